//! The status board's wire types: what `/status` serves as JSON and `xdstap status` prints,
//! each a snapshot the board builds on request; nothing here holds live state.

use serde::{Deserialize, Serialize};

use super::resources;
use crate::xds::short_type;

/// The sync state of one type for one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SyncState {
    /// The last push was accepted.
    Synced,
    /// Subscribed; nothing pushed yet.
    NotSent,
    /// A push went out and its answer is not yet overdue (and nothing was accepted before).
    Pending,
    /// The last answer was a NACK: the client runs an older config.
    Nacked,
    /// A push has gone unanswered for longer than the threshold.
    Stale,
}

impl SyncState {
    /// As shown in tables.
    pub fn label(self) -> &'static str {
        match self {
            SyncState::Synced => "SYNCED",
            SyncState::Pending => "PENDING",
            SyncState::NotSent => "NOT SENT",
            SyncState::Nacked => "NACKED",
            SyncState::Stale => "STALE",
        }
    }

    /// NACKED and STALE need someone's attention.
    pub fn is_problem(self) -> bool {
        matches!(self, SyncState::Nacked | SyncState::Stale)
    }
}

/// The last NACK of a type.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NackInfo {
    /// `error_detail.code`.
    pub code: i32,
    /// The client's message.
    pub message: String,
    /// Suspect resources (capped).
    pub suspects: Vec<String>,
    /// The version that was rejected.
    pub version: String,
    /// When the type became NACKED (the first of consecutive NACKs).
    pub since: String,
    /// How much of the push the client rejected: `whole`, `partial` (the rest of the push
    /// runs) or `unknown`.
    #[serde(default)]
    pub scope: String,
    /// Partial: the resources rejected (capped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<String>,
    /// Partial: the changed resources that landed all the same (capped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied: Vec<String>,
}

/// One type of one node, as `/status` shows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TypeStatus {
    /// `CDS`, `EDS`, ... or the type URL.
    #[serde(rename = "type")]
    pub short_type: String,
    /// Full type URL.
    pub type_url: String,
    /// The state now.
    pub state: SyncState,
    /// Version last pushed.
    pub version_sent: Option<String>,
    /// Version last accepted.
    pub version_accepted: Option<String>,
    /// Nonce of the last push.
    pub nonce: Option<String>,
    /// When the last push went out.
    pub last_push_at: Option<String>,
    /// Since when a push has been waiting for its answer.
    pub pending_since: Option<String>,
    /// Push to answer of the last answered push, milliseconds.
    pub latency_ms: Option<f64>,
    /// Pushes seen.
    pub pushes: u64,
    /// ACKs.
    pub acks: u64,
    /// NACKs.
    pub nacks: u64,
    /// Pushes superseded before an answer.
    pub superseded: u64,
    /// Pushes left unanswered by a stream end.
    pub unanswered: u64,
    /// Pushes whose nonce the control plane had already used on that stream (its fault).
    #[serde(default)]
    pub nonce_reuses: u64,
    /// Pushes of content the client had just NACKed, sent again (the control plane loops).
    #[serde(default)]
    pub rejected_resends: u64,
    /// Heartbeats answered (pushes of bare wrappers that refresh TTLs; not counted as pushes).
    #[serde(default)]
    pub heartbeats: u64,
    /// The current NACK, when NACKED.
    pub nack: Option<NackInfo>,
    /// Whether the client asked for this type (pushes can come unasked).
    #[serde(default)]
    pub subscribed: bool,
    /// Since when the type has been in its state.
    #[serde(default)]
    pub state_since: Option<String>,
    /// How long it has been in its state, seconds.
    #[serde(default)]
    pub state_seconds: f64,
    /// When the type's last message passed, either way.
    #[serde(default)]
    pub last_message_at: Option<String>,
    /// CDS: the EDS resources the open push waits for (cluster warming): Envoy holds its answer
    /// until they come, or until their fetch timeout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<String>,
    /// Resources the control plane reported errors for and has not sent since (capped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_errors: Vec<ResourceErrorInfo>,
}

/// A resource the control plane reported an error for (`resource_errors`), until it sends it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResourceErrorInfo {
    /// The resource name.
    pub name: String,
    /// `error_detail.code`.
    pub code: i32,
    /// `error_detail.message`, as the control plane sent it.
    pub message: String,
    /// When the push that reported it went out.
    pub since: String,
}

/// One node, as `/status` shows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NodeStatus {
    /// `node.id`.
    pub id: String,
    /// `node.cluster`.
    pub cluster: String,
    /// Client user agent.
    pub user_agent: String,
    /// The worst state over its types.
    pub state: SyncState,
    /// Whether any of its xDS streams is open.
    pub connected: bool,
    /// Open xDS streams.
    pub streams: usize,
    /// Last event.
    pub last_seen: String,
    /// When its last stream closed, while disconnected.
    pub disconnected_at: Option<String>,
    /// Per type, sorted by short type.
    pub types: Vec<TypeStatus>,
    /// Per resource, when one node is asked for over HTTP (`/status?node=ID`); over gRPC, CSDS
    /// answers this.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ResourceView>,
}

/// One resource of one node, as `/status?node=ID` lists it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResourceView {
    /// `CDS`, `EDS`, ... or the type URL.
    #[serde(rename = "type")]
    pub short_type: String,
    /// The resource name.
    pub name: String,
    /// The version whose content the client runs (empty: none).
    pub version: String,
    /// The control plane's side: SYNCED, NOT_SENT, STALE, ERROR.
    pub config: resources::ConfigStatus,
    /// The client's side: ACKED, NACKED, REQUESTED, RECEIVED_ERROR.
    pub client: resources::ClientStatus,
    /// The client's (or, for RECEIVED_ERROR, the control plane's) message about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The version rejected, when the client rejected one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected_version: Option<String>,
}

impl From<resources::ResourceStatus> for ResourceView {
    fn from(r: resources::ResourceStatus) -> Self {
        let (error, rejected) = match r.error {
            Some((message, version, _)) => (Some(message), Some(version).filter(|v| !v.is_empty())),
            None => (None, None),
        };
        ResourceView {
            short_type: short_type(&r.type_url).to_string(),
            name: r.name,
            version: r.version,
            config: r.config,
            client: r.client,
            error,
            rejected_version: rejected,
        }
    }
}

/// `/status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StatusReport {
    /// When this was taken.
    pub generated_at: String,
    /// The STALE threshold, seconds.
    pub stale_after_seconds: f64,
    /// Nodes, sorted by id.
    pub nodes: Vec<NodeStatus>,
}

/// The state a node shows: its worst type's (STALE, then NACKED, PENDING, NOT SENT, SYNCED: the
/// order [`SyncState`] is declared in). Only STALE and NACKED are problems
/// ([`SyncState::is_problem`]).
pub fn worst(states: impl Iterator<Item = SyncState>) -> SyncState {
    states.max().unwrap_or(SyncState::NotSent)
}
