//! Live verdicts for watchers (`xdstap watch`, the API's `Watch`): every verdict, warming change
//! and peer fault goes to a broadcast channel while anyone listens, and costs nothing when no
//! one does. A watcher that reads too slowly misses events, never slows the sinks: it is told
//! how many it missed.

use tokio::sync::broadcast;

use super::Sink;
use crate::correlate::Event;

/// Events held for the slowest watcher before it starts missing them.
pub const WATCH_BUFFER: usize = 4096;

/// The broadcast end; cheap to clone.
#[derive(Clone)]
pub struct Watchers {
    tx: broadcast::Sender<Event>,
}

impl Default for Watchers {
    fn default() -> Self {
        Watchers {
            tx: broadcast::channel(WATCH_BUFFER).0,
        }
    }
}

impl Watchers {
    /// A new watcher: every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}

/// The events a watcher can see.
pub fn watched(event: &Event) -> bool {
    if let Event::Verdict { push, .. } = event {
        if push.heartbeat() {
            return false;
        }
    }
    matches!(
        event,
        Event::Verdict { .. }
            | Event::Warming { .. }
            | Event::StaleAnswer { .. }
            | Event::NonceReused { .. }
            | Event::UnmatchedAnswer { .. }
    )
}

impl Sink for Watchers {
    fn on_event(&mut self, event: &Event) {
        if self.tx.receiver_count() > 0 && watched(event) {
            // No receiver left between the check and the send is fine: nothing to deliver.
            let _ = self.tx.send(event.clone());
        }
    }
}
