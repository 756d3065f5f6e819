//! Transparent HTTP/2 forwarding: accept a client connection, dial one upstream connection for
//! it, and relay the peers' own bytes both ways, reading the frames as they pass. Knows HTTP/2
//! framing and nothing of gRPC or xDS; every DATA payload is shown to an [`Observe`]r before it
//! is forwarded, and forwarding never waits on the observer.
//!
//! - `listen`: where the tap listens; `tls`: rustls on either side; `upstream`: dialing.
//! - `relay`: one connection pair, both directions in one task, moving bytes.
//! - `reader`: what the bytes mean: streams and their observers, for one connection;
//!   `frame` and `headers` read frames and HPACK header blocks for it.

mod frame;
mod headers;
pub(crate) mod listen;
mod reader;
mod relay;
mod tls;
mod upstream;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

pub use frame::{Reason, PREFACE};
pub use headers::Headers;
pub use listen::{AddressError, AsyncIo, Endpoint, Io, Listener};
pub use reader::{MAX_HEADER_BLOCK, MAX_STREAMS};
// The frame and HPACK readers are how the proxy reads, not its API: public to the crate's own
// tests and fuzz targets only.
#[cfg(feature = "internals")]
pub use frame::{Broken, Frame, FrameReader, StreamId};
#[cfg(feature = "internals")]
pub use headers::{HeaderReader, HpackError, MAX_HEADER_LIST};
#[cfg(feature = "internals")]
pub use reader::ConnectionReader;
#[cfg(not(feature = "internals"))]
use reader::ConnectionReader;
pub use relay::READ_CHUNK;
pub use tls::{ClientTls, ServerTls, TlsError};
pub use upstream::{ConnectError, Connector};

/// How the tap forwards.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long the tap goes on serving after a shutdown signal, not ready (`/readyz` 503),
    /// before it stops accepting: time for a load balancer to stop sending it clients.
    pub drain_delay: Duration,
    /// How long open streams may run, once the tap stops accepting, before their connections
    /// are closed.
    pub shutdown_grace: Duration,
    /// How long the upstream connect (TCP, TLS) and the client's TLS handshake may take.
    pub connect_timeout: Duration,
    /// Most client connections open at once (`None`: no limit); past it a new one is closed on
    /// accept.
    pub max_connections: Option<usize>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            drain_delay: Duration::ZERO,
            shutdown_grace: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            max_connections: None,
        }
    }
}

/// Which way bytes travel.
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
    /// The tap's number for the stream: counted across the process from 1, not the HTTP/2
    /// stream id.
    pub seq: u64,
    /// `:path`, e.g. `/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources`.
    pub path: &'a str,
    /// The request header fields the tap reads.
    pub headers: &'a Headers,
    /// Downstream peer address.
    pub downstream: &'a str,
    /// Upstream address.
    pub upstream: &'a str,
    /// What its observer has yet to observe: the connection's and the whole tap's.
    pub backlog: &'a Backlogs,
}

/// Bytes handed to observers and not yet observed (an observer that works on a thread of its
/// own counts them in and out), against a cap: past it, the relays counting on it read
/// nothing more, from either side, until the observer has caught up half of it. A message far
/// bigger than the cap (a 100 MiB push) goes at the observer's pace rather than into memory.
#[derive(Debug)]
pub struct Backlog {
    queued: std::sync::atomic::AtomicUsize,
    cap: usize,
    /// Relays waiting for room.
    waiting: Mutex<Vec<std::task::Waker>>,
    parked: std::sync::atomic::AtomicBool,
}

