//! The correlation core: a pure, synchronous state machine per stream that pairs every push
//! with the request that answers it. Time is passed in; no I/O, no tokio.
//!
//! Per (stream, type_url), SotW:
//! ```text
//!              push N1                   request response_nonce=N1
//!   Idle ──────────────> Pending(N1) ─────────────────────────────> Idle
//!                          │   error_detail unset: Ack (version_info = pushed version)
//!                          │   error_detail set:   Nack (version_info = version kept)
//!                          │ push N2 before an answer: N1 Superseded, Pending(N2);
//!                          │   a later answer naming N1 is a StaleAnswer, never an ACK of N2
//!                          └ stream ends: Unanswered (grpc-status from trailers or reset)
//! ```
//! Delta answers every nonce on its own, so several pushes may be pending and none supersedes
//! another.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::xds::{Api, ErrorDetail, Node, Request, Resources, Response};

/// Nanoseconds since the Unix epoch.
pub type Timestamp = u64;

/// How many recently superseded or answered nonces are remembered per type, to tell a stale
/// answer or a subscription change from an answer to a push we never saw.
const REMEMBERED_NONCES: usize = 16;
/// Delta pushes left unanswered beyond this many per type are given up on (bounded memory).
const MAX_PENDING: usize = 1024;

/// What the tap knows about the stream an event comes from.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct StreamContext {
    /// Process-unique stream id.
    pub stream_id: u64,
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
    /// The resources (names and digests).
    pub resources: Resources,
    /// Names removed (Delta).
    pub removed: Vec<String>,
    /// Message size, bytes.
    pub bytes: u64,
    /// `control_plane.identifier`, when set.
    pub control_plane: Option<String>,
}

/// How a push ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    /// Accepted.
    Ack,
    /// Rejected: the client stays on `client_version`.
    Nack {
        /// `error_detail` as the client sent it.
        error: ErrorDetail,
        /// Resources changed since the last accepted push of this type that the error names,
        /// or, when it names none, every changed resource.
        suspects: Vec<String>,
        /// Resources added, removed or changed since the last accepted push.
        changed: Vec<String>,
    },
    /// A newer push of the same type went out before this one was answered (SotW).
    Superseded {
        /// The newer push's nonce.
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

impl Verdict {
    /// `ack`, `nack`, `superseded`, `unanswered`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Ack => "ack",
            Verdict::Nack { .. } => "nack",
            Verdict::Superseded { .. } => "superseded",
            Verdict::Unanswered { .. } => "unanswered",
        }
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
        at: Context,
        /// Names asked for (empty = wildcard).
        names: Vec<String>,
    },
    /// A first request that states what the client already has: a reconnect.
    Resubscribe {
        /// Where, who, what type.
        #[serde(flatten)]
        at: Context,
        /// SotW: the version the client last accepted.
        version: String,
        /// Delta: `initial_resource_versions`.
        versions: Vec<(String, String)>,
    },
    /// Same nonce answered again with other resource names, or a Delta (un)subscribe.
    SubscriptionChange {
        /// Where, who, what type.
        #[serde(flatten)]
        at: Context,
        /// The names now asked for (SotW), or added (Delta).
        names: Vec<String>,
        /// Names dropped (Delta).
        unsubscribed: Vec<String>,
    },
    /// A push went out.
    Push {
        /// Where, who, what type.
        #[serde(flatten)]
        at: Context,
        /// The push.
        push: Arc<Push>,
    },
    /// A push's fate.
    Verdict {
        /// Where, who, what type.
        #[serde(flatten)]
        at: Context,
        /// The push.
        push: Arc<Push>,
        /// What became of it.
        #[serde(flatten)]
        verdict: Verdict,
        /// When it was decided.
        decided_at: Timestamp,
        /// The version the client said it has (ack/nack).
        client_version: Option<String>,
    },
    /// The stream ended (the context's type is empty).
    StreamEnd {
        /// Where, who.
        #[serde(flatten)]
        at: Context,
        /// grpc-status, when the call ended with one.
        grpc_status: Option<i32>,
        /// How it ended, for humans.
        message: String,
    },
    /// An answer naming an older nonce while a newer push is pending. Never an ACK of the newer.
    StaleAnswer {
        /// Where, who, what type.
        #[serde(flatten)]
        at: Context,
        /// The nonce the answer named.
        nonce: String,
        /// The pending push's nonce.
        pending_nonce: String,
        /// Whether the stale answer was a NACK.
        nack: bool,
    },
}

