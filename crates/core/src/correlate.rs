//! The correlation core: a pure, synchronous state machine per stream that pairs every push
//! with the request that answers it. Time is passed in; no I/O, no tokio.
//!
//! Per (stream, type_url), every push stays open until its own answer decides it. A client
//! answers the pushes of a type in the order they went out, so in SotW a newer push that
//! overtakes an older one before its answer does not decide the older one:
//! ```text
//!   open: [N1]        push N1
//!   open: [N1, N2]    push N2 before N1 is answered (N1 is overtaken by N2)
//!   open: [N2]        answer naming N1: N1's own verdict, Ack or Nack, marked overtaken by N2
//!   open: []          answer naming N2: N2's verdict
//! ```
//! An answer naming a later push decides the open pushes before it as Superseded: answers come
//! in order, so theirs will never come. An answer naming a push already superseded is a
//! StaleAnswer, never an acceptance of anything. When the stream ends, an overtaken push still
//! open is Superseded and the newest is Unanswered (with the grpc-status). A control plane that
//! reuses a nonce is reported (NonceReused) and its pushes still pair with answers in order.
//!
//! Delta answers every nonce on its own, so several pushes may be open and none supersedes
//! another.
//!
//! Cluster warming: once running, Envoy holds its answer to a CDS push until every cluster the
//! push adds or changes that takes its endpoints from EDS has received them (or its
//! `initial_fetch_timeout`, 15 s by default, passed); while it starts it does not hold it. A CDS
//! push to a client that accepted clusters before (on this stream, or, when it reconnects
//! stating a version or Delta resource versions, as the [`Ledger`] knows it from its last
//! stream) names those clusters' EDS resources; a reconnecting SotW client whose clusters the
//! tap does not know is not followed (every cluster would look new), a Delta one by the
//! versions it states; each EDS push after it on the stream
//! strikes off the names it carries; [`Event::Warming`] tells what is left whenever it changes,
//! and the push's verdict says what was still missing when the answer came. Only within one
//! stream (ADS): per-type streams carry CDS and EDS apart.
//!
//! What a NACK leaves running: a client that adds resources one by one (Envoy's CDS and LDS,
//! gRPC proxyless clients) applies the valid ones of a push it NACKs. [`scope::read`] tells
//! from the message which were rejected; the rest of the push then counts as what the client
//! runs, so the next NACK is blamed against that and not against the last fully accepted push.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::xds::origin::{self, Origin};
use crate::xds::{
    Api, ErrorDetail, Interner, Node, Request, Resources, Response, CLUSTER, ENDPOINTS,
};

pub mod ledger;
pub mod scope;
pub use ledger::Ledger;
pub use scope::{Rejected, Scope};

/// Nanoseconds since the Unix epoch.
pub type Timestamp = u64;

/// How many recently decided nonces are remembered per type, to tell a stale answer or a
/// subscription change from an answer to a push we never saw.
const REMEMBERED_NONCES: usize = 16;
/// SotW pushes open per type at most: past it the oldest overtaken one is Superseded.
const MAX_OPEN_SOTW: usize = 16;
/// Delta pushes left unanswered beyond this many per type are given up on (bounded memory).
const MAX_OPEN_DELTA: usize = 1024;
/// Types per stream at most; requests and responses of further types are not correlated.
const MAX_TYPES: usize = 256;
/// CDS pushes whose warming is followed per stream at most: past it the oldest is forgotten.
const MAX_WARMING: usize = 16;
/// EDS names followed per warming CDS push at most (the list in events is cut there too).
const MAX_WARMING_NAMES: usize = 1024;

/// What the tap knows about the stream an event comes from.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct StreamContext {
    /// The tap's number for the stream: counted across the process from 1, not the HTTP/2
    /// stream id (which each connection counts on its own).
    pub seq: u64,
    /// SotW or Delta.
    pub api: Option<Api>,
    /// gRPC service.
    pub service: String,
    /// gRPC method.
    pub method: String,
    /// Downstream (client) address.
    pub downstream: String,
    /// Upstream (control plane) address.
    pub upstream: String,
}

/// A push: one response, reduced to what we keep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Push {
    /// `type_url`.
    pub type_url: String,
    /// `version_info` (SotW) or `system_version_info` (Delta).
    pub version: String,
    /// `nonce`.
    pub nonce: String,
    /// When it went out.
    pub at: Timestamp,
    /// The resources (names and digests), shared with every other push of the same set.
    pub resources: Arc<Resources>,
    /// Names removed (Delta).
    pub removed: Vec<String>,
    /// Message size, bytes.
    pub bytes: u64,
    /// `control_plane.identifier`, when set.
    pub control_plane: Option<String>,
    /// `resource_errors`: (name, error) for each resource the control plane could not produce.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resource_errors: Vec<(String, ErrorDetail)>,
    /// How many times in a row the control plane has now pushed content this client NACKed
    /// (the same resources, by digest, as the last push it rejected): 0 for a push that is
    /// no resend. go-control-plane-style servers ignore `error_detail` and loop like this.
    pub resent_rejected: u32,
    /// The objects whose resources it changes against what the client ran (none when the tap
    /// did not see what the client ran: a stream's first push), shared by every stream that
    /// moved between the same two pushes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects_changed: Option<Arc<crate::xds::origin::Changed>>,
}

impl Push {
    /// A heartbeat: bare wrappers only (each refreshes its resource's TTL), nothing removed;
    /// answered, but no new content.
    pub fn heartbeat(&self) -> bool {
        self.resources.all_bare() && self.removed.is_empty()
    }
}

