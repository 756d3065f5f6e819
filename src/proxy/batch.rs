//! Fewer, larger socket reads and writes under the HTTP/2 codec.
//!
//! The h2 crate reads about one frame per `recv`, and less: its read buffer is sized to the frame
//! it is decoding, so forwarding 16 KiB frames costs about two `recv` calls per frame, and the
//! kernel's per-call work dominates. [`Batched`] sits between
//! the codec (or TLS) and the socket: while data keeps arriving, one `recv` of up to
//! [`READ_CHUNK`] fills a buffer that serves the codec's next reads. The buffer is allocated at
//! the start of a burst and freed at its end, so an idle connection holds none.
//!
//! The codec also writes and flushes each DATA frame on its own (one `writev` per 16 KiB frame).
//! The task that drives a connection polls it through its [`Gate`]: during that poll the codec's
//! writes are gathered (up to [`WRITE_GATHER`]) and its flushes put off, and at the end of the
//! poll everything gathered goes out in one `write`, as an event loop writes at the end of its
//! turn. Nothing waits past the poll that produced it (the bytes would wait behind every other
//! ready task), and the buffer is freed once written.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most one `recv` asks for.
pub const READ_CHUNK: usize = 64 * 1024;

/// The most gathered before writing, within one poll.
pub const WRITE_GATHER: usize = 128 * 1024;

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
    /// Gathered writes not yet on the socket: `wbuf[wpos..]`. Empty outside a gathering poll.
    wbuf: Vec<u8>,
    wpos: usize,
    /// Inside the poll of the task that drives the connection ([`Gate::poll`]): writes are
    /// gathered and flushes put off to the end of that poll.
    gathering: bool,
    /// A write that failed at the end of a poll, for the codec's next write or flush to see.
    failed: Option<io::Error>,
}

impl<T> Batched<T> {
    /// Wraps `io`.
    pub fn new(io: T) -> Self {
        Batched {
            io,
            rbuf: Vec::new(),
            rpos: 0,
            rlen: 0,
            wbuf: Vec::new(),
            wpos: 0,
            gathering: false,
            failed: None,
        }
    }
}

impl<T: AsyncWrite + Unpin> Batched<T> {
    /// Writes what is gathered; frees the buffer once it is all out.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.wpos < self.wbuf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.wbuf[self.wpos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.wpos += n;
        }
        self.wbuf = Vec::new();
        self.wpos = 0;
        Poll::Ready(Ok(()))
    }

    /// Appends `bufs`. A buffer started by a frame-sized write is taken at its full size at
    /// once, so that gathering never reallocates (and copies) what it holds.
    fn gather<B: std::ops::Deref<Target = [u8]>>(&mut self, bufs: &[B]) -> usize {
        let n = bufs.iter().map(|b| b.len()).sum();
        if self.wbuf.capacity() == 0 && n >= 4096 {
            self.wbuf.reserve(WRITE_GATHER + 32 * 1024);
        }
        for b in bufs {
            self.wbuf.extend_from_slice(b);
        }
        n
    }

    /// Before gathering more: the error of an earlier write-out, or room (writing out when full).
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.failed.take() {
            return Poll::Ready(Err(e));
        }
        // A write-out under way (the socket was full) finishes first, so the buffer never
        // holds more than WRITE_GATHER and one write.
        if self.wpos > 0 || self.wbuf.len() >= WRITE_GATHER {
            ready!(self.poll_write_out(cx))?;
        }
        Poll::Ready(Ok(()))
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
        let this = self.get_mut();
        if !this.gathering && this.wbuf.is_empty() {
            return Pin::new(&mut this.io).poll_write(cx, buf);
        }
        ready!(this.poll_room(cx))?;
        this.gather(&[buf]);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !this.gathering && this.wbuf.is_empty() {
            return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        }
        ready!(this.poll_room(cx))?;
        Poll::Ready(Ok(this.gather(bufs)))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Err(e));
        }
        if this.gathering {
            // The end of the driver's poll writes it out.
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// One connection's socket, shared by the HTTP/2 codec (reading and writing it) and the task
/// that drives the codec (writing out at the end of each poll, see [`Gate`]).
struct SharedIo<T>(Arc<Mutex<Batched<T>>>);

impl<T> SharedIo<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Batched<T>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SharedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.lock()).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SharedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.lock()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.lock()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.lock().is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.lock()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.lock()).poll_shutdown(cx)
    }
}

