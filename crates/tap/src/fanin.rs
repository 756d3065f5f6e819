//! Several taps asked as one, as the CLI asks them and as a tap's admin server asks its peers
//! (`admin.peers`): their gRPC API on their admin addresses, over TCP or a Unix socket. A
//! name that resolves to several addresses (a Kubernetes headless Service) stands for each.
//! Every tap is asked at once, and their answers merge into one report: a node seen by several
//! taps (it reconnected to another replica, say) is one row, the view of its newest stream
//! first; a rollout counts each node once. A tap that did not answer is named in the report
//! (`taps`), so a partial answer never reads as a complete one.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::codegen::Service;
use tonic::transport::{Channel, Uri};

use crate::api::csds::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
use crate::api::v1::rollout_node::Standing;
use crate::api::v1::tap_client::TapClient;
use crate::api::v1::{
    NackGroup, NodeStatus, ObjectNode, Rollout, RolloutNode, RolloutReport, StatusReport, TapAnswer,
};
use crate::proxy::{AddressError, Endpoint};

/// How long a connect to the tap may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer read from a tap: a fleet's rollouts with every node listed, or its CSDS,
/// run to tens of megabytes (gRPC's default limit is 4 MiB).
const MAX_ANSWER: usize = 1 << 30;

/// Why the tap could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// A bad address.
    #[error("invalid tap address {admin:?}: {reason}")]
    Address {
        /// The address given.
        admin: String,
        /// What is wrong with it.
        reason: AddressError,
    },
    /// An address tonic cannot make a URI of.
    #[error("invalid tap address {admin:?}: {reason}")]
    Uri {
        /// The address given.
        admin: String,
        /// Why.
        reason: http::uri::InvalidUri,
    },
    /// Nothing listens at the address.
    #[error("{admin}: refused (nothing listens there)")]
    Refused {
        /// The address.
        admin: String,
    },
    /// Connected (or connecting), and no answer came in time.
    #[error("{admin}: no answer within {} s", within.as_secs_f64())]
    Silent {
        /// The address.
        admin: String,
        /// How long it was given.
        within: Duration,
    },
    /// Something answered, and it is no xdstap's admin API.
    #[error("{admin}: not an xdstap ({what} answered)")]
    NotTap {
        /// The address.
        admin: String,
        /// What answered: `an HTTP/1 server`, `a gRPC server without xdstap's API`.
        what: String,
    },
    /// A TLS server answered: the admin API is plain HTTP/2.
    #[error("{admin}: TLS failure (it answered with TLS; a tap's admin API is plain HTTP/2)")]
    Tls {
        /// The address.
        admin: String,
    },
    /// No connection, for another reason.
    #[error("{admin}: cannot connect: {why}")]
    Connect {
        /// The address.
        admin: String,
        /// The innermost cause (no such file, a name that does not resolve).
        why: String,
    },
    /// The call failed.
    #[error("{admin}: the tap answered: {}", status.message())]
    Call {
        /// The address.
        admin: String,
        /// The tap's answer.
        status: tonic::Status,
    },
    /// Several taps asked, and none answered.
    #[error("no tap answered: {}", .0.join("; "))]
    Nobody(Vec<String>),
}

/// A connected client of the tap at `admin`.
#[derive(Clone)]
pub struct AdminClient {
    /// The generated client.
    pub client: TapClient<Channel>,
    /// CSDS on the same connection.
    pub csds: ClientStatusDiscoveryServiceClient<Channel>,
    /// The address, for messages.
    pub admin: String,
}