/// How a push ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    /// Accepted.
    Ack,
    /// Rejected, in whole or in part ([`Scope`]).
    Nack {
        /// `error_detail` as the client sent it.
        error: ErrorDetail,
        /// The resources rejected when the scope is partial; otherwise the changed resources
        /// the error names, or, when it names none, every changed resource.
        suspects: Vec<String>,
        /// Resources added, removed or changed since what the client ran before.
        changed: Vec<String>,
        /// How much of the push the client rejected.
        #[serde(rename = "nack_scope")]
        scope: Scope,
        /// Partial: the resources rejected, each with its own part of the message.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        rejected: Vec<Rejected>,
        /// Partial: the changed resources that the client applied all the same (added,
        /// changed or removed).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        applied: Vec<String>,
        /// The Kubernetes objects the rejected resources (the suspects) were made from, as
        /// their metadata names them; empty when it names none.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        objects: Vec<Origin>,
    },
    /// No answer came for this push, and a newer push of its type went out before (SotW):
    /// the client answered a later push, or the stream ended, first.
    Superseded {
        /// The nonce of the push that overtook it.
        by_nonce: String,
    },
    /// The stream ended before an answer.
    Unanswered {
        /// grpc-status from the trailers, if any.
        grpc_status: Option<i32>,
        /// grpc-message or the reset/failure, for humans.
        message: String,
    },
}

/// Which of the four a [`Verdict`] is, without what it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VerdictKind {
    /// [`Verdict::Ack`].
    Ack,
    /// [`Verdict::Nack`].
    Nack,
    /// [`Verdict::Superseded`].
    Superseded,
    /// [`Verdict::Unanswered`].
    Unanswered,
}

impl VerdictKind {
    /// `ack`, `nack`, `superseded`, `unanswered`: the one spelling logs, spans and JSON use.
    pub fn name(self) -> &'static str {
        match self {
            VerdictKind::Ack => "ack",
            VerdictKind::Nack => "nack",
            VerdictKind::Superseded => "superseded",
            VerdictKind::Unanswered => "unanswered",
        }
    }
}

impl Verdict {
    /// Which verdict this is.
    pub fn kind(&self) -> VerdictKind {
        match self {
            Verdict::Ack => VerdictKind::Ack,
            Verdict::Nack { .. } => VerdictKind::Nack,
            Verdict::Superseded { .. } => VerdictKind::Superseded,
            Verdict::Unanswered { .. } => VerdictKind::Unanswered,
        }
    }

    /// `ack`, `nack`, `superseded`, `unanswered`.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

/// What happened, in the order it happened.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// A first request for a type on a new stream, with no version: a fresh subscription.
    Subscribe {
        /// Where, who, what type.
        #[serde(flatten)]
        context: Context,
        /// Names asked for (empty = wildcard).
        names: Vec<String>,
    },
    /// A first request that states what the client already has: a reconnect.
    Resubscribe {
        /// Where, who, what type.
        #[serde(flatten)]
        context: Context,
        /// SotW: the version the client last accepted.
        version: String,
        /// Delta: `initial_resource_versions`.
        versions: Vec<(String, String)>,
        /// Names asked for (empty = wildcard).
        names: Vec<String>,
    },
    /// Same nonce answered again with other resource names, or a Delta (un)subscribe.
    SubscriptionChange {
        /// Where, who, what type.
        #[serde(flatten)]
        context: Context,
        /// The names now asked for (SotW), or added (Delta).
        names: Vec<String>,
        /// Names dropped (Delta).
        unsubscribed: Vec<String>,
    },
    /// A push went out.
    Push {
        /// Where, who, what type.
        #[serde(flatten)]
        context: Context,
        /// The push.
        push: Arc<Push>,
    },
    /// A push's fate.
    Verdict {
        /// Where, who, what type.
        #[serde(flatten)]
        context: Context,
        /// The push.
        push: Arc<Push>,
        /// What became of it.
        #[serde(flatten)]
        verdict: Verdict,
        /// When it was decided.
        decided_at: Timestamp,
        /// The version the client runs after its answer (ack/nack): SotW, the `version_info` it
        /// said; Delta, whose requests say none, the version of the last push it accepted on
        /// the stream (none when the tap saw none, or the control plane gave it none).
        client_version: Option<String>,
        /// Ack/nack that came after a newer push of the type went out: that push's nonce.
        #[serde(skip_serializing_if = "Option::is_none")]
        overtaken_by: Option<String>,
        /// CDS: the EDS resources of clusters this push added or changed that no EDS push had
        /// carried when it was decided (an ACK with names here came after the fetch timeout).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        waiting_for: Vec<String>,
    },
    /// What an open CDS push still waits for: the EDS resources of the clusters it added or
    /// changed that no EDS push has carried since. At the push, and whenever it shrinks.
    Warming {
        /// Where, who; the type is CDS.
        #[serde(flatten)]
        context: Context,
        /// The CDS push's nonce.
        nonce: String,
        /// The CDS push's version.
        version: String,
        /// EDS resource names still to come; empty when all came.
        clusters: Vec<String>,
    },
    /// The stream ended (the context's type is empty).
    StreamEnd {
        /// Where, who.
        #[serde(flatten)]
        context: Context,
        /// grpc-status, when the call ended with one.
        grpc_status: Option<i32>,
        /// How it ended, for humans.
        message: String,
    },
    /// An answer naming a push already decided as superseded. Never an ACK of anything.
    StaleAnswer {
        /// Where, who, what type.
        #[serde(flatten)]
        context: Context,
        /// The nonce the answer named.
        nonce: String,
        /// The newest open push's nonce, if any.
        pending_nonce: String,
        /// Whether the stale answer was a NACK.
        nack: bool,
    },
    /// An answer naming a nonce the tap never saw pushed (it started mid-stream, say).
    UnmatchedAnswer {
        /// Where, who, what type.
        #[serde(flatten)]
        context: Context,
        /// The nonce the answer named.
        nonce: String,
    },
    /// The control plane sent a nonce again while the push that first carried it is open or
    /// recently decided: a control-plane fault. Answers still pair with pushes in order.
    NonceReused {
        /// Where, who, what type.
        #[serde(flatten)]
        context: Context,
        /// The nonce sent twice.
        nonce: String,
    },
}