impl Event {
    /// Where, who, what type.
    pub fn context(&self) -> &Context {
        match self {
            Event::Subscribe { at, .. }
            | Event::Resubscribe { at, .. }
            | Event::SubscriptionChange { at, .. }
            | Event::Push { at, .. }
            | Event::Verdict { at, .. }
            | Event::StaleAnswer { at, .. }
            | Event::StreamEnd { at, .. } => at,
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

#[derive(Default)]
struct TypeState {
    requested: bool,
    names: Vec<String>,
    pending: VecDeque<Arc<Push>>,
    superseded: VecDeque<String>,
    answered: VecDeque<String>,
    /// What the client last accepted, to diff a NACKed push against.
    accepted: Option<Accepted>,
}

/// The last accepted state of one type.
enum Accepted {
    /// SotW: the last accepted push is the whole state; kept by reference, not copied.
    Push(Arc<Push>),
    /// Delta: name -> digest, accumulated over the accepted pushes.
    Digests(HashMap<String, u64>),
}

fn remember(ring: &mut VecDeque<String>, nonce: String) {
    if ring.len() == REMEMBERED_NONCES {
        ring.pop_front();
    }
    ring.push_back(nonce);
}

/// Correlates one stream.
pub struct Correlator {
    stream: Arc<StreamContext>,
    api: Api,
    node: Option<Arc<Node>>,
    types: HashMap<String, TypeState>,
    /// Answers naming a nonce we never saw pushed (the tap started mid-stream, say).
    pub unmatched_answers: u64,
    ended: bool,
}

impl Correlator {
    /// A correlator for a new stream.
    pub fn new(api: Api, stream: StreamContext) -> Self {
        Correlator {
            stream: Arc::new(stream),
            api,
            node: None,
            types: HashMap::new(),
            unmatched_answers: 0,
            ended: false,
        }
    }

    /// The node, once a request carried one.
    pub fn node(&self) -> Option<&Arc<Node>> {
        self.node.as_ref()
    }

    fn context(&self, type_url: &str, time: Timestamp) -> Context {
        Context {
            stream: self.stream.clone(),
            node: self.node.clone(),
            type_url: type_url.into(),
            time,
        }
    }

    /// A request from the client.
    pub fn on_request(&mut self, req: Request, now: Timestamp, out: &mut Vec<Event>) {
        if let Some(node) = req.node {
            if self.node.is_none() || !node.id.is_empty() {
                self.node = Some(Arc::new(node));
            }
        }
        let at = self.context(&req.type_url, now);
        let api = self.api;
        let state = self.types.entry(req.type_url.clone()).or_default();
        let first = !state.requested;
        state.requested = true;

        if req.response_nonce.is_empty() {
            let names_changed = state.names != req.resource_names;
            if first {
                if api == Api::Sotw && !req.version_info.is_empty() {
                    out.push(Event::Resubscribe {
                        at,
                        version: req.version_info,
                        versions: vec![],
                    });
                } else if api == Api::Delta && !req.initial_resource_versions.is_empty() {
                    out.push(Event::Resubscribe {
                        at,
                        version: String::new(),
                        versions: req.initial_resource_versions,
                    });
                } else {
                    out.push(Event::Subscribe {
                        at,
                        names: req.resource_names.clone(),
                    });
                }
            } else if api == Api::Delta || names_changed {
                out.push(Event::SubscriptionChange {
                    at,
                    names: req.resource_names.clone(),
                    unsubscribed: req.unsubscribe,
                });
            }
            if api == Api::Sotw {
                state.names = req.resource_names;
            }
            return;
        }

        let nonce = req.response_nonce;
        if let Some(index) = state.pending.iter().position(|p| p.nonce == nonce) {
            let push = state.pending.remove(index).expect("index from position");
            let (verdict, client_version) = match req.error_detail {
                None => {
                    match (api, &mut state.accepted) {
                        (Api::Sotw, _) => state.accepted = Some(Accepted::Push(push.clone())),
                        (Api::Delta, Some(Accepted::Digests(acc))) => {
                            for n in &push.removed {
                                acc.remove(n);
                            }
                            acc.extend(
                                push.resources
                                    .iter()
                                    .map(|r| (r.name.into_owned(), r.digest)),
                            );
                        }
                        (Api::Delta, _) => {
                            state.accepted = Some(Accepted::Digests(
                                push.resources
                                    .iter()
                                    .map(|r| (r.name.into_owned(), r.digest))
                                    .collect(),
                            ))
                        }
                    }
                    (Verdict::Ack, req.version_info)
                }
                Some(error) => {
                    let (suspects, changed) =
                        blame(api, &push, state.accepted.as_ref(), &error.message);
                    (
                        Verdict::Nack {
                            error,
                            suspects,
                            changed,
                        },
                        req.version_info,
                    )
                }
            };
            remember(&mut state.answered, nonce);
            let names_changed = api == Api::Sotw && state.names != req.resource_names;
            if api == Api::Sotw {
                state.names = req.resource_names.clone();
            }
            let client_version = (api == Api::Sotw).then_some(client_version);
            out.push(Event::Verdict {
                at: at.clone(),
                push,
                verdict,
                decided_at: now,
                client_version,
            });
            if names_changed {
                out.push(Event::SubscriptionChange {
                    at,
                    names: req.resource_names,
                    unsubscribed: vec![],
                });
            } else if api == Api::Delta
                && (!req.resource_names.is_empty() || !req.unsubscribe.is_empty())
            {
                out.push(Event::SubscriptionChange {
                    at,
                    names: req.resource_names,
                    unsubscribed: req.unsubscribe,
                });
            }
        } else if state.superseded.contains(&nonce) {
            let pending_nonce = state
                .pending
                .back()
                .map(|p| p.nonce.clone())
                .unwrap_or_default();
            out.push(Event::StaleAnswer {
                at,
                nonce,
                pending_nonce,
                nack: req.error_detail.is_some(),
            });
            if api == Api::Sotw {
                state.names = req.resource_names;
            }
        } else if state.answered.contains(&nonce) {
            // Already answered: the same nonce again is a subscription change (EDS, RDS) when the
            // names differ, and a harmless repeat otherwise.
            if api == Api::Delta || state.names != req.resource_names {
                out.push(Event::SubscriptionChange {
                    at,
                    names: req.resource_names.clone(),
                    unsubscribed: req.unsubscribe,
                });
            }
            if api == Api::Sotw {
                state.names = req.resource_names;
            }
        } else {
            self.unmatched_answers += 1;
        }
    }

    /// A response from the control plane. Call it before the response is forwarded, so an
    /// answer can never be seen before its push.
    pub fn on_response(&mut self, resp: Response, now: Timestamp, out: &mut Vec<Event>) {
        let at = self.context(&resp.type_url, now);
        let api = self.api;
        let state = self.types.entry(resp.type_url.clone()).or_default();
        let push = Arc::new(Push {
            type_url: resp.type_url,
            version: resp.version_info,
            nonce: resp.nonce,
            at: now,
            resources: {
                let mut r = resp.resources;
                r.shrink_to_fit();
                r
            },
            removed: resp.removed,
            bytes: resp.bytes,
            control_plane: resp.control_plane,
        });
        if api == Api::Sotw {
            while let Some(old) = state.pending.pop_front() {
                remember(&mut state.superseded, old.nonce.clone());
                out.push(Event::Verdict {
                    at: at.clone(),
                    push: old,
                    verdict: Verdict::Superseded {
                        by_nonce: push.nonce.clone(),
                    },
                    decided_at: now,
                    client_version: None,
                });
            }
        } else if state.pending.len() >= MAX_PENDING {
            if let Some(old) = state.pending.pop_front() {
                out.push(Event::Verdict {
                    at: at.clone(),
                    push: old,
                    verdict: Verdict::Unanswered {
                        grpc_status: None,
                        message: format!(
                            "more than {MAX_PENDING} pushes pending; gave up on the oldest"
                        ),
                    },
                    decided_at: now,
                    client_version: None,
                });
            }
        }
        state.pending.push_back(push.clone());
        out.push(Event::Push { at, push });
    }

    /// The stream ended: every pending push is unanswered, then one [`Event::StreamEnd`].
    /// Later calls (the trailers came first, then the stream closed) do nothing.
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
        let mut types: Vec<_> = self.types.keys().cloned().collect();
        types.sort();
        for type_url in types {
            let at = self.context(&type_url, now);
            let state = self.types.get_mut(&type_url).expect("key from the map");
            for push in state.pending.drain(..) {
                out.push(Event::Verdict {
                    at: at.clone(),
                    push,
                    verdict: Verdict::Unanswered {
                        grpc_status,
                        message: message.into(),
                    },
                    decided_at: now,
                    client_version: None,
                });
            }
        }
        out.push(Event::StreamEnd {
            at: self.context("", now),
            grpc_status,
            message: message.into(),
        });
    }
}

/// NACK blame: what changed since the last accepted state, and which of those the error names.
/// Runs only on a NACK; linear in the resources of both states.
fn blame(
    api: Api,
    push: &Push,
    accepted: Option<&Accepted>,
    message: &str,
) -> (Vec<String>, Vec<String>) {
    let old: Option<HashMap<Cow<str>, u64>> = accepted.map(|a| match a {
        Accepted::Push(p) => p.resources.iter().map(|r| (r.name, r.digest)).collect(),
        Accepted::Digests(m) => m.iter().map(|(k, v)| (Cow::from(k), *v)).collect(),
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
                let now: std::collections::HashSet<Cow<str>> =
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
    let mut named: Vec<String> = push
        .resources
        .iter()
        .map(|r| r.name)
        .chain(push.removed.iter().map(Cow::from))
        .filter(|n| mentions(message, n))
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

/// Whether `message` mentions `name` as a whole word (so cluster `a` is not found in "value").
pub fn mentions(message: &str, name: &str) -> bool {
    if name.is_empty() {
        return false;
    }
    let word = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '|' | '~' | '/');
    let mut start = 0;
    while let Some(i) = message[start..].find(name) {
        let at = start + i;
        let before = message[..at].chars().next_back();
        let after = message[at + name.len()..].chars().next();
        let boundary_after = match after {
            None => true,
            // A trailing '.' ends a sentence, it does not extend the name.
            Some('.') => message[at + name.len() + 1..]
                .chars()
                .next()
                .is_none_or(|c| !word(c)),
            Some(c) => !word(c),
        };
        if before.is_none_or(|c| !word(c)) && boundary_after {
            return true;
        }
        start = at + name.len().max(1);
    }
    false
}

#[cfg(test)]
mod tests;