impl AdminClient {
    /// Connects to `endpoint`, named `admin` in messages.
    pub async fn connect_to(endpoint: &Endpoint, admin: &str) -> Result<AdminClient, AskError> {
        let failed = |e: tonic::transport::Error| {
            // The innermost source says why (refused, no such file).
            let mut why: &dyn std::error::Error = &e;
            while let Some(inner) = why.source() {
                why = inner;
            }
            let admin = admin.to_string();
            match why.downcast_ref::<std::io::Error>().map(|e| e.kind()) {
                Some(std::io::ErrorKind::ConnectionRefused) => AskError::Refused { admin },
                Some(std::io::ErrorKind::TimedOut) => AskError::Silent {
                    admin,
                    within: CONNECT_TIMEOUT,
                },
                _ if why.to_string().contains("timed out") => AskError::Silent {
                    admin,
                    within: CONNECT_TIMEOUT,
                },
                _ => AskError::Connect {
                    admin,
                    why: why.to_string(),
                },
            }
        };
        let channel = match endpoint {
            Endpoint::Tcp(a) => {
                let uri = format!("http://{a}");
                (Channel::from_shared(uri).map_err(|reason| AskError::Uri {
                    admin: admin.into(),
                    reason,
                })?)
                .connect_timeout(CONNECT_TIMEOUT)
                .connect()
                .await
                .map_err(failed)?
            }
            // The URI is not used: the connector dials the socket.
            Endpoint::Unix(path) => (Channel::from_static("http://xdstap.admin"))
                .connect_timeout(CONNECT_TIMEOUT)
                .connect_with_connector(UnixConnector(path.clone()))
                .await
                .map_err(failed)?,
        };
        Ok(AdminClient {
            csds: ClientStatusDiscoveryServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_ANSWER),
            client: TapClient::new(channel).max_decoding_message_size(MAX_ANSWER),
            admin: admin.to_string(),
        })
    }

    /// A failed call, as an error naming the tap: a server that does not know the call is no
    /// tap (a tap of another version names what it lacks in its message).
    pub fn failed(&self, status: tonic::Status) -> AskError {
        let admin = self.admin.clone();
        match status.code() {
            tonic::Code::Unimplemented if !status.message().contains("xdstap") => {
                AskError::NotTap {
                    admin,
                    what: "a gRPC server without xdstap's API".into(),
                }
            }
            _ => AskError::Call { admin, status },
        }
    }
}

/// A call's failure that no tap's answer makes: the connection's (a protocol error, a reset).
fn below_grpc(status: &tonic::Status) -> bool {
    use std::error::Error;
    status.source().is_some()
        || matches!(status.code(), tonic::Code::Unknown | tonic::Code::Internal)
}

/// How long the probe of a peer that failed a call may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What answers at `endpoint`, when a call failed below gRPC (a protocol error): it is sent
/// HTTP/2's preface and what it says back is read. `None` when it speaks HTTP/2 (the call's
/// own error says more).
async fn probe(endpoint: &Endpoint, admin: &str) -> Option<AskError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let admin = admin.to_string();
    let said = tokio::time::timeout(PROBE_TIMEOUT, async {
        let mut io = crate::proxy::Connector::new(endpoint.clone(), None)
            .dial(PROBE_TIMEOUT)
            .await
            .ok()?;
        let mut hello = crate::proxy::PREFACE.to_vec();
        hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        io.write_all(&hello).await.ok()?;
        let mut first = [0u8; 16];
        let n = io.read(&mut first).await.ok()?;
        Some(first[..n].to_vec())
    })
    .await;
    let what = match said {
        Err(_) => {
            return Some(AskError::Silent {
                admin,
                within: PROBE_TIMEOUT,
            })
        }
        Ok(None) => return None,
        Ok(Some(b)) if b.is_empty() => "something that closed the connection",
        Ok(Some(b)) if b.starts_with(b"HTTP/") => "an HTTP/1 server",
        Ok(Some(b)) if matches!(b[..], [0x15 | 0x16, 0x03, ..]) => {
            return Some(AskError::Tls { admin })
        }
        // A frame header: SETTINGS (type 4) is an HTTP/2 server's first word.
        Ok(Some(b)) if b.len() >= 4 && b[3] == 4 => return None,
        Ok(Some(_)) => "something that does not speak HTTP",
    };
    Some(AskError::NotTap {
        admin,
        what: what.into(),
    })
}

/// Dials a Unix socket for tonic.
#[derive(Clone)]
struct UnixConnector(PathBuf);

impl Service<Uri> for UnixConnector {
    type Response = TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            tokio::net::UnixStream::connect(path)
                .await
                .map(TokioIo::new)
        })
    }
}

/// Nodes listed per list of a merged rollout (as a tap lists them).
const LISTED: usize = 20;
/// Example nodes per merged NACK group (as a tap gives them).
const EXAMPLES: usize = 5;

/// How long a tap is given to answer (connecting included) unless told otherwise.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The taps a command asks.
pub struct Fleet {
    taps: Vec<Tap>,
    /// How long each is given to answer.
    timeout: Duration,
}