impl Event {
    /// The node the event is about, as every view names it: its id, or for a client that sent
    /// none, its stream.
    pub fn node_id(&self) -> std::borrow::Cow<'_, str> {
        let context = self.context();
        match &context.node {
            Some(n) if !n.id.is_empty() => std::borrow::Cow::Borrowed(&n.id),
            _ => format!("(no node id, stream {})", context.stream.seq).into(),
        }
    }

    /// Where, who, what type.
    pub fn context(&self) -> &Context {
        match self {
            Event::Subscribe { context, .. }
            | Event::Resubscribe { context, .. }
            | Event::SubscriptionChange { context, .. }
            | Event::Push { context, .. }
            | Event::Verdict { context, .. }
            | Event::StaleAnswer { context, .. }
            | Event::UnmatchedAnswer { context, .. }
            | Event::NonceReused { context, .. }
            | Event::Warming { context, .. }
            | Event::StreamEnd { context, .. } => context,
        }
    }
}

/// Where an event happened: stream, node, type.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Context {
    /// The stream.
    pub stream: Arc<StreamContext>,
    /// The client's node (from the first request that carried one).
    pub node: Option<Arc<Node>>,
    /// `type_url`.
    pub type_url: String,
    /// When the event happened.
    pub time: Timestamp,
}

/// How a remembered nonce was decided.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Decided {
    /// By its answer.
    Answered,
    /// Superseded: an answer naming it is stale.
    Superseded,
}

/// One type on one stream.
#[derive(Default)]
struct Subscription {
    requested: bool,
    /// SotW: the names the client last asked for.
    names: Vec<String>,
    /// Pushes not yet decided, in the order they went out.
    open: VecDeque<Arc<Push>>,
    /// Recently decided nonces, oldest first.
    decided: VecDeque<(String, Decided)>,
    /// What the client last accepted, to diff a NACKed push against.
    accepted: Option<Accepted>,
    /// SotW: the version the client says it runs (its last answer's, or, reconnecting, the one
    /// its first request states).
    running_version: Option<String>,
    /// The content of the last push the client NACKed, and how often it was pushed again.
    rejected: Option<(u64, u32)>,
    /// Delta: the version of the last push (in the order they went out) the client accepted
    /// in whole, and when that push went out.
    accepted_version: Option<(String, Timestamp)>,
    /// Delta, reconnecting: the resource versions the client stated it has, until it accepts
    /// a push on this stream (what it runs is then known by digest).
    stated: Option<HashMap<String, String>>,
}

/// What the client runs of one type.
#[derive(Clone)]
enum Accepted {
    /// SotW: the last accepted push's resources are the whole state; kept by reference, not
    /// copied (the fleet shares them).
    Push(Arc<Resources>),
    /// SotW after a partial NACK: that push's resources, but for those it rejected, which keep
    /// the digest they had (none: they were new). A stream keeps only where it differs from
    /// the push, which the fleet shares.
    Except(Arc<Resources>, Vec<(String, Option<u64>)>),
    /// Delta: name -> what the client has of it, folded over what was applied.
    Digests(HashMap<String, Held>),
}

/// A Delta resource the client has: the digests of its content and of the version the control
/// plane gave it, which is what a reconnecting client states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    digest: u64,
    version: u64,
}

impl Held {
    fn of(r: &crate::xds::Resource<'_>) -> Held {
        Held {
            digest: r.digest,
            version: version_digest(r.version.unwrap_or_default()),
        }
    }
}

/// The digest a Delta resource's version is kept and matched by.
fn version_digest(version: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(version.as_bytes())
}

impl Accepted {
    fn digests(&self) -> HashMap<String, u64> {
        // A name twice in a push: Envoy runs the first.
        let of = |p: &Resources| -> HashMap<String, u64> {
            let mut m = HashMap::new();
            for r in p.iter() {
                m.entry(r.name.into_owned()).or_insert(r.digest);
            }
            m
        };
        match self {
            Accepted::Push(p) => of(p),
            Accepted::Except(p, kept) => {
                let mut m = of(p);
                for (name, digest) in kept {
                    match digest {
                        Some(d) => m.insert(name.clone(), *d),
                        None => m.remove(name),
                    };
                }
                m
            }
            Accepted::Digests(m) => m.iter().map(|(k, h)| (k.clone(), h.digest)).collect(),
        }
    }
}

impl Subscription {
    fn remember(&mut self, nonce: String, how: Decided) {
        if self.decided.len() == REMEMBERED_NONCES {
            self.decided.pop_front();
        }
        self.decided.push_back((nonce, how));
    }

    /// How `nonce` was decided, when it is remembered (the latest time it was).
    fn decided(&self, nonce: &str) -> Option<Decided> {
        self.decided
            .iter()
            .rev()
            .find(|(n, _)| n == nonce)
            .map(|(_, how)| *how)
    }

    /// A change of what the client asks for: SotW names that differ from the last ones, or
    /// any Delta (un)subscribe.
    fn names_changed(&mut self, api: Api, names: &[String], unsubscribe: &[String]) -> bool {
        match api {
            Api::Sotw if self.names != names => {
                self.names = names.to_vec();
                true
            }
            Api::Sotw => false,
            Api::Delta => !names.is_empty() || !unsubscribe.is_empty(),
        }
    }

