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

use crate::observe::board::StatusBoard;
use crate::proxy::{Endpoint, Listener};

/// What the admin server shows.
pub struct Admin {
    /// Sync status.
    pub status: StatusBoard,
    /// Metrics.
    pub registry: Registry,
    /// The control plane, for `/readyz`.
    pub upstream: Endpoint,
}

/// Serves HTTP/1.1 on `listener` until the task is dropped or aborted.
pub async fn serve(listener: Listener, admin: Arc<Admin>) {
    loop {
        let conn = match listener.accept().await {
            Ok((io, _)) => io,
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
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(conn), service)
                .await;
        });
    }
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
        // A query value: `+` is a space, then percent-decoding.
        .map(|v| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
}

async fn handle(admin: &Admin, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n");
    }
    match req.uri().path() {
        "/status" => {
            let node = node_param(req.uri().query());
            let report = admin.status.report(crate::observe::now(), node.as_deref());
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
