//! The demo's control plane: a SotW ADS server on raw HTTP/2 that answers each new
//! subscription with the current snapshot and pushes on command (one push, two back to back,
//! or a restart).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::messages::{cluster, cluster_at, listener, response, Pipe, CDS, LDS};
use xdstap_core::xds::wire as pb;

/// The control plane's config: one version for both types.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// `version_info`.
    pub version: String,
    /// (name, connect timeout in ms)
    pub clusters: Vec<(&'static str, u64)>,
    /// A cluster whose endpoint address is no IP (Envoy rejects it alone as it adds it).
    pub bad_address: Option<&'static str>,
    /// Listener names.
    pub listeners: Vec<&'static str>,
}

impl Snapshot {
    fn response(&self, type_url: &str, nonce: &str) -> Vec<u8> {
        let resources: Vec<Vec<u8>> = if type_url == CDS {
            (self.clusters.iter())
                .map(|&(n, t)| match self.bad_address {
                    Some(bad) if bad == n => cluster_at(n, t, "not-an-ip"),
                    _ => cluster(n, t),
                })
                .collect()
        } else {
            self.listeners.iter().map(|n| listener(n)).collect()
        };
        response(type_url, &self.version, nonce, &resources)
    }
}

/// What the driver tells every open stream.
#[derive(Clone, Debug)]
pub enum Order {
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
pub struct ControlPlane {
    snapshot: Arc<Mutex<Snapshot>>,
    streams: Arc<Mutex<Vec<mpsc::UnboundedSender<Order>>>>,
    nonce: Arc<AtomicU64>,
}

impl ControlPlane {
    /// A control plane serving `snapshot`.
    pub fn new(snapshot: Snapshot) -> Self {
        ControlPlane {
            snapshot: Arc::new(Mutex::new(snapshot)),
            streams: Arc::default(),
            nonce: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Replaces the snapshot (pushed only on command).
    pub fn set(&self, s: Snapshot) {
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

    /// Tells every open stream.
    pub fn command(&self, c: Order) {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|s| s.send(c.clone()).is_ok());
    }

    /// Serves on its own single-threaded runtime: a stream's task and its connection's task
    /// then never run at the same time, so frames queued together (a push and the trailers
    /// that end the stream, or two pushes) leave in one write, and the tap sees them together,
    /// as it would from a control plane that is slower than its client.
    pub fn serve(&self, listener: std::net::TcpListener) -> anyhow::Result<()> {
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
                    let pipe = Pipe::new(send, req.into_body());
                    tokio::spawn(cp.clone().stream(pipe, rx));
                }
            });
        }
    }

    async fn stream(self, mut pipe: Pipe, mut commands: mpsc::UnboundedReceiver<Order>) {
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
                        Order::Push(t) if subscribed.contains(t) => {
                            pipe.send(&self.current().response(t, &self.next_nonce()))
                        }
                        Order::Push(_) => Ok(()),
                        Order::PushPair(a, b) => {
                            let mut both = xdstap_core::grpc::encode(&a.response(CDS, &self.next_nonce()));
                            both.extend_from_slice(&xdstap_core::grpc::encode(&b.response(CDS, &self.next_nonce())));
                            pipe.send.send_data(Bytes::from(both), false).map_err(anyhow::Error::from)
                        }
                        Order::Restart => {
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