impl Backlog {
    /// A backlog of at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Backlog {
            queued: Default::default(),
            cap: cap.max(1),
            waiting: Mutex::default(),
            parked: Default::default(),
        }
    }

    /// `n` bytes handed over.
    pub fn add(&self, n: usize) {
        self.queued.fetch_add(n, Ordering::AcqRel);
    }

    /// `n` bytes observed: relays waiting for room read again once half the cap is free.
    pub fn observed(&self, n: usize) {
        let left = self.queued.fetch_sub(n, Ordering::AcqRel).saturating_sub(n);
        if left <= self.cap / 2 && self.parked.swap(false, Ordering::AcqRel) {
            let waiting =
                std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()));
            for w in waiting {
                w.wake();
            }
        }
    }

    /// Bytes handed over and not yet observed.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Ready while less than the cap waits; else pending, woken at half of it.
    fn poll_room(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.queued() < self.cap {
            return std::task::Poll::Ready(());
        }
        {
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                waiting.push(cx.waker().clone());
            }
        }
        self.parked.store(true, Ordering::Release);
        // The observer may have caught up between the look and the parking.
        if self.queued() <= self.cap / 2 {
            return std::task::Poll::Ready(());
        }
        std::task::Poll::Pending
    }
}

/// A connection's backlog and the whole tap's, counted together.
#[derive(Debug, Clone)]
pub struct Backlogs {
    /// This connection's: one connection's flood waits for itself.
    pub connection: Arc<Backlog>,
    /// The tap's, shared by every connection (the observer's): what observing may hold.
    pub tap: Option<Arc<Backlog>>,
}

impl Backlogs {
    /// The most one connection's observers may be behind before it stops reading.
    pub const CONNECTION_CAP: usize = 512 << 10;

    /// A new connection's, counting into the tap's `tap`.
    pub fn new(tap: Option<Arc<Backlog>>) -> Self {
        Backlogs {
            connection: Arc::new(Backlog::new(Backlogs::CONNECTION_CAP)),
            tap,
        }
    }

    /// `n` bytes handed over.
    pub fn add(&self, n: usize) {
        self.connection.add(n);
        if let Some(t) = &self.tap {
            t.add(n);
        }
    }

    /// `n` bytes observed.
    pub fn observed(&self, n: usize) {
        self.connection.observed(n);
        if let Some(t) = &self.tap {
            t.observed(n);
        }
    }

    /// Ready while neither is full.
    pub(crate) fn poll_room(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        std::task::ready!(self.connection.poll_room(cx));
        match &self.tap {
            Some(t) => t.poll_room(cx),
            None => std::task::Poll::Ready(()),
        }
    }
}

/// How a forwarded stream ended.
#[derive(Clone, Debug)]
pub enum StreamEnd {
    /// Both halves ended normally.
    Complete,
    /// A peer reset the stream with this HTTP/2 error code (the reset went on to the other).
    Reset {
        /// Who reset it.
        by: Side,
        /// The RST_STREAM error code (printed by name: `CANCEL`).
        reason: Reason,
    },
    /// A connection closed or failed under the stream, or a GOAWAY left it unprocessed.
    Failed {
        /// Whose connection.
        by: Side,
        /// What happened, for humans.
        message: String,
    },
    /// The tap stopped following it: observation of its connection stopped, or the tap shut
    /// down before the stream ended. The bytes were never held up.
    Cut {
        /// Why, for humans.
        message: String,
    },
}

/// Creates one [`StreamObserver`] per forwarded stream.
pub trait Observe: Send + Sync + 'static {
    /// Called once when a stream opens, before anything of it is forwarded.
    fn on_stream(&self, info: &StreamInfo<'_>) -> Box<dyn StreamObserver>;

    /// The backlog every connection counts into, for an observer that works behind the relay
    /// (none for one that works where the frame is read).
    fn backlog(&self) -> Option<Arc<Backlog>> {
        None
    }
}

