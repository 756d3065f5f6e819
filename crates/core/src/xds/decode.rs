//! One gRPC message body into one xDS [`Message`]: inflates `gzip`/`deflate` as it streams (for
//! decoding only; the forwarded bytes are untouched), enforces the decode limit, and reports
//! why a message could not be decoded. It never fails the stream: the caller counts and moves on.

use std::io::Write;

use super::scan::{MessageKind, ScanError, Scanner};
use super::Message;

/// Why a message was not decoded. Labels for the decode-error metric come from [`reason`](Self::reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The protobuf is malformed.
    #[error("invalid protobuf: {0}")]
    Protobuf(#[from] ScanError),
    /// Compressed with an encoding we do not inflate.
    #[error("unsupported grpc-encoding {0:?}")]
    Encoding(String),
    /// The compressed bytes do not inflate.
    #[error("cannot inflate: {0}")]
    Inflate(String),
    /// Larger than the decode limit (it was still forwarded).
    #[error("message of {size} bytes is over the decode limit of {limit} bytes")]
    TooLarge {
        /// Size seen so far (inflated).
        size: u64,
        /// The limit.
        limit: u64,
    },
}

impl DecodeError {
    /// A short, fixed label.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Protobuf(_) => "invalid_protobuf",
            DecodeError::Encoding(_) => "unsupported_encoding",
            DecodeError::Inflate(_) => "inflate",
            DecodeError::TooLarge { .. } => "too_large",
        }
    }
}

/// Feeds a [`Scanner`] through `io::Write`, so flate2's streaming decoders can write into it.
struct Sink {
    scanner: Scanner,
    limit: u64,
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.scanner.position() + buf.len() as u64 > self.limit {
            return Err(std::io::Error::other("over the decode limit"));
        }
        self.scanner.feed(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

enum Input {
    Plain(Box<Sink>),
    Gzip(Box<flate2::write::GzDecoder<Sink>>),
    Deflate(Box<flate2::write::ZlibDecoder<Sink>>),
    Failed(DecodeError),
}

/// Decodes one message as its body streams past.
pub struct MessageDecoder {
    input: Input,
    limit: u64,
    seen: u64,
}

impl MessageDecoder {
    /// Starts a message of `len` body bytes. `compressed` is the prefix flag and `encoding` the
    /// stream's `grpc-encoding`.
    pub fn new(
        kind: MessageKind,
        len: u32,
        compressed: bool,
        encoding: Option<&str>,
        limit: u64,
    ) -> Self {
        let input = if compressed {
            let sink = Sink {
                scanner: Scanner::new(kind, None),
                limit,
            };
            match encoding {
                Some("gzip") => Input::Gzip(Box::new(flate2::write::GzDecoder::new(sink))),
                Some("deflate") => Input::Deflate(Box::new(flate2::write::ZlibDecoder::new(sink))),
                other => Input::Failed(DecodeError::Encoding(other.unwrap_or("(none)").into())),
            }
        } else if len as u64 > limit {
            Input::Failed(DecodeError::TooLarge {
                size: len as u64,
                limit,
            })
        } else {
            Input::Plain(Box::new(Sink {
                scanner: Scanner::new(kind, Some(len as u64)),
                limit,
            }))
        };
        MessageDecoder {
            input,
            limit,
            seen: 0,
        }
    }

    /// The resources' full chunks go through `interner` as they fill, shared with every
    /// stream decoding the same push.
    pub fn with_interner(mut self, interner: std::sync::Arc<super::Interner>) -> Self {
        let sink = match &mut self.input {
            Input::Plain(sink) => sink,
            Input::Gzip(d) => d.get_mut(),
            Input::Deflate(d) => d.get_mut(),
            Input::Failed(_) => return self,
        };
        sink.scanner.set_interner(interner);
        self
    }

    /// The next slice of the body.
    pub fn feed(&mut self, data: &[u8]) {
        self.seen += data.len() as u64;
        let result = match &mut self.input {
            Input::Plain(sink) => {
                sink.scanner.feed(data);
                Ok(())
            }
            Input::Gzip(d) => d.write_all(data),
            Input::Deflate(d) => d.write_all(data),
            Input::Failed(_) => Ok(()),
        };
        if let Err(e) = result {
            self.input = Input::Failed(self.inflate_error(e));
        }
    }

    fn inflate_error(&self, e: std::io::Error) -> DecodeError {
        if e.to_string().contains("decode limit") {
            DecodeError::TooLarge {
                size: self.limit + 1,
                limit: self.limit,
            }
        } else {
            DecodeError::Inflate(e.to_string())
        }
    }

    /// The body is complete.
    /// The error when the message is known to be undecodable from its prefix alone (over the
    /// limit, an encoding we do not inflate), so it can be counted at once rather than after
    /// the whole message has streamed past (a length prefix may claim 4 GiB).
    pub fn early_error(&self) -> Option<DecodeError> {
        match &self.input {
            Input::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }

    /// The message, once all of it was fed; or why it could not be read.
    pub fn finish(self) -> Result<Message, DecodeError> {
        let sink = match self.input {
            Input::Plain(sink) => *sink,
            Input::Gzip(d) => d
                .finish()
                .map_err(|e| DecodeError::Inflate(e.to_string()))?,
            Input::Deflate(d) => d
                .finish()
                .map_err(|e| DecodeError::Inflate(e.to_string()))?,
            Input::Failed(e) => return Err(e),
        };
        Ok(sink.scanner.finish()?)
    }
}
