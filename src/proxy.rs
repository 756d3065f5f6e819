//! Transparent HTTP/2 forwarding: accept, one upstream stream per downstream stream, frames passed
//! on as they come. Knows HTTP/2 and nothing of gRPC or xDS; every DATA chunk is shown to an
//! [`Observe`]r before it is forwarded, and forwarding never waits on the observer.

mod batch;
mod connection;
mod listen;
mod stream;
mod tls;
mod upstream;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use listen::{Endpoint, Io, Listener};
pub use tls::{ClientTls, ServerTls, TlsError};
pub use upstream::{ConnectError, Connector};

/// HTTP/2 settings the tap advertises on both sides.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Initial stream flow-control window, bytes. Also the bound on bytes buffered per stream and
    /// direction.
    pub stream_window: u32,
    /// Initial connection flow-control window, bytes.
    pub connection_window: u32,
    /// Largest DATA frame payload we accept, bytes.
    pub max_frame_size: u32,
    /// Largest header list accepted from either side (Envoy's default is 60 KiB).
    pub max_header_list_size: u32,
    /// How long open streams may run after a shutdown signal before they are cut.
    pub shutdown_grace: Duration,
    /// How long to wait for the upstream TCP/TLS/HTTP2 handshake.
    pub connect_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        // The stream window is also what the tap may hold per stream and direction when the
        // receiver is slower than the sender, so it bounds the tap's memory for a big push.
        // 1 MiB moves pushes at full speed wherever the round trip is about a millisecond or
        // less; a stream moves at most one window per round trip, so links with a long round
        // trip want more (Envoy uses 16 MiB and 24 MiB).
        Settings {
            stream_window: 1 << 20,
            connection_window: 8 << 20,
            max_frame_size: 16_384,
            max_header_list_size: 64 << 10,
            shutdown_grace: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Which way a chunk travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client to control plane (requests).
    Request,
    /// Control plane to client (responses).
    Response,
}

/// The peer that caused something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The downstream client (Envoy, a gRPC client).
    Client,
    /// The upstream server (the control plane).
    Upstream,
}

/// What the proxy knows of a new stream when it opens.
#[derive(Debug)]
pub struct StreamInfo<'a> {
    /// Process-unique stream id.
    pub id: u64,
    /// `:path`, e.g. `/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources`.
    pub path: &'a str,
    /// Request headers as the client sent them.
    pub headers: &'a HeaderMap,
    /// Downstream peer address.
    pub downstream: &'a str,
    /// Upstream address.
    pub upstream: &'a str,
}

/// How a forwarded stream ended.
#[derive(Debug)]
pub enum StreamEnd {
    /// Both halves closed normally.
    Complete,
    /// A peer reset the stream with this HTTP/2 error code; the tap passed the reset on.
    Reset {
        /// Who reset it.
        by: Side,
        /// The RST_STREAM error code.
        reason: u32,
    },
    /// A connection failed under the stream (I/O error, GOAWAY, connect failure).
    Failed {
        /// Whose connection failed.
        by: Side,
        /// What failed, for humans.
        message: String,
    },
}

/// Creates one [`StreamObserver`] per forwarded stream.
pub trait Observe: Send + Sync + 'static {
    /// Called once when a stream opens, before anything is forwarded.
    fn on_stream(&self, info: &StreamInfo<'_>) -> Box<dyn StreamObserver>;
}

/// Sees one stream's traffic. Calls come from the forwarding task, so they must be quick and
/// must never block: hand anything slow to a queue.
pub trait StreamObserver: Send {
    /// A DATA chunk, shown before it is forwarded.
    fn on_data(&mut self, direction: Direction, chunk: &Bytes);
    /// Response headers (a trailers-only gRPC response carries `grpc-status` here).
    fn on_response_headers(&mut self, _headers: &HeaderMap) {}
    /// Trailers, shown before they are forwarded.
    fn on_trailers(&mut self, _direction: Direction, _trailers: &HeaderMap) {}
    /// The stream is over.
    fn on_end(&mut self, _end: &StreamEnd) {}
}

/// An observer that sees nothing: a plain forwarder.
pub struct NoObserver;

struct Nothing;

