//! The control plane dies and comes back 50 times while pushing new versions to three real
//! Envoys through one tap: every Envoy reconnects through the tap, resubscribes stating what it
//! has, and ends SYNCED on the last version; every verdict the tap gave agrees with what the
//! control plane recorded of Envoy's answers. The tap reaches the control plane through a relay
//! that "kills" it by resetting every connection and refusing new ones, then "restarts" it;
//! the control plane keeps its snapshot, as a restarted one would serve the same config.

use crate::support;

use std::time::Duration;

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::resources::{Snapshot, CDS};
use support::tap::{TapOptions, XdsTap};
use xdstap::api::v1::SyncState;
use xdstap::correlate::{Event, Verdict};
use xdstap::views::board::{StatusBoard, StatusSettings};

const RESTARTS: usize = 50;

/// A TCP relay in front of the control plane that can die abruptly (every connection reset)
/// and come back on the same address.
struct Relay {
    addr: String,
    target: String,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Relay {
    async fn start(addr: &str, target: &str) -> Relay {
        let mut r = Relay {
            addr: addr.into(),
            target: target.into(),
            task: None,
        };
        r.up().await;
        r
    }

    async fn up(&mut self) {
        let listener = tokio::net::TcpListener::bind(&self.addr).await.unwrap();
        self.addr = listener.local_addr().unwrap().to_string();
        let target = self.target.clone();
        self.task = Some(tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut down, _)) = listener.accept().await {
                let target = target.clone();
                conns.spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                    // Aborted with the relay: the sockets close under both peers at once.
                });
            }
            drop(conns);
        }));
        // (aborting the task drops `conns`, which aborts every relayed connection)
    }

    /// Every relayed connection is dropped at once, and nothing listens until [`Relay::up`].
    async fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_control_plane_restarts_under_three_envoys() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v0", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let mut relay = Relay::start("127.0.0.1:0", &cp_addr).await;
    let status = StatusBoard::new(StatusSettings::default());
    let tap =
        XdsTap::with_sinks(TapOptions::new(&relay.addr), vec![Box::new(status.clone())]).await;
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
        // A new version goes out, and the control plane dies right behind it.
        cp.set(Snapshot::standard(
            &format!("v{i}"),
            1000 + i as i64,
            1000,
            9,
        ));
        tokio::time::sleep(Duration::from_millis(5)).await;
        relay.kill().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        relay.up().await;
        // Every Envoy is back on the new control plane before the next kill.
        let want = (i + 1) * nodes.len();
        support::eventually(30, "the Envoys to resubscribe", || {
            let resubscribed = tap
                .events()
                .iter()
                .filter(
                    |e| matches!(e, Event::Resubscribe { context, .. } if context.type_url == CDS),
                )
                .count();
            (resubscribed + nodes.len() >= want).then_some(())
        })
        .await;
    }

    // The last version: every node SYNCED on it.
    let last = format!("v{}", RESTARTS + 1);
    cp.set(Snapshot::standard(&last, 5000, 1000, 9));
    support::eventually(60, "every Envoy SYNCED on the last version", || {
        let r = status.report(xdstap::now(), None);
        let synced = r
            .nodes
            .iter()
            .filter(|n| {
                n.types.iter().any(|t| {
                    t.r#type == "CDS"
                        && t.state() == SyncState::Synced
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
    // An answer can reach the tap and die with the relay before the control plane reads it.
    // Answers travel in order on a stream, so then the control plane heard no answer to any
    // later push of that stream and type either: the answer was in the stream's lost tail.
    let sent = cp.sent();
    let in_lost_tail = |nonce: &str| {
        let Some(i) = sent.iter().position(|s| s.nonce == nonce) else {
            return false;
        };
        let (stream, type_url) = (sent[i].stream, &sent[i].type_url);
        !sent[i + 1..].iter().any(|s| {
            s.stream == stream && &s.type_url == type_url && cp.answer_to(&s.nonce).is_some()
        })
    };
    let mut unanswered = 0;
    let mut superseded = 0;
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
                            in_lost_tail(nonce),
                            "ack of {nonce}, which the control plane never heard, though it \
                             heard the answer to a later push of that stream"
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
            Verdict::Superseded { .. } => {
                superseded += 1;
                assert!(answer.is_none(), "answered push {nonce} called superseded");
            }
        }
    }
    let resubscribes = tap
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Resubscribe { .. }))
        .count();
    println!(
        "{RESTARTS} restarts x {} Envoys: {} verdicts ({acks} ack, {unheard} of them answered as the \
         control plane died, {unanswered} unanswered, {superseded} superseded), {resubscribes} resubscribes",
        nodes.len(),
        verdicts.len()
    );
    assert!(resubscribes >= RESTARTS * nodes.len());
    drop(envoys);
}
