//! The observer's own thread: the forwarding task hands each xDS stream's frames over (the
//! chunk itself, shared, not copied, and the time it was read) and writes them on at once; the
//! deframing, decoding and correlation run here, at a lower priority than forwarding, one
//! stream's work in the order its bytes crossed the tap. So a busy machine's decoding falls
//! behind the wire, never the wire behind the decoding.
//!
//! ```text
//!  forwarding task: read chunk ─> Handle::on_data ─(job)─> write chunk on
//!                                      │
//!  observer thread:                    └─> deframe ─> decode ─> correlate ─> event queue
//! ```
//!
//! The backlog is bounded in bytes (`--observe-backlog`): a stream whose chunk would pass it is
//! no longer observed, from that chunk to its end. Its correlator ends there, so every push
//! it had open gets its verdict with that reason (unanswered: "not observed past ..."), the
//! stream is counted (`xdstap_streams_unobserved_total`) and logged once; its bytes flow on
//! as before. What waits in the backlog is the relay's own chunks, so the bound is also the
//! most memory observing can hold beyond the streams' own state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{ObserverStats, XdsStream};
use crate::clock::now;
use crate::correlate::Timestamp;
use crate::proxy::{Backlog, Direction, Headers, StreamEnd, StreamObserver};

/// What the forwarding side hands the observer's thread.
enum Job {
    Open(u64, Box<XdsStream>, Arc<AtomicU64>, Arc<Backlog>),
    Data(u64, Direction, Bytes, Timestamp),
    ResponseHeaders(u64, Headers),
    Trailers(u64, Direction, Headers, Timestamp),
    End(u64, StreamEnd, Timestamp),
    /// The backlog was full: observation of the stream stops here.
    Unobserved(u64, Timestamp),
    /// The forwarding task dropped the stream without an end (the tap stopping).
    Gone(u64),
    /// Answer once every job before this one is done.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// What the forwarding side and the thread share.
struct Shared {
    /// Bytes of chunks handed over and not yet observed.
    queued: AtomicUsize,
    /// The most `queued` may reach.
    limit: usize,
    stats: Arc<ObserverStats>,
    hold: Hold,
}

/// A gate the thread waits at before each job, closed by [`Gate::hold`]: how a test shows
/// that a slow observer delays no frame.
#[derive(Default)]
struct Hold {
    closed: AtomicBool,
    lock: Mutex<bool>,
    open: Condvar,
}

impl Hold {
    fn set(&self, closed: bool) {
        let mut held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        *held = closed;
        self.closed.store(closed, Ordering::Release);
        self.open.notify_all();
    }

