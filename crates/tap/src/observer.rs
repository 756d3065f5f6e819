//! The proxy's observer: per xDS stream, gRPC framing -> xDS decode -> correlation, run on a
//! thread of its own ([`offload`]) in the order the bytes crossed the tap, each step stamped
//! with the time its bytes were read, with events handed to the bounded queue. Other gRPC
//! methods are only counted, where the frame is read. Nothing here can fail or delay
//! forwarding. The observing side's counters are here too: the rooms downstream read them.

mod offload;

pub use offload::{Gate, Held};

use crate::clock::now;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::correlate::{Correlator, Event, Ledger, StreamContext, Timestamp};
use crate::grpc::{Deframed, Deframer};
use crate::proxy::{Direction, Headers, Observe, Side, StreamEnd, StreamInfo, StreamObserver};
use crate::queue::EventSender;
use crate::xds::decode::{DecodeError, MessageDecoder};
use crate::xds::scan::MessageKind;
use crate::xds::{Interner, Message, Method};

/// Counters of the observing side.
#[derive(Debug, Default)]
pub struct ObserverStats {
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
    /// Times a bound of the object reader cut a resource's metadata short.
    pub origins_cut: AtomicU64,
    /// gRPC messages forwarded client -> control plane (any method).
    pub request_messages: AtomicU64,
    /// gRPC messages forwarded control plane -> client (any method).
    pub response_messages: AtomicU64,
    /// Open SotW xDS streams.
    pub streams_sotw: AtomicU64,
    /// Open Delta xDS streams.
    pub streams_delta: AtomicU64,
}

impl ObserverStats {
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

/// The xDS observer.
pub struct Observer {
    events: EventSender,
    stats: Arc<ObserverStats>,
    decode_limit: u64,
    /// Pushes' resource sets, held once for all streams.
    interner: Arc<Interner>,
    /// What each node ran when its last stream ended, for the stream it reconnects on.
    ledger: Arc<Ledger>,
    /// The thread the xDS streams are observed on.
    offload: offload::Offload,
}

impl Observer {
    /// An observer that sends events to `events`, its thread started; at most `backlog` bytes
    /// wait for it.
    pub fn new(
        events: EventSender,
        stats: Arc<ObserverStats>,
        decode_limit: u64,
        backlog: usize,
    ) -> std::io::Result<Self> {
        Ok(Observer {
            offload: offload::Offload::start(backlog)?,
            events,
            stats,
            decode_limit,
            interner: Arc::default(),
            ledger: Arc::default(),
        })
    }

    /// Waits until everything forwarded so far is observed and its events queued.
    pub async fn flush(&self) {
        self.offload.flush().await;
    }

    /// The way to hold observing while forwarding goes on (for tests and benchmarks).
    pub fn gate(&self) -> Gate {
        self.offload.gate()
    }
}

impl Observe for Observer {
    fn backlog(&self) -> Option<Arc<crate::proxy::Backlog>> {
        Some(self.offload.backlog())
    }

