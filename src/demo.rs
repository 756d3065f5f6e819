//! `xdstap demo`: the whole story in one process. An embedded SotW ADS control plane serves real
//! Envoy config (hand-encoded Cluster and Listener protos) through the real tap on loopback to an
//! xDS client: a real Envoy when one is found, else a built-in client that validates clusters the
//! way Envoy does for the demo's one rejected case and says it is a stand-in. The driver changes
//! the control plane's config step by step; everything printed comes from the tap's own events,
//! status board and spans.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::correlate::{Event, Verdict};
use crate::observe::spans::{SpanSettings, SpanStats};
use crate::observe::status::{StatusBoard, StatusSettings};
use crate::proxy::{Connector, Endpoint, Listener, Proxy, Settings};
use crate::tap::Pipeline;
use crate::xds::short_type;

const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const NODE: &str = "demo-client~127.0.0.1~builtin.demo~demo.svc.cluster.local";
const ENVOY_NODE: &str = "demo-envoy~127.0.0.1~envoy.demo~demo.svc.cluster.local";

use crate::xds::wire as pb;

/// A STATIC cluster (type 0, no endpoints) with a connect timeout; name field 1,
/// connect_timeout 4. Envoy rejects a timeout of 0s.
fn cluster(name: &str, timeout_ms: u64) -> Vec<u8> {
    let mut c = Vec::new();
    pb::bytes(&mut c, 1, name.as_bytes());
    let mut d = Vec::new();
    if timeout_ms >= 1000 {
        pb::uint(&mut d, 1, timeout_ms / 1000);
    }
    if !timeout_ms.is_multiple_of(1000) {
        pb::uint(&mut d, 2, (timeout_ms % 1000) * 1_000_000);
    }
    pb::bytes(&mut c, 4, &d);
    c
}

/// A listener Envoy accepts: 127.0.0.1 on an ephemeral port, TCP-proxying to cluster `a`.
fn listener(name: &str) -> Vec<u8> {
    let mut socket = Vec::new();
    pb::bytes(&mut socket, 2, b"127.0.0.1");
    pb::uint(&mut socket, 3, 0);
    let mut address = Vec::new();
    pb::bytes(&mut address, 1, &socket);
    let mut tcp_proxy = Vec::new();
    pb::bytes(&mut tcp_proxy, 1, name.as_bytes());
    pb::bytes(&mut tcp_proxy, 2, b"a");
    let mut filter = Vec::new();
    pb::bytes(&mut filter, 1, b"envoy.filters.network.tcp_proxy");
    pb::bytes(&mut filter, 4, &any(TCP_PROXY, &tcp_proxy));
    let mut chain = Vec::new();
    pb::bytes(&mut chain, 3, &filter);
    let mut l = Vec::new();
    pb::bytes(&mut l, 1, name.as_bytes());
    pb::bytes(&mut l, 2, &address);
    pb::bytes(&mut l, 3, &chain);
    l
}

fn any(type_url: &str, value: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    pb::bytes(&mut a, 1, type_url.as_bytes());
    pb::bytes(&mut a, 2, value);
    a
}

fn response(type_url: &str, version: &str, nonce: &str, resources: &[Vec<u8>]) -> Vec<u8> {
    let mut m = Vec::new();
    pb::bytes(&mut m, 1, version.as_bytes());
    for r in resources {
        pb::bytes(&mut m, 2, &any(type_url, r));
    }
    pb::bytes(&mut m, 4, type_url.as_bytes());
    pb::bytes(&mut m, 5, nonce.as_bytes());
    m
}

fn request(type_url: &str, version: &str, nonce: &str, node: bool, error: Option<&str>) -> Vec<u8> {
    let mut m = Vec::new();
    pb::bytes(&mut m, 1, version.as_bytes());
    if node {
        let mut n = Vec::new();
        pb::bytes(&mut n, 1, NODE.as_bytes());
        pb::bytes(&mut n, 2, b"demo");
        pb::bytes(&mut n, 6, b"xdstap-demo-client");
        pb::bytes(&mut m, 2, &n);
    }
    pb::bytes(&mut m, 4, type_url.as_bytes());
    pb::bytes(&mut m, 5, nonce.as_bytes());
    if let Some(message) = error {
        let mut s = Vec::new();
        pb::uint(&mut s, 1, 13);
        pb::bytes(&mut s, 2, message.as_bytes());
        pb::bytes(&mut m, 6, &s);
    }
    m
}