    fn wait(&self) {
        if !self.closed.load(Ordering::Acquire) {
            return;
        }
        let mut held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        while *held {
            held = self.open.wait(held).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The way to hold the observer's thread (for tests and benchmarks).
#[derive(Clone)]
pub struct Gate(Arc<Shared>, mpsc::UnboundedSender<Job>);

impl Gate {
    /// Waits until everything forwarded so far is observed and its events queued.
    pub async fn caught_up(&self) {
        flush(&self.1).await;
    }

    /// Until the guard is dropped, the observer's thread takes no job (forwarding goes on);
    /// then it catches up, with the times the bytes were read.
    pub fn hold(&self) -> Held {
        self.0.hold.set(true);
        Held(self.0.clone())
    }

    /// Bytes forwarded and not yet observed.
    pub fn backlog(&self) -> usize {
        self.0.queued.load(Ordering::Relaxed)
    }
}

/// Until dropped, the observer's thread takes no job (forwarding goes on).
pub struct Held(Arc<Shared>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.hold.set(false);
    }
}

/// The observer's thread and the way to it.
pub(super) struct Offload {
    jobs: mpsc::UnboundedSender<Job>,
    shared: Arc<Shared>,
}

/// What the observer's thread runs first, set once by the binary (see [`on_thread_start`]).
static THREAD_START: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets what the observer's thread runs as it starts: the binary lowers its priority there
/// (the library makes no FFI calls), so that under load the scheduler gives forwarding the
/// core first. Only the first call counts.
pub fn on_thread_start(f: fn()) {
    let _ = THREAD_START.set(f);
}

impl Offload {
    /// Starts the thread; at most `limit` bytes wait for it.
    pub(super) fn start(stats: Arc<ObserverStats>, limit: usize) -> std::io::Result<Offload> {
        let (jobs, mut rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            limit,
            stats,
            hold: Hold::default(),
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("xdstap-observe".into())
            .spawn(move || {
                if let Some(start) = THREAD_START.get() {
                    start();
                }
                let mut streams = HashMap::new();
                while let Some(job) =
                    crate::queue::next(&mut rx, |r| r.try_recv(), |r| r.blocking_recv())
                {
                    worker.hold.wait();
                    run(job, &mut streams, &worker);
                }
            })?;
        Ok(Offload { jobs, shared })
    }

    /// The forwarding side's handle of `stream`, observed here.
    pub(super) fn handle(&self, key: u64, stream: XdsStream, backlog: &Arc<Backlog>) -> Handle {
        let state = Arc::new(AtomicU64::new(0));
        let (stream, connection) = (Box::new(stream), backlog.clone());
        let _ = self
            .jobs
            .send(Job::Open(key, stream, state.clone(), connection));
        Handle {
            key,
            connection: backlog.clone(),
            jobs: self.jobs.clone(),
            shared: self.shared.clone(),
            state,
            sent: 1,
            unobserved: false,
            ended: false,
        }
    }

    /// Waits until every job handed over so far is done.
    pub(super) async fn flush(&self) {
        flush(&self.jobs).await;
    }

    /// The way to hold the thread.
    pub(super) fn gate(&self) -> Gate {
        Gate(self.shared.clone(), self.jobs.clone())
    }
}

async fn flush(jobs: &mpsc::UnboundedSender<Job>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if jobs.send(Job::Flush(tx)).is_ok() {
        let _ = rx.await;
    }
}

/// One stream on the thread: its observer, and what the forwarding side reads of it.
struct Entry {
    stream: Box<XdsStream>,
    /// Its connection's backlog.
    connection: Arc<Backlog>,
    /// Jobs done << 1 | settled.
    state: Arc<AtomicU64>,
    done: u64,
}

fn run(job: Job, streams: &mut HashMap<u64, Entry>, shared: &Shared) {
    let (key, done) = match job {
        Job::Open(key, stream, state, connection) => {
            streams.insert(
                key,
                Entry {
                    stream,
                    connection,
                    state,
                    done: 0,
                },
            );
            (key, false)
        }
        Job::Data(key, direction, chunk, at) => {
            shared.queued.fetch_sub(chunk.len(), Ordering::Relaxed);
            if let Some(e) = streams.get_mut(&key) {
                e.stream.on_data(direction, &chunk, at);
                e.connection.observed(chunk.len());
            }
            (key, false)
        }
        Job::ResponseHeaders(key, headers) => {
            if let Some(e) = streams.get_mut(&key) {
                e.stream.on_response_headers(&headers);
            }
            (key, false)
        }
        Job::Trailers(key, direction, headers, at) => {
            if let Some(e) = streams.get_mut(&key) {
                e.stream.on_trailers(direction, &headers, at);
            }
            (key, false)
        }
        Job::Unobserved(key, at) => {
            if let Some(e) = streams.get_mut(&key) {
                e.stream.unobserved(shared.limit, at);
            }
            (key, false)
        }
        Job::End(key, end, at) => {
            if let Some(e) = streams.get_mut(&key) {
                e.stream.on_end(&end, at);
            }
            (key, true)
        }
        Job::Gone(key) => (key, true),
        Job::Flush(done) => {
            let _ = done.send(());
            return;
        }
    };
    if done {
        streams.remove(&key);
    } else if let Some(e) = streams.get_mut(&key) {
        e.done += 1;
        let settled = u64::from(e.stream.settled());
        e.state.store(e.done << 1 | settled, Ordering::Release);
    }
}

/// The forwarding side of one xDS stream: hands each call over and returns.
pub(super) struct Handle {
    key: u64,
    /// The connection's backlog: its relay stops reading when it is full.
    connection: Arc<Backlog>,
    jobs: mpsc::UnboundedSender<Job>,
    shared: Arc<Shared>,
    state: Arc<AtomicU64>,
    /// Jobs handed over, [`Job::Open`] included, ends not.
    sent: u64,
    unobserved: bool,
    ended: bool,
}

impl Handle {
    fn send(&mut self, job: Job) {
        self.sent += 1;
        let _ = self.jobs.send(job);
    }
}

impl StreamObserver for Handle {
    fn on_data(&mut self, direction: Direction, chunk: &Bytes) {
        if self.unobserved {
            return;
        }
        let n = chunk.len();
        let queued = self.shared.queued.fetch_add(n, Ordering::Relaxed);
        if queued + n > self.shared.limit {
            self.shared.queued.fetch_sub(n, Ordering::Relaxed);
            self.unobserved = true;
            let stats = &self.shared.stats;
            stats.streams_unobserved.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                stream = self.key,
                backlog = self.shared.limit,
                "The observer is behind by more than its backlog: this stream is forwarded, \
                 not observed, from here to its end"
            );
            self.send(Job::Unobserved(self.key, now()));
            return;
        }
        self.connection.add(n);
        self.send(Job::Data(self.key, direction, chunk.clone(), now()));
    }

    fn on_response_headers(&mut self, headers: &Headers) {
        if !self.unobserved {
            self.send(Job::ResponseHeaders(self.key, headers.clone()));
        }
    }

    fn on_trailers(&mut self, direction: Direction, trailers: &Headers) {
        if !self.unobserved {
            self.send(Job::Trailers(self.key, direction, trailers.clone(), now()));
        }
    }

    fn on_end(&mut self, end: &StreamEnd) {
        self.ended = true;
        let _ = self.jobs.send(Job::End(self.key, end.clone(), now()));
    }

    fn settled(&self) -> bool {
        let state = self.state.load(Ordering::Acquire);
        state >> 1 == self.sent && state & 1 == 1
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.jobs.send(Job::Gone(self.key));
        }
    }
}
