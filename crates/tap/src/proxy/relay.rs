//! One connection pair: the client's bytes go to the upstream and the upstream's back, exactly
//! as read (same frames, stream ids, HPACK blocks, padding; SETTINGS, PING, WINDOW_UPDATE and
//! flow control stay the peers' own). Both directions run in one task; each reads a chunk,
//! shows its frames to the streams' observers, writes that very chunk on, and reads again only
//! once it is written, so a slow reader stops the tap reading from the writer and the tap
//! holds at most one chunk per direction. While data keeps coming a direction reads in place
//! into a buffer of its own; while idle it holds none, and what comes (an ACK, a small push)
//! is read into the stack and copied out.
//!
//! ```text
//!  client ──bytes──> [read chunk ─> FrameReader ─> observers] ──same bytes──> upstream
//!  client <──bytes── [observers <─ FrameReader <─ read chunk] <──same bytes── upstream
//! ```
//!
//! What a chunk's frames mean is [`super::reader`]'s business; the relay only moves bytes.
//! The tap speaks only at shutdown: a GOAWAY to the client, written between two of the
//! upstream's frames, so the client opens no new stream on a tap going away.
//!
//! The tap closes a connection the way a careful peer does, never dropping a socket with
//! bytes unread (the kernel would answer them with a reset, and a reset makes the receiver
//! discard what it has not yet read: the client's last ACK, say):
//! ```text
//!  draining: GOAWAY to the client ─> every stream settled (or the grace over) ─> closing:
//!    client side:   what is queued (nothing once the grace is over), then FIN; its bytes
//!                   still go on to the upstream
//!    upstream side: the client's FIN passed on after its last byte; the upstream's bytes
//!                   read and dropped until it closes
//!    both closed, or LINGER passed ─> the sockets are dropped
//! ```

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::listen::Io;
use super::reader::ConnectionReader;
use super::{Direction, ProxyStats, Side};

/// A direction's buffer while data keeps coming: the most one read takes.
pub const READ_CHUNK: usize = 256 << 10;
/// The most a read takes while idle (into the stack; no buffer is held): a read that fills it
/// says data keeps coming, and brings the large buffer.
const IDLE_CHUNK: usize = 8 << 10;

/// How long a closing relay waits for both peers to close after the tap's own FIN.
pub(super) const LINGER: Duration = Duration::from_secs(5);
/// While draining, how often a relay looks again whether its streams have settled: the
/// observer decides that on a thread of its own, after the bytes have gone by.
const SETTLE_CHECK: Duration = Duration::from_millis(5);

/// What the tap asks of its relays, in the order it asks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Stop {
    /// Relay.
    Serving,
    /// Send the client a GOAWAY; close once no stream waits for an answer.
    Draining,
    /// Close now (the grace is over).
    Closing,
}

/// How a relay ended.
#[derive(Debug)]
pub(super) enum Ended {
    /// Both sides closed their sending halves, and each close was passed on; this side first.
    Closed(Side),
    /// The tap closed it (draining, or at the end of the grace), as described above.
    Drained,
    /// A read or write failed on `by`'s connection.
    Failed(Side, io::Error),
}

/// One direction: where its bytes come from, what is waiting to go out.
struct Half {
    direction: Direction,
    buf: BytesMut,
    /// Chunks read and observed, not yet all written (the front one `written` far).
    out: VecDeque<Bytes>,
    written: usize,
    /// The source closed its sending half.
    eof: bool,
    /// ... and the close was passed on.
    closed: bool,
    /// Data keeps coming: read into the large buffer.
    hot: bool,
    /// The tap is closing the connection: once what is queued is written, the destination
    /// gets a FIN and what the source sends is read and dropped until it closes.
    closing: bool,
}

impl Half {
    fn new(direction: Direction) -> Self {
        Half {
            direction,
            buf: BytesMut::new(),
            out: VecDeque::new(),
            written: 0,
            eof: false,
            closed: false,
            hot: false,
            closing: false,
        }
    }

    /// `n` bytes of the waiting chunks went out.
    fn wrote(&mut self, mut n: usize) {
        while let Some(front) = self.out.front() {
            let left = front.len() - self.written;
            if n < left {
                self.written += n;
                return;
            }
            n -= left;
            self.out.pop_front();
            self.written = 0;
        }
    }

    fn held(&self) -> usize {
        self.out.iter().map(Bytes::len).sum::<usize>() - self.written
    }

