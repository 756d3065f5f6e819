//! A control plane that is down must look the same to a client through the tap as without it:
//! the tap closes each client connection before its own HTTP/2 handshake, so every client
//! applies its own connection backoff. A real proxyless gRPC client (grpcio 1.85, C-core) and a
//! real Envoy run through the tap while the control plane is down for 5 s; beside them, a
//! second grpcio client and a second Envoy dial a port where nothing listens. Through the tap
//! (one each, so the tap's count of accepted connections is that client's attempts), each makes
//! at most twice the connection attempts of its twin against the refused port (each twin counted
//! over as long a time from its own first attempt), and the clients' own counts agree; grpcio's
//! memory grows by less than 50 MB, and once the control plane is back both resync within 5 s. (A tap that completed the
//! handshake and answered UNAVAILABLE had grpcio retry without backoff.)
//!
//! Attempts are counted by the clients themselves: grpcio's subchannel trace
//! (`GRPC_TRACE=subchannel`, a "connect failed" line per failed attempt) and Envoy's
//! `cluster.xds.upstream_cx_total`.

use crate::support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::grpc::api_listener;
use support::resources::{cluster, endpoints, Snapshot, CDS, EDS, LDS};
use support::tap::{TapOptions, XdsTap};
use xdstap::proxy::counter;

const OUTAGE: Duration = Duration::from_secs(5);

/// What grpcio's proxyless client subscribes to: `svc`'s API listener, its clusters and their
/// endpoints.
fn proxyless(version: &str) -> Snapshot {
    Snapshot::new(version)
        .with(LDS, api_listener())
        .with(CDS, cluster("c1", 1000))
        .with(CDS, cluster("c2", 1000))
        .with(EDS, endpoints("c1", 9))
        .with(EDS, endpoints("c2", 9))
}

/// Failed connection attempts grpcio has logged so far.
fn grpc_attempts(trace: &std::path::Path) -> usize {
    let text = std::fs::read_to_string(trace).unwrap_or_default();
    text.matches("connect failed").count()
}