impl StreamObserver for Nothing {
    fn on_data(&mut self, _: Direction, _: &Bytes) {}
}

impl Observe for NoObserver {
    fn on_stream(&self, _: &StreamInfo<'_>) -> Box<dyn StreamObserver> {
        Box::new(Nothing)
    }
}

/// Counters of the forwarding layer. Cheap relaxed atomics, read by metrics and tests.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Downstream connections accepted.
    pub connections_total: AtomicU64,
    /// Downstream connections open now.
    pub connections_active: AtomicU64,
    /// Streams forwarded.
    pub streams_total: AtomicU64,
    /// Streams open now.
    pub streams_active: AtomicU64,
    /// DATA payload bytes forwarded client to upstream.
    pub request_bytes: AtomicU64,
    /// DATA payload bytes forwarded upstream to client.
    pub response_bytes: AtomicU64,
    /// Failed upstream connection attempts.
    pub upstream_connect_errors: AtomicU64,
    /// Downstream connections that failed their TLS or HTTP/2 handshake.
    pub handshake_errors: AtomicU64,
    /// Downstream connections that ended with an error (a protocol violation, a flood, a
    /// broken socket), after their handshake.
    pub connection_errors: AtomicU64,
    /// Most bytes one stream and direction ever held inside the tap (received, not yet handed on).
    pub peak_stream_buffered: AtomicU64,
}

impl ProxyStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn sub(counter: &AtomicU64, n: u64) {
        counter.fetch_sub(n, Ordering::Relaxed);
    }
    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Everything a connection task needs, shared.
pub(crate) struct Shared {
    pub settings: Settings,
    pub connector: Arc<Connector>,
    pub observer: Arc<dyn Observe>,
    pub stats: Arc<ProxyStats>,
    pub next_stream: AtomicU64,
}

/// A forwarder: a listener, an upstream, an observer.
pub struct Proxy {
    listener: Listener,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Builds a proxy on a bound listener, counting into `stats`.
    pub fn new(
        listener: Listener,
        connector: Connector,
        settings: Settings,
        observer: Arc<dyn Observe>,
        stats: Arc<ProxyStats>,
    ) -> Self {
        let shared = Arc::new(Shared {
            settings,
            connector: Arc::new(connector),
            observer,
            stats,
            next_stream: AtomicU64::new(1),
        });
        Proxy { listener, shared }
    }

    /// The forwarding counters.
    pub fn stats(&self) -> Arc<ProxyStats> {
        self.shared.stats.clone()
    }

    /// Where the listener is bound (`127.0.0.1:15010`, `unix:/path`).
    pub fn local_addr(&self) -> String {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves, then stops accepting, sends GOAWAY on every connection
    /// and gives open streams `shutdown_grace` to finish before cutting them.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut connections = JoinSet::new();
        let mut next_conn: u64 = 0;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((io, gate, peer)) => {
                        next_conn += 1;
                        let shared = self.shared.clone();
                        let stop = stop_rx.clone();
                        let tls = self.listener.tls();
                        connections.spawn(connection::serve(io, gate, tls, peer, next_conn, shared, stop));
                    }
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "Accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(self.listener);
        let open = connections.len();
        tracing::info!(connections = open, grace = ?self.shared.settings.shutdown_grace, "Shutting down");
        let _ = stop_tx.send(true);
        let drain = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(self.shared.settings.shutdown_grace, drain)
            .await
            .is_err()
        {
            tracing::warn!(
                connections = connections.len(),
                "Grace period over, closing open connections"
            );
            connections.shutdown().await;
            // Cut connections cut their streams; wait (briefly) for those tasks to be dropped,
            // so every observer has seen its stream end before the caller stops observing.
            let cut = tokio::time::Instant::now();
            while ProxyStats::get(&self.shared.stats.streams_active) > 0
                && cut.elapsed() < Duration::from_secs(1)
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Decrements a gauge when dropped, so every exit path counts.
struct Decrement<'a>(&'a AtomicU64);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        ProxyStats::sub(self.0, 1);
    }
}

/// Headers that describe one hop and must not be forwarded (RFC 9110 §7.6.1, RFC 9113 §8.2.2).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
    if headers.get("te").is_some_and(|v| v != "trailers") {
        headers.remove("te");
    }
}