    /// Folds an accepted push into what the client has.
    fn accept(&mut self, api: Api, push: &Arc<Push>) {
        // A bare wrapper (a heartbeat) carries no content.
        fn digests(p: &Push) -> impl Iterator<Item = (String, Held)> + '_ {
            (p.resources.iter())
                .filter(|r| !r.bare)
                .map(|r| (r.name.to_string(), Held::of(&r)))
        }
        match (api, &mut self.accepted) {
            // Envoy's SotW mux leaves bare wrappers out: under a wildcard they are gone, a
            // named one keeps what it had.
            (Api::Sotw, _) if push.resources.has_bare() => {
                let before = (!self.names.is_empty())
                    .then(|| self.accepted.as_ref().map(Accepted::digests))
                    .flatten();
                let kept = (push.resources.iter())
                    .filter(|r| r.bare)
                    .map(|r| {
                        let had = before.as_ref().and_then(|b| b.get(&*r.name)).copied();
                        (r.name.into_owned(), had)
                    })
                    .collect();
                self.accepted = Some(Accepted::Except(push.resources.clone(), kept));
            }
            (Api::Sotw, _) => self.accepted = Some(Accepted::Push(push.resources.clone())),
            (Api::Delta, Some(Accepted::Digests(acc))) => {
                for n in &push.removed {
                    acc.remove(n);
                }
                acc.extend(digests(push));
            }
            (Api::Delta, _) => self.accepted = Some(Accepted::Digests(digests(push).collect())),
        }
    }

    /// Folds the part of a NACKed push that the client applied: every resource but the
    /// `rejected`, which keep what they were; SotW drops what the push leaves out, Delta what it
    /// removes.
    fn accept_part(&mut self, api: Api, push: &Arc<Push>, rejected: &[Rejected]) {
        let before = self.accepted.as_ref().map(Accepted::digests);
        if api == Api::Sotw {
            let kept = (rejected.iter())
                .filter(|r| !r.duplicate())
                .map(|r| {
                    let had = before.as_ref().and_then(|b| b.get(&r.name)).copied();
                    (r.name.clone(), had)
                })
                .collect();
            self.accepted = Some(Accepted::Except(push.resources.clone(), kept));
            return;
        }
        let before = match &self.accepted {
            Some(Accepted::Digests(m)) => Some(m.clone()),
            _ => None,
        };
        let rejected_names = scope::names(rejected);
        let is_rejected = |n: &str| rejected_names.contains(n);
        let mut now = before.clone().unwrap_or_default();
        for n in &push.removed {
            now.remove(n);
        }
        for r in push.resources.iter().filter(|r| !is_rejected(&r.name)) {
            now.insert(r.name.to_string(), Held::of(&r));
        }
        for r in rejected {
            if let Some(h) = before.as_ref().and_then(|b| b.get(&r.name)) {
                now.insert(r.name.clone(), *h);
            }
        }
        self.accepted = Some(Accepted::Digests(now));
    }
}

/// The objects `new` changes against what the client ran (`accepted`): none when the tap does
/// not know what it ran, or neither side names objects.
fn objects_changed(
    accepted: Option<&Accepted>,
    new: &Arc<Resources>,
    interner: Option<&crate::xds::Interner>,
) -> Option<Arc<crate::xds::origin::Changed>> {
    use crate::xds::origin::Changed;
    match accepted? {
        Accepted::Push(old) | Accepted::Except(old, _) => {
            if Arc::ptr_eq(old, new) || (!old.has_origins() && !new.has_origins()) {
                return None;
            }
            Some(match interner {
                Some(i) => i.changed(old, new),
                None => Arc::new(Changed::between(old, new)),
            })
        }
        Accepted::Digests(had) => {
            if !new.has_origins() {
                return None;
            }
            let mut c = Changed::default();
            for (i, r) in new.iter().enumerate() {
                if !r.bare && had.get(&*r.name).map(|h| h.digest) != Some(r.digest) {
                    c.add(new.origins_of(i));
                }
            }
            Some(Arc::new(c))
        }
    }
}

/// An open CDS push's clusters warming: the EDS names it waits for.
struct Warming {
    nonce: String,
    version: String,
    names: Vec<String>,
}

/// Correlates one stream.
pub struct Correlator {
    stream: Arc<StreamContext>,
    api: Api,
    node: Option<Arc<Node>>,
    /// By type URL, in the order first seen: a stream has one type or a few.
    types: Vec<(String, Subscription)>,
    /// Open CDS pushes that wait for EDS, oldest first.
    warming: VecDeque<Warming>,
    ended: bool,
    /// How the stream ended, once it has: a push that crosses the end is decided by it.
    end: Option<(Option<i32>, String)>,
    /// Where pushes' resource sets are held once for every stream.
    interner: Option<Arc<Interner>>,
    /// What each node ran when its last stream ended.
    ledger: Option<Arc<Ledger>>,
}

impl Correlator {
    /// Whether a push on this stream still waits for its answer (or for the endpoints it
    /// warms on).
    pub fn awaiting_answer(&self) -> bool {
        self.types.iter().any(|(_, s)| !s.open.is_empty()) || !self.warming.is_empty()
    }
}

/// A verdict event for `push`, decided at `now`.
fn verdict(context: &Context, push: Arc<Push>, verdict: Verdict, now: Timestamp) -> Event {
    Event::Verdict {
        context: context.clone(),
        push,
        verdict,
        decided_at: now,
        client_version: None,
        overtaken_by: None,
        waiting_for: vec![],
    }
}

impl Correlator {
    /// A correlator for a new stream.
    pub fn new(api: Api, stream: StreamContext) -> Self {
        Correlator {
            stream: Arc::new(stream),
            api,
            node: None,
            types: Vec::new(),
            warming: VecDeque::new(),
            ended: false,
            end: None,
            interner: None,
            ledger: None,
        }
    }

    /// Pushes' resource sets go through `interner`, shared with every stream's equal sets.
    pub fn with_interner(mut self, interner: Arc<Interner>) -> Self {
        self.interner = Some(interner);
        self
    }

    /// What a node runs is kept in `ledger` when the stream ends, and read from it when the
    /// node reconnects.
    pub fn with_ledger(mut self, ledger: Arc<Ledger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// The node, once a request carried one.
    pub fn node(&self) -> Option<&Arc<Node>> {
        self.node.as_ref()
    }

    /// Whether the stream has ended (every push decided).
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// Pushes and nonces held for this stream: bounded by the type count times the per-type
    /// bounds, whatever the peers send.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.types
            .iter()
            .map(|(_, s)| s.open.len() + s.decided.len())
            .sum::<usize>()
            + self.warming.len()
    }