/// One end of a gRPC stream: send and receive whole messages.
struct Pipe {
    send: SendStream<Bytes>,
    recv: RecvStream,
    buf: BytesMut,
}

impl Pipe {
    fn send(&mut self, msg: &[u8]) -> anyhow::Result<()> {
        self.send
            .send_data(Bytes::from(crate::grpc::encode(msg)), false)?;
        Ok(())
    }
    async fn recv(&mut self) -> anyhow::Result<Vec<u8>> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    return Ok(self.buf.split_to(len).to_vec());
                }
            }
            let chunk = self
                .recv
                .data()
                .await
                .ok_or_else(|| anyhow::anyhow!("stream ended"))??;
            let _ = self.recv.flow_control().release_capacity(chunk.len());
            self.buf.extend_from_slice(&chunk);
        }
    }
}

/// The built-in client's validation: what Envoy says of a cluster whose connect_timeout is 0s.
fn validate(type_url: &str, resource: &[u8]) -> Option<String> {
    if type_url != CDS {
        return None;
    }
    let fields = pb::fields(resource);
    let name = fields
        .iter()
        .find(|f| f.0 == 1)
        .map(|f| String::from_utf8_lossy(&f.2).into_owned())?;
    let timeout = fields.iter().find(|f| f.0 == 4).map(|f| pb::fields(&f.2));
    let positive = timeout.is_some_and(|d| d.iter().any(|(_, v, _)| *v > 0));
    (!positive).then(|| {
        format!(
            "Error adding/updating cluster(s) {name}: Proto constraint validation failed \
             (ClusterValidationError.ConnectTimeout: value must be greater than 0s)"
        )
    })
}

/// The control plane's config: one version for both types.
#[derive(Clone, Debug)]
struct Snapshot {
    version: String,
    /// (name, connect timeout in ms)
    clusters: Vec<(&'static str, u64)>,
    listeners: Vec<&'static str>,
}

impl Snapshot {
    fn response(&self, type_url: &str, nonce: &str) -> Vec<u8> {
        let resources: Vec<Vec<u8>> = if type_url == CDS {
            self.clusters.iter().map(|(n, t)| cluster(n, *t)).collect()
        } else {
            self.listeners.iter().map(|n| listener(n)).collect()
        };
        response(type_url, &self.version, nonce, &resources)
    }
}

/// What the driver tells every open stream.
#[derive(Clone, Debug)]
enum Command {
    /// Push the current snapshot of this type.
    Push(&'static str),
    /// Push two CDS snapshots in one DATA frame, before any answer can come back.
    PushPair(Snapshot, Snapshot),
    /// End the stream with grpc-status 14: the control plane restarting.
    Restart,
}

/// A SotW ADS server on raw HTTP/2: answers each new subscription with the current snapshot and
/// pushes on command.
#[derive(Clone)]
struct ControlPlane {
    snapshot: Arc<Mutex<Snapshot>>,
    streams: Arc<Mutex<Vec<mpsc::UnboundedSender<Command>>>>,
    nonce: Arc<AtomicU64>,
}

impl ControlPlane {
    fn new(snapshot: Snapshot) -> Self {
        ControlPlane {
            snapshot: Arc::new(Mutex::new(snapshot)),
            streams: Arc::default(),
            nonce: Arc::new(AtomicU64::new(0)),
        }
    }

