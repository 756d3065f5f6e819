//! From an object to every proxy: `xdstap wait --object` and `xdstap rollout --object` with
//! real Envoys (SotW and Delta ADS) that receive a DestinationRule's cluster, a third outside
//! its scope (its control plane gives it other clusters, as a Sidecar would), a silent ADS
//! client that never answers, and a control plane that writes istiod's metadata. Each case a
//! user meets: taken by every node in scope (exit 0, the out-of-scope node named as not waited
//! for); `--since` before the push (it waits for the push, then exits 0); a node not pushed
//! since and one that does not answer (exit 2 at the timeout, each named); a partial NACK of
//! another object's cluster (exit 0 for this one, 1 for that one); a NACK of this object's
//! cluster (exit 1, naming the node, the cluster and Envoy's words); a disconnected node (not
//! waited for). At each stage the object view's content digests and versions agree with each
//! Envoy's config_dump, and so does the page's objects section in a real Chromium (its row's
//! counts, its nodes' digests, its filter). The event log says which objects each push changed.

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use prost::Message;

use crate::support;
use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::metadata::{istio_cluster, plain_cluster};
use support::resources::{Snapshot, CDS};
use support::tap::XdsTap;
use xdstap::api::v1::object_node::Standing;
use xdstap::api::v1::ObjectReport;

const REVIEWS: &str = "outbound|9080|v2|reviews.default.svc.cluster.local";
const RATINGS: &str = "outbound|9080||ratings.default.svc.cluster.local";
const DR: &str = "destinationrule/default/reviews";
const OTHER_DR: &str = "destinationrule/default/ratings";
/// The nodes in the DestinationRule's scope, and whether each speaks Delta.
const IN_SCOPE: [(&str, bool); 2] = [("envoy-sotw", false), ("envoy-delta", true)];
const SCOPED_OUT: &str = "envoy-scoped";

/// The clusters of `version`: the reviews DestinationRule's (on `port`, or broken) and the
/// ratings DestinationRule's (broken when `ratings_bad`).
fn snapshot(version: &str, port: u32, reviews_bad: bool, ratings_bad: bool) -> Snapshot {
    Snapshot::new(version)
        .with(
            CDS,
            istio_cluster(
                REVIEWS,
                ("reviews", "default", "reviews", "v2"),
                port,
                reviews_bad,
            ),
        )
        .with(CDS, ratings(ratings_bad))
}

fn ratings(bad: bool) -> (String, envoy_types::pb::google::protobuf::Any) {
    // Encoded once each: the metadata is a protobuf Struct, whose map prost encodes in a random
    // order, and the same cluster must be the same bytes from one push to the next.
    static ENCODED: std::sync::OnceLock<[(String, envoy_types::pb::google::protobuf::Any); 2]> =
        std::sync::OnceLock::new();
    let both = ENCODED.get_or_init(|| {
        let of = |bad| istio_cluster(RATINGS, ("ratings", "default", "ratings", ""), 9, bad);
        [of(false), of(true)]
    });
    both[usize::from(bad)].clone()
}

/// What the node outside the scope gets: no cluster made from the reviews DestinationRule.
fn scoped(version: &str, ratings_bad: bool) -> Snapshot {
    Snapshot::new(version)
        .with(CDS, ratings(ratings_bad))
        .with(CDS, plain_cluster("plain", 9, false))
}

/// The digest the tap gives a resource's content (xxh3 of its bytes), as the view shows it.
fn digest_of(snapshot: &Snapshot, name: &str) -> String {
    let (_, any) = (snapshot.of(CDS).iter()).find(|(n, _)| n == name).unwrap();
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&any.value))
}

struct Stage {
    tap: XdsTap,
    cp: ControlPlane,
    envoys: Vec<Envoy>,
    log: std::path::PathBuf,
    _dir: support::TempDir,
}

