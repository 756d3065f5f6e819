//! The gRPC messages and services of `proto/`, generated at build time (`build.rs`): the tap's
//! own API (`xdstap.v1.Tap`), which the CLI reads, and the part of CSDS the tap serves. The
//! tap's messages are also the views' reports: the status board and the rollout view build
//! them, `/status` and `/rollouts` serve them as JSON (serde, derived by `build.rs`), and the
//! CLI prints them as they come.

/// Every message and service of `proto/`, as an encoded `FileDescriptorSet`: what gRPC server
/// reflection serves, so `grpcurl` lists and calls the API without the protos at hand.
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

/// `xdstap.v1`: status, rollouts and watch.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("xdstap.v1");
}

mod project;
pub(crate) use project::nack;
pub use project::{names, NAMES_CAP};

/// `envoy.service.status.v3`: the Client Status Discovery Service, the fields the tap fills.
#[allow(clippy::all, missing_docs)]
pub mod csds {
    tonic::include_proto!("envoy.service.status.v3");
}

impl v1::SyncState {
    /// As tables show it.
    pub fn label(self) -> &'static str {
        match self {
            v1::SyncState::Synced => "SYNCED",
            v1::SyncState::NotSent => "NOT SENT",
            v1::SyncState::Pending => "PENDING",
            v1::SyncState::Nacked => "NACKED",
            v1::SyncState::Stale => "STALE",
            v1::SyncState::Unspecified => "?",
        }
    }

    /// NACKED and STALE need someone's attention.
    pub fn is_problem(self) -> bool {
        matches!(self, v1::SyncState::Nacked | v1::SyncState::Stale)
    }

    /// The state a node shows: its worst type's, the greatest in the order the proto declares
    /// them (SYNCED, NOT SENT, PENDING, NACKED, STALE); NOT SENT when it has no type.
    pub fn worst(states: impl Iterator<Item = v1::SyncState>) -> v1::SyncState {
        states.max().unwrap_or(v1::SyncState::NotSent)
    }
}