/// One tap: how it is named, where it is, and its connection once made.
struct Tap {
    admin: String,
    /// Where it is, or why it cannot be asked (a name that does not resolve).
    endpoint: Result<Endpoint, String>,
    client: Option<AdminClient>,
}

impl Fleet {
    /// The taps `given` names, each DNS name expanded to every address it resolves to (named
    /// by that address when there are several). A malformed address is a usage error.
    pub async fn resolve(given: &[String]) -> Result<Fleet, AskError> {
        let mut taps: Vec<Tap> = Vec::new();
        let mut add = |admin: String, endpoint: Result<Endpoint, String>| {
            if !taps.iter().any(|t| t.admin == admin) {
                taps.push(Tap {
                    admin,
                    endpoint,
                    client: None,
                });
            }
        };
        for admin in given.iter().map(|a| a.trim()).filter(|a| !a.is_empty()) {
            let endpoint: Endpoint = admin.parse().map_err(|reason| AskError::Address {
                admin: admin.into(),
                reason,
            })?;
            let Endpoint::Tcp(addr) = &endpoint else {
                add(admin.to_string(), Ok(endpoint));
                continue;
            };
            if endpoint
                .host()
                .is_some_and(|h| h.parse::<std::net::IpAddr>().is_ok())
            {
                add(admin.to_string(), Ok(endpoint));
                continue;
            }
            let found = tokio::net::lookup_host(addr.clone()).await;
            match found {
                Err(e) => add(admin.to_string(), Err(format!("cannot resolve it: {e}"))),
                Ok(found) => {
                    let mut found: Vec<std::net::SocketAddr> = found.collect();
                    found.sort();
                    found.dedup();
                    match found.len() {
                        0 => add(admin.to_string(), Err("it resolves to no address".into())),
                        1 => add(admin.to_string(), Ok(endpoint)),
                        _ => {
                            for a in found {
                                add(a.to_string(), Ok(Endpoint::Tcp(a.to_string())));
                            }
                        }
                    }
                }
            }
        }
        if taps.is_empty() {
            return Err(AskError::Address {
                admin: given.join(","),
                reason: AddressError::NoPort,
            });
        }
        Ok(Fleet {
            taps,
            timeout: ANSWER_TIMEOUT,
        })
    }

    /// Gives each tap `timeout` to answer (connecting included); past it, it is named as
    /// giving no answer within it.
    pub fn with_timeout(mut self, timeout: Duration) -> Fleet {
        self.timeout = timeout;
        self
    }

    /// How many taps it asks.
    pub fn count(&self) -> usize {
        self.taps.len()
    }

    /// Asks every tap with `call` at once, connecting to those not yet connected (a tap that
    /// could not be reached is dialled again on the next ask): each tap's name and answer, in
    /// order.
    pub async fn ask<T, F, Fut>(&mut self, call: F) -> Vec<(String, Result<T, AskError>)>
    where
        T: Send + 'static,
        F: Fn(AdminClient) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<T, AskError>> + Send + 'static,
    {
        let mut asks = tokio::task::JoinSet::new();
        for (i, tap) in self.taps.iter_mut().enumerate() {
            let admin = tap.admin.clone();
            let endpoint = tap.endpoint.clone();
            let client = tap.client.take();
            let call = call.clone();
            let within = self.timeout;
            asks.spawn(async move {
                let silent = |admin: &str| AskError::Silent {
                    admin: admin.into(),
                    within,
                };
                let (to, at) = (endpoint.clone(), admin.clone());
                let asked = tokio::time::timeout(within, async move {
                    let (endpoint, admin) = (to, at);
                    let client = match (client, &endpoint) {
                        (Some(c), _) => c,
                        (None, Ok(e)) => match AdminClient::connect_to(e, &admin).await {
                            Ok(c) => c,
                            Err(e) => return (None, Err(e)),
                        },
                        (None, Err(why)) => {
                            let (admin, why) = (admin.clone(), why.clone());
                            return (None, Err(AskError::Connect { admin, why }));
                        }
                    };
                    let answer = call(client.clone()).await;
                    let reachable = match &answer {
                        Err(AskError::Call { status, .. }) => {
                            status.code() != tonic::Code::Unavailable
                        }
                        other => other.is_ok(),
                    };
                    (reachable.then_some(client), answer)
                });
                let (client, answer) = match asked.await {
                    Ok(done) => done,
                    Err(_) => (None, Err(silent(&admin))),
                };
                // A call that failed below gRPC: say what answered instead.
                let answer = match (answer, &endpoint) {
                    (Err(AskError::Call { status, admin }), Ok(e)) if below_grpc(&status) => {
                        match probe(e, &admin).await {
                            Some(said) => Err(said),
                            None => Err(AskError::Call { status, admin }),
                        }
                    }
                    (answer, _) => answer,
                };
                (i, client, answer)
            });
        }
        let mut answers: Vec<Option<Result<T, AskError>>> =
            (0..self.taps.len()).map(|_| None).collect();
        while let Some(done) = asks.join_next().await {
            if let Ok((i, client, answer)) = done {
                self.taps[i].client = client;
                answers[i] = Some(answer);
            }
        }
        (self.taps.iter().zip(answers))
            .map(|(tap, answer)| {
                let answer = answer.unwrap_or_else(|| {
                    Err(AskError::Connect {
                        admin: tap.admin.clone(),
                        why: "the ask failed".into(),
                    })
                });
                (tap.admin.clone(), answer)
            })
            .collect()
    }
}

