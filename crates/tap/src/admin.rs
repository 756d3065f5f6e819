//! The admin server (loopback by default), HTTP/1.1 and HTTP/2 on one address. HTTP: the live
//! page at `/` ([`page`]), `/status`, `/rollouts`, `/objects` and `/verdicts?node=` (JSON; the
//! first two and the last answer for the tier when the tap has peers), `/events` (verdicts as
//! server-sent events), `/metrics` (Prometheus / OpenMetrics text; each scrape looks at the
//! upstream as `/readyz` does), `/healthz`, `/readyz` (not draining, and the upstream answers
//! HTTP/2: [`ready`]). gRPC (any request of content-type
//! `application/grpc`): the tap's own API, `xdstap.v1.Tap` ([`api`]), and CSDS ([`csds`]).
//! Read-only: nothing here changes what the tap does.

pub mod csds;
pub mod page;
pub mod ready;
pub mod service;

use std::collections::HashMap;
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
use crate::api::v1::tap_server::TapServer;
use crate::proxy::{Endpoint, Listener};
use crate::views::board::StatusBoard;
use crate::views::rollout::Rollouts;
use crate::views::watch::Watchers;

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
    /// Whether the control plane answers, for `/readyz`.
    pub ready: ready::Readiness,
    /// The forwarder's counters; `/readyz` says 503 once it drains.
    pub proxy: Arc<crate::proxy::ProxyStats>,
    /// The trace ids the tap's spans carry, when it exports spans.
    pub traces: Option<crate::outputs::spans::TraceIds>,
    /// The page's link to a trace (`{trace_id}` in it).
    pub trace_url: Option<String>,
    /// The watchers' seats taken (gRPC watches and pages' `/events`), at most
    /// [`service::MAX_WATCHERS`].
    pub seats: service::Seats,
    /// This tap among a tier's: its admin address (or host name and port).
    pub name: String,
    /// Its process's id, random at start, which its reports carry.
    pub instance: String,
    /// When it started: it knows no push from before.
    pub started_at: crate::correlate::Timestamp,
    /// The tier's other taps, asked by `/status` (none: this tap only).
    pub peers: Vec<String>,
    /// Them resolved and connected, and their last answers.
    pub fleet: tokio::sync::Mutex<Peers>,
}

/// The tier's other taps as `/status` asks them: one ask at a time; whoever waited for it shares
/// its answers, so a peer slow to answer costs every caller one wait, not one wait each.
#[derive(Default)]
pub struct Peers {
    /// Resolved and connected, and when they were resolved.
    fleet: Option<(std::time::Instant, crate::fanin::Fleet)>,
    /// The last ask: when it ended, the node it was for, and each peer's answer or why none
    /// (kept until the next ask: a report per peer).
    last: Option<(std::time::Instant, Option<String>, PeerAnswers)>,
    /// The instance each peer address last answered as: a tap named twice that stops
    /// answering is still one tap not answering.
    known: HashMap<String, String>,
}

/// Each peer's status report, or why it gave none.
type PeerAnswers = Vec<(String, Result<crate::api::v1::StatusReport, String>)>;

/// Peers are resolved again this often (a tier scales).
const RESOLVE_PEERS: Duration = Duration::from_secs(30);

/// How long `/status` waits for the peers; one that has not answered by then is named.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// Peers that did not answer, each once: addresses that last answered as the same tap are
/// listed with the first of them (`also`).
fn once_silent(taps: &mut Vec<crate::api::v1::TapAnswer>, known: &HashMap<String, String>) {
    let mut first: HashMap<&str, usize> = HashMap::new();
    let mut i = 0;
    while i < taps.len() {
        let id = known
            .get(&taps[i].admin)
            .filter(|_| !taps[i].error.is_empty());
        match id.and_then(|id| first.get(id.as_str()).copied()) {
            Some(at) => {
                let gone = taps.remove(i);
                taps[at].also.push(gone.admin);
            }
            None => {
                if let Some(id) = id {
                    first.insert(id, i);
                }
                i += 1;
            }
        }
    }
}

/// A random id for this process: its reports carry it, so a tier's fan-in knows itself.
pub fn instance_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let seed = format!("{}-{now}", std::process::id());
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(seed.as_bytes()))
}

impl Admin {
    /// Whether the control plane answers HTTP/2 ([`ready::Readiness::check`]), kept as the
    /// upstream's reachability (`xdstap_upstream_up`).
    pub async fn look_upstream(&self) -> Result<(), String> {
        let answer = self.ready.check().await;
        let up = u64::from(answer.is_ok());
        (self.proxy.upstream_up).store(up, std::sync::atomic::Ordering::Relaxed);
        answer
    }

