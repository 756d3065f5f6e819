//! The views' reports as API messages and back: the server sends what `/status` and
//! `/rollouts` show, the CLI turns it back into the same reports (so `-o json` prints what the
//! HTTP endpoints print). Field by field, both ways, tested as a round trip.

use super::tap;
use crate::sinks::board::{
    NackInfo, NodeStatus, ResourceErrorInfo, StatusReport, SyncState, TypeStatus,
};
use crate::sinks::rollout::{Latency, NackSummary, NodeStanding, RolloutReport, RolloutStatus};

impl From<SyncState> for tap::SyncState {
    fn from(s: SyncState) -> Self {
        match s {
            SyncState::Synced => tap::SyncState::Synced,
            SyncState::Pending => tap::SyncState::Pending,
            SyncState::NotSent => tap::SyncState::NotSent,
            SyncState::Nacked => tap::SyncState::Nacked,
            SyncState::Stale => tap::SyncState::Stale,
        }
    }
}

fn state_from(s: i32) -> SyncState {
    match tap::SyncState::try_from(s) {
        Ok(tap::SyncState::Synced) => SyncState::Synced,
        Ok(tap::SyncState::Pending) => SyncState::Pending,
        Ok(tap::SyncState::Nacked) => SyncState::Nacked,
        Ok(tap::SyncState::Stale) => SyncState::Stale,
        _ => SyncState::NotSent,
    }
}

impl From<StatusReport> for tap::StatusReport {
    fn from(r: StatusReport) -> Self {
        tap::StatusReport {
            generated_at: r.generated_at,
            stale_after_seconds: r.stale_after_seconds,
            nodes: r.nodes.into_iter().map(node_to).collect(),
        }
    }
}

impl From<tap::StatusReport> for StatusReport {
    fn from(r: tap::StatusReport) -> Self {
        StatusReport {
            generated_at: r.generated_at,
            stale_after_seconds: r.stale_after_seconds,
            nodes: r.nodes.into_iter().map(node_from).collect(),
        }
    }
}

fn node_to(n: NodeStatus) -> tap::NodeStatus {
    tap::NodeStatus {
        id: n.id,
        cluster: n.cluster,
        user_agent: n.user_agent,
        state: tap::SyncState::from(n.state) as i32,
        connected: n.connected,
        streams: n.streams as u32,
        last_seen: n.last_seen,
        disconnected_at: n.disconnected_at,
        types: n.types.into_iter().map(type_to).collect(),
    }
}

fn node_from(n: tap::NodeStatus) -> NodeStatus {
    NodeStatus {
        id: n.id,
        cluster: n.cluster,
        user_agent: n.user_agent,
        state: state_from(n.state),
        connected: n.connected,
        streams: n.streams as usize,
        last_seen: n.last_seen,
        disconnected_at: n.disconnected_at,
        types: n.types.into_iter().map(type_from).collect(),
        // Over gRPC, resources come from CSDS.
        resources: Vec::new(),
    }
}

fn type_to(t: TypeStatus) -> tap::TypeStatus {
    tap::TypeStatus {
        r#type: t.short_type,
        type_url: t.type_url,
        state: tap::SyncState::from(t.state) as i32,
        version_sent: t.version_sent,
        version_accepted: t.version_accepted,
        nonce: t.nonce,
        last_push_at: t.last_push_at,
        pending_since: t.pending_since,
        latency_ms: t.latency_ms,
        pushes: t.pushes,
        acks: t.acks,
        nacks: t.nacks,
        superseded: t.superseded,
        unanswered: t.unanswered,
        nonce_reuses: t.nonce_reuses,
        rejected_resends: t.rejected_resends,
        heartbeats: t.heartbeats,
        resource_errors: (t.resource_errors.into_iter())
            .map(|e| tap::ResourceError {
                name: e.name,
                code: e.code,
                message: e.message,
                since: e.since,
            })
            .collect(),
        nack: t.nack.map(|n| tap::Nack {
            code: n.code,
            message: n.message,
            suspects: n.suspects,
            version: n.version,
            since: n.since,
            scope: n.scope,
            rejected: n.rejected,
            applied: n.applied,
        }),
        subscribed: t.subscribed,
        state_since: t.state_since,
        state_seconds: t.state_seconds,
        last_message_at: t.last_message_at,
        waiting_for: t.waiting_for,
    }
}

