//! A 100 MiB SotW push through the `xdstap` binary, run as its own process so its memory can be
//! read from /proc: the push is decoded (nonce, version and resource count in the event log) and
//! the tap's peak RSS rises by less than 16 MiB over idle, because no message is held whole and
//! the tap holds at most one stream window (4 MiB by default) of it at a time.

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use prost::Message as _;
use support::resources::CDS;
use support::{eventually, TempDir};
use tokio::net::{TcpListener, UnixStream};
use xdstap::xds::wire::bytes as field;

const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const CLUSTERS: usize = 50_000;
const CLUSTER_BODY: usize = 2_040;

/// Cluster `i` as an `Any`, encoded by hand so the push can be produced piece by piece.
fn cluster_any(i: usize) -> Vec<u8> {
    let mut c = Vec::new();
    field(&mut c, 1, format!("big-cluster-{i:06}").as_bytes());
    field(&mut c, 33, &[0x5a; CLUSTER_BODY]);
    let mut any = Vec::new();
    field(&mut any, 1, CDS.as_bytes());
    field(&mut any, 2, &c);
    let mut out = Vec::new();
    field(&mut out, 2, &any);
    out
}

fn head(version: &str) -> Vec<u8> {
    let mut m = Vec::new();
    field(&mut m, 1, version.as_bytes());
    m
}

fn tail(nonce: &str) -> Vec<u8> {
    let mut m = Vec::new();
    field(&mut m, 4, CDS.as_bytes());
    field(&mut m, 5, nonce.as_bytes());
    m
}

/// Sends `data` as the peer's window allows, so the sender never buffers more than it must.
async fn send_all(send: &mut h2::SendStream<Bytes>, mut data: Bytes) {
    while !data.is_empty() {
        send.reserve_capacity(data.len().min(4 << 20));
        let capacity = std::future::poll_fn(|cx| send.poll_capacity(cx))
            .await
            .expect("stream open")
            .expect("capacity");
        if capacity == 0 {
            continue;
        }
        send.send_data(data.split_to(capacity.min(data.len())), false)
            .unwrap();
    }
}

/// The gRPC message of a push of `count` clusters, built before it is sent.
fn push(version: &str, nonce: &str, count: usize) -> Bytes {
    let mut m = head(version);
    for i in 0..count {
        m.extend_from_slice(&cluster_any(i));
    }
    m.extend_from_slice(&tail(nonce));
    support::raw::grpc(&m)
}

/// A control plane that answers the first request with a small push and the second with a push
/// of `CLUSTERS` clusters (about 100 MiB), built beforehand and sent as fast as the tap's window
/// lets it: the worst case for the tap's memory, since it then holds a full window whenever the
/// client reads more slowly than the control plane writes.
async fn control_plane(listener: TcpListener) {
    let small = push("v1", "n1", 1);
    let big = push("v2-big", "n2-big", CLUSTERS);
    let (io, _) = listener.accept().await.unwrap();
    let mut conn = h2::server::handshake(io).await.unwrap();
    let (req, mut respond) = conn.accept().await.unwrap().unwrap();
    tokio::spawn(async move { while conn.accept().await.is_some() {} });
    let mut body = req.into_body();
    let resp = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let mut send = respond.send_response(resp, false).unwrap();
    let mut requests = 0;
    while let Some(Ok(chunk)) = support::within(30, "the next DATA", body.data()).await {
        let _ = body.flow_control().release_capacity(chunk.len());
        // Each request here arrives in one DATA frame; the test's client sends them whole.
        requests += 1;
        match requests {
            1 => send_all(&mut send, small.clone()).await,
            2 => send_all(&mut send, big.clone()).await,
            _ => {}
        }
    }
}

fn request(version: &str, nonce: &str) -> Bytes {
    let m = DiscoveryRequest {
        version_info: version.into(),
        node: Some(Node {
            id: "big-push-node".into(),
            ..Default::default()
        }),
        type_url: CDS.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
    .encode_to_vec();
    support::raw::grpc(&m)
}

/// Reads one whole gRPC message off `body` and returns its length, keeping none of it.
async fn read_message(body: &mut h2::RecvStream) -> usize {
    let mut prefix = Vec::new();
    let mut want = None;
    let mut got = 0usize;
    loop {
        let chunk = support::within(30, "the next DATA", body.data())
            .await
            .unwrap()
            .unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        let mut rest = &chunk[..];
        if want.is_none() {
            let take = (5 - prefix.len()).min(rest.len());
            prefix.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if prefix.len() == 5 {
                want =
                    Some(u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize);
            }
        }
        got += rest.len();
        if let Some(n) = want {
            assert!(got <= n, "one message at a time");
            if got == n {
                return n;
            }
        }
    }
}

/// `VmRSS` or `VmHWM` of a process, in KiB.
fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').trim().strip_suffix("kB"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

fn verdicts(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mib_push_is_decoded_in_bounded_memory() {
    let dir = TempDir::new("big-push");
    let cp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = cp.local_addr().unwrap().to_string();
    tokio::spawn(control_plane(cp));
    let sock = dir.path().join("tap.sock");
    let events = dir.path().join("events.jsonl");
    let tap = support::Child(
        Command::new(env!("CARGO_BIN_EXE_xdstap"))
            .args(["run", "--listen"])
            .arg(format!("unix:{}", sock.display()))
            .args(["--upstream", &upstream, "--event-log"])
            .arg(&events)
            .args(["--log-level", "warn", "--admin", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = tap.0.id();
    support::listening(&sock).await;

    let io = UnixStream::connect(&sock).await.unwrap();
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(16 << 20)
        .initial_connection_window_size(24 << 20)
        .handshake(io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://xds{ADS}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (resp, mut send) = client.send_request(req, false).unwrap();
    send.send_data(request("", ""), false).unwrap();
    let mut body = resp.await.unwrap().into_body();

    // Warm up on a small push so every connection, task and buffer exists, then read idle.
    read_message(&mut body).await;
    send.send_data(request("v1", "n1"), false).unwrap();
    eventually(10, "the small push's ack", || {
        (verdicts(&events).len() == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = memory_kib(pid, "VmRSS");
    // Reset the peak to the current RSS (Linux >= 4.0), so the peak below is the push's.
    let reset = std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok();

    // The 100 MiB push: the ACK asks for it, the client reads it whole and answers it.
    let len = read_message(&mut body).await;
    assert!(len > 100 << 20, "the push is over 100 MiB ({len} bytes)");
    send.send_data(request("v2-big", "n2-big"), false).unwrap();
    let all = eventually(20, "the big push's verdict", || {
        let v = verdicts(&events);
        (v.len() == 2).then_some(v)
    })
    .await;
    let big = &all[1];
    assert_eq!(big["verdict"], "ack", "{big}");
    assert_eq!(big["version"], "v2-big");
    assert_eq!(big["nonce"], "n2-big");
    assert_eq!(big["resources"], CLUSTERS);
    assert_eq!(big["bytes"].as_u64().unwrap() as usize, len);
    assert_eq!(big["node"], "big-push-node");
    assert_eq!(big["resource_names"][0], "big-cluster-000000");

    let peak = memory_kib(pid, "VmHWM");
    let rise = peak.saturating_sub(idle);
    println!(
        "100 MiB push ({len} bytes, {CLUSTERS} clusters): tap RSS idle {idle} KiB, peak {peak} KiB, \
         rise {rise} KiB (peak reset before the push: {reset})"
    );
    assert!(
        rise < 16 * 1024,
        "tap peak RSS rose {rise} KiB over idle ({idle} KiB) for a 100 MiB push"
    );
}
