//! `xdstap watch`: verdicts as they happen, one line each (or one JSON object per line), until
//! interrupted, `--count` lines, or the tap goes away (exit 69).

use std::io::Write;
use std::process::ExitCode;

use super::client::{block_on, AdminClient};
use super::status::{landed, one_line};
use super::{Output, WatchArgs, EX_UNAVAILABLE};
use crate::api::tap::{WatchEvent, WatchRequest};

/// `xdstap watch`.
pub fn run(args: &WatchArgs) -> ExitCode {
    match block_on(watch(args)) {
        Ok(code) => code,
        Err(code) => code,
    }
}

async fn watch(args: &WatchArgs) -> ExitCode {
    let mut tap = match AdminClient::connect(&args.admin.admin).await {
        Ok(t) => t,
        Err(e) => return e.exit("watch"),
    };
    let request = WatchRequest {
        node: args.node.clone().unwrap_or_default(),
        types: args.types.clone(),
        kinds: args.verdicts.iter().map(|k| k.name().to_string()).collect(),
    };
    let mut events = match tap.client.watch(request).await {
        Ok(r) => r.into_inner(),
        Err(e) => return tap.failed(e).exit("watch"),
    };
    eprintln!("xdstap watch: watching the tap at {}", tap.admin);
    let wide = args.output == Output::Wide;
    let mut shown = 0;
    let mut out = std::io::stdout().lock();
    loop {
        if args.count.is_some_and(|n| shown >= n) {
            return ExitCode::SUCCESS;
        }
        let e = match events.message().await {
            Ok(Some(e)) => e,
            Ok(None) => {
                eprintln!("xdstap watch: the tap at {} ended the watch", tap.admin);
                return ExitCode::from(EX_UNAVAILABLE);
            }
            Err(e) => return tap.failed(e).exit("watch"),
        };
        if e.missed > 0 {
            let _ = writeln!(out, "({} events missed: reading too slowly)", e.missed);
        }
        let line = match args.output {
            Output::Json => serde_json::to_string(&e).unwrap_or_default(),
            _ => crate::xds::printable(&line(&e, wide)).into_owned(),
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
    let mut s = format!(
        "{}  {}  {}  {}  {}",
        e.time,
        e.node,
        e.r#type,
        e.kind.to_uppercase(),
        e.version
    );
    let add = |s: &mut String, part: String| {
        s.push_str("  ");
        s.push_str(&part);
    };
    if matches!(e.kind.as_str(), "ack" | "nack") {
        add(&mut s, format!("{:.0}ms", e.latency_ms));
    }
    if e.kind == "nack" {
        match landed(&e.nack_scope, &e.rejected, &e.applied) {
            Some(l) if e.nack_scope == "partial" => add(&mut s, l),
            Some(l) => add(
                &mut s,
                format!("{l}, running {}", or_nothing(&e.client_version)),
            ),
            None => add(&mut s, format!("running {}", or_nothing(&e.client_version))),
        }
        add(&mut s, one_line(&e.error_message, wide));
        if !e.suspects.is_empty() && e.nack_scope != "partial" {
            add(&mut s, format!("[suspects: {}]", e.suspects.join(", ")));
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
    match (e.kind.as_str(), e.waiting_for.is_empty()) {
        ("warming", true) => add(&mut s, "every cluster has its endpoints".into()),
        (_, false) => add(
            &mut s,
            format!("waiting for endpoints of {}", e.waiting_for.join(", ")),
        ),
        _ => {}
    }
    if matches!(
        e.kind.as_str(),
        "stale-answer" | "nonce-reused" | "unmatched-answer"
    ) {
        add(&mut s, format!("nonce {}", e.nonce));
    }
    s
}

fn or_nothing(v: &str) -> &str {
    if v.is_empty() {
        "nothing"
    } else {
        v
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
            kind: "nack".into(),
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

    #[test]
    fn a_partial_nack_says_what_landed() {
        let e = WatchEvent {
            node: "envoy-1".into(),
            r#type: "CDS".into(),
            kind: "nack".into(),
            version: "2".into(),
            client_version: "1".into(),
            error_message: "Error adding/updating cluster(s) b: malformed IP address".into(),
            suspects: vec!["b".into()],
            nack_scope: "partial".into(),
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
        assert_eq!(serde_json::to_value(&e).unwrap()["nack_scope"], "partial");
    }
}
