//! One verdict as one flat record, built once on the sinks' thread (by the first sink that
//! reads it, [`crate::queue::Delivered`]) and read by every output and view that shows a
//! verdict: the log line, the event log, spans, watch and the page. And a client's
//! resubscribe, which the event log writes too. Names, versions and digests only; never
//! resource contents; lists capped at [`NAMES_CAP`].

use serde::Serialize;

use crate::api::{names, v1, NAMES_CAP};
use crate::clock::rfc3339;
use crate::correlate::{Event, Scope, Verdict, VerdictKind};
use crate::xds::{short_type, Api};

/// Who a record is about, as every record names it: the node and the type.
#[derive(Debug, Clone, Serialize)]
pub struct Subject {
    /// `node.id`.
    pub node: String,
    /// `node.cluster`.
    pub node_cluster: String,
    /// Client user agent.
    pub user_agent: String,
    /// Short type (`CDS`) or the type URL when not a known one.
    #[serde(rename = "type")]
    pub short_type: String,
    /// Full type URL.
    pub type_url: String,
    /// SotW or Delta (`sotw`, `delta`), when the stream said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api: Option<Api>,
}

impl Subject {
    /// The node and stream of `context`, with `type_url`.
    fn of(context: &crate::correlate::Context, type_url: &str) -> Subject {
        let node = context.node.as_deref().cloned().unwrap_or_default();
        Subject {
            node: node.id,
            node_cluster: node.cluster,
            user_agent: node.user_agent,
            short_type: short_type(type_url).to_string(),
            type_url: type_url.to_string(),
            api: context.stream.api,
        }
    }
}

/// A push's fate, flattened.
#[derive(Debug, Clone, Serialize)]
pub struct VerdictRecord {
    /// When the verdict was reached, RFC 3339 UTC.
    pub time: String,
    /// `ack`, `nack`, `superseded`, `unanswered`.
    pub verdict: VerdictKind,
    /// The node and the type.
    #[serde(flatten)]
    pub subject: Subject,
    /// Version pushed.
    pub version: String,
    /// Nonce of the push.
    pub nonce: String,
    /// Resources in the push.
    pub resources: usize,
    /// The first [`NAMES_CAP`] resource names.
    pub resource_names: Vec<String>,
    /// Names removed (Delta).
    pub removed: Vec<String>,
    /// Push size in bytes.
    pub bytes: u64,
    /// Push to verdict, milliseconds.
    pub latency_ms: f64,
    /// The version the client said it has (ack, nack).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_version: Option<String>,
    /// NACK: `error_detail.code`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<i32>,
    /// NACK: `error_detail.message`, the client's own text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// NACK: the resources to look at first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub suspects: Vec<String>,
    /// NACK: every resource changed since what the client ran before (capped).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<String>,
    /// NACK: `whole`, `partial` (the rest of the push runs) or `unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nack_scope: Option<Scope>,
    /// Partial NACK: the resources rejected (capped).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<String>,
    /// Partial NACK: the changed resources that landed all the same (capped).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub applied: Vec<String>,
    /// NACK: the Kubernetes objects the rejected resources were made from, as their metadata
    /// names them (as the API shows them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<v1::Origin>,
    /// The Kubernetes objects whose resources the push changed against what the client ran
    /// (added, changed, removed), as their metadata names them: the first 64.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub objects_changed: Vec<String>,
    /// How many objects it changed in all.
    #[serde(skip_serializing_if = "is_zero")]
    pub objects_changed_count: usize,
    /// Superseded: the nonce of the push that overtook it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    /// Ack/nack answered late: the nonce of the newer push that went out before the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overtaken_by: Option<String>,
    /// CDS: the EDS resources still missing when the push was decided (cluster warming).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<String>,
    /// Unanswered: grpc-status the stream ended with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<i32>,
    /// Unanswered: why the stream ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_message: Option<String>,
    /// Process-unique stream id.
    pub stream: u64,
    /// The gRPC service (`envoy.service.discovery.v3.AggregatedDiscoveryService`).
    pub service: String,
    /// The gRPC method (`StreamAggregatedResources`).
    pub method: String,
    /// Client address.
    pub downstream: String,
    /// Control plane address.
    pub upstream: String,
    /// `control_plane.identifier`, when the server set it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<String>,
}

