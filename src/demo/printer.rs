//! The demo's timeline: one line per event, as the tap's own events tell it, a verdict as its
//! record says it (or one JSON object per event with `--json`).

use crate::cli::status::one_line;
use xdstap::{Recorded, VerdictRecord};
use xdstap_core::correlate::{Event, Scope, VerdictKind};
use xdstap_core::xds::short_type;

/// Prints events as they come.
pub struct Printer {
    /// JSON lines instead of text.
    pub json: bool,
    /// ANSI colours.
    pub color: bool,
    /// Times are shown relative to this.
    pub start: u64,
    /// Events already printed.
    pub seen: usize,
}

impl Printer {
    /// `s` in colour `code` when colours are on.
    pub fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    /// A line of narration (not in JSON mode).
    pub fn say(&self, s: &str) {
        if !self.json {
            println!("{s}");
        }
    }

    /// Prints events not yet printed.
    pub fn events(&mut self, events: &[Recorded]) {
        for r in &events[self.seen..] {
            if self.json {
                println!("{}", serde_json::to_string(&r.event).unwrap_or_default());
            } else {
                println!("{}", self.line(r));
            }
        }
        self.seen = events.len();
    }

    /// One event on one line (a NACK on three).
    fn line(&self, r: &Recorded) -> String {
        let e = &r.event;
        let context = e.context();
        let t = format!(
            "+{:7.3}s",
            context.time.saturating_sub(self.start) as f64 / 1e9
        );
        let ty = short_type(&context.type_url);
        match e {
            Event::Subscribe { .. } => format!("{t}  {ty:4} subscribe"),
            Event::Resubscribe { version, .. } => {
                format!("{t}  {ty:4} resubscribe after reconnect, client has {version}")
            }
            Event::SubscriptionChange { names, .. } => {
                format!("{t}  {ty:4} subscription change: {}", names.join(","))
            }
            Event::Push { push, .. } => {
                let n = push.resources.len();
                let names: Vec<_> = push.resources.iter().map(|r| r.name).collect();
                format!(
                    "{t}  {ty:4} push {} ({n} resource{}: {}) nonce {}",
                    push.version,
                    if n == 1 { "" } else { "s" },
                    names.join(","),
                    push.nonce
                )
            }
            Event::Verdict { .. } => r
                .record
                .as_ref()
                .map_or(String::new(), |v| self.verdict(&t, v)),
            Event::Warming { clusters, .. } if clusters.is_empty() => {
                format!("{t}  {ty:4} warming done: every cluster has its endpoints")
            }
            Event::Warming { clusters, .. } => {
                format!(
                    "{t}  {ty:4} warming: waits for endpoints of {}",
                    clusters.join(",")
                )
            }
            Event::UnmatchedAnswer { nonce, .. } => {
                format!("{t}  {ty:4} answer to nonce {nonce}, never pushed on this stream")
            }
            Event::NonceReused { nonce, .. } => self.paint(
                "33",
                &format!("{t}  {ty:4} nonce {nonce} sent again by the control plane"),
            ),
            Event::StaleAnswer { nonce, .. } => self.paint(
                "33",
                &format!("{t}  {ty:4} stale answer to nonce {nonce}, already superseded"),
            ),
            Event::StreamEnd {
                grpc_status,
                message,
                ..
            } => {
                let status = grpc_status.map_or("none".to_string(), |s| s.to_string());
                self.paint(
                    "33",
                    &format!("{t}  ---  stream ended: grpc-status {status}, {message}"),
                )
            }
        }
    }

    fn verdict(&self, t: &str, v: &VerdictRecord) -> String {
        let ty = &v.subject.short_type;
        let ms = v.latency_ms;
        let late = (v.overtaken_by.as_ref())
            .map(|n| format!(", answered after nonce {n} went out"))
            .unwrap_or_default();
        let error = one_line(v.error_message.as_deref().unwrap_or(""), false);
        match v.verdict {
            VerdictKind::Ack => self.paint(
                "32",
                &format!("{t}  {ty:4} ACK  {} ({ms:.1} ms{late})", v.version),
            ),
            VerdictKind::Nack if v.nack_scope == Some(Scope::Partial) => self.paint(
                "31;1",
                &format!(
                    "{t}  {ty:4} NACK {} ({ms:.1} ms{late}), in part: {} rejected; {} applied \
                     all the same\n             error: {error}\n             changed: {}{}",
                    v.version,
                    names(&v.rejected),
                    names(&v.applied),
                    v.changed.join(","),
                    made_from(v)
                ),
            ),
            VerdictKind::Nack => self.paint(
                "31;1",
                &format!(
                    "{t}  {ty:4} NACK {} ({ms:.1} ms{late}): {}, client stays on {}\n             \
                     error: {error}\n             suspects: {}   changed since last ACK: {}{}",
                    v.version,
                    match v.nack_scope {
                        Some(Scope::Whole) => "the whole push rejected",
                        _ => "what of it landed is not known",
                    },
                    v.client_version.as_deref().unwrap_or("?"),
                    v.suspects.join(","),
                    v.changed.join(","),
                    made_from(v)
                ),
            ),
            VerdictKind::Superseded => self.paint(
                "33",
                &format!(
                    "{t}  {ty:4} superseded {} by nonce {}, never answered",
                    v.version,
                    v.superseded_by.as_deref().unwrap_or("?")
                ),
            ),
            VerdictKind::Unanswered => self.paint(
                "33",
                &format!(
                    "{t}  {ty:4} unanswered {} (stream ended: grpc-status {:?}, {})",
                    v.version,
                    v.grpc_status,
                    v.end_message.as_deref().unwrap_or("")
                ),
            ),
        }
    }
}

/// Names for people: `a, c`, or `nothing`.
fn names(all: &[String]) -> String {
    match all.is_empty() {
        true => "nothing".into(),
        false => all.join(", "),
    }
}

/// `\n             made from: DestinationRule demo/b, Service demo/b` (the objects the rejected
/// resources were made from), or nothing when their metadata names none.
fn made_from(v: &VerdictRecord) -> String {
    let mut labels: Vec<String> = Vec::new();
    for o in &v.objects {
        let l = o.label();
        if !labels.contains(&l) {
            labels.push(l);
        }
    }
    match labels.is_empty() {
        true => String::new(),
        false => format!("\n             made from: {}", labels.join(", ")),
    }
}
