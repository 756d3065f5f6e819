//! `xdstap status`: reads a running tap's `/status` and prints a table like
//! `istioctl proxy-status`, a column per type, with the reason for every NACKED or STALE type
//! below it. The exit status serves scripts: 0 all fine, 1 some node NACKED or STALE, 69 the tap
//! could not be asked.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use super::{Output, StatusArgs, EX_UNAVAILABLE, EX_USAGE};
use crate::observe::board::{worst, NodeStatus, StatusReport, SyncState, TypeStatus};
use crate::proxy::Endpoint;

/// `xdstap status`: fetch, print, and say by the exit status whether anything needs attention.
pub fn run(args: &StatusArgs) -> ExitCode {
    match fetch(&args.admin, args.node.as_deref()) {
        Ok(report) => {
            match args.output {
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&report).unwrap_or_default()
                ),
                Output::Table => print!("{}", render(&report, false)),
                Output::Wide => print!("{}", render(&report, true)),
            }
            ExitCode::from(u8::from(has_problems(&report)))
        }
        Err(e @ FetchError::Address(..)) => {
            eprintln!("error: {e}");
            ExitCode::from(EX_USAGE)
        }
        Err(e) => {
            eprintln!("xdstap status: {e}");
            ExitCode::from(EX_UNAVAILABLE)
        }
    }
}

/// Why the status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Bad `--admin`.
    #[error("invalid --admin {0:?}: {1}")]
    Address(String, String),
    /// Connect, write or read failed.
    #[error("cannot reach the tap's admin server at {0}: {1}")]
    Io(String, std::io::Error),
    /// Not an HTTP answer we understand.
    #[error("unexpected answer from {0}: {1}")]
    Protocol(String, String),
    /// The node asked for is not known to the tap.
    #[error("node {0:?} is not known to the tap at {1}")]
    NoSuchNode(String, String),
}

/// A query value: everything but RFC 3986's unreserved characters percent-encoded.
fn query_value(s: &str) -> String {
    const VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, VALUE).to_string()
}

/// GETs `/status` (optionally for one node) from `admin`.
pub fn fetch(admin: &str, node: Option<&str>) -> Result<StatusReport, FetchError> {
    let endpoint: Endpoint = admin
        .parse()
        .map_err(|e: String| FetchError::Address(admin.into(), e))?;
    let path = match node {
        Some(n) => format!("/status?node={}", query_value(n)),
        None => "/status".into(),
    };
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: xdstap\r\nConnection: close\r\nAccept: application/json\r\n\r\n");
    let io = |e| FetchError::Io(admin.into(), e);
    let mut raw = Vec::new();
    match &endpoint {
        Endpoint::Tcp(a) => {
            use std::net::ToSocketAddrs;
            let addr = a
                .to_socket_addrs()
                .map_err(io)?
                .next()
                .ok_or_else(|| FetchError::Address(admin.into(), "no address".into()))?;
            let mut s =
                std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(io)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .map_err(io)?;
            s.write_all(request.as_bytes()).map_err(io)?;
            s.read_to_end(&mut raw).map_err(io)?;
        }
        Endpoint::Unix(p) => {
            let mut s = std::os::unix::net::UnixStream::connect(p).map_err(io)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .map_err(io)?;
            s.write_all(request.as_bytes()).map_err(io)?;
            s.read_to_end(&mut raw).map_err(io)?;
        }
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| FetchError::Protocol(admin.into(), "no HTTP header".into()))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| FetchError::Protocol(admin.into(), "no HTTP status".into()))?;
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    match code {
        200 => serde_json::from_slice(&body)
            .map_err(|e| FetchError::Protocol(admin.into(), format!("not a status report: {e}"))),
        404 if node.is_some() => Err(FetchError::NoSuchNode(
            node.unwrap_or_default().into(),
            admin.into(),
        )),
        other => Err(FetchError::Protocol(
            admin.into(),
            format!("HTTP {other}: {}", String::from_utf8_lossy(&body).trim()),
        )),
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..eol])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

const COLUMNS: [&str; 5] = ["CDS", "LDS", "EDS", "RDS", "SDS"];

fn cell(t: Option<&TypeStatus>, wide: bool) -> String {
    let Some(t) = t else {
        return "-".into();
    };
    let label = t.state.label().to_string();
    if !wide {
        return label;
    }
    let accepted = t.version_accepted.as_deref().unwrap_or("-");
    match (t.state, t.version_sent.as_deref()) {
        (SyncState::Synced, _) => format!("{label} {accepted}"),
        (_, Some(sent)) => format!("{label} {sent} (on {accepted})"),
        (_, None) => label,
    }
}

