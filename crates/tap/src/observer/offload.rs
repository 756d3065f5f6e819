//! The observer's own thread: the forwarding task hands each xDS stream's frames over (each
//! DATA payload, and the time it was read) and writes them on
//! at once; the deframing, decoding and correlation run here, one stream's work in the order
//! its bytes crossed the tap. So a burst's decoding falls behind the wire, not the wire behind
//! the decoding, and the decoding has a core of its own where the machine has one.
//!
//! ```text
//!  forwarding task: read chunk ─> Handle::on_data ─(job)─> write chunk on
//!                                      │
//!  observer thread:                    └─> deframe ─> decode ─> correlate ─> event queue
//! ```
//!
//! What waits is bounded in bytes, twice ([`crate::proxy::Backlogs`]): a connection whose
//! bytes are 512 KiB ahead of the observer, or any connection while the whole tap's are
//! `--observe-backlog` (2 MiB) ahead, reads nothing more until the observer has caught up half
//! of it. So nothing is dropped, a burst up to the bound costs forwarding nothing, and past it
//! forwarding goes at the observer's pace. The thread runs at the forwarding's priority: a
//! lower one made forwarding, once it waits for the thread, wait longer (measured in
//! docs/performance.md). It is handed slices of the relay's reads while the tap's backlog is
//! under one connection's bound, and copies past it (a storm), so that what waits then holds
//! no read buffers and the bounds are the memory observing holds beyond the streams' state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::XdsStream;
use crate::clock::now;
use crate::correlate::Timestamp;
use crate::proxy::{Backlog, Backlogs, Direction, Headers, StreamEnd, StreamObserver};

/// What the forwarding side hands the observer's thread.
enum Job {
    Open(u64, Box<XdsStream>, Arc<AtomicU64>, Backlogs),
    Data(u64, Direction, Bytes, Timestamp),
    ResponseHeaders(u64, Headers),
    Trailers(u64, Direction, Headers, Timestamp),
    End(u64, StreamEnd, Timestamp),
    /// The forwarding task dropped the stream without an end (the tap stopping).
    Gone(u64),
    /// Answer once every job before this one is done.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// What the forwarding side and the thread share.
struct Shared {
    /// Bytes handed over and not yet observed, over every connection.
    backlog: Arc<Backlog>,
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

    /// Until the guard is dropped, the observer's thread takes no job (forwarding goes on,
    /// up to the backlogs' bounds); then it catches up, with the times the bytes were read.
    pub fn hold(&self) -> Held {
        self.0.hold.set(true);
        Held(self.0.clone())
    }

    /// Bytes forwarded and not yet observed.
    pub fn backlog(&self) -> usize {
        self.0.backlog.queued()
    }
}

/// Until dropped, the observer's thread takes no job.
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

impl Offload {
    /// Starts the thread; at most `limit` bytes of the whole tap's wait for it.
    pub(super) fn start(limit: usize) -> std::io::Result<Offload> {
        let (jobs, mut rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            backlog: Arc::new(Backlog::new(limit)),
            hold: Hold::default(),
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("xdstap-observe".into())
            .spawn(move || {
                let mut streams = HashMap::new();
                // Short naps: a relay that waits for this thread waits for the nap too.
                let linger = crate::queue::Linger {
                    nap: std::time::Duration::from_micros(200),
                };
                while let Some(job) = linger.next(&mut rx, |r| r.try_recv(), |r| r.blocking_recv())
                {
                    worker.hold.wait();
                    run(job, &mut streams);
                }
            })?;
        Ok(Offload { jobs, shared })
    }

    /// The forwarding side's handle of `stream`, observed here, counting into `backlog`.
    pub(super) fn handle(&self, key: u64, stream: XdsStream, backlog: &Backlogs) -> Handle {
        let state = Arc::new(AtomicU64::new(0));
        let open = Job::Open(key, Box::new(stream), state.clone(), backlog.clone());
        let _ = self.jobs.send(open);
        Handle {
            key,
            backlog: backlog.clone(),
            jobs: self.jobs.clone(),
            state,
            sent: 1,
        }
    }

    /// The whole tap's backlog, which every connection counts into.
    pub(super) fn backlog(&self) -> Arc<Backlog> {
        self.shared.backlog.clone()
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
    /// Its connection's backlog and the tap's.
    backlog: Backlogs,
    /// Jobs done << 1 | settled.
    state: Arc<AtomicU64>,
    done: u64,
}

fn run(job: Job, streams: &mut HashMap<u64, Entry>) {
    let (key, done) = match job {
        Job::Open(key, stream, state, backlog) => {
            let entry = Entry {
                stream,
                backlog,
                state,
                done: 0,
            };
            streams.insert(key, entry);
            (key, false)
        }
        Job::Data(key, direction, chunk, at) => {
            if let Some(e) = streams.get_mut(&key) {
                e.stream.on_data(direction, &chunk, at);
                e.backlog.observed(chunk.len());
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
        // Kept until the forwarding side lets go of it: a push that crossed the client's
        // reset still comes to it.
        Job::End(key, end, at) => {
            if let Some(e) = streams.get_mut(&key) {
                e.stream.on_end(&end, at);
            }
            (key, false)
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
    /// The connection's backlog and the tap's: its relay stops reading when one is full.
    backlog: Backlogs,
    jobs: mpsc::UnboundedSender<Job>,
    state: Arc<AtomicU64>,
    /// Jobs handed over, [`Job::Open`] included.
    sent: u64,
}

impl Handle {
    fn send(&mut self, job: Job) {
        self.sent += 1;
        let _ = self.jobs.send(job);
    }
}

impl StreamObserver for Handle {
    fn on_data(&mut self, direction: Direction, chunk: &Bytes) {
        // A slice of the relay's read while few connections wait for the observer (each
        // holds a read buffer or two); a copy once the tap's backlog passes one connection's
        // bound (a storm), so that what waits holds no read buffers.
        let behind = self.backlog.tap.as_ref().map_or(0, |t| t.queued());
        let data = match behind < Backlogs::CONNECTION_CAP {
            true => chunk.clone(),
            false => Bytes::copy_from_slice(chunk),
        };
        self.backlog.add(chunk.len());
        self.send(Job::Data(self.key, direction, data, now()));
    }

    fn on_response_headers(&mut self, headers: &Headers) {
        self.send(Job::ResponseHeaders(self.key, headers.clone()));
    }

    fn on_trailers(&mut self, direction: Direction, trailers: &Headers) {
        self.send(Job::Trailers(self.key, direction, trailers.clone(), now()));
    }

    fn on_end(&mut self, end: &StreamEnd) {
        self.send(Job::End(self.key, end.clone(), now()));
    }

    fn settled(&self) -> bool {
        let state = self.state.load(Ordering::Acquire);
        state >> 1 == self.sent && state & 1 == 1
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.jobs.send(Job::Gone(self.key));
    }
}