    fn context(&self, type_url: &str, time: Timestamp) -> Context {
        Context {
            stream: self.stream.clone(),
            node: self.node.clone(),
            type_url: type_url.into(),
            time,
        }
    }

    /// The subscription of `type_url`, unless the stream already has [`MAX_TYPES`] others.
    fn subscription(&mut self, type_url: &str) -> Option<&mut Subscription> {
        let i = match self.types.iter().position(|(t, _)| t == type_url) {
            Some(i) => i,
            None if self.types.len() >= MAX_TYPES => return None,
            None => {
                if self.types.is_empty() {
                    // Room for exactly one: most streams never ask for a second type.
                    self.types.reserve_exact(1);
                }
                self.types
                    .push((type_url.to_string(), Subscription::default()));
                self.types.len() - 1
            }
        };
        Some(&mut self.types[i].1)
    }

    /// The subscription of `type_url`, if the stream has one.
    fn subscribed(&self, type_url: &str) -> Option<&Subscription> {
        (self.types.iter()).find_map(|(t, s)| (t == type_url).then_some(s))
    }

    /// A request from the client. Nothing after the stream's end counts.
    pub fn on_request(&mut self, mut req: Request, now: Timestamp, out: &mut Vec<Event>) {
        if self.ended {
            return;
        }
        if let Some(node) = req.node.take() {
            if self.node.is_none() || !node.id.is_empty() {
                self.node = Some(Arc::new(node));
            }
        }
        let context = self.context(&req.type_url, now);
        let api = self.api;
        let ledger = self.ledger.clone();
        let node = self.node.clone();
        let Some(sub) = self.subscription(&req.type_url) else {
            return;
        };
        if !sub.requested {
            sub.requested = true;
            if api == Api::Sotw {
                sub.names = req.resource_names.clone();
            }
            if req.response_nonce.is_empty() {
                // Reconnecting, a SotW client says which version it runs: when its last stream
                // through this tap ended on that version, what it runs is known.
                if api == Api::Sotw && !req.version_info.is_empty() {
                    sub.running_version = Some(req.version_info.clone());
                    if let (Some(ledger), Some(node)) = (&ledger, &node) {
                        sub.accepted = ledger.recall(&node.id, &req.type_url, &req.version_info);
                    }
                }
                // A Delta client states each resource's version: when every one is what its
                // last stream through this tap ended with, what it runs is known by content.
                if api == Api::Delta && !req.initial_resource_versions.is_empty() {
                    if let (Some(ledger), Some(node)) = (&ledger, &node) {
                        let stated = &req.initial_resource_versions;
                        sub.accepted = ledger.recall_delta(&node.id, &req.type_url, stated);
                    }
                    let stated = req.initial_resource_versions.iter().cloned().collect();
                    sub.stated = Some(stated);
                }
                out.push(first_request(api, context, req));
                return;
            }
        }
        let nonce = &req.response_nonce;
        let decided_from = out.len();
        if !nonce.is_empty() {
            if let Some(k) = sub.open.iter().position(|p| p.nonce == *nonce) {
                answer(api, sub, k, &context, &req, now, out);
            } else {
                match sub.decided(nonce) {
                    Some(Decided::Superseded) => out.push(Event::StaleAnswer {
                        context: context.clone(),
                        nonce: nonce.clone(),
                        pending_nonce: sub.open.back().map(|p| p.nonce.clone()).unwrap_or_default(),
                        nack: req.error_detail.is_some(),
                    }),
                    // Already answered: the same nonce again is a subscription change (EDS,
                    // RDS) when the names differ, and a harmless repeat otherwise.
                    Some(Decided::Answered) => {}
                    None => out.push(Event::UnmatchedAnswer {
                        context: context.clone(),
                        nonce: nonce.clone(),
                    }),
                }
            }
        }
        if sub.names_changed(api, &req.resource_names, &req.unsubscribe) {
            out.push(Event::SubscriptionChange {
                context,
                names: req.resource_names,
                unsubscribed: req.unsubscribe,
            });
        }
        self.settle_warming(&mut out[decided_from..]);
    }

    /// A response from the control plane. Call it before the response is forwarded, so an
    /// answer can never be seen before its push. One that comes after the stream's end (it
    /// crossed the client's reset on the wire) is a push all the same, and Unanswered at once,
    /// by that end.
    pub fn on_response(&mut self, resp: Response, now: Timestamp, out: &mut Vec<Event>) {
        if let Some((grpc_status, message)) = self.end.take() {
            self.ended = false;
            self.on_response(resp, now, out);
            self.ended = true;
            self.end = Some((grpc_status, message.clone()));
            let message = format!("{message}; the push crossed the stream's end");
            let decided_from = out.len();
            self.decide_open(grpc_status, &message, now, out);
            self.settle_warming(&mut out[decided_from..]);
            self.warming.clear();
            return;
        }
        if self.ended {
            return;
        }
        let context = self.context(&resp.type_url, now);
        let api = self.api;
        let decided_from = out.len();
        let interner = self.interner.clone();
        let Some(sub) = self.subscription(&resp.type_url) else {
            return;
        };
        let content = content_digest(&resp.resources, &resp.removed);
        let resent_rejected = match &mut sub.rejected {
            Some((c, n)) if *c == content => {
                *n += 1;
                *n
            }
            _ => 0,
        };
        let resources = {
            let mut r = resp.resources;
            r.shrink_to_fit();
            match &interner {
                Some(i) => i.intern(r),
                None => Arc::new(r),
            }
        };
        let objects_changed =
            objects_changed(sub.accepted.as_ref(), &resources, interner.as_deref());
        let push = Arc::new(Push {
            resent_rejected,
            objects_changed,
            type_url: resp.type_url,
            version: resp.version_info,
            nonce: resp.nonce,
            at: now,
            resources,
            removed: resp.removed,
            bytes: resp.bytes,
            control_plane: resp.control_plane,
            resource_errors: resp.resource_errors,
        });
        if !push.nonce.is_empty()
            && (sub.open.iter().any(|p| p.nonce == push.nonce)
                || sub.decided(&push.nonce).is_some())
        {
            out.push(Event::NonceReused {
                context: context.clone(),
                nonce: push.nonce.clone(),
            });
        }
        let bound = match api {
            Api::Sotw => MAX_OPEN_SOTW,
            Api::Delta => MAX_OPEN_DELTA,
        };
        if sub.open.len() >= bound {
            let oldest = sub.open.pop_front().expect("the bound is at least one");
            let given_up = match (api, sub.open.front()) {
                (Api::Sotw, Some(next)) => Verdict::Superseded {
                    by_nonce: next.nonce.clone(),
                },
                _ => Verdict::Unanswered {
                    grpc_status: None,
                    message: format!("more than {bound} pushes open; gave up on the oldest"),
                },
            };
            sub.remember(oldest.nonce.clone(), Decided::Superseded);
            out.push(verdict(&context, oldest, given_up, now));
        }
        sub.open.push_back(push.clone());
        out.push(Event::Push {
            context: context.clone(),
            push: push.clone(),
        });
        self.settle_warming(&mut out[decided_from..]);
        match push.type_url.as_str() {
            CLUSTER => self.start_warming(&context, &push, out),
            ENDPOINTS => self.feed_warming(&push, now, out),
            _ => {}
        }
    }