/// What the taps that answered said, each with its name; and every tap asked, with why it did
/// not answer (empty when it did).
pub type Answers<T> = (Vec<(String, T)>, Vec<TapAnswer>);

/// The answers split into [`Answers`]. `Err` with the first tap's error when none answered.
pub fn split<T>(answers: Vec<(String, Result<T, AskError>)>) -> Result<Answers<T>, AskError> {
    let mut ok = Vec::new();
    let mut taps = Vec::new();
    let mut first = None;
    for (admin, answer) in answers {
        match answer {
            Ok(t) => {
                taps.push(TapAnswer {
                    admin: admin.clone(),
                    ..Default::default()
                });
                ok.push((admin, t));
            }
            Err(e) => {
                taps.push(TapAnswer {
                    admin,
                    error: e.to_string(),
                    ..Default::default()
                });
                first.get_or_insert(e);
            }
        }
    }
    match (ok.is_empty(), first) {
        (true, Some(e)) if taps.len() == 1 => Err(e),
        (true, Some(_)) => Err(AskError::Nobody(
            taps.into_iter().map(|t| t.error).collect(),
        )),
        _ => Ok((ok, taps)),
    }
}

/// A report that names the tap process that made it.
pub trait Instance {
    /// The process's id (empty from a tap too old to say).
    fn instance(&self) -> &str;
}

impl Instance for StatusReport {
    fn instance(&self) -> &str {
        &self.instance
    }
}

impl Instance for RolloutReport {
    fn instance(&self) -> &str {
        &self.instance
    }
}

impl Instance for crate::api::v1::ObjectReport {
    fn instance(&self) -> &str {
        &self.instance
    }
}

/// Each tap once: answers from a tap already answered on another address (one tap named
/// `localhost:9977` and `127.0.0.1:9977`) are dropped, and the address is listed with the
/// first (`also`), its own entry gone from `taps`.
pub fn once<T: Instance>(answers: Vec<(String, T)>, taps: &mut Vec<TapAnswer>) -> Vec<(String, T)> {
    let mut first: HashMap<String, String> = HashMap::new();
    let mut kept = Vec::with_capacity(answers.len());
    for (admin, report) in answers {
        let id = report.instance().to_string();
        match first.get(&id) {
            Some(at) if !id.is_empty() => {
                if let Some(t) = taps.iter_mut().find(|t| &t.admin == at) {
                    if t.admin != admin && !t.also.contains(&admin) {
                        t.also.push(admin.clone());
                    }
                }
                if let Some(i) = taps
                    .iter()
                    .position(|t| t.admin == admin && t.error.is_empty())
                {
                    taps.remove(i);
                }
            }
            _ => {
                first.insert(id, admin.clone());
                kept.push((admin, report));
            }
        }
    }
    kept
}

/// Whether some tap asked did not answer.
pub fn is_partial(taps: &[TapAnswer]) -> bool {
    taps.iter().any(|t| !t.error.is_empty())
}

