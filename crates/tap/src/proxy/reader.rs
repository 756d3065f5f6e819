//! The observing side of one connection: a frame reader and an HPACK decoder per direction,
//! and the streams with their observers. It is shown each chunk the relay read, before the
//! relay writes it on, and says what to write: that very chunk, and, when the tap is shutting
//! down, its GOAWAY to the client between two of the upstream's frames. Anything it cannot
//! follow stops observation of the connection, counted and logged once; the bytes flow on.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::frame::{Frame, FrameReader, StreamId};
use super::headers::{HeaderReader, Headers};
use super::{Direction, Observe, ProxyStats, Side, StreamEnd, StreamInfo, StreamObserver};

/// The largest header block observation gathers (Envoy accepts 60 KiB of headers by default).
pub const MAX_HEADER_BLOCK: usize = 64 << 10;
/// Streams observed at once per connection; past it observation of the connection stops.
pub const MAX_STREAMS: usize = 16_384;
/// Streams the client reset whose observers still see what the control plane sent before it
/// learnt of the reset (a push crossing the reset on the wire), per connection at most.
const CROSSING: usize = 16;

/// One observed stream.
struct Stream {
    observer: Box<dyn StreamObserver>,
    /// Request and response halves ended (END_STREAM seen).
    ended: [bool; 2],
    response_headers: bool,
}

/// The streams of one connection, by HTTP/2 stream id.
struct Streams {
    observer: Arc<dyn Observe>,
    stats: Arc<ProxyStats>,
    /// Process-unique stream ids, shared by every connection.
    ids: Arc<AtomicU64>,
    open: HashMap<StreamId, Stream>,
    /// The highest stream id the client opened (for the tap's GOAWAY).
    last_client_stream: StreamId,
    peer: String,
    upstream: String,
    /// What the streams' observers have yet to observe.
    backlog: super::Backlogs,
    /// Streams the client reset, newest last: their ended observers still see the control
    /// plane's DATA that crossed the reset, until the control plane ends its half or
    /// [`CROSSING`] newer ones take their place.
    crossing: std::collections::VecDeque<(StreamId, Stream)>,
}

