//! Reading HTTP/2 frames as they pass (RFC 9113 §4, §6), one direction of a connection, from
//! chunks split anywhere. It reads; it never changes, holds or writes a byte of the stream: DATA
//! payloads come out as slices of the chunk they arrived in (padding stripped), header blocks
//! are gathered (HEADERS or PUSH_PROMISE, then CONTINUATION, up to a bound) for the HPACK
//! decoder, and the few control frames observation needs are read field by field. No I/O.
//!
//! ```text
//!   Preface (client side only: the 24 octets "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
//!      │
//!      v
//!   Header (9 octets) ──> Payload { prefix, body, padding } ──> Header ...
//!      │  a frame that breaks the rules observation relies on
//!      └──────────────────────────> Broken (the rest of the direction is not read)
//! ```

use std::fmt;

use bytes::Bytes;
pub use h2::Reason;

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A frame type (RFC 9113 §6); the ones the reader does not read into are passed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameType(u8);

const DATA: FrameType = FrameType(0x0);
const HEADERS: FrameType = FrameType(0x1);
const RST_STREAM: FrameType = FrameType(0x3);
const SETTINGS: FrameType = FrameType(0x4);
const PUSH_PROMISE: FrameType = FrameType(0x5);
const GOAWAY: FrameType = FrameType(0x7);
const CONTINUATION: FrameType = FrameType(0x9);

impl FrameType {
    /// Its name in RFC 9113, for the types the reader knows.
    fn name(self) -> &'static str {
        match self {
            DATA => "DATA",
            HEADERS => "HEADERS",
            PUSH_PROMISE => "PUSH_PROMISE",
            CONTINUATION => "CONTINUATION",
            RST_STREAM => "RST_STREAM",
            SETTINGS => "SETTINGS",
            GOAWAY => "GOAWAY",
            _ => "frame",
        }
    }
}

impl From<FrameType> for u8 {
    fn from(k: FrameType) -> u8 {
        k.0
    }
}

/// An HTTP/2 stream identifier (31 bits; 0 is the connection).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// SETTINGS_HEADER_TABLE_SIZE (RFC 9113 §6.5.2).
const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;

/// What the reader found, in the order it came.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// The next slice of a DATA frame's data (padding stripped).
    Data {
        /// Stream id.
        stream: StreamId,
        /// A slice of the chunk.
        data: Bytes,
    },
    /// A DATA frame with END_STREAM is complete.
    EndStream {
        /// Stream id.
        stream: StreamId,
    },
    /// A whole header block: HEADERS (or PUSH_PROMISE) and any CONTINUATION frames.
    HeaderBlock {
        /// Stream id.
        stream: StreamId,
        /// The HPACK-encoded block.
        block: &'a [u8],
        /// The HEADERS frame carried END_STREAM.
        end_stream: bool,
        /// It came in a PUSH_PROMISE (decoded only to keep the HPACK state).
        push: bool,
    },
    /// RST_STREAM.
    Reset {
        /// Stream id.
        stream: StreamId,
        /// The error code.
        code: Reason,
    },
    /// A SETTINGS frame (not an ACK), with its header table size when it sets one.
    Settings {
        /// SETTINGS_HEADER_TABLE_SIZE, the last one in the frame.
        header_table_size: Option<u32>,
    },
    /// GOAWAY.
    GoAway {
        /// The last stream id the sender processes.
        last_stream: StreamId,
        /// The error code.
        code: Reason,
    },
}

/// Why a direction stopped being read. The bytes still flow; only observation stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    /// The client did not start with the HTTP/2 preface.
    #[error("not HTTP/2 with prior knowledge (no connection preface)")]
    Preface,
    /// A header block grew past the bound.
    #[error("a header block is over {0} bytes")]
    BlockTooLarge(usize),
    /// A CONTINUATION out of place, or another frame where one was due.
    #[error("a header block interrupted or continued out of place")]
    Continuation,
    /// A frame whose length does not fit its fields (padding past the end, a short
    /// RST_STREAM, a SETTINGS frame not made of 6-byte settings).
    #[error("a malformed {0} frame")]
    Malformed(&'static str),
}

impl Broken {
    /// A short, fixed label.
    pub fn reason(&self) -> &'static str {
        match self {
            Broken::Preface => "not_http2",
            Broken::BlockTooLarge(_) => "header_block_too_large",
            Broken::Continuation | Broken::Malformed(_) => "malformed_frame",
        }
    }
}

