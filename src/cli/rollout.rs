//! `xdstap rollout [VERSION]`: per type and version, how many nodes it was pushed to and how
//! they answered, newest first; below the table, for each version not taken everywhere, the
//! NACKs grouped by message and the nodes that do not run it. Exit 1 when any node rejected a
//! version shown or never answered it.

use super::client::Exit;
use std::process::ExitCode;

use super::client::{block_on, AskError};
use super::fleet::{self, Fleet};
use super::status::{age, dash, landed, made_from, one_line, NodeResource};
use super::{table, RolloutArgs};
use xdstap::api::v1::resource_status::ClientStatus;
use xdstap::api::v1::rollout_node::Standing;
use xdstap::api::v1::NackScope;
use xdstap::api::v1::{Rollout, RolloutReport, RolloutsRequest};
use xdstap_core::xds::is_type_named;

/// `xdstap rollout`.
pub fn run(args: &RolloutArgs) -> ExitCode {
    if let Some(object) = &args.object {
        return super::objects::run_rollout(args, object);
    }
    block_on(rollout(args)).unwrap_or_else(|code| code)
}

async fn rollout(args: &RolloutArgs) -> ExitCode {
    let mut taps = match Fleet::resolve(&args.admin.admin).await {
        Ok(f) => f,
        Err(e) => return e.exit("rollout"),
    };
    let version = args.version.as_deref();
    if let (Some(name), Some(v)) = (args.resource.as_deref(), version) {
        return run_resource(&mut taps, args, name, v).await;
    }
    let report = match fetch(&mut taps, version, &args.types).await {
        Ok(r) => r,
        Err(e) => return e.exit("rollout"),
    };
    let partial = fleet::warn_partial("rollout", &report.taps);
    if let (Some(v), true) = (version, report.rollouts.is_empty()) {
        let kept = match fetch(&mut taps, None, &args.types).await {
            Ok(all) => versions(&all),
            Err(_) => String::new(),
        };
        eprintln!("xdstap rollout: no tap that answered has seen version {v:?} pushed{kept}");
        print!("{}", fleet::missing_lines(&report.taps));
        return fleet::not_found(1, partial);
    }
    args.output.print(&report, render);
    fleet::exit(is_failing(&report), partial)
}