    /// Writes what is waiting, then reads and observes the next chunk; `Ready(Ok)` once the
    /// source's close has been passed on.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        src: &mut Io,
        dst: &mut Io,
        observation: &mut ConnectionReader,
        stats: &ProxyStats,
    ) -> Poll<Result<(), (Side, io::Error)>> {
        let (from, to) = match self.direction {
            Direction::Request => (Side::Client, Side::Upstream),
            Direction::Response => (Side::Upstream, Side::Client),
        };
        loop {
            while !self.out.is_empty() {
                // The chunk read, in one write; in slices only where the tap adds its GOAWAY.
                let mut slices = [IoSlice::new(&[]); 3];
                for (i, b) in self.out.iter().take(slices.len()).enumerate() {
                    slices[i] = IoSlice::new(if i == 0 { &b[self.written..] } else { b });
                }
                let k = self.out.len().min(slices.len());
                let n = ready!(Pin::new(&mut *dst).poll_write_vectored(cx, &slices[..k]))
                    .map_err(|e| (to, e))?;
                if n == 0 {
                    return Poll::Ready(Err((to, io::ErrorKind::WriteZero.into())));
                }
                self.wrote(n);
            }
            // TLS holds records until flushed; a plain socket flushes at once.
            ready!(Pin::new(&mut *dst).poll_flush(cx)).map_err(|e| (to, e))?;
            if self.eof || self.closing {
                if !self.closed {
                    ready!(Pin::new(&mut *dst).poll_shutdown(cx)).map_err(|e| (to, e))?;
                    self.closed = true;
                }
                if self.eof {
                    return Poll::Ready(Ok(()));
                }
                return self.poll_discard(cx, src).map_err(|e| (from, e));
            }
            if self.direction == Direction::Response {
                if let Some(goaway) = observation.goaway_when_idle() {
                    self.out.push_back(goaway);
                    continue;
                }
            }
            // Reads no further than the observers can follow.
            ready!(observation.poll_room(cx));
            let chunk = match self.hot {
                true => ready!(self.poll_read_hot(cx, src)),
                false => ready!(poll_read_idle(cx, src)),
            };
            let chunk = chunk.map_err(|e| (from, e))?;
            if chunk.is_empty() {
                self.eof = true;
                continue;
            }
            // A read that fills the buffer says more is waiting: read in place from now on.
            if chunk.len() == IDLE_CHUNK && !self.hot {
                self.hot = true;
            }
            observation.pass(self.direction, chunk, &mut self.out);
            let held = self.held() as u64;
            stats.peak_buffered.fetch_max(held, Ordering::Relaxed);
        }
    }
}

impl Half {
    /// While data keeps coming: reads into the large buffer, and hands the bytes read out of it
    /// as they are (nothing copied). Once a read finds nothing, the buffer goes (reclaimed when
    /// the chunks taken from it are written) and the half is idle.
    fn poll_read_hot(&mut self, cx: &mut Context<'_>, src: &mut Io) -> Poll<io::Result<Bytes>> {
        if self.buf.capacity() == self.buf.len() {
            // Reclaims the buffer's space once the chunks written from it are dropped.
            self.buf.reserve(READ_CHUNK);
        }
        match tokio_util::io::poll_read_buf(Pin::new(&mut *src), cx, &mut self.buf) {
            Poll::Pending => {
                self.hot = false;
                self.buf = BytesMut::new();
                Poll::Pending
            }
            Poll::Ready(r) => Poll::Ready(r.map(|_| self.buf.split().freeze())),
        }
    }

