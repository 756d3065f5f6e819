//! From a Kubernetes object to every proxy: `xdstap rollout --object KIND/NS/NAME` (the
//! resources made from it, and per node whether it runs what was pushed for them) and `xdstap
//! wait --object` ("I applied this DestinationRule: has every proxy taken it?"). Both ask every
//! tap's object view and merge it, each node once.
//!
//! `wait --object` exits:
//! - 0 once every node that receives a resource made from each object runs what was pushed
//!   for it (since `--since`, or content some node was pushed since): taken. Nodes that receive
//!   nothing made from it (a Sidecar's scope) and disconnected nodes are not waited for, and
//!   said;
//! - 1 the moment a node rejects such a resource, naming the node, the resource and the
//!   client's words (a NACK of another object's resource in the same push is not this one's);
//! - 2 at the timeout, naming who was not pushed since and who has not answered;
//! - 4 when only taps that did not answer stand in the way.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::client::{block_on, AskError, Exit};
use super::fleet::{self, Fleet};
use super::wait::Outcome;
use super::{table, RolloutArgs, WaitArgs, EX_PARTIAL};
use xdstap::api::v1::object_node::Standing;
use xdstap::api::v1::{ObjectNode, ObjectReport, ObjectStatus, ObjectsRequest};

/// How often `wait` asks the taps.
const POLL: Duration = Duration::from_millis(100);

/// Every tap's view of `objects` (or of every object), merged.
pub async fn fetch(
    taps: &mut Fleet,
    objects: &[xdstap::ObjectSpec],
    since: Option<String>,
) -> Result<ObjectReport, AskError> {
    let request = ObjectsRequest {
        objects: objects.iter().map(|o| o.to_string()).collect(),
        since: since.unwrap_or_default(),
    };
    let answers = (taps.ask(move |mut tap| {
        let request = request.clone();
        async move {
            match tap.client.objects(request).await {
                Ok(r) => Ok(r.into_inner()),
                Err(e) => Err(tap.failed(e)),
            }
        }
    }))
    .await;
    let (answers, answered) = fleet::split(answers)?;
    Ok(xdstap::fanin::objects(answers, answered))
}

/// The verdict on one object: accepted once taken by every node it reaches (and one at least).
pub fn outcome(o: &ObjectStatus) -> Outcome {
    if o.rejected > 0 {
        return Outcome::Rejected;
    }
    match o.taken > 0 && o.pending == 0 && o.not_pushed == 0 {
        true => Outcome::Accepted,
        false => Outcome::Waiting,
    }
}

/// `xdstap rollout --object`.
pub fn run_rollout(args: &RolloutArgs, object: &xdstap::ObjectSpec) -> ExitCode {
    block_on(rollout(args, object)).unwrap_or_else(|code| code)
}

async fn rollout(args: &RolloutArgs, object: &xdstap::ObjectSpec) -> ExitCode {
    let mut taps = match Fleet::resolve(&args.admin.admin).await {
        Ok(f) => f,
        Err(e) => return e.exit("rollout"),
    };
    let since = args.since.map(|s| s.rfc3339(xdstap::now()));
    let report = match fetch(&mut taps, std::slice::from_ref(object), since).await {
        Ok(r) => r,
        Err(e) => return e.exit("rollout"),
    };
    let partial = fleet::warn_partial("rollout", &report.taps);
    args.output.print(&report, |report, wide| {
        let mut out: String = report.objects.iter().map(|s| render(s, wide)).collect();
        out.push_str(&fleet::missing_lines(&report.taps));
        out
    });
    let rejected = report.objects.iter().any(|o| o.rejected > 0);
    fleet::exit(rejected, partial)
}

/// The object's name as lines show it.
fn name(o: &ObjectStatus) -> String {
    match &o.object {
        Some(object) => object.label(),
        None => o.asked.clone(),
    }
}

