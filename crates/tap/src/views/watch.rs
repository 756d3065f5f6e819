//! Live verdicts for watchers (`xdstap watch`, the API's `Watch`, the page's `/events`): every
//! verdict, warming change and peer fault goes to a broadcast channel while anyone listens, as
//! the API's `WatchEvent`, made once (a verdict from its record) for every watcher, and costs
//! nothing when no one listens. A watcher that reads too slowly misses events, never slows
//! the sinks: it is told how many it missed. The last [`RECENT`] verdicts are kept as the API
//! shows them, [`bounded`] (names, versions and messages), so a page opened late still shows
//! what just happened.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::api::v1::watch_event::{self, Kind};
use crate::api::v1::{NackScope, WatchEvent};
use crate::api::NAMES_CAP;
use crate::clock::rfc3339;
use crate::correlate::Event;
use crate::queue::{Delivered, Sink};
use crate::record::VerdictRecord;
use crate::views::traces::TraceIds;
use crate::xds::short_type;

/// Events held for the slowest watcher before it starts missing them.
pub const WATCH_BUFFER: usize = 4096;
/// Verdicts kept for a page that opens late.
pub const RECENT: usize = 256;
/// The most of a message a kept or paged verdict holds (the whole one is in `/status`).
pub const MESSAGE_CAP: usize = 4096;

/// What a watcher sees unless told which: the verdicts, and clients reconnecting.
pub const SHOWN: [Kind; 5] = [
    Kind::Ack,
    Kind::Nack,
    Kind::Superseded,
    Kind::Unanswered,
    Kind::Resubscribe,
];

/// The broadcast end, and the recent verdicts; cheap to clone.
#[derive(Clone)]
pub struct Watchers {
    tx: broadcast::Sender<Arc<WatchEvent>>,
    recent: Arc<Mutex<VecDeque<WatchEvent>>>,
    traces: Option<TraceIds>,
}

impl Default for Watchers {
    fn default() -> Self {
        Watchers::new(None)
    }
}

impl Watchers {
    /// Watchers whose events name their trace as `traces` gives it (none: spans are off).
    pub fn new(traces: Option<TraceIds>) -> Self {
        Watchers {
            tx: broadcast::channel(WATCH_BUFFER).0,
            recent: Arc::default(),
            traces,
        }
    }

    /// A new watcher: every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<WatchEvent>> {
        self.tx.subscribe()
    }

    /// The last verdicts, oldest first.
    pub fn recent(&self) -> Vec<WatchEvent> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.iter().cloned().collect()
    }

    /// How the events name their trace.
    pub fn traces(&self) -> Option<&TraceIds> {
        self.traces.as_ref()
    }
}

/// The events a watcher can see.
pub fn watched(event: &Event) -> bool {
    if let Event::Verdict { push, .. } = event {
        if push.heartbeat() {
            return false;
        }
    }
    kind(event).is_some()
}

/// The kind of a watched event, as the API names it.
pub fn kind(event: &Event) -> Option<Kind> {
    Some(match event {
        Event::Verdict { verdict, .. } => Kind::from(verdict.kind()),
        Event::Warming { .. } => Kind::Warming,
        Event::Resubscribe { .. } => Kind::Resubscribe,
        Event::StaleAnswer { .. } => Kind::StaleAnswer,
        Event::NonceReused { .. } => Kind::NonceReused,
        Event::UnmatchedAnswer { .. } => Kind::UnmatchedAnswer,
        _ => return None,
    })
}

/// `delivered` as the API shows it (none for what watchers do not see), its trace named by
/// `traces`: a verdict from its record.
pub fn watched_event(delivered: &Delivered<'_>, traces: Option<&TraceIds>) -> Option<WatchEvent> {
    let event = delivered.event;
    if !watched(event) {
        return None;
    }
    match delivered.record() {
        Some(r) => Some(from_record(r, traces)),
        None => other_event(event),
    }
}

