//! A scripted ADS control plane (tonic + envoy-types), SotW and Delta. It serves snapshots
//! (one default, optionally one per node id), pushes changed types in istiod's order and re-sends
//! EDS after CDS so Envoy's cluster warming completes, and records every request and response.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::resources::{Snapshot, CDS, EDS, ORDER};

/// One request as the control plane received it.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    pub delta: bool,
    pub node: Option<String>,
    pub type_url: String,
    pub response_nonce: String,
    pub error: Option<(i32, String)>,
    pub initial_versions: BTreeMap<String, String>,
}

/// One response as the control plane sent it.
#[derive(Clone, Debug)]
pub struct Sent {
    pub stream: u64,
    pub node: Option<String>,
    pub type_url: String,
    pub version: String,
    pub nonce: String,
}

#[derive(Default)]
pub struct Log {
    pub requests: Vec<Recorded>,
    pub sent: Vec<Sent>,
}

struct Inner {
    default: Mutex<Snapshot>,
    per_node: Mutex<HashMap<String, Snapshot>>,
    changed: watch::Sender<u64>,
    stop: watch::Sender<bool>,
    log: Mutex<Log>,
    next_stream: AtomicU64,
    next_nonce: AtomicU64,
    /// Delta: a change pushes every resource of the type again, changed or not.
    full_delta: AtomicBool,
}

impl Inner {
    fn snapshot(&self, node: Option<&str>) -> Snapshot {
        if let Some(s) = node.and_then(|n| self.per_node.lock().unwrap().get(n).cloned()) {
            return s;
        }
        self.default.lock().unwrap().clone()
    }
    fn nonce(&self) -> String {
        format!("n{}", self.next_nonce.fetch_add(1, Ordering::Relaxed))
    }
}

#[derive(Clone)]
pub struct ControlPlane {
    inner: Arc<Inner>,
}

fn digest(any: &envoy_types::pb::google::protobuf::Any) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&any.value))
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl ControlPlane {
    pub fn new(snapshot: Snapshot) -> Self {
        ControlPlane {
            inner: Arc::new(Inner {
                default: Mutex::new(snapshot),
                per_node: Mutex::default(),
                changed: watch::channel(0).0,
                stop: watch::channel(false).0,
                log: Mutex::default(),
                next_stream: AtomicU64::new(1),
                next_nonce: AtomicU64::new(1),
                full_delta: Default::default(),
            }),
        }
    }

    /// A control plane serving `snapshot` on a loopback port: it, its address and its task.
    pub async fn listening(snapshot: Snapshot) -> (Self, String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cp = ControlPlane::new(snapshot);
        let server = cp.serve(listener);
        (cp, addr, server)
    }

    /// Serves on `listener` until `stop` is called; returns the server task.
    pub fn serve(&self, listener: tokio::net::TcpListener) -> tokio::task::JoinHandle<()> {
        self.inner.stop.send_replace(false);
        let svc = AggregatedDiscoveryServiceServer::new(self.clone())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let mut stop = self.inner.stop.subscribe();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
        })
    }

    /// Ends every stream with UNAVAILABLE and stops serving (a control-plane restart).
    pub async fn stop(&self, server: tokio::task::JoinHandle<()>) {
        self.inner.stop.send_replace(true);
        let _ = server.await;
    }

    /// From now on a change pushes Delta clients every resource of a type again, as a Delta
    /// server that computes no difference does (istiod's full pushes); a stream's first
    /// answer still skips what the client states it has.
    pub fn push_delta_in_full(&self) {
        self.inner.full_delta.store(true, Ordering::Relaxed);
    }

    /// Replaces the default snapshot and pushes what changed to every stream.
    pub fn set(&self, snapshot: Snapshot) {
        *self.inner.default.lock().unwrap() = snapshot;
        self.inner.changed.send_modify(|g| *g += 1);
    }

    /// Gives one node its own snapshot.
    pub fn set_for_node(&self, node: &str, snapshot: Snapshot) {
        self.inner
            .per_node
            .lock()
            .unwrap()
            .insert(node.into(), snapshot);
        self.inner.changed.send_modify(|g| *g += 1);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.log.lock().unwrap().requests.clone()
    }

    pub fn sent(&self) -> Vec<Sent> {
        self.inner.log.lock().unwrap().sent.clone()
    }

    /// The answer the client gave to nonce `nonce`, if any.
    pub fn answer_to(&self, nonce: &str) -> Option<Recorded> {
        self.requests()
            .into_iter()
            .find(|r| r.response_nonce == nonce)
    }

    /// The answer to `nonce`, waiting for it: the tap sees an answer before it forwards it, so
    /// a test that learns of it from the tap can be ahead of the control plane's record.
    pub async fn answer_eventually(&self, nonce: &str) -> Recorded {
        super::eventually(
            10,
            &format!("the control plane to record the answer to {nonce}"),
            || self.answer_to(nonce),
        )
        .await
    }

    fn record(&self, r: Recorded) {
        self.inner.log.lock().unwrap().requests.push(r);
    }

    fn record_sent(&self, s: Sent) {
        self.inner.log.lock().unwrap().sent.push(s);
    }
}

