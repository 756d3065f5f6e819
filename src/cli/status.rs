//! `xdstap status`: asks a running tap for its status board and prints a table like
//! `istioctl proxy-status`, a column per type, with the reason for every NACKED or STALE type
//! below it. The exit status serves scripts: 0 all fine, 1 some node NACKED or STALE, 3 the
//! tap knows no node of the `--node` given, 69 the tap could not be asked.

use super::client::Exit;
use std::process::ExitCode;

use super::client::{block_on, AskError};
use super::fleet::{self, Fleet};
use super::{table, StatusArgs, EX_NO_NODE};
use xdstap::api::v1::resource_status::ClientStatus;
use xdstap::api::v1::ResourceStatus;
use xdstap::api::v1::{NackScope, NodeStatus, StatusReport, StatusRequest, SyncState, TypeStatus};

/// `xdstap status`: fetch, print, and say by the exit status whether anything needs attention.
pub fn run(args: &StatusArgs) -> ExitCode {
    block_on(status(args)).unwrap_or_else(|code| code)
}

async fn status(args: &StatusArgs) -> ExitCode {
    let mut taps = match Fleet::resolve(&args.admin.admin).await {
        Ok(f) => f,
        Err(e) => return e.exit("status"),
    };
    if let (true, Some(node)) = (args.resources, args.node.as_deref()) {
        return resources(&mut taps, node, args.output).await;
    }
    let node = args.node.clone().unwrap_or_default();
    let answers = (taps.ask(move |mut tap| {
        let request = StatusRequest {
            node: node.clone(),
            resources: false,
        };
        async move {
            match tap.client.status(request).await {
                Ok(r) => Ok(r.into_inner()),
                // It answered: it knows no such node.
                Err(e) if e.code() == tonic::Code::NotFound => Ok(StatusReport::default()),
                Err(e) => Err(tap.failed(e)),
            }
        }
    }))
    .await;
    let report = match fleet::split(answers) {
        Ok((answers, taps)) => fleet::status(answers, taps),
        Err(e) => return e.exit("status"),
    };
    let partial = fleet::warn_partial("status", &report.taps);
    if let (Some(id), true) = (args.node.as_deref(), report.nodes.is_empty()) {
        eprintln!("xdstap status: no tap that answered knows a node {id:?}");
        return fleet::not_found(EX_NO_NODE, partial);
    }
    args.output.print(&report, render);
    fleet::exit(has_problems(&report), partial)
}

/// `xdstap status --node N --resources`: one line per resource of N, over CSDS.
async fn resources(taps: &mut Fleet, node: &str, output: super::Output) -> ExitCode {
    let (rows, answered) = match fetch_resources(taps, Some(node)).await {
        Ok(r) => r,
        Err(e) => return e.exit("status"),
    };
    let partial = fleet::warn_partial("status", &answered);
    if rows.is_empty() {
        eprintln!("xdstap status: no tap that answered knows resources of node {node:?}");
        return fleet::not_found(EX_NO_NODE, partial);
    }
    let problems = rows.iter().any(NodeResource::is_bad);
    output.print(&ResourceRows(rows), render_resources);
    if output != super::Output::Json {
        print!("{}", fleet::missing_lines(&answered));
    }
    fleet::exit(problems, partial)
}

/// The resources of node `node` (or of every node) as the taps' status gives them (the tap's
/// own per-resource states, finer than CSDS's), over every tap: a resource of a node that
/// several taps list is the one updated last. With every tap asked and whether it answered.
pub async fn fetch_resources(
    taps: &mut Fleet,
    node: Option<&str>,
) -> Result<(Vec<NodeResource>, Vec<xdstap::api::v1::TapAnswer>), AskError> {
    let request = StatusRequest {
        node: node.unwrap_or("").to_string(),
        resources: true,
    };
    let answers = (taps.ask(move |mut tap| {
        let request = request.clone();
        async move {
            match tap.client.status(request).await {
                Ok(r) => Ok(r.into_inner()),
                // It answered: it knows no such node.
                Err(e) if e.code() == tonic::Code::NotFound => Ok(StatusReport::default()),
                Err(e) => Err(tap.failed(e)),
            }
        }
    }))
    .await;
    let (answers, answered) = fleet::split(answers)?;
    let mut newest: std::collections::BTreeMap<(String, String, String), NodeResource> =
        Default::default();
    for (admin, report) in answers {
        for n in report.nodes {
            for status in n.resources {
                let key = (n.id.clone(), status.type_url.clone(), status.name.clone());
                let row = NodeResource {
                    node: n.id.clone(),
                    status,
                    tap: admin.clone(),
                };
                let later =
                    |seen: &NodeResource| row.status.last_updated > seen.status.last_updated;
                if newest.get(&key).is_none_or(later) {
                    newest.insert(key, row);
                }
            }
        }
    }
    Ok((newest.into_values().collect(), answered))
}