    /// This tap's status report (of node `node` only, when given).
    pub fn local_status(&self, node: Option<&str>) -> crate::api::v1::StatusReport {
        let mut report = self.status.report(crate::clock::now(), node);
        report.instance = self.instance.clone();
        report
    }

    /// This tap's status report with every node's resources (of node `node` only, when given).
    pub fn local_resources(&self, node: Option<&str>) -> crate::api::v1::StatusReport {
        let mut report = self.status.report_resources(crate::clock::now(), node);
        report.instance = self.instance.clone();
        report
    }

    /// The tier's status report: this tap's and its peers', merged as the CLI merges them
    /// (every node once, each naming its tap; a peer that did not answer named in `taps`).
    /// This tap's own report when it has no peers.
    pub async fn tier_status(&self, node: Option<&str>) -> crate::api::v1::StatusReport {
        use crate::api::v1::TapAnswer;
        let arrived = std::time::Instant::now();
        let local = self.local_status(node);
        if self.peers.is_empty() {
            return local;
        }
        let mut held = self.fleet.lock().await;
        let asked = match &held.last {
            // An ask that ended after this call came: its answers are as new as this one's.
            Some((at, of, answers)) if *at >= arrived && of.as_deref() == node => answers.clone(),
            _ => {
                let answers = self.ask_peers(&mut held, node).await;
                let now = std::time::Instant::now();
                held.last = Some((now, node.map(str::to_string), answers.clone()));
                for (admin, answer) in &answers {
                    if let Ok(r) = answer {
                        held.known.insert(admin.clone(), r.instance.clone());
                    }
                }
                answers
            }
        };
        let known = held.known.clone();
        drop(held);
        let mut answers = vec![(self.name.clone(), local)];
        let mut taps = vec![TapAnswer {
            admin: self.name.clone(),
            ..Default::default()
        }];
        // This tap itself may be among its peers (a headless Service lists it too): the merge
        // counts each tap once, by its instance.
        for (admin, answer) in asked {
            match answer {
                Ok(r) => {
                    taps.push(TapAnswer {
                        admin: admin.clone(),
                        ..Default::default()
                    });
                    answers.push((admin, r));
                }
                Err(error) => taps.push(TapAnswer {
                    admin,
                    error,
                    ..Default::default()
                }),
            }
        }
        let mut merged = crate::fanin::status(answers, taps);
        once_silent(&mut merged.taps, &known);
        merged.instance = self.instance.clone();
        merged
    }

    /// Asks every peer for its status report (of `node` only, when given), resolving them
    /// first when not resolved lately; each peer named, never left out.
    async fn ask_peers(&self, held: &mut Peers, node: Option<&str>) -> PeerAnswers {
        let request = crate::api::v1::StatusRequest {
            node: node.unwrap_or("").to_string(),
            resources: false,
        };
        self.ask_each(held, move |mut tap| {
            let request = request.clone();
            async move {
                match tap.client.status(request).await {
                    Ok(r) => Ok(r.into_inner()),
                    // A peer that does not know the node answered: it has none.
                    Err(e) if e.code() == tonic::Code::NotFound => Ok(Default::default()),
                    Err(e) => Err(tap.failed(e)),
                }
            }
        })
        .await
    }

    /// Asks every peer with `call`, resolving them first when not resolved lately; each peer
    /// named, never left out, its answer or why none in the CLI's words.
    async fn ask_each<T, F, Fut>(
        &self,
        held: &mut Peers,
        call: F,
    ) -> Vec<(String, Result<T, String>)>
    where
        T: Send + 'static,
        F: Fn(crate::fanin::AdminClient) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = Result<T, crate::fanin::AskError>> + Send + 'static,
    {
        use crate::fanin::{AskError, Fleet};
        let fresh = (held.fleet.as_ref()).is_some_and(|(at, _)| at.elapsed() < RESOLVE_PEERS);
        if !fresh {
            // A name server that does not answer holds up no page for long.
            match tokio::time::timeout(PEER_TIMEOUT, Fleet::resolve(&self.peers)).await {
                Ok(Ok(f)) => {
                    let f = f.with_timeout(PEER_TIMEOUT);
                    held.fleet = Some((std::time::Instant::now(), f));
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "admin.peers: cannot resolve"),
                Err(_) => tracing::warn!("admin.peers: no name resolved within {PEER_TIMEOUT:?}"),
            }
        }
        let none = |why: String| -> Vec<(String, Result<T, String>)> {
            (self.peers.iter())
                .map(|p| {
                    let admin = p.clone();
                    let why = why.clone();
                    (p.clone(), Err(AskError::Connect { admin, why }.to_string()))
                })
                .collect()
        };
        // Never resolved: each peer is named as not answering.
        let Some((_, fleet)) = held.fleet.as_mut() else {
            return none("its name did not resolve".into());
        };
        let ask = fleet.ask(call);
        // Each call is bounded; this bounds the dialling too (an address that drops packets
        // takes the whole connect timeout).
        match tokio::time::timeout(PEER_TIMEOUT * 4, ask).await {
            Ok(answers) => (answers.into_iter())
                .map(|(admin, a)| (admin, a.map_err(|e| e.to_string())))
                .collect(),
            Err(_) => {
                // The ask was dropped with its connections: dial again next time.
                held.fleet = None;
                none(format!("no answer within {:?}", PEER_TIMEOUT * 4))
            }
        }
    }