struct SotwState {
    names: HashMap<String, Vec<String>>,
    sent_digest: HashMap<String, Vec<String>>,
}

fn wants(names: &[String], resource: &str) -> bool {
    names.is_empty() || names.iter().any(|n| n == "*" || n == resource)
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for ControlPlane {
    type StreamAggregatedResourcesStream = BoxStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = BoxStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<DiscoveryResponse, Status>>(64);
        let cp = self.clone();
        let stream = cp.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        let mut changed = cp.inner.changed.subscribe();
        let mut stop = cp.inner.stop.subscribe();
        tokio::spawn(async move {
            let mut node: Option<String> = None;
            let mut st = SotwState {
                names: HashMap::new(),
                sent_digest: HashMap::new(),
            };
            // Sends `type_url` (and EDS after CDS when clusters changed).
            let send = |st: &mut SotwState, node: &Option<String>, type_url: &str, force: bool| {
                let snap = cp.inner.snapshot(node.as_deref());
                let names = st.names.get(type_url).cloned().unwrap_or_default();
                let chosen: Vec<_> = snap
                    .of(type_url)
                    .iter()
                    .filter(|(n, _)| wants(&names, n))
                    .cloned()
                    .collect();
                let digests: Vec<String> = chosen.iter().map(|(_, a)| digest(a)).collect();
                if !force && st.sent_digest.get(type_url) == Some(&digests) {
                    return None;
                }
                if snap.of(type_url).is_empty() && !st.sent_digest.contains_key(type_url) && !force
                {
                    return None;
                }
                st.sent_digest.insert(type_url.to_string(), digests);
                let nonce = cp.inner.nonce();
                cp.record_sent(Sent {
                    stream,
                    node: node.clone(),
                    type_url: type_url.into(),
                    version: snap.version.clone(),
                    nonce: nonce.clone(),
                });
                Some(DiscoveryResponse {
                    version_info: snap.version.clone(),
                    resources: chosen.into_iter().map(|(_, a)| a).collect(),
                    type_url: type_url.into(),
                    nonce,
                    ..Default::default()
                })
            };
            loop {
                tokio::select! {
                    _ = async { let _ = stop.wait_for(|s| *s).await; } => {
                        let _ = tx.send(Err(Status::unavailable("control plane restarting"))).await;
                        return;
                    }
                    msg = inbound.next() => {
                        let Some(Ok(req)) = msg else { return };
                        if node.is_none() {
                            node = req.node.as_ref().map(|n| n.id.clone());
                        }
                        cp.record(Recorded {
                            delta: false,
                            node: node.clone(),
                            type_url: req.type_url.clone(),
                            response_nonce: req.response_nonce.clone(),
                            error: req.error_detail.as_ref().map(|e| (e.code, e.message.clone())),
                            ..Default::default()
                        });
                        let first = !st.names.contains_key(&req.type_url);
                        let names_changed = st.names.get(&req.type_url) != Some(&req.resource_names);
                        st.names.insert(req.type_url.clone(), req.resource_names.clone());
                        if first || names_changed {
                            if let Some(resp) = send(&mut st, &node, &req.type_url, first) {
                                let _ = tx.send(Ok(resp)).await;
                            }
                        }
                    }
                    _ = changed.changed() => {
                        let mut cds_changed = false;
                        for t in ORDER {
                            if !st.names.contains_key(t) {
                                continue;
                            }
                            let force = t == EDS && cds_changed;
                            if let Some(resp) = send(&mut st, &node, t, force) {
                                cds_changed |= t == CDS;
                                let _ = tx.send(Ok(resp)).await;
                            }
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<DeltaDiscoveryResponse, Status>>(64);
        let cp = self.clone();
        let stream = cp.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        let mut changed = cp.inner.changed.subscribe();
        let mut stop = cp.inner.stop.subscribe();
        tokio::spawn(async move {
            let mut node: Option<String> = None;
            // Per type: subscribed names (empty = wildcard) and what the client has (name -> version).
            let mut subs: HashMap<String, Vec<String>> = HashMap::new();
            let mut has: HashMap<String, BTreeMap<String, String>> = HashMap::new();
            let diff = |subs: &HashMap<String, Vec<String>>,
                        has: &mut HashMap<String, BTreeMap<String, String>>,
                        node: &Option<String>,
                        type_url: &str,
                        force: &[String]| {
                let snap = cp.inner.snapshot(node.as_deref());
                let names = subs.get(type_url).cloned().unwrap_or_default();
                let client = has.entry(type_url.to_string()).or_default();
                let mut resources = Vec::new();
                for (name, any) in snap.of(type_url) {
                    if !wants(&names, name) {
                        continue;
                    }
                    let v = digest(any);
                    if client.get(name) != Some(&v) || force.contains(name) {
                        client.insert(name.clone(), v.clone());
                        resources.push(Resource {
                            name: name.clone(),
                            version: v,
                            resource: Some(any.clone()),
                            ..Default::default()
                        });
                    }
                }
                let removed: Vec<String> = client
                    .keys()
                    .filter(|n| wants(&names, n) && !snap.of(type_url).iter().any(|(m, _)| m == *n))
                    .cloned()
                    .collect();
                for n in &removed {
                    client.remove(n);
                }
                if resources.is_empty() && removed.is_empty() {
                    return None;
                }
                let nonce = cp.inner.nonce();
                cp.record_sent(Sent {
                    stream,
                    node: node.clone(),
                    type_url: type_url.into(),
                    version: snap.version.clone(),
                    nonce: nonce.clone(),
                });
                Some(DeltaDiscoveryResponse {
                    system_version_info: snap.version.clone(),
                    resources,
                    type_url: type_url.into(),
                    nonce,
                    removed_resources: removed,
                    ..Default::default()
                })
            };
            loop {
                tokio::select! {
                    _ = async { let _ = stop.wait_for(|s| *s).await; } => {
                        let _ = tx.send(Err(Status::unavailable("control plane restarting"))).await;
                        return;
                    }
                    msg = inbound.next() => {
                        let Some(Ok(req)) = msg else { return };
                        if node.is_none() {
                            node = req.node.as_ref().map(|n| n.id.clone());
                        }
                        cp.record(Recorded {
                            delta: true,
                            node: node.clone(),
                            type_url: req.type_url.clone(),
                            response_nonce: req.response_nonce.clone(),
                            error: req.error_detail.as_ref().map(|e| (e.code, e.message.clone())),
                            initial_versions: req.initial_resource_versions.clone().into_iter().collect(),
                        });
                        let t = req.type_url.clone();
                        let first = !subs.contains_key(&t);
                        let entry = subs.entry(t.clone()).or_default();
                        for n in &req.resource_names_subscribe {
                            if !entry.contains(n) {
                                entry.push(n.clone());
                            }
                        }
                        entry.retain(|n| !req.resource_names_unsubscribe.contains(n));
                        if first {
                            has.insert(t.clone(), req.initial_resource_versions.clone().into_iter().collect());
                        }
                        if first || !req.resource_names_subscribe.is_empty() {
                            let force = if first { vec![] } else { req.resource_names_subscribe.clone() };
                            if let Some(resp) = diff(&subs, &mut has, &node, &t, &force) {
                                let _ = tx.send(Ok(resp)).await;
                            }
                        }
                    }
                    _ = changed.changed() => {
                        let mut changed_clusters: Vec<String> = Vec::new();
                        let full = cp.inner.full_delta.load(Ordering::Relaxed);
                        for t in ORDER {
                            if !subs.contains_key(t) {
                                continue;
                            }
                            let force = if full {
                                let snap = cp.inner.snapshot(node.as_deref());
                                snap.of(t).iter().map(|(n, _)| n.clone()).collect()
                            } else if t == EDS {
                                changed_clusters.clone()
                            } else {
                                vec![]
                            };
                            if let Some(resp) = diff(&subs, &mut has, &node, t, &force) {
                                if t == CDS {
                                    changed_clusters = resp.resources.iter().map(|r| r.name.clone()).collect();
                                }
                                let _ = tx.send(Ok(resp)).await;
                            }
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
