//! The bounded event queue between the observer and the sinks: the observer hands events over
//! with `try_send` and never waits (a full queue drops, and the observer counts it), and a
//! thread of its own drains it into the sinks, the outputs and the views.

use std::cell::OnceCell;

use tokio::sync::mpsc;

use crate::correlate::Event;
use crate::record::VerdictRecord;

/// What the event queue carries. `Stop` comes once: boxing the event to even the variants
/// would cost an allocation per event for nothing.
#[allow(clippy::large_enum_variant)]
enum Queued {
    Event(Event),
    /// Deliver what came before, then stop.
    Stop,
}

/// The sending end of the event queue. Cloned into every observed stream.
#[derive(Clone)]
pub struct EventSender {
    tx: mpsc::Sender<Queued>,
}

impl EventSender {
    /// Hands an event over without waiting: false when the queue is full and it was dropped.
    #[must_use]
    pub fn send(&self, event: Event) -> bool {
        self.tx.try_send(Queued::Event(event)).is_ok()
    }
}

/// Something that consumes events. Runs on the sinks' own thread, never on the forwarding path.
pub trait Sink: Send {
    /// One event.
    fn on_event(&mut self, event: &Event);

    /// One event as delivered, with a verdict's record at hand; by default, [`Sink::on_event`].
    fn deliver(&mut self, delivered: &Delivered<'_>) {
        self.on_event(delivered.event);
    }
}

/// An event as the sinks get it: a verdict's flat record is built once, by the first sink
/// that reads it, and shared by the others.
pub struct Delivered<'a> {
    /// The event.
    pub event: &'a Event,
    record: OnceCell<Option<VerdictRecord>>,
}

impl<'a> Delivered<'a> {
    /// `event`, its record not built yet.
    pub fn new(event: &'a Event) -> Self {
        Delivered {
            event,
            record: OnceCell::new(),
        }
    }

    /// The verdict's record; none for other events.
    pub fn record(&self) -> Option<&VerdictRecord> {
        (self.record)
            .get_or_init(|| VerdictRecord::from_event(self.event))
            .as_ref()
    }
}

/// While items keep coming, a consumer thread takes them in batches a nap apart rather than
/// being woken for each (a wake-up is a futex call and two context switches, more than most
/// items cost): the sinks' naps are a millisecond, the observer's 200 µs (a relay may be
/// waiting for it). After 10 ms of empty looks it waits to be woken again.
pub(crate) struct Linger {
    /// Between two looks at an empty queue.
    pub nap: std::time::Duration,
}

impl Linger {
    /// The next item of a queue whose consumer is a thread of its own: at once when one is
    /// there, else after short naps while the queue has been busy lately, else when a sender
    /// wakes the thread.
    pub(crate) fn next<R, T>(
        &self,
        rx: &mut R,
        try_recv: impl Fn(&mut R) -> Result<T, mpsc::error::TryRecvError>,
        blocking_recv: impl FnOnce(&mut R) -> Option<T>,
    ) -> Option<T> {
        let rounds =
            (std::time::Duration::from_millis(10).as_micros() / self.nap.as_micros().max(1)).max(1);
        for _ in 0..rounds {
            match try_recv(rx) {
                Ok(q) => return Some(q),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) => std::thread::sleep(self.nap),
            }
        }
        blocking_recv(rx)
    }
}

/// The sinks at work: a thread of their own draining the bounded event queue, so that they
/// never take a turn from the forwarding tasks, and forwarding never waits for them (a full
/// queue drops and counts).
pub struct Sinks {
    tx: mpsc::Sender<Queued>,
    done: tokio::sync::oneshot::Receiver<()>,
}

impl Sinks {
    /// Starts the thread with `sinks`; events wait in a queue of `capacity`. Returns the
    /// senders' end.
    pub fn start(
        capacity: usize,
        mut sinks: Vec<Box<dyn Sink>>,
    ) -> std::io::Result<(EventSender, Sinks)> {
        let (tx, mut rx) = mpsc::channel(capacity.max(1));
        let (done_tx, done) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("xdstap-sinks".into())
            .spawn(move || {
                let linger = Linger {
                    nap: std::time::Duration::from_millis(1),
                };
                while let Some(Queued::Event(event)) =
                    linger.next(&mut rx, |r| r.try_recv(), |r| r.blocking_recv())
                {
                    let delivered = Delivered::new(&event);
                    for sink in sinks.iter_mut() {
                        sink.deliver(&delivered);
                    }
                }
                // Dropping the sinks lets exporters flush.
                drop(sinks);
                let _ = done_tx.send(());
            })?;
        Ok((EventSender { tx: tx.clone() }, Sinks { tx, done }))
    }

    /// Delivers everything queued so far, then drops the sinks.
    pub async fn close(self) {
        let _ = self.tx.send(Queued::Stop).await;
        let _ = self.done.await;
    }
}