impl v1::NackGroup {
    /// What NACKs are grouped by, on one tap and over several: the client's message with its
    /// run-to-run noise taken out (Envoy's messages can embed a debug marker,
    /// `goo.gle/debugonly`, `goo.gle/debugproto`, ..., and varying spacing).
    pub fn key(message: &str) -> String {
        message
            .split_whitespace()
            .filter(|w| !w.starts_with("goo.gle/debug"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl v1::rollout_node::Standing {
    /// As tables show it.
    pub fn label(self) -> &'static str {
        use v1::rollout_node::Standing;
        match self {
            Standing::Pending => "pending",
            Standing::Acked => "acked",
            Standing::Nacked => "nacked",
            Standing::Partial => "partial",
            Standing::Superseded => "superseded",
            Standing::Unanswered => "unanswered",
            Standing::Unspecified => "?",
        }
    }

    /// It rejected the version or never answered it: it fails the rollout unless it has
    /// accepted a newer version since.
    pub fn missed(self) -> bool {
        use v1::rollout_node::Standing;
        matches!(
            self,
            Standing::Nacked | Standing::Partial | Standing::Unanswered
        )
    }
}

impl v1::NackScope {
    /// As messages say it.
    pub fn label(self) -> &'static str {
        match self {
            v1::NackScope::Whole => "whole",
            v1::NackScope::Partial => "partial",
            v1::NackScope::Unknown | v1::NackScope::Unspecified => "unknown",
        }
    }
}

impl v1::Origin {
    /// `DestinationRule default/reviews`, with ` section S` when it has one and how the
    /// resource came from it when not directly; words that are not plain names quoted.
    pub fn label(&self) -> String {
        let mut s =
            crate::xds::origin::label(&self.kind, &self.namespace, &self.name, &self.section);
        if !self.via.is_empty() {
            s.push_str(&format!(" (via {})", self.via));
        }
        s
    }

    /// The command that shows it, or why there is none.
    pub fn command(&self) -> &str {
        match self.kubectl.is_empty() {
            false => &self.kubectl,
            true => "no command: a word of it is no Kubernetes name",
        }
    }

    /// The object alone, without where it was found: what objects are grouped by.
    pub fn object_key(&self) -> ObjectKey {
        (
            self.kind.clone(),
            self.group.clone(),
            self.namespace.clone(),
            self.name.clone(),
            self.section.clone(),
            self.via.clone(),
        )
    }
}

/// An object as objects are grouped: kind, group, namespace, name, section, via.
pub type ObjectKey = (String, String, String, String, String, String);

/// The objects behind a NACK on some node now, from the nodes' reports: each object once,
/// with how many nodes reject a resource made from it and since when, most nodes first. The
/// board's report and the CLI's fan-in over several taps compute it alike.
pub fn rejected_objects(nodes: &[v1::NodeStatus]) -> Vec<v1::RejectedObject> {
    let mut by: std::collections::BTreeMap<ObjectKey, v1::RejectedObject> =
        std::collections::BTreeMap::new();
    for n in nodes {
        let mut counted: Vec<ObjectKey> = Vec::new();
        let nacked = (n.types.iter()).filter(|t| t.state() == v1::SyncState::Nacked);
        for (t, nack) in nacked.filter_map(|t| t.nack.as_ref().map(|k| (t, k))) {
            for o in &nack.objects {
                let key = o.object_key();
                // Since the first NACK that named it (a report without that: the node's run).
                let since = match o.since.is_empty() {
                    true => &nack.since,
                    false => &o.since,
                };
                let e = by.entry(key.clone()).or_insert_with(|| v1::RejectedObject {
                    object: Some(v1::Origin {
                        resource: String::new(),
                        part: String::new(),
                        named: false,
                        since: String::new(),
                        ..o.clone()
                    }),
                    since: since.clone(),
                    ..Default::default()
                });
                if !counted.contains(&key) {
                    counted.push(key);
                    e.nodes += 1;
                    if e.examples.len() < 5 {
                        e.examples.push(n.id.clone());
                    }
                }
                if *since < e.since {
                    e.since = since.clone();
                }
                if !e.types.contains(&t.r#type) {
                    e.types.push(t.r#type.clone());
                }
                if !e.resources.contains(&o.resource) && e.resources.len() < NAMES_CAP {
                    e.resources.push(o.resource.clone());
                }
            }
        }
    }
    let mut out: Vec<v1::RejectedObject> = by.into_values().collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.nodes));
    out
}

impl v1::watch_event::Kind {
    /// As lines and flags name it: `ack`, `stale-answer`.
    pub fn label(self) -> &'static str {
        use v1::watch_event::Kind;
        match self {
            Kind::Ack => "ack",
            Kind::Nack => "nack",
            Kind::Superseded => "superseded",
            Kind::Unanswered => "unanswered",
            Kind::Warming => "warming",
            Kind::Resubscribe => "resubscribe",
            Kind::StaleAnswer => "stale-answer",
            Kind::NonceReused => "nonce-reused",
            Kind::UnmatchedAnswer => "unmatched-answer",
            Kind::Unspecified => "?",
        }
    }

    /// The four verdicts on a push.
    pub fn is_verdict(self) -> bool {
        use v1::watch_event::Kind;
        matches!(
            self,
            Kind::Ack | Kind::Nack | Kind::Superseded | Kind::Unanswered
        )
    }
}