trait Gated: Send + Sync {
    fn enter(&self);
    fn exit(&self, cx: &mut Context<'_>);
}

impl<T: AsyncWrite + Unpin + Send> Gated for Mutex<Batched<T>> {
    fn enter(&self) {
        self.lock().unwrap_or_else(|p| p.into_inner()).gathering = true;
    }

    fn exit(&self, cx: &mut Context<'_>) {
        let mut b = self.lock().unwrap_or_else(|p| p.into_inner());
        b.gathering = false;
        // Pending: the socket wakes this task when writable, and the next poll's end goes on.
        if let Poll::Ready(Err(e)) = b.poll_write_out(cx) {
            b.failed = Some(e);
        }
    }
}

/// Held by the task that drives an HTTP/2 connection: while it polls the connection, the
/// codec's writes (one per DATA frame, in the h2 crate) are gathered, and written at the end of
/// the poll in one `write`, as an event loop writes at the end of its turn. Nothing waits past
/// the poll that produced it.
#[derive(Clone, Default)]
pub struct Gate(Option<Arc<dyn Gated>>);

impl Gate {
    /// Runs `poll` (one poll of the connection) with writes gathered, then writes them out.
    pub fn poll<R>(&self, cx: &mut Context<'_>, poll: impl FnOnce(&mut Context<'_>) -> R) -> R {
        match &self.0 {
            None => poll(cx),
            Some(g) => {
                g.enter();
                let r = poll(cx);
                g.exit(cx);
                r
            }
        }
    }
}