    /// A CDS push: the EDS names of the clusters it adds or changes, which the client waits
    /// for. Not while the client starts: Envoy holds CDS answers for warming clusters only once
    /// its first clusters are up, so only a client that accepted clusters before (on this
    /// stream, or as it says when it reconnects) waits.
    fn start_warming(&mut self, context: &Context, push: &Push, out: &mut Vec<Event>) {
        let Some(sub) = self.subscribed(CLUSTER) else {
            return;
        };
        let names = match (&sub.accepted, &sub.stated) {
            (Some(accepted), _) => {
                // Same place, same digest: the same resource (a digest covers the name, and
                // pushes list their clusters in the same order as a rule); only the others'
                // names are decoded and looked up.
                let mut by_name: Option<HashMap<String, u64>> = None;
                warming_names(push, |i, digest| {
                    if let Accepted::Push(p) = accepted {
                        if p.digest_at(i).map(|d| d.0) == Some(digest) {
                            return true;
                        }
                    }
                    let Some(r) = push.resources.get(i) else {
                        return false;
                    };
                    let had = match accepted {
                        Accepted::Digests(m) => m.get(&*r.name).map(|h| h.digest),
                        a => by_name
                            .get_or_insert_with(|| a.digests())
                            .get(&*r.name)
                            .copied(),
                    };
                    had == Some(digest)
                })
            }
            // A reconnected Delta client has, of each resource, the version it stated.
            (None, Some(stated)) => warming_names(push, |i, _| {
                let r = push.resources.get(i);
                let stated = r.as_ref().and_then(|r| stated.get(&*r.name));
                stated.is_some() && stated.map(|v| v.as_str()) == r.as_ref().and_then(|r| r.version)
            }),
            (None, None) => return,
        };
        if names.is_empty() {
            return;
        }
        if self.warming.len() == MAX_WARMING {
            self.warming.pop_front();
        }
        out.push(Event::Warming {
            context: context.clone(),
            nonce: push.nonce.clone(),
            version: push.version.clone(),
            clusters: names.clone(),
        });
        self.warming.push_back(Warming {
            nonce: push.nonce.clone(),
            version: push.version.clone(),
            names,
        });
    }

    /// An EDS push: strikes the names it carries off every warming CDS push.
    fn feed_warming(&mut self, push: &Push, now: Timestamp, out: &mut Vec<Event>) {
        if self.warming.is_empty() {
            return;
        }
        let came: std::collections::HashSet<Cow<'_, str>> =
            push.resources.iter().map(|r| r.name).collect();
        let context = self.context(CLUSTER, now);
        for w in &mut self.warming {
            let before = w.names.len();
            w.names.retain(|n| !came.contains(n.as_str()));
            if w.names.len() != before {
                out.push(Event::Warming {
                    context: context.clone(),
                    nonce: w.nonce.clone(),
                    version: w.version.clone(),
                    clusters: w.names.clone(),
                });
            }
        }
    }

    /// CDS verdicts among `events` take what their push still waited for; decided pushes are
    /// followed no more.
    fn settle_warming(&mut self, events: &mut [Event]) {
        if self.warming.is_empty() {
            return;
        }
        for e in events {
            if let Event::Verdict {
                context,
                push,
                waiting_for,
                ..
            } = e
            {
                if context.type_url != CLUSTER {
                    continue;
                }
                if let Some(k) = self.warming.iter().position(|w| w.nonce == push.nonce) {
                    *waiting_for = self.warming.remove(k).expect("found above").names;
                }
            }
        }
    }

    /// The stream ended: every open push is decided (an overtaken one Superseded, the newest
    /// Unanswered with `grpc_status` and `message`), then one [`Event::StreamEnd`]. Later calls
    /// (the trailers came first, then the stream closed) do nothing.
    pub fn on_stream_end(
        &mut self,
        grpc_status: Option<i32>,
        message: &str,
        now: Timestamp,
        out: &mut Vec<Event>,
    ) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.end = Some((grpc_status, message.to_string()));
        let decided_from = out.len();
        self.decide_open(grpc_status, message, now, out);
        let types = std::mem::take(&mut self.types);
        if let (Some(ledger), Some(node)) = (&self.ledger, &self.node) {
            for (type_url, sub) in &types {
                match (&sub.running_version, &sub.accepted) {
                    (Some(version), Some(accepted)) if self.api == Api::Sotw => {
                        ledger.record(&node.id, type_url, version, accepted.clone());
                    }
                    (_, Some(Accepted::Digests(held))) if self.api == Api::Delta => {
                        ledger.record_delta(&node.id, type_url, held);
                    }
                    _ => {}
                }
            }
        }
        self.types = types;
        self.settle_warming(&mut out[decided_from..]);
        self.warming.clear();
        out.push(Event::StreamEnd {
            context: self.context("", now),
            grpc_status,
            message: message.into(),
        });
    }
}