/// One status report of several taps'. A node one tap sees is as that tap says, named by it
/// (`taps`); a node several see is one row: the view of its newest stream (a connected one
/// first, then the latest seen), with the others' under `elsewhere`.
pub fn status(answers: Vec<(String, StatusReport)>, mut taps: Vec<TapAnswer>) -> StatusReport {
    let answers = once(answers, &mut taps);
    let mut merged = StatusReport {
        taps,
        ..Default::default()
    };
    let mut by_id: BTreeMap<String, Vec<NodeStatus>> = BTreeMap::new();
    for (admin, report) in answers {
        if report.generated_at > merged.generated_at {
            merged.generated_at = report.generated_at;
        }
        merged.stale_after_seconds = merged.stale_after_seconds.max(report.stale_after_seconds);
        for mut node in report.nodes {
            node.taps = vec![admin.clone()];
            by_id.entry(node.id.clone()).or_default().push(node);
        }
    }
    for (_, mut views) in by_id {
        // Stable: between equals, the tap given first.
        views.sort_by(|a, b| (b.connected, &b.last_seen).cmp(&(a.connected, &a.last_seen)));
        let mut views = views.into_iter();
        let mut node = views.next().expect("one view at least");
        node.elsewhere = views.collect();
        let others = node.elsewhere.iter().flat_map(|n| n.taps.iter().cloned());
        node.taps.extend(others.collect::<Vec<_>>());
        merged.nodes.push(node);
    }
    merged.rejected_objects = crate::api::rejected_objects(&merged.nodes);
    merged
}

/// How a node stands, as a tap says; a value this CLI does not know ranks with the accepted.
fn standing(n: &RolloutNode) -> Standing {
    match n.state() {
        Standing::Unspecified => Standing::Acked,
        s => s,
    }
}

/// One version of one type over the taps that pushed it: each node as its newest push left
/// it, and the group of its NACK (the message's key, and the group as first seen).
#[derive(Default)]
struct Version {
    parts: Vec<Rollout>,
    nodes: BTreeMap<String, (RolloutNode, Option<NackGroup>)>,
}

/// One rollout report of several taps' (each asked with `every_node`): per type and version,
/// the nodes counted once, each as its newest push left it.
pub fn rollouts(answers: Vec<(String, RolloutReport)>, mut taps: Vec<TapAnswer>) -> RolloutReport {
    let answers = once(answers, &mut taps);
    let mut merged = RolloutReport {
        taps,
        ..Default::default()
    };
    let mut versions: BTreeMap<(String, String), Version> = BTreeMap::new();
    for (admin, report) in answers {
        if report.generated_at > merged.generated_at {
            merged.generated_at = report.generated_at;
        }
        for mut r in report.rollouts {
            let v = versions
                .entry((r.type_url.clone(), r.version.clone()))
                .or_default();
            for mut n in std::mem::take(&mut r.nodes) {
                n.tap = admin.clone();
                let group = (n.nack_group as usize)
                    .checked_sub(1)
                    .and_then(|g| r.nacks.get(g).cloned());
                let newer = match v.nodes.get(&n.node) {
                    Some((seen, _)) => n.pushed_at > seen.pushed_at,
                    None => true,
                };
                if newer {
                    v.nodes.insert(n.node.clone(), (n, group));
                }
            }
            v.parts.push(r);
        }
    }
    let mut all: Vec<Rollout> = versions.into_values().map(version).collect();
    moved_on(&mut all);
    all.sort_by(|a, b| b.first_push.cmp(&a.first_push));
    for r in &mut all {
        r.nodes.clear();
    }
    merged.rollouts = all;
    merged
}