fn type_from(t: tap::TypeStatus) -> TypeStatus {
    TypeStatus {
        state: state_from(t.state),
        short_type: t.r#type,
        type_url: t.type_url,
        version_sent: t.version_sent,
        version_accepted: t.version_accepted,
        nonce: t.nonce,
        last_push_at: t.last_push_at,
        pending_since: t.pending_since,
        latency_ms: t.latency_ms,
        pushes: t.pushes,
        acks: t.acks,
        nacks: t.nacks,
        superseded: t.superseded,
        unanswered: t.unanswered,
        nonce_reuses: t.nonce_reuses,
        rejected_resends: t.rejected_resends,
        heartbeats: t.heartbeats,
        resource_errors: (t.resource_errors.into_iter())
            .map(|e| ResourceErrorInfo {
                name: e.name,
                code: e.code,
                message: e.message,
                since: e.since,
            })
            .collect(),
        nack: t.nack.map(|n| NackInfo {
            code: n.code,
            message: n.message,
            suspects: n.suspects,
            version: n.version,
            since: n.since,
            scope: n.scope,
            rejected: n.rejected,
            applied: n.applied,
        }),
        subscribed: t.subscribed,
        state_since: t.state_since,
        state_seconds: t.state_seconds,
        last_message_at: t.last_message_at,
        waiting_for: t.waiting_for,
    }
}

impl From<RolloutReport> for tap::RolloutReport {
    fn from(r: RolloutReport) -> Self {
        tap::RolloutReport {
            generated_at: r.generated_at,
            rollouts: r.rollouts.into_iter().map(rollout_to).collect(),
        }
    }
}

impl From<tap::RolloutReport> for RolloutReport {
    fn from(r: tap::RolloutReport) -> Self {
        RolloutReport {
            generated_at: r.generated_at,
            rollouts: r.rollouts.into_iter().map(rollout_from).collect(),
        }
    }
}

fn rollout_to(r: RolloutStatus) -> tap::Rollout {
    tap::Rollout {
        r#type: r.short_type,
        type_url: r.type_url,
        version: r.version,
        first_push: r.first_push,
        last_push: r.last_push,
        last_answer: r.last_answer,
        pushed: r.pushed,
        acked: r.acked,
        nacked: r.nacked,
        partial: r.partial,
        superseded: r.superseded,
        unanswered: r.unanswered,
        pending: r.pending,
        latency_p50_ms: r.latency_ms.p50,
        latency_p90_ms: r.latency_ms.p90,
        latency_max_ms: r.latency_ms.max,
        behind: (r.behind.into_iter())
            .map(|n| tap::RolloutNode {
                node: n.node,
                state: n.state,
                running: n.running,
                pushed_at: n.pushed_at,
                waiting_seconds: n.waiting_seconds,
                waiting_for: n.waiting_for,
            })
            .collect(),
        acked_nodes: r.acked_nodes,
        nacks: (r.nacks.into_iter())
            .map(|g| tap::NackGroup {
                message: g.message,
                nodes: g.nodes,
                examples: g.examples,
                suspects: g.suspects,
                scope: g.scope,
                rejected: g.rejected,
                applied: g.applied,
            })
            .collect(),
        since_last_push_seconds: r.since_last_push_seconds,
    }
}

