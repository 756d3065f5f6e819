//! Side by side, in one run: the same xDS-shaped workloads over a direct connection, socat (L4),
//! a plain user-space L4 relay (tokio's `copy_bidirectional`, 256 KiB buffers, one thread: the
//! cheapest relay that touches every byte; this bench binary run again as it), Envoy 1.40 as an
//! HTTP/2 L7 proxy (--concurrency 1), and xdstap (decoding, correlating and exporting spans to a
//! local OTLP receiver). Every proxy runs as its own process, so its CPU
//! time and memory come from /proc; the control plane and clients run in this process.
//!
//! Workloads:
//! 0. h2load against nghttpd serving a 4 MiB file over 4 connections (plain HTTP/2).
//! 1. One ADS stream: 4 MiB pushes, then 64 MiB pushes, each answered before the next.
//! 2. 1,000 streams, 16 KiB pushes answered: pushes/s and push->answer latency at the control
//!    plane.
//! 3. 10,000 and 30,000 idle ADS streams (100 per connection: this machine allows 20,000 open
//!    files per process): RSS per stream.
//! 4. One 100 MiB push: the proxy's peak RSS over idle.
//! 5. A fleet: 10,000 ADS streams (100 per connection) each pushed the same 2,000-cluster CDS
//!    with Istio-like names (about 100 bytes a cluster), then a second version changing every
//!    cluster, each answered: the proxy's RSS over idle per stream after each version.
//!
//! With `SIDEBYSIDE_METADATA=1` every cluster of the push workloads (1, 2 and 5) carries the
//! metadata istiod writes (`istio.config` naming a DestinationRule, `istio.services`), in place
//! of as many filler bytes: what reading it costs, side by side with a build that skips it.
//!
//! Columns on request (`SIDEBYSIDE_ONLY` names them): `xdstap-2t`, the tap with two worker
//! threads; `xdstap-admin`, with its admin address on; `xdstap-pages`, that and its live page
//! open in ten headless Chromiums (Debian's, `scripts/install-chromium`).
//!
//! Run: `scripts/bench` (installs socat and nghttp2 if missing, then
//! `cargo bench --bench sidebyside`). Under `cargo test` it runs a small smoke version.

use xdstap::xds::wire::istio_cluster_metadata;
use xdstap_support::{l4, otlp};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::net::{TcpListener, TcpStream};
use xdstap::xds::wire::bytes as field;

const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const CDS: &[u8] = b"type.googleapis.com/envoy.config.cluster.v3.Cluster";
const WINDOW: u32 = 16 << 20;
const CONN_WINDOW: u32 = 24 << 20;

/// Whether pushes carry istiod's metadata (`SIDEBYSIDE_METADATA=1`).
fn with_metadata() -> bool {
    std::env::var("SIDEBYSIDE_METADATA").as_deref() == Ok("1")
}

/// A cluster's body: `name`, its metadata when pushes carry it, and filler up to `filler`
/// bytes in all (of `fill`).
fn cluster_body(name: &str, i: usize, filler: usize, fill: u8) -> Vec<u8> {
    let mut c = Vec::new();
    field(&mut c, 1, name.as_bytes());
    let mut left = filler;
    if with_metadata() {
        let m = istio_cluster_metadata(&format!("svc-{i}"), &format!("ns-{}", i % 50));
        left = left.saturating_sub(m.len());
        c.extend(m);
    }
    field(&mut c, 33, &vec![fill; left]);
    c
}

/// A fleet push: `clusters` clusters with Istio-like names and 100-byte bodies that differ by
/// `version`, without its tail; the same for every stream.
fn fleet_head(clusters: usize, version: u64) -> Bytes {
    let mut body = Vec::with_capacity(clusters * 200);
    field(&mut body, 1, format!("bench-v{version}").as_bytes());
    for i in 0..clusters {
        let name = format!("outbound|8080||svc-{i}.ns-{}.svc.cluster.local", i % 50);
        let c = cluster_body(&name, i, 100, version as u8);
        let mut any = Vec::new();
        field(&mut any, 1, CDS);
        field(&mut any, 2, &c);
        field(&mut body, 2, &any);
    }
    body.into()
}