/// A merged version's rollout, its node list kept for [`moved_on`].
fn version(v: Version) -> Rollout {
    let first = &v.parts[0];
    let mut r = Rollout {
        r#type: first.r#type.clone(),
        type_url: first.type_url.clone(),
        version: first.version.clone(),
        first_push: (v.parts.iter().map(|p| &p.first_push).min().cloned()).unwrap_or_default(),
        last_push: (v.parts.iter().map(|p| &p.last_push).max().cloned()).unwrap_or_default(),
        last_answer: v.parts.iter().filter_map(|p| p.last_answer.clone()).max(),
        since_last_push_seconds: (v.parts.iter())
            .map(|p| p.since_last_push_seconds)
            .fold(f64::INFINITY, f64::min),
        pushed: v.nodes.len() as u64,
        ..Default::default()
    };
    let mut latencies: Vec<f64> = Vec::new();
    let mut groups: Vec<(String, NackGroup)> = Vec::new();
    let mut behind: Vec<&RolloutNode> = Vec::new();
    for (n, group) in v.nodes.values() {
        let s = standing(n);
        match s {
            Standing::Acked | Standing::Unspecified => r.acked += 1,
            Standing::Nacked => r.nacked += 1,
            Standing::Partial => {
                r.nacked += 1;
                r.partial += 1;
            }
            Standing::Superseded => r.superseded += 1,
            Standing::Unanswered => r.unanswered += 1,
            Standing::Pending => r.pending += 1,
        }
        latencies.extend(n.latency_ms);
        match s {
            Standing::Acked if r.acked_nodes.len() < LISTED => r.acked_nodes.push(n.node.clone()),
            Standing::Acked => {}
            _ => behind.push(n),
        }
        if let Some(g) = group {
            let key = crate::api::v1::NackGroup::key(&g.message);
            let i = match groups.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    let fresh = NackGroup {
                        nodes: 0,
                        examples: Vec::new(),
                        ..g.clone()
                    };
                    groups.push((key, fresh));
                    groups.len() - 1
                }
            };
            let merged = &mut groups[i].1;
            merged.nodes += 1;
            if merged.examples.len() < EXAMPLES {
                merged.examples.push(n.node.clone());
            }
        }
    }
    latencies.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        let i = ((latencies.len() as f64 * q).ceil() as usize).saturating_sub(1);
        latencies.get(i).copied().unwrap_or(0.0)
    };
    (r.latency_p50_ms, r.latency_p90_ms) = (pct(0.5), pct(0.9));
    r.latency_max_ms = latencies.last().copied().unwrap_or(0.0);
    behind.sort_by(|a, b| {
        (standing(a), &a.pushed_at, &a.node).cmp(&(standing(b), &b.pushed_at, &b.node))
    });
    r.behind = behind.into_iter().take(LISTED).cloned().collect();
    groups.sort_by_key(|(_, g)| std::cmp::Reverse(g.nodes));
    r.nacks = groups.into_iter().map(|(_, g)| g).collect();
    r.nodes = v.nodes.into_values().map(|(n, _)| n).collect();
    r
}

/// Counts, per merged rollout, the nacked and unanswered nodes that accepted a newer version
/// of the type since (first pushed later).
fn moved_on(all: &mut [Rollout]) {
    let mut acked: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
    for r in all.iter() {
        for n in r.nodes.iter().filter(|n| standing(n) == Standing::Acked) {
            acked
                .entry((&r.type_url, &n.node))
                .or_default()
                .push(&r.first_push);
        }
    }
    let counts: Vec<u64> = (all.iter())
        .map(|r| {
            (r.nodes.iter())
                .filter(|n| standing(n).missed())
                .filter(|n| {
                    (acked.get(&(r.type_url.as_str(), n.node.as_str())))
                        .is_some_and(|firsts| firsts.iter().any(|f| **f > *r.first_push))
                })
                .count() as u64
        })
        .collect();
    for (r, c) in all.iter_mut().zip(counts) {
        r.moved_on = c;
    }
}

/// One object report of several taps': each object once (in the order asked, or most nodes
/// first), each node once, as the tap it is connected to sees it (else the tap that saw it
/// pushed last), its counts made again from the nodes; a listing without nodes adds the taps'
/// counts. `started_at` is the latest of the taps' starts.
pub fn objects(
    answers: Vec<(String, crate::api::v1::ObjectReport)>,
    mut taps: Vec<TapAnswer>,
) -> crate::api::v1::ObjectReport {
    use crate::api::v1::{ObjectReport, ObjectStatus};
    let answers = once(answers, &mut taps);
    let mut merged = ObjectReport {
        taps,
        ..Default::default()
    };
    // By the object's spelling (asked) or its label (listed), in the order first seen.
    let mut order: Vec<String> = Vec::new();
    let mut by: BTreeMap<String, (ObjectStatus, BTreeMap<String, ObjectNode>)> = BTreeMap::new();
    for (admin, report) in answers {
        merged.generated_at = merged.generated_at.max(report.generated_at);
        merged.started_at = merged.started_at.max(report.started_at);
        merged.connected += report.connected;
        for o in report.objects {
            let key = match (&o.asked, &o.object) {
                (a, _) if !a.is_empty() => a.clone(),
                (_, Some(object)) => object.label(),
                _ => continue,
            };
            let e = by.entry(key.clone()).or_insert_with(|| {
                order.push(key.clone());
                let first = ObjectStatus {
                    asked: o.asked.clone(),
                    ..Default::default()
                };
                (first, BTreeMap::new())
            });
            merge_object(e, o, &admin);
        }
    }
    for key in order {
        if let Some((o, nodes)) = by.remove(&key) {
            merged.objects.push(recount(o, nodes));
        }
    }
    merged
}

