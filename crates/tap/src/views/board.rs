//! The live sync status: per client node and type, SYNCED / NACKED / STALE / PENDING / NOT SENT,
//! with versions, the last error and counts. Fed by events on the sinks' thread, read by the
//! admin server. Memory is bounded: disconnected nodes are forgotten after a while, and past
//! `max_nodes` the longest-idle node goes first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::api::NAMES_CAP;
use crate::clock::rfc3339;
use crate::correlate::{Event, Push, Timestamp, Verdict};
use crate::queue::Sink;
use crate::xds::{short_type, Api};

pub mod objects;
pub mod resources;
use crate::api::v1::{Nack, NodeStatus, ResourceError, StatusReport, SyncState, TypeStatus};
use resources::{CpErrors, Held, ListenerNeeds, Ttls, Unsettled};

/// How the board ages entries.
#[derive(Clone, Debug)]
pub struct StatusSettings {
    /// A push unanswered this long makes its type STALE.
    pub stale_after: Duration,
    /// A node with no connected stream is forgotten after this long.
    pub forget_after: Duration,
    /// At most this many nodes are kept.
    pub max_nodes: usize,
}

impl Default for StatusSettings {
    fn default() -> Self {
        StatusSettings {
            stale_after: Duration::from_secs(30),
            forget_after: Duration::from_secs(600),
            max_nodes: 100_000,
        }
    }
}

#[derive(Default)]
struct TypeEntry {
    version_sent: Option<String>,
    version_accepted: Option<String>,
    nonce: Option<String>,
    last_push_at: Option<Timestamp>,
    pending: Option<(String, Timestamp)>,
    latency_ns: Option<u64>,
    // Counts per node and type: a u32 each (saturating), which a push a second fills in 136
    // years.
    pushes: u32,
    acks: u32,
    nacks: u32,
    superseded: u32,
    unanswered: u32,
    nonce_reuses: u32,
    rejected_resends: u32,
    nack: Option<Box<(Nack, Timestamp)>>,
    /// When the client first asked for the type (none: it never did, pushes came unasked).
    subscribed_at: Option<Timestamp>,
    /// The client, reconnecting, stated what it runs of the type (a SotW version, Delta
    /// resource versions): it runs config, whether or not anything is pushed.
    stated: bool,
    /// When the type became SYNCED: the ACK after a NACK, or the first.
    acked_at: Option<Timestamp>,
    /// The open CDS push that waits for EDS, and the EDS names it waits for.
    warming: Option<Box<(String, Vec<String>)>>,
    /// The type's last message either way.
    last_message: Timestamp,
    /// What the node accepted, per resource (for CSDS).
    held: Option<Held>,
    /// The last push not accepted: pending, or NACKed.
    unsettled: Option<Box<Unsettled>>,
    /// The names the client asks for, while they are few (for CSDS's NOT_SENT).
    requested: resources::Requested,
    /// SotW or Delta, as the type's last stream speaks.
    api: Option<Api>,
    /// What few types of few nodes have; boxed, so that the rest pay a pointer.
    rare: Option<Box<Rare>>,
    /// Heartbeats answered: pushes of bare wrappers only, no new content.
    heartbeats: u32,
}

/// What few types of few nodes have.
#[derive(Default)]
struct Rare {
    /// The control plane's `resource_errors`, each until the resource arrives.
    cp_errors: CpErrors,
    /// The TTL clocks of what the node runs (resources pushed with a TTL).
    ttls: Ttls,
    /// Delta: names asked for that the control plane removed (it has none).
    absent: Vec<String>,
    /// LDS: what each listener needs (RDS, SDS names).
    needs: ListenerNeeds,
}

impl TypeEntry {
    /// What few types have: the box there is, or a new one when `needed`.
    fn rare_if(&mut self, needed: bool) -> Option<&mut Rare> {
        if needed && self.rare.is_none() {
            self.rare = Some(Box::default());
        }
        self.rare.as_deref_mut()
    }

    /// Applies one event of this type.
    fn apply(&mut self, event: &Event, now: Timestamp) {
        let context = event.context();
        self.last_message = self.last_message.max(now);
        if matches!(
            event,
            Event::Subscribe { .. } | Event::Resubscribe { .. } | Event::SubscriptionChange { .. }
        ) {
            self.subscribed_at.get_or_insert(now);
        }
        self.requested.apply(event);
        if context.stream.api.is_some() {
            self.api = context.stream.api;
        }
        match event {
            Event::Resubscribe { version, .. } => {
                self.stated = true;
                if !version.is_empty() && self.version_accepted.is_none() {
                    self.version_accepted = Some(version.clone());
                }
            }
            // A heartbeat is no push: it changes no content, and only its answer counts.
            Event::Push { push, .. } if push.heartbeat() => {}
            Event::Push { push, .. } => {
                self.unsettled = Some(Box::new(Unsettled::new(push.clone())));
                self.pushes = self.pushes.saturating_add(1);
                if let Some(rare) = self.rare_if(!push.resource_errors.is_empty()) {
                    rare.cp_errors.on_push(push);
                }
                if push.resent_rejected > 0 {
                    self.rejected_resends = self.rejected_resends.saturating_add(1);
                }
                self.version_sent = Some(push.version.clone());
                self.nonce = Some(push.nonce.clone());
                self.last_push_at = Some(push.at);
                self.pending = Some((push.nonce.clone(), push.at));
            }
            Event::Verdict {
                push,
                verdict,
                decided_at,
                client_version,
                ..
            } => self.on_verdict(
                context.stream.api,
                push,
                verdict,
                *decided_at,
                client_version.as_deref(),
            ),
            Event::NonceReused { .. } => self.nonce_reuses = self.nonce_reuses.saturating_add(1),
            Event::Warming {
                nonce, clusters, ..
            } => {
                self.warming = (!clusters.is_empty()).then(|| {
                    let shown = crate::api::names(clusters);
                    Box::new((nonce.clone(), shown))
                });
            }
            _ => {}
        }
    }