/// One resource of one node as a tap's status gives it (`status --resources`, `rollout
/// --resource`): the API's own per-resource status, with the node and the tap that said so.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct NodeResource {
    /// The node's id.
    pub node: String,
    /// The resource, as the tap's API states it.
    #[serde(flatten)]
    pub status: ResourceStatus,
    /// The admin address of the tap that said so.
    pub tap: String,
}

impl NodeResource {
    /// Whether the node is in trouble with it: rejected, reported in error by the control
    /// plane, or dropped when its TTL lapsed.
    pub fn is_bad(&self) -> bool {
        matches!(
            self.status.client(),
            ClientStatus::Nacked | ClientStatus::ReceivedError | ClientStatus::Expired
        )
    }
}

/// A node's resources, printed as a JSON array or a table.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
struct ResourceRows(Vec<NodeResource>);

/// One line per resource: type, name, the version it runs, how it stands, its error.
fn render_resources(ResourceRows(rows): &ResourceRows, wide: bool) -> String {
    let mut table_rows = vec![["TYPE", "NAME", "RUNS", "STATE", "SENT", "ERROR"]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>()];
    for NodeResource { status: r, .. } in rows {
        let error = match (&r.error, &r.rejected_version) {
            (Some(e), Some(v)) => format!("{} (rejected {v})", one_line(e, wide)),
            (Some(e), None) => one_line(e, wide),
            (None, _) => "-".into(),
        };
        table_rows.push(vec![
            r.r#type.clone(),
            r.name.clone(),
            dash(&r.version),
            r.client().as_str_name().to_string(),
            r.config().as_str_name().to_string(),
            error,
        ]);
    }
    table(&table_rows)
}

/// `value`, or `-` when empty.
pub fn dash(value: &str) -> String {
    if value.is_empty() {
        "-".into()
    } else {
        value.into()
    }
}