/// Sees one stream's traffic. Calls come from the forwarding task, so they must be quick and
/// must never block: hand anything slow to a queue.
pub trait StreamObserver: Send {
    /// A slice of DATA payload (padding stripped), shown before it is forwarded.
    fn on_data(&mut self, direction: Direction, chunk: &Bytes);
    /// The response's first header block (a trailers-only gRPC response carries
    /// `grpc-status` here).
    fn on_response_headers(&mut self, _headers: &Headers) {}
    /// A later header block: trailers, shown before they are forwarded.
    fn on_trailers(&mut self, _direction: Direction, _trailers: &Headers) {}
    /// The stream is over.
    fn on_end(&mut self, _end: &StreamEnd) {}
    /// Nothing on this stream waits for an answer: when the tap stops, its connection may
    /// close now rather than at the end of the grace. Unknown streams never are.
    fn settled(&self) -> bool {
        false
    }
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

/// Reads one of the tap's counters (these and the observer's, [`crate::Running`]'s stats).
pub fn counter(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Counters of the forwarding layer. Cheap relaxed atomics, read by metrics and tests.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Downstream connections accepted.
    pub connections_total: AtomicU64,
    /// Downstream connections open now.
    pub connections_active: AtomicU64,
    /// Streams seen opening.
    pub streams_total: AtomicU64,
    /// Streams open now (as observed).
    pub streams_active: AtomicU64,
    /// Times a connection's relay paused reading because its observers were more than a
    /// backlog's cap behind (the connection's, or the tap's).
    pub observer_waits: AtomicU64,
    /// Bytes relayed client to upstream.
    pub request_bytes: AtomicU64,
    /// Bytes relayed upstream to client.
    pub response_bytes: AtomicU64,
    /// Failed upstream connection attempts.
    pub upstream_connect_errors: AtomicU64,
    /// 1 when the control plane answered the tap's last dial (a client's, or the admin
    /// server's look at it for `/readyz` and each scrape), 0 when it did not.
    pub upstream_up: AtomicU64,
    /// Downstream connections that failed their TLS handshake.
    pub handshake_errors: AtomicU64,
    /// Connections closed because the client sent nothing within
    /// `listen::FIRST_BYTES_TIMEOUT` (never a control-plane connection for them).
    pub silent_connections: AtomicU64,
    /// Connections closed on accept because `max_connections` were open.
    pub refused_connections: AtomicU64,
    /// Connections whose relay ended with an I/O error on either side.
    pub connection_errors: AtomicU64,
    /// Most bytes one direction of a connection ever held inside the tap (read, not yet
    /// written).
    pub peak_buffered: AtomicU64,
    /// The tap is shutting down: not ready for new clients.
    pub draining: std::sync::atomic::AtomicBool,
    /// Connections whose observation stopped, by reason (forwarding went on).
    pub observation_stopped: Mutex<Vec<(&'static str, u64)>>,
}

impl ProxyStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn sub(counter: &AtomicU64, n: u64) {
        counter.fetch_sub(n, Ordering::Relaxed);
    }
    fn count_stopped(&self, reason: &'static str) {
        let mut counts = self
            .observation_stopped
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match counts.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => counts.push((reason, 1)),
        }
    }

    /// Connections whose observation stopped for `reason` (`not_http2`, `header_block`,
    /// `header_block_too_large`, `malformed_frame`, `streams`).
    pub fn stopped(&self, reason: &str) -> u64 {
        self.observation_stopped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    }
}

/// Decrements a gauge when dropped, so every exit path counts.
struct Decrement<'a>(&'a AtomicU64);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        ProxyStats::sub(self.0, 1);
    }
}

/// Everything a connection task needs, shared.
pub(crate) struct Shared {
    pub settings: Settings,
    pub connector: Connector,
    pub observer: Arc<dyn Observe>,
    pub stats: Arc<ProxyStats>,
    pub next_stream: Arc<AtomicU64>,
    /// Upstream dials that failed, and client TLS handshakes that failed: each can happen for
    /// every client of a fleet at once, so each is logged with a count every few seconds.
    pub unreachable: Mutex<Throttled>,
    pub handshakes: Mutex<Throttled>,
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
            connector,
            observer,
            stats,
            next_stream: Arc::new(AtomicU64::new(1)),
            unreachable: Mutex::new(Throttled::new(
                "Upstream unreachable; client connections closed before the handshake",
            )),
            handshakes: Mutex::new(Throttled::new("Client TLS handshake failed")),
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

