//! The demo's timeline: one line per event, as the tap's own events tell it (or one JSON
//! object per event with `--json`).

use crate::cli::status::one_line;
use crate::correlate::{Event, Verdict};
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
                continue;
            }
            let at = e.context();
            let t = format!("+{:7.3}s", at.time.saturating_sub(self.start) as f64 / 1e9);
            let ty = short_type(&at.type_url);
            let line = match e {
                Event::Subscribe { .. } => format!("{t}  {ty:4} subscribe"),
                Event::Resubscribe { version, .. } => format!("{t}  {ty:4} resubscribe after reconnect, client has {version}"),
                Event::SubscriptionChange { names, .. } => format!("{t}  {ty:4} subscription change: {}", names.join(",")),
                Event::Push { push, .. } => format!(
                    "{t}  {ty:4} push {} ({} resource{}: {}) nonce {}",
                    push.version,
                    push.resources.len(),
                    if push.resources.len() == 1 { "" } else { "s" },
                    push.resources.iter().map(|r| r.name).collect::<Vec<_>>().join(","),
                    push.nonce
                ),
                Event::Verdict { push, verdict, decided_at, client_version, .. } => {
                    let ms = decided_at.saturating_sub(push.at) as f64 / 1e6;
                    match verdict {
                        Verdict::Ack => self.paint("32", &format!("{t}  {ty:4} ACK  {} ({ms:.1} ms)", push.version)),
                        Verdict::Nack { error, suspects, changed } => self.paint(
                            "31;1",
                            &format!(
                                "{t}  {ty:4} NACK {} ({ms:.1} ms): client stays on {}\n             error: {}\n             suspects: {}   changed since last ACK: {}",
                                push.version,
                                client_version.as_deref().unwrap_or("?"),
                                one_line(&error.message, false),
                                suspects.join(","),
                                changed.join(",")
                            ),
                        ),
                        Verdict::Superseded { by_nonce } => self.paint("33", &format!("{t}  {ty:4} superseded {} by nonce {by_nonce}", push.version)),
                        Verdict::Unanswered { grpc_status, message } => self.paint(
                            "33",
                            &format!("{t}  {ty:4} unanswered {} (stream ended: grpc-status {grpc_status:?}, {message})", push.version),
                        ),
                    }
                }
                Event::StaleAnswer { nonce, pending_nonce, .. } => {
                    self.paint("33", &format!("{t}  {ty:4} stale answer to nonce {nonce} while {pending_nonce} is pending (not an ACK of it)"))
                }
                Event::StreamEnd { grpc_status, message, .. } => self.paint(
                    "33",
                    &format!("{t}  ---  stream ended: grpc-status {}, {message}", grpc_status.map_or("none".to_string(), |s| s.to_string())),
                ),
            };
            println!("{line}");
        }
        self.seen = events.len();
    }
}
