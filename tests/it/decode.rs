//! The streaming decoder on real xDS messages encoded by envoy-types/prost: every field we
//! need, any split into pieces, Resource wrappers in SotW, Delta maps, gzip, and bad input.

use crate::support;

use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::envoy::config::core::v3::{BuildVersion, Node};
use envoy_types::pb::envoy::r#type::v3::SemanticVersion;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::rpc::Status;
use prost::Message as _;
use support::resources::{self, CDS};
use xdstap::xds::decode::{DecodeError, MessageDecoder};
use xdstap::xds::scan::{MessageKind, Scanner};
use xdstap::xds::{Api, Interner, Message};

fn scan_split(kind: MessageKind, bytes: &[u8], cut: usize) -> Message {
    let mut s = Scanner::new(kind, Some(bytes.len() as u64));
    let (a, b) = bytes.split_at(cut);
    s.feed(a);
    s.feed(b);
    s.finish().unwrap()
}

fn sotw_response() -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: "2026-11-29T12:00:00Z/42".into(),
        resources: vec![
            resources::cluster("outbound|80||reviews.default.svc.cluster.local", 1000).1,
            resources::cluster("b", 0).1,
        ],
        type_url: CDS.into(),
        nonce: "nonce-7f3a".into(),
        ..Default::default()
    }
}

#[test]
fn sotw_response_at_every_split() {
    let bytes = sotw_response().encode_to_vec();
    let whole = scan_split(MessageKind::Response(Api::Sotw), &bytes, 0);
    let Message::Response(r) = &whole else {
        panic!()
    };
    assert_eq!(r.version_info, "2026-11-29T12:00:00Z/42");
    assert_eq!(r.nonce, "nonce-7f3a");
    assert_eq!(r.type_url, CDS);
    let names: Vec<String> = r.resources.iter().map(|r| r.name.into_owned()).collect();
    assert_eq!(
        names,
        ["outbound|80||reviews.default.svc.cluster.local", "b"]
    );
    // The digest is of the resource's own bytes.
    let value = &sotw_response().resources[1].value;
    assert_eq!(
        r.resources.get(1).unwrap().digest,
        xxhash_rust::xxh3::xxh3_64(value)
    );
    for cut in 0..=bytes.len() {
        assert_eq!(
            scan_split(MessageKind::Response(Api::Sotw), &bytes, cut),
            whole,
            "cut at {cut}"
        );
    }
    // Pieces of every size from one byte up: digests streamed over many pieces agree too.
    for size in 1..64 {
        let mut s = Scanner::new(MessageKind::Response(Api::Sotw), Some(bytes.len() as u64));
        for piece in bytes.chunks(size) {
            s.feed(piece);
        }
        assert_eq!(s.finish().unwrap(), whole, "pieces of {size}");
    }
}

#[test]
fn sotw_request_with_node_and_error_detail() {
    let req = DiscoveryRequest {
        version_info: "v1".into(),
        node: Some(Node {
            id: "sidecar~10.1.2.3~p.ns~ns.svc.cluster.local".into(),
            cluster: "reviews".into(),
            user_agent_name: "envoy".into(),
            // What Envoy sends: its version as a BuildVersion, not a string.
            user_agent_version_type: Some(UserAgentVersionType::UserAgentBuildVersion(
                BuildVersion {
                    version: Some(SemanticVersion {
                        major_number: 1,
                        minor_number: 40,
                        patch: 0,
                    }),
                    metadata: None,
                },
            )),
            ..Default::default()
        }),
        resource_names: vec!["a".into(), "b".into()],
        type_url: CDS.into(),
        response_nonce: "n2".into(),
        error_detail: Some(Status {
            code: 13,
            message: "Error adding/updating cluster(s) b: bad".into(),
            details: vec![],
        }),
        ..Default::default()
    };
    let bytes = req.encode_to_vec();
    for cut in 0..=bytes.len() {
        let Message::Request(r) = scan_split(MessageKind::Request(Api::Sotw), &bytes, cut) else {
            panic!()
        };
        assert_eq!(r.version_info, "v1");
        assert_eq!(r.response_nonce, "n2");
        assert_eq!(r.resource_names, ["a", "b"]);
        let node = r.node.unwrap();
        assert_eq!(
            (
                node.id.as_str(),
                node.cluster.as_str(),
                node.user_agent.as_str()
            ),
            (
                "sidecar~10.1.2.3~p.ns~ns.svc.cluster.local",
                "reviews",
                "envoy 1.40.0"
            )
        );
        let e = r.error_detail.unwrap();
        assert_eq!(
            (e.code, e.message.as_str()),
            (13, "Error adding/updating cluster(s) b: bad")
        );
    }
}