fn rollout_from(r: tap::Rollout) -> RolloutStatus {
    RolloutStatus {
        short_type: r.r#type,
        type_url: r.type_url,
        version: r.version,
        first_push: r.first_push,
        last_push: r.last_push,
        since_last_push_seconds: r.since_last_push_seconds,
        last_answer: r.last_answer,
        pushed: r.pushed,
        acked: r.acked,
        nacked: r.nacked,
        partial: r.partial,
        superseded: r.superseded,
        unanswered: r.unanswered,
        pending: r.pending,
        latency_ms: Latency {
            p50: r.latency_p50_ms,
            p90: r.latency_p90_ms,
            max: r.latency_max_ms,
        },
        behind: (r.behind.into_iter())
            .map(|n| NodeStanding {
                node: n.node,
                state: n.state,
                running: n.running,
                pushed_at: n.pushed_at,
                waiting_seconds: n.waiting_seconds,
                waiting_for: n.waiting_for,
            })
            .collect(),
        acked_nodes: r.acked_nodes,
        nacks: (r.nacks.into_iter())
            .map(|g| NackSummary {
                message: g.message,
                nodes: g.nodes,
                examples: g.examples,
                suspects: g.suspects,
                scope: g.scope,
                rejected: g.rejected,
                applied: g.applied,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_survives_the_round_trip() {
        let status = StatusReport {
            generated_at: "t".into(),
            stale_after_seconds: 30.0,
            nodes: vec![NodeStatus {
                id: "n".into(),
                cluster: "c".into(),
                user_agent: "envoy 1.40.0".into(),
                state: SyncState::Nacked,
                connected: false,
                streams: 2,
                last_seen: "l".into(),
                disconnected_at: Some("d".into()),
                resources: vec![],
                types: vec![TypeStatus {
                    short_type: "CDS".into(),
                    type_url: "u".into(),
                    state: SyncState::Nacked,
                    version_sent: Some("v2".into()),
                    version_accepted: None,
                    nonce: Some("1".into()),
                    last_push_at: Some("p".into()),
                    pending_since: None,
                    latency_ms: Some(0.0),
                    pushes: 1,
                    acks: 2,
                    nacks: 3,
                    superseded: 4,
                    unanswered: 5,
                    nonce_reuses: 6,
                    rejected_resends: 5,
                    heartbeats: 7,
                    resource_errors: vec![ResourceErrorInfo {
                        name: "x".into(),
                        code: 5,
                        message: "gone".into(),
                        since: "s".into(),
                    }],
                    nack: Some(NackInfo {
                        code: 13,
                        message: "m".into(),
                        suspects: vec!["b".into()],
                        version: "v2".into(),
                        since: "s".into(),
                        scope: "partial".into(),
                        rejected: vec!["b".into()],
                        applied: vec!["a".into()],
                    }),
                    subscribed: true,
                    state_since: Some("s".into()),
                    state_seconds: 1.5,
                    last_message_at: Some("m".into()),
                    waiting_for: vec!["w".into()],
                }],
            }],
        };
        let back = StatusReport::from(tap::StatusReport::from(status.clone()));
        assert_eq!(back, status);
    }

    #[test]
    fn rollouts_survive_the_round_trip() {
        let rollouts = RolloutReport {
            generated_at: "t".into(),
            rollouts: vec![RolloutStatus {
                short_type: "CDS".into(),
                type_url: "u".into(),
                version: "v".into(),
                first_push: "f".into(),
                last_push: "l".into(),
                since_last_push_seconds: 2.0,
                last_answer: None,
                pushed: 9,
                acked: 1,
                nacked: 2,
                partial: 1,
                superseded: 3,
                unanswered: 1,
                pending: 2,
                latency_ms: Latency {
                    p50: 1.0,
                    p90: 2.0,
                    max: 3.0,
                },
                behind: vec![NodeStanding {
                    node: "n".into(),
                    state: "pending".into(),
                    running: Some("v0".into()),
                    pushed_at: "p".into(),
                    waiting_seconds: 4.0,
                    waiting_for: vec!["w".into()],
                }],
                acked_nodes: vec!["a".into()],
                nacks: vec![NackSummary {
                    message: "m".into(),
                    nodes: 2,
                    examples: vec!["b".into()],
                    suspects: vec!["x".into()],
                    scope: "partial".into(),
                    rejected: vec!["x".into()],
                    applied: vec!["y".into()],
                }],
            }],
        };
        let back = RolloutReport::from(tap::RolloutReport::from(rollouts.clone()));
        assert_eq!(back, rollouts);
    }
}
