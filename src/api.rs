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
pub mod tap {
    tonic::include_proto!("xdstap.v1");
}

/// `envoy.service.status.v3`: the Client Status Discovery Service, the fields the tap fills.
#[allow(clippy::all, missing_docs)]
pub mod csds {
    tonic::include_proto!("envoy.service.status.v3");
}

impl tap::SyncState {
    /// As tables show it.
    pub fn label(self) -> &'static str {
        match self {
            tap::SyncState::Synced => "SYNCED",
            tap::SyncState::NotSent => "NOT SENT",
            tap::SyncState::Pending => "PENDING",
            tap::SyncState::Nacked => "NACKED",
            tap::SyncState::Stale => "STALE",
            tap::SyncState::Unspecified => "?",
        }
    }

    /// NACKED and STALE need someone's attention.
    pub fn is_problem(self) -> bool {
        matches!(self, tap::SyncState::Nacked | tap::SyncState::Stale)
    }

    /// The state a node shows: its worst type's, the greatest in the order the proto declares
    /// them (SYNCED, NOT SENT, PENDING, NACKED, STALE); NOT SENT when it has no type.
    pub fn worst(states: impl Iterator<Item = tap::SyncState>) -> tap::SyncState {
        states.max().unwrap_or(tap::SyncState::NotSent)
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
                    #[derive(serde::Deserialize)]
                    #[serde(untagged)]
                    enum Value {
                        Name(String),
                        Number(i32),
                    }
                    match <Value as serde::Deserialize>::deserialize(d)? {
                        Value::Number(n) => Ok(n),
                        Value::Name(name) => <$enum>::from_str_name(&name)
                            .map(|e| e as i32)
                            .ok_or_else(|| D::Error::custom(format!("unknown value {name:?}"))),
                    }
                }
            }
        )*};
    }

    by_name! {
        /// [`SyncState`](super::tap::SyncState).
        sync_state: super::super::tap::SyncState;
        /// [`ConfigStatus`](super::tap::resource_status::ConfigStatus).
        config: super::super::tap::resource_status::ConfigStatus;
        /// [`ClientStatus`](super::tap::resource_status::ClientStatus).
        client: super::super::tap::resource_status::ClientStatus;
    }
}

#[cfg(test)]
mod tests {
    use super::tap;

    /// The JSON is the proto's: fields by name, enums by value name, read back the same.
    #[test]
    fn reports_read_back_from_their_json() {
        let report = tap::StatusReport {
            generated_at: "t".into(),
            stale_after_seconds: 30.0,
            nodes: vec![tap::NodeStatus {
                id: "n".into(),
                state: tap::SyncState::Nacked as i32,
                types: vec![tap::TypeStatus {
                    r#type: "CDS".into(),
                    state: tap::SyncState::NotSent as i32,
                    version_sent: Some("v2".into()),
                    ..Default::default()
                }],
                resources: vec![tap::ResourceStatus {
                    name: "a".into(),
                    config: tap::resource_status::ConfigStatus::Error as i32,
                    client: tap::resource_status::ClientStatus::DoesNotExist as i32,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            taps: vec![],
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
        let back: tap::StatusReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
        // Absent fields take their defaults; a number reads as the value it numbers.
        let sparse: tap::NodeStatus = serde_json::from_str(r#"{"id":"x","state":5}"#).unwrap();
        assert_eq!(
            (sparse.state(), sparse.types.len()),
            (tap::SyncState::Stale, 0)
        );
        let bad = serde_json::from_str::<tap::NodeStatus>(r#"{"state":"GREEN"}"#);
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("unknown value \"GREEN\""));
    }

    #[test]
    fn the_worst_state_is_the_greatest() {
        use tap::SyncState as S;
        let all = [S::Synced, S::NotSent, S::Pending, S::Nacked, S::Stale];
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(S::worst([S::Pending, S::Synced].into_iter()), S::Pending);
        assert_eq!(S::worst(std::iter::empty()), S::NotSent);
    }
}
