//! The command line. Values are taken as text and validated by [`crate::config`], so every bad
//! value is reported the same way, with the option's name, and exits 64.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::Overrides;

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
    /// Play the whole story in one process: control plane, tap and a client, with a bad push.
    Demo(DemoArgs),
    /// Show which proxies are in sync, like `istioctl proxy-status`, from a running tap's admin
    /// server. Exits 1 when any node is NACKED or STALE, 69 when the tap cannot be reached.
    Status(StatusArgs),
}

/// `xdstap status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The tap's admin address: host:port or unix:/path.
    #[arg(long, value_name = "ADDR", env = "XDSTAP_ADMIN", default_value = crate::admin::DEFAULT_ADMIN)]
    pub admin: String,
    /// Show only this node.
    #[arg(long, value_name = "ID")]
    pub node: Option<String>,
    /// Output: table, wide (versions sent/accepted per type) or json.
    #[arg(long, short = 'o', value_name = "FORMAT", default_value = "table")]
    pub output: String,
}

/// `xdstap demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Print one JSON object per event and a summary, instead of the timeline.
    #[arg(long)]
    pub json: bool,
    /// Colour: auto (on a terminal), always or never.
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    pub color: String,
    /// The xDS client: auto (Envoy when one is found, else the built-in stand-in), envoy, or
    /// builtin.
    #[arg(long, value_name = "CLIENT", default_value = "auto")]
    pub client: String,
    /// The Envoy binary to run [default: ENVOY_BIN, then .envoy/ (installed by scripts/test),
    /// then envoy on PATH].
    #[arg(long, value_name = "PATH")]
    pub envoy: Option<PathBuf>,
    /// Send the demo's spans to this OTLP endpoint [default: OTEL_EXPORTER_OTLP_ENDPOINT, else a
    /// local file of OTLP JSON lines].
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: grpc or http/protobuf.
    #[arg(long, value_name = "PROTOCOL")]
    pub otlp_protocol: Option<String>,
}

/// `xdstap check-config`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The YAML config file to check.
    pub file: PathBuf,
    #[command(flatten)]
    pub options: Options,
}

/// `xdstap run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// YAML config file; flags override its keys.
    #[arg(long, short = 'c', value_name = "FILE", env = "XDSTAP_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub options: Options,
}