/// serde for the enum fields of the tap's messages, which prost keeps as `i32`: written as the
/// value's name in the proto, read from a name or a number (a number of no value is kept).
pub mod names {
    macro_rules! by_name {
        ($($(#[$doc:meta])* $module:ident: $enum:ty;)*) => {$(
            $(#[$doc])*
            pub mod $module {
                /// The value's name (its number when it has none).
                pub fn serialize<S: serde::Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
                    match <$enum>::try_from(*v) {
                        Ok(e) => s.serialize_str(e.as_str_name()),
                        Err(_) => s.serialize_i32(*v),
                    }
                }

                /// A name or a number.
                pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
                    use serde::de::Error;
                    match <Value as serde::Deserialize>::deserialize(d)? {
                        Value::Number(n) => Ok(n),
                        Value::Name(name) => <$enum>::from_str_name(&name)
                            .map(|e| e as i32)
                            .ok_or_else(|| D::Error::custom(format!("unknown value {name:?}"))),
                    }
                }

                /// A repeated field of the enum, each value as one field of it.
                pub mod list {
                    /// The values' names.
                    pub fn serialize<S: serde::Serializer>(
                        v: &[i32],
                        s: S,
                    ) -> Result<S::Ok, S::Error> {
                        use serde::ser::SerializeSeq;
                        let mut seq = s.serialize_seq(Some(v.len()))?;
                        for e in v {
                            seq.serialize_element(&super::Named(*e))?;
                        }
                        seq.end()
                    }

                    /// Names or numbers.
                    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
                        d: D,
                    ) -> Result<Vec<i32>, D::Error> {
                        use serde::de::Error;
                        let values: Vec<super::Value> = serde::Deserialize::deserialize(d)?;
                        (values.into_iter())
                            .map(|v| match v {
                                super::Value::Number(n) => Ok(n),
                                super::Value::Name(name) => <$enum>::from_str_name(&name)
                                    .map(|e| e as i32)
                                    .ok_or_else(|| {
                                        D::Error::custom(format!("unknown value {name:?}"))
                                    }),
                            })
                            .collect()
                    }
                }

                /// One value, written by name.
                struct Named(i32);

                impl serde::Serialize for Named {
                    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                        serialize(&self.0, s)
                    }
                }

                /// A value as JSON may give it.
                #[derive(serde::Deserialize)]
                #[serde(untagged)]
                enum Value {
                    Name(String),
                    Number(i32),
                }
            }
        )*};
    }

    by_name! {
        /// [`SyncState`](crate::api::v1::SyncState).
        sync_state: crate::api::v1::SyncState;
        /// [`ConfigStatus`](crate::api::v1::resource_status::ConfigStatus).
        config: crate::api::v1::resource_status::ConfigStatus;
        /// [`ClientStatus`](crate::api::v1::resource_status::ClientStatus).
        client: crate::api::v1::resource_status::ClientStatus;
        /// [`NackScope`](crate::api::v1::NackScope).
        nack_scope: crate::api::v1::NackScope;
        /// [`Standing`](crate::api::v1::rollout_node::Standing).
        standing: crate::api::v1::rollout_node::Standing;
        /// [`Kind`](crate::api::v1::watch_event::Kind).
        kind: crate::api::v1::watch_event::Kind;
        /// [`Api`](crate::api::v1::watch_event::Api).
        api: crate::api::v1::watch_event::Api;
        /// [`Format`](crate::api::v1::origin::Format).
        format: crate::api::v1::origin::Format;
        /// [`Standing`](crate::api::v1::object_node::Standing).
        object_standing: crate::api::v1::object_node::Standing;
    }
}

#[cfg(test)]
mod tests {
    use super::v1;

    /// The JSON is the proto's: fields by name, enums by value name, read back the same.
    #[test]
    fn reports_read_back_from_their_json() {
        let report = v1::StatusReport {
            generated_at: "t".into(),
            stale_after_seconds: 30.0,
            nodes: vec![v1::NodeStatus {
                id: "n".into(),
                state: v1::SyncState::Nacked as i32,
                types: vec![v1::TypeStatus {
                    r#type: "CDS".into(),
                    state: v1::SyncState::NotSent as i32,
                    version_sent: Some("v2".into()),
                    ..Default::default()
                }],
                resources: vec![v1::ResourceStatus {
                    name: "a".into(),
                    config: v1::resource_status::ConfigStatus::Error as i32,
                    client: v1::resource_status::ClientStatus::DoesNotExist as i32,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            taps: vec![],
            rejected_objects: vec![],
            instance: String::new(),
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["nodes"][0]["state"], "NACKED");
        assert_eq!(json["nodes"][0]["types"][0]["type"], "CDS");
        assert_eq!(json["nodes"][0]["types"][0]["state"], "NOT_SENT");
        assert_eq!(
            json["nodes"][0]["types"][0]["version_accepted"],
            serde_json::Value::Null
        );
        assert_eq!(json["nodes"][0]["resources"][0]["config"], "ERROR");
        assert_eq!(json["nodes"][0]["resources"][0]["client"], "DOES_NOT_EXIST");
        let back: v1::StatusReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
        // Absent fields take their defaults; a number reads as the value it numbers.
        let sparse: v1::NodeStatus = serde_json::from_str(r#"{"id":"x","state":5}"#).unwrap();
        assert_eq!(
            (sparse.state(), sparse.types.len()),
            (v1::SyncState::Stale, 0)
        );
        let bad = serde_json::from_str::<v1::NodeStatus>(r#"{"state":"GREEN"}"#);
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("unknown value \"GREEN\""));
    }

    #[test]
    fn the_worst_state_is_the_greatest() {
        use v1::SyncState as S;
        let all = [S::Synced, S::NotSent, S::Pending, S::Nacked, S::Stale];
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(S::worst([S::Pending, S::Synced].into_iter()), S::Pending);
        assert_eq!(S::worst(std::iter::empty()), S::NotSent);
    }
}