    /// The tier's rollouts: this tap's and its peers', each asked for every node and merged
    /// as the CLI merges them (each node once, as its newest push left it; a peer that did not
    /// answer named in `taps`). This tap's own when it has no peers.
    pub async fn tier_rollouts(
        &self,
        ask: &crate::api::v1::RolloutsRequest,
    ) -> crate::api::v1::RolloutReport {
        use crate::api::v1::TapAnswer;
        if self.peers.is_empty() {
            return self.rollouts(ask);
        }
        let every = crate::api::v1::RolloutsRequest {
            every_node: true,
            ..ask.clone()
        };
        let local = self.rollouts(&every);
        let mut held = self.fleet.lock().await;
        let asked = self.ask_each(&mut held, move |mut tap| {
            let request = every.clone();
            async move {
                match tap.client.rollouts(request).await {
                    Ok(r) => Ok(r.into_inner()),
                    Err(e) => Err(tap.failed(e)),
                }
            }
        });
        let asked = asked.await;
        let known = held.known.clone();
        drop(held);
        let mut answers = vec![(self.name.clone(), local)];
        let mut taps = vec![TapAnswer {
            admin: self.name.clone(),
            ..Default::default()
        }];
        for (admin, answer) in asked {
            match answer {
                Ok(r) => {
                    taps.push(TapAnswer {
                        admin: admin.clone(),
                        ..Default::default()
                    });
                    answers.push((admin, r));
                }
                Err(error) => taps.push(TapAnswer {
                    admin,
                    error,
                    ..Default::default()
                }),
            }
        }
        let mut merged = crate::fanin::rollouts(answers, taps);
        once_silent(&mut merged.taps, &known);
        merged.instance = self.instance.clone();
        merged
    }

    /// A node's recent verdicts, from the tap it is connected to (this one, or a peer asked
    /// for its recent ones), and which tap that is.
    pub async fn node_verdicts(&self, node: &str) -> NodeVerdicts {
        let local = |tap: &str| NodeVerdicts {
            tap: tap.to_string(),
            verdicts: (self.watchers.recent().into_iter())
                .filter(|e| e.node == node && e.kind().is_verdict())
                .map(crate::views::watch::bounded)
                .collect(),
            error: String::new(),
        };
        if self.peers.is_empty() {
            return local(&self.name);
        }
        let status = self.tier_status(Some(node)).await;
        let Some(tap) = status.nodes.first().and_then(|n| n.taps.first()).cloned() else {
            return local(&self.name);
        };
        if tap == self.name {
            return local(&tap);
        }
        let request = crate::api::v1::WatchRequest {
            node: node.replace(['*', '?'], "?"),
            recent_only: true,
            ..Default::default()
        };
        let asked = async {
            let endpoint: crate::proxy::Endpoint = tap.parse().map_err(|e| format!("{e}"))?;
            let mut client = crate::fanin::AdminClient::connect_to(&endpoint, &tap)
                .await
                .map_err(|e| e.to_string())?;
            let mut stream = (client.client.watch(request).await)
                .map_err(|e| client.failed(e).to_string())?
                .into_inner();
            let mut verdicts = Vec::new();
            while let Some(e) = stream
                .message()
                .await
                .map_err(|e| client.failed(e).to_string())?
            {
                if e.node == node {
                    verdicts.push(e);
                }
            }
            Ok::<_, String>(verdicts)
        };
        let (verdicts, error) = match tokio::time::timeout(PEER_TIMEOUT, asked).await {
            Ok(Ok(v)) => (v, String::new()),
            Ok(Err(e)) => (Vec::new(), e),
            Err(_) => (
                Vec::new(),
                crate::fanin::AskError::Silent {
                    admin: tap.clone(),
                    within: PEER_TIMEOUT,
                }
                .to_string(),
            ),
        };
        NodeVerdicts {
            tap,
            verdicts,
            error,
        }
    }