impl VerdictRecord {
    /// The record of a verdict event; `None` for other events.
    pub fn from_event(event: &Event) -> Option<VerdictRecord> {
        let Event::Verdict {
            context,
            push,
            verdict,
            decided_at,
            client_version,
            overtaken_by,
            waiting_for,
        } = event
        else {
            return None;
        };
        let mut r = VerdictRecord {
            time: rfc3339(*decided_at),
            verdict: verdict.kind(),
            subject: Subject::of(context, &push.type_url),
            version: push.version.clone(),
            nonce: push.nonce.clone(),
            resources: push.resources.len(),
            resource_names: names(push.resources.iter().map(|r| r.name)),
            removed: names(&push.removed),
            bytes: push.bytes,
            latency_ms: decided_at.saturating_sub(push.at) as f64 / 1e6,
            client_version: client_version.clone(),
            error_code: None,
            error_message: None,
            suspects: Vec::new(),
            changed: Vec::new(),
            nack_scope: None,
            rejected: Vec::new(),
            applied: Vec::new(),
            objects: Vec::new(),
            objects_changed: (push.objects_changed.iter())
                .flat_map(|c| c.objects.iter())
                .map(|o| o.label())
                .collect(),
            objects_changed_count: push.objects_changed.as_ref().map_or(0, |c| c.count),
            superseded_by: None,
            overtaken_by: overtaken_by.clone(),
            waiting_for: names(waiting_for),
            grpc_status: None,
            end_message: None,
            stream: context.stream.seq,
            service: context.stream.service.clone(),
            method: context.stream.method.clone(),
            downstream: context.stream.downstream.clone(),
            upstream: context.stream.upstream.clone(),
            control_plane: push.control_plane.clone(),
        };
        match verdict {
            Verdict::Nack { changed, scope, .. } => {
                let nack = crate::api::nack(push, verdict, *decided_at).expect("a NACK");
                r.error_code = Some(nack.code);
                r.error_message = Some(nack.message);
                r.suspects = nack.suspects;
                r.changed = names(changed);
                r.nack_scope = Some(*scope);
                r.rejected = nack.rejected;
                r.applied = nack.applied;
                r.objects = nack.objects;
            }
            Verdict::Superseded { by_nonce } => r.superseded_by = Some(by_nonce.clone()),
            Verdict::Unanswered {
                grpc_status,
                message,
            } => {
                r.grpc_status = *grpc_status;
                r.end_message = Some(message.clone());
            }
            Verdict::Ack => {}
        }
        Some(r)
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A client that reconnected, stating what it runs, flattened: the event log's line for it
/// (`"event": "resubscribe"`; a verdict's line has a `verdict` instead).
#[derive(Debug, Clone, Serialize)]
pub struct ResubscribeRecord {
    /// Always `resubscribe`.
    pub event: &'static str,
    /// When the client's first request on its new stream came, RFC 3339 UTC.
    pub time: String,
    /// The node and the type.
    #[serde(flatten)]
    pub subject: Subject,
    /// SotW: the version the client says it runs.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Delta: the first [`NAMES_CAP`] of the resource versions it says it has, `[name,
    /// version]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stated: Vec<(String, String)>,
    /// Delta: how many resource versions it stated.
    pub stated_count: usize,
    /// The first [`NAMES_CAP`] names it asks for (none: every one).
    pub names: Vec<String>,
    /// Process-unique stream id.
    pub stream: u64,
    /// Client address.
    pub downstream: String,
    /// Control plane address.
    pub upstream: String,
}

impl ResubscribeRecord {
    /// The record of a resubscribe event; `None` for other events.
    pub fn from_event(event: &Event) -> Option<ResubscribeRecord> {
        let Event::Resubscribe {
            context,
            version,
            versions,
            names,
        } = event
        else {
            return None;
        };
        Some(ResubscribeRecord {
            event: "resubscribe",
            time: rfc3339(context.time),
            subject: Subject::of(context, &context.type_url),
            version: version.clone(),
            stated: versions.iter().take(NAMES_CAP).cloned().collect(),
            stated_count: versions.len(),
            names: crate::api::names(names),
            stream: context.stream.seq,
            downstream: context.stream.downstream.clone(),
            upstream: context.stream.upstream.clone(),
        })
    }
}