    /// Serves until `shutdown` resolves; then stops accepting, sends each client a GOAWAY
    /// (between two of the upstream's frames), closes each connection once nothing on it waits
    /// for an answer, and after `shutdown_grace` closes the rest. A connection closes as a
    /// careful peer closes it (FIN after the last byte, the other side read until it closes,
    /// for at most a few seconds), so nothing either peer sent before is lost. Every observer
    /// has seen its stream end when this returns.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let (stop_tx, stop_rx) = watch::channel(relay::Stop::Serving);
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        let mut accepting = Accepting {
            listener: &self.listener,
            shared: &self.shared,
            connections: &mut connections,
            next_conn: 0,
            accept_failed: Throttled::new("Accept failed; backing off"),
            refused: Throttled::new("Connection refused: max_connections open"),
            stop: stop_rx,
        };
        tokio::select! {
            _ = &mut shutdown => {}
            _ = accepting.run() => {}
        }
        self.shared.stats.draining.store(true, Ordering::Relaxed);
        let delay = self.shared.settings.drain_delay;
        if !delay.is_zero() {
            tracing::info!(
                ?delay,
                "Draining: /readyz says 503; serving on until the delay is over"
            );
            let _ = tokio::time::timeout(delay, accepting.run()).await;
        }
        drop(accepting);
        drop(self.listener);
        let open = connections.len();
        tracing::info!(connections = open, grace = ?self.shared.settings.shutdown_grace, "Shutting down");
        let _ = stop_tx.send(relay::Stop::Draining);
        let grace = self.shared.settings.shutdown_grace;
        if tokio::time::timeout(grace, drain(&mut connections))
            .await
            .is_err()
        {
            tracing::warn!(
                connections = connections.len(),
                "Grace period over, closing open connections"
            );
            let _ = stop_tx.send(relay::Stop::Closing);
            // Each closes within its linger; a second more, then what is left is cut (its
            // observation dropped: its open streams end there and then).
            let linger = relay::LINGER + Duration::from_secs(1);
            if tokio::time::timeout(linger, drain(&mut connections))
                .await
                .is_err()
            {
                connections.shutdown().await;
            }
        }
    }
}

/// The accepting loop's state: a connection task per client, bounded by `max_connections`.
struct Accepting<'a> {
    listener: &'a Listener,
    shared: &'a Arc<Shared>,
    connections: &'a mut JoinSet<()>,
    next_conn: u64,
    accept_failed: Throttled,
    refused: Throttled,
    stop: watch::Receiver<relay::Stop>,
}

impl Accepting<'_> {
    /// Accepts clients, and reaps the tasks of those that left, until dropped.
    async fn run(&mut self) {
        let max = self.shared.settings.max_connections.unwrap_or(usize::MAX);
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((io, peer)) if self.connections.len() >= max => {
                        ProxyStats::add(&self.shared.stats.refused_connections, 1);
                        self.refused.note(&format_args!("{max} open, closed {peer}"));
                        drop(io);
                    }
                    Ok((io, peer)) => {
                        self.next_conn += 1;
                        let (shared, stop) = (self.shared.clone(), self.stop.clone());
                        let task = connection(io, self.listener.tls(), peer, self.next_conn, shared, stop);
                        self.connections.spawn(task);
                    }
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning, serving
                        // what is open, and say so once in a while with a count.
                        self.accept_failed.note(&e);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = self.connections.join_next(), if !self.connections.is_empty() => {}
            }
        }
    }
}

/// Waits for every connection task to end.
async fn drain(connections: &mut JoinSet<()>) {
    while connections.join_next().await.is_some() {}
}

/// Something that may happen many times a second (accept failures such as EMFILE, refused
/// connections), logged at most once per [`Throttled::EVERY`] with how many there were.
pub(crate) struct Throttled {
    what: &'static str,
    since_log: u64,
    logged: Option<std::time::Instant>,
}

impl Throttled {
    const EVERY: Duration = Duration::from_secs(5);

    pub(crate) fn new(what: &'static str) -> Self {
        Throttled {
            what,
            since_log: 0,
            logged: None,
        }
    }

    /// Notes one under a lock shared by every connection's task.
    pub(crate) fn note_shared(this: &Mutex<Throttled>, detail: &dyn std::fmt::Display) {
        this.lock().unwrap_or_else(|p| p.into_inner()).note(detail);
    }

