//! Fewer, larger socket calls under the HTTP/2 codec.
//!
//! The h2 crate reads about one frame per `recv` (its read buffer is sized to the frame it is
//! decoding) and writes and flushes every DATA frame on its own, so forwarding 16 KiB frames
//! costs two `recv`s and one `writev` per frame, and the kernel's per-call and per-segment work
//! dominated the tap's CPU (see the README's performance section). [`Batched`] sits between the
//! codec (or TLS) and the socket:
//!
//! - Reads: when the codec asks for less than [`READ_CHUNK`], one `recv` of up to
//!   [`READ_CHUNK`] fills a buffer that serves the next reads.
//! - Writes: bytes are gathered up to [`WRITE_CHUNK`]. A flush right after a write is put off:
//!   the codec flushes after each frame, and more frames usually follow in the same poll. Putting
//!   it off wakes the task, so the next call of any kind (the codec always reads again, and
//!   flushes at the end of its send loop) writes the bytes out. A flush with nothing written
//!   since the last one, a full buffer, and shutdown write at once.
//!
//! Both buffers are allocated when needed and freed once drained, so an idle connection holds
//! none.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most one `recv` asks for.
pub const READ_CHUNK: usize = 64 * 1024;
/// The most gathered before a write.
pub const WRITE_CHUNK: usize = 64 * 1024;

/// A byte stream whose reads and writes are gathered into larger socket calls.
pub struct Batched<T> {
    io: T,
    /// Read but not yet handed out: `rbuf[rpos..]`.
    rbuf: Vec<u8>,
    rpos: usize,
    /// Gathered, not yet written: `wbuf[wpos..]`.
    wbuf: Vec<u8>,
    wpos: usize,
    /// Bytes were gathered since the last flush call.
    fresh: bool,
    /// A write error met while writing out early, reported by the next write or flush.
    failed: Option<io::Error>,
}

impl<T> Batched<T> {
    /// Wraps `io`.
    pub fn new(io: T) -> Self {
        Batched {
            io,
            rbuf: Vec::new(),
            rpos: 0,
            wbuf: Vec::new(),
            wpos: 0,
            fresh: false,
            failed: None,
        }
    }
}

