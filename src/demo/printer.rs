//! The demo's timeline: one line per event, as the tap's own events tell it (or one JSON
//! object per event with `--json`).

use crate::cli::status::one_line;
use crate::correlate::{Event, Scope, Verdict};
use crate::xds::short_type;

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
    pub fn events(&mut self, events: &[Event]) {
        for e in &events[self.seen..] {
            if self.json {
                println!("{}", serde_json::to_string(e).unwrap_or_default());
            } else {
                println!("{}", self.line(e));
            }
        }
        self.seen = events.len();
    }

    /// One event on one line (a NACK on three).
    fn line(&self, e: &Event) -> String {
        let context = e.context();
        let t = format!("+{:7.3}s", context.time.saturating_sub(self.start) as f64 / 1e9);
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
            Event::Verdict { .. } => self.verdict(&t, ty, e),
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

    fn verdict(&self, t: &str, ty: &str, e: &Event) -> String {
        let Event::Verdict {
            push,
            verdict,
            decided_at,
            client_version,
            overtaken_by,
            ..
        } = e
        else {
            return String::new();
        };
        let ms = decided_at.saturating_sub(push.at) as f64 / 1e6;
        let late = overtaken_by
            .as_ref()
            .map(|n| format!(", answered after nonce {n} went out"))
            .unwrap_or_default();
        match verdict {
            Verdict::Ack => self.paint(
                "32",
                &format!("{t}  {ty:4} ACK  {} ({ms:.1} ms{late})", push.version),
            ),
            Verdict::Nack {
                error,
                changed,
                scope: Scope::Partial,
                rejected,
                applied,
                ..
            } => self.paint(
                "31;1",
                &format!(
                    "{t}  {ty:4} NACK {} ({ms:.1} ms{late}), in part: {} rejected; {} applied \
                     all the same\n             error: {}\n             changed: {}",
                    push.version,
                    names(rejected.iter().map(|r| r.name.as_str())),
                    names(applied.iter().map(String::as_str)),
                    one_line(&error.message, false),
                    changed.join(",")
                ),
            ),
            Verdict::Nack {
                error,
                suspects,
                changed,
                scope,
                ..
            } => self.paint(
                "31;1",
                &format!(
                    "{t}  {ty:4} NACK {} ({ms:.1} ms{late}): {}, client stays on {}\n             \
                     error: {}\n             suspects: {}   changed since last ACK: {}",
                    push.version,
                    match scope {
                        Scope::Whole => "the whole push rejected",
                        _ => "what of it landed is not known",
                    },
                    client_version.as_deref().unwrap_or("?"),
                    one_line(&error.message, false),
                    suspects.join(","),
                    changed.join(",")
                ),
            ),
            Verdict::Superseded { by_nonce } => self.paint(
                "33",
                &format!(
                    "{t}  {ty:4} superseded {} by nonce {by_nonce}, never answered",
                    push.version
                ),
            ),
            Verdict::Unanswered {
                grpc_status,
                message,
            } => self.paint(
                "33",
                &format!(
                    "{t}  {ty:4} unanswered {} (stream ended: grpc-status {grpc_status:?}, {message})",
                    push.version
                ),
            ),
        }
    }
}

/// Names for people: `a, c`, or `nothing`.
fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let all: Vec<&str> = names.collect();
    match all.is_empty() {
        true => "nothing".into(),
        false => all.join(", "),
    }
}
