//! A slow observer delays no frame: with the observer's thread held on purpose, a real Envoy
//! gets every push through the tap and its answers reach the control plane as quickly as with
//! the observer free, while nothing is decided; once the thread is let go, every verdict comes,
//! stamped with the times the bytes crossed the tap, not the time they were observed.

use crate::support;

use std::time::{Duration, Instant};

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::resources::Snapshot;
use support::tap::XdsTap;
use xdstap::correlate::Verdict;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// Pushes CDS `version` and waits until the control plane has Envoy's ACK of it: the round
/// trip through the tap.
async fn push_and_answer(cp: &ControlPlane, version: u64) -> (String, Duration) {
    let started = Instant::now();
    cp.set(Snapshot::standard(
        &format!("v{version}"),
        1000 + version as i64,
        1000,
        9,
    ));
    let nonce = support::eventually(20, "the CDS push going out", || {
        cp.sent()
            .into_iter()
            .rev()
            .find(|s| s.type_url == CDS && s.version == format!("v{version}"))
            .map(|s| s.nonce)
    })
    .await;
    let answer = support::within(
        20,
        "Envoy's answer through the tap",
        cp.answer_eventually(&nonce),
    )
    .await;
    assert_eq!(answer.error, None, "Envoy accepted v{version}");
    (nonce, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_observer_delays_no_frame_and_decides_everything_once_let_go() {
    let (cp, cp_addr, _server) =
        ControlPlane::listening(Snapshot::standard("v0", 1000, 1000, 9)).await;
    let tap = XdsTap::start(support::tap::TapOptions::new(&cp_addr)).await;
    let envoy = Envoy::start("node-1", Xds::Tcp(tap.tap.addr.clone()), false).await;
    envoy
        .wait_stat("cluster_manager.cds.update_success", 1, 30)
        .await;

    // Free: three pushes, each decided.
    let mut free = Vec::new();
    for v in 1..=3 {
        let (nonce, took) = push_and_answer(&cp, v).await;
        free.push(took);
        support::eventually(10, "the verdict of a push observed freely", || {
            tap.verdicts()
                .iter()
                .any(|x| x.nonce == nonce)
                .then_some(())
        })
        .await;
    }

    // Held: three more, forwarded and answered all the same, nothing decided.
    let held = tap.observer.hold();
    let decided_before = tap.verdicts().len();
    let mut pushed = Vec::new();
    let mut slow = Vec::new();
    for v in 4..=6 {
        let (nonce, took) = push_and_answer(&cp, v).await;
        pushed.push(nonce);
        slow.push(took);
    }
    envoy
        .wait_stat("cluster_manager.cds.update_success", 7, 10)
        .await;
    assert!(
        tap.observer.backlog() > 0,
        "the pushes wait for the held observer"
    );
    assert_eq!(
        tap.verdicts().len(),
        decided_before,
        "nothing decided while held"
    );
    // A held inline observer would hold the frames: no answer would come at all. Here the round
    // trip is the free one's, give or take the machine's noise.
    let worst_free = free.iter().max().copied().unwrap_or_default();
    for took in &slow {
        assert!(
            *took < worst_free * 3 + Duration::from_millis(500),
            "a push while held took {took:?}, the slowest free one {worst_free:?}"
        );
    }
    let dump = envoy.config_dump().await;
    assert!(
        dump.to_string().contains("\"version_info\":\"v6\""),
        "Envoy runs the last push it got while the observer was held"
    );

    // Let go: every held push is decided, ACK, stamped before the release.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = xdstap::now();
    drop(held);
    for nonce in &pushed {
        support::eventually(10, "the verdict of a held push", || {
            tap.verdicts()
                .into_iter()
                .find(|x| &x.nonce == nonce)
                .map(|x| assert_eq!(x.verdict, Verdict::Ack, "push {nonce}"))
        })
        .await;
    }
    let stamped: Vec<_> = tap
        .events()
        .into_iter()
        .filter_map(|e| match e {
            xdstap::correlate::Event::Verdict {
                push, decided_at, ..
            } if pushed.contains(&push.nonce) => Some((push.at, decided_at)),
            _ => None,
        })
        .collect();
    assert_eq!(stamped.len(), pushed.len(), "one verdict per push");
    for (at, decided) in stamped {
        assert!(
            at < released && decided < released,
            "stamped when the bytes went by"
        );
    }
    assert_eq!(tap.observer.backlog(), 0, "the observer caught up");
}
