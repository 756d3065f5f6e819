//! `xdstap watch`: verdicts as they happen, one line each (or one JSON object per line), until
//! interrupted, `--count` lines, or the tap goes away (exit 69).

use super::client::Exit;
use std::io::Write;
use std::process::ExitCode;

use super::client::{block_on, AdminClient};
use super::fleet::{self, Fleet};
use super::status::{landed, made_from, one_line};
use super::{Output, WatchArgs, EX_PARTIAL, EX_UNAVAILABLE};
use xdstap::api::v1::watch_event::Kind;
use xdstap::api::v1::{NackScope, WatchEvent, WatchRequest};

/// `xdstap watch`.
pub fn run(args: &WatchArgs) -> ExitCode {
    block_on(watch(args)).unwrap_or_else(|code| code)
}

/// Each tap's events as they come, interleaved, each marked with its tap; then each tap's end.
fn interleave(
    streams: Vec<(String, (AdminClient, tonic::Streaming<WatchEvent>))>,
) -> tokio::sync::mpsc::Receiver<Seen> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Seen>(256);
    for (admin, (tap, mut events)) in streams {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                let seen = match events.message().await {
                    Ok(Some(mut e)) => {
                        e.tap = admin.clone();
                        Seen::Event(Box::new(e))
                    }
                    Ok(None) => Seen::End(admin.clone(), None),
                    Err(e) => Seen::End(admin.clone(), Some(tap.failed(e).to_string())),
                };
                let end = matches!(seen, Seen::End(..));
                if tx.send(seen).await.is_err() || end {
                    return;
                }
            }
        });
    }
    rx
}

/// What a tap's watch sends on: an event, or its end (why, when it failed).
enum Seen {
    Event(Box<WatchEvent>),
    End(String, Option<String>),
}

async fn watch(args: &WatchArgs) -> ExitCode {
    let mut taps = match Fleet::resolve(&args.admin.admin).await {
        Ok(f) => f,
        Err(e) => return e.exit("watch"),
    };
    let request = WatchRequest {
        node: args.node.clone().unwrap_or_default(),
        types: args.types.clone(),
        kinds: args.verdicts.iter().map(|k| k.kind() as i32).collect(),
        recent_only: false,
    };
    let answers = (taps.ask(move |mut tap| {
        let request = request.clone();
        async move {
            match tap.client.watch(request).await {
                Ok(r) => Ok((tap, r.into_inner())),
                Err(e) => Err(tap.failed(e)),
            }
        }
    }))
    .await;
    let (streams, answered) = match fleet::split(answers) {
        Ok(s) => s,
        Err(e) => return e.exit("watch"),
    };
    let mut missing = fleet::is_partial(&answered);
    for t in &answered {
        match t.error.is_empty() {
            true => eprintln!("xdstap watch: watching the tap at {}", t.admin),
            false => eprintln!(
                "xdstap watch: not watching the tap at {}: {}",
                t.admin, t.error
            ),
        }
    }
    let marked = answered.len() > 1;
    let mut open = streams.len();
    let mut rx = interleave(streams);
    let wide = args.output == Output::Wide;
    let mut shown = 0;
    let mut out = std::io::stdout().lock();
    loop {
        if args.count.is_some_and(|n| shown >= n) {
            return ExitCode::from(if missing { EX_PARTIAL } else { 0 });
        }
        let e = match rx.recv().await {
            Some(Seen::Event(e)) => e,
            Some(Seen::End(admin, why)) => {
                open -= 1;
                missing = true;
                let why = why.unwrap_or_else(|| "it ended the watch".into());
                eprintln!("xdstap watch: the tap at {admin} is gone: {why}");
                if marked {
                    // In the output too: what follows lacks that tap's events.
                    let _ = writeln!(
                        out,
                        "({admin} is gone: events from it are missing from here on)"
                    );
                }
                if open == 0 {
                    return ExitCode::from(EX_UNAVAILABLE);
                }
                continue;
            }
            None => return ExitCode::from(EX_UNAVAILABLE),
        };
        if e.missed > 0 {
            let _ = writeln!(out, "({} events missed: reading too slowly)", e.missed);
        }
        let line = match args.output {
            Output::Json => serde_json::to_string(&e).unwrap_or_default(),
            _ => {
                let line = line(&e, wide);
                let line = match marked {
                    true => format!("[{}]  {line}", e.tap),
                    false => line,
                };
                xdstap_core::xds::printable(&line).into_owned()
            }
        };
        // A closed pipe (`| head`) ends the watch quietly.
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
            return ExitCode::SUCCESS;
        }
        shown += 1;
    }
}