/// Why observation cannot go on: a metric label and words for humans.
type Trouble = (&'static str, String);

impl Streams {
    /// A header block on `stream`: a new stream when the client opens one, else response
    /// headers or trailers.
    fn headers(
        &mut self,
        direction: Direction,
        stream: StreamId,
        headers: &Headers,
        end_stream: bool,
    ) -> Result<(), Trouble> {
        if direction == Direction::Request && !self.open.contains_key(&stream) {
            if self.open.len() >= MAX_STREAMS {
                return Err((
                    "streams",
                    format!("more than {MAX_STREAMS} streams at once"),
                ));
            }
            self.last_client_stream = self.last_client_stream.max(stream);
            let s = self.start(headers);
            self.open.insert(stream, s);
        } else if let Some(s) = self.open.get_mut(&stream) {
            if direction == Direction::Response && !s.response_headers {
                s.response_headers = true;
                s.observer.on_response_headers(headers);
            } else {
                s.observer.on_trailers(direction, headers);
            }
        }
        if end_stream {
            self.half_ended(direction, stream);
        }
        Ok(())
    }

    /// A stream the client opened: its observer, told everything the tap knows of it.
    fn start(&self, headers: &Headers) -> Stream {
        ProxyStats::add(&self.stats.streams_total, 1);
        ProxyStats::add(&self.stats.streams_active, 1);
        let seq = self.ids.fetch_add(1, Ordering::Relaxed);
        let observer = self.observer.on_stream(&StreamInfo {
            seq,
            path: headers.path.as_deref().unwrap_or(""),
            headers,
            downstream: &self.peer,
            upstream: &self.upstream,
            backlog: &self.backlog,
        });
        Stream {
            observer,
            ended: [false, false],
            response_headers: false,
        }
    }

    fn data(&mut self, direction: Direction, stream: StreamId, data: &Bytes) {
        if let Some(s) = self.open.get_mut(&stream) {
            s.observer.on_data(direction, data);
        } else if direction == Direction::Response {
            if let Some((_, s)) = self.crossing.iter_mut().find(|(id, _)| *id == stream) {
                s.observer.on_data(direction, data);
            }
        }
    }

    /// The client reset `stream`: it ends, and what the control plane sent before it learnt
    /// of the reset is still shown to its observer (a push that crossed the reset is a push).
    fn reset_by_client(&mut self, stream: StreamId, how: &StreamEnd) {
        if let Some(mut s) = self.open.remove(&stream) {
            s.observer.on_end(how);
            ProxyStats::sub(&self.stats.streams_active, 1);
            if self.crossing.len() == CROSSING {
                self.crossing.pop_front();
            }
            self.crossing.push_back((stream, s));
        }
    }

    /// The control plane ended its half of a stream the client had reset: nothing more of it
    /// can come.
    fn crossed(&mut self, stream: StreamId) {
        self.crossing.retain(|(id, _)| *id != stream);
    }

    /// One half ended; both ended is the stream's end.
    fn half_ended(&mut self, direction: Direction, stream: StreamId) {
        if let Some(s) = self.open.get_mut(&stream) {
            s.ended[index(direction)] = true;
            if s.ended == [true, true] {
                self.end(stream, &StreamEnd::Complete);
            }
        }
    }

    /// The control plane's GOAWAY: the streams past `last_stream` were not processed.
    fn refused_past(&mut self, last_stream: StreamId) {
        let refused: Vec<StreamId> = self
            .open
            .keys()
            .copied()
            .filter(|s| *s > last_stream)
            .collect();
        let how = StreamEnd::Failed {
            by: Side::Upstream,
            message: "not processed: the control plane's GOAWAY".into(),
        };
        for s in refused {
            self.end(s, &how);
        }
    }

    fn end(&mut self, stream: StreamId, how: &StreamEnd) {
        if let Some(mut s) = self.open.remove(&stream) {
            s.observer.on_end(how);
            ProxyStats::sub(&self.stats.streams_active, 1);
        }
    }

    fn end_all(&mut self, how: &StreamEnd) {
        for (_, mut s) in self.open.drain() {
            s.observer.on_end(how);
            ProxyStats::sub(&self.stats.streams_active, 1);
        }
        self.crossing.clear();
    }
}

/// The observing side of one connection. Dropped with the relay; streams still open then are
/// ended as cut by the tap.
pub struct ConnectionReader {
    readers: [FrameReader; 2],
    hpack: [HeaderReader; 2],
    streams: Streams,
    /// Why observation stopped, once it has.
    stopped: Option<String>,
    /// The tap is shutting down: a GOAWAY is due to the client, or has gone.
    drain: Drain,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Drain {
    No,
    Due,
    Sent,
}

fn index(d: Direction) -> usize {
    match d {
        Direction::Request => 0,
        Direction::Response => 1,
    }
}

fn side(d: Direction) -> Side {
    match d {
        Direction::Request => Side::Client,
        Direction::Response => Side::Upstream,
    }
}

impl ConnectionReader {
    /// The reader of a new connection from `peer` to `upstream`: its streams' observers come
    /// from `observer`, their ids from `ids`; counted in `stats`.
    pub fn new(
        observer: Arc<dyn Observe>,
        stats: Arc<ProxyStats>,
        ids: Arc<AtomicU64>,
        peer: String,
        upstream: String,
    ) -> ConnectionReader {
        let observer_backlog = observer.backlog();
        ConnectionReader {
            readers: [
                FrameReader::new(true, MAX_HEADER_BLOCK),
                FrameReader::new(false, MAX_HEADER_BLOCK),
            ],
            hpack: [HeaderReader::default(), HeaderReader::default()],
            streams: Streams {
                observer,
                stats,
                ids,
                open: HashMap::new(),
                last_client_stream: StreamId(0),
                peer,
                upstream,
                backlog: super::Backlogs::new(observer_backlog),
                crossing: std::collections::VecDeque::new(),
            },
            stopped: None,
            drain: Drain::No,
        }
    }

    fn stats(&self) -> &ProxyStats {
        &self.streams.stats
    }

    /// Ready while the connection's observers are not too far behind (see
    /// [`super::Backlog`]); pending (woken when they catch up) otherwise, counted.
    pub fn poll_room(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let room = self.streams.backlog.poll_room(cx);
        if room.is_pending() {
            ProxyStats::add(&self.stats().observer_waits, 1);
        }
        room
    }

    /// A chunk read in `direction`: shown to the streams' observers, then queued on `out`, to
    /// be written as it is (with the tap's GOAWAY after a frame in it, when one is due).
    pub fn pass(&mut self, direction: Direction, chunk: Bytes, out: &mut VecDeque<Bytes>) {
        self.observe(direction, &chunk);
        let counter = match direction {
            Direction::Request => &self.stats().request_bytes,
            Direction::Response => &self.stats().response_bytes,
        };
        ProxyStats::add(counter, chunk.len() as u64);
        let pos = self.readers[1].last_boundary();
        match (self.goaway_due(direction, false), pos) {
            (Some(goaway), Some(pos)) => {
                if pos > 0 {
                    out.push_back(chunk.slice(..pos));
                }
                out.push_back(goaway);
                if pos < chunk.len() {
                    out.push_back(chunk.slice(pos..));
                }
            }
            _ => out.push_back(chunk),
        }
    }

    /// The tap is shutting down: its GOAWAY is due to the client.
    pub fn drain(&mut self) {
        if self.drain == Drain::No {
            self.drain = Drain::Due;
        }
    }

    /// The tap's GOAWAY, when it is due and nothing of the upstream's is half written.
    pub fn goaway_when_idle(&mut self) -> Option<Bytes> {
        self.goaway_due(Direction::Response, true)
    }

    /// Why observation stopped, if it has.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // the tests' and fuzzers'
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Shows one chunk's frames to the streams' observers.
    fn observe(&mut self, direction: Direction, chunk: &Bytes) {
        if self.stopped.is_some() {
            return;
        }
        let ConnectionReader {
            readers,
            hpack,
            streams,
            ..
        } = self;
        let mut trouble: Option<Trouble> = None;
        let read = readers[index(direction)].feed(chunk, &mut |frame| {
            if trouble.is_none() {
                trouble = on_frame(hpack, streams, direction, frame).err();
            }
        });
        let why = match (read, trouble) {
            (Err(b), _) => Some((b.reason(), b.to_string())),
            (Ok(()), t) => t,
        };
        if let Some((label, why)) = why {
            self.stop(label, &why);
        }
    }

    /// Observation of this connection stops; forwarding goes on.
    fn stop(&mut self, label: &'static str, why: &str) {
        self.stats().count_stopped(label);
        tracing::warn!(peer = %self.streams.peer, reason = %why, "Stopped observing a connection; forwarding goes on");
        self.stopped = Some(why.to_string());
        self.end_all(&StreamEnd::Cut {
            message: format!("the tap stopped observing the connection: {why}"),
        });
    }

    /// Every stream still open ends with `end`.
    pub fn end_all(&mut self, end: &StreamEnd) {
        self.streams.end_all(end);
    }

    /// The tap's GOAWAY, when it is due in `direction` now: at a frame boundary of the
    /// upstream's bytes (`idle`: nothing read in between), never inside a header block.
    fn goaway_due(&mut self, direction: Direction, idle: bool) -> Option<Bytes> {
        if direction != Direction::Response || self.drain != Drain::Due {
            return None;
        }
        let reader = &self.readers[1];
        let fits = if idle {
            reader.at_boundary()
        } else {
            reader.last_boundary().is_some()
        };
        // Never before the upstream's own first frame, its SETTINGS (RFC 9113 §3.4), and never
        // once observation stopped: the reader no longer follows the frames.
        if !fits || reader.frames() == 0 || self.stopped.is_some() {
            return None;
        }
        self.drain = Drain::Sent;
        let mut frame = vec![0, 0, 8, 0x7, 0, 0, 0, 0, 0];
        frame.extend_from_slice(&self.streams.last_client_stream.0.to_be_bytes());
        frame.extend_from_slice(&0u32.to_be_bytes());
        Some(Bytes::from(frame))
    }

    /// After the tap's GOAWAY with every stream done, an HTTP/2 server would close.
    /// Streams that wait for nothing (an ADS stream whose pushes are all answered) do not hold
    /// the connection open: they would never end by themselves.
    pub fn drained(&self) -> bool {
        self.drain == Drain::Sent
            && self.stopped.is_none()
            && self.streams.open.values().all(|s| s.observer.settled())
    }
}

/// One frame's meaning for the streams.
fn on_frame(
    hpack: &mut [HeaderReader; 2],
    streams: &mut Streams,
    direction: Direction,
    frame: Frame<'_>,
) -> Result<(), Trouble> {
    let d = index(direction);
    match frame {
        Frame::Data { stream, data } => streams.data(direction, stream, &data),
        Frame::EndStream { stream } if direction == Direction::Response => {
            streams.crossed(stream);
            streams.half_ended(direction, stream)
        }
        Frame::EndStream { stream } => streams.half_ended(direction, stream),
        Frame::HeaderBlock {
            stream,
            block,
            end_stream,
            push,
        } => {
            let headers = hpack[d].read(block).map_err(|e| match e.oversized {
                true => ("header_list", e.to_string()),
                false => ("header_block", e.to_string()),
            })?;
            // A push is read only to keep the HPACK state.
            if !push {
                streams.headers(direction, stream, &headers, end_stream)?;
            }
        }
        Frame::Reset { stream, code } => {
            let how = StreamEnd::Reset {
                by: side(direction),
                reason: code,
            };
            match direction {
                Direction::Request => streams.reset_by_client(stream, &how),
                Direction::Response => {
                    streams.crossed(stream);
                    streams.end(stream, &how)
                }
            }
        }
        // The sender's setting governs the blocks sent to it: the other direction's.
        Frame::Settings {
            header_table_size: Some(n),
        } => hpack[1 - d].allow_table_size(n),
        Frame::Settings { .. } => {}
        Frame::GoAway { last_stream, .. } if direction == Direction::Response => {
            streams.refused_past(last_stream)
        }
        Frame::GoAway { .. } => {}
    }
    Ok(())
}

impl Drop for ConnectionReader {
    fn drop(&mut self) {
        self.end_all(&StreamEnd::Cut {
            message: "the tap stopped before the stream ended".into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::NoObserver;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn observation() -> ConnectionReader {
        ConnectionReader::new(
            Arc::new(NoObserver),
            Arc::default(),
            Arc::new(AtomicU64::new(1)),
            "client".into(),
            "upstream".into(),
        )
    }

    /// Once a header block fails to decode, observation stops: the bytes still pass whole,
    /// and no GOAWAY is placed by a reader that no longer follows the frames.
    #[test]
    fn no_goaway_once_observation_stopped() {
        let mut o = observation();
        let mut out = VecDeque::new();
        let mut wire = frame(0x4, 0, 0, &[]);
        // An indexed field past the static and dynamic tables: not decodable.
        wire.extend(frame(0x1, 0x4, 1, &[0xff, 0xff, 0x0f]));
        wire.extend(frame(0x6, 0, 0, &[0; 8]));
        o.pass(Direction::Response, Bytes::from(wire.clone()), &mut out);
        assert!(o.stopped().is_some());
        o.drain();
        let more = Bytes::from_static(b"12345678");
        o.pass(Direction::Response, more.clone(), &mut out);
        assert_eq!(o.goaway_when_idle(), None);
        let written: Vec<u8> = out.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(written, [wire, more.to_vec()].concat());
    }

    /// Draining puts the GOAWAY right after the last whole frame of the upstream's chunk, and
    /// only after the upstream's own first frame.
    #[test]
    fn the_goaway_goes_between_frames() {
        let mut o = observation();
        o.drain();
        assert_eq!(
            o.goaway_when_idle(),
            None,
            "not before the upstream's SETTINGS"
        );
        let mut out = VecDeque::new();
        let settings = frame(0x4, 0, 0, &[]);
        let ping = frame(0x6, 0, 0, &[7; 8]);
        let mut wire = settings.clone();
        wire.extend(&ping[..10]);
        o.pass(Direction::Response, Bytes::from(wire), &mut out);
        let pieces: Vec<&[u8]> = out.iter().map(|b| &b[..]).collect();
        assert_eq!(pieces[0], &settings[..]);
        assert_eq!(&pieces[1][..9], &[0, 0, 8, 0x7, 0, 0, 0, 0, 0]);
        assert_eq!(pieces[2], &ping[..10]);
        assert_eq!(o.goaway_when_idle(), None, "once");
    }
}
