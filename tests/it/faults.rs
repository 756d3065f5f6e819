//! Faults: clients that vanish without a goodbye. xDS clients connect through the `xdstap`
//! binary, subscribe, get their push, and drop their socket with a TCP reset, 2 x 1,000 times;
//! open files and tasks return to where a fresh tap started, and memory does not grow across
//! the second 1,000.

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::control_plane::ControlPlane;
use support::raw::subscribe;
use support::resources::Snapshot;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// One client: subscribe, read the first push, then reset the connection.
async fn vanish(tap: &str, node: String) {
    let io = TcpStream::connect(tap).await.unwrap();
    let std = io.into_std().unwrap();
    // SO_LINGER 0: closing sends RST, as a killed process's socket does.
    let sock = socket_with_linger_zero(std);
    let io = TcpStream::from_std(sock).unwrap();
    let (client, conn) = h2::client::handshake(io).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let (resp, mut send) = client
        .send_request(support::raw::request(ADS), false)
        .unwrap();
    send.send_data(subscribe(&node), false).unwrap();
    let mut body = resp.await.unwrap().into_body();
    let chunk = support::within(30, "the next DATA", body.data())
        .await
        .unwrap()
        .unwrap();
    assert!(!chunk.is_empty());
    conn.abort();
    let _ = conn.await;
}

fn socket_with_linger_zero(s: std::net::TcpStream) -> std::net::TcpStream {
    // std has no set_linger on stable; tokio's TcpStream does.
    s.set_nonblocking(true).unwrap();
    let t = tokio::net::TcpStream::from_std(s).unwrap();
    #[allow(deprecated)]
    t.set_linger(Some(Duration::ZERO)).unwrap();
    t.into_std().unwrap()
}

/// GET `path` from the admin server on a Unix socket.
async fn admin_get(sock: &std::path::Path, path: &str) -> String {
    let mut s = UnixStream::connect(sock).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

async fn gauge(sock: &std::path::Path, name: &str) -> f64 {
    let text = admin_get(sock, "/metrics").await;
    let m = support::prom::parse(&text).unwrap();
    m.get(name, &[])
}

struct Usage {
    fds: usize,
    rss_kib: u64,
    tasks: f64,
}

async fn usage(pid: u32, admin: &std::path::Path) -> Usage {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap();
    Usage {
        fds,
        rss_kib,
        tasks: gauge(admin, "xdstap_tasks").await,
    }
}

async fn settle(admin: &std::path::Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = admin_get(admin, "/metrics").await;
        let m = support::prom::parse(&text).unwrap();
        let open = m.get("xdstap_connections_active", &[])
            + m.get("xdstap_xds_streams_active", &[("api", "sotw")]);
        if open == 0.0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "connections still open: {open}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_clients_killed_abruptly_leave_nothing_behind() {
    let dir = support::TempDir::new("faults");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let admin = dir.path().join("admin.sock");
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tap_addr = free.local_addr().unwrap().to_string();
    drop(free);
    let tap = support::Child(
        Command::new(env!("CARGO_BIN_EXE_xdstap"))
            .args(["run", "--listen", &tap_addr, "--upstream", &cp_addr])
            .arg("--admin")
            .arg(format!("unix:{}", admin.display()))
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = tap.id();
    support::listening(&admin).await;
    vanish(&tap_addr, "first".into()).await;
    settle(&admin).await;
    let start = usage(pid, &admin).await;

    // A first round of 1,000 (buffers, allocator arenas and the status board's entries for
    // these node ids all reach their size), then the baseline, then a second round: anything
    // that grows per vanished client shows as growth across the second round.
    let mut rounds = Vec::new();
    for _round in 0..2 {
        let mut done = 0;
        while done < 1000 {
            let mut batch = tokio::task::JoinSet::new();
            for i in done..done + 50 {
                let tap_addr = tap_addr.clone();
                batch.spawn(async move { vanish(&tap_addr, format!("node-{i}")).await });
            }
            while let Some(r) = batch.join_next().await {
                r.unwrap();
            }
            done += 50;
        }
        settle(&admin).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        rounds.push(usage(pid, &admin).await);
    }
    let (before, after) = (&rounds[0], &rounds[1]);
    println!(
        "1,000 more abrupt client kills: fds {} -> {}, tasks {} -> {}, RSS {} -> {} KiB \
         (fresh process: {} fds, {} KiB)",
        before.fds,
        after.fds,
        before.tasks,
        after.tasks,
        before.rss_kib,
        after.rss_kib,
        start.fds,
        start.rss_kib
    );
    assert!(after.fds <= start.fds + 2, "file descriptors leaked");
    assert!(after.tasks <= start.tasks + 2.0, "tasks leaked");
    assert!(
        // 4 MiB over 1,000 clients: anything that keeps 4 KiB per vanished client fails this.
        after.rss_kib <= before.rss_kib + 4 * 1024,
        "memory grew by {} KiB over the second 1,000",
        after.rss_kib - before.rss_kib
    );
    // The tap still works, and it saw every stream end.
    let streams = gauge(&admin, "xdstap_streams_total").await;
    assert!(streams >= 2001.0, "{streams}");
    vanish(&tap_addr, "after".into()).await;
    drop(tap);
}
