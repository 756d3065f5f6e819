//! "I pushed V: who has it?" with real Envoys (SotW and Delta) through one tap: `xdstap rollout`,
//! `/rollouts`, `xdstap wait` and `xdstap watch` against what the control plane recorded of
//! every push and answer, through a bad push, its fix, a node never pushed the version, and a
//! control-plane restart.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::resources::{Snapshot, CDS};
use support::tap::{TapOptions, XdsTap};
use support::xdstap;
use xdstap::api::v1::{Rollout, RolloutReport};
use xdstap::correlate::Event;

/// The nodes the control plane pushed `type_url` version `version` to, split by how their
/// answers went (by its own record): (acked, nacked with the message).
fn recorded(
    cp: &ControlPlane,
    type_url: &str,
    version: &str,
) -> (BTreeSet<String>, Vec<(String, String)>) {
    let mut acked = BTreeSet::new();
    let mut nacked = Vec::new();
    for s in cp.sent() {
        if s.type_url != type_url || s.version != version {
            continue;
        }
        let node = s.node.clone().unwrap_or_default();
        match cp.answer_to(&s.nonce).and_then(|a| a.error) {
            Some((_, message)) => nacked.push((node, message)),
            None if cp.answer_to(&s.nonce).is_some() => {
                acked.insert(node);
            }
            None => {}
        }
    }
    (acked, nacked)
}

