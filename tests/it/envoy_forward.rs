//! Real Envoy -> xdstap -> scripted control plane, SotW ADS and Delta ADS, over TCP and over a
//! Unix socket: Envoy gets its config through the tap.

use crate::support;

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::resources::Snapshot;
use support::tap::{Tap, TapOptions};
use xdstap::proxy::Endpoint;

async fn run(delta: bool, unix: bool) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let dir = support::TempDir::new("fwd");
    let mut options = TapOptions::new(&cp_addr);
    if unix {
        options.listen = Endpoint::Unix(dir.path().join("xds.sock"));
    }
    let tap = Tap::with(options).await;
    let xds = if unix {
        Xds::Unix(dir.path().join("xds.sock"))
    } else {
        Xds::Tcp(tap.addr.clone())
    };
    let envoy = Envoy::start("node-fwd", xds, delta).await;
    envoy
        .wait_stat("cluster_manager.cds.update_success", 1, 30)
        .await;
    envoy
        .wait_stat("listener_manager.lds.update_success", 1, 30)
        .await;
    let clusters = envoy.clusters().await;
    assert!(clusters.contains("a::"), "cluster a missing:\n{clusters}");
    assert!(
        clusters.contains("b::127.0.0.1:9"),
        "cluster b endpoints missing:\n{clusters}"
    );
    assert!(xdstap::proxy::counter(&tap.stats.streams_total) >= 1);
    assert!(cp.requests().iter().all(|r| r.delta == delta));
    assert!(cp
        .requests()
        .iter()
        .any(|r| r.node.as_deref() == Some("node-fwd")));
}

#[tokio::test]
async fn envoy_sotw_over_tcp() {
    run(false, false).await;
}

#[tokio::test]
async fn envoy_delta_over_tcp() {
    run(true, false).await;
}

#[tokio::test]
async fn envoy_sotw_over_unix_socket() {
    run(false, true).await;
}

#[tokio::test]
async fn envoy_delta_over_unix_socket() {
    run(true, true).await;
}