/// Options shared by `run` and `check-config`.
#[derive(Debug, Args, Default)]
pub struct Options {
    /// Where xDS clients connect: host:port (h2c) or unix:/path.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The control plane: host:port or unix:/path.
    #[arg(long, value_name = "ADDR")]
    pub upstream: Option<String>,
    /// PEM certificate chain for downstream TLS.
    #[arg(long, value_name = "FILE", help_heading = "Downstream TLS")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, value_name = "FILE", help_heading = "Downstream TLS")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle; clients must present a certificate signed by it (mTLS).
    #[arg(long, value_name = "FILE", help_heading = "Downstream TLS")]
    pub tls_client_ca: Option<PathBuf>,
    /// Speak TLS to the upstream (implied by the other --upstream-* TLS flags).
    #[arg(long, help_heading = "Upstream TLS")]
    pub upstream_tls: bool,
    /// PEM CA bundle to verify the upstream [default: system roots].
    #[arg(long, value_name = "FILE", help_heading = "Upstream TLS")]
    pub upstream_ca: Option<PathBuf>,
    /// PEM client certificate for an upstream that requires mTLS.
    #[arg(long, value_name = "FILE", help_heading = "Upstream TLS")]
    pub upstream_cert: Option<PathBuf>,
    /// PEM private key for --upstream-cert.
    #[arg(long, value_name = "FILE", help_heading = "Upstream TLS")]
    pub upstream_key: Option<PathBuf>,
    /// Server name to send and verify [default: the upstream host].
    #[arg(long, value_name = "NAME", help_heading = "Upstream TLS")]
    pub upstream_sni: Option<String>,
    /// HTTP/2 stream window, both sides; also the most the tap buffers per stream and direction
    /// [default: 1MiB].
    #[arg(long, value_name = "SIZE", help_heading = "HTTP/2")]
    pub stream_window: Option<String>,
    /// HTTP/2 connection window, both sides [default: 8MiB].
    #[arg(long, value_name = "SIZE", help_heading = "HTTP/2")]
    pub connection_window: Option<String>,
    /// Largest HTTP/2 DATA frame accepted [default: 16384].
    #[arg(long, value_name = "SIZE", help_heading = "HTTP/2")]
    pub max_frame_size: Option<String>,
    /// Time open streams get to finish after SIGTERM/SIGINT [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub shutdown_grace: Option<String>,
    /// Upstream connect timeout [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub connect_timeout: Option<String>,
    /// Worker threads for forwarding and observing. One is the cheapest per byte (measured: 20%
    /// less CPU than two); raise it for a tap tier carrying many proxies [default: 1].
    #[arg(long, value_name = "N")]
    pub threads: Option<String>,
    /// Log format: text or json [default: text].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Log filter, e.g. info or xdstap=debug [default: info; RUST_LOG also works].
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Largest xDS message decoded; larger ones are forwarded untouched and counted
    /// [default: 256MiB].
    #[arg(long, value_name = "SIZE", help_heading = "Observation")]
    pub decode_limit: Option<String>,
    /// Append one JSON line per verdict (ack, nack, superseded, unanswered) to FILE.
    #[arg(long, value_name = "FILE", help_heading = "Observation")]
    pub event_log: Option<PathBuf>,
    /// Export a span per push to this OTLP endpoint, e.g. http://127.0.0.1:4317
    /// [default: OTEL_EXPORTER_OTLP_ENDPOINT; off when neither is set].
    #[arg(long, value_name = "URL", help_heading = "Spans (OpenTelemetry)")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: grpc or http/protobuf [default: OTEL_EXPORTER_OTLP_PROTOCOL, else
    /// http/protobuf].
    #[arg(long, value_name = "PROTOCOL", help_heading = "Spans (OpenTelemetry)")]
    pub otlp_protocol: Option<String>,
    /// One trace per config version (across types and proxies) or per push [default: version].
    #[arg(
        long,
        value_name = "version|push",
        help_heading = "Spans (OpenTelemetry)"
    )]
    pub trace_grouping: Option<String>,
    /// Write spans to FILE as OTLP JSON lines instead of sending them to an endpoint.
    #[arg(long, value_name = "FILE", help_heading = "Spans (OpenTelemetry)")]
    pub spans_file: Option<PathBuf>,
    /// Mixed into version-derived trace ids; give each control plane its own.
    #[arg(long, value_name = "ID", help_heading = "Spans (OpenTelemetry)")]
    pub control_plane_id: Option<String>,
    /// Admin server (/status, /metrics, /healthz, /readyz): host:port, unix:/path or off
    /// [default: 127.0.0.1:9977].
    #[arg(long, value_name = "ADDR", help_heading = "Admin and status")]
    pub admin: Option<String>,
    /// A push unanswered this long makes its type STALE [default: 30s].
    #[arg(long, value_name = "DURATION", help_heading = "Admin and status")]
    pub stale_after: Option<String>,
    /// Disconnected nodes leave the status view after this long [default: 10m].
    #[arg(long, value_name = "DURATION", help_heading = "Admin and status")]
    pub forget_after: Option<String>,
}

impl Options {
    /// The flags as overrides for the config file.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            upstream: self.upstream.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            tls_client_ca: self.tls_client_ca.clone(),
            upstream_tls: self.upstream_tls,
            upstream_ca: self.upstream_ca.clone(),
            upstream_cert: self.upstream_cert.clone(),
            upstream_key: self.upstream_key.clone(),
            upstream_sni: self.upstream_sni.clone(),
            stream_window: self.stream_window.clone(),
            connection_window: self.connection_window.clone(),
            max_frame_size: self.max_frame_size.clone(),
            shutdown_grace: self.shutdown_grace.clone(),
            connect_timeout: self.connect_timeout.clone(),
            threads: self.threads.clone(),
            log_format: self.log_format.clone(),
            log_level: self
                .log_level
                .clone()
                .or_else(|| std::env::var("RUST_LOG").ok()),
            decode_limit: self.decode_limit.clone(),
            event_log: self.event_log.clone(),
            otlp_endpoint: self.otlp_endpoint.clone(),
            otlp_protocol: self.otlp_protocol.clone(),
            trace_grouping: self.trace_grouping.clone(),
            control_plane_id: self.control_plane_id.clone(),
            spans_file: self.spans_file.clone(),
            admin: self.admin.clone(),
            stale_after: self.stale_after.clone(),
            forget_after: self.forget_after.clone(),
        }
    }
}