    pub(crate) fn note(&mut self, detail: &dyn std::fmt::Display) {
        self.since_log += 1;
        if self.logged.is_none_or(|at| at.elapsed() >= Self::EVERY) {
            self.logged = Some(std::time::Instant::now());
            tracing::warn!(detail = %detail, times = self.since_log, "{}", self.what);
            self.since_log = 0;
        }
    }
}

/// One client connection: TLS if configured, dial the upstream, relay until either side ends.
async fn connection(
    io: Io,
    tls: Option<TlsAcceptor>,
    peer: String,
    conn_id: u64,
    shared: Arc<Shared>,
    stop: watch::Receiver<relay::Stop>,
) {
    let stats = shared.stats.clone();
    ProxyStats::add(&stats.connections_total, 1);
    ProxyStats::add(&stats.connections_active, 1);
    let _active = Decrement(&stats.connections_active);
    let timeout = shared.settings.connect_timeout;
    let io: Io = match tls {
        Some(acceptor) => match tokio::time::timeout(timeout, acceptor.accept(io)).await {
            Ok(Ok(tls)) => Box::new(tls),
            Ok(Err(e)) => {
                ProxyStats::add(&stats.handshake_errors, 1);
                Throttled::note_shared(&shared.handshakes, &format_args!("{peer}: {e}"));
                return;
            }
            Err(_) => {
                ProxyStats::add(&stats.handshake_errors, 1);
                let why = format_args!("{peer}: timed out after {timeout:?}");
                Throttled::note_shared(&shared.handshakes, &why);
                return;
            }
        },
        None => io,
    };
    // No control-plane connection for a client that never speaks.
    let Some(io) = listen::first_bytes(io, listen::FIRST_BYTES_TIMEOUT).await else {
        ProxyStats::add(&stats.silent_connections, 1);
        tracing::debug!(conn = conn_id, %peer, "Connection closed: nothing sent");
        return;
    };
    let upstream = match shared.connector.dial(timeout).await {
        Ok(u) => {
            stats.upstream_up.store(1, Ordering::Relaxed);
            u
        }
        Err(e) => {
            stats.upstream_up.store(0, Ordering::Relaxed);
            // Closed before the tap says a byte of HTTP/2: to the client, a server it could not
            // reach, so its own connection backoff applies (docs/design.md, "An upstream the
            // tap cannot reach"). The reason goes to the log, the metrics and /readyz.
            ProxyStats::add(&stats.upstream_connect_errors, 1);
            Throttled::note_shared(&shared.unreachable, &format_args!("{peer}: {e}"));
            return;
        }
    };
    tracing::info!(conn = conn_id, %peer, upstream = %shared.connector.endpoint(), "Connection opened");
    let mut observation = ConnectionReader::new(
        shared.observer.clone(),
        stats.clone(),
        shared.next_stream.clone(),
        peer.clone(),
        shared.connector.endpoint().to_string(),
    );
    let ended = relay::relay(io, upstream, &mut observation, &stats, stop).await;
    let upstream_addr = shared.connector.endpoint().to_string();
    let whose = |by: Side| match by {
        Side::Client => format!("the client {peer}"),
        Side::Upstream => format!("the control plane {upstream_addr}"),
    };
    let end = match &ended {
        relay::Ended::Closed(by) => StreamEnd::Failed {
            by: *by,
            message: format!("{} closed the connection", whose(*by)),
        },
        relay::Ended::Drained => StreamEnd::Cut {
            message: "the tap stopped before the stream ended: it closed the connection".into(),
        },
        relay::Ended::Failed(by, e) => {
            ProxyStats::add(&stats.connection_errors, 1);
            StreamEnd::Failed {
                by: *by,
                message: format!("connection to {}: {e}", whose(*by)),
            }
        }
    };
    observation.end_all(&end);
    match ended {
        relay::Ended::Failed(by, e) => {
            tracing::info!(conn = conn_id, %peer, ?by, error = %e, "Connection closed")
        }
        _ => tracing::info!(conn = conn_id, %peer, "Connection closed"),
    }
}