/// One event on one line: time, node, type, kind, version, and what matters for the kind.
pub fn line(e: &WatchEvent, wide: bool) -> String {
    let kind = e.kind();
    let mut s = format!(
        "{}  {}  {}  {}  {}",
        e.time,
        e.node,
        e.r#type,
        kind.label().to_uppercase(),
        e.version
    );
    let add = |s: &mut String, part: String| {
        s.push_str("  ");
        s.push_str(&part);
    };
    if matches!(kind, Kind::Ack | Kind::Nack) {
        add(&mut s, format!("{:.0}ms", e.latency_ms));
    }
    let partial = e.nack_scope() == NackScope::Partial;
    if kind == Kind::Nack {
        match landed(e.nack_scope(), &e.rejected, &e.applied) {
            Some(l) if partial => add(&mut s, l),
            Some(l) => add(&mut s, format!("{l}, {}", running(&e.client_version))),
            None => add(&mut s, running(&e.client_version)),
        }
        add(&mut s, one_line(&e.error_message, wide));
        if !e.suspects.is_empty() && !partial {
            add(&mut s, format!("[suspects: {}]", e.suspects.join(", ")));
        }
        if !e.objects.is_empty() {
            add(&mut s, made_from(&e.objects).trim_start().to_string());
        }
    }
    if !e.overtaken_by.is_empty() {
        add(
            &mut s,
            format!("(answered after push {} went out)", e.overtaken_by),
        );
    }
    if !e.superseded_by.is_empty() {
        add(&mut s, format!("by push {}", e.superseded_by));
    }
    if !e.end_message.is_empty() {
        add(&mut s, e.end_message.clone());
    }
    // A NACK waits for nothing: what it names are the endpoints the push would have needed.
    match (kind, e.waiting_for.is_empty()) {
        (Kind::Warming, true) => add(&mut s, "every cluster has its endpoints".into()),
        (Kind::Nack, false) => {}
        (Kind::Ack, false) => add(
            &mut s,
            format!(
                "after the fetch timeout, without endpoints of {}",
                e.waiting_for.join(", ")
            ),
        ),
        // Warming, or a push superseded or left unanswered while its clusters waited.
        (_, false) => add(
            &mut s,
            format!("waiting for endpoints of {}", e.waiting_for.join(", ")),
        ),
        _ => {}
    }
    if kind == Kind::Resubscribe {
        add(&mut s, stated(e));
    }
    if matches!(
        kind,
        Kind::StaleAnswer | Kind::NonceReused | Kind::UnmatchedAnswer
    ) {
        add(&mut s, format!("nonce {}", e.nonce));
    }
    s
}

/// What a reconnecting client states it runs: SotW its version (on the line already), Delta
/// its resource versions.
fn stated(e: &WatchEvent) -> String {
    if e.stated_count == 0 {
        return "stating the version it runs".into();
    }
    let shown: Vec<String> = (e.stated.iter().take(3))
        .map(|s| format!("{}@{}", s.name, s.version))
        .collect();
    let more = e.stated_count as usize - shown.len();
    match more {
        0 => format!("stating {}", shown.join(", ")),
        n => format!("stating {} and {n} more", shown.join(", ")),
    }
}

/// What a client runs after a whole NACK: the version it kept, when it said or the tap knows.
fn running(version: &str) -> String {
    match version {
        "" => "running what it ran before".into(),
        v => format!("running {v}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nack_on_one_line() {
        let e = WatchEvent {
            time: "2026-12-01T10:00:00.1Z".into(),
            node: "envoy-3".into(),
            r#type: "CDS".into(),
            kind: Kind::Nack as i32,
            version: "v2".into(),
            latency_ms: 1.6,
            client_version: "v1".into(),
            error_message: "name: \"b\"\n  bad: value must be greater than 0s".into(),
            suspects: vec!["b".into()],
            ..Default::default()
        };
        assert_eq!(
            line(&e, false),
            "2026-12-01T10:00:00.1Z  envoy-3  CDS  NACK  v2  2ms  running v1  name: \"b\" bad: \
             value must be greater than 0s  [suspects: b]"
        );
        assert_eq!(serde_json::to_value(&e).unwrap()["suspects"][0], "b");
    }

    /// A NACK waits for nothing, and a client that said no version (Delta) is not said to
    /// run nothing.
    #[test]
    fn a_nack_neither_waits_nor_runs_nothing() {
        let e = WatchEvent {
            kind: Kind::Nack as i32,
            version: "v2".into(),
            error_message: "bad".into(),
            waiting_for: vec!["backend".into()],
            ..Default::default()
        };
        let l = line(&e, false);
        assert!(
            !l.contains("waiting for") && l.contains("running what it ran before"),
            "{l}"
        );
        let late = WatchEvent {
            kind: Kind::Ack as i32,
            ..e.clone()
        };
        assert!(
            line(&late, false).contains("after the fetch timeout, without endpoints of backend")
        );
        // A push replaced while its clusters waited did wait.
        let replaced = WatchEvent {
            kind: Kind::Superseded as i32,
            ..e
        };
        assert!(line(&replaced, false).contains("waiting for endpoints of backend"));
    }

    #[test]
    fn a_partial_nack_says_what_landed() {
        let e = WatchEvent {
            node: "envoy-1".into(),
            r#type: "CDS".into(),
            kind: Kind::Nack as i32,
            version: "2".into(),
            client_version: "1".into(),
            error_message: "Error adding/updating cluster(s) b: malformed IP address".into(),
            suspects: vec!["b".into()],
            nack_scope: NackScope::Partial as i32,
            rejected: vec!["b".into()],
            applied: vec!["a".into(), "c".into()],
            ..Default::default()
        };
        let l = line(&e, false);
        assert!(
            l.contains("NACK  2  0ms  b rejected; a, c applied  Error adding"),
            "{l}"
        );
        assert!(!l.contains("running"), "{l}");
        assert_eq!(serde_json::to_value(&e).unwrap()["nack_scope"], "PARTIAL");
    }
}
