//! Storms a mesh lives through, the tap against the same clients and control plane without it
//! (and against another build of the tap, `SIDEBYSIDE_BEFORE=PATH`, when given). The tap runs
//! as `xdstap run` would by default (admin address on, one worker thread), as its own process,
//! so its memory comes from /proc; control plane and clients run in this process.
//!
//! - `push`: 1,000 ADS streams, one connection each (as 1,000 proxies), each pushed the same
//!   2,000-cluster CDS (Istio-like names, 100-byte clusters) as it opens, and answering it;
//!   then a second version, changing every cluster, pushed to all at once. The clients run in
//!   a process of their own (this one, started again), reading at their own pace. The tap's
//!   RSS over idle per stream: at the peak of the storm (sampled every 10 ms) and 30 s after.
//! - `gone`: 10,000 streams (100 per connection), each a node of its own, pushed a 100-cluster
//!   CDS and answering it, then all gone: the tap's RSS over idle per disconnected node (the
//!   status view keeps them for `forget_after`, 10 minutes by default).
//! - `reconnect`: 2,000 streams, one connection each, on the 2,000-cluster CDS; the control
//!   plane restarts (every connection closed) and, once it is back, every client reconnects at
//!   once stating the version it runs; the control plane pushes the whole CDS to each. Time from
//!   the return until 50%, 90% and 100% of the clients have it again and have answered, direct
//!   and through the tap, rounds alternating; the tap's ratio to direct.
//!
//! Run: `scripts/bench --storm [--before REV]` (`cargo bench --bench storm`). Knobs:
//! `STORM=push,gone` picks workloads, `STORM_ROUNDS=N` the reconnect rounds (3),
//! `STORM_CLIENTS=N` the reconnecting clients (2,000), `STORM_NODES=N` the nodes gone
//! (10,000), `STORM_TAP_ARGS` flags added to the tap's, `STORM_TAP_WRAP` a command (a
//! profiler) to run the tap under. Under `cargo test` it runs a small smoke version.

use xdstap_support::l4;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use xdstap::xds::wire::bytes as field;

const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const CDS: &[u8] = b"type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// The whole CDS at `version` (`clusters` clusters whose bodies differ by version), without its
/// nonce: the same bytes for every stream.
fn cds(clusters: usize, version: u64) -> Bytes {
    let mut body = Vec::with_capacity(clusters * 200);
    field(&mut body, 1, format!("v{version}").as_bytes());
    for i in 0..clusters {
        let mut c = Vec::new();
        let name = format!("outbound|8080||svc-{i}.ns-{}.svc.cluster.local", i % 50);
        field(&mut c, 1, name.as_bytes());
        field(&mut c, 33, &[version as u8; 100]);
        let mut any = Vec::new();
        field(&mut any, 1, CDS);
        field(&mut any, 2, &c);
        field(&mut body, 2, &any);
    }
    field(&mut body, 4, CDS);
    body.into()
}

fn grpc(m: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + m.len());
    out.push(0);
    out.extend_from_slice(&(m.len() as u32).to_be_bytes());
    out.extend_from_slice(m);
    out.into()
}

/// A request: the first of a stream (node `node`, stating `version` when it has one), or the
/// answer to push `nonce` at `version`.
fn request(node: &str, version: u64, nonce: Option<u64>) -> Bytes {
    let mut m = Vec::new();
    if version > 0 {
        field(&mut m, 1, format!("v{version}").as_bytes());
    }
    if nonce.is_none() {
        let mut n = Vec::new();
        field(&mut n, 1, node.as_bytes());
        field(&mut m, 2, &n);
    }
    field(&mut m, 4, CDS);
    if let Some(nonce) = nonce {
        field(&mut m, 5, nonce.to_string().as_bytes());
    }
    grpc(&m)
}

/// The control plane: every stream gets the current version's CDS when it opens and again
/// whenever the version changes; it can restart (every connection closed at once).
#[derive(Clone)]
struct ControlPlane {
    clusters: usize,
    version: watch::Sender<u64>,
    pushes: Arc<Mutex<std::collections::HashMap<u64, Bytes>>>,
    nonces: Arc<AtomicU64>,
    /// Answers received.
    answers: Arc<AtomicU64>,
}