    fn on_stream(&self, info: &StreamInfo<'_>) -> Box<dyn StreamObserver> {
        let Some(method) = Method::classify(info.path) else {
            return Box::new(Counting {
                seq: info.seq,
                path: info.path.into(),
                counts: [Count::default(); 2],
                deframers: [Some(Deframer::new()), Some(Deframer::new())],
                stats: self.stats.clone(),
            });
        };
        self.stats
            .api_streams(method.api)
            .fetch_add(1, Ordering::Relaxed);
        let encoding = info.headers.grpc_encoding.clone();
        let context = StreamContext {
            seq: info.seq,
            api: Some(method.api),
            service: method.service.clone(),
            method: method.method.clone(),
            downstream: info.downstream.into(),
            upstream: info.upstream.into(),
        };
        let stream = XdsStream {
            correlator: Correlator::new(method.api, context)
                .with_interner(self.interner.clone())
                .with_ledger(self.ledger.clone()),
            method,
            request: Decoding {
                encoding,
                ..Decoding::default()
            },
            response: Decoding::default(),
            events: self.events.clone(),
            stats: self.stats.clone(),
            limit: self.decode_limit,
            interner: self.interner.clone(),
            grpc_status: None,
            grpc_message: None,
            pending: Vec::new(),
        };
        Box::new(self.offload.handle(info.seq, stream, info.backlog))
    }
}

#[derive(Clone, Copy, Default)]
struct Count {
    messages: u64,
    bytes: u64,
}

/// A non-xDS stream: bytes and gRPC messages counted, logged at stream end at debug.
struct Counting {
    seq: u64,
    path: String,
    counts: [Count; 2],
    /// Per direction; dropped when the body turns out not to be gRPC-framed.
    deframers: [Option<Deframer>; 2],
    stats: Arc<ObserverStats>,
}

impl StreamObserver for Counting {
    fn on_data(&mut self, direction: Direction, chunk: &Bytes) {
        let i = direction as usize;
        self.counts[i].bytes += chunk.len() as u64;
        if let Some(d) = self.deframers[i].as_mut() {
            let mut messages = 0;
            let framed = d.feed(chunk, &mut |f| {
                if let Deframed::End = f {
                    messages += 1;
                }
            });
            self.counts[i].messages += messages;
            self.stats
                .messages(direction)
                .fetch_add(messages, Ordering::Relaxed);
            if framed.is_err() {
                self.deframers[i] = None;
            }
        }
    }
    fn on_end(&mut self, end: &StreamEnd) {
        tracing::debug!(stream = self.seq, path = %self.path, request_bytes = self.counts[0].bytes,
            response_bytes = self.counts[1].bytes, ?end, "Stream closed");
    }
}

#[derive(Default)]
struct Decoding {
    deframer: Deframer,
    decoder: Option<MessageDecoder>,
    encoding: Option<String>,
    broken: bool,
    count: Count,
}

struct XdsStream {
    method: Method,
    correlator: Correlator,
    request: Decoding,
    response: Decoding,
    events: EventSender,
    stats: Arc<ObserverStats>,
    limit: u64,
    /// Where full chunks of decoded resources are shared with every stream's.
    interner: Arc<Interner>,
    grpc_status: Option<i32>,
    grpc_message: Option<String>,
    pending: Vec<Event>,
}

impl XdsStream {
    /// Hands the correlator's events to the queue, counting the peers' faults on the way
    /// (counted here, on the forwarding side, so a full queue cannot lose them).
    fn flush(&mut self) {
        // Taken, not drained: a stream idle for hours keeps no room for events.
        for e in std::mem::take(&mut self.pending) {
            let fault = match &e {
                Event::UnmatchedAnswer { .. } => Some(&self.stats.unmatched_answers),
                Event::NonceReused { .. } => Some(&self.stats.nonce_reuses),
                Event::Push { push, .. } if push.resent_rejected > 0 => {
                    Some(&self.stats.rejected_resends)
                }
                _ => None,
            };
            if let Some(counter) = fault {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            if !self.events.send(e) {
                self.stats.dropped_events.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn count_error(&self, e: &DecodeError) {
        let c = match e {
            DecodeError::Protobuf(_) => &self.stats.decode_invalid,
            DecodeError::Encoding(_) | DecodeError::Inflate(_) => &self.stats.decode_encoding,
            DecodeError::TooLarge { .. } => &self.stats.decode_too_large,
        };
        c.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(stream = self.method_path(), reason = e.reason(), error = %e, "xDS message not decoded; forwarded as is");
    }

    fn method_path(&self) -> String {
        format!("{}/{}", self.method.service, self.method.method)
    }
}

/// Called on the observer's thread, each with the time its bytes were read.
impl XdsStream {
    fn settled(&self) -> bool {
        // Nor a message half through either way.
        !self.correlator.awaiting_answer()
            && self.request.decoder.is_none()
            && self.response.decoder.is_none()
    }

    fn on_data(&mut self, direction: Direction, chunk: &Bytes, now: Timestamp) {
        let api = self.method.api;
        let (half, kind) = match direction {
            Direction::Request => (&mut self.request, MessageKind::Request(api)),
            Direction::Response => (&mut self.response, MessageKind::Response(api)),
        };
        if half.broken {
            return;
        }
        half.count.bytes += chunk.len() as u64;
        let limit = self.limit;
        let interner = &self.interner;
        let mut finished: Vec<Result<Message, DecodeError>> = Vec::new();
        let Decoding {
            deframer,
            decoder,
            encoding,
            count,
            ..
        } = half;
        let messages_before = count.messages;
        let framed = deframer.feed(chunk, &mut |frame| match frame {
            Deframed::Start { compressed, len } => {
                let d = MessageDecoder::new(kind, len, compressed, encoding.as_deref(), limit)
                    .with_interner(interner.clone());
                match d.early_error() {
                    // Counted now; the message itself is forwarded untouched as it streams.
                    Some(e) => finished.push(Err(e)),
                    None => *decoder = Some(d),
                }
            }
            Deframed::Body(b) => {
                if let Some(d) = decoder.as_mut() {
                    d.feed(b);
                }
            }
            Deframed::End => {
                count.messages += 1;
                if let Some(d) = decoder.take() {
                    finished.push(d.finish());
                }
            }
        });
        self.stats
            .messages(direction)
            .fetch_add(count.messages - messages_before, Ordering::Relaxed);
        if framed.is_err() {
            half.broken = true;
            half.decoder = None;
            self.stats.framing_errors.fetch_add(1, Ordering::Relaxed);
        }
        if finished.is_empty() {
            return;
        }
        for result in finished {
            match result {
                Ok(Message::Request(r)) => {
                    self.stats.decoded.fetch_add(1, Ordering::Relaxed);
                    self.correlator.on_request(r, now, &mut self.pending);
                }
                Ok(Message::Response(r)) => {
                    self.stats.decoded.fetch_add(1, Ordering::Relaxed);
                    if r.origins_cut > 0 {
                        let cut = u64::from(r.origins_cut);
                        self.stats.origins_cut.fetch_add(cut, Ordering::Relaxed);
                    }
                    self.correlator.on_response(r, now, &mut self.pending);
                }
                Err(e) => self.count_error(&e),
            }
        }
        self.flush();
    }

    fn on_response_headers(&mut self, headers: &Headers) {
        self.response.encoding = headers.grpc_encoding.clone();
        self.read_status(headers);
    }

    fn on_trailers(&mut self, direction: Direction, trailers: &Headers, now: Timestamp) {
        if direction == Direction::Response {
            self.read_status(trailers);
            // The server's trailers end the call, whatever the client does with its half.
            let message = self
                .grpc_message
                .clone()
                .unwrap_or_else(|| "stream closed by the control plane".into());
            self.correlator
                .on_stream_end(self.grpc_status, &message, now, &mut self.pending);
            self.flush();
        }
    }

    fn on_end(&mut self, end: &StreamEnd, now: Timestamp) {
        let message = match end {
            StreamEnd::Complete => self
                .grpc_message
                .clone()
                .unwrap_or_else(|| "stream closed".into()),
            StreamEnd::Reset { by, reason } => {
                format!("reset by {} (HTTP/2 {reason:?})", side(*by))
            }
            StreamEnd::Failed { message, .. } | StreamEnd::Cut { message } => message.clone(),
        };
        self.correlator
            .on_stream_end(self.grpc_status, &message, now, &mut self.pending);
        self.flush();
        tracing::debug!(
            stream = self.method_path(),
            node = self.correlator.node().map(|n| n.id.as_str()).unwrap_or(""),
            request_messages = self.request.count.messages,
            request_bytes = self.request.count.bytes,
            response_messages = self.response.count.messages,
            response_bytes = self.response.count.bytes,
            "xDS stream closed"
        );
    }
}

impl Drop for XdsStream {
    fn drop(&mut self) {
        // Dropped without an end: the forwarding task was cut (the tap stopping after its grace
        // period). Every open push still gets its verdict.
        if !self.correlator.is_ended() {
            self.correlator.on_stream_end(
                self.grpc_status,
                "the tap stopped before the stream ended",
                now(),
                &mut self.pending,
            );
            self.flush();
        }
        self.stats
            .api_streams(self.method.api)
            .fetch_sub(1, Ordering::Relaxed);
    }
}

fn side(s: Side) -> &'static str {
    match s {
        Side::Client => "client",
        Side::Upstream => "control plane",
    }
}

impl XdsStream {
    fn read_status(&mut self, headers: &Headers) {
        if let Some(s) = headers.grpc_status.as_deref().and_then(|v| v.parse().ok()) {
            self.grpc_status = Some(s);
        }
        if let Some(m) = headers.grpc_message.as_deref() {
            // grpc-message is percent-encoded (gRPC over HTTP/2, "Responses").
            let decoded = percent_encoding::percent_decode_str(m).decode_utf8_lossy();
            self.grpc_message = Some(decoded.into_owned());
        }
    }
}
