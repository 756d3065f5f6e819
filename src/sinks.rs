//! Where correlation events go: a bounded queue (the tap hands events over with `try_send` and
//! never waits; a full queue drops and counts), drained by a thread of its own into the sinks.
//! Sinks here: one log line per verdict, and a recorder the demo and tests read.

pub mod board;
pub mod eventlog;
pub mod metrics;
pub mod record;
pub mod rollout;
pub mod spans;
pub mod watch;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;

use crate::correlate::{Event, Timestamp, Verdict};
use crate::xds::short_type;

/// Wall-clock now, for event timestamps and the views' ages.
pub fn now() -> Timestamp {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Counters of the observing side.
#[derive(Debug, Default)]
pub struct TapStats {
    /// Events dropped because the queue was full.
    pub dropped_events: AtomicU64,
    /// xDS messages decoded.
    pub decoded: AtomicU64,
    /// Messages not decoded: invalid protobuf.
    pub decode_invalid: AtomicU64,
    /// Messages not decoded: compressed with an encoding we do not inflate, or not inflatable.
    pub decode_encoding: AtomicU64,
    /// Messages not decoded: over the decode limit.
    pub decode_too_large: AtomicU64,
    /// Streams whose gRPC framing broke (the rest of that direction is not decoded).
    pub framing_errors: AtomicU64,
    /// Answers naming a nonce the tap never saw pushed.
    pub unmatched_answers: AtomicU64,
    /// Pushes whose nonce repeated one still open or recently decided (a control-plane fault).
    pub nonce_reuses: AtomicU64,
    /// Pushes of content the client had just NACKed, sent again (a control plane's resend loop).
    pub rejected_resends: AtomicU64,
    /// gRPC messages forwarded client -> control plane (any method).
    pub request_messages: AtomicU64,
    /// gRPC messages forwarded control plane -> client (any method).
    pub response_messages: AtomicU64,
    /// Open SotW xDS streams.
    pub streams_sotw: AtomicU64,
    /// Open Delta xDS streams.
    pub streams_delta: AtomicU64,
}

impl TapStats {
    /// The message counter of a direction.
    pub fn messages(&self, d: crate::proxy::Direction) -> &AtomicU64 {
        match d {
            crate::proxy::Direction::Request => &self.request_messages,
            crate::proxy::Direction::Response => &self.response_messages,
        }
    }

    /// The open-streams gauge of an API.
    pub fn api_streams(&self, api: crate::xds::Api) -> &AtomicU64 {
        match api {
            crate::xds::Api::Sotw => &self.streams_sotw,
            crate::xds::Api::Delta => &self.streams_delta,
        }
    }
}

/// What the event queue carries. `Stop` comes once: boxing the event to even the variants
/// would cost an allocation per event for nothing.
#[allow(clippy::large_enum_variant)]
enum Queued {
    Event(Event),
    /// Deliver what came before, then stop.
    Stop,
}

/// The sending end of the event queue. Cloned into every observed stream.
#[derive(Clone)]
pub struct EventSender {
    tx: mpsc::Sender<Queued>,
    stats: Arc<TapStats>,
}

impl EventSender {
    /// Hands an event over without waiting; drops and counts it when the queue is full.
    pub fn send(&self, event: Event) {
        if self.tx.try_send(Queued::Event(event)).is_err() {
            self.stats.dropped_events.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Something that consumes events. Runs on the sinks' own thread, never on the forwarding path.
pub trait Sink: Send {
    /// One event.
    fn on_event(&mut self, event: &Event);
}

/// While events keep coming, the sinks' thread takes them in batches a millisecond apart
/// rather than being woken for each (a wake-up is a futex call and two context switches, more
/// than most events cost); after this many empty looks it waits to be woken again.
const LINGER_ROUNDS: u32 = 10;

/// The next queued item: at once when one is there, else after short naps while the queue has
/// been busy lately, else when a sender wakes the thread.
fn next(rx: &mut mpsc::Receiver<Queued>) -> Option<Queued> {
    for _ in 0..LINGER_ROUNDS {
        match rx.try_recv() {
            Ok(q) => return Some(q),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
        }
    }
    rx.blocking_recv()
}

/// The sinks at work: a thread of their own draining the bounded event queue, so that they
/// never take a turn from the forwarding tasks, and forwarding never waits for them (a full
/// queue drops and counts).
pub struct Sinks {
    tx: mpsc::Sender<Queued>,
    done: tokio::sync::oneshot::Receiver<()>,
}

impl Sinks {
    /// Starts the thread with `sinks`; events wait in a queue of `capacity`. Returns the
    /// senders' end.
    pub fn start(
        capacity: usize,
        stats: Arc<TapStats>,
        mut sinks: Vec<Box<dyn Sink>>,
    ) -> std::io::Result<(EventSender, Sinks)> {
        let (tx, mut rx) = mpsc::channel(capacity.max(1));
        let (done_tx, done) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("xdstap-sinks".into())
            .spawn(move || {
                while let Some(Queued::Event(event)) = next(&mut rx) {
                    for sink in sinks.iter_mut() {
                        sink.on_event(&event);
                    }
                }
                // Dropping the sinks lets exporters flush.
                drop(sinks);
                let _ = done_tx.send(());
            })?;
        Ok((
            EventSender {
                tx: tx.clone(),
                stats,
            },
            Sinks { tx, done },
        ))
    }

    /// Delivers everything queued so far, then drops the sinks.
    pub async fn close(self) {
        let _ = self.tx.send(Queued::Stop).await;
        let _ = self.done.await;
    }
}

/// One structured log line per verdict: NACK at warn (everything needed to act), others at
/// debug.
pub struct LogSink;

impl Sink for LogSink {
    fn on_event(&mut self, event: &Event) {
        let context = event.context();
        let node = context.node.as_ref().map(|n| n.id.as_str()).unwrap_or("");
        // Values given as `&str` are logged in their Debug form, escaped; those given with `%`
        // (Display) are made printable here.
        let short = crate::xds::printable(short_type(&context.type_url));
        match event {
            Event::Verdict {
                push,
                verdict:
                    Verdict::Nack {
                        error,
                        suspects,
                        changed,
                        scope,
                        rejected,
                        applied,
                    },
                client_version,
                overtaken_by,
                ..
            } => {
                tracing::warn!(
                    xds.node = node,
                    xds.type_url = %crate::xds::printable(&context.type_url),
                    xds.version = %crate::xds::printable(&push.version),
                    xds.nonce = %crate::xds::printable(&push.nonce),
                    xds.client_version = client_version.as_deref().unwrap_or(""),
                    xds.error_code = error.code,
                    xds.error_message = %crate::xds::printable(&error.message),
                    xds.suspects = %crate::xds::printable(&suspects.join(",")),
                    xds.changed = %crate::xds::printable(&changed.join(",")),
                    xds.nack_scope = scope.as_str(),
                    xds.rejected = %crate::xds::printable(&rejected.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(",")),
                    xds.applied = %crate::xds::printable(&applied.join(",")),
                    xds.overtaken_by = overtaken_by.as_deref().unwrap_or(""),
                    stream = context.stream.stream_id,
                    "{short} push NACKed",
                );
            }
            Event::Verdict {
                push,
                verdict,
                waiting_for,
                ..
            } if !waiting_for.is_empty() => {
                tracing::info!(
                    xds.node = node,
                    xds.version = %crate::xds::printable(&push.version),
                    xds.nonce = %crate::xds::printable(&push.nonce),
                    xds.verdict = verdict.name(),
                    xds.waiting_for = %crate::xds::printable(&waiting_for.join(",")),
                    stream = context.stream.stream_id,
                    "{short} push {} while clusters still waited for their endpoints",
                    verdict.name(),
                );
            }
            Event::Verdict {
                push,
                verdict,
                decided_at,
                ..
            } => {
                tracing::debug!(
                    xds.node = node,
                    xds.type_url = %crate::xds::printable(&context.type_url),
                    xds.version = %crate::xds::printable(&push.version),
                    xds.nonce = %crate::xds::printable(&push.nonce),
                    xds.verdict = verdict.name(),
                    latency_ms = decided_at.saturating_sub(push.at) as f64 / 1e6,
                    stream = context.stream.stream_id,
                    "{short} push {}",
                    verdict.name(),
                );
            }
            Event::StaleAnswer {
                nonce,
                pending_nonce,
                nack,
                ..
            } => {
                tracing::debug!(xds.node = node, xds.type_url = %crate::xds::printable(&context.type_url), xds.nonce = %crate::xds::printable(nonce),
                    xds.pending_nonce = %crate::xds::printable(pending_nonce), nack, "{short} stale answer");
            }
            Event::Warming {
                nonce, clusters, ..
            } => {
                tracing::debug!(xds.node = node, xds.nonce = %crate::xds::printable(nonce),
                    xds.waiting_for = %crate::xds::printable(&clusters.join(",")), "{short} push warming");
            }
            Event::NonceReused { nonce, .. } => {
                tracing::debug!(xds.node = node, xds.type_url = %crate::xds::printable(&context.type_url), xds.nonce = %crate::xds::printable(nonce),
                    stream = context.stream.stream_id, "{short} nonce reused by the control plane");
            }
            _ => {}
        }
    }
}

/// Keeps the last `capacity` events in memory, for the status view, the demo and tests.
#[derive(Clone)]
pub struct Recorder {
    events: Arc<Mutex<VecDeque<Event>>>,
    capacity: usize,
}

impl Recorder {
    /// A recorder of the last `capacity` events.
    pub fn new(capacity: usize) -> Self {
        Recorder {
            events: Arc::default(),
            capacity,
        }
    }

    /// A copy of the events held.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

impl Sink for Recorder {
    fn on_event(&mut self, event: &Event) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if events.len() == self.capacity {
            events.pop_front();
        }
        events.push_back(event.clone());
    }
}
