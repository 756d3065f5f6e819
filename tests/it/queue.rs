//! The event queue at its bound, with the default settings but a small queue: a sink that holds
//! the sinks' thread (as a slow disk would) fills the queue; further events are dropped and
//! counted (the tap's counter and `xdstap_dropped_events` agree), a real Envoy's pushes are
//! forwarded and answered all the while, and once the sink lets go, events flow again.

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::resources::Snapshot;
use support::tap::XdsTap;
use xdstap::correlate::Event;

/// A sink that waits at each event until the gate opens, counting what it is given.
struct Held {
    gate: Arc<(Mutex<bool>, Condvar)>,
    seen: Arc<AtomicU64>,
}

impl xdstap::queue::Sink for Held {
    fn on_event(&mut self, _: &Event) {
        let (open, opened) = &*self.gate;
        let mut open = open.lock().unwrap();
        while !*open {
            open = opened.wait(open).unwrap();
        }
        self.seen.fetch_add(1, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_event_queue_drops_and_counts_and_forwarding_goes_on() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v0", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let seen = Arc::new(AtomicU64::new(0));
    let held = Held {
        gate: gate.clone(),
        seen: seen.clone(),
    };
    let mut config = support::tap::config("127.0.0.1:0", &cp_addr);
    config.event_queue = 16;
    let tap = XdsTap::with_config(config, vec![Box::new(held)]).await;
    let envoy = Envoy::start("node-1", Xds::Tcp(tap.tap.addr.clone()), false).await;
    envoy
        .wait_stat("cluster_manager.cds.update_success", 1, 20)
        .await;
    // Twenty versions, each forwarded and accepted while the sinks' thread is held.
    for i in 1..=20 {
        cp.set(Snapshot::standard(&format!("v{i}"), 1000 + i, 1000, 9));
        envoy
            .wait_stat("cluster_manager.cds.update_success", i as u64 + 1, 20)
            .await;
    }
    // Envoy's last ACK reaches the tap a moment after Envoy counts the update: the count
    // settles once nothing more comes.
    let count = || xdstap::proxy::counter(&tap.stats.dropped_events);
    let dropped = support::eventually_async(10, "the dropped count settling", || async {
        let before = count();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        (count() == before).then_some(before)
    })
    .await;
    assert!(dropped > 0, "the queue of 16 never filled");
    assert_eq!(seen.load(Ordering::Relaxed), 0, "the sink was held");
    let (code, text) = support::http_get(&tap.admin, "/metrics").await;
    assert_eq!(code, 200);
    let metrics = support::prom::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(
        metrics.get("xdstap_dropped_events_total", &[]),
        dropped as f64,
        "the metric is the counter"
    );

    // Let go: the queued events arrive (all of them: the count settles once the queue is
    // empty, nothing else coming), then a new version's, its verdict with them.
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    let delivered = support::eventually_async(20, "the queued events delivered", || async {
        let before = seen.load(Ordering::Relaxed);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let now = seen.load(Ordering::Relaxed);
        (now > 0 && now == before).then_some(now)
    })
    .await;
    cp.set(Snapshot::standard("v21", 1021, 1000, 9));
    support::eventually(20, "the verdict on v21", || {
        (tap.verdicts().iter())
            .any(|v| v.version == "v21" && v.verdict == xdstap::correlate::Verdict::Ack)
            .then_some(())
    })
    .await;
    support::eventually(10, "events flowing again", || {
        (seen.load(Ordering::Relaxed) > delivered).then_some(())
    })
    .await;
    assert_eq!(
        xdstap::proxy::counter(&tap.stats.dropped_events),
        dropped,
        "nothing dropped once the sink keeps up"
    );
    drop(envoy);
    tap.close().await;
}