    fn set(&self, s: Snapshot) {
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    fn current(&self) -> Snapshot {
        self.snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn next_nonce(&self) -> String {
        (self.nonce.fetch_add(1, Ordering::Relaxed) + 1).to_string()
    }

    fn command(&self, c: Command) {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|s| s.send(c.clone()).is_ok());
    }

    /// Serves on its own single-threaded runtime: a stream's task and its connection's task
    /// then never run at the same time, so frames queued together (a push and the trailers
    /// that end the stream, or two pushes) leave in one write, and the tap sees them together,
    /// as it would from a control plane that is slower than its client.
    fn serve(&self, listener: std::net::TcpListener) -> anyhow::Result<()> {
        listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let cp = self.clone();
        std::thread::Builder::new()
            .name("demo-control-plane".into())
            .spawn(move || runtime.block_on(cp.accept(listener)))?;
        Ok(())
    }

    async fn accept(self, listener: std::net::TcpListener) {
        let Ok(listener) = TcpListener::from_std(listener) else {
            return;
        };
        while let Ok((io, _)) = listener.accept().await {
            let _ = io.set_nodelay(true);
            let cp = self.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(io).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let mut head = http::Response::new(());
                    head.headers_mut().insert(
                        "content-type",
                        http::HeaderValue::from_static("application/grpc"),
                    );
                    let Ok(send) = respond.send_response(head, false) else {
                        continue;
                    };
                    let (tx, rx) = mpsc::unbounded_channel();
                    cp.streams
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(tx);
                    let pipe = Pipe {
                        send,
                        recv: req.into_body(),
                        buf: BytesMut::new(),
                    };
                    tokio::spawn(cp.clone().stream(pipe, rx));
                }
            });
        }
    }