    /// A push's fate. The version the client runs is what its latest answer says: an ACK's
    /// version, or the version a SotW NACK says it kept (a late answer included).
    fn on_verdict(
        &mut self,
        api: Option<Api>,
        push: &Arc<Push>,
        verdict: &Verdict,
        decided_at: Timestamp,
        client_version: Option<&str>,
    ) {
        if push.heartbeat() {
            if *verdict == Verdict::Ack {
                self.heartbeats = self.heartbeats.saturating_add(1);
                resources::on_verdict(self, api, push, verdict, decided_at);
            }
            return;
        }
        if self.pending.as_ref().is_some_and(|(n, _)| *n == push.nonce) {
            self.pending = None;
        }
        resources::on_verdict(self, api, push, verdict, decided_at);
        if self
            .warming
            .as_deref()
            .is_some_and(|(n, _)| *n == push.nonce)
        {
            self.warming = None;
        }
        match verdict {
            Verdict::Ack => {
                self.acks = self.acks.saturating_add(1);
                if self.nack.is_some() || self.acked_at.is_none() {
                    self.acked_at = Some(decided_at);
                }
                self.latency_ns = Some(decided_at.saturating_sub(push.at));
                let running = client_version.filter(|v| !v.is_empty());
                self.version_accepted = Some(running.unwrap_or(&push.version).to_string());
                self.nack = None;
            }
            Verdict::Nack { .. } => {
                self.nacks = self.nacks.saturating_add(1);
                self.latency_ns = Some(decided_at.saturating_sub(push.at));
                if let Some(kept) = client_version {
                    self.version_accepted = (!kept.is_empty()).then(|| kept.to_string());
                }
                let before = self.nack.take();
                let since = before.as_deref().map_or(decided_at, |(_, s)| *s);
                let Some(mut info) = crate::api::nack(push, verdict, since) else {
                    return;
                };
                // An object named by the NACKs before keeps the time they first named it.
                let earlier = before.as_deref().map_or(&[][..], |(n, _)| &n.objects[..]);
                for o in &mut info.objects {
                    o.since = match earlier.iter().find(|e| e.object_key() == o.object_key()) {
                        Some(e) => e.since.clone(),
                        None => rfc3339(decided_at),
                    };
                }
                self.nack = Some(Box::new((info, since)));
            }
            Verdict::Superseded { .. } => self.superseded = self.superseded.saturating_add(1),
            Verdict::Unanswered { .. } => self.unanswered = self.unanswered.saturating_add(1),
        }
    }
}

pub(super) struct NodeEntry {
    /// Shared with every node that names the same (few distinct in a mesh).
    cluster: Arc<str>,
    user_agent: Arc<str>,
    /// Its open streams (one for ADS; one a type on per-type streams).
    streams: HashSet<u64>,
    last_seen: Timestamp,
    disconnected_at: Option<Timestamp>,
    types: Types,
}

/// A node's types by URL, in URL order: a node has a few, so a vector of exactly them (a map
/// would hold room for eleven entries of several hundred bytes each, per node).
#[derive(Default)]
struct Types(Vec<(Arc<str>, TypeEntry)>);

impl Types {
    /// The entry of `url`.
    fn get(&self, url: &str) -> Option<&TypeEntry> {
        let i = self.0.binary_search_by(|(u, _)| (**u).cmp(url)).ok()?;
        Some(&self.0[i].1)
    }

    /// The entry of `url`, made when there is none (its URL from `names`).
    fn entry(&mut self, url: &str, names: &mut Names) -> &mut TypeEntry {
        let i = match self.0.binary_search_by(|(u, _)| (**u).cmp(url)) {
            Ok(i) => i,
            Err(i) => {
                self.0.reserve_exact(1);
                self.0.insert(i, (names.share(url), TypeEntry::default()));
                i
            }
        };
        &mut self.0[i].1
    }

    /// Every type, in URL order.
    fn iter(&self) -> impl Iterator<Item = (&str, &TypeEntry)> {
        self.0.iter().map(|(u, t)| (&**u, t))
    }

    fn values(&self) -> impl Iterator<Item = &TypeEntry> {
        self.0.iter().map(|(_, t)| t)
    }
}

/// Strings many nodes name alike (type URLs, clusters, user agents), held once; swept of those
/// no node names any more as the set grows.
#[derive(Default)]
struct Names {
    set: HashSet<Arc<str>>,
    sweep_at: usize,
}

impl Names {
    fn share(&mut self, s: &str) -> Arc<str> {
        if let Some(shared) = self.set.get(s) {
            return shared.clone();
        }
        if self.set.len() >= self.sweep_at {
            self.set.retain(|n| Arc::strong_count(n) > 1);
            self.sweep_at = (self.set.len() * 2).max(64);
        }
        let shared: Arc<str> = s.into();
        self.set.insert(shared.clone());
        shared
    }
}

#[derive(Default)]
struct Board {
    /// Boxed: a map's room for entries it does not hold yet costs the entry's size each.
    nodes: HashMap<Arc<str>, Box<NodeEntry>>,
    /// stream id -> node key, for stream ends.
    streams: HashMap<u64, Arc<str>>,
    names: Names,
    evicted: u64,
    /// New nodes not tracked: the board was full of connected nodes.
    untracked: u64,
    last_sweep: Timestamp,
    /// When each content of a resource that names objects was first pushed (what a `since`
    /// judges new by).
    first_pushed: objects::FirstPushed,
}

/// The shared status board.
#[derive(Clone)]
pub struct StatusBoard {
    inner: Arc<Mutex<Board>>,
    settings: StatusSettings,
}

impl StatusBoard {
    /// An empty board.
    pub fn new(settings: StatusSettings) -> Self {
        StatusBoard {
            inner: Arc::default(),
            settings,
        }
    }

    /// Disconnected nodes evicted to stay under `max_nodes`.
    pub fn evicted(&self) -> u64 {
        self.lock().evicted
    }

