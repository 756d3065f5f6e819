//! Why a push is late: a running Envoy holds its answer to a CDS push until every cluster the
//! push adds has its endpoints. A push with a cluster whose endpoints (EDS) never come: while
//! Envoy holds the ACK (its own stats say the cluster is warming, the control plane has no
//! answer), the tap's `/status`, `xdstap status` and the rollout view name the cluster; when
//! Envoy gives up waiting (the cluster's `initial_fetch_timeout`) and ACKs, the push's span says
//! what it waited for.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::otlp::Receiver;
use support::resources::{warming_cluster, Snapshot, CDS};
use support::tap::{TapOptions, XdsTap};
use support::xdstap;
use xdstap::api::v1::{StatusReport, SyncState, TypeStatus};
use xdstap::outputs::spans::{Protocol, SpanSettings, SpanStats};

fn cds(r: &StatusReport) -> Option<TypeStatus> {
    let node = r.nodes.iter().find(|n| n.id == "node-1")?;
    node.types.iter().find(|t| t.r#type == "CDS").cloned()
}

async fn status_until(admin: &str, what: &str, f: impl Fn(&TypeStatus) -> bool) -> TypeStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = crate::support::status(admin).await;
        if let Some(t) = cds(&r).filter(|t| f(t)) {
            return t;
        }
        assert!(std::time::Instant::now() < deadline, "never {what}: {r:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cds_push_held_for_endpoints_that_never_come() {
    const FETCH_TIMEOUT_MS: i64 = 3000;
    let receiver = Receiver::grpc().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let settings = SpanSettings {
        endpoint: Some(receiver.endpoint.clone()),
        protocol: Protocol::Grpc,
        interval: Duration::from_millis(100),
        ..Default::default()
    };
    let (sink, _export) =
        xdstap::outputs::spans::start(settings, Arc::new(SpanStats::default())).unwrap();
    let tap = XdsTap::with_sinks(TapOptions::new(&cp_addr), vec![Box::new(sink)]).await;
    let envoy = Envoy::start("node-1", Xds::Tcp(tap.tap.addr.clone()), false).await;
    status_until(&tap.admin, "SYNCED on v1", |t| {
        t.state() == SyncState::Synced && t.version_accepted.as_deref() == Some("v1")
    })
    .await;
    assert!(cds(&crate::support::status(&tap.admin).await)
        .unwrap()
        .waiting_for
        .is_empty());

    // v2 adds cluster `w`; the control plane has no endpoints for it.
    let v2 =
        Snapshot::standard("v2", 1000, 1000, 9).with(CDS, warming_cluster("w", FETCH_TIMEOUT_MS));
    cp.set(v2);
    let held = status_until(&tap.admin, "naming the warming cluster", |t| {
        t.waiting_for == ["w"]
    })
    .await;
    assert_eq!(held.version_sent.as_deref(), Some("v2"));
    assert_eq!(
        held.version_accepted.as_deref(),
        Some("v1"),
        "not answered yet"
    );
    // Envoy's own word: the cluster is warming and the control plane has no answer.
    assert_eq!(
        envoy.stat("cluster_manager.warming_clusters").await,
        Some(1)
    );
    let nonce = held.nonce.clone().unwrap();
    assert!(cp.answer_to(&nonce).is_none(), "Envoy holds its answer");
    let (_, out, _) = xdstap(&["status", "--admin", &tap.admin]).await;
    println!("xdstap status while Envoy holds the CDS answer:\n{out}");
    assert!(
        out.contains("node-1 CDS: push v2 unanswered since")
            && out.contains("waits for the endpoints (EDS) of w"),
        "{out}"
    );
    let (_, out, _) = xdstap(&["rollout", "--admin", &tap.admin, "v2", "--type", "CDS"]).await;
    println!("xdstap rollout v2 --type CDS:\n{out}");
    assert!(
        out.contains("pending") && out.contains("endpoints of w"),
        "{out}"
    );

    // Envoy gives up waiting and ACKs: the span says what the push waited for.
    let answer = cp.answer_eventually(&nonce).await;
    assert!(answer.error.is_none(), "an ACK after the fetch timeout");
    let span = crate::support::eventually(30, "the span of CDS v2", || {
        (receiver.spans().into_iter()).find(|s| {
            s.text("xds.type").as_deref() == Some("CDS")
                && s.text("xds.version").as_deref() == Some("v2")
        })
    })
    .await;
    assert_eq!(span.text("xds.verdict").as_deref(), Some("ack"));
    assert_eq!(span.strings("xds.waiting_for"), ["w"]);
    let held_ms = (span.span.end_time_unix_nano - span.span.start_time_unix_nano) / 1_000_000;
    assert!(
        held_ms as i64 >= FETCH_TIMEOUT_MS - 500,
        "the push took Envoy's fetch timeout: {held_ms} ms"
    );
    let after = status_until(&tap.admin, "SYNCED on v2", |t| {
        t.version_accepted.as_deref() == Some("v2")
    })
    .await;
    assert!(after.waiting_for.is_empty());
    tap.close().await;
}
