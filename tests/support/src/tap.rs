//! The tap started in-process on a loopback port or Unix socket, with its counters at hand.

use std::sync::Arc;

use xdstap::config::Options;
use xdstap::observer::ObserverStats;
use xdstap::outputs::Recorder;
use xdstap::proxy::{
    ClientTls, Connector, Endpoint, Listener, NoObserver, Observe, Proxy, ProxyStats, ServerTls,
    Settings,
};

pub struct Tap {
    pub addr: String,
    pub stats: Arc<ProxyStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

pub struct TapOptions {
    pub listen: Endpoint,
    pub upstream: Endpoint,
    pub settings: Settings,
    pub observer: Arc<dyn Observe>,
    pub tls: Option<ServerTls>,
    pub upstream_tls: Option<ClientTls>,
}

impl TapOptions {
    pub fn new(upstream: &str) -> Self {
        TapOptions {
            listen: Endpoint::Tcp("127.0.0.1:0".into()),
            upstream: upstream.parse().unwrap(),
            settings: Settings::default(),
            observer: Arc::new(NoObserver),
            tls: None,
            upstream_tls: None,
        }
    }
}

impl Tap {
    pub async fn start(upstream: &str) -> Tap {
        Tap::with(TapOptions::new(upstream)).await
    }

    pub async fn with(o: TapOptions) -> Tap {
        let acceptor = o.tls.map(|t| t.acceptor().unwrap());
        let listener = Listener::bind(&o.listen).await.unwrap().with_tls(acceptor);
        let tls = o
            .upstream_tls
            .map(|t| t.connector(o.upstream.host()).unwrap());
        let proxy = Proxy::new(
            listener,
            Connector::new(o.upstream, tls),
            o.settings,
            o.observer,
            Arc::default(),
        );
        let addr = proxy.local_addr();
        let stats = proxy.stats();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(proxy.serve(async {
            let _ = rx.await;
        }));
        Tap {
            addr,
            stats,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting and waits for the grace period to run out or every stream to end.
    pub async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The tap as `xdstap run` assembles it (the library's [`xdstap::Server`]), with its admin
/// server on a loopback port; verdicts are read from a recorder.
/// A tap's config as `xdstap run --listen LISTEN --upstream UPSTREAM --admin 127.0.0.1:0` makes
/// it, for a test to add to.
pub fn config(listen: &str, upstream: &str) -> xdstap::config::Config {
    Options::from_flags([
        "--listen",
        listen,
        "--upstream",
        upstream,
        "--admin",
        "127.0.0.1:0",
    ])
    .unwrap()
    .resolve()
    .unwrap()
}

pub struct XdsTap {
    pub tap: Tap,
    /// The observer's counters.
    pub stats: Arc<ObserverStats>,
    /// Every event, for the test to read.
    pub recorder: Recorder,
    /// The admin server's address.
    pub admin: String,
    /// Holds observing while forwarding goes on.
    pub observer: xdstap::Gate,
}

impl XdsTap {
    pub async fn start(options: TapOptions) -> XdsTap {
        XdsTap::with_sinks(options, vec![]).await
    }

    /// A tap whose events also go to `sinks` (spans, ...).
    pub async fn with_sinks(
        options: TapOptions,
        sinks: Vec<Box<dyn xdstap::queue::Sink>>,
    ) -> XdsTap {
        let mut config = config(&options.listen.to_string(), &options.upstream.to_string());
        config.tls = options.tls;
        config.upstream_tls = options.upstream_tls;
        config.proxy = options.settings;
        XdsTap::with_config(config, sinks).await
    }

    /// A tap as `xdstap run` would make it of `flags` (`--listen` and `--upstream` among them).
    pub async fn with_flags(flags: &[&str]) -> XdsTap {
        let config = Options::from_flags(flags).unwrap().resolve().unwrap();
        XdsTap::with_config(config, vec![]).await
    }

    /// A tap for `config` (listening where it says), its events also going to `sinks`.
    pub async fn with_config(
        config: xdstap::config::Config,
        sinks: Vec<Box<dyn xdstap::queue::Sink>>,
    ) -> XdsTap {
        let recorder = Recorder::new(100_000);
        let listener = Listener::bind(&config.listen).await.unwrap();
        let mut server = xdstap::Server::new(config).with_sink(Box::new(recorder.clone()));
        for sink in sinks {
            server = server.with_sink(sink);
        }
        if let Some(dir) = std::env::var_os("XDSTAP_FUZZ_SEEDS") {
            server = server.wrap_observer(move |inner| {
                Arc::new(Capture {
                    inner,
                    dir: dir.into(),
                })
            });
        }
        let running = server.start(listener).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr, proxy_stats) = (running.local_addr(), running.proxy_stats());
        let observer = running.observer_gate();
        let (stats, admin) = (
            running.tap_stats(),
            running.admin_addr().unwrap_or_default().to_string(),
        );
        let task = tokio::spawn(running.serve(async {
            let _ = stopped.await;
        }));
        XdsTap {
            tap: Tap {
                addr,
                stats: proxy_stats,
                stop: Some(stop),
                task: Some(task),
            },
            stats,
            recorder,
            admin,
            observer,
        }
    }

    /// Stops the tap: open streams get the grace period, every event reaches the sinks, spans
    /// are flushed.
    pub async fn close(self) {
        self.tap.shutdown().await;
    }

    pub fn events(&self) -> Vec<xdstap::correlate::Event> {
        self.recorder.events()
    }

    /// (node, short type, nonce, verdict) of every verdict so far.
    pub fn verdicts(&self) -> Vec<Verdict> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                xdstap::correlate::Event::Verdict {
                    context,
                    push,
                    verdict,
                    client_version,
                    ..
                } => Some(Verdict {
                    node: context
                        .node
                        .as_ref()
                        .map(|n| n.id.clone())
                        .unwrap_or_default(),
                    type_url: context.type_url.clone(),
                    nonce: push.nonce.clone(),
                    version: push.version.clone(),
                    verdict,
                    client_version,
                }),
                _ => None,
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub struct Verdict {
    pub node: String,
    pub type_url: String,
    pub nonce: String,
    pub version: String,
    pub verdict: xdstap::correlate::Verdict,
    pub client_version: Option<String>,
}

/// With `XDSTAP_FUZZ_SEEDS=DIR`, the xDS messages real peers exchange through an [`XdsTap`] are
/// written to DIR as fuzz seeds: `DIR/framer/*` (each direction's raw body) and
/// `DIR/decode/*` (each message, prefixed as the decode target reads it). See scripts/fuzz.
struct Capture {
    inner: Arc<dyn Observe>,
    dir: std::path::PathBuf,
}

struct CaptureStream {
    inner: Box<dyn xdstap::proxy::StreamObserver>,
    dir: std::path::PathBuf,
    id: u64,
    bodies: [Vec<u8>; 2],
    delta: bool,
}

impl Observe for Capture {
    fn on_stream(
        &self,
        info: &xdstap::proxy::StreamInfo<'_>,
    ) -> Box<dyn xdstap::proxy::StreamObserver> {
        Box::new(CaptureStream {
            inner: self.inner.on_stream(info),
            dir: self.dir.clone(),
            id: info.seq,
            bodies: [Vec::new(), Vec::new()],
            delta: info.path.contains("Delta"),
        })
    }
}

impl xdstap::proxy::StreamObserver for CaptureStream {
    fn on_data(&mut self, d: xdstap::proxy::Direction, chunk: &bytes::Bytes) {
        self.bodies[d as usize].extend_from_slice(chunk);
        self.inner.on_data(d, chunk);
    }
    fn on_response_headers(&mut self, h: &xdstap::proxy::Headers) {
        self.inner.on_response_headers(h);
    }
    fn on_trailers(&mut self, d: xdstap::proxy::Direction, t: &xdstap::proxy::Headers) {
        self.inner.on_trailers(d, t);
    }
    fn on_end(&mut self, end: &xdstap::proxy::StreamEnd) {
        self.inner.on_end(end);
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let pid = format!(
            "{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        for (i, body) in self.bodies.iter().enumerate() {
            if body.is_empty() {
                continue;
            }
            let framer = self.dir.join("framer");
            let _ = std::fs::create_dir_all(&framer);
            let mut seed = vec![7u8];
            seed.extend_from_slice(body);
            let _ = std::fs::write(framer.join(format!("{pid}-{}-{i}", self.id)), seed);
            let decode = self.dir.join("decode");
            let _ = std::fs::create_dir_all(&decode);
            // kind: bit 0 response, bit 1 delta (see fuzz/fuzz_targets/decode.rs)
            let kind = (i as u8) | if self.delta { 2 } else { 0 };
            let mut rest = &body[..];
            let mut n = 0;
            while rest.len() >= 5 {
                let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
                if rest.len() < 5 + len || rest[0] != 0 {
                    break;
                }
                let mut seed = vec![kind, (len / 2).min(255) as u8];
                seed.extend_from_slice(&rest[5..5 + len]);
                let _ = std::fs::write(decode.join(format!("{pid}-{}-{i}-{n}", self.id)), seed);
                rest = &rest[5 + len..];
                n += 1;
            }
        }
    }
}