impl ControlPlane {
    fn new(clusters: usize) -> Self {
        ControlPlane {
            clusters,
            version: watch::channel(1).0,
            pushes: Arc::default(),
            nonces: Arc::new(AtomicU64::new(1)),
            answers: Arc::default(),
        }
    }

    fn push_of(&self, version: u64) -> Bytes {
        let mut pushes = self.pushes.lock().unwrap();
        (pushes.entry(version))
            .or_insert_with(|| cds(self.clusters, version))
            .clone()
    }

    /// Serves on `listener` until the returned task is aborted, which drops every connection.
    fn serve(&self, listener: TcpListener) -> tokio::task::JoinHandle<()> {
        let cp = self.clone();
        tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((s, _)) = listener.accept().await {
                let _ = s.set_nodelay(true);
                conns.spawn(cp.clone().connection(s));
                while conns.try_join_next().is_some() {}
            }
        })
    }

    async fn connection(self, s: TcpStream) {
        let Ok(mut conn) = h2::server::Builder::new()
            .initial_window_size(16 << 20)
            .initial_connection_window_size(24 << 20)
            .max_concurrent_streams(10_000)
            .handshake::<_, Bytes>(s)
            .await
        else {
            return;
        };
        let mut streams = tokio::task::JoinSet::new();
        while let Some(Ok((req, respond))) = conn.accept().await {
            streams.spawn(self.clone().stream(req.into_body(), respond));
        }
    }

    async fn stream(self, mut body: h2::RecvStream, mut respond: h2::server::SendResponse<Bytes>) {
        let resp = http::Response::builder()
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let Ok(mut send) = respond.send_response(resp, false) else {
            return;
        };
        let mut version = self.version.subscribe();
        let mut buf = BytesMut::new();
        let mut opened = false;
        loop {
            tokio::select! {
                data = body.data() => {
                    let Some(Ok(chunk)) = data else { return };
                    let _ = body.flow_control().release_capacity(chunk.len());
                    buf.extend_from_slice(&chunk);
                    while buf.len() >= 5 {
                        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                        if buf.len() < 5 + len {
                            break;
                        }
                        buf.advance(5 + len);
                        if opened {
                            self.answers.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        opened = true;
                        let v = *version.borrow_and_update();
                        if !self.push(&mut send, v).await {
                            return;
                        }
                    }
                }
                changed = version.changed(), if opened => {
                    if changed.is_err() {
                        return;
                    }
                    let v = *version.borrow_and_update();
                    if !self.push(&mut send, v).await {
                        return;
                    }
                }
            }
        }
    }

    async fn push(&self, send: &mut h2::SendStream<Bytes>, version: u64) -> bool {
        let head = self.push_of(version);
        let mut nonce = Vec::new();
        let n = self.nonces.fetch_add(1, Ordering::Relaxed);
        field(&mut nonce, 5, n.to_string().as_bytes());
        let mut prefix = vec![0];
        prefix.extend_from_slice(&((head.len() + nonce.len()) as u32).to_be_bytes());
        send_all(send, prefix.into()).await
            && send_all(send, head).await
            && send_all(send, nonce.into()).await
    }
}

/// A control plane's listener as Go's (istiod's) is: a backlog of `net.core.somaxconn`, so
/// that clients reconnecting at once are not held up by the control plane's own queue.
fn listen(addr: &str) -> TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr.parse().unwrap()).unwrap();
    socket.listen(4096).unwrap()
}

/// Sends within the peer's window, so no sender buffers a whole push.
async fn send_all(send: &mut h2::SendStream<Bytes>, mut data: Bytes) -> bool {
    while !data.is_empty() {
        send.reserve_capacity(data.len().min(4 << 20));
        match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(n)) if n > 0 => {
                if send
                    .send_data(data.split_to(n.min(data.len())), false)
                    .is_err()
                {
                    return false;
                }
            }
            Some(Ok(_)) => {}
            _ => return false,
        }
    }
    true
}

async fn connect(addr: &str) -> Option<h2::client::SendRequest<Bytes>> {
    let io = TcpStream::connect(addr).await.ok()?;
    io.set_nodelay(true).ok()?;
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(16 << 20)
        .initial_connection_window_size(24 << 20)
        .handshake(io)
        .await
        .ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Some(client)
}