/// Connection attempts Envoy has made to its xDS cluster so far.
async fn envoy_attempts(envoy: &Envoy) -> u64 {
    envoy
        .stat("cluster.xds.upstream_cx_total")
        .await
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    (status.lines())
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until `node` has ACKed a CDS push the control plane sent after its `from`th push.
async fn resynced(cp: &ControlPlane, node: &str, from: usize) {
    support::eventually(
        15,
        &format!("{node} to ACK a push after the restart"),
        || {
            let sent = cp.sent();
            (sent[from.min(sent.len())..].iter())
                .filter(|s| s.type_url == CDS && s.node.as_deref() == Some(node))
                .find_map(|s| cp.answer_to(&s.nonce).filter(|a| a.error.is_none()))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_back_off_through_the_tap_as_they_do_without_it() {
    let (cp, cp_addr, server) = ControlPlane::listening(proxyless("1")).await;
    cp.set_for_node("envoy-tap", Snapshot::standard("1", 1000, 1000, 9));
    let tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let envoy_tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let refused = support::free_addr();
    let dir = support::TempDir::new("outage");
    let trace = [("GRPC_TRACE", "subchannel"), ("GRPC_VERBOSITY", "debug")];
    let log = |name: &str| {
        let path = dir.path().join(name);
        (Stdio::from(std::fs::File::create(&path).unwrap()), path)
    };
    let (stderr, tap_trace) = log("grpc-tap.log");
    let grpc = support::grpc::start(dir.path(), &tap.tap.addr, "grpc-tap", stderr, &trace);
    let envoy = Envoy::start("envoy-tap", Xds::Tcp(envoy_tap.tap.addr.clone()), false).await;
    resynced(&cp, "grpc-tap", 0).await;
    resynced(&cp, "envoy-tap", 0).await;

    // The control plane goes down; the twins start against a port where nothing listens.
    let accepted = |tap: &XdsTap| counter(&tap.tap.stats.connections_total);
    let failed = |tap: &XdsTap| counter(&tap.tap.stats.upstream_connect_errors);
    let before = [&tap, &envoy_tap].map(|t| (accepted(t), failed(t)));
    let (grpc_before, envoy_before) = (grpc_attempts(&tap_trace), envoy_attempts(&envoy).await);
    let rss_before = rss_kib(grpc.id());
    cp.stop(server).await;
    let t0 = Instant::now();
    let (stderr, refused_trace) = log("grpc-refused.log");
    let _grpc_refused = support::grpc::start(dir.path(), &refused, "grpc-refused", stderr, &trace);
    let envoy_refused = Envoy::start("envoy-refused", Xds::Tcp(refused.clone()), false).await;
    // The clients through the tap are counted over OUTAGE from the outage, each twin over
    // OUTAGE from its own first attempt: a twin slow to start (grpcio's interpreter on a busy
    // machine) gets a window as long.
    let through_tap = async {
        tokio::time::sleep(OUTAGE.saturating_sub(t0.elapsed())).await;
        let counts = [(&tap, before[0]), (&envoy_tap, before[1])]
            .map(|(t, (a, f))| (accepted(t) - a, failed(t) - f));
        let own = (
            grpc_attempts(&tap_trace) - grpc_before,
            envoy_attempts(&envoy).await - envoy_before,
        );
        (counts, own, rss_kib(grpc.id()).saturating_sub(rss_before))
    };
    let grpc_twin = async {
        support::eventually(30, "grpcio's first attempt at the refused port", || {
            (grpc_attempts(&refused_trace) > 0).then_some(())
        })
        .await;
        tokio::time::sleep(OUTAGE).await;
        grpc_attempts(&refused_trace)
    };
    let envoy_twin = async {
        support::eventually_async(30, "Envoy's first attempt at the refused port", || async {
            (envoy_attempts(&envoy_refused).await > 0).then_some(())
        })
        .await;
        tokio::time::sleep(OUTAGE).await;
        envoy_attempts(&envoy_refused).await
    };
    let (through_tap, grpc_direct, envoy_direct) = tokio::join!(through_tap, grpc_twin, envoy_twin);
    let (counts, (grpc_via_tap, envoy_via_tap), grown_kib) = through_tap;
    let [(grpc_at_tap, grpc_failed), (envoy_at_tap, envoy_failed)] = counts;
    eprintln!(
        "in {OUTAGE:?} down: grpcio tried {grpc_at_tap} times at its tap ({grpc_via_tap} by its \
         own count), {grpc_direct} at the refused port; Envoy {envoy_at_tap} ({envoy_via_tap}) \
         and {envoy_direct}; grpcio grew {grown_kib} KiB"
    );
    assert!(grpc_direct >= 2 && envoy_direct >= 2, "the twins tried");
    for (who, at_tap, own, direct, failed) in [
        (
            "grpcio",
            grpc_at_tap,
            grpc_via_tap as u64,
            grpc_direct as u64,
            grpc_failed,
        ),
        (
            "Envoy",
            envoy_at_tap,
            envoy_via_tap,
            envoy_direct,
            envoy_failed,
        ),
    ] {
        assert!(
            at_tap <= 2 * direct,
            "{who}: {at_tap} attempts at the tap, {direct} at the refused port"
        );
        assert!(
            own + 1 >= at_tap && at_tap + 1 >= own,
            "{who}: the tap accepted {at_tap}, the client says it failed {own} times"
        );
        assert_eq!(
            failed, at_tap,
            "{who}: every attempt met the control plane down"
        );
    }
    assert!(grown_kib < 50 << 10, "grpcio grew {grown_kib} KiB");

    // The control plane is back on the same port: both resync within 5 s.
    let from = cp.sent().len();
    let listener = tokio::net::TcpListener::bind(&cp_addr).await.unwrap();
    let _server = cp.serve(listener);
    let back = Instant::now();
    resynced(&cp, "grpc-tap", from).await;
    resynced(&cp, "envoy-tap", from).await;
    let took = back.elapsed();
    eprintln!("both resynced {took:?} after the control plane came back");
    assert!(took < Duration::from_secs(5), "resync took {took:?}");
    drop(grpc);
    tap.close().await;
    envoy_tap.close().await;
}
