//! The admin server (loopback by default), HTTP/1.1 and HTTP/2 on one address. HTTP: the live
//! page at `/` ([`page`]), `/status` and `/rollouts` (JSON), `/events` (verdicts as server-sent
//! events), `/metrics` (Prometheus / OpenMetrics text), `/healthz`, `/readyz` (listening, and
//! the upstream answers HTTP/2, as of at most a second ago). gRPC (any request of content-type
//! `application/grpc`): the tap's own API, `xdstap.v1.Tap` ([`api`]), and CSDS ([`csds`]).
//! Read-only: nothing here changes what the tap does.

pub mod api;
pub mod csds;
pub mod page;

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
use crate::sinks::board::StatusBoard;
use crate::sinks::rollout::Rollouts;
use crate::sinks::watch::Watchers;
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
    /// How the tap dials it (TLS included), for `/readyz`.
    pub connector: crate::proxy::Connector,
    /// The last readiness check and when it ran: `/readyz` dials at most once a second, and
    /// probes that come while it dials wait for that dial's answer.
    pub ready: tokio::sync::Mutex<Option<(std::time::Instant, Result<(), String>)>>,
    /// The trace ids the tap's spans carry, when it exports spans.
    pub traces: Option<crate::sinks::spans::TraceIds>,
    /// The page's link to a trace (`{trace_id}` in it).
    pub trace_url: Option<String>,
}

impl Admin {
    /// The rollouts `ask` asks for, each named by its trace when spans share one per version.
    pub fn rollouts(&self, ask: &crate::api::tap::RolloutsRequest) -> crate::api::tap::RolloutReport {
        let mut report = self.rollouts.report(crate::sinks::now(), ask);
        if let Some(traces) = &self.traces {
            for r in &mut report.rollouts {
                if let Some(id) = traces.of_version(&r.version) {
                    r.trace_id = id.to_string();
                }
            }
        }
        report
    }

    /// Whether the control plane answers HTTP/2, as of at most a second ago. A change is logged
    /// once, naming the likely cause.
    async fn ready(&self) -> Result<(), String> {
        // Held across the dial: one dial at a time, whatever the number of probes.
        let mut last = self.ready.lock().await;
        if let Some((_, r)) = last.as_ref().filter(|(at, _)| at.elapsed() < READY_FOR) {
            return r.clone();
        }
        let now = upstream_answers(&self.connector).await;
        let changed = last.as_ref().is_none_or(|(_, r)| r.is_ok() != now.is_ok());
        match (&now, changed) {
            (Err(e), true) => tracing::warn!(upstream = %self.upstream, "Not ready: {e}"),
            (Ok(()), true) if last.is_some() => {
                tracing::info!(upstream = %self.upstream, "Ready: the upstream answers HTTP/2")
            }
            _ => {}
        }
        *last = Some((std::time::Instant::now(), now.clone()));
        now
    }
}

/// How long a readiness answer is reused.
const READY_FOR: Duration = Duration::from_secs(1);

/// `routes` with gRPC server reflection (v1, and v1alpha for older clients) describing the
/// tap's API and CSDS.
fn with_reflection(routes: tonic::service::Routes) -> tonic::service::Routes {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::api::DESCRIPTORS)
    };
    // The descriptors are compiled in and checked by the build: they always register.
    match (builder().build_v1(), builder().build_v1alpha()) {
        (Ok(v1), Ok(v1alpha)) => routes.add_service(v1).add_service(v1alpha),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %e, "gRPC reflection unavailable");
            routes
        }
    }
}

/// Serves HTTP/1.1 and HTTP/2 on `listener` until the task is dropped or aborted.
pub async fn serve(listener: Listener, admin: Arc<Admin>) {
    let grpc = tonic::service::Routes::new(TapServer::new(api::TapApi(admin.clone())))
        .add_service(ClientStatusDiscoveryServiceServer::new(csds::Csds(
            admin.clone(),
        )));
    let grpc = with_reflection(grpc);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut failures = crate::proxy::Throttled::new("Accept failed; backing off");
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
                    Ok::<_, Infallible>(handle(&admin, req).await)
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

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Body::new(Full::new(body.into())))
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

fn json(body: &impl serde::Serialize) -> Response<Body> {
    let mut body = serde_json::to_vec_pretty(body).unwrap_or_default();
    body.push(b'\n');
    reply(StatusCode::OK, "application/json", body)
}

async fn handle(admin: &Admin, req: Request<Incoming>) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n");
    }
    if let Some(page) = page::serve(admin, req.uri().path()) {
        return page;
    }
    match req.uri().path() {
        "/status" => {
            let node = node_param(req.uri().query());
            let report = admin.status.report(crate::sinks::now(), node.as_deref());
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
            let ask = crate::api::tap::RolloutsRequest {
                version: params(query, "version").next().unwrap_or_default(),
                types: params(query, "type").collect(),
                every_node: params(query, "every_node").any(|v| v == "true" || v == "1"),
            };
            json(&admin.rollouts(&ask))
        }
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            crate::sinks::metrics::render(&admin.registry),
        ),
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => match admin.ready().await {
            Ok(()) => reply(StatusCode::OK, "text/plain", "ready\n"),
            Err(e) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("upstream {} unreachable: {e}\n", admin.upstream),
            ),
        },
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// Dials the upstream as the tap does (TLS included) and says the HTTP/2 preface: ready when its
/// SETTINGS come back within a second. Otherwise why not, with the likely cause.
async fn upstream_answers(connector: &crate::proxy::Connector) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let within = Duration::from_secs(1);
    let mut io = connector.dial(within).await.map_err(|e| e.to_string())?;
    let mut hello = crate::proxy::PREFACE.to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let answer = async {
        io.write_all(&hello).await?;
        let mut head = [0u8; 9];
        io.read_exact(&mut head).await.map(|_| head)
    };
    match tokio::time::timeout(within, answer).await {
        Ok(Ok(head)) if head[3] == 4 => Ok(()),
        // Go's TLS server (istiod's) answers a plaintext HTTP-looking hello with HTTP/1.0 400.
        Ok(Ok(head)) if head.starts_with(b"HTTP/") => Err(
            "it answered HTTP/1, as a TLS server answers plaintext: a TLS port (istiod's \
             15012?) needs --upstream-tls"
                .into(),
        ),
        Ok(Ok(head)) if head[0] == 0x15 || head[0] == 0x16 => {
            Err("it answered with TLS: a TLS port (istiod's 15012?) needs --upstream-tls".into())
        }
        Ok(Ok(_)) => Err("it answered, but not with HTTP/2 SETTINGS: not an xDS server?".into()),
        Ok(Err(e)) => Err(format!(
            "it closed the connection without an HTTP/2 answer ({e}): TLS on the other side, or \
             not an xDS server?"
        )),
        Err(_) => {
            Err("no HTTP/2 answer within 1s: TLS on the other side, or not an xDS server?".into())
        }
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