/// One tap's view `o` of an object into the merged one `m` (and its nodes, each kept from
/// the tap it is connected to, else the one that pushed it last).
fn merge_object(
    (m, seen): &mut (crate::api::v1::ObjectStatus, BTreeMap<String, ObjectNode>),
    mut o: crate::api::v1::ObjectStatus,
    admin: &str,
) {
    let nodes = std::mem::take(&mut o.node_states);
    if m.object.is_none() {
        m.object = o.object.clone();
    }
    for s in o.sections {
        if !m.sections.contains(&s) {
            m.sections.push(s);
        }
    }
    for r in o.resources {
        if !(m.resources.iter()).any(|x| x.type_url == r.type_url && x.name == r.name) {
            m.resources.push(r);
        }
    }
    m.resource_count = (m.resource_count.max(o.resource_count)).max(m.resources.len() as u64);
    m.out_of_scope += o.out_of_scope;
    m.last_pushed = m.last_pushed.clone().max(o.last_pushed);
    for p in o.pushes {
        match (m.pushes.iter_mut()).find(|x| x.r#type == p.r#type && x.version == p.version) {
            Some(x) => {
                x.nodes += p.nodes;
                x.at = x.at.clone().min(p.at);
            }
            None => m.pushes.push(p),
        }
    }
    if nodes.is_empty() {
        // A listing: counts only.
        m.nodes += o.nodes;
        m.taken += o.taken;
        m.pending += o.pending;
        m.rejected += o.rejected;
        m.not_pushed += o.not_pushed;
        m.disconnected += o.disconnected;
    }
    for mut n in nodes {
        n.tap = admin.to_string();
        let last = |n: &ObjectNode| n.resources.iter().map(|r| r.pushed_at.clone()).max();
        let better = match seen.get(&n.node) {
            None => true,
            Some(s) => (n.connected, last(&n)) > (s.connected, last(s)),
        };
        if better {
            seen.insert(n.node.clone(), n);
        }
    }
}