impl<T: AsyncWrite + Unpin> Batched<T> {
    /// Writes out everything gathered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.failed.take() {
            return Poll::Ready(Err(e));
        }
        while self.wpos < self.wbuf.len() {
            let n =
                std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &self.wbuf[self.wpos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.wpos += n;
        }
        self.wbuf = Vec::new();
        self.wpos = 0;
        Poll::Ready(Ok(()))
    }

    /// Writes out what was gathered if it can be done now; an error waits for the next write.
    fn drain_now(&mut self, cx: &mut Context<'_>) {
        if self.wpos < self.wbuf.len() {
            if let Poll::Ready(Err(e)) = self.poll_drain(cx) {
                self.failed = Some(e);
            }
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Batched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // The codec reads on every poll: the moment to write out a flush that was put off.
        this.drain_now(cx);
        if this.rpos == this.rbuf.len() {
            if buf.remaining() >= READ_CHUNK {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            }
            this.rbuf.resize(READ_CHUNK, 0);
            let mut fill = ReadBuf::new(&mut this.rbuf);
            let polled = Pin::new(&mut this.io).poll_read(cx, &mut fill);
            let n = fill.filled().len();
            this.rbuf.truncate(n);
            this.rpos = 0;
            if n == 0 {
                this.rbuf = Vec::new();
            }
            std::task::ready!(polled)?;
        }
        let n = buf.remaining().min(this.rbuf.len() - this.rpos);
        buf.put_slice(&this.rbuf[this.rpos..this.rpos + n]);
        this.rpos += n;
        if this.rpos == this.rbuf.len() {
            this.rbuf = Vec::new();
            this.rpos = 0;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Batched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if this.wbuf.len() - this.wpos + total > WRITE_CHUNK {
            std::task::ready!(this.poll_drain(cx))?;
        }
        if total >= WRITE_CHUNK {
            // Already large: straight to the socket.
            return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        }
        if this.wbuf.is_empty() {
            this.wbuf.reserve_exact(WRITE_CHUNK);
        }
        for b in bufs {
            this.wbuf.extend_from_slice(b);
        }
        this.fresh = true;
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if std::mem::take(&mut this.fresh) && this.wbuf.len() - this.wpos < WRITE_CHUNK {
            // More frames usually follow in this poll; the next call writes them all out.
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        std::task::ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Bytes written in any pattern of sizes, vectored writes and flushes arrive whole and in
    /// order, and reads of any size see them the same.
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
                // Sizes from 1 byte to past WRITE_CHUNK; a 9-byte head chained to a payload.
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
        let mut buf = vec![0u8; 1000];
        loop {
            let n = r.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        writer.await.unwrap();
        assert_eq!(got.len(), expect.len());
        assert!(got == expect, "bytes altered");
    }

    /// A flush right after a write is put off and wakes the task; the next call of any kind
    /// (here a read that finds nothing) writes the bytes out. A second flush with nothing new
    /// writes at once.
    #[test]
    fn put_off_flush_is_written_by_the_next_call() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (a, mut peer) = tokio::io::duplex(1 << 20);
            let mut t = Batched::new(a);
            let count = Arc::new(Count(AtomicUsize::new(0)));
            let waker = std::task::Waker::from(count.clone());
            let mut cx = Context::from_waker(&waker);

            let frame = [7u8; 100];
            assert!(matches!(
                Pin::new(&mut t).poll_write(&mut cx, &frame),
                Poll::Ready(Ok(100))
            ));
            assert!(matches!(
                Pin::new(&mut t).poll_flush(&mut cx),
                Poll::Ready(Ok(()))
            ));
            assert_eq!(
                count.0.load(Ordering::SeqCst),
                1,
                "putting off must wake the task"
            );
            let mut probe = [0u8; 200];
            let early =
                tokio::time::timeout(std::time::Duration::from_millis(50), peer.read(&mut probe))
                    .await;
            assert!(early.is_err(), "nothing written yet");

            let mut space = [0u8; 10];
            let mut rb = ReadBuf::new(&mut space);
            assert!(Pin::new(&mut t).poll_read(&mut cx, &mut rb).is_pending());
            let n = tokio::time::timeout(std::time::Duration::from_secs(5), peer.read(&mut probe))
                .await
                .expect("the read wrote out the put-off flush")
                .unwrap();
            assert_eq!(&probe[..n], &frame[..]);

            // Written, then flushed twice: the second flush writes.
            assert!(Pin::new(&mut t).poll_write(&mut cx, &frame).is_ready());
            assert!(Pin::new(&mut t).poll_flush(&mut cx).is_ready());
            assert!(Pin::new(&mut t).poll_flush(&mut cx).is_ready());
            let n = tokio::time::timeout(std::time::Duration::from_secs(5), peer.read(&mut probe))
                .await
                .expect("the second flush wrote")
                .unwrap();
            assert_eq!(n, 100);
        });
    }

    /// Gathering stops at WRITE_CHUNK: a full buffer is written without waiting for a flush.
    #[tokio::test]
    async fn a_full_buffer_is_written_without_a_flush() {
        let (a, mut peer) = tokio::io::duplex(1 << 20);
        let mut t = Batched::new(a);
        let piece = vec![1u8; 16_384];
        for _ in 0..(WRITE_CHUNK / piece.len() + 1) {
            t.write_all(&piece).await.unwrap();
        }
        let mut probe = vec![0u8; WRITE_CHUNK];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), peer.read(&mut probe))
            .await
            .expect("the full buffer was written")
            .unwrap();
        assert!(n > 0);
    }
}