#[test]
fn resource_wrappers_in_sotw_and_delta() {
    let (_, any) = resources::cluster("wrapped", 1000);
    let wrapper = Resource {
        name: "wrapped".into(),
        version: "r7".into(),
        resource: Some(any.clone()),
        ..Default::default()
    };
    let sotw = DiscoveryResponse {
        version_info: "v".into(),
        resources: vec![resources::any(&wrapper)],
        type_url: CDS.into(),
        nonce: "n".into(),
        ..Default::default()
    };
    let Message::Response(r) =
        scan_split(MessageKind::Response(Api::Sotw), &sotw.encode_to_vec(), 3)
    else {
        panic!()
    };
    assert_eq!(r.resources.len(), 1);
    assert_eq!(r.resources.get(0).unwrap().name, "wrapped");
    assert_eq!(r.resources.get(0).unwrap().version, Some("r7"));
    assert_eq!(
        r.resources.get(0).unwrap().digest,
        xxhash_rust::xxh3::xxh3_64(&any.value)
    );

    let delta = DeltaDiscoveryResponse {
        system_version_info: "2026-11-29/3".into(),
        resources: vec![wrapper],
        type_url: CDS.into(),
        nonce: "d1".into(),
        removed_resources: vec!["gone".into()],
        ..Default::default()
    };
    let Message::Response(r) = scan_split(
        MessageKind::Response(Api::Delta),
        &delta.encode_to_vec(),
        10,
    ) else {
        panic!()
    };
    assert_eq!(
        (r.version_info.as_str(), r.nonce.as_str()),
        ("2026-11-29/3", "d1")
    );
    assert_eq!(r.resources.get(0).unwrap().name, "wrapped");
    assert_eq!(r.removed, ["gone"]);

    let dreq = DeltaDiscoveryRequest {
        type_url: CDS.into(),
        resource_names_subscribe: vec!["x".into()],
        resource_names_unsubscribe: vec!["y".into()],
        initial_resource_versions: [("a".to_string(), "1".to_string())].into_iter().collect(),
        response_nonce: "d1".into(),
        ..Default::default()
    };
    let Message::Request(r) =
        scan_split(MessageKind::Request(Api::Delta), &dreq.encode_to_vec(), 5)
    else {
        panic!()
    };
    assert_eq!(r.resource_names, ["x"]);
    assert_eq!(r.unsubscribe, ["y"]);
    assert_eq!(
        r.initial_resource_versions,
        [("a".to_string(), "1".to_string())]
    );
    assert_eq!(r.response_nonce, "d1");
}

#[test]
fn gzip_limit_and_bad_input() {
    use std::io::Write;
    let bytes = sotw_response().encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&bytes).unwrap();
    let gz = gz.finish().unwrap();
    let mut d = MessageDecoder::new(
        MessageKind::Response(Api::Sotw),
        gz.len() as u32,
        true,
        Some("gzip"),
        1 << 20,
    );
    for piece in gz.chunks(7) {
        d.feed(piece);
    }
    let Message::Response(r) = d.finish().unwrap() else {
        panic!()
    };
    assert_eq!(r.nonce, "nonce-7f3a");

    let d = MessageDecoder::new(
        MessageKind::Response(Api::Sotw),
        10,
        true,
        Some("snappy"),
        1 << 20,
    );
    assert!(matches!(d.finish(), Err(DecodeError::Encoding(_))));

    let mut d = MessageDecoder::new(
        MessageKind::Response(Api::Sotw),
        bytes.len() as u32,
        false,
        None,
        16,
    );
    d.feed(&bytes);
    assert!(matches!(d.finish(), Err(DecodeError::TooLarge { .. })));

    let mut d = MessageDecoder::new(MessageKind::Response(Api::Sotw), 4, false, None, 1 << 20);
    d.feed(&[0x0f, 0xff, 0xff, 0xff]); // wire type 7
    assert!(matches!(d.finish(), Err(DecodeError::Protobuf(_))));

    // A length running past the message.
    let mut d = MessageDecoder::new(MessageKind::Response(Api::Sotw), 3, false, None, 1 << 20);
    d.feed(&[0x0a, 0x7f, 0x41]);
    assert!(d.finish().is_err());
}

