//! The admin server (loopback by default), HTTP/1.1 and HTTP/2 on one address. HTTP: `/status`
//! and `/rollouts` (JSON), `/metrics` (Prometheus / OpenMetrics text), `/healthz`, `/readyz`
//! (listening, and the upstream answers a connect). gRPC (any request of content-type
//! `application/grpc`): the tap's own API, `xdstap.v1.Tap` ([`api`]), and CSDS ([`csds`]).

pub mod api;
pub mod csds;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use tonic::body::Body;
use tonic::codegen::Service;

use crate::api::csds::client_status_discovery_service_server::ClientStatusDiscoveryServiceServer;
use crate::api::tap::tap_server::TapServer;
use crate::observe::board::StatusBoard;
use crate::observe::rollout::Rollouts;
use crate::observe::watch::Watchers;
use crate::proxy::{Endpoint, Listener};

/// Admin connections open at once at most (watchers and CSDS streams hold one each).
const MAX_CONNECTIONS: usize = 256;

/// HTTP/1.1: a request's headers must arrive within this, and an idle kept-alive connection
/// closes after it.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What the admin server shows.
pub struct Admin {
    /// Sync status.
    pub status: StatusBoard,
    /// The rollout view.
    pub rollouts: Rollouts,
    /// Live verdicts.
    pub watchers: Watchers,
    /// Metrics.
    pub registry: Registry,
    /// The control plane, for `/readyz`.
    pub upstream: Endpoint,
}

/// Serves HTTP/1.1 and HTTP/2 on `listener` until the task is dropped or aborted.
pub async fn serve(listener: Listener, admin: Arc<Admin>) {
    let grpc = tonic::service::Routes::new(TapServer::new(api::TapApi(admin.clone()))).add_service(
        ClientStatusDiscoveryServiceServer::new(csds::Csds(admin.clone())),
    );
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut failures = crate::proxy::AcceptFailures::default();
    loop {
        // Past the bound, new clients wait in the kernel's backlog, holding no descriptor.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let conn = match listener.accept().await {
            Ok((io, _)) => io,
            Err(e) => {
                failures.note(&e);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admin = admin.clone();
        let grpc = grpc.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let timeout = crate::proxy::listen::FIRST_BYTES_TIMEOUT;
            let Some(conn) = crate::proxy::listen::first_bytes(conn, timeout).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let admin = admin.clone();
                let mut grpc = grpc.clone();
                async move {
                    if is_grpc(&req) {
                        return grpc.call(req).await;
                    }
                    Ok::<_, Infallible>(handle(&admin, req).await.map(Body::new))
                }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // A request's headers, and the wait for the next on a kept-alive connection, within
            // HEADER_TIMEOUT.
            builder
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let _ = builder
                .serve_connection_with_upgrades(TokioIo::new(conn), service)
                .await;
        });
    }
}

fn is_grpc(req: &Request<Incoming>) -> bool {
    (req.headers().get(http::header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .expect("static parts")
}

/// Every `?key=VALUE` of `query` (percent-decoded).
fn params<'a>(query: Option<&'a str>, key: &'a str) -> impl Iterator<Item = String> + 'a {
    (query.unwrap_or("").split('&'))
        .filter_map(move |kv| kv.strip_prefix(key)?.strip_prefix('='))
        // A query value: `+` is a space, then percent-decoding.
        .map(|v| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
}

/// `?node=ID`.
fn node_param(query: Option<&str>) -> Option<String> {
    params(query, "node").next()
}

fn json(body: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let mut body = serde_json::to_vec_pretty(body).unwrap_or_default();
    body.push(b'\n');
    reply(StatusCode::OK, "application/json", body)
}

async fn handle(admin: &Admin, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n");
    }
    match req.uri().path() {
        "/status" => {
            let node = node_param(req.uri().query());
            let mut report = admin.status.report(crate::observe::now(), node.as_deref());
            if let (Some(id), [one]) = (&node, &mut report.nodes[..]) {
                let mut of = admin.status.resources(|n| n == id);
                one.resources = (of.pop().into_iter())
                    .flat_map(|n| n.resources)
                    .map(Into::into)
                    .collect();
            }
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
            json(&report)
        }
        "/rollouts" => {
            let query = req.uri().query();
            let version = params(query, "version").next();
            let types: Vec<String> = params(query, "type").collect();
            let now = crate::observe::now();
            json(&admin.rollouts.report(now, version.as_deref(), &types))
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
            "xdstap admin: /status[?node=ID] /rollouts[?version=V&type=CDS] /metrics /healthz \
             /readyz; gRPC: xdstap.v1.Tap, envoy.service.status.v3.ClientStatusDiscoveryService\n",
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
        let q = Some("type=CDS&version=v%201&type=LDS&typo=x");
        assert_eq!(params(q, "type").collect::<Vec<_>>(), ["CDS", "LDS"]);
        assert_eq!(params(q, "version").collect::<Vec<_>>(), ["v 1"]);
    }
}