/// One object: what it is, what was made from it, how many nodes stand where, then a line per
/// node and resource.
pub fn render(o: &ObjectStatus, wide: bool) -> String {
    let mut out = format!("{}: {}\n", name(o), counts(o));
    if let Some(object) = &o.object {
        out.push_str(&format!("  {}\n", object.command()));
    }
    if o.resource_count > 0 {
        let shown: Vec<String> = (o.resources.iter())
            .map(|r| format!("{} {}", r.r#type, &r.name))
            .collect();
        let more = o.resource_count.saturating_sub(shown.len() as u64);
        out.push_str(&format!(
            "  made from it: {}{}\n",
            shown.join(", "),
            match more {
                0 => String::new(),
                n => format!(" and {n} more"),
            }
        ));
    }
    for p in o.pushes.iter().take(if wide { usize::MAX } else { 3 }) {
        out.push_str(&format!(
            "  pushed: {} {} at {} ({} node{})\n",
            p.r#type,
            &p.version,
            p.at,
            p.nodes,
            if p.nodes == 1 { "" } else { "s" }
        ));
    }
    if o.node_states.is_empty() {
        return out;
    }
    let mut rows = vec![["NODE", "STATE", "RESOURCE", "RUNS", "PUSHED", "ERROR"]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>()];
    for n in &o.node_states {
        for r in &n.resources {
            let content = |v: &str, d: &str| match d.is_empty() {
                true => "-".to_string(),
                false => format!("{v} {}", d.chars().take(8).collect::<String>()),
            };
            rows.push(vec![
                n.node.clone(),
                label(n.state()).to_string(),
                format!("{} {}", r.r#type, &r.name),
                content(&r.version, &r.digest),
                content(&r.pushed_version, &r.pushed_digest),
                match &r.error {
                    Some(e) => super::status::one_line(e, wide),
                    None => "-".into(),
                },
            ]);
        }
    }
    out.push_str(&table(&rows));
    out
}

/// `taken by 2 of 3 nodes (1 rejected); 1 connected node receives nothing made from it`.
pub fn counts(o: &ObjectStatus) -> String {
    if o.nodes == 0 {
        return "no node receives anything made from it".into();
    }
    let mut parts = Vec::new();
    for (n, what) in [
        (o.rejected, "rejected"),
        (o.pending, "pending"),
        (o.not_pushed, "not pushed since"),
        (o.disconnected, "disconnected (not waited for)"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    let mut s = format!(
        "taken by {} of {} node{}",
        o.taken,
        o.nodes,
        if o.nodes == 1 { "" } else { "s" }
    );
    if !parts.is_empty() {
        s.push_str(&format!(" ({})", parts.join(", ")));
    }
    if o.out_of_scope > 0 {
        s.push_str(&format!(
            "; {} connected node{} receive{} nothing made from it (not waited for)",
            o.out_of_scope,
            if o.out_of_scope == 1 { "" } else { "s" },
            if o.out_of_scope == 1 { "s" } else { "" },
        ));
    }
    s
}

fn label(s: Standing) -> &'static str {
    match s {
        Standing::Taken => "TAKEN",
        Standing::Pending => "PENDING",
        Standing::Rejected => "REJECTED",
        Standing::NotPushed => "NOT PUSHED",
        Standing::Disconnected => "DISCONNECTED",
        Standing::Unspecified => "?",
    }
}

/// `xdstap wait --object`: until every object is taken, one is rejected, or the timeout.
pub async fn wait(args: &WaitArgs, taps: &mut Fleet, started: Instant) -> ExitCode {
    let deadline = started + args.timeout.0;
    let since = args.since.map(|s| s.rfc3339(xdstap::now()));
    loop {
        let report = match fetch(taps, &args.object, since.clone()).await {
            // Every string from the taps printable: no control character reaches the terminal.
            Ok(r) => super::printable_copy(&r),
            Err(e) => return e.exit("wait"),
        };
        let partial = fleet::is_partial(&report.taps);
        let outcomes: Vec<Outcome> = report.objects.iter().map(outcome).collect();
        if outcomes.contains(&Outcome::Rejected) {
            for o in report.objects.iter().filter(|o| o.rejected > 0) {
                eprintln!("xdstap wait: {} was rejected", name(o));
                for n in nodes(o, Standing::Rejected) {
                    for r in n
                        .resources
                        .iter()
                        .filter(|r| r.state() == Standing::Rejected)
                    {
                        println!(
                            "{} rejected {} {} (pushed {} at {}): {}",
                            &n.node,
                            r.r#type,
                            &r.name,
                            &r.pushed_version,
                            r.pushed_at,
                            super::status::one_line(r.error.as_deref().unwrap_or(""), true)
                        );
                    }
                }
            }
            summarize(&report, since.as_deref());
            return ExitCode::from(1);
        }
        let all_taken = outcomes.iter().all(|o| *o == Outcome::Accepted);
        if all_taken && !partial {
            summarize(&report, since.as_deref());
            return ExitCode::SUCCESS;
        }
        if Instant::now() >= deadline {
            let waited = started.elapsed().as_secs_f64();
            match all_taken {
                true => eprintln!(
                    "xdstap wait: timed out after {waited:.1}s: every tap that answered says it \
                     is taken, but {}",
                    fleet::not_all(&report.taps)
                ),
                false => eprintln!("xdstap wait: timed out after {waited:.1}s"),
            }
            for o in &report.objects {
                for n in nodes(o, Standing::Pending).chain(nodes(o, Standing::NotPushed)) {
                    println!("{}", behind(n, since.as_deref()));
                }
            }
            summarize(&report, since.as_deref());
            return ExitCode::from(if all_taken { EX_PARTIAL } else { 2 });
        }
        tokio::time::sleep(POLL).await;
    }
}

fn nodes(o: &ObjectStatus, s: Standing) -> impl Iterator<Item = &ObjectNode> {
    o.node_states.iter().filter(move |n| n.state() == s)
}

/// Why a node has not taken an object: each resource it has not taken.
fn behind(n: &ObjectNode, since: Option<&str>) -> String {
    let why: Vec<String> = (n.resources.iter())
        .filter(|r| r.state() != Standing::Taken)
        .map(|r| {
            let what = format!("{} {}", r.r#type, &r.name);
            match r.state() {
                Standing::Pending => format!(
                    "{what} pushed {} at {}, not answered",
                    &r.pushed_version, r.pushed_at
                ),
                _ => format!(
                    "{what} runs {} pushed at {}, not pushed since {}",
                    &r.version,
                    r.pushed_at,
                    since.unwrap_or("-")
                ),
            }
        })
        .collect();
    format!("{} {}: {}", &n.node, label(n.state()), why.join("; "))
}

/// Each object's line, and what the taps could not see.
fn summarize(report: &ObjectReport, since: Option<&str>) {
    for o in &report.objects {
        println!("{}: {}", name(o), counts(o));
    }
    if let Some(since) = since {
        if !report.started_at.is_empty() && report.started_at.as_str() > since {
            println!(
                "note: a tap started at {}, after --since {since}: it knows no push from before",
                report.started_at
            );
        }
    }
    print!("{}", fleet::missing_lines(&report.taps));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(taken: u64, pending: u64, rejected: u64, not_pushed: u64) -> ObjectStatus {
        ObjectStatus {
            nodes: taken + pending + rejected + not_pushed,
            taken,
            pending,
            rejected,
            not_pushed,
            ..Default::default()
        }
    }

    #[test]
    fn outcomes() {
        assert_eq!(
            outcome(&object(0, 0, 0, 0)),
            Outcome::Waiting,
            "nothing reaches a node yet"
        );
        assert_eq!(outcome(&object(2, 0, 0, 0)), Outcome::Accepted);
        assert_eq!(outcome(&object(1, 1, 0, 0)), Outcome::Waiting);
        assert_eq!(
            outcome(&object(1, 0, 0, 1)),
            Outcome::Waiting,
            "not pushed since"
        );
        assert_eq!(outcome(&object(1, 1, 1, 0)), Outcome::Rejected, "at once");
        let disconnected = ObjectStatus {
            disconnected: 1,
            ..object(1, 0, 0, 0)
        };
        assert_eq!(outcome(&disconnected), Outcome::Accepted, "not waited for");
    }
}