impl Stage {
    async fn start(first: &Snapshot) -> Stage {
        let (cp, cp_addr, _server) = ControlPlane::listening(first.clone()).await;
        cp.set_for_node(SCOPED_OUT, scoped(&first.version, false));
        let dir = support::TempDir::new("wait-object");
        let log = dir.path().join("events.jsonl");
        let mut config = support::tap::config("127.0.0.1:0", &cp_addr);
        config.event_log = Some(log.clone());
        let tap = XdsTap::with_config(config, vec![]).await;
        let mut envoys = Vec::new();
        for (node, delta) in IN_SCOPE.iter().chain(&[(SCOPED_OUT, false)]) {
            envoys.push(Envoy::start(node, Xds::Tcp(tap.tap.addr.clone()), *delta).await);
        }
        let stage = Stage {
            tap,
            cp,
            envoys,
            log,
            _dir: dir,
        };
        stage.ports(first, 30).await;
        stage
    }

    /// Pushes `snapshot` to every node in scope (the out-of-scope one gets `scoped`).
    fn push(&self, snapshot: &Snapshot, scoped_out: Snapshot) {
        self.cp.set_for_node(SCOPED_OUT, scoped_out);
        for (node, _) in IN_SCOPE {
            self.cp.set_for_node(node, snapshot.clone());
        }
    }

    /// Waits until each node in scope runs `snapshot`'s reviews cluster, as its config_dump
    /// says.
    async fn ports(&self, snapshot: &Snapshot, secs: u64) {
        let want = port_of(snapshot);
        for e in self.envoys.iter().filter(|e| e.node != SCOPED_OUT) {
            support::eventually_async(secs, &format!("{} on port {want}", e.node), || async {
                (dumped_port(e).await == Some(want)).then_some(())
            })
            .await;
        }
    }