fn others(n: &NodeStatus, wide: bool) -> String {
    let rest: Vec<&TypeStatus> = n
        .types
        .iter()
        .filter(|t| !COLUMNS.contains(&t.short_type.as_str()))
        .collect();
    if rest.is_empty() {
        return "-".into();
    }
    let state = worst(rest.iter().map(|t| t.state));
    if wide {
        let names: Vec<&str> = rest.iter().map(|t| t.short_type.as_str()).collect();
        format!("{} ({})", state.label(), names.join(","))
    } else {
        format!("{} ({})", state.label(), rest.len())
    }
}

/// A NACK message on one line. Envoy's often carries a multi-line dump of the rejected resource
/// before the reason, so a long one keeps its head and its tail (the reason) unless `full`.
pub fn one_line(message: &str, full: bool) -> String {
    let flat = message.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars: Vec<char> = flat.chars().collect();
    if full || chars.len() <= 300 {
        return flat;
    }
    let head: String = chars[..80].iter().collect();
    let tail: String = chars[chars.len() - 200..].iter().collect();
    format!("{head} ... {tail}")
}

/// The table, then one line per NACKED or STALE type saying why (whole messages with `wide`).
pub fn render(report: &StatusReport, wide: bool) -> String {
    let mut header = vec!["NODE", "CLUSTER"];
    header.extend(COLUMNS);
    header.extend(["OTHER", "CONNECTED"]);
    if wide {
        header.push("USER AGENT");
    }
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for n in &report.nodes {
        let mut row = vec![n.id.clone(), n.cluster.clone()];
        for c in COLUMNS {
            row.push(cell(n.types.iter().find(|t| t.short_type == c), wide));
        }
        row.push(others(n, wide));
        row.push(if n.connected {
            "yes".into()
        } else {
            format!("no (since {})", n.disconnected_at.as_deref().unwrap_or("?"))
        });
        if wide {
            row.push(n.user_agent.clone());
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    if report.nodes.is_empty() {
        out.push_str("(no xDS clients seen yet)\n");
    }
    let mut reasons = Vec::new();
    for n in &report.nodes {
        for t in &n.types {
            match t.state {
                SyncState::Nacked => {
                    let Some(nack) = &t.nack else { continue };
                    let suspects = if nack.suspects.is_empty() {
                        String::new()
                    } else {
                        format!(" [suspects: {}]", nack.suspects.join(", "))
                    };
                    reasons.push(format!(
                        "{} {} NACKED since {}: rejected {}, running {}: {}{}",
                        n.id,
                        t.short_type,
                        nack.since,
                        nack.version,
                        t.version_accepted.as_deref().unwrap_or("nothing"),
                        one_line(&nack.message, wide),
                        suspects
                    ));
                }
                SyncState::Stale => reasons.push(format!(
                    "{} {} STALE: push {} (nonce {}) unanswered since {} (threshold {}s)",
                    n.id,
                    t.short_type,
                    t.version_sent.as_deref().unwrap_or("?"),
                    t.nonce.as_deref().unwrap_or("?"),
                    t.pending_since.as_deref().unwrap_or("?"),
                    report.stale_after_seconds
                )),
                _ => {}
            }
            if t.nonce_reuses > 0 {
                reasons.push(format!(
                    "{} {}: the control plane reused a nonce {} time(s); answers were paired with \
                     pushes in order",
                    n.id, t.short_type, t.nonce_reuses
                ));
            }
        }
    }
    if !reasons.is_empty() {
        out.push('\n');
        for r in reasons {
            out.push_str(&r);
            out.push('\n');
        }
    }
    out
}

/// Whether any node needs attention (the exit status).
pub fn has_problems(report: &StatusReport) -> bool {
    report
        .nodes
        .iter()
        .any(|n| n.types.iter().any(|t| t.state.is_problem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_keep_their_reason() {
        let dump = format!(
            "name: \"b\"\n{}: Proto constraint validation failed (x)",
            "  field {\n  }\n".repeat(40)
        );
        let short = one_line(&dump, false);
        assert!(short.len() < 300 && !short.contains('\n'), "{short}");
        assert!(short.starts_with("name: \"b\"") && short.ends_with("validation failed (x)"));
        assert_eq!(one_line("a\n  b", false), "a b");
        assert!(one_line(&dump, true).len() > 300);
    }
}