/// A verdict as the API shows it, from its record.
fn from_record(r: &VerdictRecord, traces: Option<&TraceIds>) -> WatchEvent {
    let kind = Kind::from(r.verdict);
    let api = r
        .subject
        .api
        .map_or(watch_event::Api::Unspecified, Into::into);
    let nack_scope = r.nack_scope.map_or(NackScope::Unspecified, NackScope::from);
    let trace_id = traces.map(|t| {
        t.of(&r.version, r.stream, &r.subject.type_url, &r.nonce)
            .to_string()
    });
    WatchEvent {
        time: r.time.clone(),
        node: r.subject.node.clone(),
        r#type: r.subject.short_type.clone(),
        type_url: r.subject.type_url.clone(),
        kind: kind as i32,
        api: api as i32,
        stream: r.stream,
        version: r.version.clone(),
        nonce: r.nonce.clone(),
        latency_ms: r.latency_ms,
        client_version: r.client_version.clone().unwrap_or_default(),
        error_message: r.error_message.clone().unwrap_or_default(),
        suspects: r.suspects.clone(),
        nack_scope: nack_scope as i32,
        rejected: r.rejected.clone(),
        applied: r.applied.clone(),
        objects: r.objects.clone(),
        overtaken_by: r.overtaken_by.clone().unwrap_or_default(),
        superseded_by: r.superseded_by.clone().unwrap_or_default(),
        end_message: r.end_message.clone().unwrap_or_default(),
        waiting_for: r.waiting_for.clone(),
        trace_id: trace_id.unwrap_or_default(),
        ..Default::default()
    }
}

/// A watched event other than a verdict as the API shows it.
fn other_event(event: &Event) -> Option<WatchEvent> {
    let kind = kind(event)?;
    let context = event.context();
    let node = context.node.as_ref().map(|n| n.id.as_str()).unwrap_or("");
    let mut w = WatchEvent {
        time: rfc3339(context.time),
        node: node.to_string(),
        r#type: short_type(&context.type_url).to_string(),
        type_url: context.type_url.clone(),
        kind: kind as i32,
        api: (context.stream.api).map_or(watch_event::Api::Unspecified, Into::into) as i32,
        stream: context.stream.seq,
        ..Default::default()
    };
    match event {
        Event::Warming {
            nonce,
            version,
            clusters,
            ..
        } => {
            w.nonce = nonce.clone();
            w.version = version.clone();
            w.waiting_for = clusters.clone();
        }
        Event::Resubscribe {
            version, versions, ..
        } => {
            w.version = version.clone();
            w.stated_count = versions.len() as u32;
            w.stated = (versions.iter().take(NAMES_CAP))
                .map(|(name, version)| crate::api::v1::StatedVersion {
                    name: name.clone(),
                    version: version.clone(),
                })
                .collect();
        }
        Event::StaleAnswer { nonce, .. }
        | Event::NonceReused { nonce, .. }
        | Event::UnmatchedAnswer { nonce, .. } => w.nonce = nonce.clone(),
        _ => {}
    }
    Some(w)
}

/// `w` cut to what a page is sent and the ring keeps: messages to [`MESSAGE_CAP`] bytes, name
/// lists to their first [`NAMES_CAP`] (as the status board keeps them), so what one verdict
/// holds does not grow with the size of its push.
pub fn bounded(mut w: WatchEvent) -> WatchEvent {
    cut(&mut w.error_message, MESSAGE_CAP);
    cut(&mut w.end_message, MESSAGE_CAP);
    for names in [
        &mut w.suspects,
        &mut w.rejected,
        &mut w.applied,
        &mut w.waiting_for,
    ] {
        names.truncate(NAMES_CAP);
    }
    w
}

/// `s` cut to at most `max` bytes, at a character boundary, marked when cut.
fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str(" …");
    }
}

impl Sink for Watchers {
    fn on_event(&mut self, event: &Event) {
        self.deliver(&Delivered::new(event));
    }

    fn deliver(&mut self, delivered: &Delivered<'_>) {
        let Some(w) = watched_event(delivered, self.traces()) else {
            return;
        };
        if let Event::Verdict { .. } = delivered.event {
            let kept = bounded(w.clone());
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(kept);
        }
        if self.tx.receiver_count() > 0 {
            // No receiver left between the check and the send is fine: nothing to deliver.
            let _ = self.tx.send(Arc::new(w));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_at_a_character() {
        let mut s = "é".repeat(10);
        cut(&mut s, 5);
        assert_eq!(s, "éé …");
        let mut short = "ok".to_string();
        cut(&mut short, 5);
        assert_eq!(short, "ok");
    }

    /// What a page is sent of a NACK of a large push does not grow with the push.
    #[test]
    fn a_kept_verdict_is_bounded_whatever_its_push() {
        let names: Vec<String> = (0..10_000).map(|i| format!("cluster-{i}")).collect();
        let w = bounded(WatchEvent {
            error_message: "x".repeat(100_000),
            applied: names.clone(),
            rejected: names.clone(),
            suspects: names.clone(),
            waiting_for: names,
            ..Default::default()
        });
        assert!(w.error_message.len() <= MESSAGE_CAP + " …".len());
        for list in [&w.applied, &w.rejected, &w.suspects, &w.waiting_for] {
            assert_eq!(list.len(), NAMES_CAP);
            assert_eq!(list[0], "cluster-0");
        }
    }
}
