//! The one projection of the core's verdicts into the API's messages: a NACK as `Nack` (its
//! names capped, its objects as `Origin`s, its times written), the core's enums as the API's.
//! The record, the status board, the rollout view and watch read a verdict through here, so
//! what one shows of a NACK is what the others show; strings are made only when a message is
//! written out.

use super::v1;
use crate::clock::rfc3339;
use crate::correlate::{Push, Scope, Timestamp, Verdict, VerdictKind};
use crate::xds::origin::{Format, Origin};
use crate::xds::Api;

/// How many names a list of the API holds at most (its count, where it has one, is exact).
pub const NAMES_CAP: usize = 50;

/// The first [`NAMES_CAP`] of `all`.
pub fn names<S: AsRef<str>>(all: impl IntoIterator<Item = S>) -> Vec<String> {
    (all.into_iter().take(NAMES_CAP))
        .map(|s| s.as_ref().to_string())
        .collect()
}

/// A NACK as the API shows it (none for another verdict): the client's words, what it
/// rejected and kept, the objects behind it; `since` is when the node's NACKs began, as the
/// one showing it counts them (the verdict's own time for a record).
pub fn nack(push: &Push, verdict: &Verdict, since: Timestamp) -> Option<v1::Nack> {
    let Verdict::Nack {
        error,
        suspects,
        scope,
        rejected,
        applied,
        objects,
        ..
    } = verdict
    else {
        return None;
    };
    let since = rfc3339(since);
    Some(v1::Nack {
        code: error.code,
        message: error.message.clone(),
        suspects: names(suspects),
        version: push.version.clone(),
        scope: v1::NackScope::from(*scope) as i32,
        rejected: names(rejected.iter().map(|r| &r.name)),
        applied: names(applied),
        objects: (objects.iter())
            .map(|o| v1::Origin {
                since: since.clone(),
                ..v1::Origin::from(o)
            })
            .collect(),
        since,
    })
}

impl From<&v1::Nack> for v1::NackGroup {
    /// The group a NACK starts: its words, what it rejected, the objects behind it; no node
    /// counted yet.
    fn from(n: &v1::Nack) -> Self {
        v1::NackGroup {
            message: n.message.clone(),
            nodes: 0,
            examples: Vec::new(),
            suspects: n.suspects.clone(),
            scope: n.scope,
            rejected: n.rejected.clone(),
            applied: n.applied.clone(),
            objects: n.objects.clone(),
        }
    }
}

impl From<Scope> for v1::NackScope {
    fn from(scope: Scope) -> Self {
        match scope {
            Scope::Whole => v1::NackScope::Whole,
            Scope::Partial => v1::NackScope::Partial,
            Scope::Unknown => v1::NackScope::Unknown,
        }
    }
}

impl From<Api> for v1::watch_event::Api {
    fn from(api: Api) -> Self {
        match api {
            Api::Sotw => v1::watch_event::Api::Sotw,
            Api::Delta => v1::watch_event::Api::Delta,
        }
    }
}

impl From<VerdictKind> for v1::watch_event::Kind {
    fn from(kind: VerdictKind) -> Self {
        match kind {
            VerdictKind::Ack => v1::watch_event::Kind::Ack,
            VerdictKind::Nack => v1::watch_event::Kind::Nack,
            VerdictKind::Superseded => v1::watch_event::Kind::Superseded,
            VerdictKind::Unanswered => v1::watch_event::Kind::Unanswered,
        }
    }
}

impl From<&Origin> for v1::Origin {
    fn from(o: &Origin) -> Self {
        v1::Origin {
            kind: o.object.kind.to_string(),
            group: o.object.group.to_string(),
            namespace: o.object.namespace.to_string(),
            name: o.object.name.to_string(),
            section: o.object.section.to_string(),
            format: match o.object.format {
                Format::Istio => v1::origin::Format::Istio,
                Format::EnvoyGateway => v1::origin::Format::EnvoyGateway,
                Format::Contour => v1::origin::Format::Contour,
            } as i32,
            resource: o.resource.clone(),
            part: o.part.clone(),
            named: o.named,
            kubectl: o.object.kubectl().unwrap_or_default(),
            since: String::new(),
            via: o.object.via.to_string(),
        }
    }
}