    /// The objects `ask` asks for (or every object), as this tap sees them.
    pub fn objects(
        &self,
        ask: &crate::api::v1::ObjectsRequest,
    ) -> Result<crate::api::v1::ObjectReport, ObjectsError> {
        let specs = (ask.objects.iter())
            .map(|o| o.parse())
            .collect::<Result<Vec<crate::views::board::objects::ObjectSpec>, _>>()?;
        let since = match ask.since.as_str() {
            "" => None,
            s => Some(crate::clock::parse_rfc3339(s).ok_or_else(|| ObjectsError::Since(s.into()))?),
        };
        let mut report = self.status.objects(crate::clock::now(), &specs, since);
        report.instance = self.instance.clone();
        report.started_at = crate::clock::rfc3339(self.started_at);
        Ok(report)
    }

    /// The rollouts `ask` asks for, each named by its trace when spans share one per version.
    pub fn rollouts(&self, ask: &crate::api::v1::RolloutsRequest) -> crate::api::v1::RolloutReport {
        let mut report = self.rollouts.report(crate::clock::now(), ask);
        report.instance = self.instance.clone();
        if let Some(traces) = &self.traces {
            for r in &mut report.rollouts {
                if let Some(id) = traces.of_version(&r.version) {
                    r.trace_id = id.to_string();
                }
            }
        }
        report
    }
}

/// A node's recent verdicts as `/verdicts` gives them.
#[derive(Debug, serde::Serialize)]
pub struct NodeVerdicts {
    /// The tap the node is connected to (or was last seen on), which gave them.
    pub tap: String,
    /// Its last verdicts there, oldest first.
    pub verdicts: Vec<crate::api::v1::WatchEvent>,
    /// Why that tap gave none (empty when it answered).
    pub error: String,
}

/// Why an objects request cannot be answered.
#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    /// An object spelled in a way no object is.
    #[error(transparent)]
    Object(#[from] crate::views::board::objects::ObjectSpecError),
    /// A `since` that is no RFC 3339 time.
    #[error("since {0:?}: expected an RFC 3339 time, as 2026-12-04T10:00:00Z")]
    Since(String),
}

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
pub async fn serve(listener: Listener, admin: Arc<Admin>, max_connections: usize) {
    let grpc = tonic::service::Routes::new(TapServer::new(service::TapApi(admin.clone())))
        .add_service(ClientStatusDiscoveryServiceServer::new(csds::Csds(
            admin.clone(),
        )));
    let grpc = with_reflection(grpc);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let mut failures = crate::proxy::Throttled::new("Accept failed; backing off");
    // The connections' tasks end with the server's (a stopped tap answers no one, even on a
    // connection opened before).
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
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
        connections.spawn(async move {
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
            let report = admin.tier_status(node.as_deref()).await;
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
            let ask = crate::api::v1::RolloutsRequest {
                version: params(query, "version").next().unwrap_or_default(),
                types: params(query, "type").collect(),
                every_node: params(query, "every_node").any(|v| v == "true" || v == "1"),
            };
            json(&admin.tier_rollouts(&ask).await)
        }
        "/verdicts" => match node_param(req.uri().query()) {
            Some(node) => json(&admin.node_verdicts(&node).await),
            None => reply(
                StatusCode::BAD_REQUEST,
                "application/json",
                "{\"error\":\"node: which node's verdicts\"}\n",
            ),
        },
        "/objects" => {
            let query = req.uri().query();
            let ask = crate::api::v1::ObjectsRequest {
                objects: params(query, "object").collect(),
                since: params(query, "since").next().unwrap_or_default(),
            };
            match admin.objects(&ask) {
                Ok(report) => json(&report),
                Err(e) => reply(
                    StatusCode::BAD_REQUEST,
                    "application/json",
                    format!(
                        "{{\"error\":{}}}\n",
                        serde_json::Value::String(e.to_string())
                    ),
                ),
            }
        }
        "/metrics" => {
            // The control plane's reachability as of this scrape, whether or not a client
            // dialled it lately (the look reuses /readyz's kept connection: no dial while up).
            let _ = admin.look_upstream().await;
            reply(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                crate::outputs::metrics::render(&admin.registry),
            )
        }
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz"
            if admin
                .proxy
                .draining
                .load(std::sync::atomic::Ordering::Relaxed) =>
        {
            reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "draining: shutting down, send new clients elsewhere\n",
            )
        }
        "/readyz" => match admin.look_upstream().await {
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