    /// Reads what the source sends and drops it, until it closes: `Ready(Ok)` at its FIN.
    fn poll_discard(&mut self, cx: &mut Context<'_>, src: &mut Io) -> Poll<io::Result<()>> {
        let mut stack = [0u8; IDLE_CHUNK];
        loop {
            let mut read = tokio::io::ReadBuf::new(&mut stack);
            ready!(Pin::new(&mut *src).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                self.eof = true;
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// While idle: reads into the stack, so an idle connection holds no buffer (a thousand idle
/// proxies, a thousand buffers fewer); the few bytes that come (an ACK) are copied out.
fn poll_read_idle(cx: &mut Context<'_>, src: &mut Io) -> Poll<io::Result<Bytes>> {
    let mut stack = [0u8; IDLE_CHUNK];
    let mut read = tokio::io::ReadBuf::new(&mut stack);
    ready!(Pin::new(&mut *src).poll_read(cx, &mut read))?;
    Poll::Ready(Ok(Bytes::copy_from_slice(read.filled())))
}

/// Relays `client` and `upstream` until both sides have closed (or one fails), observing in
/// `observation`. When `stop` says so the tap drains: its GOAWAY goes to the client, and once
/// no stream waits for an answer (or when `stop` says to close) it closes both sides as the
/// module's diagram shows.
pub(super) async fn relay(
    mut client: Io,
    mut upstream: Io,
    observation: &mut ConnectionReader,
    stats: &ProxyStats,
    stop: watch::Receiver<Stop>,
) -> Ended {
    let mut halves = [
        Half::new(Direction::Request),
        Half::new(Direction::Response),
    ];
    let mut done = [false, false];
    let mut first: Option<Side> = None;
    let reached = |mut stop: watch::Receiver<Stop>, at: Stop| async move {
        let _ = stop.wait_for(|s| *s >= at).await;
    };
    let mut drain_asked = std::pin::pin!(reached(stop.clone(), Stop::Draining));
    let mut close_asked = std::pin::pin!(reached(stop, Stop::Closing));
    let mut draining = false;
    // Set once the tap closes: the linger's end.
    let mut linger: Option<Pin<Box<tokio::time::Sleep>>> = None;
    // Set once draining: the next look at whether the streams have settled.
    let mut settle_check: Option<tokio::time::Interval> = None;
    poll_fn(|cx| loop {
        if !draining && drain_asked.as_mut().poll(cx).is_ready() {
            draining = true;
            observation.drain();
            settle_check = Some(tokio::time::interval(SETTLE_CHECK));
        }
        if linger.is_none() {
            if let Some(check) = settle_check.as_mut() {
                // Only registers the wake-up: what it looks at is below.
                while check.poll_tick(cx).is_ready() {}
            }
        }
        let settled = draining && observation.drained() && halves.iter().all(|h| h.out.is_empty());
        if linger.is_none() && (settled || close_asked.as_mut().poll(cx).is_ready()) {
            if !settled {
                // The grace is over: what the client has not taken by now is not sent.
                halves[1].out.clear();
                halves[1].written = 0;
            }
            halves[1].closing = true;
            linger = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        if let Some(l) = linger.as_mut() {
            if l.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ended::Drained);
            }
        }
        let [up, down] = &mut halves;
        let [up_done, down_done] = &mut done;
        for (half, finished, from) in [
            (up, up_done, Side::Client),
            (down, down_done, Side::Upstream),
        ] {
            if *finished {
                continue;
            }
            let polled = match from {
                Side::Client => half.poll(cx, &mut client, &mut upstream, observation, stats),
                Side::Upstream => half.poll(cx, &mut upstream, &mut client, observation, stats),
            };
            match polled {
                Poll::Ready(Ok(())) => {
                    *finished = true;
                    first.get_or_insert(from);
                }
                // Closing, a peer that resets instead of closing ends it all the same.
                Poll::Ready(Err(_)) if linger.is_some() => return Poll::Ready(Ended::Drained),
                Poll::Ready(Err((by, e))) => return Poll::Ready(Ended::Failed(by, e)),
                Poll::Pending => {}
            }
        }
        if done == [true, true] {
            return Poll::Ready(match linger {
                Some(_) => Ended::Drained,
                None => Ended::Closed(first.unwrap_or(Side::Client)),
            });
        }
        // What was just read may have settled the last stream: close now, not at the next
        // wake-up.
        let settled_now =
            draining && observation.drained() && halves.iter().all(|h| h.out.is_empty());
        if linger.is_some() || !settled_now {
            return Poll::Pending;
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_takes_off_what_went_out_across_chunks() {
        let mut h = Half::new(Direction::Response);
        h.out.extend([
            Bytes::from_static(b"abc"),
            Bytes::from_static(b"GOAWAY"),
            Bytes::from_static(b"de"),
        ]);
        h.wrote(2);
        assert_eq!((h.out.len(), h.written, h.held()), (3, 2, 9));
        h.wrote(4);
        assert_eq!((h.out.len(), h.written, h.held()), (2, 3, 5));
        h.wrote(5);
        assert_eq!((h.out.len(), h.written, h.held()), (0, 0, 0));
    }
}