    async fn stream(self, mut pipe: Pipe, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut subscribed: HashSet<&'static str> = HashSet::new();
        loop {
            tokio::select! {
                msg = pipe.recv() => {
                    let Ok(msg) = msg else { return };
                    let fields = pb::fields(&msg);
                    let type_url = fields.iter().find(|f| f.0 == 4).map(|f| f.2.clone()).unwrap_or_default();
                    let nonce = fields.iter().find(|f| f.0 == 5).map(|f| f.2.clone()).unwrap_or_default();
                    let t = match &type_url[..] {
                        b if b == CDS.as_bytes() => CDS,
                        b if b == LDS.as_bytes() => LDS,
                        _ => continue,
                    };
                    // A request naming no nonce opens a subscription: answer with the state.
                    if nonce.is_empty() && subscribed.insert(t) {
                        let r = self.current().response(t, &self.next_nonce());
                        if pipe.send(&r).is_err() {
                            return;
                        }
                    }
                }
                c = commands.recv() => {
                    let Some(c) = c else { return };
                    let sent = match c {
                        Command::Push(t) if subscribed.contains(t) => {
                            pipe.send(&self.current().response(t, &self.next_nonce()))
                        }
                        Command::Push(_) => Ok(()),
                        Command::PushPair(a, b) => {
                            let mut both = crate::grpc::encode(&a.response(CDS, &self.next_nonce()));
                            both.extend_from_slice(&crate::grpc::encode(&b.response(CDS, &self.next_nonce())));
                            pipe.send.send_data(Bytes::from(both), false).map_err(anyhow::Error::from)
                        }
                        Command::Restart => {
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("grpc-status", http::HeaderValue::from_static("14"));
                            trailers.insert("grpc-message", http::HeaderValue::from_static("control plane restarting"));
                            let _ = pipe.send.send_trailers(trailers);
                            return;
                        }
                    };
                    if sent.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// A response as the built-in client read it, with its validation result.
struct Received {
    type_url: String,
    version: String,
    nonce: String,
    error: Option<String>,
}

fn read_response(msg: &[u8]) -> Received {
    let fields = pb::fields(msg);
    let get = |n: u32| {
        fields
            .iter()
            .find(|f| f.0 == n)
            .map(|f| String::from_utf8_lossy(&f.2).into_owned())
            .unwrap_or_default()
    };
    let type_url = get(4);
    let error = fields
        .iter()
        .filter(|f| f.0 == 2)
        .filter_map(|f| {
            pb::fields(&f.2)
                .into_iter()
                .find(|a| a.0 == 2)
                .and_then(|v| validate(&type_url, &v.2))
        })
        .next();
    Received {
        version: get(1),
        nonce: get(5),
        type_url,
        error,
    }
}

async fn open_stream(tap: &str) -> anyhow::Result<Pipe> {
    let io = tokio::net::TcpStream::connect(tap).await?;
    io.set_nodelay(true)?;
    let (client, conn) = h2::client::handshake(io).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await?;
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{tap}{ADS}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let (resp, send) = client.send_request(req, false)?;
    let recv = resp.await?.into_body();
    Ok(Pipe {
        send,
        recv,
        buf: BytesMut::new(),
    })
}

/// How long the built-in client takes to apply a response before it answers.
const APPLY_TIME: Duration = Duration::from_millis(3);

/// The built-in client: subscribes to CDS and LDS, ACKs what validates, NACKs what does not
/// (keeping its last accepted version), and after the stream ends reconnects stating the
/// versions it has, like Envoy.
async fn builtin_client(tap: String) {
    let mut accepted: HashMap<String, String> = HashMap::new();
    loop {
        if let Ok(mut pipe) = open_stream(&tap).await {
            let v = |t: &str| accepted.get(t).cloned().unwrap_or_default();
            let opened = pipe
                .send(&request(CDS, &v(CDS), "", true, None))
                .and_then(|()| pipe.send(&request(LDS, &v(LDS), "", false, None)));
            if opened.is_ok() {
                while let Ok(msg) = pipe.recv().await {
                    let r = read_response(&msg);
                    // Envoy takes a few milliseconds to apply a config before it answers; so does
                    // this stand-in, so a control plane that ends the stream right after a push
                    // leaves that push unanswered, as it would with Envoy.
                    tokio::time::sleep(APPLY_TIME).await;
                    let answer = match &r.error {
                        None => {
                            accepted.insert(r.type_url.clone(), r.version.clone());
                            request(&r.type_url, &r.version, &r.nonce, false, None)
                        }
                        Some(e) => {
                            let kept = accepted.get(&r.type_url).cloned().unwrap_or_default();
                            request(&r.type_url, &kept, &r.nonce, false, Some(e))
                        }
                    };
                    if pipe.send(&answer).is_err() {
                        break;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where `xdstap demo` looks for Envoy, in order: `--envoy`, `ENVOY_BIN`, the project-local one
/// the test command installs (`.envoy/` here or in the source tree), `envoy` on `PATH`.
pub fn find_envoy(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Some(PathBuf::from(p));
    }
    let local = Path::new(".envoy/envoy/_bin/envoy");
    let source_tree = Path::new(env!("CARGO_MANIFEST_DIR")).join(".envoy/envoy/_bin/envoy");
    for p in [local.to_path_buf(), source_tree] {
        if p.is_file() {
            return Some(p);
        }
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("envoy"))
            .find(|p| p.is_file())
    })
}

/// A real Envoy bootstrapped to fetch CDS and LDS over SotW ADS from the tap.
struct EnvoyProcess {
    child: std::process::Child,
    dir: PathBuf,
}

impl EnvoyProcess {
    fn start(binary: &Path, tap: &str) -> anyhow::Result<EnvoyProcess> {
        let dir = std::env::temp_dir().join(format!("xdstap-demo-envoy-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let (host, port) = tap.rsplit_once(':').unwrap_or((tap, "0"));
        let bootstrap = format!(
            r#"node: {{ id: "{ENVOY_NODE}", cluster: demo }}
admin: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }} }}
dynamic_resources:
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    grpc_services: [ {{ envoy_grpc: {{ cluster_name: xdstap }} }} ]
  cds_config: {{ ads: {{}}, resource_api_version: V3 }}
  lds_config: {{ ads: {{}}, resource_api_version: V3 }}
static_resources:
  clusters:
  - name: xdstap
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: xdstap
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: "{host}", port_value: {port} }} }} }}
"#
        );
        let config = dir.join("bootstrap.yaml");
        std::fs::write(&config, bootstrap)?;
        let log = std::fs::File::create(dir.join("envoy.log"))?;
        let child = std::process::Command::new(binary)
            .arg("-c")
            .arg(&config)
            .args([
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "-l",
                "warning",
            ])
            .arg("--admin-address-path")
            .arg(dir.join("admin.txt"))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start Envoy {}: {e}", binary.display()))?;
        Ok(EnvoyProcess { child, dir })
    }

    /// Whether Envoy is still running; its log tail when it is not.
    fn check(&mut self) -> anyhow::Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = std::fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(10).collect();
            anyhow::bail!(
                "Envoy exited ({status}); last log lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(())
    }
}

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Which client the demo runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientChoice {
    /// Envoy when one is found, else the built-in client.
    Auto,
    /// Envoy (this binary, or the first found); an error when none is found.
    Envoy(Option<PathBuf>),
    /// The built-in stand-in.
    Builtin,
}

