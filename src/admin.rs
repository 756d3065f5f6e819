//! The admin HTTP server (loopback by default): `/status` (JSON), `/metrics` (Prometheus /
//! OpenMetrics text), `/healthz`, `/readyz` (listening, and the upstream answers a connect).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;

use crate::observe::status::StatusBoard;
use crate::proxy::Endpoint;

/// Default admin address.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9977";

/// What the admin server shows.
pub struct Admin {
    /// Sync status.
    pub status: StatusBoard,
    /// Metrics.
    pub registry: Registry,
    /// The control plane, for `/readyz`.
    pub upstream: Endpoint,
}

/// A bound admin listener.
pub enum AdminListener {
    /// TCP.
    Tcp(tokio::net::TcpListener),
    /// Unix socket.
    Unix(tokio::net::UnixListener),
}

impl AdminListener {
    /// Binds `addr`.
    pub async fn bind(addr: &Endpoint) -> std::io::Result<AdminListener> {
        Ok(match addr {
            Endpoint::Tcp(a) => AdminListener::Tcp(tokio::net::TcpListener::bind(a).await?),
            Endpoint::Unix(p) => {
                let _ = std::fs::remove_file(p);
                AdminListener::Unix(tokio::net::UnixListener::bind(p)?)
            }
        })
    }

    /// The bound address, as `host:port` or `unix:/path`.
    pub fn local_addr(&self) -> String {
        match self {
            AdminListener::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            AdminListener::Unix(l) => l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
                .unwrap_or_default(),
        }
    }
}

/// Serves until the task is dropped or aborted.
pub async fn serve(listener: AdminListener, admin: Arc<Admin>) {
    loop {
        let accepted = match &listener {
            AdminListener::Tcp(l) => l.accept().await.map(|(s, _)| Conn::Tcp(s)),
            AdminListener::Unix(l) => l.accept().await.map(|(s, _)| Conn::Unix(s)),
        };
        let conn = match accepted {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("admin accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let admin = admin.clone();
                async move { Ok::<_, Infallible>(handle(&admin, req).await) }
            });
            let builder = hyper::server::conn::http1::Builder::new();
            let _ = match conn {
                Conn::Tcp(s) => builder.serve_connection(TokioIo::new(s), service).await,
                Conn::Unix(s) => builder.serve_connection(TokioIo::new(s), service).await,
            };
        });
    }
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .expect("static parts")
}

/// `?node=ID` (percent-decoded).
fn node_param(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix("node="))
        .map(percent_decode)
}

fn percent_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(admin: &Admin, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n");
    }
    match req.uri().path() {
        "/status" => {
            let node = node_param(req.uri().query());
            let report = admin.status.report(crate::tap::now(), node.as_deref());
            if node.is_some() && report.nodes.is_empty() {
                return reply(
                    StatusCode::NOT_FOUND,
                    "application/json",
                    format!(
                        "{{\"error\":\"no such node\",\"node\":{}}}\n",
                        serde_json::to_string(&node).unwrap_or_default()
                    ),
                );
            }
            let mut body = serde_json::to_vec_pretty(&report).unwrap_or_default();
            body.push(b'\n');
            reply(StatusCode::OK, "application/json", body)
        }
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            crate::observe::metrics::render(&admin.registry),
        ),
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => match upstream_reachable(&admin.upstream).await {
            Ok(()) => reply(StatusCode::OK, "text/plain", "ready\n"),
            Err(e) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("upstream {} unreachable: {e}\n", admin.upstream),
            ),
        },
        "/" => reply(
            StatusCode::OK,
            "text/plain",
            "xdstap admin: /status[?node=ID] /metrics /healthz /readyz\n",
        ),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// A fresh connect to the upstream within a second (TCP, or the Unix socket).
async fn upstream_reachable(upstream: &Endpoint) -> Result<(), String> {
    let connect = async {
        match upstream {
            Endpoint::Tcp(a) => tokio::net::TcpStream::connect(a).await.map(drop),
            Endpoint::Unix(p) => tokio::net::UnixStream::connect(p).await.map(drop),
        }
    };
    match tokio::time::timeout(Duration::from_secs(1), connect).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no connection within 1s".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_query() {
        assert_eq!(
            node_param(Some("node=sidecar~10.0.0.1~a.b%2Fc~d")).as_deref(),
            Some("sidecar~10.0.0.1~a.b/c~d")
        );
        assert_eq!(node_param(Some("x=1")), None);
        assert_eq!(node_param(Some("node=50%")).as_deref(), Some("50%"));
    }
}
