//! The control plane goes away and comes back 50 times while pushing new versions to three real
//! Envoys through one tap: every Envoy reconnects through the tap, resubscribes stating what it
//! has, and ends SYNCED on the last version; every verdict the tap gave agrees with what the
//! control plane recorded of Envoy's answers.

mod support;

use std::time::Duration;

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::resources::{Snapshot, CDS};
use support::tap::{TapOptions, XdsTap};
use xdstap::correlate::{Event, Verdict};
use xdstap::observe::status::{StatusBoard, StatusSettings, SyncState};

const RESTARTS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_control_plane_restarts_under_three_envoys() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v0", 1000, 1000, 9));
    let mut server = cp.serve(listener);
    let status = StatusBoard::new(StatusSettings::default());
    let tap = XdsTap::with_sinks(TapOptions::new(&cp_addr), vec![Box::new(status.clone())]).await;
    let nodes = ["node-1", "node-2", "node-3"];
    let mut envoys = Vec::new();
    for n in nodes {
        envoys.push(Envoy::start(n, Xds::Tcp(tap.tap.addr.clone()), false).await);
    }
    for e in &envoys {
        e.wait_stat("cluster_manager.cds.update_success", 1, 30)
            .await;
    }

    for i in 1..=RESTARTS {
        // A new version goes out, and the control plane stops right behind it.
        cp.set(Snapshot::standard(
            &format!("v{i}"),
            1000 + i as i64,
            1000,
            9,
        ));
        tokio::time::sleep(Duration::from_millis(5)).await;
        cp.stop(server).await;
        let listener = tokio::net::TcpListener::bind(&cp_addr).await.unwrap();
        server = cp.serve(listener);
        // Every Envoy is back on the new control plane before the next kill.
        let want = (i + 1) * nodes.len();
        support::eventually(30, "the Envoys to resubscribe", || {
            let resubscribed = tap
                .events()
                .iter()
                .filter(|e| matches!(e, Event::Resubscribe { at, .. } if at.type_url == CDS))
                .count();
            (resubscribed + nodes.len() >= want).then_some(())
        })
        .await;
    }

    // The last version: every node SYNCED on it.
    let last = format!("v{}", RESTARTS + 1);
    cp.set(Snapshot::standard(&last, 5000, 1000, 9));
    support::eventually(60, "every Envoy SYNCED on the last version", || {
        let r = status.report(xdstap::tap::now(), None);
        let synced = r
            .nodes
            .iter()
            .filter(|n| {
                n.types.iter().any(|t| {
                    t.short_type == "CDS"
                        && t.state == SyncState::Synced
                        && t.version_accepted.as_deref() == Some(last.as_str())
                })
            })
            .count();
        (synced == nodes.len()).then_some(())
    })
    .await;

    // No wrong verdict: ACKs and NACKs match the answers the control plane recorded; an
    // unanswered push has no answer on record.
    let verdicts: Vec<_> = tap
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Verdict { push, verdict, .. } => Some((push.nonce.clone(), verdict)),
            _ => None,
        })
        .collect();
    // The last push of each type on each control-plane stream: Envoy's answer to it can reach
    // the tap just as the control plane ends the stream, and never reach the control plane.
    let sent = cp.sent();
    let mut last_on_stream = std::collections::HashMap::new();
    for s in &sent {
        last_on_stream.insert((s.stream, s.type_url.clone()), s.nonce.clone());
    }
    let last: std::collections::HashSet<String> = last_on_stream.into_values().collect();
    let mut unanswered = 0;
    let mut acks = 0;
    let mut unheard = 0;
    for (nonce, verdict) in &verdicts {
        let answer = cp.answer_to(nonce);
        match verdict {
            Verdict::Ack => {
                acks += 1;
                match answer {
                    Some(a) => assert!(a.error.is_none(), "tap says ack, Envoy nacked {nonce}"),
                    None => {
                        assert!(
                            last.contains(nonce),
                            "ack of {nonce}, which the control plane never heard and was not \
                             the last push of its stream"
                        );
                        unheard += 1;
                    }
                }
            }
            Verdict::Nack { .. } => panic!("nothing here is rejected: {nonce}"),
            Verdict::Unanswered { .. } => {
                unanswered += 1;
                assert!(answer.is_none(), "answered push {nonce} called unanswered");
            }
            Verdict::Superseded { .. } => {}
        }
    }
    let resubscribes = tap
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Resubscribe { .. }))
        .count();
    println!(
        "{RESTARTS} restarts x {} Envoys: {} verdicts ({acks} ack, {unheard} of them sent as the \
         control plane was closing the stream, {unanswered} unanswered), {resubscribes} resubscribes",
        nodes.len(),
        verdicts.len()
    );
    assert!(resubscribes >= RESTARTS * nodes.len());
    drop(envoys);
}