impl Correlator {
    /// Every open push decided by the stream's end: an overtaken one Superseded, the newest
    /// Unanswered with `grpc_status` and `message`.
    fn decide_open(
        &mut self,
        grpc_status: Option<i32>,
        message: &str,
        now: Timestamp,
        out: &mut Vec<Event>,
    ) {
        let mut types = std::mem::take(&mut self.types);
        types.sort_by(|a, b| a.0.cmp(&b.0));
        for (type_url, sub) in &mut types {
            let context = self.context(type_url, now);
            while let Some(push) = sub.open.pop_front() {
                let v = match (self.api, sub.open.front()) {
                    (Api::Sotw, Some(next)) => Verdict::Superseded {
                        by_nonce: next.nonce.clone(),
                    },
                    _ => Verdict::Unanswered {
                        grpc_status,
                        message: message.into(),
                    },
                };
                out.push(verdict(&context, push, v, now));
            }
        }
        self.types = types;
    }
}

/// The event of a type's first request with no nonce: a subscription, or a resubscription
/// stating what the client already has (a reconnect).
fn first_request(api: Api, context: Context, req: Request) -> Event {
    match api {
        Api::Sotw if !req.version_info.is_empty() => Event::Resubscribe {
            context,
            version: req.version_info,
            versions: vec![],
            names: req.resource_names,
        },
        Api::Delta if !req.initial_resource_versions.is_empty() => Event::Resubscribe {
            context,
            version: String::new(),
            versions: req.initial_resource_versions,
            names: req.resource_names,
        },
        _ => Event::Subscribe {
            context,
            names: req.resource_names,
        },
    }
}

/// The answer `req` to open push `k`: in SotW, the open pushes before it are superseded (their
/// answers, which come in order, will not come), then `k` gets its verdict.
fn answer(
    api: Api,
    sub: &mut Subscription,
    k: usize,
    context: &Context,
    req: &Request,
    now: Timestamp,
    out: &mut Vec<Event>,
) {
    if api == Api::Sotw {
        for _ in 0..k {
            let old = sub.open.pop_front().expect("k open pushes before it");
            let by_nonce = sub.open.front().expect("push k").nonce.clone();
            sub.remember(old.nonce.clone(), Decided::Superseded);
            out.push(verdict(context, old, Verdict::Superseded { by_nonce }, now));
        }
    }
    let k = if api == Api::Sotw { 0 } else { k };
    let push = sub.open.remove(k).expect("index from position");
    // SotW: a push still open behind it went out before this answer came.
    let overtaken_by = match api {
        Api::Sotw => sub.open.front().map(|p| p.nonce.clone()),
        Api::Delta => None,
    };
    if api == Api::Sotw {
        sub.running_version = Some(req.version_info.clone());
    }
    // Delta requests carry no version: what it runs is what it last accepted.
    let client_version = match api {
        Api::Sotw => Some(req.version_info.clone()),
        Api::Delta if req.error_detail.is_none() => Some(push.version.clone()),
        Api::Delta => sub.accepted_version.as_ref().map(|(v, _)| v.clone()),
    };
    let v = match &req.error_detail {
        None => {
            // Answers to Delta pushes may come in any order; the client applied them in theirs.
            let later = (sub.accepted_version.as_ref()).is_none_or(|(_, at)| push.at >= *at);
            if api == Api::Delta && !push.heartbeat() && !push.version.is_empty() && later {
                sub.accepted_version = Some((push.version.clone(), push.at));
            }
            sub.accept(api, &push);
            sub.rejected = None;
            Verdict::Ack
        }
        Some(error) => {
            let content = content_digest(&push.resources, &push.removed);
            if sub.rejected.is_none_or(|(c, _)| c != content) {
                sub.rejected = Some((content, 0));
            }
            let (mut suspects, changed) = blame(api, &push, sub.accepted.as_ref(), &error.message);
            let (scope, rejected) = scope::read(&error.message, &push.resources);
            let mut applied = Vec::new();
            if scope == Scope::Partial {
                let rejected_names = scope::names(&rejected);
                let is_rejected = |n: &str| rejected_names.contains(n);
                applied = (changed.iter())
                    .filter(|n| !is_rejected(n))
                    .cloned()
                    .collect();
                suspects = rejected.iter().map(|r| r.name.clone()).collect();
                sub.accept_part(api, &push, &rejected);
            }
            let objects = objects_behind(&push.resources, &suspects, &rejected, &error.message);
            Verdict::Nack {
                error: error.clone(),
                suspects,
                changed,
                scope,
                rejected,
                applied,
                objects,
            }
        }
    };
    sub.remember(push.nonce.clone(), Decided::Answered);
    out.push(Event::Verdict {
        context: context.clone(),
        push,
        verdict: v,
        decided_at: now,
        client_version: client_version.filter(|v| api == Api::Sotw || !v.is_empty()),
        overtaken_by,
        waiting_for: vec![],
    });
}

/// The EDS names of the clusters in a CDS `push` that take endpoints from EDS and that the
/// client does not `has` (by place in the push and digest) as they are.
fn warming_names(push: &Push, mut has: impl FnMut(usize, u64) -> bool) -> Vec<String> {
    let pushed = &push.resources;
    if !pushed.has_eds() {
        return vec![];
    }
    let mut names = Vec::new();
    for i in 0..pushed.len() {
        let Some((digest, eds)) = pushed.digest_at(i) else {
            break;
        };
        if !eds || names.len() == MAX_WARMING_NAMES || has(i, digest) {
            continue;
        }
        let Some(r) = pushed.get(i) else { break };
        if let Some(name) = pushed.eds_name(i, &r) {
            names.push(name.to_string());
        }
    }
    names
}

