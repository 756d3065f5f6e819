//! CSDS as the standard tooling reads it: a client built from Envoy's own protos (envoy-types'
//! tonic client) asks the tap for every node's resources, three real Envoys behind it, SotW and
//! Delta, one of them with a cluster it rejects, one with an SDS secret, all asking for endpoints
//! never sent. Each resource has the status the control plane's record says; the secret's
//! private key is in no answer.

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher, NodeMatcher, StringMatcher};
use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
use envoy_types::pb::envoy::service::status::v3::{
    ClientStatusRequest, ClientStatusResponse, ConfigStatus,
};
use prost::Message;
use support::control_plane::ControlPlane;
use support::csds::{node, resources};
use support::envoy::{Envoy, Xds};
use support::resources::{secret, warming_cluster, Snapshot, CDS, EDS, SDS};
use support::tap::{TapOptions, XdsTap};

fn exact(id: &str) -> NodeMatcher {
    NodeMatcher {
        node_id: Some(StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Exact(id.into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csds_client_reads_every_nodes_resources() {
    let dir = support::TempDir::new("csds");
    let pki = support::certs::make(dir.path());
    let cert = std::fs::read_to_string(&pki.server_cert).unwrap();
    let key = std::fs::read_to_string(&pki.server_key).unwrap();
    let canary: String = (key.lines())
        .filter(|l| !l.starts_with("-----"))
        .collect::<String>()[10..50]
        .to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let good = |v: &str| {
        Snapshot::standard(v, 1000, 1000, 9)
            .with(SDS, secret("gateway-cert", &cert, &key))
            // Cluster `w`'s endpoints are never sent.
            .with(CDS, warming_cluster("w", 1000))
    };
    let cp = ControlPlane::new(good("v1"));
    let _server = cp.serve(listener);
    let tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let xds = || Xds::Tcp(tap.tap.addr.clone());
    let _sds = Envoy::start_sds("envoy-sds", xds(), "gateway-cert").await;
    let _delta = Envoy::start("envoy-delta", xds(), true).await;
    let _bad = Envoy::start("envoy-bad", xds(), false).await;
    let mut client = ClientStatusDiscoveryServiceClient::connect(format!("http://{}", tap.admin))
        .await
        .unwrap();
    let fetch = |mut client: ClientStatusDiscoveryServiceClient<_>, r: ClientStatusRequest| async move {
        client.fetch_client_status(r).await.unwrap().into_inner()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let w = || ("EDS".to_string(), "w".to_string());
    let synced = |r: &ClientStatusResponse| {
        r.config.len() == 3
            && r.config.iter().all(|c| {
                let seen = resources(c);
                let id = c.node.as_ref().map_or("", |n| n.id.as_str());
                let last = if id == "envoy-sds" { "SDS" } else { "LDS" };
                seen.keys().filter(|(t, _)| t == "CDS").count() == 3
                    && seen.keys().any(|(t, _)| t == last)
                    && (seen.iter()).all(|(k, s)| k == &w() || s.2 == ClientResourceStatus::Acked)
            })
    };
    loop {
        let r = fetch(client.clone(), ClientStatusRequest::default()).await;
        if synced(&r) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never all ACKED: {r:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // envoy-bad alone gets v2: `a` changed harmlessly, `b` rejected.
    cp.set_for_node(
        "envoy-bad",
        Snapshot::standard("v2", 2000, 0, 9).with(SDS, secret("gateway-cert", &cert, &key)),
    );
    let nonce = support::eventually(30, "envoy-bad's answer to v2", || {
        let sent = cp.sent();
        let push = sent.iter().find(|s| s.type_url == CDS && s.version == "v2");
        push.and_then(|p| cp.answer_to(&p.nonce))
    })
    .await;
    let envoy_says = nonce.error.clone().expect("Envoy rejects v2").1;
    let r = support::eventually_async(30, "CSDS to say b is NACKED", || async {
        let r = fetch(client.clone(), ClientStatusRequest::default()).await;
        let bad = resources(node(&r, "envoy-bad"));
        (bad.get(&("CDS".into(), "b".into())))
            .is_some_and(|s| s.2 == ClientResourceStatus::Nacked)
            .then_some(r)
    })
    .await;
    let bad = resources(node(&r, "envoy-bad"));
    let b = &bad[&("CDS".into(), "b".into())];
    assert_eq!(
        (b.1, b.2),
        (ConfigStatus::Error, ClientResourceStatus::Nacked)
    );
    assert_eq!(b.3, envoy_says, "the error state is Envoy's message");
    assert_eq!(b.0, "v1", "it runs v1's b");
    let a = &bad[&("CDS".into(), "a".into())];
    assert_eq!(
        (a.0.as_str(), a.1, a.2),
        ("v1", ConfigStatus::Error, ClientResourceStatus::Acked),
        "a changed in the rejected push: still v1's"
    );
    let g = (node(&r, "envoy-bad").generic_xds_configs.iter())
        .find(|g| g.name == "b" && g.type_url == CDS)
        .unwrap();
    let failure = g.error_state.as_ref().unwrap();
    assert_eq!(failure.version_info, "v2", "the version rejected");
    assert!(failure.last_update_attempt.is_some() && g.last_updated.is_some());
    for id in ["envoy-sds", "envoy-delta"] {
        let mut seen = resources(node(&r, id));
        let w = seen.remove(&w()).expect("w's endpoints are asked for");
        assert_eq!(
            (w.0.as_str(), w.1, w.2),
            ("", ConfigStatus::NotSent, ClientResourceStatus::Requested),
            "{id}: asked for, never sent"
        );
        assert!(
            (seen.values())
                .all(|s| (s.1, s.2) == (ConfigStatus::Synced, ClientResourceStatus::Acked)),
            "{id}: {seen:#?}"
        );
        assert_eq!(seen[&("EDS".into(), "a".into())].1, ConfigStatus::Synced);
    }
    let sds = resources(node(&r, "envoy-sds"));
    let secret = &sds[&("SDS".into(), "gateway-cert".into())];
    assert_eq!(
        (secret.0.as_str(), secret.2),
        ("v1", ClientResourceStatus::Acked)
    );
    // Delta: per-resource versions, as the control plane set them.
    let delta = resources(node(&r, "envoy-delta"));
    let eds_a = &delta[&("EDS".into(), "a".into())].0;
    assert!(
        eds_a.len() == 16,
        "the control plane's digest version: {eds_a}"
    );
    assert!(cp
        .requests()
        .iter()
        .any(|q| q.node.as_deref() == Some("envoy-delta") && q.type_url == EDS));
    let user_agent = node(&r, "envoy-sds").node.clone().unwrap();
    assert_eq!(user_agent.user_agent_name, "envoy");

    // Node matchers, and the streaming call: one answer per request.
    let one = fetch(
        client.clone(),
        ClientStatusRequest {
            node_matchers: vec![exact("envoy-delta")],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(one.config.len(), 1);
    assert_eq!(one.config[0].node.as_ref().unwrap().id, "envoy-delta");
    let requests = tokio_stream::iter([
        ClientStatusRequest::default(),
        ClientStatusRequest {
            node_matchers: vec![exact("nobody")],
            ..Default::default()
        },
    ]);
    let mut answers = client
        .stream_client_status(requests)
        .await
        .unwrap()
        .into_inner();
    let first = support::within(10, "the first answer", answers.message()).await;
    let second = support::within(10, "the second answer", answers.message()).await;
    let (first, second) = (first.unwrap().unwrap(), second.unwrap().unwrap());
    assert_eq!((first.config.len(), second.config.len()), (3, 0));

    // No key material anywhere in what CSDS says.
    for answer in [&r, &first, &one] {
        let bytes = answer.encode_to_vec();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(&canary) && !text.contains("PRIVATE KEY"));
    }
    tap.close().await;
}