/// `; versions kept: CDS v3, v2; LDS v1` (nothing when none are).
fn versions(report: &RolloutReport) -> String {
    let mut by_type: Vec<(&str, Vec<&str>)> = Vec::new();
    for r in &report.rollouts {
        match by_type.iter_mut().find(|(t, _)| *t == r.r#type) {
            Some((_, vs)) => vs.push(&r.version),
            None => by_type.push((&r.r#type, vec![&r.version])),
        }
    }
    if by_type.is_empty() {
        return "; it has seen no version pushed".into();
    }
    let each: Vec<String> = (by_type.iter())
        .map(|(t, vs)| format!("{t} {}", vs.join(", ")))
        .collect();
    format!("; versions it keeps, newest first: {}", each.join("; "))
}

/// Whether some node rejected or never answered a version shown and has not accepted a newer
/// one since: what is wrong now, not what once was.
pub fn is_failing(report: &RolloutReport) -> bool {
    (report.rollouts.iter()).any(|r| r.nacked + r.unanswered > r.moved_on)
}

/// `xdstap rollout V --resource NAME`: which nodes run NAME from V, which rejected V's NAME,
/// which run it from another version.
async fn run_resource(taps: &mut Fleet, args: &RolloutArgs, name: &str, version: &str) -> ExitCode {
    let (rows, answered) = match super::status::fetch_resources(taps, None).await {
        Ok(r) => r,
        Err(e) => return e.exit("rollout"),
    };
    let partial = fleet::warn_partial("rollout", &answered);
    let wanted =
        |r: &&NodeResource| r.status.name == name && is_type_named(&args.types, &r.status.type_url);
    let mut table_rows = vec![["NODE", "TYPE", "RUNS", "STATE", "OF VERSION"]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>()];
    let (mut runs, mut rejected) = (0, 0);
    let mut found: Vec<&NodeResource> = rows.iter().filter(wanted).collect();
    found.sort_by_key(|r| (r.status.version != version, r.node.clone()));
    for NodeResource {
        node, status: r, ..
    } in &found
    {
        let nacked = r.client() == ClientStatus::Nacked;
        let of = match (r.version == version, r.rejected_version.as_deref()) {
            (true, _) => {
                runs += 1;
                "runs it".to_string()
            }
            (false, Some(v)) if v == version && nacked => {
                rejected += 1;
                let error = r.error.as_deref().unwrap_or("");
                format!("rejected it: {}", one_line(error, false))
            }
            _ => "another version".to_string(),
        };
        table_rows.push(vec![
            node.clone(),
            r.r#type.clone(),
            dash(&r.version),
            r.client().as_str_name().to_string(),
            of,
        ]);
    }
    if found.is_empty() {
        eprintln!("xdstap rollout: no node has or asks for a resource named {name:?}");
        print!("{}", fleet::missing_lines(&answered));
        return fleet::not_found(1, partial);
    }
    let json = serde_json::json!({
        "resource": name, "version": version, "runs": runs, "rejected": rejected,
        "nodes": found, "taps": answered,
    });
    match args.output {
        super::Output::Json => println!("{json:#}"),
        _ => {
            let table_rows: Vec<Vec<String>> = (table_rows.iter())
                .map(|r| {
                    r.iter()
                        .map(|c| xdstap_core::xds::printable(c).into_owned())
                        .collect()
                })
                .collect();
            print!("{}", table(&table_rows));
            println!(
                "\n{name} from {version}: run by {runs} of {} node(s), rejected by {rejected}",
                found.len()
            );
            print!("{}", fleet::missing_lines(&answered));
        }
    }
    fleet::exit(rejected > 0, partial)
}

/// The rollout view of every tap, as one (with every tap asked, and whether it answered).
pub async fn fetch(
    taps: &mut Fleet,
    version: Option<&str>,
    types: &[String],
) -> Result<RolloutReport, AskError> {
    let request = RolloutsRequest {
        version: version.unwrap_or("").to_string(),
        types: types.to_vec(),
        // Several taps' views merge node by node.
        every_node: taps.count() > 1,
    };
    let answers = (taps.ask(move |mut tap| {
        let request = request.clone();
        async move {
            match tap.client.rollouts(request).await {
                Ok(r) => Ok(r.into_inner()),
                Err(e) => Err(tap.failed(e)),
            }
        }
    }))
    .await;
    let (mut answers, answered) = fleet::split(answers)?;
    Ok(match answered.len() {
        1 => RolloutReport {
            taps: answered,
            ..answers.remove(0).1
        },
        _ => fleet::rollouts(answers, answered),
    })
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
    out.push_str(&fleet::missing_lines(&report.taps));
    out
}

/// Per object behind the NACKs of a version: `DestinationRule default/r: rejected by 37
/// nodes`, and the command that shows it; the object that generated the resource, not
/// necessarily the one at fault.
fn by_object(r: &Rollout) -> String {
    let mut objects: Vec<(String, String, u64)> = Vec::new();
    for g in &r.nacks {
        let mut seen: Vec<String> = Vec::new();
        for o in &g.objects {
            let label = o.label();
            if seen.contains(&label) {
                continue;
            }
            seen.push(label.clone());
            match objects.iter_mut().find(|(l, ..)| *l == label) {
                Some(e) => e.2 += g.nodes,
                None => objects.push((label, o.command().to_string(), g.nodes)),
            }
        }
    }
    objects.sort_by_key(|o| std::cmp::Reverse(o.2));
    let mut out = String::new();
    for (label, kubectl, nodes) in objects {
        let s = if nodes == 1 { "" } else { "s" };
        out.push_str(&format!(
            "  {label}: rejected by {nodes} node{s} ({kubectl})\n"
        ));
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
        let partial = g.scope() == NackScope::Partial;
        let suspects = match g.suspects.is_empty() || partial {
            true => String::new(),
            false => format!(" [suspects: {}]", g.suspects.join(", ")),
        };
        let (how, landed) = match landed(g.scope(), &g.rejected, &g.applied) {
            Some(l) if partial => ("partly rejected", format!(" ({l})")),
            Some(l) => ("rejected", format!(" ({l})")),
            None => ("rejected", String::new()),
        };
        out.push_str(&format!(
            "\n{name} {how} by {} node{}{landed} ({}{more}): {}{suspects}{}\n",
            g.nodes,
            if g.nodes == 1 { "" } else { "s" },
            g.examples.join(", "),
            one_line(&g.message, wide),
            made_from(&g.objects),
        ));
    }
    out.push_str(&by_object(r));
    let behind: Vec<_> = (r.behind.iter())
        .filter(|n| wide || n.state() != Standing::Superseded)
        .collect();
    if behind.is_empty() {
        return out;
    }
    let moved_on = match r.moved_on {
        0 => String::new(),
        n => format!(" ({n} of them rejected or missed it and took a newer version since)"),
    };
    out.push_str(&format!("\n{name}: nodes that do not run it{moved_on}\n"));
    let fan_in = behind.iter().any(|n| !n.tap.is_empty());
    let mut header = vec!["NODE", "STATE", "RUNNING", "FOR", "WAITING FOR"];
    if fan_in {
        header.push("TAP");
    }
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for n in behind {
        let mut row = vec![
            format!("  {}", n.node),
            n.state().label().to_string(),
            n.running.clone().unwrap_or_else(|| "-".into()),
            age(n.waiting_seconds),
            match n.waiting_for.is_empty() {
                true => "-".into(),
                false => format!("endpoints of {}", n.waiting_for.join(", ")),
            },
        ];
        if fan_in {
            row.push(n.tap.clone());
        }
        rows.push(row);
    }
    out.push_str(&table(&rows));
    let listed = r.behind.len() as u64;
    let not_running = r.pushed - r.acked;
    if not_running > listed {
        out.push_str(&format!("  ... and {} more\n", not_running - listed));
    }
    out
}