/// Options of `xdstap demo`.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// One JSON object per line instead of the timeline.
    pub json: bool,
    /// Colour in the timeline.
    pub color: bool,
    /// The client.
    pub client: ClientChoice,
    /// Span export: an OTLP endpoint when configured, else a local file.
    pub spans: Option<SpanSettings>,
}

struct Printer {
    json: bool,
    color: bool,
    start: u64,
    seen: usize,
}

impl Printer {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    fn say(&self, s: &str) {
        if !self.json {
            println!("{s}");
        }
    }

    /// Prints events not yet printed.
    fn events(&mut self, events: &[Event]) {
        for e in &events[self.seen..] {
            if self.json {
                println!("{}", serde_json::to_string(e).unwrap_or_default());
                continue;
            }
            let at = e.context();
            let t = format!("+{:7.3}s", at.time.saturating_sub(self.start) as f64 / 1e9);
            let ty = short_type(&at.type_url);
            let line = match e {
                Event::Subscribe { .. } => format!("{t}  {ty:4} subscribe"),
                Event::Resubscribe { version, .. } => format!("{t}  {ty:4} resubscribe after reconnect, client has {version}"),
                Event::SubscriptionChange { names, .. } => format!("{t}  {ty:4} subscription change: {}", names.join(",")),
                Event::Push { push, .. } => format!(
                    "{t}  {ty:4} push {} ({} resource{}: {}) nonce {}",
                    push.version,
                    push.resources.len(),
                    if push.resources.len() == 1 { "" } else { "s" },
                    push.resources.iter().map(|r| r.name).collect::<Vec<_>>().join(","),
                    push.nonce
                ),
                Event::Verdict { push, verdict, decided_at, client_version, .. } => {
                    let ms = decided_at.saturating_sub(push.at) as f64 / 1e6;
                    match verdict {
                        Verdict::Ack => self.paint("32", &format!("{t}  {ty:4} ACK  {} ({ms:.1} ms)", push.version)),
                        Verdict::Nack { error, suspects, changed } => self.paint(
                            "31;1",
                            &format!(
                                "{t}  {ty:4} NACK {} ({ms:.1} ms): client stays on {}\n             error: {}\n             suspects: {}   changed since last ACK: {}",
                                push.version,
                                client_version.as_deref().unwrap_or("?"),
                                crate::status::one_line(&error.message, false),
                                suspects.join(","),
                                changed.join(",")
                            ),
                        ),
                        Verdict::Superseded { by_nonce } => self.paint("33", &format!("{t}  {ty:4} superseded {} by nonce {by_nonce}", push.version)),
                        Verdict::Unanswered { grpc_status, message } => self.paint(
                            "33",
                            &format!("{t}  {ty:4} unanswered {} (stream ended: grpc-status {grpc_status:?}, {message})", push.version),
                        ),
                    }
                }
                Event::StaleAnswer { nonce, pending_nonce, .. } => {
                    self.paint("33", &format!("{t}  {ty:4} stale answer to nonce {nonce} while {pending_nonce} is pending (not an ACK of it)"))
                }
                Event::StreamEnd { grpc_status, message, .. } => self.paint(
                    "33",
                    &format!("{t}  ---  stream ended: grpc-status {}, {message}", grpc_status.map_or("none".to_string(), |s| s.to_string())),
                ),
            };
            println!("{line}");
        }
        self.seen = events.len();
    }
}

/// What the demo found, for `--json` and the exit status.
#[derive(Debug, Default, serde::Serialize)]
pub struct Outcome {
    /// Whether every step played as expected.
    pub ok: bool,
    /// `envoy` or `builtin`.
    pub client: String,
    /// The client's user agent, as its node said.
    pub user_agent: String,
    /// Step name and verdicts observed.
    pub steps: Vec<(String, Vec<String>)>,
    /// Suspects of the NACK in step 2.
    pub suspects: Vec<String>,
    /// The NACK message, as the client sent it.
    pub nack_message: String,
    /// The version the client stayed on after the NACK.
    pub kept_version: String,
    /// Where spans went.
    pub spans: String,
    /// Spans exported (or written).
    pub spans_exported: u64,
}