/// Boxes `io`, batched unless `XDSTAP_NO_BATCH` is set: the switch for measuring before and
/// after (README, performance). Writes are gathered only where the returned gate is used, and
/// not at all when `XDSTAP_NO_GATHER` is set.
pub fn wrap<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: T) -> (super::Io, Gate) {
    if std::env::var_os("XDSTAP_NO_BATCH").is_some() {
        return (Box::new(io), Gate::default());
    }
    let shared = Arc::new(Mutex::new(Batched::new(io)));
    let gate = match std::env::var_os("XDSTAP_NO_GATHER") {
        Some(_) => Gate::default(),
        None => Gate(Some(shared.clone())),
    };
    (Box::new(SharedIo(shared)), gate)
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

    /// A socket that counts `write` calls and records what reaches it, with room for `room`
    /// unread bytes (then it blocks until `drain`).
    #[derive(Default)]
    struct Wire {
        writes: usize,
        got: Vec<u8>,
        room: usize,
        waker: Option<std::task::Waker>,
    }

    #[derive(Clone, Default)]
    struct Sock(Arc<Mutex<Wire>>);

    impl Sock {
        fn wire(&self) -> std::sync::MutexGuard<'_, Wire> {
            self.0.lock().unwrap()
        }

        fn drain(&self) -> Vec<u8> {
            let mut w = self.wire();
            w.room += w.got.len();
            if let Some(k) = w.waker.take() {
                k.wake();
            }
            std::mem::take(&mut w.got)
        }
    }

    impl AsyncRead for Sock {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Sock {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let mut w = self.wire();
            if w.room == 0 {
                w.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let n = buf.len().min(w.room);
            w.room -= n;
            w.writes += 1;
            w.got.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Frames written and flushed one by one inside a gated poll reach the socket in one write
    /// when the poll ends, not before; outside a gate every write goes straight through.
    #[test]
    fn a_gated_poll_writes_once_at_its_end() {
        let sock = Sock::default();
        sock.wire().room = usize::MAX;
        let shared = Arc::new(Mutex::new(Batched::new(sock.clone())));
        let gate = Gate(Some(shared.clone()));
        let mut io = SharedIo(shared);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let frames: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; 9 + 16_384]).collect();
        gate.poll(&mut cx, |cx| {
            for f in &frames {
                let (head, body) = f.split_at(9);
                let slices = [IoSlice::new(head), IoSlice::new(body)];
                assert!(matches!(
                    Pin::new(&mut io).poll_write_vectored(cx, &slices),
                    Poll::Ready(Ok(n)) if n == f.len()
                ));
                assert!(Pin::new(&mut io).poll_flush(cx).is_ready());
                assert_eq!(sock.wire().writes, 0, "written inside the poll");
            }
        });
        assert_eq!(sock.wire().writes, 1);
        assert_eq!(sock.drain(), frames.concat());
        // No gate: straight through, one write each.
        for f in &frames {
            assert!(Pin::new(&mut io).poll_write(&mut cx, f).is_ready());
        }
        assert_eq!(sock.wire().writes, 1 + frames.len());
        assert_eq!(sock.drain(), frames.concat());
    }

    /// When the socket is full, gathering stops at WRITE_GATHER, the codec's write waits, the
    /// end of the poll writes what fits, and later polls finish the rest in order.
    #[test]
    fn a_full_socket_holds_the_codec_back_and_nothing_is_lost() {
        let sock = Sock::default();
        sock.wire().room = 100_000;
        let shared = Arc::new(Mutex::new(Batched::new(sock.clone())));
        let gate = Gate(Some(shared.clone()));
        let mut io = SharedIo(shared);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut at = 0;
        let mut got = Vec::new();
        let mut polls = 0;
        while at < data.len() || got.len() < data.len() {
            polls += 1;
            assert!(polls < 1000, "no progress");
            gate.poll(&mut cx, |cx| {
                while at < data.len() {
                    let end = (at + 16_393).min(data.len());
                    match Pin::new(&mut io).poll_write(cx, &data[at..end]) {
                        Poll::Ready(Ok(n)) => at += n,
                        Poll::Ready(Err(e)) => panic!("{e}"),
                        Poll::Pending => break,
                    }
                }
                let held = io.lock().wbuf.len();
                assert!(held < WRITE_GATHER + 16_393, "gathered {held}");
            });
            got.extend(sock.drain());
        }
        assert!(got == data, "bytes altered");
    }

    /// Neither buffer outlives its burst: the read buffer, taken when reads fill the codec's
    /// buffer, is freed by the first read that finds nothing; the write buffer once written.
    #[tokio::test]
    async fn buffers_are_freed_when_the_burst_ends() {
        let (mut peer, near) = tokio::io::duplex(1 << 20);
        let mut b = Batched::new(near);
        peer.write_all(&[7u8; 200_000]).await.unwrap();
        let mut small = [0u8; 16_384];
        let n = b.read(&mut small).await.unwrap();
        assert_eq!(n, small.len());
        let n = b.read(&mut small).await.unwrap();
        assert!(n > 0);
        assert_eq!(b.rbuf.len(), READ_CHUNK, "hot after a full read");
        let mut got = 16_384 + n;
        while got < 200_000 {
            got += b.read(&mut small).await.unwrap();
        }
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut rb = ReadBuf::new(&mut small);
        assert!(Pin::new(&mut b).poll_read(&mut cx, &mut rb).is_pending());
        assert_eq!(b.rbuf.capacity(), 0, "read buffer kept while idle");

        b.gathering = true;
        assert!(Pin::new(&mut b)
            .poll_write(&mut cx, &[1u8; 20_000])
            .is_ready());
        assert!(b.wbuf.capacity() >= 20_000);
        b.gathering = false;
        assert!(Pin::new(&mut b).poll_flush(&mut cx).is_ready());
        assert_eq!(b.wbuf.capacity(), 0, "write buffer kept once written");
        let mut back = vec![0u8; 20_000];
        peer.read_exact(&mut back).await.unwrap();
        assert!(back.iter().all(|&x| x == 1));
    }
}
