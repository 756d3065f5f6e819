//! Two taps asked as one, with four real Envoys (two through each; envoy-4 alone is pushed a
//! cluster it rejects): `xdstap status`, `rollout`, `wait` and `watch` over both taps, given as a
//! repeated `--admin`, as a comma-separated list, and as one name that resolves to both (the
//! taps' admin servers on 127.0.0.1 and ::1 at one port, the name in a private /etc/hosts of a
//! mount namespace, so the machine's own file is untouched). Each answer equals the union of
//! what each tap says of its own and the control plane's record. A node that reconnects through
//! the other tap is one row, its newest stream's view first. With one tap stopped, every
//! command names it and none exits as if the answer were complete.

use crate::support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::resources::{Snapshot, CDS};
use support::tap::XdsTap;
use support::xdstap;
use xdstap::api::v1::{RolloutReport, StatusReport, SyncState};

/// A port free on both 127.0.0.1 and ::1.
fn shared_port() -> u16 {
    for _ in 0..100 {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = v4.local_addr().unwrap().port();
        if std::net::TcpListener::bind(("::1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free on both loopback addresses");
}

/// A tap whose admin server listens on `admin`.
async fn tap_at(cp: &str, admin: &str) -> XdsTap {
    XdsTap::with_flags(&[
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        cp,
        "--admin",
        admin,
    ])
    .await
}

/// Each node's worst state as one tap's own `/status` gives it.
async fn own_states(admin: &str) -> BTreeMap<String, SyncState> {
    (support::status(admin).await.nodes.into_iter())
        .map(|n| (n.id.clone(), n.state()))
        .collect()
}

/// Waits until every tap's own view has CDS `version` answered by all its nodes.
async fn answered(admins: &[&str], version: &str, nodes: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut total = 0;
        for admin in admins {
            let (_, body) =
                support::http_get(admin, &format!("/rollouts?version={version}&type=CDS")).await;
            let r: RolloutReport = serde_json::from_str(&body).unwrap();
            total += (r.rollouts.iter()).map(|r| r.acked + r.nacked).sum::<u64>();
        }
        if total >= nodes {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "CDS {version}: {total} of {nodes} answers"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `xdstap ARGS` with `name` resolving to 127.0.0.1 and ::1 only for it: in a mount namespace
/// of its own, over a private copy of /etc/hosts (root or CAP_SYS_ADMIN, as in CI here).
async fn xdstap_resolving(name: &str, args: &[&str]) -> (i32, String, String) {
    let dir = support::TempDir::new("fleet-hosts");
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, format!("127.0.0.1 {name}\n::1 {name}\n")).unwrap();
    let mut script = format!(
        "mount --bind '{}' /etc/hosts && exec '{}'",
        hosts.display(),
        env!("CARGO_BIN_EXE_xdstap")
    );
    for a in args {
        script.push_str(&format!(" '{a}'"));
    }
    let out = tokio::task::spawn_blocking(move || {
        Command::new("unshare")
            .args(["--mount", "sh", "-c", &script])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        !err.contains("unshare failed") && !err.contains("mount:"),
        "a name for both taps needs a mount namespace (root or CAP_SYS_ADMIN): {err}"
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        err,
    )
}

/// The next `n` CDS events from a JSON watch: (node, kind, version, tap).
fn next_cds(out: &support::Lines, n: usize) -> Vec<(String, String, String, String)> {
    let mut seen = Vec::new();
    while seen.len() < n {
        let line = out.next(20, "a CDS event watched");
        let e: serde_json::Value = serde_json::from_str(&line).unwrap();
        if e["type"] != "CDS" {
            continue;
        }
        let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
        seen.push((s("node"), s("kind"), s("version"), s("tap")));
    }
    seen.sort();
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_taps_answer_as_one_and_a_stopped_one_is_named() {
    let (cp, cp_addr, _server) =
        ControlPlane::listening(Snapshot::standard("v1", 1000, 1000, 9)).await;
    let port = shared_port();
    let (a_admin, b_admin) = (format!("127.0.0.1:{port}"), format!("[::1]:{port}"));
    let a = tap_at(&cp_addr, &a_admin).await;
    let b = tap_at(&cp_addr, &b_admin).await;
    let (a_admin, b_admin) = (a.admin.clone(), b.admin.clone());
    let through = |t: &XdsTap| Xds::Tcp(t.tap.addr.clone());
    let mut e1 = Some(Envoy::start("envoy-1", through(&a), false).await);
    let _e2 = Envoy::start("envoy-2", through(&a), true).await;
    let _e3 = Envoy::start("envoy-3", through(&b), false).await;
    let _e4 = Envoy::start("envoy-4", through(&b), true).await;
    answered(&[&a_admin, &b_admin], "v1", 4).await;

    // v2: envoy-4 alone gets a cluster it rejects.
    cp.set_for_node("envoy-4", Snapshot::standard("v2", 2000, 0, 9));
    cp.set(Snapshot::standard("v2", 2000, 1000, 9));
    let (code, out, err) = xdstap(&[
        "wait",
        "--admin",
        &a_admin,
        "--admin",
        &b_admin,
        "--version",
        "v2",
    ])
    .await;
    println!("xdstap wait over both:\n{out}{err}");
    assert_eq!(
        code, 1,
        "envoy-4's NACK, seen through the other tap, fails the wait"
    );
    assert!(out.contains("rejected by 1 node (envoy-4)"), "{out}");
    answered(&[&a_admin, &b_admin], "v2", 4).await;

    // status, three ways of naming both taps: one answer, the union of each tap's own.
    let list = format!("{a_admin},{b_admin}");
    let name = format!("taps.test:{port}");
    // Each tap's own view, once every answer is in: envoy-4 NACKED, the others SYNCED.
    let settled = |own: &BTreeMap<String, SyncState>| {
        own.len() == 4
            && own.iter().all(|(id, s)| match id.as_str() {
                "envoy-4" => *s == SyncState::Nacked,
                _ => *s == SyncState::Synced,
            })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let own = loop {
        let mut own = own_states(&a_admin).await;
        own.extend(own_states(&b_admin).await);
        if settled(&own) {
            break own;
        }
        assert!(std::time::Instant::now() < deadline, "{own:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let by_name = xdstap_resolving("taps.test", &["status", "--admin", &name, "-o", "json"]).await;
    for (how, (code, out, err)) in [
        (
            "repeated",
            xdstap(&[
                "status", "--admin", &a_admin, "--admin", &b_admin, "-o", "json",
            ])
            .await,
        ),
        (
            "a list",
            xdstap(&["status", "--admin", &list, "-o", "json"]).await,
        ),
        ("a name", by_name),
    ] {
        assert_eq!(code, 1, "{how}: envoy-4 is NACKED: {err}");
        let r: StatusReport = serde_json::from_str(&out).unwrap();
        let states: BTreeMap<String, SyncState> =
            r.nodes.iter().map(|n| (n.id.clone(), n.state())).collect();
        assert_eq!(states, own, "{how}");
        assert_eq!(r.taps.len(), 2, "{how}: {:?}", r.taps);
        assert!(
            r.taps.iter().all(|t| t.error.is_empty()),
            "{how}: {:?}",
            r.taps
        );
        let tap_of = |id: &str| r.nodes.iter().find(|n| n.id == id).unwrap().taps.clone();
        assert_eq!(tap_of("envoy-1"), vec![a_admin.as_str()], "{how}");
        assert_eq!(tap_of("envoy-4"), vec![b_admin.as_str()], "{how}");
    }
    // The names resolve to each address; the table says which tap sees whom.
    let (_, out, _) = xdstap_resolving("taps.test", &["status", "--admin", &name]).await;
    println!("xdstap status --admin {name}:\n{out}");
    let row = |id: &str| out.lines().find(|l| l.starts_with(id)).unwrap().to_string();
    assert!(
        row("envoy-1").ends_with(&format!("127.0.0.1:{port}")),
        "{out}"
    );
    assert!(
        row("envoy-4").contains("NACKED") && row("envoy-4").ends_with(&format!("[::1]:{port}")),
        "{out}"
    );
    // The control plane's record: envoy-4 rejected v2, the others took it.
    let nacked: Vec<String> = (cp.sent().into_iter())
        .filter(|s| s.type_url == CDS && s.version == "v2")
        .filter(|s| cp.answer_to(&s.nonce).is_some_and(|a| a.error.is_some()))
        .filter_map(|s| s.node)
        .collect();
    assert_eq!(nacked, ["envoy-4"]);

    // rollout: the nodes counted once, summed over the taps; the NACK in Envoy's words.
    let (code, out, _) =
        xdstap(&["rollout", "--admin", &list, "v2", "-t", "CDS", "-o", "json"]).await;
    assert_eq!(code, 1);
    let merged: RolloutReport = serde_json::from_str(&out).unwrap();
    let r = &merged.rollouts[0];
    assert_eq!(
        (r.pushed, r.acked, r.nacked, r.pending),
        (4, 3, 1, 0),
        "{r:?}"
    );
    assert_eq!(r.nacks[0].examples, ["envoy-4"]);
    let message = cp
        .sent()
        .into_iter()
        .find(|s| s.node.as_deref() == Some("envoy-4") && s.version == "v2" && s.type_url == CDS)
        .and_then(|s| cp.answer_to(&s.nonce))
        .and_then(|a| a.error)
        .unwrap()
        .1;
    assert_eq!(r.nacks[0].message, message);
    let mut summed = (0, 0, 0);
    for admin in [&a_admin, &b_admin] {
        let (_, body) = support::http_get(admin, "/rollouts?version=v2&type=CDS").await;
        let own: RolloutReport = serde_json::from_str(&body).unwrap();
        let o = &own.rollouts[0];
        summed = (summed.0 + o.pushed, summed.1 + o.acked, summed.2 + o.nacked);
    }
    assert_eq!(
        summed,
        (r.pushed, r.acked, r.nacked),
        "no node is on both taps yet"
    );
    let (code, out, _) = xdstap(&[
        "rollout", "--admin", &a_admin, "--admin", &b_admin, "v2", "-t", "CDS",
    ])
    .await;
    println!("xdstap rollout v2 over both:\n{out}");
    assert_eq!(code, 1);
    assert!(
        out.contains("envoy-4") && out.contains(&format!("[::1]:{port}")),
        "{out}"
    );

    // watch: both taps' verdicts interleaved, each marked with its tap.
    let (_watch, watched, said) = support::watching(
        &["--admin", &list, "-o", "json", "--verdict", "ack,nack"],
        2,
    );
    assert!(said.contains(&a_admin) && said.contains(&b_admin), "{said}");
    cp.set_for_node("envoy-4", Snapshot::standard("v3", 3000, 1000, 9));
    cp.set(Snapshot::standard("v3", 3000, 1000, 9));
    let seen = next_cds(&watched, 4);
    let expect = |n: &str, t: &str| {
        (
            n.to_string(),
            "ACK".to_string(),
            "v3".to_string(),
            t.to_string(),
        )
    };
    assert_eq!(
        seen,
        [
            expect("envoy-1", &a_admin),
            expect("envoy-2", &a_admin),
            expect("envoy-3", &b_admin),
            expect("envoy-4", &b_admin)
        ]
    );
    let (code, out, err) = xdstap(&["wait", "--admin", &list, "--version", "v3"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("CDS v3: 4 nodes pushed it: 4 acked"), "{out}");
    // envoy-4 took v3: v2's NACK is history, and the exit code says so.
    let (code, out, _) = xdstap(&["rollout", "--admin", &list, "-t", "CDS"]).await;
    assert_eq!(code, 0, "envoy-4 has moved on to v3:\n{out}");
    assert!(out.contains("took a newer version since"), "{out}");

    // envoy-1 reconnects through the other tap: one row, the newer stream's view first.
    e1.take();
    let _e1 = Envoy::start("envoy-1", through(&b), false).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !own_states(&b_admin).await.contains_key("envoy-1") {
        assert!(
            std::time::Instant::now() < deadline,
            "envoy-1 never reached tap B"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, out, _) = xdstap(&["status", "--admin", &list, "-o", "json"]).await;
    let r: StatusReport = serde_json::from_str(&out).unwrap();
    let n1: Vec<_> = r.nodes.iter().filter(|n| n.id == "envoy-1").collect();
    assert_eq!(n1.len(), 1, "{out}");
    assert!(n1[0].connected, "{out}");
    assert_eq!(n1[0].taps, [b_admin.clone(), a_admin.clone()], "{out}");
    assert_eq!(n1[0].elsewhere.len(), 1);
    assert!(
        !n1[0].elsewhere[0].connected,
        "tap A's view: the old stream, gone"
    );
    let (_, wide, _) = xdstap(&["status", "--admin", &list, "-o", "wide"]).await;
    println!("xdstap status -o wide over both:\n{wide}");
    assert!(
        wide.contains(&format!("envoy-1 as {a_admin} sees it (disconnected")),
        "{wide}"
    );

    // Tap B stops: every command names it, and none exits 0 as if complete.
    b.close().await;
    let (code, out, err) = xdstap(&["status", "--admin", &list]).await;
    println!("xdstap status with {b_admin} down:\n{out}{err}");
    assert_eq!(code, 4, "{out}{err}");
    assert!(
        out.contains("PARTIAL: 1 of 2 taps did not answer") && out.contains(&b_admin),
        "{out}"
    );
    assert!(
        err.contains("partial answer") && err.contains(&b_admin),
        "{err}"
    );
    let (code, out, err) = xdstap(&["rollout", "--admin", &list, "-t", "CDS"]).await;
    assert_eq!(code, 4, "{out}{err}");
    assert!(out.contains(&b_admin), "{out}");
    let (code, out, err) = xdstap(&[
        "wait",
        "--admin",
        &list,
        "--version",
        "v3",
        "--timeout",
        "2s",
    ])
    .await;
    println!("xdstap wait with {b_admin} down:\n{out}{err}");
    assert_eq!(
        code, 4,
        "what tap A sees is done, what B holds is not known: {out}{err}"
    );
    assert!(
        err.contains(&b_admin) && out.contains(&b_admin),
        "{out}{err}"
    );
    let (code, out, err) = xdstap(&["status", "--admin", &b_admin]).await;
    assert_eq!(code, 69, "no tap answered: {out}{err}");
    let (_watch, watched, said) = support::watching(
        &["--admin", &list, "-o", "json", "-t", "CDS", "--count", "1"],
        2,
    );
    assert!(
        said.contains(&format!("not watching the tap at {b_admin}")),
        "{said}"
    );
    cp.set(Snapshot::standard("v4", 4000, 1000, 9));
    next_cds(&watched, 1);
    let mut watch = _watch;
    let status = watch.0.wait().unwrap();
    assert_eq!(status.code(), Some(4), "a watch missing a tap is partial");
    a.close().await;
}
