//! TTLs and heartbeats with a real Envoy (xDS `Resource.ttl`, field 6). Over Delta ADS a
//! cluster pushed with a 2 s TTL stays while heartbeats (bare wrappers, same version) come;
//! the heartbeats are answered but counted as no pushes (not in `/status` pushes, not in the
//! push metrics, not in rollouts); when they stop, Envoy drops the cluster and the tap's CSDS
//! and `/status?node=` say EXPIRED within a second of Envoy's own config_dump. Over SotW, Envoy
//! 1.40 leaves a bare wrapper out of the push it applies, so a heartbeat of a cluster under the
//! wildcard CDS subscription removes it: the tap says so too, by Envoy's config_dump.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support;
use crate::support::csds;
use crate::support::envoy::{Envoy, Xds};
use crate::support::resources::{static_cluster, CDS, LDS};
use crate::support::scripted::{delta_response, response, Scripted};
use crate::support::tap::{TapOptions, XdsTap};
use envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use envoy_types::pb::envoy::service::discovery::v3::Resource;
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use prost::Message;
use serde_json::Value;

/// A `Resource` wrapper: `body` none is a heartbeat.
fn wrapper(name: &str, version: &str, body: Option<Any>, ttl_ms: Option<i64>) -> Resource {
    Resource {
        name: name.into(),
        version: version.into(),
        resource: body,
        ttl: ttl_ms.map(|ms| PbDuration {
            seconds: ms / 1000,
            nanos: ((ms % 1000) * 1_000_000) as i32,
        }),
        ..Default::default()
    }
}

/// The same wrapper in a SotW response's `Any`.
fn wrapped(name: &str, version: &str, body: Option<Any>, ttl_ms: Option<i64>) -> Any {
    Any {
        type_url: "type.googleapis.com/envoy.service.discovery.v3.Resource".into(),
        value: wrapper(name, version, body, ttl_ms).encode_to_vec(),
    }
}

/// The clusters Envoy runs, by its config_dump.
async fn envoy_clusters(envoy: &Envoy) -> BTreeSet<String> {
    let dump = envoy.config_dump().await;
    let mut out = BTreeSet::new();
    for c in dump["configs"].as_array().unwrap() {
        for d in c["dynamic_active_clusters"]
            .as_array()
            .into_iter()
            .flatten()
        {
            out.insert(d["cluster"]["name"].as_str().unwrap().to_string());
        }
    }
    out
}

/// The clusters the tap's CSDS says `node` runs (ACKED), and what it says of `name`.
async fn tap_clusters(
    tap: &XdsTap,
    node: &str,
    name: &str,
) -> (BTreeSet<String>, Option<csds::Reported>) {
    let r = csds::fetch(&tap.admin).await;
    let seen = csds::resources(csds::node(&r, node));
    let running = (seen.iter())
        .filter(|((t, _), r)| t == "CDS" && r.2 == ClientResourceStatus::Acked)
        .map(|((_, n), _)| n.clone())
        .collect();
    (running, seen.get(&("CDS".into(), name.into())).cloned())
}

async fn cds_status(tap: &XdsTap, node: &str) -> Value {
    let (_, body) = support::http_get(&tap.admin, &format!("/status?node={node}")).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let types = v["nodes"][0]["types"].as_array().unwrap().clone();
    let cds = types.into_iter().find(|t| t["type"] == "CDS");
    let mut cds = cds.unwrap_or_else(|| panic!("no CDS in {v}"));
    cds["resources"] = v["nodes"][0]["resources"].clone();
    cds
}

async fn start(cp: &Scripted, node: &str, delta: bool) -> (XdsTap, Envoy) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let _server = cp.serve(listener);
    let tap = XdsTap::start(TapOptions::new(&upstream)).await;
    let envoy = Envoy::start(node, Xds::Tcp(tap.tap.addr.clone()), delta).await;
    (tap, envoy)
}