#[test]
fn clusters_fed_by_eds_at_every_split() {
    use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
    let named = Cluster {
        name: "outbound|9080||ratings".into(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: None,
            service_name: "ratings-endpoints".into(),
        }),
        ..Default::default()
    };
    let resp = DiscoveryResponse {
        version_info: "v1".into(),
        resources: vec![
            resources::cluster("a", 1000).1,
            resources::static_cluster("s", 1000, 80),
            resources::any(&named),
        ],
        type_url: CDS.into(),
        nonce: "n".into(),
        ..Default::default()
    };
    let bytes = resp.encode_to_vec();
    for cut in 0..=bytes.len() {
        let Message::Response(r) = scan_split(MessageKind::Response(Api::Sotw), &bytes, cut) else {
            panic!()
        };
        let eds: Vec<(String, bool, Option<String>)> = r
            .resources
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let service = r.resources.eds_name(i, &x).map(String::from);
                (x.name.to_string(), x.eds, service)
            })
            .collect();
        assert_eq!(
            eds,
            [
                ("a".into(), true, Some("a".into())),
                ("s".into(), false, None),
                (
                    "outbound|9080||ratings".into(),
                    true,
                    Some("ratings-endpoints".into())
                ),
            ],
            "cut at {cut}"
        );
        // The digest is still of each resource's own bytes, nested config included.
        let digests: Vec<u64> = r.resources.iter().map(|x| x.digest).collect();
        let want: Vec<u64> = resp
            .resources
            .iter()
            .map(|a| xxhash_rust::xxh3::xxh3_64(&a.value))
            .collect();
        assert_eq!(digests, want, "cut at {cut}");
    }
}

/// `resource_errors` (SotW 7, Delta 9): each resource's name and the control plane's
/// `error_detail`, at every split, in both APIs.
#[test]
fn resource_errors_in_both_apis() {
    use envoy_types::pb::envoy::service::discovery::v3::{ResourceError, ResourceName};
    let errors = vec![
        ResourceError {
            resource_name: Some(ResourceName {
                name: "x".into(),
                ..Default::default()
            }),
            error_detail: Some(Status {
                code: 5,
                message: "x is not in the registry".into(),
                details: vec![],
            }),
        },
        ResourceError {
            resource_name: Some(ResourceName {
                name: "y".into(),
                ..Default::default()
            }),
            error_detail: None,
        },
    ];
    let sotw = DiscoveryResponse {
        resource_errors: errors.clone(),
        ..sotw_response()
    }
    .encode_to_vec();
    let delta = DeltaDiscoveryResponse {
        type_url: CDS.into(),
        nonce: "d1".into(),
        resource_errors: errors,
        ..Default::default()
    }
    .encode_to_vec();
    for (api, bytes) in [(Api::Sotw, sotw), (Api::Delta, delta)] {
        for cut in 0..=bytes.len() {
            let Message::Response(r) = scan_split(MessageKind::Response(api), &bytes, cut) else {
                panic!()
            };
            let seen: Vec<(&str, i32, &str)> = (r.resource_errors.iter())
                .map(|(n, e)| (n.as_str(), e.code, e.message.as_str()))
                .collect();
            assert_eq!(
                seen,
                [("x", 5, "x is not in the registry"), ("y", 0, "")],
                "{api:?} cut at {cut}"
            );
        }
    }
}

