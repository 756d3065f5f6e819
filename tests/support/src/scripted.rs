//! A scripted ADS control plane (SotW and Delta) (tonic + envoy-types) for tests that decide exactly what is
//! sent when: it answers each type's first request with a response the test set, and on
//! command writes a list of responses to every open stream at once, before it reads any
//! request. It records every request and response.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// One request as the control plane read it.
#[derive(Clone, Debug)]
pub struct Answer {
    pub type_url: String,
    pub version_info: String,
    pub response_nonce: String,
    pub error: Option<String>,
    /// When the control plane read it.
    pub at: std::time::Instant,
}

#[derive(Default)]
struct Inner {
    first: HashMap<String, DiscoveryResponse>,
    first_delta: HashMap<String, DeltaDiscoveryResponse>,
    streams: Vec<mpsc::Sender<Vec<DiscoveryResponse>>>,
    delta_streams: Vec<mpsc::Sender<Vec<DeltaDiscoveryResponse>>>,
    requests: Vec<Answer>,
    sent: Vec<DiscoveryResponse>,
}

#[derive(Clone, Default)]
pub struct Scripted {
    inner: Arc<Mutex<Inner>>,
}

/// A SotW response of `resources`.
pub fn response(
    type_url: &str,
    version: &str,
    nonce: &str,
    resources: Vec<Any>,
) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.into(),
        resources,
        type_url: type_url.into(),
        nonce: nonce.into(),
        ..Default::default()
    }
}

/// A Delta response of `resources` (wrappers) and `removed` names.
pub fn delta_response(
    type_url: &str,
    nonce: &str,
    resources: Vec<Resource>,
    removed: &[&str],
) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        resources,
        type_url: type_url.into(),
        nonce: nonce.into(),
        removed_resources: removed.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl Scripted {
    /// Answers the first request of `response.type_url` on each stream with `response`.
    pub fn on_first(&self, response: DiscoveryResponse) {
        let mut inner = self.inner.lock().unwrap();
        inner.first.insert(response.type_url.clone(), response);
    }

    /// Answers the first Delta request of `response.type_url` on each stream with `response`.
    pub fn on_first_delta(&self, response: DeltaDiscoveryResponse) {
        let mut inner = self.inner.lock().unwrap();
        inner
            .first_delta
            .insert(response.type_url.clone(), response);
    }

    /// Writes `responses` to every open Delta stream.
    pub async fn send_delta(&self, responses: Vec<DeltaDiscoveryResponse>) {
        let streams = self.inner.lock().unwrap().delta_streams.clone();
        for tx in streams {
            let _ = tx.send(responses.clone()).await;
        }
    }

    /// Serves on `listener`.
    pub fn serve(&self, listener: tokio::net::TcpListener) -> tokio::task::JoinHandle<()> {
        let svc = AggregatedDiscoveryServiceServer::new(self.clone());
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await;
        })
    }

    /// Writes `responses` to every open stream, all of them before any request is read.
    pub async fn send(&self, responses: Vec<DiscoveryResponse>) {
        let streams = {
            let mut inner = self.inner.lock().unwrap();
            inner.sent.extend(responses.iter().cloned());
            inner.streams.clone()
        };
        for tx in streams {
            let _ = tx.send(responses.clone()).await;
        }
    }

    pub fn requests(&self) -> Vec<Answer> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// Every answer naming `nonce`, in the order they came.
    pub fn answers_to(&self, nonce: &str) -> Vec<Answer> {
        self.requests()
            .into_iter()
            .filter(|r| r.response_nonce == nonce)
            .collect()
    }
}

/// The responses of one [`Scripted::send`] come out of this stream all ready at once, so the
/// gRPC encoder takes them into one write.
struct Batches<T> {
    rx: mpsc::Receiver<Vec<T>>,
    ready: std::collections::VecDeque<T>,
}

impl<T: Unpin> Stream for Batches<T> {
    type Item = Result<T, Status>;
    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        loop {
            if let Some(r) = self.ready.pop_front() {
                return Poll::Ready(Some(Ok(r)));
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(batch)) => self.ready.extend(batch),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Scripted {
    type StreamAggregatedResourcesStream = BoxStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = BoxStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        self.inner.lock().unwrap().streams.push(tx.clone());
        let cp = self.clone();
        tokio::spawn(async move {
            let mut seen: Vec<String> = Vec::new();
            while let Some(Ok(req)) = inbound.next().await {
                // A request of no type (a flood's empty messages) is no answer to record.
                if req.type_url.is_empty() {
                    continue;
                }
                let first = {
                    let mut inner = cp.inner.lock().unwrap();
                    inner.requests.push(Answer {
                        type_url: req.type_url.clone(),
                        version_info: req.version_info.clone(),
                        response_nonce: req.response_nonce.clone(),
                        error: req.error_detail.as_ref().map(|e| e.message.clone()),
                        at: std::time::Instant::now(),
                    });
                    if seen.contains(&req.type_url) {
                        None
                    } else {
                        seen.push(req.type_url.clone());
                        inner.first.get(&req.type_url).cloned()
                    }
                };
                if let Some(r) = first {
                    cp.inner.lock().unwrap().sent.push(r.clone());
                    let _ = tx.send(vec![r]).await;
                }
            }
        });
        Ok(Response::new(Box::pin(Batches {
            rx,
            ready: Default::default(),
        })))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        self.inner.lock().unwrap().delta_streams.push(tx.clone());
        let cp = self.clone();
        tokio::spawn(async move {
            let mut seen: Vec<String> = Vec::new();
            while let Some(Ok(req)) = inbound.next().await {
                let first = {
                    let mut inner = cp.inner.lock().unwrap();
                    inner.requests.push(Answer {
                        type_url: req.type_url.clone(),
                        version_info: String::new(),
                        response_nonce: req.response_nonce.clone(),
                        error: req.error_detail.as_ref().map(|e| e.message.clone()),
                        at: std::time::Instant::now(),
                    });
                    if seen.contains(&req.type_url) {
                        None
                    } else {
                        seen.push(req.type_url.clone());
                        inner.first_delta.get(&req.type_url).cloned()
                    }
                };
                if let Some(r) = first {
                    let _ = tx.send(vec![r]).await;
                }
            }
        });
        Ok(Response::new(Box::pin(Batches {
            rx,
            ready: Default::default(),
        })))
    }
}
