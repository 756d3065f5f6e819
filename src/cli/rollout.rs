//! `xdstap rollout [VERSION]`: per type and version, how many nodes it was pushed to and how
//! they answered, newest first; below the table, for each version not taken everywhere, the
//! NACKs grouped by message and the nodes that do not run it. Exit 1 when any node rejected a
//! version shown or never answered it.

use std::process::ExitCode;

use super::client::{block_on, AskError, AdminClient};
use super::status::{age, landed, one_line};
use super::{table, RolloutArgs};
use crate::api::tap::{Rollout, RolloutReport, RolloutsRequest};

/// `xdstap rollout`.
pub fn run(args: &RolloutArgs) -> ExitCode {
    let version = args.version.as_deref();
    if let (Some(name), Some(v)) = (args.resource.as_deref(), version) {
        return run_resource(args, name, v);
    }
    let report = match block_on(fetch(&args.admin.admin, version, &args.types)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return e.exit("rollout"),
        Err(code) => return code,
    };
    args.output.print(&report, render);
    if let (Some(v), true) = (version, report.rollouts.is_empty()) {
        eprintln!("xdstap rollout: the tap has not seen version {v:?} pushed");
        return ExitCode::from(1);
    }
    let failed = (report.rollouts.iter()).any(|r| r.nacked > 0 || r.unanswered > 0);
    ExitCode::from(u8::from(failed))
}

/// `xdstap rollout V --resource NAME`: which nodes run NAME from V, which rejected V's NAME,
/// which run it from another version.
fn run_resource(args: &RolloutArgs, name: &str, version: &str) -> ExitCode {
    let rows = match block_on(super::status::fetch_resources(&args.admin.admin, None)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return e.exit("rollout"),
        Err(code) => return code,
    };
    let text = |r: &serde_json::Value, k: &str| r[k].as_str().unwrap_or("").to_string();
    let wanted = |r: &&serde_json::Value| {
        r["name"] == name
            && (args.types.is_empty()
                || (args.types.iter())
                    .any(|t| r["type"] == t.as_str() || r["type_url"] == t.as_str()))
    };
    let mut table_rows = vec![["NODE", "TYPE", "RUNS", "STATE", "OF VERSION"]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>()];
    let (mut runs, mut rejected) = (0, 0);
    let mut found: Vec<&serde_json::Value> = rows.iter().filter(wanted).collect();
    found.sort_by_key(|r| (text(r, "version") != version, text(r, "node")));
    for r in &found {
        let state = text(r, "client");
        let of = match (
            text(r, "version") == version,
            r["rejected_version"].as_str(),
        ) {
            (true, _) => {
                runs += 1;
                "runs it".to_string()
            }
            (false, Some(v)) if v == version && state == "NACKED" => {
                rejected += 1;
                format!("rejected it: {}", one_line(&text(r, "error"), false))
            }
            _ => "another version".to_string(),
        };
        let runs_version = match text(r, "version") {
            v if v.is_empty() => "-".to_string(),
            v => v,
        };
        table_rows.push(vec![
            text(r, "node"),
            text(r, "type"),
            runs_version,
            state,
            of,
        ]);
    }
    if found.is_empty() {
        eprintln!("xdstap rollout: no node has or asks for a resource named {name:?}");
        return ExitCode::from(1);
    }
    let json = serde_json::json!({
        "resource": name, "version": version, "runs": runs, "rejected": rejected,
        "nodes": found,
    });
    match args.output {
        super::Output::Json => println!("{json:#}"),
        _ => {
            let table_rows: Vec<Vec<String>> = (table_rows.iter())
                .map(|r| {
                    r.iter()
                        .map(|c| crate::xds::printable(c).into_owned())
                        .collect()
                })
                .collect();
            print!("{}", table(&table_rows));
            println!(
                "\n{name} from {version}: run by {runs} of {} node(s), rejected by {rejected}",
                found.len()
            );
        }
    }
    ExitCode::from(u8::from(rejected > 0))
}