async fn answered(cp: &Scripted, nonce: &str) {
    let a = support::eventually(20, &format!("Envoy's answer to {nonce}"), || {
        cp.answers_to(nonce).first().cloned()
    })
    .await;
    assert_eq!(a.error, None, "{nonce}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_heartbeats_keep_a_resource_and_the_tap_marks_it_expired_when_they_stop() {
    let (a, t) = (static_cluster("a", 1000, 9), static_cluster("t", 1000, 9));
    let cp = Scripted::default();
    let mut first = delta_response(
        CDS,
        "n1",
        vec![
            wrapper("a", "1", Some(a.clone()), None),
            wrapper("t", "1", Some(t.clone()), Some(2000)),
        ],
        &[],
    );
    first.system_version_info = "1".into();
    cp.on_first_delta(first);
    cp.on_first_delta(delta_response(LDS, "l1", vec![], &[]));
    let (tap, envoy) = start(&cp, "ttl-delta", true).await;
    answered(&cp, "n1").await;
    // Heartbeats every half second keep t in Envoy and in the tap's view.
    for k in 0..6 {
        let nonce = format!("h{k}");
        let mut hb = delta_response(CDS, &nonce, vec![wrapper("t", "1", None, Some(2000))], &[]);
        hb.system_version_info = "1".into();
        cp.send_delta(vec![hb]).await;
        answered(&cp, &nonce).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let both: BTreeSet<String> = ["a", "t"].map(String::from).into();
    assert_eq!(envoy_clusters(&envoy).await, both);
    let (running, t_says) = tap_clusters(&tap, "ttl-delta", "t").await;
    assert_eq!(running, both);
    assert_eq!(t_says.map(|t| t.0), Some("1".to_string()));
    // Heartbeats are answered, yet no push: not in pushes, not in the push metrics, rollouts.
    let s = cds_status(&tap, "ttl-delta").await;
    assert_eq!(s["pushes"], 1, "{s}");
    assert_eq!(s["heartbeats"], 6, "{s}");
    assert_eq!(s["state"], "SYNCED", "{s}");
    let (_, text) = support::http_get(&tap.admin, "/metrics").await;
    let metrics = support::prom::parse(&text).unwrap();
    let acks = [("type", "CDS"), ("verdict", "ack")];
    assert_eq!(metrics.get("xdstap_pushes_total", &acks), 1.0, "{text}");
    let (_, body) = support::http_get(&tap.admin, "/rollouts").await;
    let rollouts: Value = serde_json::from_str(&body).unwrap();
    let cds = (rollouts["rollouts"].as_array().unwrap().iter())
        .find(|r| r["type"] == "CDS" && r["version"] == "1")
        .cloned()
        .unwrap_or_else(|| panic!("no CDS 1 in {rollouts}"));
    assert_eq!(cds["pushed"], 1, "{cds}");
    assert_eq!(cds["last_push"], cds["first_push"], "{cds}");
    // The heartbeats stop: Envoy drops t when its TTL lapses, and the tap says so at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    while envoy_clusters(&envoy).await.contains("t") {
        assert!(Instant::now() < deadline, "Envoy kept t past its TTL");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dropped = Instant::now();
    let t_says = loop {
        let (running, t_says) = tap_clusters(&tap, "ttl-delta", "t").await;
        if !running.contains("t") {
            break t_says.expect("t listed");
        }
        assert!(
            dropped.elapsed() < Duration::from_secs(1),
            "the tap still says t runs a second after Envoy dropped it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(t_says.2, ClientResourceStatus::DoesNotExist, "{t_says:?}");
    assert_eq!(t_says.3, "its TTL of 2s lapsed without a heartbeat");
    let s = cds_status(&tap, "ttl-delta").await;
    let t_view = (s["resources"].as_array().unwrap().iter())
        .find(|r| r["name"] == "t")
        .cloned()
        .unwrap();
    assert_eq!(t_view["client"], "EXPIRED", "{s}");
    assert_eq!(t_view["config"], "SYNCED", "{s}");
    let args = [
        "status",
        "--admin",
        &tap.admin,
        "--node",
        "ttl-delta",
        "--resources",
    ];
    let (code, out, _) = support::xdstap(&args).await;
    assert_eq!(code, 1, "{out}");
    let line = out.lines().find(|l| l.contains(" t ")).unwrap_or_default();
    assert!(
        line.contains("EXPIRED") && line.contains("its TTL of 2s lapsed"),
        "{out}"
    );
    // Pushed again, without a TTL: it runs and stays.
    cp.send_delta(vec![delta_response(
        CDS,
        "n2",
        vec![wrapper("t", "2", Some(t.clone()), None)],
        &[],
    )])
    .await;
    answered(&cp, "n2").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !envoy_clusters(&envoy).await.contains("t") {
        assert!(Instant::now() < deadline, "Envoy never took t again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(envoy_clusters(&envoy).await, both);
    let (running, t_says) = tap_clusters(&tap, "ttl-delta", "t").await;
    assert_eq!(running, both);
    assert_eq!(t_says.map(|t| t.0), Some("2".to_string()));
    tap.close().await;
}

/// Envoy 1.40's SotW mux filters heartbeats out of the push before it applies it, and a SotW
/// CDS push is the whole set: the cluster heartbeated is removed. The tap agrees with Envoy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sotw_heartbeat_under_a_wildcard_removes_the_cluster_as_envoy_does() {
    let (a, t) = (static_cluster("a", 1000, 9), static_cluster("t", 1000, 9));
    let cp = Scripted::default();
    cp.on_first(response(
        CDS,
        "1",
        "n1",
        vec![a.clone(), wrapped("t", "1", Some(t.clone()), Some(2000))],
    ));
    cp.on_first(response(LDS, "1", "l1", vec![]));
    let (tap, envoy) = start(&cp, "ttl-sotw", false).await;
    answered(&cp, "n1").await;
    let both: BTreeSet<String> = ["a", "t"].map(String::from).into();
    let deadline = Instant::now() + Duration::from_secs(10);
    while tap_clusters(&tap, "ttl-sotw", "t").await.0 != both {
        assert!(Instant::now() < deadline, "the tap never listed a and t");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(envoy_clusters(&envoy).await, both);
    cp.send(vec![response(
        CDS,
        "1",
        "h1",
        vec![a.clone(), wrapped("t", "1", None, Some(2000))],
    )])
    .await;
    answered(&cp, "h1").await;
    let only_a: BTreeSet<String> = ["a".to_string()].into();
    let deadline = Instant::now() + Duration::from_secs(10);
    while envoy_clusters(&envoy).await != only_a {
        assert!(Instant::now() < deadline, "Envoy kept t");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (running, t_says) = tap_clusters(&tap, "ttl-sotw", "t").await;
        if running == only_a && t_says.is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tap says {running:?}, t {t_says:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tap.close().await;
}