/// Waits until `done` holds for the recorded events, printing them as they come and a
/// progress line when it takes a while.
async fn wait_for(
    pipeline: &Pipeline,
    printer: &mut Printer,
    envoy: &mut Option<EnvoyProcess>,
    what: &str,
    mut done: impl FnMut(&[Event]) -> bool,
) -> anyhow::Result<()> {
    let limit = if envoy.is_some() { 30 } else { 10 };
    let start = tokio::time::Instant::now();
    let mut said = false;
    loop {
        let events = pipeline.recorder.events();
        printer.events(&events);
        if done(&events) {
            return Ok(());
        }
        if let Some(e) = envoy.as_mut() {
            e.check()?;
        }
        if !said && start.elapsed() > Duration::from_millis(1500) {
            said = true;
            printer.say(&printer.paint("2", &format!("           ... waiting for {what}")));
        }
        if start.elapsed() > Duration::from_secs(limit) {
            anyhow::bail!("the tap did not see {what} within {limit} s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn verdicts_since(events: &[Event], from: usize) -> Vec<String> {
    events[from.min(events.len())..]
        .iter()
        .filter_map(|e| match e {
            Event::Verdict {
                at, push, verdict, ..
            } => Some(format!(
                "{} {} {}",
                short_type(&at.type_url),
                push.version,
                verdict.name()
            )),
            Event::StaleAnswer { at, .. } => {
                Some(format!("{} stale-answer", short_type(&at.type_url)))
            }
            Event::Resubscribe { at, version, .. } => Some(format!(
                "{} resubscribe {version}",
                short_type(&at.type_url)
            )),
            _ => None,
        })
        .collect()
}

fn snapshot(version: &str, a: u64, b: u64, listeners: &[&'static str]) -> Snapshot {
    Snapshot {
        version: version.into(),
        clusters: vec![("a", a), ("b", b)],
        listeners: listeners.to_vec(),
    }
}

/// Plays the story; prints the timeline (or JSON) and returns the outcome.
pub async fn run(options: DemoOptions) -> anyhow::Result<Outcome> {
    let envoy_binary = match &options.client {
        ClientChoice::Builtin => None,
        ClientChoice::Auto => find_envoy(None),
        ClientChoice::Envoy(p) => Some(find_envoy(p.as_deref()).ok_or_else(|| {
            anyhow::anyhow!(
                "no Envoy found: give --envoy PATH, set ENVOY_BIN, run scripts/test (it installs one \
                 in .envoy/), or put envoy on PATH"
            )
        })?),
    };
    if let Some(b) = &envoy_binary {
        if !b.is_file() {
            anyhow::bail!("no Envoy at {} (--envoy or ENVOY_BIN)", b.display());
        }
    }

    let status = StatusBoard::new(StatusSettings::default());
    let span_stats = Arc::new(SpanStats::default());
    let spans_file =
        std::env::temp_dir().join(format!("xdstap-demo-spans-{}.jsonl", std::process::id()));
    let span_settings = match options.spans.clone() {
        Some(s) => s,
        None => SpanSettings {
            file: Some(spans_file.clone()),
            ..Default::default()
        },
    };
    let spans_to = match (&span_settings.file, &span_settings.endpoint) {
        (Some(f), _) => format!("{} (OTLP JSON lines)", f.display()),
        (None, Some(e)) => e.clone(),
        (None, None) => "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
    };
    let (span_sink, span_task) = crate::observe::spans::start(
        SpanSettings {
            interval: Duration::from_millis(200),
            ..span_settings
        },
        span_stats.clone(),
    )?;
    let pipeline = Pipeline::start(
        crate::tap::PipelineOptions {
            queue_capacity: 4096,
            recorded_events: 10_000,
            ..Default::default()
        },
        vec![Box::new(status.clone()), Box::new(span_sink)],
    );
    let cp_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let cp_addr = cp_listener.local_addr()?.to_string();
    let cp = ControlPlane::new(snapshot("v1", 1000, 1000, &["http"]));
    cp.serve(cp_listener)?;
    let tap_listener = Listener::bind(&Endpoint::Tcp("127.0.0.1:0".into()), None).await?;
    let proxy = Proxy::new(
        tap_listener,
        Connector::new(Endpoint::Tcp(cp_addr.clone()), None),
        Settings::default(),
        pipeline.tap.clone(),
    );
    let tap_addr = proxy.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let proxy_task = tokio::spawn(proxy.serve(async {
        let _ = stop_rx.await;
    }));
    let mut printer = Printer {
        json: options.json,
        color: options.color,
        start: crate::tap::now(),
        seen: 0,
    };
    let mut outcome = Outcome {
        spans: spans_to.clone(),
        ..Default::default()
    };

    let mut envoy = None;
    let mut builtin = None;
    match &envoy_binary {
        Some(b) => {
            printer.say(&format!(
                "xdstap demo: Envoy ({}) -> tap {tap_addr} -> embedded control plane {cp_addr}\n",
                b.display()
            ));
            envoy = Some(EnvoyProcess::start(b, &tap_addr)?);
            outcome.client = "envoy".into();
        }
        None => {
            let why = if options.client == ClientChoice::Builtin {
                "as asked"
            } else {
                "no Envoy found; give --envoy PATH to use one"
            };
            printer.say(&format!(
                "xdstap demo: built-in xDS client -> tap {tap_addr} -> embedded control plane {cp_addr}\n\
                 (the built-in client is a stand-in for Envoy, {why}: it validates clusters the way\n\
                 Envoy does for this demo's one rejected case, a connect_timeout of 0s)\n"
            ));
            builtin = Some(tokio::spawn(builtin_client(tap_addr.clone())));
            outcome.client = "builtin".into();
        }
    }

    // Step 1: initial config -> ACK on every type.
    printer.say("1. Initial config: clusters a and b, listener http, all at v1");
    wait_for(&pipeline, &mut printer, &mut envoy, "the first ACKs", |e| {
        let v = verdicts_since(e, 0);
        v.contains(&"CDS v1 ack".into()) && v.contains(&"LDS v1 ack".into())
    })
    .await?;
    let events = pipeline.recorder.events();
    outcome.user_agent = events
        .iter()
        .find_map(|e| e.context().node.as_ref().map(|n| n.user_agent.clone()))
        .unwrap_or_default();
    let v = verdicts_since(&events, 0);
    let ok1 = v.iter().filter(|x| x.ends_with(" ack")).count() == v.len();
    outcome.steps.push(("initial".into(), v));

    // Step 2: a harmless change to `a` with an invalid `b` -> the whole CDS response is NACKed.
    printer.say("\n2. v2 changes cluster a (timeout 1s -> 2s) and, in the same push, breaks cluster b (timeout 0s)");
    let mark = pipeline.recorder.events().len();
    cp.set(snapshot("v2", 2000, 0, &["http"]));
    cp.command(Command::Push(CDS));
    wait_for(
        &pipeline,
        &mut printer,
        &mut envoy,
        "the answer to v2",
        |e| !verdicts_since(e, mark).is_empty(),
    )
    .await?;
    let events = pipeline.recorder.events();
    let nack = events[mark..].iter().find_map(|e| match e {
        Event::Verdict {
            verdict:
                Verdict::Nack {
                    error,
                    suspects,
                    changed,
                },
            client_version,
            ..
        } => Some((
            error.clone(),
            suspects.clone(),
            changed.clone(),
            client_version.clone(),
        )),
        _ => None,
    });
    let ok2 = match &nack {
        Some((error, suspects, changed, kept)) => {
            outcome.suspects = suspects.clone();
            outcome.nack_message = error.message.clone();
            outcome.kept_version = kept.clone().unwrap_or_default();
            printer.say(&format!(
                "           -> the client rejected the whole push and stays on {}; suspect: {}.\n           \
                 The harmless change to {} never landed.",
                kept.as_deref().unwrap_or("?"),
                suspects.join(","),
                changed.iter().filter(|c| !suspects.contains(c)).cloned().collect::<Vec<_>>().join(",")
            ));
            suspects == &vec!["b".to_string()]
                && kept.as_deref() == Some("v1")
                && error
                    .message
                    .contains("ConnectTimeout: value must be greater than 0s")
        }
        None => false,
    };
    outcome
        .steps
        .push(("bad push".into(), verdicts_since(&events, mark)));

    // Step 3: the fix -> ACK.
    printer.say("\n3. v3 fixes cluster b");
    let mark = pipeline.recorder.events().len();
    cp.set(snapshot("v3", 2000, 1000, &["http"]));
    cp.command(Command::Push(CDS));
    wait_for(
        &pipeline,
        &mut printer,
        &mut envoy,
        "the answer to v3",
        |e| !verdicts_since(e, mark).is_empty(),
    )
    .await?;
    let v = verdicts_since(&pipeline.recorder.events(), mark);
    let ok3 = v == vec!["CDS v3 ack".to_string()];
    outcome.steps.push(("fix".into(), v));

    // Step 4a: two pushes back to back: the client's answer to v4 arrives after v5 went out.
    printer.say("\n4. v4 and v5 pushed back to back, then a control-plane restart");
    let mark = pipeline.recorder.events().len();
    cp.set(snapshot("v5", 4000, 1000, &["http"]));
    cp.command(Command::PushPair(
        snapshot("v4", 3000, 1000, &["http"]),
        snapshot("v5", 4000, 1000, &["http"]),
    ));
    wait_for(
        &pipeline,
        &mut printer,
        &mut envoy,
        "the answer to v5",
        |e| verdicts_since(e, mark).iter().any(|v| v == "CDS v5 ack"),
    )
    .await?;
    let v = verdicts_since(&pipeline.recorder.events(), mark);
    let ok4 = v
        == vec![
            "CDS v4 superseded".to_string(),
            "CDS stale-answer".into(),
            "CDS v5 ack".into(),
        ];
    outcome.steps.push(("back to back".into(), v));

    // Step 4b: the control plane restarts with v6 ready; the client reconnects stating the
    // versions it runs and gets v6.
    let mark = pipeline.recorder.events().len();
    cp.set(snapshot("v6", 4000, 1000, &["http", "https"]));
    cp.command(Command::Restart);
    wait_for(
        &pipeline,
        &mut printer,
        &mut envoy,
        "the client to reconnect",
        |e| {
            let v = verdicts_since(e, mark);
            v.iter().any(|x| x == "CDS v6 ack") && v.iter().any(|x| x == "LDS v6 ack")
        },
    )
    .await?;
    let v = verdicts_since(&pipeline.recorder.events(), mark);
    let ok5 = v.contains(&"CDS resubscribe v5".to_string())
        && v.contains(&"LDS resubscribe v1".to_string())
        && v.contains(&"CDS v6 ack".to_string())
        && v.contains(&"LDS v6 ack".to_string());
    outcome.steps.push(("restart".into(), v));
    outcome.ok = ok1 && ok2 && ok3 && ok4 && ok5;

    // The status view, as `xdstap status` would show it, then the spans flushed.
    let report = status.report(crate::tap::now(), None);
    drop(envoy);
    if let Some(b) = builtin {
        b.abort();
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), proxy_task).await;
    pipeline.close().await;
    let _ = tokio::time::timeout(Duration::from_secs(10), span_task).await;
    outcome.spans_exported = span_stats.exported.load(Ordering::Relaxed);
    if options.json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "summary": &outcome, "status": &report }))?
        );
    } else {
        println!("\nStatus now (what `xdstap status` shows for a running tap):");
        print!("{}", crate::status::render(&report, true));
        println!("\nWhat happened:");
        println!(
            "  v1 was accepted; v2 was rejected as a whole because cluster b is invalid, so the"
        );
        println!("  harmless change to cluster a never landed until v3. v4 was superseded by v5, and the");
        println!("  client's late answer to v4 was not taken as acceptance of v5. When the control plane");
        println!("  restarted, the client reconnected stating the versions it runs (CDS v5, LDS v1) and got v6.");
        println!(
            "\nSpans: {} span(s) exported to {}",
            outcome.spans_exported, outcome.spans
        );
        println!(
            "Story played as expected: {}",
            if outcome.ok { "yes" } else { "NO" }
        );
    }
    Ok(outcome)
}