/// The rollout view of the tap at `admin`.
pub async fn fetch(
    admin: &str,
    version: Option<&str>,
    types: &[String],
) -> Result<RolloutReport, AskError> {
    let mut tap = AdminClient::connect(admin).await?;
    let request = RolloutsRequest {
        version: version.unwrap_or("").to_string(),
        types: types.to_vec(),
    };
    match tap.client.rollouts(request).await {
        Ok(r) => Ok(r.into_inner()),
        Err(e) => Err(tap.failed(e)),
    }
}

fn ms(v: f64) -> String {
    match v {
        v if v >= 10_000.0 => format!("{:.0}s", v / 1000.0),
        v if v >= 1000.0 => format!("{:.1}s", v / 1000.0),
        v if v >= 10.0 => format!("{v:.0}ms"),
        v => format!("{v:.1}ms"),
    }
}

/// The table, then what stands in the way of each version (everything with `wide`).
pub fn render(report: &RolloutReport, wide: bool) -> String {
    let header = [
        "TYPE",
        "VERSION",
        "PUSHED",
        "ACKED",
        "NACKED",
        "PENDING",
        "SUPERSEDED",
        "UNANSWERED",
        "P50",
        "P90",
        "MAX",
        "FIRST PUSH",
    ];
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for r in &report.rollouts {
        rows.push(vec![
            r.r#type.clone(),
            r.version.clone(),
            r.pushed.to_string(),
            r.acked.to_string(),
            r.nacked.to_string(),
            r.pending.to_string(),
            r.superseded.to_string(),
            r.unanswered.to_string(),
            ms(r.latency_p50_ms),
            ms(r.latency_p90_ms),
            ms(r.latency_max_ms),
            r.first_push.clone(),
        ]);
    }
    let mut out = table(&rows);
    if report.rollouts.is_empty() {
        out.push_str("(no versions pushed yet)\n");
    }
    for r in &report.rollouts {
        out.push_str(&details(r, wide));
    }
    out
}

/// Who rejected a version and why, and who does not run it.
pub fn details(r: &Rollout, wide: bool) -> String {
    let mut out = String::new();
    let name = format!("{} {}", r.r#type, r.version);
    for g in &r.nacks {
        let more = g.nodes.saturating_sub(g.examples.len() as u64);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        let suspects = match g.suspects.is_empty() || g.scope == "partial" {
            true => String::new(),
            false => format!(" [suspects: {}]", g.suspects.join(", ")),
        };
        let (how, landed) = match landed(&g.scope, &g.rejected, &g.applied) {
            Some(l) if g.scope == "partial" => ("partly rejected", format!(" ({l})")),
            Some(l) => ("rejected", format!(" ({l})")),
            None => ("rejected", String::new()),
        };
        out.push_str(&format!(
            "\n{name} {how} by {} node{}{landed} ({}{more}): {}{suspects}\n",
            g.nodes,
            if g.nodes == 1 { "" } else { "s" },
            g.examples.join(", "),
            one_line(&g.message, wide),
        ));
    }
    let behind: Vec<_> = (r.behind.iter())
        .filter(|n| wide || n.state != "superseded")
        .collect();
    if behind.is_empty() {
        return out;
    }
    out.push_str(&format!("\n{name}: nodes that do not run it\n"));
    let mut rows = vec![["NODE", "STATE", "RUNNING", "FOR", "WAITING FOR"]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>()];
    for n in behind {
        rows.push(vec![
            format!("  {}", n.node),
            n.state.clone(),
            n.running.clone().unwrap_or_else(|| "-".into()),
            age(n.waiting_seconds),
            match n.waiting_for.is_empty() {
                true => "-".into(),
                false => format!("endpoints of {}", n.waiting_for.join(", ")),
            },
        ]);
    }
    out.push_str(&table(&rows));
    let listed = r.behind.len() as u64;
    let not_running = r.pushed - r.acked;
    if not_running > listed {
        out.push_str(&format!("  ... and {} more\n", not_running - listed));
    }
    out
}