/// An age for people: `45s`, `3m`, `2h`, `4d`.
pub fn age(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

const COLUMNS: [&str; 5] = ["CDS", "LDS", "EDS", "RDS", "SDS"];

/// A type's cell: its state, how long it has been in it unless SYNCED, `*` when the node never
/// asked for the type; `IGNORED` for a type it never asked for and was never pushed.
fn cell(t: Option<&TypeStatus>, wide: bool) -> String {
    let Some(t) = t else {
        return "IGNORED".into();
    };
    let partial = t
        .nack
        .as_ref()
        .is_some_and(|n| n.scope() == NackScope::Partial);
    let mut label = match t.state() {
        SyncState::Nacked if partial => "PARTIAL".to_string(),
        s => s.label().to_string(),
    };
    if t.state() != SyncState::Synced && t.state_since.is_some() {
        label = format!("{label} {}", age(t.state_seconds));
    }
    if !t.subscribed {
        label.push('*');
    }
    if !wide {
        return label;
    }
    let accepted = t.version_accepted.as_deref().unwrap_or("-");
    match (t.state(), t.version_sent.as_deref()) {
        (SyncState::Synced, _) => format!("{label} {accepted}"),
        (_, Some(sent)) => format!("{label} {sent} (on {accepted})"),
        (_, None) => label,
    }
}

fn others(n: &NodeStatus, wide: bool) -> String {
    let rest: Vec<&TypeStatus> = n
        .types
        .iter()
        .filter(|t| !COLUMNS.contains(&t.r#type.as_str()))
        .collect();
    if rest.is_empty() {
        return "-".into();
    }
    let state = SyncState::worst(rest.iter().map(|t| t.state()));
    if wide {
        let names: Vec<&str> = rest.iter().map(|t| t.r#type.as_str()).collect();
        format!("{} ({})", state.label(), names.join(","))
    } else {
        format!("{} ({})", state.label(), rest.len())
    }
}

/// A NACK message on one line. Envoy's often quotes the rejected resource (a text-format dump,
/// many lines) before its reason, after ` : `; unless `full`, a long one keeps its head (which
/// names the resource) and the whole reason, and leaves the dump out. Without that shape, it
/// keeps its head and its tail.
pub fn one_line(message: &str, full: bool) -> String {
    let flat = message.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars: Vec<char> = flat.chars().collect();
    if full || chars.len() <= 300 {
        return flat;
    }
    let head: String = chars[..80].iter().collect();
    // A text-format dump writes `field: value`; ` : ` is where Envoy puts the reason after it.
    let reason = (flat.rfind(" : ")).map(|i| &flat[i + 3..]);
    match reason {
        Some(r) if r.chars().count() <= 600 && flat.len() - r.len() > 80 => {
            format!("{head} ... {r}")
        }
        _ => {
            let tail: String = chars[chars.len() - 200..].iter().collect();
            format!("{head} ... {tail}")
        }
    }
}

/// What of a NACKed push landed, in words: `b rejected; a, c applied` for a partial NACK, a
/// warning for an unknown scope, nothing for a whole rejection.
pub fn landed(scope: NackScope, rejected: &[String], applied: &[String]) -> Option<String> {
    match scope {
        NackScope::Partial if applied.is_empty() => Some(format!(
            "{} rejected; nothing else changed",
            rejected.join(", ")
        )),
        NackScope::Partial => Some(format!(
            "{} rejected; {} applied",
            rejected.join(", "),
            applied.join(", ")
        )),
        NackScope::Unknown => Some("what of it landed is not known".into()),
        NackScope::Whole | NackScope::Unspecified => None,
    }
}

/// The table, then one line per NACKED or STALE type saying why (whole messages with `wide`).
pub fn render(report: &StatusReport, wide: bool) -> String {
    let mut header = vec!["NODE", "CLUSTER"];
    header.extend(COLUMNS);
    header.extend(["OTHER", "CONNECTED"]);
    if wide {
        header.push("USER AGENT");
    }
    let fan_in = report.taps.len() > 1;
    if fan_in {
        header.push("TAP");
    }
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for n in &report.nodes {
        let mut row = vec![n.id.clone(), n.cluster.clone()];
        for c in COLUMNS {
            row.push(cell(n.types.iter().find(|t| t.r#type == c), wide));
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
        if fan_in {
            row.push(match (wide, n.taps.len()) {
                (true, _) | (false, 0 | 1) => n.taps.join(", "),
                (false, k) => format!("{} (+{})", n.taps[0], k - 1),
            });
        }
        rows.push(row);
    }
    let mut out = table(&rows);
    if report.nodes.is_empty() {
        out.push_str("(no xDS clients seen yet)\n");
    }
    let unasked = (report.nodes.iter()).any(|n| n.types.iter().any(|t| !t.subscribed));
    if unasked {
        out.push_str("* pushed to a node that never asked for the type\n");
    }
    let reasons = reasons(report, wide);
    if !reasons.is_empty() {
        out.push('\n');
        for r in reasons {
            out.push_str(&r);
            out.push('\n');
        }
    }
    out.push_str(&rejected_objects(&report.rejected_objects, wide));
    if wide {
        out.push_str(&elsewhere(report));
    }
    out.push_str(&super::fleet::also_lines(&report.taps));
    out.push_str(&super::fleet::missing_lines(&report.taps));
    out
}

/// ` [made from DestinationRule default/r, Service default/r]`: the objects behind a NACK, or
/// ` [no object named in the metadata]`.
pub fn made_from(objects: &[xdstap::api::v1::Origin]) -> String {
    let mut labels: Vec<String> = Vec::new();
    for o in objects {
        let label = o.label();
        if !labels.contains(&label) {
            labels.push(label);
        }
    }
    match labels.is_empty() {
        true => " [no object named in the metadata]".into(),
        false => format!(" [made from {}]", labels.join(", ")),
    }
}

/// The objects behind a NACK on some node now: one line each, with the command that shows it.
pub fn rejected_objects(objects: &[xdstap::api::v1::RejectedObject], wide: bool) -> String {
    if objects.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\nRejected now (the objects the rejected resources were made from; a patch such as an \
         EnvoyFilter may have changed them since):\n",
    );
    for r in objects {
        let Some(o) = &r.object else { continue };
        out.push_str(&format!(
            "{}: rejected by {} node(s) since {} ({} {}): {}\n",
            o.label(),
            r.nodes,
            r.since,
            r.types.join(","),
            r.resources.join(", "),
            o.command(),
        ));
        if wide {
            out.push_str(&format!("    e.g. {}\n", r.examples.join(", ")));
        }
    }
    out
}

/// The other taps' views of nodes several taps see (older streams), a line each.
fn elsewhere(report: &StatusReport) -> String {
    let mut out = String::new();
    for n in &report.nodes {
        for other in &n.elsewhere {
            let types: Vec<String> = (COLUMNS.iter())
                .filter_map(|c| {
                    let t = other.types.iter().find(|t| t.r#type == *c)?;
                    Some(format!("{c} {}", cell(Some(t), true)))
                })
                .collect();
            let connected = match other.connected {
                true => "connected".to_string(),
                false => format!(
                    "disconnected since {}",
                    other.disconnected_at.as_deref().unwrap_or("?")
                ),
            };
            out.push_str(&format!(
                "{} as {} sees it ({connected}, last seen {}): {}\n",
                n.id,
                other.taps.first().map_or("another tap", String::as_str),
                other.last_seen,
                types.join(", ")
            ));
        }
    }
    if !out.is_empty() {
        out.insert(0, '\n');
    }
    out
}

/// One line per NACKED, STALE or warming type, and per type whose nonces were reused.
fn reasons(report: &StatusReport, wide: bool) -> Vec<String> {
    let mut reasons = Vec::new();
    for n in &report.nodes {
        for t in &n.types {
            match t.state() {
                SyncState::Nacked => {
                    let Some(nack) = &t.nack else { continue };
                    let partial = nack.scope() == NackScope::Partial;
                    let suspects = if nack.suspects.is_empty() || partial {
                        String::new()
                    } else {
                        format!(" [suspects: {}]", nack.suspects.join(", "))
                    };
                    let running = t.version_accepted.as_deref().unwrap_or("nothing");
                    let what = match landed(nack.scope(), &nack.rejected, &nack.applied) {
                        Some(l) if partial => {
                            format!("{} partly: {l}", nack.version)
                        }
                        Some(l) => format!("rejected {} ({l}), running {running}", nack.version),
                        None => format!("rejected {}, running {running}", nack.version),
                    };
                    reasons.push(format!(
                        "{} {} NACKED since {}: {what}: {}{}{}",
                        n.id,
                        t.r#type,
                        nack.since,
                        one_line(&nack.message, wide),
                        suspects,
                        made_from(&nack.objects),
                    ));
                }
                SyncState::Stale if t.pushes == 0 => reasons.push(format!(
                    "{} {} STALE: asked for, never pushed: the control plane has not answered \
                     (threshold {}s)",
                    n.id, t.r#type, report.stale_after_seconds
                )),
                SyncState::Stale => reasons.push(format!(
                    "{} {} STALE: push {} (nonce {}) unanswered since {} (threshold {}s)",
                    n.id,
                    t.r#type,
                    t.version_sent.as_deref().unwrap_or("?"),
                    t.nonce.as_deref().unwrap_or("?"),
                    t.pending_since.as_deref().unwrap_or("?"),
                    report.stale_after_seconds
                )),
                _ => {}
            }
            if !t.waiting_for.is_empty() {
                reasons.push(format!(
                    "{} {}: push {} unanswered since {}: the client waits for the endpoints \
                     (EDS) of {}",
                    n.id,
                    t.r#type,
                    t.version_sent.as_deref().unwrap_or("?"),
                    t.pending_since.as_deref().unwrap_or("?"),
                    t.waiting_for.join(", ")
                ));
            }
            for e in &t.resource_errors {
                reasons.push(format!(
                    "{} {}: the control plane reports an error for {} since {} (code {}): {}",
                    n.id,
                    t.r#type,
                    e.name,
                    e.since,
                    e.code,
                    one_line(&e.message, wide)
                ));
            }
            if t.rejected_resends > 0 {
                reasons.push(format!(
                    "{} {}: the control plane pushed content the client had rejected again, {} \
                     time(s) (a resend loop: it ignores the NACK)",
                    n.id, t.r#type, t.rejected_resends
                ));
            }
            if t.nonce_reuses > 0 {
                reasons.push(format!(
                    "{} {}: the control plane reused a nonce {} time(s); answers were paired with \
                     pushes in order",
                    n.id, t.r#type, t.nonce_reuses
                ));
            }
        }
    }
    reasons
}

/// Whether any node needs attention (the exit status).
pub fn has_problems(report: &StatusReport) -> bool {
    report
        .nodes
        .iter()
        .any(|n| n.types.iter().any(|t| t.state().is_problem()))
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
        // A long reason is kept whole: the field it names sits in its middle.
        let reason = format!(
            "Proto constraint validation failed (ClusterValidationError.LoadAssignment: embedded \
             message failed validation | caused by {} field: value must be greater than 0s)",
            "ClusterLoadAssignmentValidationError.Endpoints[0] ".repeat(4)
        );
        let long = format!("name: \"b\"\n{} : {reason}", "  field {\n  }\n".repeat(40));
        let short = one_line(&long, false);
        let whole = one_line(&long, true);
        let reason = one_line(&reason, true);
        assert!(
            short.ends_with(&reason) && short.len() < whole.len() - 300,
            "{short}"
        );
        assert_eq!(one_line("a\n  b", false), "a b");
        assert!(one_line(&dump, true).len() > 300);
    }
}