/// The 9-octet frame header.
#[derive(Clone, Copy, Debug)]
struct Head {
    len: u32,
    kind: FrameType,
    flags: u8,
    stream: StreamId,
}

impl Head {
    fn parse(b: &[u8; 9]) -> Head {
        Head {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: FrameType(b[3]),
            flags: b[4],
            stream: StreamId(u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff),
        }
    }

    fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// PADDED means something only on the frames that can carry padding.
    fn padded(&self) -> bool {
        matches!(self.kind, DATA | HEADERS | PUSH_PROMISE) && self.has(PADDED)
    }

    /// Octets before the body: the pad length and the fields a frame type carries first.
    fn prefix_len(&self) -> usize {
        let padded = usize::from(self.padded());
        match self.kind {
            DATA => padded,
            HEADERS => padded + if self.has(PRIORITY) { 5 } else { 0 },
            PUSH_PROMISE => padded + 4,
            RST_STREAM => 4,
            GOAWAY => 8,
            _ => 0,
        }
    }
}

#[derive(Debug)]
enum State {
    Preface { have: usize },
    Header { buf: [u8; 9], have: usize },
    Payload(Payload),
    Broken(Broken),
}

/// Where the reader is within one frame's payload.
#[derive(Debug)]
struct Payload {
    head: Head,
    /// Payload octets not yet read.
    left: u32,
    /// The prefix fields, gathered first.
    prefix: [u8; 8],
    prefix_have: usize,
    /// Trailing padding octets (known once the prefix is read).
    pad: u32,
    /// SETTINGS: the current 6-octet setting, and the table size found so far.
    setting: [u8; 6],
    setting_have: usize,
    table_size: Option<u32>,
}

/// Reads one direction's frames.
#[derive(Debug)]
pub struct FrameReader {
    state: State,
    /// The header block being gathered, and its stream, END_STREAM, and whether it is a push.
    block: Vec<u8>,
    block_of: Option<(StreamId, bool, bool)>,
    max_block: usize,
    /// Where in the chunk being fed the last frame ended, when one did.
    last_boundary: Option<usize>,
    /// Frames read whole.
    frames: u64,
}

impl FrameReader {
    /// A reader for the client's direction (which opens with the preface) or the server's;
    /// header blocks past `max_block` octets stop it.
    pub fn new(client: bool, max_block: usize) -> Self {
        FrameReader {
            state: if client {
                State::Preface { have: 0 }
            } else {
                State::Header {
                    buf: [0; 9],
                    have: 0,
                }
            },
            block: Vec::new(),
            block_of: None,
            max_block,
            last_boundary: None,
            frames: 0,
        }
    }

    /// How many frames have been read whole.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Why it stopped, if it did.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // the tests' and fuzzers'
    pub fn broken(&self) -> Option<Broken> {
        match self.state {
            State::Broken(b) => Some(b),
            _ => None,
        }
    }

    /// Whether the bytes fed so far end exactly between two frames.
    pub fn at_boundary(&self) -> bool {
        matches!(self.state, State::Header { have: 0, .. }) && self.block_of.is_none()
    }

    /// The offset in the last chunk fed right after the last frame that ended in it, when one
    /// did and no header block is left open there (a frame may be inserted there).
    pub fn last_boundary(&self) -> Option<usize> {
        self.last_boundary
    }