/// One client's ADS stream.
struct Stream {
    node: String,
    send: h2::SendStream<Bytes>,
    recv: h2::RecvStream,
}

impl Stream {
    /// Opens a stream as `node`, stating `version` when it runs one.
    async fn open(
        client: &h2::client::SendRequest<Bytes>,
        node: &str,
        version: u64,
    ) -> Option<Self> {
        let mut client = client.clone().ready().await.ok()?;
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://xds{ADS}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (resp, mut send) = client.send_request(req, false).ok()?;
        send.send_data(request(node, version, None), false).ok()?;
        Some(Stream {
            node: node.into(),
            send,
            recv: resp.await.ok()?.into_body(),
        })
    }

    /// Reads one whole push and answers it; `None` when the stream ends first.
    async fn take(&mut self, version: u64) -> Option<()> {
        let mut prefix = Vec::with_capacity(5);
        let mut want = usize::MAX;
        let mut got = 0usize;
        // The message's last bytes: its nonce (field 5, last) is among them.
        let mut tail = Vec::new();
        while got < want {
            let chunk = self.recv.data().await?.ok()?;
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
            tail.extend_from_slice(&rest[rest.len().saturating_sub(32)..]);
            tail.drain(..tail.len().saturating_sub(32));
        }
        // The answer names the push's nonce, as a proxy's does, so the tap can pair them.
        let nonce = (0..tail.len().saturating_sub(2))
            .find(|&p| tail[p] == 0x2a && tail[p + 1] as usize == tail.len() - p - 2)
            .and_then(|p| std::str::from_utf8(&tail[p + 2..]).ok()?.parse().ok())
            .unwrap_or(0);
        self.send
            .send_data(request(&self.node, version, Some(nonce)), false)
            .ok()
    }
}

/// The tap as its own process (this tree, or `SIDEBYSIDE_BEFORE`'s build), or none: direct.
struct Tap {
    child: Option<Child>,
    addr: String,
    /// The tap's event log (a tap's only), removed with the tap.
    log: Option<PathBuf>,
}