/// A merged object with its nodes, counted from them (a listing keeps its summed counts).
fn recount(
    mut o: crate::api::v1::ObjectStatus,
    nodes: BTreeMap<String, ObjectNode>,
) -> crate::api::v1::ObjectStatus {
    use crate::api::v1::object_node::Standing;
    if !nodes.is_empty() {
        let count = |s: Standing| nodes.values().filter(|n| n.state() == s).count() as u64;
        o.nodes = nodes.len() as u64;
        o.taken = count(Standing::Taken);
        o.pending = count(Standing::Pending);
        o.rejected = count(Standing::Rejected);
        o.not_pushed = count(Standing::NotPushed);
        o.disconnected = count(Standing::Disconnected);
        let mut all: Vec<ObjectNode> = nodes.into_values().collect();
        all.sort_by(|a, b| a.state.cmp(&b.state).then(a.node.cmp(&b.node)));
        o.node_states = all;
    }
    o.pushes.sort_by(|a, b| b.at.cmp(&a.at));
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1::SyncState;

    fn node(id: &str, connected: bool, last_seen: &str, state: SyncState) -> NodeStatus {
        NodeStatus {
            id: id.into(),
            connected,
            last_seen: last_seen.into(),
            state: state as i32,
            ..Default::default()
        }
    }

    #[test]
    fn a_node_on_two_taps_is_one_row_its_newest_stream_first() {
        let a = StatusReport {
            generated_at: "t1".into(),
            nodes: vec![
                node(
                    "n1",
                    false,
                    "2026-01-01T00:00:09.000000Z",
                    SyncState::Nacked,
                ),
                node("n2", true, "2026-01-01T00:00:01.000000Z", SyncState::Synced),
            ],
            ..Default::default()
        };
        let b = StatusReport {
            generated_at: "t2".into(),
            nodes: vec![node(
                "n1",
                true,
                "2026-01-01T00:00:05.000000Z",
                SyncState::Synced,
            )],
            ..Default::default()
        };
        let r = status(vec![("A".into(), a), ("B".into(), b)], vec![]);
        assert_eq!(r.generated_at, "t2");
        let ids: Vec<&str> = r.nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["n1", "n2"]);
        // Connected beats seen later: B's stream is the live one.
        assert_eq!(r.nodes[0].state(), SyncState::Synced);
        assert_eq!(r.nodes[0].taps, ["B", "A"]);
        assert_eq!(r.nodes[0].elsewhere.len(), 1);
        assert_eq!(r.nodes[0].elsewhere[0].state(), SyncState::Nacked);
        assert_eq!(r.nodes[1].taps, ["A"]);
    }

    fn seen(node: &str, state: Standing, pushed_at: &str, group: u32) -> RolloutNode {
        RolloutNode {
            node: node.into(),
            state: state as i32,
            pushed_at: pushed_at.into(),
            latency_ms: (state != Standing::Pending).then_some(2.0),
            nack_group: group,
            ..Default::default()
        }
    }

    fn version(v: &str, first_push: &str, nodes: Vec<RolloutNode>, nack: &str) -> Rollout {
        Rollout {
            r#type: "CDS".into(),
            type_url: "t/envoy.config.cluster.v3.Cluster".into(),
            version: v.into(),
            first_push: first_push.into(),
            last_push: first_push.into(),
            nodes,
            nacks: vec![NackGroup {
                message: nack.into(),
                nodes: 1,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn rollouts_count_each_node_once_as_its_newest_push_left_it() {
        // n1 rejected v2 on tap A, reconnected to B, was pushed v2 again and rejected it again
        // (the same message, its debug marker spelled otherwise); n2 is on B alone.
        let a = RolloutReport {
            rollouts: vec![version(
                "v2",
                "2",
                vec![seen(
                    "n1",
                    Standing::Nacked,
                    "2026-01-01T00:00:02.000000Z",
                    1,
                )],
                "bad b goo.gle/debugonly",
            )],
            ..Default::default()
        };
        let b = RolloutReport {
            rollouts: vec![
                version(
                    "v3",
                    "3",
                    vec![
                        seen("n1", Standing::Acked, "2026-01-01T00:00:03.000000Z", 0),
                        seen("n2", Standing::Pending, "2026-01-01T00:00:03.000000Z", 0),
                    ],
                    "",
                ),
                version(
                    "v2",
                    "2",
                    vec![
                        seen("n1", Standing::Nacked, "2026-01-01T00:00:02.500000Z", 1),
                        seen("n2", Standing::Acked, "2026-01-01T00:00:02.000000Z", 0),
                    ],
                    "bad b  goo.gle/debugstr",
                ),
            ],
            ..Default::default()
        };
        let r = rollouts(vec![("A".into(), a), ("B".into(), b)], vec![]);
        let versions: Vec<&str> = r.rollouts.iter().map(|r| r.version.as_str()).collect();
        assert_eq!(versions, ["v3", "v2"], "newest first");
        let v2 = &r.rollouts[1];
        assert_eq!((v2.pushed, v2.acked, v2.nacked), (2, 1, 1));
        assert_eq!(v2.nacks.len(), 1);
        assert_eq!(
            (v2.nacks[0].nodes, &v2.nacks[0].examples[..]),
            (1, &["n1".to_string()][..])
        );
        assert_eq!(v2.behind[0].tap, "B", "the newer push's view");
        assert_eq!(v2.moved_on, 1, "n1 took v3 since");
        assert!(v2.nodes.is_empty(), "the node lists stay behind");
        let v3 = &r.rollouts[0];
        assert_eq!((v3.pushed, v3.acked, v3.pending, v3.moved_on), (2, 1, 1, 0));
    }
}