/// One digest for a push's content: its resources' digests in order, then what it removes.
fn content_digest(resources: &Resources, removed: &[String]) -> u64 {
    let mix = |h: u64, v: u64| (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    let mut h = mix(0, resources.len() as u64);
    for i in 0..resources.len() {
        h = mix(h, resources.digest_at(i).map_or(0, |(d, _)| d));
    }
    for name in removed {
        h = name.bytes().fold(mix(h, 0xff), |h, b| mix(h, u64::from(b)));
    }
    h
}

/// NACK blame: what changed since the last accepted state, and which of those the error names.
/// Runs only on a NACK; linear in the resources of both states.
fn blame(
    api: Api,
    push: &Push,
    accepted: Option<&Accepted>,
    message: &str,
) -> (Vec<String>, Vec<String>) {
    let old: Option<HashMap<Cow<'_, str>, u64>> = accepted.map(|a| match a {
        Accepted::Push(p) => p.iter().map(|r| (r.name, r.digest)).collect(),
        Accepted::Digests(m) => m.iter().map(|(k, h)| (Cow::from(k), h.digest)).collect(),
        Accepted::Except(..) => (a.digests().into_iter())
            .map(|(k, v)| (Cow::from(k), v))
            .collect(),
    });
    let mut changed: Vec<String> = push
        .resources
        .iter()
        .filter(|r| old.as_ref().and_then(|o| o.get(&r.name)) != Some(&r.digest))
        .map(|r| r.name.into_owned())
        .collect();
    match api {
        Api::Sotw => {
            if let Some(old) = &old {
                let now: std::collections::HashSet<Cow<'_, str>> =
                    push.resources.iter().map(|r| r.name).collect();
                let mut removed: Vec<&str> = old
                    .keys()
                    .filter(|n| !now.contains(*n))
                    .map(|n| &**n)
                    .collect();
                removed.sort_unstable();
                changed.extend(removed.into_iter().map(String::from));
            }
        }
        Api::Delta => changed.extend(push.removed.iter().cloned()),
    }
    let words = Mentions::of(message);
    let mut named: Vec<String> = push
        .resources
        .iter()
        .map(|r| r.name)
        .chain(push.removed.iter().map(Cow::from))
        .filter(|n| words.names(n))
        .map(Cow::into_owned)
        .collect();
    named.dedup();
    let suspects = if named.is_empty() {
        changed.clone()
    } else {
        named
    };
    (suspects, changed)
}

/// A character that may be part of a resource name as a message quotes it.
fn word(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '|' | '~' | '/')
}

/// A message's words, read once, so that asking whether it names each of a push's resources
/// costs the message's length plus one lookup a name, not the message's length a name: a NACK
/// message of 64 KiB against a push of 10,000 clusters is one pass, not 10,000.
pub struct Mentions<'a> {
    message: &'a str,
    words: std::collections::HashSet<&'a str>,
}

impl<'a> Mentions<'a> {
    /// The words of `message` (a word with one trailing `.`, which ends a sentence, also
    /// without it).
    pub fn of(message: &'a str) -> Self {
        let mut words = std::collections::HashSet::new();
        for w in message.split(|c: char| !word(c)).filter(|w| !w.is_empty()) {
            words.insert(w);
            if let Some(short) = w.strip_suffix('.') {
                words.insert(short);
            }
        }
        Mentions { message, words }
    }

    /// Whether the message names `name` as a whole word, as [`mentions`] says.
    pub fn names(&self, name: &str) -> bool {
        match name.chars().all(word) {
            true => !name.is_empty() && self.words.contains(name),
            // A name with characters no word has cannot be one word: searched for.
            false => mentions(self.message, name),
        }
    }
}

/// Whether `message` mentions `name` as a whole word (so cluster `a` is not found in "value").
pub fn mentions(message: &str, name: &str) -> bool {
    if name.is_empty() {
        return false;
    }
    let mut start = 0;
    while let Some(i) = message[start..].find(name) {
        let pos = start + i;
        let before = message[..pos].chars().next_back();
        let after = message[pos + name.len()..].chars().next();
        let boundary_after = match after {
            None => true,
            // A trailing '.' ends a sentence, it does not extend the name.
            Some('.') => message[pos + name.len() + 1..]
                .chars()
                .next()
                .is_none_or(|c| !word(c)),
            Some(c) => !word(c),
        };
        if before.is_none_or(|c| !word(c)) && boundary_after {
            return true;
        }
        start = pos + name.len().max(1);
    }
    false
}

#[cfg(test)]
mod tests;

/// The objects behind a NACK: those each suspect was made from, read against its own part of
/// the message when the client gave one (a partial NACK), else against the whole message.
/// Linear in the push, and only for a push whose metadata names any object.
fn objects_behind(
    resources: &Resources,
    suspects: &[String],
    rejected: &[scope::Rejected],
    message: &str,
) -> Vec<Origin> {
    let mut out = Vec::new();
    if !resources.has_origins() || suspects.is_empty() {
        return out;
    }
    let wanted: std::collections::HashSet<&str> = suspects.iter().map(String::as_str).collect();
    let own: HashMap<&str, &str> = (rejected.iter())
        .map(|x| (x.name.as_str(), x.reason.as_str()))
        .collect();
    // The message's words read once; a rejected resource's own part of it, once each (their
    // lengths add up to the message's at most).
    let all = origin::Words::of(message);
    for (i, r) in resources.iter().enumerate() {
        if !wanted.contains(&*r.name) || out.len() >= origin::MAX_BEHIND {
            continue;
        }
        let origins = resources.origins_of(i).map(|o| &**o);
        match own.get(&*r.name) {
            Some(reason) => origin::behind(&r.name, origins, &origin::Words::of(reason), &mut out),
            None => origin::behind(&r.name, origins, &all, &mut out),
        }
    }
    // A part the message names in one resource outweighs every object of the others.
    if out.iter().any(|o| o.named) {
        out.retain(|o| o.named);
    }
    out
}
