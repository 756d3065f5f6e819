//! What Envoy's xDS failover does around a tap, measured with a real Envoy run from
//! `config/envoy-bootstrap-failover.yaml` (the tap as its first xDS service, the control plane
//! itself as the failover). Envoy 1.40 fails over only while it has never reached its first
//! service: an Envoy whose stream runs through the tap keeps redialling the tap when the tap is
//! SIGKILLed mid-rollout, and the push made meanwhile reaches it only once the tap is back (then
//! at once, ACKed, the control plane's record says so). The restarted tap shows only what it
//! saw since: the node again, never a verdict for a push it did not forward. At start-up, an
//! Envoy whose failover answers uses it (its first try of the tap fails before the tap's cluster
//! is up) and stays there.

use crate::support;

use std::time::{Duration, Instant};

use support::control_plane::ControlPlane;
use support::envoy::Envoy;
use support::resources::{Snapshot, CDS};

const NODE: &str = "failover";

/// The `xdstap` binary between `listen` and `upstream`, admin on `admin`.
async fn tap(listen: &str, upstream: &str, admin: &str) -> support::Child {
    let child = support::Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_xdstap"))
            .args(["run", "--listen", listen, "--upstream", upstream])
            .args(["--admin", admin])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    support::eventually(10, "the tap listening", || {
        std::net::TcpStream::connect(admin).ok().map(|_| ())
    })
    .await;
    child
}

/// The recipe, with this test's ports.
fn bootstrap(tap: &str, control_plane: &str) -> String {
    let port = |a: &str| a.rsplit_once(':').unwrap().1.to_string();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/envoy-bootstrap-failover.yaml"
    );
    let recipe = std::fs::read_to_string(path).unwrap();
    for (from, what) in [
        ("port_value: 15010", "the tap's port"),
        ("port_value: 18000", "the control plane's port"),
        ("port_value: 9901", "the admin port"),
        (
            "id: sidecar~10.0.0.1~demo-1.default~default.svc.cluster.local",
            "the node id",
        ),
    ] {
        assert!(recipe.contains(from), "the recipe has no {what} ({from})");
    }
    recipe
        .replace("port_value: 15010", &format!("port_value: {}", port(tap)))
        .replace("port_value: 18000", &format!("port_value: {}", port(control_plane)))
        .replace("port_value: 9901", "port_value: 0")
        .replace(
            "id: sidecar~10.0.0.1~demo-1.default~default.svc.cluster.local",
            &format!("id: {NODE}"),
        )
        // The library's test bootstraps retry xDS every 50-500 ms; so does this one.
        .replace(
            "    - envoy_grpc: { cluster_name: xds-tap }",
            "    - envoy_grpc: { cluster_name: xds-tap, retry_policy: { retry_back_off: { base_interval: 0.05s, max_interval: 0.5s } } }",
        )
}

/// The version of CDS the tap at `admin` says the node runs, while the node is connected there.
async fn through_tap(admin: &str) -> Option<String> {
    let (code, body) = support::http_get(admin, &format!("/status?node={NODE}")).await;
    if code != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let node = &v["nodes"][0];
    if node["connected"] != true {
        return None;
    }
    let cds = (node["types"].as_array()?.iter()).find(|t| t["type"] == "CDS")?;
    cds["version_accepted"].as_str().map(String::from)
}

/// Cluster `a`'s connect timeout as Envoy runs it, from its own config_dump (each version of the
/// test's snapshot gives `a` its own: v2 2s, v3 3s).
async fn a_timeout(envoy: &Envoy) -> Option<String> {
    let dump = envoy.config_dump().await;
    let clusters = (dump["configs"].as_array()?.iter()).find(|c| {
        c["@type"]
            .as_str()
            .is_some_and(|t| t.ends_with("ClustersConfigDump"))
    })?;
    let a = (clusters["dynamic_active_clusters"].as_array()?.iter())
        .find(|d| d["cluster"]["name"] == "a")?;
    a["cluster"]["connect_timeout"].as_str().map(String::from)
}

/// Whether the control plane heard Envoy accept CDS `version` (on any stream).
fn acked(cp: &ControlPlane, version: &str) -> bool {
    (cp.sent().iter())
        .filter(|s| s.type_url == CDS && s.version == version)
        .any(|s| cp.answer_to(&s.nonce).is_some_and(|a| a.error.is_none()))
}