impl Tap {
    fn start(name: &str, upstream: &str) -> Tap {
        if name == "direct" {
            return Tap {
                child: None,
                addr: upstream.into(),
                log: None,
            };
        }
        if name == "l4-relay" {
            let addr = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().to_string()
            };
            let child = Command::new(std::env::current_exe().unwrap())
                .env("STORM_L4", format!("{addr} {upstream}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while std::net::TcpStream::connect(&addr).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "the L4 relay did not start listening"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            return Tap {
                child: Some(child),
                addr,
                log: None,
            };
        }
        let bin = match name {
            "before" => PathBuf::from(std::env::var("SIDEBYSIDE_BEFORE").unwrap()),
            _ => PathBuf::from(env!("CARGO_BIN_EXE_xdstap")),
        };
        let free = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let (addr, admin) = (free(), free());
        static LOGS: AtomicUsize = AtomicUsize::new(0);
        let log = std::env::temp_dir().join(format!(
            "xdstap-storm-{}-{}.jsonl",
            std::process::id(),
            LOGS.fetch_add(1, Ordering::Relaxed)
        ));
        // STORM_TAP_WRAP="heaptrack -o FILE" (or "env MALLOC_ARENA_MAX=1") runs the tap under
        // that command; a profiler's RSS figures are void.
        let wrap = std::env::var("STORM_TAP_WRAP").unwrap_or_default();
        let mut words = wrap.split_whitespace();
        let mut command = match words.next() {
            Some(tool) => {
                let mut c = Command::new(tool);
                c.args(words).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        let child = command
            .args([
                "run",
                "--listen",
                &addr,
                "--upstream",
                upstream,
                "--admin",
                &admin,
            ])
            .arg("--event-log")
            .arg(&log)
            .args(["--log-level", "error"])
            // STORM_TAP_ARGS adds flags, e.g. "--event-queue 1024".
            .args(
                std::env::var("STORM_TAP_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "{name} did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
        Tap {
            child: Some(child),
            addr,
            log: Some(log),
        }
    }

    /// What the tap's event log holds so far: (ACKs, resubscribes).
    fn recorded(&self) -> (usize, usize) {
        let Some(log) = &self.log else { return (0, 0) };
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let acks = text.matches(r#""verdict":"ack""#).count();
        let resubscribes = text.matches(r#""event":"resubscribe""#).count();
        (acks, resubscribes)
    }

    /// Waits (60 s at most) until the event log holds `acks` ACKs and `resubscribes`
    /// resubscribes, and says what it holds.
    async fn count(&self, acks: usize, resubscribes: usize) -> (usize, usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.recorded();
            if got.0 >= acks && got.1 >= resubscribes || Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn rss_kib(&self) -> u64 {
        self.child.as_ref().map_or(0, |c| rss_kib(c.id()))
    }

    /// Descriptors the tap holds.
    fn fds(&self) -> usize {
        let Some(c) = &self.child else { return 0 };
        std::fs::read_dir(format!("/proc/{}/fd", c.id())).map_or(0, |d| d.count())
    }
}

fn rss_kib(pid: u32) -> u64 {
    (std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default())
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

impl Drop for Tap {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            // SIGTERM first (to a profiler's child too): a profiler writes its data when the
            // tap exits.
            let _ = Command::new("pkill")
                .args(["-TERM", "-P", &c.id().to_string()])
                .status();
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            if let Some(log) = &self.log {
                let _ = std::fs::remove_file(log);
            }
            let _ = c.wait();
        }
    }
}

/// Samples the tap's RSS every 10 ms until dropped; the highest seen.
struct Peak {
    high: Arc<AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Peak {
    fn watch(tap: &Tap) -> Peak {
        let pid = tap.child.as_ref().map(|c| c.id());
        let high = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (h, s) = (Arc::clone(&high), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                h.fetch_max(pid.map_or(0, rss_kib), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Peak { high, stop }
    }

    fn high(&self) -> u64 {
        self.high.load(Ordering::Relaxed)
    }
}

impl Drop for Peak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits until `n` answers have reached the control plane.
async fn answered(cp: &ControlPlane, n: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while cp.answers.load(Ordering::Relaxed) < n {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {n} answers",
            cp.answers.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `push`: the tap's RSS over idle per stream once every stream has the first version, at the
/// peak of the second's storm and `after` later, KiB.
async fn push_storm(
    name: &str,
    streams: usize,
    clusters: usize,
    after: Duration,
) -> (f64, f64, f64) {
    let cp = ControlPlane::new(clusters);
    let listener = listen("127.0.0.1:0");
    let upstream = listener.local_addr().unwrap().to_string();
    let _server = cp.serve(listener);
    let tap = Tap::start(name, &upstream);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = tap.rss_kib();
    // The clients in a process of their own, reading at their own pace, as proxies do.
    let mut clients = Command::new(std::env::current_exe().unwrap())
        .env("STORM_PUSH_CLIENTS", format!("{} {streams}", tap.addr))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    answered(&cp, streams as u64, "v1").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let first = tap.rss_kib();
    let peak = Peak::watch(&tap);
    cp.version.send_replace(2);
    answered(&cp, 2 * streams as u64, "v2").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let high = peak.high();
    drop(peak);
    tokio::time::sleep(after).await;
    let later = tap.rss_kib();
    let _ = clients.kill();
    let _ = clients.wait();
    let per = |kib: u64| kib.saturating_sub(idle) as f64 / streams as f64;
    (per(first), per(high), per(later))
}

/// The push storm's clients (`STORM_PUSH_CLIENTS="ADDR N"`, in a process of their own): `N`
/// streams, one connection each, opened one by one, each taking the first version; then each
/// takes the second as it comes, and holds its stream open, as a proxy does, until killed.
async fn push_clients(spec: &str) {
    let (addr, streams) = spec.split_once(' ').expect("ADDR N");
    let streams: usize = streams.parse().expect("N");
    let mut clients = Vec::new();
    for i in 0..streams {
        let client = connect(addr).await.unwrap();
        let mut s = Stream::open(&client, &format!("proxy-{i}"), 0)
            .await
            .unwrap();
        s.take(1).await.unwrap();
        clients.push(tokio::spawn(async move {
            let _client = client;
            s.take(2).await;
            std::future::pending::<()>().await;
        }));
    }
    std::future::pending::<()>().await;
}

/// `gone`: the tap's RSS over idle per node once `nodes` nodes, each pushed `clusters`
/// clusters, have all disconnected, KiB.
async fn gone(name: &str, nodes: usize, clusters: usize) -> f64 {
    let cp = ControlPlane::new(clusters);
    let listener = listen("127.0.0.1:0");
    let upstream = listener.local_addr().unwrap().to_string();
    let _server = cp.serve(listener);
    let tap = Tap::start(name, &upstream);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (idle, idle_fds) = (tap.rss_kib(), tap.fds());
    let mut held = Vec::new();
    for chunk in 0..nodes.div_ceil(100) {
        let client = connect(&tap.addr).await.unwrap();
        let mut streams = Vec::new();
        for i in chunk * 100..((chunk + 1) * 100).min(nodes) {
            let mut s = Stream::open(&client, &format!("gone-{i}"), 0)
                .await
                .unwrap();
            s.take(1).await.unwrap();
            streams.push(s);
        }
        held.push((client, streams));
    }
    answered(&cp, nodes as u64, "v1").await;
    drop(held);
    // Every connection closed at the tap: what stays is the nodes' records.
    let deadline = Instant::now() + Duration::from_secs(60);
    while tap.fds() > idle_fds + 2 {
        assert!(
            Instant::now() < deadline,
            "the tap still holds {} descriptors",
            tap.fds()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What the connections' ends left to do is done.
    tokio::time::sleep(Duration::from_secs(2)).await;
    tap.rss_kib().saturating_sub(idle) as f64 / nodes as f64
}

/// `reconnect`: `streams` clients through `addr` (direct or a tap) on `upstream`'s control
/// plane; it restarts and every client reconnects at once when it is back: the times, from
/// then, by which 50%, 90% and all of them had the whole CDS again and answered; and, through a
/// tap, what it recorded: (ACKs, resubscribes), of `2 * streams` and `streams`.
async fn reconnect_storm(
    name: &str,
    streams: usize,
    clusters: usize,
) -> ([Duration; 3], Option<(usize, usize)>) {
    let cp = ControlPlane::new(clusters);
    let listener = listen("127.0.0.1:0");
    let upstream = listener.local_addr().unwrap().to_string();
    let server = cp.serve(listener);
    let tap = Tap::start(name, &upstream);
    let back = watch::channel(None::<Instant>).0;
    let resynced = Arc::new(Mutex::new(Vec::new()));
    let up = Arc::new(AtomicUsize::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..streams {
        let (addr, mut back, resynced, up) = (
            tap.addr.clone(),
            back.subscribe(),
            resynced.clone(),
            up.clone(),
        );
        clients.spawn(async move {
            let node = format!("proxy-{i}");
            let client = connect(&addr).await.unwrap();
            let mut s = Stream::open(&client, &node, 0).await.unwrap();
            s.take(1).await.unwrap();
            up.fetch_add(1, Ordering::Relaxed);
            // The control plane goes: the stream (and the connection) with it.
            while let Some(Ok(_)) = s.recv.data().await {}
            drop((s, client));
            let at = *back.wait_for(|b| b.is_some()).await.unwrap();
            let at = at.unwrap();
            loop {
                if let Some(client) = connect(&addr).await {
                    if let Some(mut s) = Stream::open(&client, &node, 1).await {
                        if s.take(1).await.is_some() {
                            resynced.lock().unwrap().push(at.elapsed());
                            std::future::pending::<()>().await;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while up.load(Ordering::Relaxed) < streams {
        let n = up.load(Ordering::Relaxed);
        assert!(
            Instant::now() < deadline,
            "{name}: only {n} of {streams} clients came up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The restart: every connection closed; then listening again on the same address.
    server.abort();
    let _ = server.await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listener = listen(&upstream);
    let _server = cp.serve(listener);
    back.send_replace(Some(Instant::now()));
    let deadline = Instant::now() + Duration::from_secs(300);
    while resynced.lock().unwrap().len() < streams {
        assert!(
            Instant::now() < deadline,
            "{name}: not every client resynced"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut times = resynced.lock().unwrap().clone();
    times.sort();
    let at = |q: f64| times[((streams as f64 * q).ceil() as usize).clamp(1, streams) - 1];
    let recorded = match tap.log {
        Some(_) => Some(tap.count(2 * streams, streams).await),
        None => None,
    };
    clients.abort_all();
    ([at(0.5), at(0.9), at(1.0)], recorded)
}

fn main() {
    if let Ok(spec) = std::env::var("STORM_L4") {
        l4::relay(&spec);
    }
    let full = std::env::args().any(|a| a == "--bench");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Ok(spec) = std::env::var("STORM_PUSH_CLIENTS") {
        rt.block_on(push_clients(&spec));
    }
    rt.block_on(run(full));
}

async fn run(full: bool) {
    let picked = std::env::var("STORM").unwrap_or_else(|_| "push,gone,reconnect".into());
    let on = |w: &str| picked.split(',').any(|p| p == w);
    let mut taps = vec!["xdstap"];
    if std::env::var_os("SIDEBYSIDE_BEFORE").is_some() {
        taps.insert(0, "before");
    }
    if on("push") {
        let (streams, clusters, after) = match full {
            true => (1_000, 2_000, Duration::from_secs(30)),
            false => (10, 50, Duration::from_millis(100)),
        };
        for name in &taps {
            let (first, peak, later) = push_storm(name, streams, clusters, after).await;
            println!(
                "push, {name}: {streams} streams x {clusters} clusters: RSS over idle per stream \
                 {first:.1} KiB on the first version (pushed as streams open); the second to all \
                 at once: {peak:.1} KiB at the peak, {later:.1} KiB {after:?} after"
            );
        }
    }
    if on("gone") {
        let (nodes, clusters) = if full {
            (
                std::env::var("STORM_NODES")
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(10_000),
                100,
            )
        } else {
            (200, 10)
        };
        for name in &taps {
            let per = gone(name, nodes, clusters).await;
            println!(
                "gone, {name}: {nodes} nodes disconnected: RSS over idle {per:.2} KiB per node, \
                 {:.1} MiB in all",
                per * nodes as f64 / 1024.0
            );
        }
    }
    if on("reconnect") {
        let clients = std::env::var("STORM_CLIENTS")
            .ok()
            .and_then(|n| n.parse().ok());
        let (streams, clusters) = if full {
            (clients.unwrap_or(2_000), 2_000)
        } else {
            (20, 50)
        };
        let rounds: usize = (std::env::var("STORM_ROUNDS").ok())
            .and_then(|r| r.parse().ok())
            .unwrap_or(if full { 3 } else { 1 });
        let mut names = vec!["direct", "l4-relay"];
        names.extend(taps.iter().copied());
        let mut all: Vec<(&str, [Duration; 3])> = Vec::new();
        for round in 0..rounds {
            for name in &names {
                let (t, recorded) = reconnect_storm(name, streams, clusters).await;
                let recorded = recorded.map_or(String::new(), |(acks, resubscribes)| {
                    format!(
                        "; recorded {acks} of {} ACKs, {resubscribes} of {streams} resubscribes",
                        2 * streams
                    )
                });
                println!(
                    "reconnect round {round}, {name}: {streams} clients resynced: 50% {:?}, \
                     90% {:?}, 100% {:?}{recorded}",
                    t[0], t[1], t[2]
                );
                all.push((name, t));
            }
        }
        let mean = |who: &str, i: usize| -> f64 {
            let v: Vec<f64> = (all.iter())
                .filter(|(n, _)| *n == who)
                .map(|(_, t)| t[i].as_secs_f64())
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        for (name, base) in names[1..]
            .iter()
            .map(|n| (*n, "direct"))
            .chain(taps.iter().map(|n| (*n, "l4-relay")))
        {
            let ratio = |i: usize| mean(name, i) / mean(base, i);
            println!(
                "reconnect, {name}/{base} (means over {rounds} rounds): 50% {:.2}, 90% {:.2}, \
                 100% {:.2}",
                ratio(0),
                ratio(1),
                ratio(2)
            );
        }
    }
}