    async fn view(&self, object: &str, since: Option<&str>) -> ObjectReport {
        let mut path = format!("/objects?object={object}");
        if let Some(s) = since {
            path.push_str(&format!("&since={s}"));
        }
        let (code, body) = support::http_get(&self.tap.admin, &path).await;
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    async fn wait(&self, args: &[&str]) -> (i32, String, String) {
        let mut all = vec!["wait", "--admin", &self.tap.admin];
        all.extend_from_slice(args);
        support::xdstap(&all).await
    }
}

/// The reviews cluster's port in `snapshot`.
fn port_of(snapshot: &Snapshot) -> u32 {
    let (_, any) = snapshot.of(CDS).iter().find(|(n, _)| n == REVIEWS).unwrap();
    cluster_port(&Cluster::decode(&*any.value).unwrap())
}

fn cluster_port(c: &Cluster) -> u32 {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    let la = c.load_assignment.as_ref().unwrap();
    let ep = &la.endpoints[0].lb_endpoints[0];
    let Some(envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(
        e,
    )) = &ep.host_identifier
    else {
        panic!("an endpoint");
    };
    let Some(address::Address::SocketAddress(sa)) =
        e.address.as_ref().and_then(|a| a.address.as_ref())
    else {
        panic!("a socket address");
    };
    match sa.port_specifier {
        Some(socket_address::PortSpecifier::PortValue(p)) => p,
        _ => panic!("a port"),
    }
}

/// The port of the reviews cluster an Envoy runs, from its config_dump.
async fn dumped_port(e: &Envoy) -> Option<u32> {
    let dump = e.config_dump().await;
    let configs = dump["configs"].as_array()?;
    let clusters = configs.iter().find(|c| {
        c["@type"]
            .as_str()
            .is_some_and(|t| t.ends_with("ClustersConfigDump"))
    })?;
    let active = clusters["dynamic_active_clusters"].as_array()?;
    let c = active.iter().find(|c| c["cluster"]["name"] == REVIEWS)?;
    let port = &c["cluster"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        ["address"]["socket_address"]["port_value"];
    port.as_u64().map(|p| p as u32)
}

/// The object view agrees with the Envoys: each node in scope runs the reviews cluster's
/// content of `snapshot` (by digest), which its config_dump shows on that snapshot's port.
async fn agrees(stage: &Stage, snapshot: &Snapshot) {
    let report = stage.view(DR, None).await;
    let o = &report.objects[0];
    let want = digest_of(snapshot, REVIEWS);
    for (node, _) in IN_SCOPE {
        let n = (o.node_states.iter())
            .find(|n| n.node == node)
            .unwrap_or_else(|| panic!("{node} in {o:?}"));
        let r = n.resources.iter().find(|r| r.name == REVIEWS).unwrap();
        assert_eq!(r.digest, want, "{node} runs {}: {o:?}", snapshot.version);
        let e = stage.envoys.iter().find(|e| e.node == node).unwrap();
        assert_eq!(
            dumped_port(e).await,
            Some(port_of(snapshot)),
            "{node}'s config_dump"
        );
    }
    assert!(
        !o.node_states.iter().any(|n| n.node == SCOPED_OUT),
        "the node outside its scope is not among its nodes: {o:?}"
    );
    assert_eq!(o.out_of_scope, 1, "{o:?}");
}

/// The page's objects section: the object's row counts its nodes as the view does (the two in
/// scope taken, the silent client that went away disconnected, the third Envoy out of scope), and its
/// nodes, once opened, run the content of `snapshot` (by digest), as each Envoy's config_dump
/// shows it.
async fn page_agrees(stage: &Stage, snapshot: &Snapshot) {
    use crate::page::{js, open};
    let (mut browser, session) = open(format!("http://{}/", stage.tap.admin)).await;
    let row = "[...document.querySelectorAll('tr.object-row')].find(r => r.dataset.object === 'DestinationRule/default/reviews')";
    let cells = format!("(r => r ? [...r.cells].map(c => c.textContent) : null)({row})");
    browser.until(
        &session,
        20,
        &format!(
            "(c => !!c && c[2] === '3' && c[3] === '2' && c[6] === '1' && c[7] === '1')({cells})"
        ),
    );
    browser.eval(&session, &format!("{row}.click(); true"));
    let want = digest_of(snapshot, REVIEWS);
    for (node, _) in IN_SCOPE {
        let found = format!(
            "[...document.querySelectorAll('tr.object-node')].some(r => r.dataset.node === {} && r.dataset.digest === {} && r.textContent.includes('TAKEN'))",
            js(node),
            js(&want)
        );
        browser.until(&session, 10, &found);
        let e = stage.envoys.iter().find(|e| e.node == node).unwrap();
        assert_eq!(
            dumped_port(e).await,
            Some(port_of(snapshot)),
            "{node}'s config_dump"
        );
    }
    // The filter narrows the section.
    let filter = "(f => { f.value = 'ratings'; f.dispatchEvent(new Event('input')); return true; })(document.getElementById('objects-filter'))";
    browser.eval(&session, filter);
    browser.until(&session, 5, &format!("!{row}"));
}

/// A SotW ADS client through the tap that subscribes to clusters and never answers a push.
async fn silent(
    tap: &str,
) -> (
    tokio::sync::mpsc::Sender<DiscoveryRequest>,
    tonic::Streaming<envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse>,
) {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{tap}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(Node {
            id: "silent".into(),
            ..Default::default()
        }),
        type_url: CDS.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut responses = client
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    support::within(20, "the silent client's push", responses.message())
        .await
        .unwrap()
        .unwrap();
    (tx, responses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_an_object_across_nodes_sotw_and_delta() {
    let v1 = snapshot("v1", 1001, false, false);
    let mut stage = Stage::start(&v1).await;

    // Taken by both nodes in scope; the third is named as not waited for.
    let (code, out, err) = stage.wait(&["--object", DR, "--timeout", "20s"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("DestinationRule default/reviews: taken by 2 of 2 nodes"),
        "{out}"
    );
    assert!(
        out.contains("1 connected node receives nothing made from it (not waited for)"),
        "{out}"
    );
    agrees(&stage, &v1).await;

    // --since before the push: it waits for the push, then for both to take it.
    let t0 = xdstap::rfc3339(xdstap::now());
    let mut waiting = std::process::Command::new(support::bin())
        .args([
            "wait",
            "--admin",
            &stage.tap.admin,
            "--object",
            DR,
            "--since",
            &t0,
        ])
        .args(["--timeout", "30s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "it waits for a push since --since"
    );
    let report = stage.view(DR, Some(&t0)).await;
    let states: Vec<Standing> = report.objects[0]
        .node_states
        .iter()
        .map(|n| n.state())
        .collect();
    assert_eq!(
        states,
        [Standing::NotPushed, Standing::NotPushed],
        "{report:?}"
    );
    let v2 = snapshot("v2", 1002, false, false);
    stage.push(&v2, scoped("v2", false));
    let done = tokio::task::spawn_blocking(move || waiting.wait_with_output().unwrap())
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&done.stdout);
    assert_eq!(
        done.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(out.contains("taken by 2 of 2 nodes"), "{out}");
    stage.ports(&v2, 20).await;
    agrees(&stage, &v2).await;
    // The event log says which objects v2 changed for each node (the spans carry the same).
    for (node, _) in IN_SCOPE {
        let line = support::eventually(10, &format!("{node}'s CDS ack of v2"), || {
            let text = std::fs::read_to_string(&stage.log).unwrap_or_default();
            (text.lines())
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|r| {
                    r["node"] == node
                        && r["type"] == "CDS"
                        && r["verdict"] == "ack"
                        && r["objects_changed_count"] == 2
                })
        })
        .await;
        let changed: Vec<&str> = (line["objects_changed"].as_array().unwrap().iter())
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(
            changed,
            ["DestinationRule default/reviews", "Service default/reviews"],
            "{line}"
        );
    }

    // A node not pushed since, and one that never answers: exit 2 at the timeout, each named.
    let t1 = xdstap::rfc3339(xdstap::now());
    let (_silent_tx, _silent_rx) = silent(&stage.tap.tap.addr).await;
    let v2b = snapshot("v2b", 1012, false, false);
    stage.cp.set_for_node("envoy-sotw", v2b.clone());
    support::eventually_async(20, "envoy-sotw on v2b", || async {
        let e = &stage.envoys[0];
        (dumped_port(e).await == Some(1012)).then_some(())
    })
    .await;
    let (code, out, err) = stage
        .wait(&["--object", DR, "--since", &t1, "--timeout", "2s"])
        .await;
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("timed out"), "{err}");
    let line = |node: &str| {
        out.lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("envoy-delta").contains("NOT PUSHED"), "{out}");
    assert!(
        line("silent").contains("PENDING") && line("silent").contains("not answered"),
        "{out}"
    );
    assert!(
        !out.lines().any(|l| l.starts_with("envoy-sotw ")),
        "envoy-sotw took it: {out}"
    );
    drop((_silent_tx, _silent_rx));

    // A partial NACK of another object's cluster: this one landed; that one was rejected.
    let t2 = xdstap::rfc3339(xdstap::now());
    let v3 = snapshot("v3", 1003, false, true);
    stage.push(&v3, scoped("v3", true));
    stage.ports(&v3, 20).await;
    let (code, out, err) = stage
        .wait(&["--object", DR, "--since", &t2, "--timeout", "20s"])
        .await;
    assert_eq!(
        code, 0,
        "a NACK of another object's cluster is not this one's: {out}{err}"
    );
    agrees(&stage, &v3).await;
    let (code, out, err) = stage
        .wait(&["--object", OTHER_DR, "--since", &t2, "--timeout", "20s"])
        .await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("DestinationRule default/ratings was rejected"),
        "{err}"
    );
    let named = (out.lines())
        .filter(|l| l.contains(&format!("rejected CDS {RATINGS}")) && l.contains("not-an-ip"))
        .count();
    assert!(named >= 1, "{out}");
    // All three receive the ratings cluster, and all three reject it.
    support::eventually_async(20, "three nodes rejecting ratings", || async {
        let r = stage.view(OTHER_DR, Some(&t2)).await;
        (r.objects[0].rejected == 3).then_some(())
    })
    .await;

    // The page's objects section says the same, in a real Chromium: the object's row, and its
    // nodes with the content each runs, as each Envoy's config_dump has it.
    page_agrees(&stage, &v3).await;

    // A NACK of this object's cluster: exit 1, naming each node, the cluster and Envoy's words.
    let t3 = xdstap::rfc3339(xdstap::now());
    let v4 = snapshot("v4", 1004, true, false);
    stage.push(&v4, scoped("v4", false));
    let (code, out, err) = stage
        .wait(&["--object", DR, "--since", &t3, "--timeout", "20s"])
        .await;
    assert_eq!(code, 1, "{out}{err}");
    // It exits the moment one node rejects it, naming each that has by then.
    let named: Vec<&str> = (out.lines())
        .filter(|l| l.contains(&format!("rejected CDS {REVIEWS}")) && l.contains("not-an-ip"))
        .collect();
    assert!(
        !named.is_empty()
            && named
                .iter()
                .all(|l| IN_SCOPE.iter().any(|(n, _)| l.starts_with(n))),
        "{out}"
    );
    // Soon both have.
    support::eventually_async(20, "both nodes rejecting", || async {
        let r = stage.view(DR, Some(&t3)).await;
        (r.objects[0].rejected == 2).then_some(())
    })
    .await;
    // Envoy keeps v3's cluster: the view says so.
    agrees(&stage, &v3).await;

    // Fixed; then a node goes away: it is named, not waited for.
    let t4 = xdstap::rfc3339(xdstap::now());
    let v5 = snapshot("v5", 1005, false, false);
    stage.push(&v5, scoped("v5", false));
    let (code, out, err) = stage
        .wait(&["--object", DR, "--since", &t4, "--timeout", "20s"])
        .await;
    assert_eq!(code, 0, "{out}{err}");
    agrees(&stage, &v5).await;
    let delta = stage.envoys.remove(1);
    drop(delta);
    let disconnected = support::eventually_async(20, "envoy-delta disconnected", || async {
        let r = stage.view(DR, None).await;
        let n = (r.objects[0].node_states.iter()).find(|n| n.node == "envoy-delta")?;
        (!n.connected).then_some(r)
    })
    .await;
    // The silent client went away earlier: both are named, neither waited for.
    assert_eq!(disconnected.objects[0].disconnected, 2, "{disconnected:?}");
    let (code, out, err) = stage.wait(&["--object", DR, "--timeout", "20s"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("taken by 1 of 3 nodes (2 disconnected (not waited for))"),
        "{out}"
    );
    // The same view for people: a line per node and resource, with what it runs.
    let (code, out, err) =
        support::xdstap(&["rollout", "--admin", &stage.tap.admin, "--object", DR]).await;
    assert_eq!(code, 0, "{out}{err}");
    let sotw = out
        .lines()
        .find(|l| l.starts_with("envoy-sotw"))
        .unwrap_or_default();
    assert!(
        sotw.contains("TAKEN") && sotw.contains(&format!("v5 {}", &digest_of(&v5, REVIEWS)[..8])),
        "{out}"
    );
    assert!(
        out.contains("kubectl get destinationrule.networking.istio.io reviews -n default -o yaml"),
        "{out}"
    );
}

/// Mistakes a user makes name what is wrong and exit 64 (the command line's usage error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_object_or_since_is_a_usage_error() {
    for (args, says) in [
        (
            vec!["wait", "--object", "reviews"],
            "expected KIND/NAMESPACE/NAME",
        ),
        (
            vec!["wait", "--object", DR, "--since", "yesterday"],
            "invalid since \"yesterday\"",
        ),
        (vec!["wait", "--since", "5m"], "--object"),
    ] {
        let (code, out, err) = support::xdstap(&args).await;
        assert_eq!(code, 64, "{args:?}: {out}{err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