/// Polls `check` every 50 ms for at most `secs`: when it first held, if it did.
async fn within(secs: u64, mut check: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if check().await {
            return Some(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_fails_over_only_from_a_tap_it_never_reached_and_the_tap_shows_a_gap() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let (listen, admin) = (support::free_addr(), support::free_addr());
    let first = tap(&listen, &cp_addr, &admin).await;
    // The control plane's own address (the failover) answers only once Envoy runs through the
    // tap: an Envoy whose failover answers at start-up stays there (the last part).
    let direct = support::free_addr();
    let envoy = Envoy::start_yaml(NODE, &bootstrap(&listen, &direct)).await;
    let started = within(30, async || {
        through_tap(&admin).await.as_deref() == Some("v1")
    })
    .await;
    if started.is_none() {
        let (_, status) = support::http_get(&admin, "/status").await;
        panic!(
            "Envoy never ran v1 through the tap: {status}\n{}",
            envoy.log()
        );
    }
    let _direct = cp.serve(tokio::net::TcpListener::bind(&direct).await.unwrap());
    cp.set(Snapshot::standard("v2", 2000, 1000, 9));
    let v2 = within(10, async || {
        through_tap(&admin).await.as_deref() == Some("v2")
    })
    .await;
    assert!(v2.is_some(), "v2 never ACKed through the tap");

    // The tap dies in the middle of the rollout. Envoy redials it and does not fail over.
    drop(first);
    let killed = Instant::now();
    cp.set(Snapshot::standard("v3", 3000, 1000, 9));
    assert!(
        within(5, async || acked(&cp, "v3")).await.is_none(),
        "v3 reached Envoy while the tap was down (a failover Envoy 1.40 did not make before)"
    );
    // Envoy's own view agrees: it still runs v2's cluster a.
    assert_eq!(a_timeout(&envoy).await.as_deref(), Some("2s"));

    // The tap comes back on its address; Envoy's stream returns through it and v3 lands.
    let sent_before = cp.sent().len();
    let _second = tap(&listen, &cp_addr, &admin).await;
    let back = within(20, async || {
        through_tap(&admin).await.as_deref() == Some("v3")
    })
    .await;
    assert!(
        back.is_some(),
        "Envoy never came back through the tap:\n{}",
        envoy.log()
    );
    assert!(acked(&cp, "v3"), "the control plane has no ACK of v3");
    let runs_v3 = within(5, async || a_timeout(&envoy).await.as_deref() == Some("3s")).await;
    assert!(
        runs_v3.is_some(),
        "Envoy's config_dump does not show v3's cluster a"
    );
    // The restarted tap knows only what it saw: v3 pushed again on the new stream, nothing of v2.
    let (_, body) = support::http_get(&admin, "/rollouts").await;
    let rollouts: serde_json::Value = serde_json::from_str(&body).unwrap();
    let since: Vec<String> = (cp.sent()[sent_before..].iter())
        .map(|s| s.version.clone())
        .collect();
    for r in rollouts["rollouts"].as_array().unwrap() {
        let version = r["version"].as_str().unwrap();
        assert!(
            since.iter().any(|v| v == version),
            "the restarted tap reports {version}, which it never saw pushed: {body}"
        );
    }
    eprintln!(
        "failover: config stopped {:?} while the tap was down; back through it {:?} after its restart",
        killed.elapsed() - back.unwrap(),
        back.unwrap()
    );

    // At start-up, with the failover answering, Envoy takes it and stays there.
    let yaml = bootstrap(&listen, &direct).replace(&format!("id: {NODE}"), "id: late");
    let late = Envoy::start_yaml("late", &yaml).await;
    let on_failover = within(20, async || {
        (cp.sent().iter()).any(|s| {
            s.node.as_deref() == Some("late")
                && cp.answer_to(&s.nonce).is_some_and(|a| a.error.is_none())
        })
    })
    .await;
    assert!(
        on_failover.is_some(),
        "the late Envoy got no config:\n{}",
        late.log()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, status) = support::http_get(&admin, "/status?node=late").await;
    assert!(
        !status.contains("\"id\": \"late\""),
        "the late Envoy came through the tap: {status}"
    );
}
