//! OTLP receivers built from the opentelemetry-proto crate: OTLP/gRPC (its tonic TraceService
//! server) and OTLP/HTTP protobuf (a small HTTP/1.1 server decoding the same message), keeping
//! every span they receive with its resource.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A span as received, with its resource's attributes.
#[derive(Clone, Debug)]
pub struct Received {
    pub resource: Vec<KeyValue>,
    pub span: Span,
}

impl Received {
    pub fn attr(&self, key: &str) -> Option<&AnyValue> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
    }

    /// A string, int, bool or double attribute as text.
    pub fn text(&self, key: &str) -> Option<String> {
        self.attr(key).map(text)
    }

    /// A string-array attribute.
    pub fn strings(&self, key: &str) -> Vec<String> {
        match self.attr(key).and_then(|v| v.value.as_ref()) {
            Some(Value::ArrayValue(a)) => a.values.iter().map(text).collect(),
            _ => Vec::new(),
        }
    }

    pub fn resource_text(&self, key: &str) -> Option<String> {
        self.resource
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .map(text)
    }

    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn text(v: &AnyValue) -> String {
    match &v.value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

type Store = Arc<Mutex<Vec<Received>>>;

fn keep(store: &Store, req: ExportTraceServiceRequest) {
    let mut all = store.lock().unwrap();
    for rs in req.resource_spans {
        let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                all.push(Received {
                    resource: resource.clone(),
                    span,
                });
            }
        }
    }
}

/// A running receiver.
pub struct Receiver {
    /// Base URL for the exporter (`http://127.0.0.1:PORT`).
    pub endpoint: String,
    store: Store,
    /// HTTP requests received (HTTP receiver only): path and content type.
    pub requests: Arc<Mutex<Vec<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Grpc(Store);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// OTLP/gRPC on a loopback port.
    pub async fn grpc() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let store = Store::default();
        let service = TraceServiceServer::new(Grpc(store.clone()));
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        Receiver {
            endpoint,
            store,
            requests: Arc::default(),
            task,
        }
    }

    /// OTLP/HTTP (protobuf bodies) on a loopback port; answers every POST with 200.
    pub async fn http() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let store = Store::default();
        let requests: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let (s, r) = (store.clone(), requests.clone());
        let task = tokio::spawn(async move {
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                tokio::spawn(http_conn(conn, s.clone(), r.clone()));
            }
        });
        Receiver {
            endpoint,
            store,
            requests,
            task,
        }
    }

    pub fn spans(&self) -> Vec<Received> {
        self.store.lock().unwrap().clone()
    }
}

/// One keep-alive HTTP/1.1 connection: requests with Content-Length bodies.
async fn http_conn(
    mut conn: tokio::net::TcpStream,
    store: Store,
    requests: Arc<Mutex<Vec<(String, String)>>>,
) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let path = head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let header = |name: &str| {
            head.lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| v.trim().to_string())
                })
                .unwrap_or_default()
        };
        let len: usize = header("content-length").parse().unwrap_or(0);
        let content_type = header("content-type");
        while buf.len() < head_end + len {
            let mut chunk = [0u8; 65536];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..head_end + len).skip(head_end).collect();
        requests.lock().unwrap().push((path, content_type));
        if let Ok(req) = ExportTraceServiceRequest::decode(&body[..]) {
            keep(&store, req);
        }
        let answer = ExportTraceServiceResponse {
            partial_success: None,
        }
        .encode_to_vec();
        let mut out = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        )
        .into_bytes();
        out.extend_from_slice(&answer);
        if conn.write_all(&out).await.is_err() {
            return;
        }
    }
}
