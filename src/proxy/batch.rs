//! Fewer, larger socket reads under the HTTP/2 codec.
//!
//! The h2 crate reads about one frame per `recv`, and less: its read buffer is sized to the frame
//! it is decoding, so forwarding 16 KiB frames cost about two `recv` calls per frame, and the
//! kernel's per-call work dominated the tap's CPU (README, performance). [`Batched`] sits between
//! the codec (or TLS) and the socket: while data keeps arriving, one `recv` of up to
//! [`READ_CHUNK`] fills a buffer that serves the codec's next reads. The buffer is allocated at
//! the start of a burst and freed at its end, so an idle connection holds none.
//!
//! Writes pass straight through. Gathering them as well (put off each flush to the next poll so
//! that several frames go out in one `write`) measured no better within this machine's noise
//! and slowed the 1,000-stream workload, where the put-off bytes wait behind every other ready
//! task; it was taken out.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most one `recv` asks for.
pub const READ_CHUNK: usize = 64 * 1024;

/// A byte stream whose small reads are served from one larger `recv`.
///
/// Cold, it reads straight into the caller's buffer. A read that fills the caller's buffer says
/// more is waiting: it turns hot and the next reads go through a [`READ_CHUNK`] buffer, kept
/// (not re-zeroed) while reads find data. The first read that finds nothing frees it and turns
/// cold again, so neither an idle connection nor an empty poll pays for a 64 KiB buffer.
pub struct Batched<T> {
    io: T,
    /// Empty when cold; `READ_CHUNK` long when hot, holding `rbuf[rpos..rlen]` not yet handed out.
    rbuf: Vec<u8>,
    rpos: usize,
    rlen: usize,
}

impl<T> Batched<T> {
    /// Wraps `io`.
    pub fn new(io: T) -> Self {
        Batched {
            io,
            rbuf: Vec::new(),
            rpos: 0,
            rlen: 0,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Batched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.rpos == this.rlen {
            let room = buf.remaining();
            if this.rbuf.is_empty() || room >= READ_CHUNK {
                let before = buf.filled().len();
                if Pin::new(&mut this.io).poll_read(cx, buf)?.is_pending() {
                    this.rbuf = Vec::new();
                    return Poll::Pending;
                }
                let full = room > 0 && buf.filled().len() - before == room;
                if full && room < READ_CHUNK && this.rbuf.is_empty() {
                    this.rbuf = vec![0; READ_CHUNK];
                }
                return Poll::Ready(Ok(()));
            }
            let mut fill = ReadBuf::new(&mut this.rbuf);
            match Pin::new(&mut this.io).poll_read(cx, &mut fill) {
                Poll::Pending => {
                    this.rbuf = Vec::new();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    this.rlen = fill.filled().len();
                    this.rpos = 0;
                    if this.rlen == 0 {
                        this.rbuf = Vec::new();
                        return Poll::Ready(Ok(()));
                    }
                }
            }
        }
        let n = buf.remaining().min(this.rlen - this.rpos);
        buf.put_slice(&this.rbuf[this.rpos..this.rpos + n]);
        this.rpos += n;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Batched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Boxes `io`, batched unless `XDSTAP_NO_BATCH` is set: the switch for measuring before and
/// after (README, performance).
pub fn wrap<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: T) -> super::Io {
    if std::env::var_os("XDSTAP_NO_BATCH").is_some() {
        Box::new(io)
    } else {
        Box::new(Batched::new(io))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bytes written in any pattern of sizes and vectored writes arrive whole and in order, read
    /// through the batch in any mix of small and large reads.
    #[tokio::test]
    async fn bytes_arrive_unaltered_in_order() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut w = Batched::new(a);
        let mut r = Batched::new(b);
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let expect = data.clone();
        let writer = tokio::spawn(async move {
            let mut at = 0;
            let mut k = 0usize;
            while at < data.len() {
                // Sizes from 1 byte to past READ_CHUNK; a 9-byte head chained to a payload.
                let size = [1, 9, 300, 16_384, 70_000, 5][k % 6].min(data.len() - at);
                let (head, body) = data[at..at + size].split_at(size.min(9));
                let slices = [IoSlice::new(head), IoSlice::new(body)];
                let n =
                    std::future::poll_fn(|cx| Pin::new(&mut w).poll_write_vectored(cx, &slices))
                        .await
                        .unwrap();
                at += n;
                if k.is_multiple_of(3) {
                    w.flush().await.unwrap();
                }
                k += 1;
            }
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        // Small reads (served from the batch) and large ones (straight to the socket) mixed.
        let mut buf = vec![0u8; 70_000];
        let mut k = 0usize;
        loop {
            let size = [1000, 70_000, 1, 9][k % 4];
            k += 1;
            let n = r.read(&mut buf[..size]).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        writer.await.unwrap();
        assert_eq!(got.len(), expect.len());
        assert!(got == expect, "bytes altered");
    }
}