/// A push body of about `size` bytes (2 KiB clusters), without its tail; shared by all pushes
/// of that size.
fn push_head(size: usize) -> Bytes {
    let mut body = Vec::with_capacity(size + 4096);
    field(&mut body, 1, b"bench-v1");
    let mut i = 0;
    while body.len() < size {
        let name = format!("outbound|8080||svc-{i}.bench.svc.cluster.local");
        let c = cluster_body(&name, i, 1900, 0x5a);
        let mut any = Vec::new();
        field(&mut any, 1, CDS);
        field(&mut any, 2, &c);
        field(&mut body, 2, &any);
        i += 1;
    }
    body.into()
}

fn tail(nonce: u64) -> Vec<u8> {
    let mut t = Vec::new();
    field(&mut t, 4, CDS);
    field(&mut t, 5, format!("{nonce:016}").as_bytes());
    t
}

fn grpc(m: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + m.len());
    out.push(0);
    out.extend_from_slice(&(m.len() as u32).to_be_bytes());
    out.extend_from_slice(m);
    out.into()
}

/// The client's request: the first one (nonce 0) or the answer to push `nonce`.
fn request(nonce: u64) -> Bytes {
    let mut m = Vec::new();
    if nonce > 0 {
        field(&mut m, 1, b"bench-v1");
    } else {
        let mut node = Vec::new();
        field(&mut node, 1, b"bench-node");
        field(&mut m, 2, &node);
    }
    field(&mut m, 4, CDS);
    if nonce > 0 {
        field(&mut m, 5, format!("{nonce:016}").as_bytes());
    }
    grpc(&m)
}

/// Sends within the peer's window, so a sender never buffers a whole 64 MiB push.
async fn send_all(send: &mut h2::SendStream<Bytes>, mut data: Bytes) -> Result<(), h2::Error> {
    while !data.is_empty() {
        send.reserve_capacity(data.len().min(4 << 20));
        let n = match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(n)) => n,
            Some(Err(e)) => return Err(e),
            None => return Ok(()),
        };
        if n > 0 {
            send.send_data(data.split_to(n.min(data.len())), false)?;
        }
    }
    Ok(())
}

/// Control-plane side measurements of workload 2.
#[derive(Default)]
struct CpStats {
    latencies_us: Mutex<Vec<u64>>,
    pushes: AtomicU64,
}

