//! The outputs: what the tap writes for others to keep. One log line per verdict (here), the
//! JSON-lines event log, OTLP spans and Prometheus metrics; and a recorder the demo and tests
//! read. Each is a sink on the sinks' thread.

pub mod eventlog;
pub mod metrics;
pub mod spans;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::correlate::{Event, Scope, Verdict, VerdictKind};
use crate::queue::{Delivered, Sink};
use crate::record::VerdictRecord;
use crate::xds::short_type;

/// One structured log line per verdict: NACK at warn (everything needed to act), others at
/// debug.
pub struct LogSink;

impl Sink for LogSink {
    fn on_event(&mut self, event: &Event) {
        self.deliver(&Delivered::new(event));
    }

    fn deliver(&mut self, delivered: &Delivered<'_>) {
        let event = delivered.event;
        if let Event::Verdict {
            verdict,
            waiting_for,
            ..
        } = event
        {
            // The record is read only for a line that is written.
            let on = match (verdict, waiting_for.is_empty()) {
                (Verdict::Nack { .. }, _) => tracing::enabled!(tracing::Level::WARN),
                (_, false) => tracing::enabled!(tracing::Level::INFO),
                _ => tracing::enabled!(tracing::Level::DEBUG),
            };
            if let Some(r) = delivered.record().filter(|_| on) {
                log_verdict(r);
            }
            return;
        }
        let context = event.context();
        let node = context.node.as_ref().map(|n| n.id.as_str()).unwrap_or("");
        // Values given as `&str` are logged in their Debug form, escaped; those given with `%`
        // (Display) are made printable here.
        let short = crate::xds::printable(short_type(&context.type_url));
        match event {
            Event::StaleAnswer {
                nonce,
                pending_nonce,
                nack,
                ..
            } => {
                tracing::debug!(xds.node = node, xds.type_url = %crate::xds::printable(&context.type_url), xds.nonce = %crate::xds::printable(nonce),
                    xds.pending_nonce = %crate::xds::printable(pending_nonce), nack, "{short} stale answer");
            }
            Event::Warming {
                nonce, clusters, ..
            } => {
                tracing::debug!(xds.node = node, xds.nonce = %crate::xds::printable(nonce),
                    xds.waiting_for = %crate::xds::printable(&clusters.join(",")), "{short} push warming");
            }
            Event::NonceReused { nonce, .. } => {
                tracing::debug!(xds.node = node, xds.type_url = %crate::xds::printable(&context.type_url), xds.nonce = %crate::xds::printable(nonce),
                    stream = context.stream.seq, "{short} nonce reused by the control plane");
            }
            _ => {}
        }
    }
}

/// One verdict's log line: a NACK at warn (everything needed to act), a push decided while its
/// clusters still waited for endpoints at info, others at debug.
fn log_verdict(r: &VerdictRecord) {
    use crate::xds::printable;
    let short = printable(&r.subject.short_type);
    let names = |v: &[String]| printable(&v.join(",")).into_owned();
    match r.verdict {
        VerdictKind::Nack => tracing::warn!(
            xds.node = r.subject.node.as_str(),
            xds.type_url = %printable(&r.subject.type_url),
            xds.version = %printable(&r.version),
            xds.nonce = %printable(&r.nonce),
            xds.client_version = r.client_version.as_deref().unwrap_or(""),
            xds.error_code = r.error_code.unwrap_or_default(),
            xds.error_message = %printable(r.error_message.as_deref().unwrap_or("")),
            xds.suspects = %names(&r.suspects),
            xds.changed = %names(&r.changed),
            xds.nack_scope = r.nack_scope.map_or("", Scope::as_str),
            xds.rejected = %names(&r.rejected),
            xds.applied = %names(&r.applied),
            xds.objects = %printable(&objects(r)),
            xds.overtaken_by = r.overtaken_by.as_deref().unwrap_or(""),
            stream = r.stream,
            "{short} push NACKed",
        ),
        verdict if !r.waiting_for.is_empty() => tracing::info!(
            xds.node = r.subject.node.as_str(),
            xds.version = %printable(&r.version),
            xds.nonce = %printable(&r.nonce),
            xds.verdict = verdict.name(),
            xds.waiting_for = %names(&r.waiting_for),
            stream = r.stream,
            "{short} push {} while clusters still waited for their endpoints",
            verdict.name(),
        ),
        verdict => tracing::debug!(
            xds.node = r.subject.node.as_str(),
            xds.type_url = %printable(&r.subject.type_url),
            xds.version = %printable(&r.version),
            xds.nonce = %printable(&r.nonce),
            xds.verdict = verdict.name(),
            latency_ms = r.latency_ms,
            stream = r.stream,
            "{short} push {}",
            verdict.name(),
        ),
    }
}

/// Keeps the last `capacity` events in memory, each with its verdict's record (the demo's
/// timeline and the tests read them).
#[derive(Clone)]
pub struct Recorder {
    events: Arc<Mutex<VecDeque<Recorded>>>,
    capacity: usize,
}

/// An event the [`Recorder`] kept, and its record when it is a verdict.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The event.
    pub event: Event,
    /// Its verdict's record (none for other events).
    pub record: Option<VerdictRecord>,
}

impl Recorder {
    /// A recorder of the last `capacity` events.
    pub fn new(capacity: usize) -> Self {
        Recorder {
            events: Arc::default(),
            capacity,
        }
    }

    /// A copy of the events held.
    pub fn events(&self) -> Vec<Event> {
        let held = self.events.lock().unwrap_or_else(|p| p.into_inner());
        held.iter().map(|r| r.event.clone()).collect()
    }

    /// A copy of the events held, with their records.
    pub fn recorded(&self) -> Vec<Recorded> {
        let held = self.events.lock().unwrap_or_else(|p| p.into_inner());
        held.iter().cloned().collect()
    }
}

impl Sink for Recorder {
    fn on_event(&mut self, event: &Event) {
        self.deliver(&Delivered::new(event));
    }

    fn deliver(&mut self, delivered: &Delivered<'_>) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if events.len() == self.capacity {
            events.pop_front();
        }
        events.push_back(Recorded {
            event: delivered.event.clone(),
            record: delivered.record().cloned(),
        });
    }
}

/// The objects behind a NACK for a log line: `DestinationRule default/r; Service default/r`.
fn objects(r: &VerdictRecord) -> String {
    let labels: Vec<String> = r.objects.iter().map(|o| o.label()).collect();
    labels.join("; ")
}