/// A `Resource` wrapper's `ttl` (field 6) and whether it holds a resource at all (a bare
/// wrapper is a heartbeat), in Delta and in a SotW `Any`, at every split.
#[test]
fn wrapper_ttls_and_heartbeats_in_both_apis() {
    use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
    let cluster = |name: &str| Any {
        type_url: CDS.into(),
        value: envoy_types::pb::envoy::config::cluster::v3::Cluster {
            name: name.into(),
            ..Default::default()
        }
        .encode_to_vec(),
    };
    let wrappers = vec![
        Resource {
            name: "timed".into(),
            version: "1".into(),
            resource: Some(cluster("timed")),
            ttl: Some(PbDuration {
                seconds: 1,
                nanos: 500_000_000,
            }),
            ..Default::default()
        },
        Resource {
            name: "beat".into(),
            version: "1".into(),
            ttl: Some(PbDuration {
                seconds: 2,
                nanos: 0,
            }),
            ..Default::default()
        },
        Resource {
            name: "plain".into(),
            version: "1".into(),
            resource: Some(cluster("plain")),
            ..Default::default()
        },
    ];
    let sotw = DiscoveryResponse {
        resources: (wrappers.iter())
            .map(|w| Any {
                type_url: "type.googleapis.com/envoy.service.discovery.v3.Resource".into(),
                value: w.encode_to_vec(),
            })
            .collect(),
        ..sotw_response()
    }
    .encode_to_vec();
    let delta = DeltaDiscoveryResponse {
        type_url: CDS.into(),
        nonce: "d1".into(),
        resources: wrappers,
        ..Default::default()
    }
    .encode_to_vec();
    for (api, bytes) in [(Api::Sotw, sotw), (Api::Delta, delta)] {
        for cut in 0..=bytes.len() {
            let Message::Response(r) = scan_split(MessageKind::Response(api), &bytes, cut) else {
                panic!()
            };
            let seen: Vec<(String, Option<u32>, bool)> = (r.resources.iter())
                .map(|x| (x.name.to_string(), x.ttl_ms, x.bare))
                .collect();
            let want = [
                ("timed".to_string(), Some(1500), false),
                ("beat".to_string(), Some(2000), true),
                ("plain".to_string(), None, false),
            ];
            assert_eq!(seen, want, "{api:?} cut at {cut}");
            assert_eq!(r.resources.get(1).map(|x| x.bare), Some(true));
            assert!(!r.resources.all_bare() && r.resources.has_ttl());
        }
    }
}