async fn rollouts(admin: &str, query: &str) -> RolloutReport {
    let (code, body) = support::http_get(admin, &format!("/rollouts{query}")).await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

async fn cds(admin: &str, version: &str) -> Option<Rollout> {
    (rollouts(admin, &format!("?version={version}&type=CDS"))
        .await
        .rollouts)
        .into_iter()
        .next()
}

/// Waits until CDS `version` has `answered` answers from the tap's point of view.
async fn answered(admin: &str, version: &str, answered: u64) -> Rollout {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(r) = cds(admin, version).await {
            if r.acked + r.nacked >= answered {
                return r;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "CDS {version} never got {answered} answers: {:?}",
            cds(admin, version).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `xdstap watch ARGS` in the background, once it says it is watching.
fn watch(args: &[&str]) -> (support::Child, support::Lines) {
    let (child, out, said) = support::watching(args, 1);
    assert!(said.contains("watching the tap"), "{said}");
    (child, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_took_each_version_across_a_fix_a_bystander_and_a_restart() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    // envoy-4 has config of its own: it is never pushed the versions the others get.
    cp.set_for_node("envoy-4", Snapshot::standard("w1", 1000, 1000, 9));
    let server = cp.serve(listener);
    let tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let admin = tap.admin.clone();
    let xds = || Xds::Tcp(tap.tap.addr.clone());
    let _e1 = Envoy::start("envoy-1", xds(), false).await;
    let _e2 = Envoy::start("envoy-2", xds(), true).await;
    let _e3 = Envoy::start("envoy-3", xds(), false).await;
    let _e4 = Envoy::start("envoy-4", xds(), false).await;
    let v1 = answered(&admin, "v1", 3).await;
    assert_eq!((v1.pushed, v1.acked), (3, 3), "{v1:?}");

    // v2: envoy-3 alone gets a cluster it rejects; a watch sees the NACK live.
    let (_watch, watched) = watch(&["--admin", &admin, "--verdict", "nack", "-o", "json"]);
    let (_one, one) = watch(&[
        "--admin",
        &admin,
        "--node",
        "envoy-1",
        "-t",
        "CDS",
        "--verdict",
        "ack,nack",
        "-o",
        "json",
    ]);
    cp.set_for_node("envoy-3", Snapshot::standard("v2", 2000, 0, 9));
    cp.set(Snapshot::standard("v2", 2000, 1000, 9));
    let (code, out, err) = xdstap(&["wait", "--admin", &admin, "--version", "v2"]).await;
    println!("xdstap wait --version v2:\n{out}{err}");
    assert_eq!(code, 1, "a NACK fails the wait");
    assert!(
        out.contains("rejected by 1 node (envoy-3)")
            && out.contains("value must be greater than 0s")
            && out.contains("[suspects: b]"),
        "{out}"
    );
    let r = answered(&admin, "v2", 3).await;
    let (acked, nacked) = recorded(&cp, CDS, "v2");
    assert_eq!(acked, ["envoy-1", "envoy-2"].map(String::from).into());
    assert_eq!(nacked.len(), 1);
    assert_eq!(nacked[0].0, "envoy-3");
    assert_eq!((r.pushed, r.acked, r.nacked, r.pending), (3, 2, 1, 0));
    assert_eq!(r.acked_nodes, ["envoy-1", "envoy-2"]);
    assert_eq!(r.nacks.len(), 1);
    assert_eq!(r.nacks[0].message, nacked[0].1, "Envoy's own text");
    assert_eq!(r.nacks[0].examples, ["envoy-3"]);
    assert_eq!(r.nacks[0].suspects, ["b"]);
    assert_eq!(r.behind[0].node, "envoy-3");
    assert_eq!(r.behind[0].running.as_deref(), Some("v1"), "it kept v1");
    let line = watched.next(20, "the NACK watched");
    let live: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(live["node"], "envoy-3", "{line}");
    assert_eq!(
        (live["type"].as_str(), live["kind"].as_str()),
        (Some("CDS"), Some("NACK"))
    );
    assert_eq!(live["version"], "v2");
    assert_eq!(live["error_message"], nacked[0].1.as_str());
    // `watch --node envoy-1`: envoy-1's answer to v2, and nothing of the others'.
    let line = one.next(20, "envoy-1's answer watched");
    let mine: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (mine["node"].as_str(), mine["version"].as_str()),
        (Some("envoy-1"), Some("v2"))
    );
    assert_eq!(mine["kind"], "ACK", "{line}");
    assert_eq!(one.try_next(1000), None, "only envoy-1's verdicts");

    let (code, out, _) = xdstap(&["rollout", "--admin", &admin, "v2"]).await;
    println!("xdstap rollout v2:\n{out}");
    assert_eq!(code, 1, "a node rejected v2");
    let row = out.lines().find(|l| l.starts_with("CDS ")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[..6], ["CDS", "v2", "3", "2", "1", "0"], "{out}");
    assert!(out.contains("envoy-3") && out.contains("nacked"), "{out}");
    // A version the tap never saw: said so, with the versions it keeps; an unknown type is a
    // usage error naming the flag.
    let (code, out, err) = xdstap(&["rollout", "--admin", &admin, "v99", "-t", "CDS"]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.is_empty(), "no empty table: {out}");
    let kept = err
        .split("versions it keeps, newest first: CDS ")
        .nth(1)
        .unwrap_or("");
    assert!(
        err.contains("has seen version \"v99\" pushed")
            && kept.contains("v2")
            && kept.contains("v1"),
        "{err}"
    );
    let (code, _, err) = xdstap(&["rollout", "--admin", &admin, "-t", "XDS"]).await;
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("'XDS'") && err.contains("--type"), "{err}");
    let (code, out, _) = xdstap(&["rollout", "--admin", &admin, "v1", "-o", "json"]).await;
    assert_eq!(code, 0, "everyone took v1");
    let v1: RolloutReport = serde_json::from_str(&out).unwrap();
    assert!(v1
        .rollouts
        .iter()
        .all(|r| r.nacked == 0 && r.version == "v1"));

    // The fix reaches all three; envoy-4, never pushed v3, is not waited for.
    cp.set_for_node("envoy-3", Snapshot::standard("v3", 3000, 1000, 9));
    cp.set(Snapshot::standard("v3", 3000, 1000, 9));
    let (code, out, err) = xdstap(&["wait", "--admin", &admin, "--version", "v3"]).await;
    println!("xdstap wait --version v3:\n{out}{err}");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("CDS v3: 3 nodes pushed it: 3 acked"), "{out}");
    let (acked, nacked) = recorded(&cp, CDS, "v3");
    assert_eq!(acked.len(), 3);
    assert!(nacked.is_empty() && !acked.contains("envoy-4"));
    let (code, _, err) = xdstap(&[
        "wait",
        "--admin",
        &admin,
        "--version",
        "v9",
        "--timeout",
        "1s",
    ])
    .await;
    assert_eq!(code, 2, "never pushed: a timeout");
    assert!(err.contains("version v9 was never pushed"), "{err}");

    // The control plane restarts while a wait for v4 runs; v4 goes out on the new streams.
    let admin2 = admin.clone();
    let waiting = tokio::spawn(async move {
        xdstap(&[
            "wait",
            "--admin",
            &admin2,
            "--version",
            "v4",
            "--timeout",
            "60s",
        ])
        .await
    });
    cp.stop(server).await;
    cp.set_for_node("envoy-3", Snapshot::standard("v4", 4000, 1000, 9));
    cp.set(Snapshot::standard("v4", 4000, 1000, 9));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listener = tokio::net::TcpListener::bind(&cp_addr).await.unwrap();
    let _server = cp.serve(listener);
    let (code, out, err) = waiting.await.unwrap();
    println!("xdstap wait --version v4 across a restart:\n{out}{err}");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("CDS v4: 3 nodes pushed it: 3 acked"), "{out}");
    // v3 was everyone's before the restart, and still is: a wait for it returns at once.
    let (code, out, err) = xdstap(&[
        "wait",
        "--admin",
        &admin,
        "--version",
        "v3",
        "--type",
        "CDS",
        "--settle",
        "0s",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    // On its new stream the Delta Envoy states what it has; the control plane sends CDS `a`
    // (changed) and not its endpoints (unchanged): a running Envoy holds the CDS answer until
    // its 15 s fetch timeout, and the tap says what for.
    let held: Vec<(Vec<String>, u64)> = (tap.events().into_iter())
        .filter_map(|e| match e {
            Event::Verdict {
                context,
                push,
                waiting_for,
                decided_at,
                ..
            } if context.type_url == CDS && push.version == "v4" && !waiting_for.is_empty() => {
                let node = context.node.map(|n| n.id.clone()).unwrap_or_default();
                assert_eq!(node, "envoy-2", "only the Delta Envoy waits");
                Some((waiting_for, (decided_at - push.at) / 1_000_000))
            }
            _ => None,
        })
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].0, ["a"]);
    assert!(
        (14_000..17_000).contains(&held[0].1),
        "held for Envoy's 15 s fetch timeout: {held:?}"
    );
    let (acked, _) = recorded(&cp, CDS, "v4");
    assert_eq!(acked.len(), 3, "the control plane's record agrees");

    // A client that takes its pushes and never answers: a wait for v5 times out (exit 2),
    // naming it as pending, while the Envoys' answers are in.
    let _mute = mute(&tap.tap.addr, "mute-1").await;
    cp.set_for_node("envoy-3", Snapshot::standard("v5", 5000, 1000, 9));
    cp.set(Snapshot::standard("v5", 5000, 1000, 9));
    let (code, out, err) = xdstap(&[
        "wait",
        "--admin",
        &admin,
        "--version",
        "v5",
        "--type",
        "CDS",
        "--timeout",
        "3s",
    ])
    .await;
    println!("xdstap wait --version v5 with a client that never answers:\n{out}{err}");
    assert_eq!(code, 2, "a timeout: {out}{err}");
    assert!(err.contains("timed out after"), "{err}");
    assert!(
        out.contains("CDS v5: 4 nodes pushed it: 3 acked, 1 pending"),
        "{out}"
    );
    assert!(out.contains("mute-1"), "the pending node named: {out}");
    let (acked, _) = recorded(&cp, CDS, "v5");
    assert_eq!(
        acked.len(),
        3,
        "the control plane has the three Envoys' answers"
    );
    tap.close().await;
}

/// An ADS stream from `node` through the tap at `addr` that subscribes to CDS, reads its first
/// push and never answers; held open while the result lives.
async fn mute(addr: &str, node: &str) -> (h2::SendStream<bytes::Bytes>, h2::RecvStream) {
    const ADS: &str =
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
    let io = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let (resp, mut send) = client
        .send_request(support::raw::request(ADS), false)
        .unwrap();
    send.send_data(support::raw::subscribe(node), false)
        .unwrap();
    let mut body = resp.await.unwrap().into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.data()).await;
    assert!(
        first.is_ok_and(|d| d.is_some_and(|d| d.is_ok())),
        "{node} got no push"
    );
    (send, body)
}