/// The control plane: on every request message on a stream, one push of the size the stream's
/// `x-push-size` header asks for (0: a 1-cluster push), or, with `x-fleet-clusters: N`, the
/// fleet push of N clusters at version 1, 2, ... for at most two requests; records
/// push->answer latency.
async fn control_plane(listener: TcpListener, stats: Arc<CpStats>) {
    let heads: Arc<Mutex<HashMap<(usize, u64), Bytes>>> = Arc::default();
    loop {
        let Ok((s, _)) = listener.accept().await else {
            return;
        };
        let _ = s.set_nodelay(true);
        let (heads, stats) = (heads.clone(), stats.clone());
        tokio::spawn(async move {
            let Ok(mut conn) = h2::server::Builder::new()
                .initial_window_size(WINDOW)
                .initial_connection_window_size(CONN_WINDOW)
                .max_concurrent_streams(10_000)
                .handshake::<_, Bytes>(s)
                .await
            else {
                return;
            };
            while let Some(Ok((req, mut respond))) = conn.accept().await {
                let size: usize = req
                    .headers()
                    .get("x-push-size")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let fleet: usize = req
                    .headers()
                    .get("x-fleet-clusters")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let head_of = {
                    let heads = heads.clone();
                    move |version: u64| {
                        let key = match fleet {
                            0 => (size, 0),
                            n => (n, version),
                        };
                        let mut heads = heads.lock().unwrap();
                        let head = heads.entry(key).or_insert_with(|| match fleet {
                            0 => push_head(size),
                            n => fleet_head(n, version),
                        });
                        head.clone()
                    }
                };
                let stats = stats.clone();
                tokio::spawn(async move {
                    let mut body = req.into_body();
                    let resp = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(())
                        .unwrap();
                    let Ok(mut send) = respond.send_response(resp, false) else {
                        return;
                    };
                    let mut buf = BytesMut::new();
                    let mut nonce = 0u64;
                    let mut sent_at: Option<Instant> = None;
                    while let Some(Ok(chunk)) = body.data().await {
                        let _ = body.flow_control().release_capacity(chunk.len());
                        buf.extend_from_slice(&chunk);
                        while buf.len() >= 5 {
                            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                            if buf.len() < 5 + len {
                                break;
                            }
                            buf.advance(5 + len);
                            if let Some(t) = sent_at.take() {
                                stats
                                    .latencies_us
                                    .lock()
                                    .unwrap()
                                    .push(t.elapsed().as_micros() as u64);
                            }
                            nonce += 1;
                            if fleet > 0 && nonce > 2 {
                                continue;
                            }
                            let head = head_of(nonce);
                            let t = tail(nonce);
                            let total = head.len() + t.len();
                            let mut prefix = vec![0];
                            prefix.extend_from_slice(&(total as u32).to_be_bytes());
                            let sent = send_all(&mut send, prefix.into()).await.is_ok()
                                && send_all(&mut send, head.clone()).await.is_ok()
                                && send_all(&mut send, t.into()).await.is_ok();
                            if !sent {
                                return;
                            }
                            sent_at = Some(Instant::now());
                            stats.pushes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
    }
}

async fn connect(addr: &str) -> h2::client::SendRequest<Bytes> {
    let io = TcpStream::connect(addr).await.unwrap();
    io.set_nodelay(true).unwrap();
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(WINDOW)
        .initial_connection_window_size(CONN_WINDOW)
        .handshake(io)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// One ADS stream of a client.
struct Stream {
    send: h2::SendStream<Bytes>,
    recv: h2::RecvStream,
    answered: u64,
}

impl Stream {
    async fn open(client: &h2::client::SendRequest<Bytes>, push_size: usize) -> Stream {
        Stream::open_with(client, "x-push-size", push_size).await
    }

    /// A stream whose pushes the header `name: value` chooses.
    async fn open_with(
        client: &h2::client::SendRequest<Bytes>,
        name: &'static str,
        value: usize,
    ) -> Stream {
        let mut client = client.clone().ready().await.unwrap();
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://xds{ADS}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header(name, value.to_string())
            .body(())
            .unwrap();
        let (resp, mut send) = client.send_request(req, false).unwrap();
        send.send_data(request(0), false).unwrap();
        Stream {
            send,
            recv: resp.await.unwrap().into_body(),
            answered: 0,
        }
    }

    /// Reads one whole push and answers it; returns its size.
    async fn round(&mut self) -> usize {
        let size = self.read_push().await;
        self.answer();
        size
    }

    /// ACKs the push read last.
    fn answer(&mut self) {
        self.answered += 1;
        self.send.send_data(request(self.answered), false).unwrap();
    }

    /// Reads one whole push; returns its size.
    async fn read_push(&mut self) -> usize {
        let mut prefix = Vec::with_capacity(5);
        let mut want = usize::MAX;
        let mut got = 0usize;
        while got < want {
            let chunk = self.recv.data().await.unwrap().unwrap();
            let _ = self.recv.flow_control().release_capacity(chunk.len());
            let mut rest = &chunk[..];
            if prefix.len() < 5 {
                let take = (5 - prefix.len()).min(rest.len());
                prefix.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if prefix.len() == 5 {
                    want =
                        u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
                }
            }
            got += rest.len();
        }
        want + 5
    }
}

/// A proxy under test, as its own process.
struct Proxy {
    name: &'static str,
    addr: String,
    child: Option<Child>,
    dir: PathBuf,
    /// "xdstap-pages": ten headless Chromiums, each with the tap's live page open.
    pages: Vec<Child>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for mut b in self.pages.drain(..) {
            let _ = b.kill();
            let _ = b.wait();
        }
        if let Some(c) = self.child.as_mut() {
            // SIGINT first: perf (when profiling) writes its data on it.
            let _ = Command::new("kill")
                .args(["-INT", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn envoy_binary() -> PathBuf {
    std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".envoy/envoy/_bin/envoy"))
}

fn envoy_l7_bootstrap(port: u16, upstream_port: u16) -> String {
    let h2 = "http2_protocol_options: { initial_stream_window_size: 16777216, initial_connection_window_size: 25165824, max_concurrent_streams: 2147483647 }";
    format!(
        r#"admin: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }} }}
static_resources:
  listeners:
  - name: l7
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: l7
          codec_type: HTTP2
          stream_idle_timeout: 0s
          {h2}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: cp, timeout: 0s }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: cp
    type: STATIC
    connect_timeout: 1s
    circuit_breakers:
      thresholds: [ {{ max_connections: 1000000, max_pending_requests: 1000000, max_requests: 1000000 }} ]
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ {h2} }}
    load_assignment:
      cluster_name: cp
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {upstream_port} }} }} }}
"#
    )
}

fn start(name: &'static str, upstream: &str, otlp: &str) -> Proxy {
    let dir = std::env::temp_dir().join(format!("xdstap-bench-{name}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    if name == "direct" {
        return Proxy {
            name,
            addr: upstream.into(),
            child: None,
            dir,
            pages: Vec::new(),
        };
    }
    let port = free_port();
    let admin = matches!(name, "xdstap-admin" | "xdstap-pages")
        .then(|| format!("127.0.0.1:{}", free_port()));
    let upstream_port: u16 = upstream.rsplit(':').next().unwrap().parse().unwrap();
    let child = match name {
        "l4-relay" => Command::new(std::env::current_exe().unwrap())
            .env("SIDEBYSIDE_L4", format!("127.0.0.1:{port} {upstream}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        "socat" => Command::new("socat")
            .arg(format!(
                "TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,nodelay"
            ))
            .arg(format!("TCP:127.0.0.1:{upstream_port},nodelay"))
            .stderr(Stdio::null())
            .spawn()
            .expect("socat (scripts/bench installs it)"),
        "envoy-l7" => {
            let config = dir.join("envoy.yaml");
            std::fs::write(&config, envoy_l7_bootstrap(port, upstream_port)).unwrap();
            Command::new(envoy_binary())
                .arg("-c")
                .arg(&config)
                .args(["--concurrency", "1", "--disable-hot-restart", "-l", "error"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("envoy (scripts/install-envoy)")
        }
        "xdstap" | "before" | "xdstap-2t" | "xdstap-admin" | "xdstap-pages" => {
            // "before": another build of xdstap (SIDEBYSIDE_BEFORE=PATH), same flags;
            // "xdstap-2t": this tree with two worker threads; "xdstap-admin": with its admin
            // address on; "xdstap-pages": that, and the live page open in ten Chromiums.
            let bin = match name {
                "before" => PathBuf::from(std::env::var("SIDEBYSIDE_BEFORE").unwrap()),
                _ => PathBuf::from(env!("CARGO_BIN_EXE_xdstap")),
            };
            // SIDEBYSIDE_PERF=FILE runs the tap under `perf record -g` writing FILE;
            // SIDEBYSIDE_PERF=heaptrack:FILE under heaptrack (its RSS figures are then void).
            let mut c = match std::env::var("SIDEBYSIDE_PERF") {
                Ok(out) if name == "xdstap" && out.starts_with("heaptrack:") => {
                    let mut c = Command::new("heaptrack");
                    c.args(["-o", &out["heaptrack:".len()..]]).arg(&bin);
                    c
                }
                Ok(out) if name == "xdstap" => {
                    let mut c = Command::new("perf");
                    c.args(["record", "-F", "999", "-g", "-o", &out, "--"])
                        .arg(&bin);
                    c
                }
                _ => Command::new(&bin),
            };
            c.args(["run", "--listen", &format!("127.0.0.1:{port}")]);
            if name == "xdstap-2t" {
                c.args(["--threads", "2"]);
            }
            // SIDEBYSIDE_TAP_THREADS=N: the tap's worker threads (`run --threads N`).
            if let Ok(n) = std::env::var("SIDEBYSIDE_TAP_THREADS") {
                match name {
                    "before" => c.env("TOKIO_WORKER_THREADS", n),
                    _ => c.args(["--threads", &n]),
                };
            }
            c.args([
                "--upstream",
                upstream,
                "--admin",
                admin.as_deref().unwrap_or("off"),
                "--log-level",
                "error",
            ])
            // SIDEBYSIDE_OTLP replaces the span endpoint ("none": no export), to compare a
            // live, a dead and no backend.
            .args(match std::env::var("SIDEBYSIDE_OTLP").as_deref() {
                Ok("none") => vec![],
                Ok(other) => vec!["--otlp-endpoint".to_string(), other.to_string()],
                Err(_) => vec!["--otlp-endpoint".to_string(), otlp.to_string()],
            })
            .args(["--otlp-protocol", "grpc"])
            // SIDEBYSIDE_TAP_ARGS adds flags, e.g. "--threads 2".
            .args(
                std::env::var("SIDEBYSIDE_TAP_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
        }
        other => panic!("unknown proxy {other}"),
    };
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "{name} did not start listening");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pages = match (name, admin) {
        ("xdstap-pages", Some(a)) => open_pages(&a, &dir),
        _ => Vec::new(),
    };
    Proxy {
        name,
        addr,
        child: Some(child),
        dir,
        pages,
    }
}

/// The live page at `admin` open in ten headless Chromiums (headless mode opens one page per
/// process), once each holds its `/events` stream.
fn open_pages(admin: &str, dir: &std::path::Path) -> Vec<Child> {
    let url = format!("http://{admin}/");
    let pages: Vec<Child> = (0..10)
        .map(|i| {
            Command::new(std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into()))
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--remote-debugging-port=0",
                ])
                .arg(format!(
                    "--user-data-dir={}",
                    dir.join(format!("chromium-{i}")).display()
                ))
                .arg(&url)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromium (scripts/install-chromium)")
        })
        .collect();
    let port = admin.rsplit(':').next().unwrap_or("0");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let open = Command::new("ss")
            .args([
                "-Htn",
                "state",
                "established",
                "dport",
                "=",
                &format!(":{port}"),
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
            .unwrap_or(0);
        if open >= 10 {
            return pages;
        }
        assert!(
            Instant::now() < deadline,
            "ten pages did not open: {open} connections"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// utime + stime of a process and its children so far, seconds (socat forks per connection).
fn cpu_seconds(pid: u32) -> f64 {
    let tick = 100.0; // USER_HZ on Linux
    let mut total = 0.0;
    let mut pids = vec![pid];
    while let Some(p) = pids.pop() {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            let after = &stat[stat.rfind(')').unwrap_or(0) + 2..];
            let f: Vec<&str> = after.split_whitespace().collect();
            // Fields 14-17 (1-based, after the name): utime stime cutime cstime.
            for i in 11..15 {
                total += f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / tick;
            }
        }
        if let Ok(children) = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")) {
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    total
}

fn memory_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn pid(p: &Proxy) -> Option<u32> {
    p.child.as_ref().map(|c| c.id())
}

struct Row {
    workload: String,
    figures: Vec<(String, String)>,
}

/// Workload 1: one stream, `count` pushes of `size`; MB/s and proxy CPU-seconds per GiB.
async fn one_stream(p: &Proxy, size: usize, count: usize) -> (f64, Option<f64>) {
    let client = connect(&p.addr).await;
    let mut s = Stream::open(&client, size).await;
    s.round().await; // warm up, not timed
    let cpu0 = pid(p).map(cpu_seconds);
    let start = Instant::now();
    let mut bytes = 0;
    for _ in 0..count {
        bytes += s.round().await;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = pid(p)
        .map(|id| (cpu_seconds(id) - cpu0.unwrap_or(0.0)) / (bytes as f64 / (1u64 << 30) as f64));
    (bytes as f64 / secs / 1e6, cpu)
}

/// Workload 2: `streams` streams (one connection each) doing `rounds` 16 KiB round trips:
/// pushes per second, push-to-answer p50 and p99 (µs), and the proxy's CPU per push (µs).
async fn many_streams(
    p: &Proxy,
    cp: &CpStats,
    streams: usize,
    rounds: usize,
) -> (f64, u64, u64, Option<f64>) {
    let mut opened = Vec::new();
    for _ in 0..streams {
        let client = connect(&p.addr).await;
        let mut s = Stream::open(&client, 16 << 10).await;
        s.round().await;
        opened.push((client, s));
    }
    cp.latencies_us.lock().unwrap().clear();
    let cpu0 = pid(p).map(cpu_seconds);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (client, mut s) in opened {
        tasks.spawn(async move {
            for _ in 0..rounds {
                s.round().await;
            }
            drop(client);
        });
    }
    while tasks.join_next().await.is_some() {}
    let secs = start.elapsed().as_secs_f64();
    let mut l = cp.latencies_us.lock().unwrap().clone();
    l.sort_unstable();
    let pct = |q: f64| {
        l.get(((l.len() as f64 * q) as usize).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let pushes = (streams * rounds) as f64;
    let cpu = pid(p).map(|id| (cpu_seconds(id) - cpu0.unwrap_or(0.0)) / pushes * 1e6);
    (pushes / secs, pct(0.5), pct(0.99), cpu)
}

/// Workload 3: `streams` idle streams, 100 per connection; the proxy's RSS rise per stream.
async fn idle_streams(p: &Proxy, streams: usize) -> Option<f64> {
    let id = pid(p)?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = memory_kib(id, "VmRSS");
    let mut held = Vec::new();
    let mut clients = Vec::new();
    for i in 0..streams {
        if i % 100 == 0 {
            clients.push(connect(&p.addr).await);
        }
        let mut s = Stream::open(clients.last().unwrap(), 0).await;
        s.round().await;
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = memory_kib(id, "VmRSS");
    drop(held);
    drop(clients);
    Some((after.saturating_sub(before)) as f64 * 1024.0 / streams as f64)
}

/// Workload 5: `streams` streams, 100 per connection, each pushed the same `clusters`-cluster
/// CDS twice (two versions); the proxy's RSS over idle per stream once every stream holds the
/// first push (not yet answered: answering brings the second), and once every stream has
/// answered both, bytes. One push is in flight at a time, so no connection's window fills with
/// pushes nobody reads.
async fn fleet(p: &Proxy, streams: usize, clusters: usize) -> Option<(f64, f64)> {
    let id = pid(p)?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = memory_kib(id, "VmRSS");
    let mut held = Vec::new();
    let mut clients = Vec::new();
    for i in 0..streams {
        if i % 100 == 0 {
            clients.push(connect(&p.addr).await);
        }
        let client = clients.last().unwrap();
        let mut s = Stream::open_with(client, "x-fleet-clusters", clusters).await;
        s.read_push().await;
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let first = memory_kib(id, "VmRSS");
    for s in &mut held {
        s.answer();
        s.round().await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = memory_kib(id, "VmRSS");
    let per = |kib: u64| kib.saturating_sub(idle) as f64 * 1024.0 / streams as f64;
    Some((per(first), per(second)))
}

/// Workload 4: one 100 MiB push; the proxy's peak RSS over idle, KiB.
async fn big_push(p: &Proxy) -> Option<u64> {
    let id = pid(p)?;
    let client = connect(&p.addr).await;
    let mut small = Stream::open(&client, 0).await;
    small.round().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = memory_kib(id, "VmRSS");
    let _ = std::fs::write(format!("/proc/{id}/clear_refs"), "5");
    let mut s = Stream::open(&client, 100 << 20).await;
    s.round().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    Some(memory_kib(id, "VmHWM").saturating_sub(idle))
}

/// Workload 0: h2load fetching a 4 MiB file from nghttpd over 4 connections.
fn h2load(p: &Proxy, requests: usize) -> Option<(f64, Option<f64>)> {
    let cpu0 = pid(p).map(cpu_seconds);
    let out = Command::new("h2load")
        .args([
            "-n",
            &requests.to_string(),
            "-c",
            "4",
            "-m",
            "1",
            "-w",
            "24",
            "-W",
            "25",
        ])
        .arg(format!("http://{}/4m.bin", p.addr))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("finished in"))?;
    // "finished in 1.23s, 324.00 req/s, 1.27GB/s"
    let rate = line.rsplit(", ").next()?;
    let (n, unit) = rate.split_at(rate.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = n.parse().ok()?;
    let mbs = match unit {
        "GB/s" => n * 1024.0,
        "MB/s" => n,
        "KB/s" => n / 1024.0,
        _ => return None,
    };
    let ok = text.contains(&format!("{requests} succeeded"));
    assert!(ok, "h2load through {}: {text}", p.name);
    let gib = (requests * (4 << 20)) as f64 / (1u64 << 30) as f64;
    let cpu = pid(p).map(|id| (cpu_seconds(id) - cpu0.unwrap_or(0.0)) / gib);
    Some((mbs * 1.048576, cpu))
}

fn main() {
    if let Ok(spec) = std::env::var("SIDEBYSIDE_L4") {
        l4::relay(&spec);
    }
    let full = std::env::args().any(|a| a == "--bench");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(full));
}

async fn run(full: bool) {
    let cp_stats = Arc::new(CpStats::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    tokio::spawn(control_plane(listener, cp_stats.clone()));
    let receiver = otlp::Receiver::grpc().await;
    // SIDEBYSIDE_OTLP=blackhole: a backend that accepts connections and never answers.
    if std::env::var("SIDEBYSIDE_OTLP").as_deref() == Ok("blackhole") {
        let hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
        std::env::set_var(
            "SIDEBYSIDE_OTLP",
            format!("http://{}", hole.local_addr().unwrap()),
        );
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((c, _)) = hole.accept().await {
                held.push(c);
            }
        });
    }
    // SIDEBYSIDE_BEFORE=PATH adds a column for another xdstap build (before/after).
    let before = std::env::var_os("SIDEBYSIDE_BEFORE").is_some();
    let all: Vec<&'static str> = if full {
        vec![
            "direct", "socat", "l4-relay", "envoy-l7", "before", "xdstap",
        ]
    } else {
        vec!["direct", "l4-relay", "before", "xdstap"]
    };
    // "xdstap-2t" (two worker threads) and "xdstap-pages" (ten live pages open) only when
    // SIDEBYSIDE_ONLY names them.
    let mut all: Vec<&'static str> = all
        .into_iter()
        .filter(|n| *n != "before" || before)
        .collect();
    all.extend(["xdstap-2t", "xdstap-admin", "xdstap-pages"]);
    // SIDEBYSIDE_ONLY=xdstap,direct and SIDEBYSIDE_WORKLOADS=1,2 narrow a run (for profiling).
    let only = std::env::var("SIDEBYSIDE_ONLY").unwrap_or_default();
    let names: Vec<&'static str> = all
        .iter()
        .copied()
        .filter(|n| {
            only.split(',').any(|o| o == *n)
                || (only.is_empty() && !matches!(*n, "xdstap-2t" | "xdstap-admin" | "xdstap-pages"))
        })
        .collect();
    let names = &names[..];
    let workloads = std::env::var("SIDEBYSIDE_WORKLOADS").unwrap_or_else(|_| "0,1,2,3,4,5".into());
    let on = |w: &str| workloads.split(',').any(|x| x == w);
    let mut rows: Vec<Row> = Vec::new();
    let mut row = |workload: &str, name: &str, figure: String| {
        if let Some(r) = rows.iter_mut().find(|r| r.workload == workload) {
            r.figures.push((name.into(), figure));
        } else {
            rows.push(Row {
                workload: workload.into(),
                figures: vec![(name.into(), figure)],
            });
        }
    };

    // Workload 0: nghttpd + h2load, when installed.
    let nghttpd = if full && on("0") && Command::new("h2load").arg("--version").output().is_ok() {
        let dir = std::env::temp_dir().join(format!("xdstap-bench-www-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("4m.bin"), vec![0x5au8; 4 << 20]).unwrap();
        let port = free_port();
        let child = Command::new("nghttpd")
            .args(["--no-tls", "-d"])
            .arg(&dir)
            .args(["--window-bits", "24", "--connection-window-bits", "25"])
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        child.map(|c| (c, addr, dir))
    } else {
        None
    };
    if let Some((_, www, _)) = &nghttpd {
        for name in names {
            let p = start(name, www, &receiver.endpoint);
            let (mbs, cpu) = h2load(&p, 1000).unwrap_or((0.0, None));
            row(
                "0. h2load 4 MiB x 1000, 4 conns: MB/s",
                name,
                format!("{mbs:.0}"),
            );
            if let Some(c) = cpu {
                row("0. proxy CPU-seconds per GiB", name, format!("{c:.2}"));
            }
        }
    }

    for name in names {
        let p = start(name, &upstream, &receiver.endpoint);
        let (count4, count64) = if full { (250, 16) } else { (2, 1) };
        if on("1") {
            let (mbs, cpu) = one_stream(&p, 4 << 20, count4).await;
            row(
                "1. one stream, 4 MiB pushes: MB/s",
                name,
                format!("{mbs:.0}"),
            );
            if let Some(c) = cpu {
                row(
                    "1. proxy CPU-seconds per GiB (4 MiB)",
                    name,
                    format!("{c:.2}"),
                );
            }
            let (mbs, _) = one_stream(&p, 64 << 20, count64).await;
            row(
                "1. one stream, 64 MiB pushes: MB/s",
                name,
                format!("{mbs:.0}"),
            );
        }
        if on("2") {
            let (streams, rounds) = if full { (1000, 20) } else { (10, 2) };
            let (rate, p50, p99, cpu) = many_streams(&p, &cp_stats, streams, rounds).await;
            row(
                "2. 1,000 streams x 16 KiB: pushes/s",
                name,
                format!("{rate:.0}"),
            );
            row("2. push->answer p50 (µs)", name, p50.to_string());
            row("2. push->answer p99 (µs)", name, p99.to_string());
            if let Some(c) = cpu {
                row("2. proxy CPU per push (µs)", name, format!("{c:.1}"));
            }
        }
        drop(p);

        if full && on("3") && matches!(*name, "xdstap" | "before" | "envoy-l7") {
            for n in [10_000, 30_000] {
                let p = start(name, &upstream, &receiver.endpoint);
                if let Some(per) = idle_streams(&p, n).await {
                    row(
                        &format!("3. {n} idle streams: RSS per stream (KiB)"),
                        name,
                        format!("{:.1}", per / 1024.0),
                    );
                }
            }
        }
        if on("5") && matches!(*name, "xdstap" | "before") {
            let (streams, clusters) = if full { (10_000, 2_000) } else { (20, 50) };
            let p = start(name, &upstream, &receiver.endpoint);
            if let Some((first, second)) = fleet(&p, streams, clusters).await {
                let what = format!("5. {streams} streams x {clusters} clusters: RSS per stream");
                row(
                    &format!("{what}, one version (KiB)"),
                    name,
                    format!("{:.1}", first / 1024.0),
                );
                row(
                    &format!("{what}, two versions (KiB)"),
                    name,
                    format!("{:.1}", second / 1024.0),
                );
            }
        }
        if on("4") && *name != "direct" && *name != "socat" {
            let p = start(name, &upstream, &receiver.endpoint);
            if let Some(kib) = big_push(&p).await {
                row(
                    "4. one 100 MiB push: peak RSS over idle (MiB)",
                    name,
                    format!("{:.1}", kib as f64 / 1024.0),
                );
            }
        }
    }
    if let Some((mut c, _, dir)) = nghttpd {
        let _ = c.kill();
        let _ = c.wait();
        let _ = std::fs::remove_dir_all(dir);
    }

    // The table, with ratios where both figures exist: to direct for throughput and latency,
    // and for xdstap also to Envoy L7 (throughput and CPU per GiB).
    println!("\n| workload | {} |", names.join(" | "));
    println!("|---|{}", "---|".repeat(names.len()));
    for r in &rows {
        let cells: Vec<String> = names
            .iter()
            .map(|n| {
                let v = r
                    .figures
                    .iter()
                    .find(|(name, _)| name == n)
                    .map(|(_, f)| f.clone());
                let of = |who: &str| {
                    r.figures
                        .iter()
                        .find(|(name, _)| name == who)
                        .and_then(|(_, f)| f.parse::<f64>().ok())
                        .filter(|x| *x > 0.0)
                };
                let Some(v) = v else {
                    return "-".to_string();
                };
                let x: f64 = v.parse().unwrap_or(0.0);
                let rate = r.workload.contains("/s");
                let latency = r.workload.contains("p50") || r.workload.contains("p99");
                let cpu = r.workload.contains("CPU");
                let mut ratios = Vec::new();
                if let Some(d) = of("direct").filter(|_| *n != "direct" && (rate || latency)) {
                    ratios.push(format!("{:.2}x", x / d));
                }
                let tap = n.starts_with("xdstap") || *n == "before";
                if let Some(l) = of("l4-relay").filter(|_| tap && (rate || cpu)) {
                    ratios.push(format!("{:.2}x L4", x / l));
                }
                if let Some(e) = of("envoy-l7").filter(|_| tap && (rate || cpu)) {
                    ratios.push(format!("{:.2}x Envoy", x / e));
                }
                match ratios.is_empty() {
                    true => v,
                    false => format!("{v} ({})", ratios.join(", ")),
                }
            })
            .collect();
        println!("| {} | {} |", r.workload, cells.join(" | "));
    }
    println!(
        "\nspans received by the OTLP receiver: {}",
        receiver.spans().len()
    );
}