/// A listener's needs (the RDS name of its HTTP connection manager, the SDS name of its TLS
/// context), read at every split, in SotW and in a Delta wrapper; digests stay those of each
/// listener's own bytes.
#[test]
fn listener_needs_at_every_split() {
    use xdstap::xds::Needs;
    let listeners = [
        resources::listener("http", "routes-1"),
        resources::tls_listener("tls", "cert-1", "a"),
        resources::route("not-a-listener", "a"),
    ];
    let sotw = DiscoveryResponse {
        version_info: "1".into(),
        type_url: resources::LDS.into(),
        nonce: "n".into(),
        resources: listeners.iter().take(2).map(|(_, a)| a.clone()).collect(),
        ..Default::default()
    };
    let delta = DeltaDiscoveryResponse {
        type_url: resources::LDS.into(),
        nonce: "d".into(),
        resources: (listeners.iter().take(2))
            .map(|(n, a)| Resource {
                name: n.clone(),
                version: "1".into(),
                resource: Some(a.clone()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let want_digests: Vec<u64> = (listeners.iter().take(2))
        .map(|(_, a)| xxhash_rust::xxh3::xxh3_64(&a.value))
        .collect();
    for (api, bytes) in [
        (Api::Sotw, sotw.encode_to_vec()),
        (Api::Delta, delta.encode_to_vec()),
    ] {
        for cut in 0..=bytes.len() {
            let Message::Response(r) = scan_split(MessageKind::Response(api), &bytes, cut) else {
                panic!()
            };
            let needs: Vec<Vec<(Needs, String)>> = (0..r.resources.len())
                .map(|i| {
                    (r.resources.needs_of(i))
                        .map(|(k, n)| (k, n.to_string()))
                        .collect()
                })
                .collect();
            assert_eq!(
                needs,
                [
                    vec![(Needs::Routes, "routes-1".to_string())],
                    vec![(Needs::Secret, "cert-1".to_string())]
                ],
                "{api:?} cut at {cut}"
            );
            let digests: Vec<u64> = r.resources.iter().map(|x| x.digest).collect();
            assert_eq!(digests, want_digests, "{api:?} cut at {cut}");
        }
    }
    // A route configuration names nothing a listener needs.
    let routes = DiscoveryResponse {
        type_url: resources::RDS.into(),
        resources: vec![listeners[2].1.clone()],
        ..Default::default()
    }
    .encode_to_vec();
    let Message::Response(r) = scan_split(MessageKind::Response(Api::Sotw), &routes, 0) else {
        panic!()
    };
    assert!(!r.resources.has_needs());
}

/// What a push decodes to whole, without any sharing.
fn plain(kind: MessageKind, bytes: &[u8]) -> Message {
    scan_split(kind, bytes, 0)
}

/// `bytes` read by a scanner sharing `interner` (as every stream of a tap does), in pieces of
/// `size` bytes.
fn shared(
    kind: MessageKind,
    bytes: &[u8],
    size: usize,
    interner: &std::sync::Arc<Interner>,
) -> Message {
    let mut s = Scanner::new(kind, Some(bytes.len() as u64));
    s.set_interner(interner.clone());
    for piece in bytes.chunks(size.max(1)) {
        s.feed(piece);
    }
    s.finish()
        .unwrap_or_else(|e| panic!("{kind:?} in pieces of {size}: {e}"))
}

/// A fleet's streams read a push as the first one did: a push recorded by one stream is
/// followed by the next resource by resource (a digest of each one's bytes), and a push that
/// differs from it anywhere (a resource changed, missing or added, a wrapper's TTL, a
/// listener's needs, a cluster fed by EDS under another name) decodes exactly as it would
/// alone, in pieces of every size from one byte up, SotW and Delta.
#[test]
fn a_fleets_streams_read_a_push_as_the_first_one_did() {
    use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
    use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
    let eds = |i: usize| Cluster {
        name: format!("outbound|9080||svc-{i}"),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: None,
            service_name: format!("endpoints-{i}"),
        }),
        ..Default::default()
    };
    let resources = |version: u32, n: usize, changed: Option<usize>| -> Vec<Any> {
        (0..n)
            .map(|i| match i % 4 {
                _ if Some(i) == changed => {
                    resources::cluster(&format!("c{i}"), 2000 + version as i64).1
                }
                0 => resources::any(&eds(i)),
                1 => resources::static_cluster(&format!("s{i}"), 1000, 80),
                2 => resources::listener(&format!("l{i}"), &format!("routes-{i}")).1,
                _ => resources::cluster(&format!("c{i}"), 1000).1,
            })
            .collect()
    };
    let sotw = |res: Vec<Any>| {
        DiscoveryResponse {
            version_info: "v".into(),
            resources: res,
            type_url: CDS.into(),
            nonce: "n".into(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    let delta = |res: Vec<Any>| {
        DeltaDiscoveryResponse {
            type_url: CDS.into(),
            nonce: "d".into(),
            resources: (res.into_iter().enumerate())
                .map(|(i, a)| Resource {
                    name: format!("r{i}"),
                    version: i.to_string(),
                    resource: Some(a),
                    ttl: (i % 5 == 0).then_some(PbDuration {
                        seconds: 3,
                        nanos: 0,
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    const N: usize = 300;
    for (api, encode) in [
        (Api::Sotw, &sotw as &dyn Fn(Vec<Any>) -> Vec<u8>),
        (Api::Delta, &delta),
    ] {
        let kind = MessageKind::Response(api);
        let interner = std::sync::Arc::new(Interner::default());
        let first = encode(resources(1, N, None));
        let want = plain(kind, &first);
        // The first stream records it (DATA frames of 16 KiB, as Envoy and Go servers send).
        assert_eq!(
            shared(kind, &first, 16 << 10, &interner),
            want,
            "{api:?}: the first"
        );
        for size in (1..40).chain([100, 1000, 16 << 10, first.len()]) {
            assert_eq!(
                shared(kind, &first, size, &interner),
                want,
                "{api:?}: again in {size}"
            );
        }
        for other in [
            resources(2, N, Some(150)),
            resources(2, N, Some(0)),
            resources(2, N, Some(N - 1)),
            resources(1, N - 7, None),
            resources(1, N + 9, None),
        ] {
            let bytes = encode(other);
            let want = plain(kind, &bytes);
            for size in [1, 7, 333, 16 << 10] {
                let got = shared(kind, &bytes, size, &interner);
                assert_eq!(got, want, "{api:?}: another push in {size}");
            }
        }
        // What a run shares is the set the first stream made: the same chunks, whole.
        let Message::Response(a) = shared(kind, &first, 16 << 10, &interner) else {
            panic!()
        };
        let Message::Response(b) = shared(kind, &first, 1000, &interner) else {
            panic!()
        };
        assert!(a.resources.same_as(&b.resources));
    }
}
