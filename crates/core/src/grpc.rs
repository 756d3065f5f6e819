//! gRPC message framing (the 5-byte length prefix), reassembled across DATA frames in a streaming
//! way: a message body is handed on in the slices it arrives in, so a 100 MiB message is never
//! held whole. Knows nothing of protobuf.
//!
//! ```text
//!            5 header bytes seen                 len body bytes seen
//!  Header ────────────────────────> Body{left} ───────────────────────> Header
//!     │  flag byte not 0 or 1                                  (emits End)
//!     └──────────────────────> Broken (everything after is ignored)
//! ```

/// What the deframer found in the bytes fed to it.
#[derive(Debug, PartialEq, Eq)]
pub enum Deframed<'a> {
    /// A message header: compressed flag and body length.
    Start {
        /// The compressed flag of the prefix.
        compressed: bool,
        /// The body length the prefix announces.
        len: u32,
    },
    /// The next slice of the current message's body.
    Body(&'a [u8]),
    /// The current message is complete.
    End,
}

/// The prefix was not a gRPC message prefix; the direction is no longer decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("gRPC length prefix has compressed flag {flag}, expected 0 or 1")]
pub struct FramingError {
    /// The offending flag byte.
    pub flag: u8,
}

#[derive(Debug)]
enum State {
    Header { buf: [u8; 5], have: usize },
    Body { left: u32 },
    Broken,
}

/// Splits one direction of a gRPC stream into messages.
#[derive(Debug)]
pub struct Deframer {
    state: State,
}

impl Default for Deframer {
    fn default() -> Self {
        Deframer {
            state: State::Header {
                buf: [0; 5],
                have: 0,
            },
        }
    }
}

impl Deframer {
    /// A deframer at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a message is partly read (the stream ending now would cut it).
    #[cfg(test)]
    pub fn is_mid_message(&self) -> bool {
        match self.state {
            State::Header { have, .. } => have > 0,
            State::Body { .. } => true,
            State::Broken => false,
        }
    }

    /// Feeds the next chunk; `on_part` sees every message start, body slice and end in order.
    /// After an error the rest of the stream is ignored.
    pub fn feed<'a>(
        &mut self,
        mut chunk: &'a [u8],
        on_part: &mut impl FnMut(Deframed<'a>),
    ) -> Result<(), FramingError> {
        while !chunk.is_empty() {
            match &mut self.state {
                State::Broken => return Ok(()),
                State::Header { buf, have } => {
                    let n = (5 - *have).min(chunk.len());
                    buf[*have..*have + n].copy_from_slice(&chunk[..n]);
                    *have += n;
                    chunk = &chunk[n..];
                    if *have == 5 {
                        let flag = buf[0];
                        if flag > 1 {
                            self.state = State::Broken;
                            return Err(FramingError { flag });
                        }
                        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
                        on_part(Deframed::Start {
                            compressed: flag == 1,
                            len,
                        });
                        if len == 0 {
                            on_part(Deframed::End);
                            self.state = State::Header {
                                buf: [0; 5],
                                have: 0,
                            };
                        } else {
                            self.state = State::Body { left: len };
                        }
                    }
                }
                State::Body { left } => {
                    let n = (*left as usize).min(chunk.len());
                    on_part(Deframed::Body(&chunk[..n]));
                    *left -= n as u32;
                    chunk = &chunk[n..];
                    if *left == 0 {
                        on_part(Deframed::End);
                        self.state = State::Header {
                            buf: [0; 5],
                            have: 0,
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

/// Frames one message with a gRPC length prefix (for tests and the demo's peers).
pub fn encode(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whole messages with their compressed flag.
    type Messages = Vec<(bool, Vec<u8>)>;

    /// Collects whole messages from events.
    fn collect(chunks: &[&[u8]]) -> (Messages, Result<(), FramingError>) {
        let mut d = Deframer::new();
        let mut out: Vec<(bool, Vec<u8>)> = Vec::new();
        let mut result = Ok(());
        for chunk in chunks {
            result = d.feed(chunk, &mut |e| match e {
                Deframed::Start { compressed, .. } => out.push((compressed, Vec::new())),
                Deframed::Body(b) => out.last_mut().unwrap().1.extend_from_slice(b),
                Deframed::End => {}
            });
            if result.is_err() {
                break;
            }
        }
        (out, result)
    }

    #[test]
    fn several_messages_in_one_chunk_and_empty_messages() {
        let mut wire = encode(b"hello");
        wire.extend(encode(b""));
        wire.extend(encode(b"world"));
        let (msgs, r) = collect(&[&wire]);
        assert!(r.is_ok());
        let bodies: Vec<&[u8]> = msgs.iter().map(|(_, b)| b.as_slice()).collect();
        assert_eq!(bodies, vec![&b"hello"[..], b"", b"world"]);
    }

    #[test]
    fn every_split_point_yields_the_same_messages() {
        let mut wire = encode(b"first message");
        wire.extend(encode(&[7u8; 300]));
        let (whole, _) = collect(&[&wire]);
        for i in 0..=wire.len() {
            let (a, b) = wire.split_at(i);
            assert_eq!(collect(&[a, b]).0, whole, "split at {i}");
        }
    }

    #[test]
    fn corrupt_prefix_stops_decoding_without_panic() {
        let mut wire = encode(b"ok");
        wire.extend([9, 0, 0, 0, 1, 0]);
        wire.extend(encode(b"never seen"));
        let (msgs, r) = collect(&[&wire]);
        assert_eq!(r, Err(FramingError { flag: 9 }));
        assert_eq!(msgs.len(), 1);
    }

    #[test]
    fn a_four_gib_prefix_is_streamed_not_allocated() {
        let mut d = Deframer::new();
        let mut started = None;
        let mut body = 0usize;
        d.feed(&[0, 0xff, 0xff, 0xff, 0xff], &mut |e| match e {
            Deframed::Start { len, .. } => started = Some(len),
            Deframed::Body(b) => body += b.len(),
            Deframed::End => panic!("cannot end"),
        })
        .unwrap();
        d.feed(&[1; 1000], &mut |e| {
            if let Deframed::Body(b) = e {
                body += b.len()
            }
        })
        .unwrap();
        assert_eq!(started, Some(u32::MAX));
        assert_eq!(body, 1000);
        assert!(d.is_mid_message());
    }

    proptest! {
        #[test]
        fn any_split_yields_the_same_messages(
            messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..8),
            cuts in proptest::collection::vec(0usize..2000, 0..20),
        ) {
            let wire: Vec<u8> = messages.iter().flat_map(|m| encode(m)).collect();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
            cuts.sort();
            let mut chunks = Vec::new();
            let mut last = 0;
            for c in cuts { chunks.push(&wire[last..c]); last = c; }
            chunks.push(&wire[last..]);
            let (got, r) = collect(&chunks);
            prop_assert!(r.is_ok());
            let got: Vec<Vec<u8>> = got.into_iter().map(|(_, b)| b).collect();
            prop_assert_eq!(got, messages);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..500)) {
            let _ = collect(&[&bytes]);
        }
    }
}
