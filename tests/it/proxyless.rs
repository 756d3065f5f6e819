//! A real proxyless gRPC client (PyPI's grpcio 1.85, C-core, installed into `.grpc/` by the test
//! command) through the tap, SotW ADS: its channel to `xds:///svc` subscribes to the listener,
//! the clusters c1 and c2 its route splits between, and their endpoints. A push that changes c1
//! and makes c2 STATIC (a discovery type gRPC does not take) is NACKed in C-core's own words
//! naming c2 by its index; gRPC uses the valid c1 all the same (gRFC A46). The tap's view, per
//! resource (CSDS through envoy-types' client), equals the client's own CSDS.

use crate::support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::control_plane::ControlPlane;
use support::csds;
use support::grpc::api_listener;
use support::resources::{cluster, endpoints, static_cluster, Snapshot, CDS, EDS, LDS};
use support::tap::{TapOptions, XdsTap};

const NODE: &str = "grpc-client";

/// (type, name) -> (version, client status) of the CDS resources in a CSDS answer for `node`
/// (the client's own CSDS answers for itself alone).
fn clusters(
    r: &envoy_types::pb::envoy::service::status::v3::ClientStatusResponse,
    node: Option<&str>,
) -> BTreeMap<String, (String, String)> {
    let c = match node {
        Some(id) => csds::node(r, id),
        None => &r.config[0],
    };
    (csds::resources(c).into_iter())
        .filter(|((t, _), _)| t == "CDS")
        .map(|((_, name), (version, _, status, _))| {
            (name, (version, status.as_str_name().to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxyless_clients_own_csds_equals_the_taps_view() {
    let snapshot = |v: &str, c1_ms: i64, c2_static: bool| {
        let c2 = match c2_static {
            true => ("c2".to_string(), static_cluster("c2", 1000, 9)),
            false => cluster("c2", 1000),
        };
        Snapshot::new(v)
            .with(LDS, api_listener())
            .with(CDS, cluster("c1", c1_ms))
            .with(CDS, c2)
            .with(EDS, endpoints("c1", 9))
            .with(EDS, endpoints("c2", 9))
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(snapshot("1", 1000, false));
    let _server = cp.serve(listener);
    let tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let dir = support::TempDir::new("proxyless");
    let client = support::grpc::start(dir.path(), &tap.tap.addr, NODE, Stdio::inherit(), &[]);
    let answer = |version: &'static str| {
        let cp = cp.clone();
        async move {
            support::eventually(30, &format!("the client's answer to CDS {version}"), || {
                let sent = cp.sent();
                let push = (sent.iter())
                    .rev()
                    .find(|s| s.type_url == CDS && s.version == version)?;
                cp.answer_to(&push.nonce)
            })
            .await
        }
    };
    assert_eq!(answer("1").await.error, None, "gRPC takes v1");

    cp.set(snapshot("2", 2000, true));
    let nack = answer("2").await;
    let (_, message) = nack.error.expect("gRPC rejects c2");
    assert!(
        message.contains("resource index 1: c2: INVALID_ARGUMENT"),
        "C-core's own words: {message}"
    );

    // Both views settle: the client's own CSDS and the tap's, resource by resource.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (own, seen) = loop {
        let own = clusters(&csds::fetch(&client.csds).await, None);
        let seen = clusters(&csds::fetch(&tap.admin).await, Some(NODE));
        let wanted: BTreeMap<String, (String, String)> = [
            ("c1".to_string(), ("2".to_string(), "ACKED".to_string())),
            ("c2".to_string(), ("1".to_string(), "NACKED".to_string())),
        ]
        .into();
        if own == wanted && seen == own {
            break (own, seen);
        }
        assert!(
            Instant::now() < deadline,
            "the client's CSDS {own:?} and the tap's {seen:?} never both said {wanted:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(own, seen);
    let (_, body) = support::http_get(&tap.admin, &format!("/status?node={NODE}")).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cds = (v["nodes"][0]["types"].as_array().unwrap().iter())
        .find(|t| t["type"] == "CDS")
        .unwrap();
    assert_eq!(cds["nack"]["scope"], "PARTIAL", "{cds}");
    assert_eq!(cds["nack"]["rejected"], serde_json::json!(["c2"]), "{cds}");
    assert_eq!(cds["nack"]["applied"], serde_json::json!(["c1"]), "{cds}");
    drop(client);
    tap.close().await;
}