    /// Reads the next chunk; `on` sees every frame event in order. Once broken, it reads
    /// nothing more and says why.
    pub fn feed(&mut self, chunk: &Bytes, on: &mut impl FnMut(Frame<'_>)) -> Result<(), Broken> {
        self.last_boundary = None;
        let mut pos = 0;
        while pos < chunk.len() {
            pos = match self.step(chunk, pos, on) {
                Ok(next) => next,
                Err(b) => {
                    self.state = State::Broken(b);
                    self.block = Vec::new();
                    return Err(b);
                }
            };
        }
        match self.state {
            State::Broken(b) => Err(b),
            _ => Ok(()),
        }
    }

    /// Consumes what it can from `chunk[pos..]`; returns where it stopped.
    fn step(
        &mut self,
        chunk: &Bytes,
        pos: usize,
        on: &mut impl FnMut(Frame<'_>),
    ) -> Result<usize, Broken> {
        let rest = &chunk[pos..];
        match &mut self.state {
            State::Broken(b) => Err(*b),
            State::Preface { have } => {
                let n = rest.len().min(PREFACE.len() - *have);
                if rest[..n] != PREFACE[*have..*have + n] {
                    return Err(Broken::Preface);
                }
                *have += n;
                if *have == PREFACE.len() {
                    self.state = State::Header {
                        buf: [0; 9],
                        have: 0,
                    };
                    self.last_boundary = Some(pos + n);
                }
                Ok(pos + n)
            }
            State::Header { buf, have } => {
                let n = rest.len().min(9 - *have);
                buf[*have..*have + n].copy_from_slice(&rest[..n]);
                *have += n;
                if *have == 9 {
                    let head = Head::parse(buf);
                    self.start(head)?;
                    if head.len == 0 {
                        self.finish(pos + n, on);
                    }
                }
                Ok(pos + n)
            }
            State::Payload(p) => {
                let n = rest.len().min(p.left as usize);
                let taken = Self::payload(p, &mut self.block, self.max_block, chunk, pos, n, on)?;
                p.left -= taken as u32;
                if p.left == 0 {
                    self.finish(pos + taken, on);
                }
                Ok(pos + taken)
            }
        }
    }

    /// A frame header has been read: checks what must follow what, and starts its payload.
    fn start(&mut self, head: Head) -> Result<(), Broken> {
        match (self.block_of, head.kind) {
            (Some((stream, ..)), CONTINUATION) if stream == head.stream => {}
            (Some(_), _) | (None, CONTINUATION) => return Err(Broken::Continuation),
            (None, HEADERS) => {
                self.block_of = Some((head.stream, head.has(END_STREAM), false));
            }
            (None, PUSH_PROMISE) => self.block_of = Some((head.stream, false, true)),
            _ => {}
        }
        let prefix = head.prefix_len() as u32;
        if head.len < prefix {
            return Err(Broken::Malformed(head.kind.name()));
        }
        if head.kind == RST_STREAM && head.len != 4 {
            return Err(Broken::Malformed("RST_STREAM"));
        }
        if head.kind == SETTINGS && !head.has(ACK) && !head.len.is_multiple_of(6) {
            return Err(Broken::Malformed("SETTINGS"));
        }
        self.state = State::Payload(Payload {
            head,
            left: head.len,
            prefix: [0; 8],
            prefix_have: 0,
            pad: 0,
            setting: [0; 6],
            setting_have: 0,
            table_size: None,
        });
        Ok(())
    }

    /// Reads `n` payload octets at `chunk[pos..]`, all of them: prefix fields, then the body
    /// (data slices, block fragments, settings), then padding.
    fn payload(
        p: &mut Payload,
        block: &mut Vec<u8>,
        max_block: usize,
        chunk: &Bytes,
        pos: usize,
        n: usize,
        on: &mut impl FnMut(Frame<'_>),
    ) -> Result<usize, Broken> {
        let mut i = 0;
        let need = p.head.prefix_len();
        if p.prefix_have < need {
            let k = (need - p.prefix_have).min(n);
            p.prefix[p.prefix_have..p.prefix_have + k].copy_from_slice(&chunk[pos..pos + k]);
            p.prefix_have += k;
            i += k;
            if p.prefix_have == need && p.head.padded() {
                p.pad = u32::from(p.prefix[0]);
                if p.pad > p.head.len - need as u32 {
                    return Err(Broken::Malformed(p.head.kind.name()));
                }
            }
            if p.prefix_have < need {
                return Ok(i);
            }
        }
        // Body octets left in this frame: what is left minus the padding at its end.
        let body_left = (p.left - i as u32).saturating_sub(p.pad) as usize;
        let k = body_left.min(n - i);
        let body = &chunk[pos + i..pos + i + k];
        match p.head.kind {
            DATA if k > 0 => on(Frame::Data {
                stream: p.head.stream,
                data: chunk.slice(pos + i..pos + i + k),
            }),
            HEADERS | PUSH_PROMISE | CONTINUATION => {
                if block.len() + k > max_block {
                    return Err(Broken::BlockTooLarge(max_block));
                }
                block.extend_from_slice(body);
            }
            SETTINGS if !p.head.has(ACK) => {
                for &b in body {
                    p.setting[p.setting_have] = b;
                    p.setting_have += 1;
                    if p.setting_have == 6 {
                        p.setting_have = 0;
                        let s = &p.setting;
                        if u16::from_be_bytes([s[0], s[1]]) == SETTINGS_HEADER_TABLE_SIZE {
                            p.table_size = Some(u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
                        }
                    }
                }
            }
            _ => {}
        }
        // The rest of what was given is padding.
        Ok(n)
    }

    /// The frame's last payload octet has been read, at chunk offset `end`.
    fn finish(&mut self, end: usize, on: &mut impl FnMut(Frame<'_>)) {
        let next = State::Header {
            buf: [0; 9],
            have: 0,
        };
        let State::Payload(p) = std::mem::replace(&mut self.state, next) else {
            unreachable!("finish is called on a payload");
        };
        self.frames += 1;
        let (head, prefix) = (p.head, p.prefix);
        let word =
            |i: usize| u32::from_be_bytes([prefix[i], prefix[i + 1], prefix[i + 2], prefix[i + 3]]);
        match head.kind {
            DATA if head.has(END_STREAM) => on(Frame::EndStream {
                stream: head.stream,
            }),
            RST_STREAM => on(Frame::Reset {
                stream: head.stream,
                code: word(0).into(),
            }),
            SETTINGS if !head.has(ACK) => on(Frame::Settings {
                header_table_size: p.table_size,
            }),
            GOAWAY => on(Frame::GoAway {
                last_stream: StreamId(word(0) & 0x7fff_ffff),
                code: word(4).into(),
            }),
            HEADERS | PUSH_PROMISE | CONTINUATION if head.has(END_HEADERS) => self.end_block(on),
            _ => {}
        }
        if self.block_of.is_none() {
            self.last_boundary = Some(end);
        }
    }

    fn end_block(&mut self, on: &mut impl FnMut(Frame<'_>)) {
        if let Some((stream, end_stream, push)) = self.block_of.take() {
            on(Frame::HeaderBlock {
                stream,
                block: &self.block,
                end_stream,
                push,
            });
            self.block.clear();
            if self.block.capacity() > 4096 {
                self.block = Vec::new();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One frame on the wire.
    pub(crate) fn frame(kind: impl Into<u8>, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.push(kind.into());
        f.push(flags);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// An event as owned data, with a frame's DATA slices joined.
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Data(u32, Vec<u8>),
        EndStream(u32),
        Block(u32, Vec<u8>, bool, bool),
        Reset(u32, u32),
        Settings(Option<u32>),
        GoAway(u32, u32),
    }

    /// Feeds `wire` cut at `cuts`; returns what was seen and how it ended.
    fn read(client: bool, wire: &[u8], cuts: &[usize]) -> (Vec<Seen>, Result<(), Broken>) {
        let mut r = FrameReader::new(client, 1024);
        let mut seen: Vec<Seen> = Vec::new();
        let mut result = Ok(());
        let mut pos = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.push(wire.len());
        for cut in cuts {
            let chunk = Bytes::copy_from_slice(&wire[pos..cut.max(pos)]);
            pos = cut.max(pos);
            result = r.feed(&chunk, &mut |f| {
                let s = match f {
                    Frame::Data {
                        stream: StreamId(stream),
                        data,
                    } => {
                        if let Some(Seen::Data(s, d)) = seen.last_mut() {
                            if *s == stream {
                                d.extend_from_slice(&data);
                                return;
                            }
                        }
                        Seen::Data(stream, data.to_vec())
                    }
                    Frame::EndStream { stream } => Seen::EndStream(stream.0),
                    Frame::HeaderBlock {
                        stream: StreamId(stream),
                        block,
                        end_stream,
                        push,
                    } => Seen::Block(stream, block.to_vec(), end_stream, push),
                    Frame::Reset { stream, code } => Seen::Reset(stream.0, code.into()),
                    Frame::Settings { header_table_size } => Seen::Settings(header_table_size),
                    Frame::GoAway { last_stream, code } => Seen::GoAway(last_stream.0, code.into()),
                };
                seen.push(s);
            });
            if result.is_err() {
                break;
            }
        }
        (seen, result)
    }

    fn conversation() -> Vec<u8> {
        let mut w = PREFACE.to_vec();
        let mut settings = vec![0, 1, 0, 0, 0x20, 0];
        settings.extend_from_slice(&[0, 4, 0, 1, 0, 0]);
        w.extend(frame(SETTINGS, 0, 0, &settings));
        w.extend(frame(SETTINGS, ACK, 0, &[]));
        // HEADERS padded and with priority, its block continued.
        let mut h = vec![2];
        h.extend_from_slice(&[0, 0, 0, 0, 16]);
        h.extend_from_slice(b"abc");
        h.extend_from_slice(&[0, 0]);
        w.extend(frame(HEADERS, PADDED | PRIORITY, 1, &h));
        w.extend(frame(CONTINUATION, END_HEADERS, 1, b"def"));
        // DATA padded, then an empty DATA ending the stream.
        w.extend(frame(DATA, PADDED, 1, &[3, b'x', b'y', 0, 0, 0]));
        w.extend(frame(DATA, END_STREAM, 1, &[]));
        w.extend(frame(0x6, 0, 0, &[1; 8]));
        w.extend(frame(0x8, 0, 1, &[0, 0, 1, 0]));
        w.extend(frame(0x20, 0xff, 7, b"unknown type"));
        w.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, b"trailers"));
        w.extend(frame(
            PUSH_PROMISE,
            END_HEADERS | PADDED,
            3,
            &[1, 0, 0, 0, 2, b'p', 0],
        ));
        w.extend(frame(RST_STREAM, 0, 5, &[0, 0, 0, 8]));
        w.extend(frame(GOAWAY, 0, 0, &[0, 0, 0, 5, 0, 0, 0, 0, b'd']));
        w
    }

    fn expected() -> Vec<Seen> {
        vec![
            Seen::Settings(Some(8192)),
            Seen::Block(1, b"abcdef".to_vec(), false, false),
            Seen::Data(1, b"xy".to_vec()),
            Seen::EndStream(1),
            Seen::Block(3, b"trailers".to_vec(), true, false),
            Seen::Block(3, b"p".to_vec(), false, true),
            Seen::Reset(5, 8),
            Seen::GoAway(5, 0),
        ]
    }

    #[test]
    fn reads_every_frame_whole_and_split_anywhere() {
        let wire = conversation();
        assert_eq!(read(true, &wire, &[]), (expected(), Ok(())));
        for cut in 0..=wire.len() {
            assert_eq!(
                read(true, &wire, &[cut]),
                (expected(), Ok(())),
                "cut at {cut}"
            );
        }
        let every: Vec<usize> = (0..wire.len()).collect();
        assert_eq!(read(true, &wire, &every), (expected(), Ok(())));
        // The server's side has no preface.
        assert_eq!(
            read(false, &wire[PREFACE.len()..], &[]),
            (expected(), Ok(()))
        );
    }

    #[test]
    fn knows_where_frames_end() {
        let wire = conversation();
        let mut r = FrameReader::new(true, 1024);
        let headers_at = PREFACE.len() + 21 + 9;
        let chunk = Bytes::copy_from_slice(&wire[..headers_at + 12]);
        r.feed(&chunk, &mut |_| {}).unwrap();
        // The last frame that ended in it: the SETTINGS ACK, before the HEADERS began.
        assert_eq!(r.last_boundary(), Some(headers_at));
        assert!(!r.at_boundary());
        // The HEADERS frame (20 octets) ends inside its header block: no boundary; the
        // CONTINUATION that ends the block (12 more) is one.
        let rest = Bytes::copy_from_slice(&wire[headers_at + 12..headers_at + 25]);
        r.feed(&rest, &mut |_| {}).unwrap();
        assert_eq!(r.last_boundary(), None);
        let rest = Bytes::copy_from_slice(&wire[headers_at + 25..headers_at + 32]);
        r.feed(&rest, &mut |_| {}).unwrap();
        assert_eq!(r.last_boundary(), Some(7));
        assert!(r.at_boundary());
        let mut r = FrameReader::new(false, 1024);
        r.feed(&Bytes::from(frame(0x6, 0, 0, &[0; 8])), &mut |_| {})
            .unwrap();
        assert!(r.at_boundary());
        assert_eq!(r.last_boundary(), Some(17));
    }

    #[test]
    fn stops_at_what_it_cannot_follow() {
        let broken = |client: bool, wire: Vec<u8>| read(client, &wire, &[]).1.unwrap_err();
        assert_eq!(
            broken(true, b"GET / HTTP/1.1\r\n\r\n".to_vec()),
            Broken::Preface
        );
        assert_eq!(
            broken(false, frame(CONTINUATION, END_HEADERS, 1, b"x")),
            Broken::Continuation
        );
        let mut w = frame(HEADERS, 0, 1, b"x");
        w.extend(frame(DATA, 0, 1, b"y"));
        assert_eq!(broken(false, w), Broken::Continuation);
        let mut w = frame(HEADERS, 0, 1, b"x");
        w.extend(frame(CONTINUATION, END_HEADERS, 3, b"y"));
        assert_eq!(broken(false, w), Broken::Continuation);
        let mut w = frame(HEADERS, 0, 1, &[0; 600]);
        w.extend(frame(CONTINUATION, END_HEADERS, 1, &[0; 600]));
        assert_eq!(broken(false, w), Broken::BlockTooLarge(1024));
        assert_eq!(
            broken(false, frame(DATA, PADDED, 1, &[5, 0, 0])),
            Broken::Malformed("DATA")
        );
        assert_eq!(
            broken(false, frame(DATA, PADDED, 1, &[])),
            Broken::Malformed("DATA")
        );
        assert_eq!(
            broken(false, frame(RST_STREAM, 0, 1, &[0; 3])),
            Broken::Malformed("RST_STREAM")
        );
        assert_eq!(
            broken(false, frame(SETTINGS, 0, 0, &[0; 5])),
            Broken::Malformed("SETTINGS")
        );
        assert_eq!(
            broken(false, frame(GOAWAY, 0, 0, &[0; 7])),
            Broken::Malformed("GOAWAY")
        );
        // Once broken, nothing more is read.
        let mut r = FrameReader::new(true, 1024);
        assert!(r.feed(&Bytes::from_static(b"nope"), &mut |_| {}).is_err());
        let mut seen = 0;
        let more = Bytes::from(frame(RST_STREAM, 0, 1, &[0; 4]));
        assert!(r.feed(&more, &mut |_| seen += 1).is_err());
        assert_eq!(seen, 0);
    }

    proptest::proptest! {
        /// Any sequence of well-formed frames, split anywhere: the same events as whole.
        #[test]
        fn any_frames_any_splits(
            frames in proptest::collection::vec(
                (0u8..10, 0u8..=255, 1u32..6, proptest::collection::vec(0u8..=255, 0..40)),
                0..30,
            ),
            cuts in proptest::collection::vec(0usize..2000, 0..12),
        ) {
            // Well formed: payloads fit their flags; a header block is never interrupted.
            let mut wire = Vec::new();
            for (kind, flags, stream, payload) in frames {
                let (kind, mut flags, mut payload) = (FrameType(kind), flags, payload);
                match kind {
                    HEADERS | PUSH_PROMISE => flags |= END_HEADERS,
                    CONTINUATION => continue,
                    RST_STREAM => payload.resize(4, 0),
                    SETTINGS if flags & ACK == 0 => {
                        let n = payload.len() / 6 * 6;
                        payload.truncate(n);
                    }
                    SETTINGS => payload.clear(),
                    GOAWAY => payload.resize(payload.len().max(8), 0),
                    _ => {}
                }
                let head = Head { len: payload.len() as u32, kind, flags, stream: StreamId(stream) };
                if (payload.len() as u32) < head.prefix_len() as u32 {
                    payload.resize(head.prefix_len(), 0);
                }
                if flags & PADDED != 0 && matches!(kind, DATA | HEADERS | PUSH_PROMISE) {
                    let room = payload.len() - head.prefix_len();
                    payload[0] %= room as u8 + 1;
                }
                wire.extend(frame(kind, flags, stream, &payload));
            }
            let whole = read(false, &wire, &[]);
            proptest::prop_assert!(whole.1.is_ok() || matches!(whole.1, Err(Broken::BlockTooLarge(_))));
            proptest::prop_assert_eq!(read(false, &wire, &cuts), whole);
        }

        /// Any bytes at all, split anywhere: no panic, and the same events and end as whole.
        #[test]
        fn any_bytes_any_splits(
            wire in proptest::collection::vec(0u8..=255, 0..600),
            cuts in proptest::collection::vec(0usize..600, 0..8),
        ) {
            let whole = read(false, &wire, &[]);
            proptest::prop_assert_eq!(read(false, &wire, &cuts), whole);
        }
    }
}