    /// New nodes left off the board because every node on it was connected.
    pub fn untracked(&self) -> u64 {
        self.lock().untracked
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Board> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one event.
    pub fn apply(&self, event: &Event) {
        let mut board = self.lock();
        let context = event.context();
        let now = context.time;
        let stream = context.stream.seq;
        let key: Arc<str> = match event {
            // A stream that never said who it is leaves no trace.
            Event::StreamEnd { .. } => match board.streams.remove(&stream) {
                Some(k) => k,
                None => return,
            },
            _ => match board.nodes.get_key_value(&*event.node_id()) {
                Some((k, _)) => k.clone(),
                None => event.node_id().into(),
            },
        };
        self.forget_old(&mut board, now);
        if !board.nodes.contains_key(&*key) {
            if matches!(event, Event::StreamEnd { .. }) {
                return;
            }
            if !self.make_room(&mut board) {
                return;
            }
            board.nodes.insert(
                key.clone(),
                Box::new(NodeEntry {
                    cluster: "".into(),
                    user_agent: "".into(),
                    streams: HashSet::new(),
                    last_seen: now,
                    disconnected_at: None,
                    types: Types::default(),
                }),
            );
        }
        if !matches!(event, Event::StreamEnd { .. }) && !board.streams.contains_key(&stream) {
            board.streams.insert(stream, key.clone());
        }
        if let Event::Push { push, .. } = event {
            board.first_pushed.on_push(push);
        }
        let Board { nodes, names, .. } = &mut *board;
        let node = nodes.get_mut(&*key).expect("inserted above");
        node.last_seen = now;
        if let Some(n) = &context.node {
            if *node.cluster != *n.cluster {
                node.cluster = names.share(&n.cluster);
            }
            if *node.user_agent != *n.user_agent {
                node.user_agent = names.share(&n.user_agent);
            }
        }
        if let Event::StreamEnd { .. } = event {
            node.streams.remove(&stream);
            if node.streams.is_empty() {
                // A node gone keeps no room for streams.
                node.streams = HashSet::new();
                node.disconnected_at = Some(now);
            }
            return;
        }
        node.streams.insert(stream);
        node.disconnected_at = None;
        let t = node.types.entry(&context.type_url, names);
        t.apply(event, now);
    }

    fn forget_old(&self, board: &mut Board, now: Timestamp) {
        // A sweep walks every node: at most once a second.
        if now.saturating_sub(board.last_sweep) < 1_000_000_000 {
            return;
        }
        board.last_sweep = now;
        let limit = self.settings.forget_after.as_nanos() as u64;
        let before = board.nodes.len();
        board.nodes.retain(|_, n| {
            n.disconnected_at
                .is_none_or(|d| now.saturating_sub(d) < limit)
        });
        if board.nodes.len() != before {
            let nodes = &board.nodes;
            board.streams.retain(|_, k| nodes.contains_key(k));
        }
    }

    /// Room for one more node under `max_nodes`: a disconnected node leaves (the longest idle
    /// first). A connected node never does: when every node is connected, the new one is not
    /// tracked (counted), so a flood of made-up clients cannot push a real one off the board.
    fn make_room(&self, board: &mut Board) -> bool {
        while board.nodes.len() >= self.settings.max_nodes.max(1) {
            let victim = (board.nodes.iter())
                .filter(|(_, n)| n.disconnected_at.is_some())
                .min_by_key(|(_, n)| n.last_seen)
                .map(|(k, _)| k.clone());
            let Some(victim) = victim else {
                board.untracked += 1;
                return false;
            };
            board.nodes.remove(&victim);
            board.streams.retain(|_, k| *k != victim);
            board.evicted += 1;
        }
        true
    }

    /// The status of every node, or of one with its resources, as of `now`.
    pub fn report(&self, now: Timestamp, only: Option<&str>) -> StatusReport {
        let mut report = self.report_nodes(now, only);
        if only.is_some() {
            self.add_resources(now, &mut report);
        }
        report
    }

    /// The status of every node (or of one), each with its resources, as of `now`.
    pub fn report_resources(&self, now: Timestamp, only: Option<&str>) -> StatusReport {
        let mut report = self.report_nodes(now, only);
        self.add_resources(now, &mut report);
        report
    }

    /// The resources of each node of `report`.
    fn add_resources(&self, now: Timestamp, report: &mut StatusReport) {
        let listed: HashSet<&str> = report.nodes.iter().map(|n| n.id.as_str()).collect();
        let mut of: HashMap<String, Vec<_>> = (self.resources_at(now, |id| listed.contains(id)))
            .into_iter()
            .map(|n| (n.id, n.resources))
            .collect();
        for node in &mut report.nodes {
            let rows = of.remove(&node.id).unwrap_or_default();
            node.resources = rows.into_iter().map(Into::into).collect();
        }
    }

    fn report_nodes(&self, now: Timestamp, only: Option<&str>) -> StatusReport {
        let board = self.lock();
        let stale = self.settings.stale_after.as_nanos() as u64;
        let forget = self.settings.forget_after.as_nanos() as u64;
        let mut nodes: Vec<NodeStatus> = board
            .nodes
            .iter()
            .filter(|(id, _)| only.is_none_or(|o| *o == ***id))
            .filter(|(_, n)| {
                n.disconnected_at
                    .is_none_or(|d| now.saturating_sub(d) < forget)
            })
            .map(|(id, n)| {
                let mut types: Vec<TypeStatus> = n
                    .types
                    .iter()
                    .map(|(url, t)| type_status(url, t, now, stale))
                    .collect();
                types.sort_by(|a, b| a.r#type.cmp(&b.r#type));
                let state = SyncState::worst(types.iter().map(|t| t.state()));
                NodeStatus {
                    id: id.to_string(),
                    cluster: n.cluster.to_string(),
                    user_agent: n.user_agent.to_string(),
                    state: state as i32,
                    connected: !n.streams.is_empty(),
                    streams: n.streams.len() as u32,
                    last_seen: rfc3339(n.last_seen),
                    disconnected_at: n.disconnected_at.map(rfc3339),
                    types,
                    ..Default::default()
                }
            })
            .collect();
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        StatusReport {
            generated_at: rfc3339(now),
            stale_after_seconds: self.settings.stale_after.as_secs_f64(),
            rejected_objects: crate::api::rejected_objects(&nodes),
            nodes,
            taps: Vec::new(),
            instance: String::new(),
        }
    }

    /// How many nodes are in each (worst) state: the report's states, without the report.
    pub fn counts(&self, now: Timestamp) -> BTreeMap<SyncState, u64> {
        let board = self.lock();
        let stale = self.settings.stale_after.as_nanos() as u64;
        let forget = self.settings.forget_after.as_nanos() as u64;
        let mut out = BTreeMap::new();
        let shown = (board.nodes.values())
            .filter(|n| (n.disconnected_at).is_none_or(|d| now.saturating_sub(d) < forget));
        for n in shown {
            let state = SyncState::worst(n.types.values().map(|t| type_state(t, now, stale).0));
            *out.entry(state).or_default() += 1;
        }
        out
    }
}

/// A type's state, and since when.
fn type_state(t: &TypeEntry, now: Timestamp, stale: u64) -> (SyncState, Option<Timestamp>) {
    let pending_at = t.pending.as_ref().map(|(_, at)| *at);
    let overdue = pending_at.is_some_and(|at| now.saturating_sub(at) >= stale);
    // Asked for, and the control plane never answered: a client waits for it.
    let unanswered = (t.pushes == 0 && t.version_accepted.is_none() && !t.stated)
        .then_some(t.subscribed_at)
        .flatten()
        .filter(|at| now.saturating_sub(*at) >= stale);
    if overdue {
        (SyncState::Stale, pending_at.map(|at| at + stale))
    } else if let Some(at) = unanswered {
        (SyncState::Stale, Some(at + stale))
    } else if let Some((_, since)) = t.nack.as_deref() {
        (SyncState::Nacked, Some(*since))
    } else if t.version_accepted.is_some() || t.stated {
        (SyncState::Synced, t.acked_at.or(t.subscribed_at))
    } else if pending_at.is_some() {
        (SyncState::Pending, pending_at)
    } else {
        (SyncState::NotSent, t.subscribed_at)
    }
}

fn type_status(url: &str, t: &TypeEntry, now: Timestamp, stale: u64) -> TypeStatus {
    let (state, since) = type_state(t, now, stale);
    TypeStatus {
        r#type: short_type(url).to_string(),
        type_url: url.to_string(),
        state: state as i32,
        version_sent: t.version_sent.clone(),
        version_accepted: t.version_accepted.clone(),
        nonce: t.nonce.clone(),
        last_push_at: t.last_push_at.map(rfc3339),
        pending_since: t.pending.as_ref().map(|(_, at)| rfc3339(*at)),
        latency_ms: t.latency_ns.map(|n| n as f64 / 1e6),
        pushes: t.pushes.into(),
        acks: t.acks.into(),
        nacks: t.nacks.into(),
        superseded: t.superseded.into(),
        unanswered: t.unanswered.into(),
        nonce_reuses: t.nonce_reuses.into(),
        rejected_resends: t.rejected_resends.into(),
        heartbeats: t.heartbeats.into(),
        resource_errors: (t.rare.iter().flat_map(|r| &r.cp_errors.0).take(NAMES_CAP))
            .map(|(name, code, message, at)| ResourceError {
                name: name.clone(),
                code: *code,
                message: message.clone(),
                since: rfc3339(*at),
            })
            .collect(),
        nack: t.nack.as_deref().map(|(n, _)| n.clone()),
        subscribed: t.subscribed_at.is_some(),
        state_since: since.map(rfc3339),
        state_seconds: since.map_or(0.0, |s| now.saturating_sub(s) as f64 / 1e9),
        last_message_at: (t.last_message > 0).then(|| rfc3339(t.last_message)),
        waiting_for: t
            .warming
            .as_deref()
            .map(|(_, w)| w.clone())
            .unwrap_or_default(),
    }
}

impl Sink for StatusBoard {
    fn on_event(&mut self, event: &Event) {
        self.apply(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::correlate::{Correlator, StreamContext};
    use crate::xds::{Api, ErrorDetail, Node, Request, ResourceRef, Response};

    const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    const S: u64 = 1_000_000_000;

    fn req(node: Option<&str>, version: &str, nonce: &str, error: Option<&str>) -> Request {
        Request {
            node: node.map(|id| Node {
                id: id.into(),
                cluster: "c".into(),
                user_agent: "envoy 1.40.0".into(),
            }),
            type_url: CDS.into(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            error_detail: error.map(|m| ErrorDetail {
                code: 3,
                message: m.into(),
            }),
            ..Default::default()
        }
    }

    fn resp(version: &str, nonce: &str, names: &[&str]) -> Response {
        Response {
            type_url: CDS.into(),
            version_info: version.into(),
            nonce: nonce.into(),
            resources: names
                .iter()
                .map(|n| ResourceRef {
                    name: n.to_string(),
                    version: None,
                    digest: n.len() as u64 + version.len() as u64,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn stream(id: u64) -> Correlator {
        Correlator::new(
            Api::Sotw,
            StreamContext {
                seq: id,
                ..Default::default()
            },
        )
    }

    fn feed(board: &StatusBoard, events: Vec<Event>) {
        for e in &events {
            board.apply(e);
        }
    }

    /// The node's CDS status; and, wherever a test looks, the metrics' counts agree with the
    /// report's states.
    fn cds(board: &StatusBoard, node: &str, now: Timestamp) -> TypeStatus {
        let mut from_report = BTreeMap::new();
        for n in board.report(now, None).nodes {
            *from_report.entry(n.state()).or_insert(0u64) += 1;
        }
        assert_eq!(board.counts(now), from_report);
        board.report(now, Some(node)).nodes[0].types[0].clone()
    }

    #[test]
    fn synced_nacked_stale_and_back() {
        let board = StatusBoard::new(StatusSettings {
            stale_after: Duration::from_secs(10),
            ..Default::default()
        });
        let mut c = stream(1);
        let mut e = Vec::new();
        c.on_request(req(Some("n1"), "", "", None), S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(cds(&board, "n1", S).state(), SyncState::NotSent);

        c.on_response(resp("v1", "1", &["a"]), 2 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(cds(&board, "n1", 3 * S).state(), SyncState::Pending);
        assert_eq!(cds(&board, "n1", 12 * S).state(), SyncState::Stale);

        c.on_request(req(None, "v1", "1", None), 13 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let t = cds(&board, "n1", 13 * S);
        assert_eq!(t.state(), SyncState::Synced);
        assert_eq!(t.version_accepted.as_deref(), Some("v1"));
        assert_eq!(t.latency_ms, Some(11_000.0));

        c.on_response(resp("v2", "2", &["a", "b"]), 14 * S, &mut e);
        c.on_request(req(None, "v1", "2", Some("bad b")), 15 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let t = cds(&board, "n1", 15 * S);
        assert_eq!(t.state(), SyncState::Nacked);
        assert_eq!(t.version_sent.as_deref(), Some("v2"));
        assert_eq!(t.version_accepted.as_deref(), Some("v1"));
        let nack = t.nack.unwrap();
        assert_eq!(nack.message, "bad b");
        assert_eq!(nack.suspects, ["b"]);
        assert_eq!(nack.version, "v2");

        // A new push while NACKED: still NACKED until answered, STALE once overdue.
        c.on_response(resp("v3", "3", &["a"]), 16 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(cds(&board, "n1", 17 * S).state(), SyncState::Nacked);
        assert_eq!(cds(&board, "n1", 30 * S).state(), SyncState::Stale);
        c.on_request(req(None, "v3", "3", None), 31 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let t = cds(&board, "n1", 31 * S);
        assert_eq!(t.state(), SyncState::Synced);
        assert!(t.nack.is_none());
        assert_eq!((t.pushes, t.acks, t.nacks), (3, 2, 1));
        let report = board.report(31 * S, None);
        assert_eq!(report.nodes[0].state(), SyncState::Synced);
        assert!(report.nodes[0].connected);
    }

    /// A client that reconnects stating what it runs runs config, pushed to or not (a control
    /// plane that sees its versions current may send nothing): SotW by its version, Delta by
    /// its resource versions. A plain subscription that is never answered goes STALE.
    #[test]
    fn a_resubscribe_that_states_what_it_runs_is_synced() {
        let board = StatusBoard::new(StatusSettings {
            stale_after: Duration::from_secs(10),
            ..Default::default()
        });
        let mut e = Vec::new();
        let mut sotw = stream(1);
        sotw.on_request(req(Some("sotw"), "v7", "", None), S, &mut e);
        let mut delta = Correlator::new(Api::Delta, StreamContext::default());
        let mut first = req(Some("delta"), "", "", None);
        first.initial_resource_versions = vec![("a".into(), "3".into())];
        delta.on_request(first, S, &mut e);
        let mut fresh = Correlator::new(Api::Delta, StreamContext::default());
        fresh.on_request(req(Some("fresh"), "", "", None), S, &mut e);
        feed(&board, e);
        let t = cds(&board, "sotw", 20 * S);
        assert_eq!(t.state(), SyncState::Synced);
        assert_eq!(t.version_accepted.as_deref(), Some("v7"));
        assert_eq!(cds(&board, "delta", 20 * S).state(), SyncState::Synced);
        assert_eq!(cds(&board, "fresh", 20 * S).state(), SyncState::Stale);
    }

    #[test]
    fn disconnected_nodes_are_forgotten_and_the_board_is_bounded() {
        let board = StatusBoard::new(StatusSettings {
            forget_after: Duration::from_secs(60),
            max_nodes: 3,
            ..Default::default()
        });
        let mut e = Vec::new();
        let mut first = stream(1);
        first.on_request(req(Some("gone"), "", "", None), S, &mut e);
        first.on_stream_end(Some(14), "bye", 2 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let r = board.report(3 * S, None);
        assert!(!r.nodes[0].connected);
        assert!(r.nodes[0].disconnected_at.is_some());

        // 61 s later a new node's event sweeps the gone one out.
        let mut c = stream(2);
        c.on_request(req(Some("live-0"), "", "", None), 63 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let ids: Vec<String> = board
            .report(63 * S, None)
            .nodes
            .into_iter()
            .map(|n| n.id)
            .collect();
        assert_eq!(ids, ["live-0"]);

        for i in 1..10u64 {
            let mut c = stream(10 + i);
            c.on_request(
                req(Some(&format!("live-{i}")), "", "", None),
                (63 + i) * S,
                &mut e,
            );
            feed(&board, std::mem::take(&mut e));
        }
        let ids: Vec<String> = board
            .report(80 * S, None)
            .nodes
            .into_iter()
            .map(|n| n.id)
            .collect();
        assert_eq!(
            ids,
            ["live-0", "live-1", "live-2"],
            "connected nodes stay; the new ones are not tracked"
        );
        assert_eq!((board.evicted(), board.untracked()), (0, 7));
        // Once one disconnects, it makes room.
        let mut c = stream(11);
        c.on_stream_end(Some(0), "bye", 82 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let mut late = stream(31);
        late.on_request(req(Some("late"), "", "", None), 83 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let ids: Vec<String> = (board.report(84 * S, None).nodes.into_iter())
            .map(|n| n.id)
            .collect();
        assert_eq!(ids, ["late", "live-0", "live-2"]);
        assert_eq!((board.evicted(), board.untracked()), (1, 7));
    }

    #[test]
    fn resources_per_node_as_csds_shows_them() {
        use resources::{ClientStatus as C, ConfigStatus as K};
        let board = StatusBoard::new(StatusSettings::default());
        let mut c = stream(1);
        let mut e = Vec::new();
        c.on_request(req(Some("n1"), "", "", None), S, &mut e);
        c.on_response(resp("v1", "1", &["a", "b"]), 2 * S, &mut e);
        c.on_request(req(None, "v1", "1", None), 3 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let seen = |board: &StatusBoard| -> Vec<(String, String, K, C, bool)> {
            let nodes = board.resources(|id| id == "n1");
            assert_eq!(nodes.len(), 1);
            (nodes[0].resources.iter())
                .map(|r| {
                    (
                        r.name.clone(),
                        r.version.clone(),
                        r.config,
                        r.client,
                        r.error.is_some(),
                    )
                })
                .collect()
        };
        let s = |n: &str, v: &str, k, c, e| (n.to_string(), v.to_string(), k, c, e);
        assert_eq!(
            seen(&board),
            [
                s("a", "v1", K::Synced, C::Acked, false),
                s("b", "v1", K::Synced, C::Acked, false)
            ]
        );
        // v2: `a` unchanged (its digest is its name's length plus the version's), `b` left
        // out, `cc` new.
        let mut v2 = resp("v2", "2", &["a", "cc"]);
        v2.resources = crate::xds::Resources::default();
        v2.resources.push_parts("a", None, 1 + 2);
        v2.resources.push_parts("cc", None, 9);
        c.on_response(v2, 4 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(
            seen(&board),
            [
                s("a", "v1", K::Synced, C::Acked, false),
                s("b", "v1", K::Stale, C::Acked, false),
                s("cc", "", K::Stale, C::Requested, false)
            ]
        );
        c.on_request(req(None, "v1", "2", Some("bad cc")), 5 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        // A message of no known form: what it names (cc) is rejected; whether the removal of
        // b landed is not known (the "b" in "bad" is no mention of it).
        assert_eq!(
            seen(&board),
            [
                s("a", "v1", K::Synced, C::Acked, false),
                s("b", "v1", K::Error, C::Unknown, true),
                s("cc", "", K::Error, C::Nacked, true)
            ]
        );
        let nodes = board.resources(|_| true);
        let cc = &nodes[0].resources[2];
        assert_eq!(cc.error, Some(("bad cc".into(), "v2".into(), 5 * S)));
        assert!(board.resources(|id| id == "other").is_empty());
    }

    #[test]
    fn names_asked_for_and_never_sent_are_not_sent() {
        use resources::{ClientStatus as C, ConfigStatus as K};
        let board = StatusBoard::new(StatusSettings::default());
        let mut c = stream(1);
        let mut e = Vec::new();
        let named = |node, version: &str, nonce: &str, names: &[&str]| Request {
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            ..req(node, version, nonce, None)
        };
        let seen = |board: &StatusBoard| -> Vec<(String, K, C)> {
            (board.resources(|_| true)[0].resources.iter())
                .map(|r| (r.name.clone(), r.config, r.client))
                .collect()
        };
        let s = |n: &str, k, c| (n.to_string(), k, c);
        c.on_request(named(Some("n1"), "", "", &["a", "x"]), S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(
            seen(&board),
            [
                s("a", K::NotSent, C::Requested),
                s("x", K::NotSent, C::Requested)
            ]
        );
        c.on_response(resp("v1", "1", &["a"]), 2 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(
            seen(&board),
            [
                s("a", K::Stale, C::Requested),
                s("x", K::NotSent, C::Requested)
            ]
        );
        c.on_request(named(None, "v1", "1", &["a", "x"]), 3 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(
            seen(&board),
            [
                s("a", K::Synced, C::Acked),
                s("x", K::NotSent, C::Requested)
            ]
        );
        // The client stops asking for `x`.
        c.on_request(named(None, "v1", "1", &["a"]), 4 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(seen(&board), [s("a", K::Synced, C::Acked)]);
        // Too many names to keep: only what was sent is listed.
        let many: Vec<String> = (0..100).map(|i| format!("n{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        c.on_request(named(None, "v1", "1", &many), 5 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(seen(&board), [s("a", K::Synced, C::Acked)]);
    }

    /// Delta: a removal of a name the client asks for reads DOES_NOT_EXIST until a push
    /// carries it; a heartbeat (a bare wrapper) keeps the content and counts as no push.
    #[test]
    fn delta_removal_of_a_name_asked_for_does_not_exist_and_heartbeats_change_nothing() {
        use resources::{ClientStatus as C, ConfigStatus as K};
        let board = StatusBoard::new(StatusSettings::default());
        let mut c = Correlator::new(
            Api::Delta,
            StreamContext {
                seq: 1,
                api: Some(Api::Delta),
                ..Default::default()
            },
        );
        let mut e = Vec::new();
        let seen = |board: &StatusBoard, now| -> Vec<(String, String, K, C)> {
            (board.resources_at(now, |_| true)[0].resources.iter())
                .map(|r| (r.name.clone(), r.version.clone(), r.config, r.client))
                .collect()
        };
        let s = |n: &str, v: &str, k, c| (n.to_string(), v.to_string(), k, c);
        let subscribe = Request {
            resource_names: vec!["a".into(), "x".into()],
            ..req(Some("n1"), "", "", None)
        };
        c.on_request(subscribe, S, &mut e);
        let wrapper = |name: &str, version: &str, digest: u64, bare: bool| ResourceRef {
            name: name.into(),
            version: Some(version.into()),
            digest,
            ttl_ms: Some(2000),
            bare,
        };
        let push = |nonce: &str, resources: Vec<ResourceRef>, removed: &[&str]| Response {
            type_url: CDS.into(),
            nonce: nonce.into(),
            resources: resources.into_iter().collect(),
            removed: removed.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        c.on_response(
            push("1", vec![wrapper("a", "1", 7, false)], &["x"]),
            2 * S,
            &mut e,
        );
        c.on_request(req(None, "", "1", None), 3 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(
            seen(&board, 3 * S),
            [
                s("a", "1", K::Synced, C::Acked),
                s("x", "", K::Synced, C::DoesNotExist)
            ]
        );
        // Its TTL of 2 s lapses at 4 s, but for a heartbeat at 3 s: no push, the same content.
        c.on_response(
            push("2", vec![wrapper("a", "1", 0, true)], &[]),
            3 * S,
            &mut e,
        );
        c.on_request(req(None, "", "2", None), 3 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let t = cds(&board, "n1", 4 * S);
        assert_eq!((t.pushes, t.heartbeats, t.acks), (1, 1, 1));
        assert_eq!(seen(&board, 4 * S)[0], s("a", "1", K::Synced, C::Acked));
        assert_eq!(seen(&board, 5 * S)[0], s("a", "1", K::Synced, C::Expired));
        c.on_response(
            push("3", vec![wrapper("x", "3", 9, false)], &[]),
            6 * S,
            &mut e,
        );
        c.on_request(req(None, "", "3", None), 6 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(seen(&board, 6 * S)[1], s("x", "3", K::Synced, C::Acked));
    }

    /// A listener naming routes the node does not run warms for Envoy's initial fetch timeout,
    /// then serves without them; once the routes come it is ACKED with nothing missing.
    #[test]
    fn a_listener_warms_for_its_routes_until_the_initial_fetch_timeout() {
        use resources::ClientStatus as C;
        const LDS: &str = crate::xds::LISTENER;
        let board = StatusBoard::new(StatusSettings::default());
        let mut c = stream(1);
        let mut e = Vec::new();
        let of = |type_url: &str, version: &str, nonce: &str, names: &[&str]| Response {
            type_url: type_url.into(),
            ..resp(version, nonce, names)
        };
        let ask = |type_url: &str, node, version: &str, nonce: &str| Request {
            type_url: type_url.into(),
            ..req(node, version, nonce, None)
        };
        c.on_request(ask(LDS, Some("n1"), "", ""), S, &mut e);
        let mut push = of(LDS, "1", "1", &["l"]);
        push.resources
            .mark_needs([(crate::xds::Needs::Routes, "r")]);
        c.on_response(push, S, &mut e);
        c.on_request(ask(LDS, None, "1", "1"), S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let l = |now| {
            let r = &board.resources_at(now, |_| true)[0].resources[0];
            (
                r.client,
                r.error.as_ref().map(|e| e.0.clone()).unwrap_or_default(),
            )
        };
        assert_eq!(l(5 * S), (C::Warming, "warming: waits for RDS r".into()));
        let late = "serves without RDS r, not pushed within the 15s initial fetch timeout";
        assert_eq!(l(17 * S), (C::Acked, late.into()));
        let routes = crate::xds::ROUTES;
        c.on_request(ask(routes, None, "", ""), 18 * S, &mut e);
        c.on_response(of(routes, "1", "2", &["r"]), 18 * S, &mut e);
        c.on_request(ask(routes, None, "1", "2"), 18 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(l(19 * S), (C::Acked, String::new()));
    }

    /// A push of clusters `a` and `b`, each made from the DestinationRule of its name, as
    /// istiod's metadata says.
    fn with_objects(version: &str, nonce: &str) -> Response {
        let content = |name: &str| version.len() as u64 * 10 + name.len() as u64;
        clusters(version, nonce, &[("a", content("a")), ("b", content("b"))])
    }

    /// An object is rejected since the first NACK that named it, not since the node's NACKs
    /// began: v2's NACK names a, v3's names a and b; b is rejected since v3's.
    #[test]
    fn an_object_is_rejected_since_the_first_nack_that_named_it() {
        let board = StatusBoard::new(StatusSettings::default());
        let mut c = stream(1);
        let mut e = Vec::new();
        c.on_request(req(Some("n1"), "", "", None), S, &mut e);
        c.on_response(with_objects("v1", "1"), S, &mut e);
        c.on_request(req(None, "v1", "1", None), S, &mut e);
        c.on_response(with_objects("v2", "2"), 2 * S, &mut e);
        c.on_request(req(None, "v1", "2", Some("cluster a: bad")), 3 * S, &mut e);
        c.on_response(with_objects("v3", "3"), 10 * S, &mut e);
        c.on_request(
            req(None, "v1", "3", Some("clusters a, b: bad")),
            11 * S,
            &mut e,
        );
        feed(&board, e);
        let report = board.report(12 * S, None);
        let since: BTreeMap<String, String> = (report.rejected_objects.iter())
            .map(|r| (r.object.as_ref().unwrap().name.clone(), r.since.clone()))
            .collect();
        assert_eq!(since["a"], rfc3339(3 * S), "{since:?}");
        assert_eq!(since["b"], rfc3339(11 * S), "{since:?}");
        // The node's NACKs began with v2's.
        assert_eq!(
            cds(&board, "n1", 12 * S).nack.unwrap().since,
            rfc3339(3 * S)
        );
    }

    /// A CDS push of `clusters` (name, content), each made from the DestinationRule of its
    /// name.
    fn clusters(version: &str, nonce: &str, clusters: &[(&str, u64)]) -> Response {
        use crate::xds::origin::{Format, ObjectRef, Origins, Part, PartKind};
        let mut r = resp(version, nonce, &[]);
        r.resources = crate::xds::Resources::default();
        for (name, content) in clusters {
            r.resources.push_parts(name, None, *content);
            r.resources.mark_origins(std::sync::Arc::new(Origins {
                parts: vec![Part {
                    kind: PartKind::Resource,
                    name: "".into(),
                    refs: Box::new([]),
                    objects: vec![ObjectRef {
                        kind: "DestinationRule".into(),
                        group: "networking.istio.io".into(),
                        namespace: "default".into(),
                        name: (*name).into(),
                        section: "".into(),
                        format: Format::Istio,
                        via: "".into(),
                    }]
                    .into(),
                }]
                .into(),
            }));
        }
        r
    }

    /// Per object, per node: taken, pending, rejected (a whole NACK, or its own part of a
    /// partial one), not pushed since, out of scope; a partial NACK of another object's
    /// resource leaves this one taken.
    #[test]
    fn the_object_view_follows_each_node() {
        use crate::api::v1::object_node::Standing as O;
        let board = StatusBoard::new(StatusSettings::default());
        let mut e = Vec::new();
        let (mut n1, mut n2, mut n3) = (stream(1), stream(2), stream(3));
        for (c, id) in [(&mut n1, "n1"), (&mut n2, "n2"), (&mut n3, "n3")] {
            c.on_request(req(Some(id), "", "", None), S, &mut e);
        }
        let v1 = [("a", 1), ("b", 1)];
        for c in [&mut n1, &mut n2] {
            c.on_response(clusters("v1", "1", &v1), S, &mut e);
            c.on_request(req(None, "v1", "1", None), S, &mut e);
        }
        n3.on_response(clusters("v1", "1", &[("c", 1)]), S, &mut e);
        n3.on_request(req(None, "v1", "1", None), S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let a: crate::ObjectSpec = "destinationrule/default/a".parse().unwrap();
        let view = |since: Option<u64>| {
            let r = board.objects(10 * S, std::slice::from_ref(&a), since);
            let o = r.objects[0].clone();
            let states: Vec<(String, O)> = (o.node_states.iter())
                .map(|n| (n.node.clone(), n.state()))
                .collect();
            (states, o.out_of_scope, o.resource_count)
        };
        let s = |n: &str, st| (n.to_string(), st);
        assert_eq!(
            view(None),
            (vec![s("n1", O::Taken), s("n2", O::Taken)], 1, 1)
        );
        // With since after v1: not pushed since.
        assert_eq!(
            view(Some(2 * S)).0,
            [s("n1", O::NotPushed), s("n2", O::NotPushed)]
        );
        // v2 changes a and b; n1 accepts, n2 has not answered.
        let v2 = [("a", 2), ("b", 2)];
        for c in [&mut n1, &mut n2] {
            c.on_response(clusters("v2", "2", &v2), 3 * S, &mut e);
        }
        n1.on_request(req(None, "v2", "2", None), 3 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(
            view(Some(2 * S)).0,
            [s("n2", O::Pending), s("n1", O::Taken)]
        );
        // n2 rejects b alone (a partial NACK): a landed.
        let partial = "Error adding/updating cluster(s) b: malformed IP address: not-an-ip";
        n2.on_request(req(None, "v1", "2", Some(partial)), 4 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(view(Some(2 * S)).0, [s("n1", O::Taken), s("n2", O::Taken)]);
        let b: crate::ObjectSpec = "DestinationRule/default/b".parse().unwrap();
        let r = board.objects(10 * S, std::slice::from_ref(&b), Some(2 * S));
        let n2_b = r.objects[0]
            .node_states
            .iter()
            .find(|n| n.node == "n2")
            .unwrap();
        assert_eq!(n2_b.state(), O::Rejected);
        assert!(n2_b.resources[0]
            .error
            .as_deref()
            .unwrap()
            .contains("not-an-ip"));
        // v3 changes a; n1 rejects the whole push.
        n1.on_response(clusters("v3", "3", &[("a", 3), ("b", 2)]), 5 * S, &mut e);
        let whole = "Proto constraint validation failed (ClusterValidationError.ConnectTimeout)";
        n1.on_request(req(None, "v2", "3", Some(whole)), 6 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        assert_eq!(
            view(Some(2 * S)).0,
            [s("n1", O::Rejected), s("n2", O::Taken)]
        );
        // n3 receives nothing made from a; the listing counts every object.
        let all = board.objects(10 * S, &[], None);
        let names: Vec<String> = (all.objects.iter())
            .map(|o| o.object.as_ref().unwrap().name.clone())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!((all.objects[0].nodes, all.objects[0].rejected), (2, 1));
        assert_eq!(all.objects[2].out_of_scope, 2);
        // An object no node receives.
        let z: crate::ObjectSpec = "destinationrule/default/z".parse().unwrap();
        let none = board.objects(10 * S, &[z], None);
        assert_eq!(
            (none.objects[0].nodes, none.objects[0].out_of_scope),
            (0, 3)
        );
    }

    /// Old content pushed again after `since` to one node (it reconnects) is what that node was
    /// given since, and no change of the object for the others: they are not pushed since,
    /// until new content reaches them.
    #[test]
    fn old_content_pushed_again_is_not_taken_since() {
        use crate::api::v1::object_node::Standing as O;
        let board = StatusBoard::new(StatusSettings::default());
        let mut e = Vec::new();
        let (mut n1, mut late) = (stream(1), stream(2));
        n1.on_request(req(Some("n1"), "", "", None), S, &mut e);
        n1.on_response(clusters("v1", "1", &[("a", 1)]), S, &mut e);
        n1.on_request(req(None, "v1", "1", None), S, &mut e);
        // After `since` (2 s) a node connects and gets v1 again.
        late.on_request(req(Some("late"), "", "", None), 3 * S, &mut e);
        late.on_response(clusters("v1", "1", &[("a", 1)]), 3 * S, &mut e);
        late.on_request(req(None, "v1", "1", None), 3 * S, &mut e);
        feed(&board, std::mem::take(&mut e));
        let a: crate::ObjectSpec = "destinationrule/default/a".parse().unwrap();
        let states = |board: &StatusBoard| -> Vec<O> {
            let r = board.objects(9 * S, std::slice::from_ref(&a), Some(2 * S));
            r.objects[0].node_states.iter().map(|n| n.state()).collect()
        };
        assert_eq!(states(&board), [O::NotPushed, O::Taken]);
        // New content reaches both.
        for c in [&mut n1, &mut late] {
            c.on_response(clusters("v2", "2", &[("a", 2)]), 4 * S, &mut e);
            c.on_request(req(None, "v2", "2", None), 4 * S, &mut e);
        }
        feed(&board, std::mem::take(&mut e));
        assert_eq!(states(&board), [O::Taken, O::Taken]);
    }
}
