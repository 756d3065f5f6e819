//! The options as given: [`Options`] is both the flags (clap) and the YAML file's keys (serde),
//! one struct per section, every flag's clap id its YAML key. A file is read into `Options` and
//! the flags given replace what they name.

use std::path::{Path, PathBuf};

use clap::{ArgMatches, Args, CommandFactory, FromArgMatches};
use serde::Deserialize;

use super::values::{AdminAddress, Count, HumanDuration, LogFormat, Size};
use super::{option_name, ConfigError};
use crate::outputs::spans::{Grouping, Protocol};
use crate::proxy::Endpoint;

/// Every option of `xdstap run` and `check-config`. The field path is the YAML key; the flag is
/// named in each field's `#[arg]`. Unset options take the defaults their help states.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// Where xDS clients connect: host:port (h2c) or unix:/path.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<Endpoint>,
    /// The control plane: host:port or unix:/path.
    #[arg(long, value_name = "ADDR")]
    pub upstream: Option<Endpoint>,
    /// After SIGTERM/SIGINT, how long the tap serves on with /readyz answering 503, before
    /// it stops accepting: time for a load balancer to send new clients elsewhere.
    #[arg(long, value_name = "DURATION")]
    pub drain_delay: Option<HumanDuration>,
    /// Once the tap stops accepting, how long streams still waiting for an answer get before
    /// their connections are closed.
    #[arg(long, value_name = "DURATION")]
    pub shutdown_grace: Option<HumanDuration>,
    /// Upstream connect timeout, TCP + TLS + HTTP/2 handshake.
    #[arg(long, value_name = "DURATION")]
    pub connect_timeout: Option<HumanDuration>,
    /// Worker threads for forwarding and observing; one is the cheapest per byte, raise it for
    /// a tap tier carrying many proxies.
    #[arg(long, value_name = "N")]
    pub threads: Option<Count>,
    /// Most client connections open at once; past it a new connection is closed as soon as it
    /// is accepted (counted, and logged with a count every few seconds), so a client with a
    /// failover goes there at once [default: no limit].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<Count>,
    /// Downstream TLS.
    #[command(flatten)]
    pub tls: TlsOptions,
    /// Upstream TLS.
    #[command(flatten)]
    #[serde(deserialize_with = "UpstreamTlsOptions::from_section")]
    pub upstream_tls: UpstreamTlsOptions,
    /// Logging.
    #[command(flatten)]
    pub log: LogOptions,
    /// Largest xDS message decoded; larger ones are forwarded untouched and counted.
    #[arg(long, value_name = "SIZE", help_heading = "Observation")]
    pub decode_limit: Option<Size>,
    /// Bytes forwarded and waiting for the observer's thread; past it, connections read no
    /// more until it has caught up half of it (nothing goes unobserved).
    #[arg(long, value_name = "SIZE", help_heading = "Observation")]
    pub observe_backlog: Option<Size>,
    /// Append one JSON line per verdict (ack, nack, superseded, unanswered) to FILE [default: off].
    #[arg(long, value_name = "FILE", help_heading = "Observation")]
    pub event_log: Option<PathBuf>,
    /// Events waiting for the sinks (spans, status, metrics, event log); beyond it events are
    /// dropped and counted, never forwarding held up.
    #[arg(long, value_name = "N", help_heading = "Observation")]
    pub event_queue: Option<Count>,
    /// Span export.
    #[command(flatten)]
    pub spans: SpanOptions,
    /// The admin server and the status view.
    #[command(flatten)]
    pub admin: AdminOptions,
}

/// `tls:`: downstream TLS, off when neither cert nor key is given.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Downstream TLS")]
pub struct TlsOptions {
    /// PEM certificate chain for downstream TLS.
    #[arg(id = "tls.cert", long = "tls-cert", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(id = "tls.key", long = "tls-key", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// PEM CA bundle; clients must present a certificate signed by it (mTLS).
    #[arg(id = "tls.client_ca", long = "tls-client-ca", value_name = "FILE")]
    pub client_ca: Option<PathBuf>,
}

/// `upstream_tls:`: TLS to the control plane, on when the section or any of its flags is given.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Upstream TLS")]
pub struct UpstreamTlsOptions {
    /// Speak TLS to the upstream (implied by the other --upstream-* TLS flags; in YAML, by the
    /// section) [default: off].
    #[arg(
        id = "upstream_tls.enabled",
        long = "upstream-tls",
        num_args = 0,
        default_missing_value = "true"
    )]
    pub enabled: Option<bool>,
    /// PEM CA bundle to verify the upstream [default: system roots].
    #[arg(id = "upstream_tls.ca", long = "upstream-ca", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// PEM client certificate for an upstream that requires mTLS.
    #[arg(id = "upstream_tls.cert", long = "upstream-cert", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// PEM private key for --upstream-cert.
    #[arg(id = "upstream_tls.key", long = "upstream-key", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Server name to send and verify [default: the upstream host].
    #[arg(id = "upstream_tls.sni", long = "upstream-sni", value_name = "NAME")]
    pub sni: Option<String>,
    /// Set when the YAML file has a non-empty `upstream_tls:` section, which turns TLS on by
    /// itself.
    #[arg(skip)]
    #[serde(skip)]
    pub in_file: bool,
}

/// `log:`.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Logging")]
pub struct LogOptions {
    /// Log format: text or json.
    #[arg(id = "log.format", long = "log-format", value_name = "FORMAT")]
    pub format: Option<LogFormat>,
    /// Log filter, e.g. info or xdstap=debug.
    #[arg(
        id = "log.level",
        long = "log-level",
        value_name = "FILTER",
        env = "RUST_LOG"
    )]
    pub level: Option<String>,
}

/// `spans:`: OpenTelemetry span export, off unless an endpoint or a file is given here, by flag,
/// or by `OTEL_EXPORTER_OTLP_ENDPOINT`.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Spans (OpenTelemetry)")]
pub struct SpanOptions {
    /// Export a span per push to this OTLP endpoint, e.g. http://127.0.0.1:4317
    /// [default: OTEL_EXPORTER_OTLP_ENDPOINT; off when neither is set].
    #[arg(id = "spans.endpoint", long = "otlp-endpoint", value_name = "URL")]
    pub endpoint: Option<String>,
    /// OTLP transport: grpc or http/protobuf [default: OTEL_EXPORTER_OTLP_PROTOCOL, else
    /// http/protobuf].
    #[arg(id = "spans.protocol", long = "otlp-protocol", value_name = "PROTOCOL")]
    pub protocol: Option<Protocol>,
    /// One trace per config version (across types and proxies) or per push.
    #[arg(
        id = "spans.grouping",
        long = "trace-grouping",
        value_name = "version|push"
    )]
    pub grouping: Option<Grouping>,
    /// Mixed into version-derived trace ids; give each control plane its own [default: none].
    #[arg(
        id = "spans.control_plane_id",
        long = "control-plane-id",
        value_name = "ID"
    )]
    pub control_plane_id: Option<String>,
    /// Spans waiting for export; beyond it spans are dropped and counted.
    #[arg(id = "spans.queue_size", long = "span-queue-size", value_name = "N")]
    pub queue_size: Option<Count>,
    /// Write spans to FILE as OTLP JSON lines instead of sending them to an endpoint.
    #[arg(id = "spans.file", long = "spans-file", value_name = "FILE")]
    pub file: Option<PathBuf>,
}

/// `admin:`.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Admin and status")]
pub struct AdminOptions {
    /// Admin server (HTTP: /status, /rollouts, /metrics, /healthz, /readyz; gRPC: the tap's API
    /// and CSDS): host:port, unix:/path or off.
    #[arg(id = "admin.address", long = "admin", value_name = "ADDR")]
    pub address: Option<AdminAddress>,
    /// A push unanswered this long makes its type STALE.
    #[arg(
        id = "admin.stale_after",
        long = "stale-after",
        value_name = "DURATION"
    )]
    pub stale_after: Option<HumanDuration>,
    /// Disconnected nodes leave the status view after this long.
    #[arg(
        id = "admin.forget_after",
        long = "forget-after",
        value_name = "DURATION"
    )]
    pub forget_after: Option<HumanDuration>,
    /// Nodes kept in the status view; past it the longest-idle node leaves.
    #[arg(id = "admin.max_nodes", long = "max-nodes", value_name = "N")]
    pub max_nodes: Option<Count>,
    /// Versions per type the rollout view keeps; past it the oldest goes.
    #[arg(
        id = "admin.rollout_versions",
        long = "rollout-versions",
        value_name = "N"
    )]
    pub rollout_versions: Option<Count>,
    /// The page links each version and verdict to its trace: a URL with `{trace_id}` in it,
    /// e.g. http://jaeger:16686/trace/{trace_id} [default: no links].
    #[arg(id = "admin.trace_url", long = "trace-url", value_name = "TEMPLATE")]
    pub trace_url: Option<String>,
    /// The other taps of a tier, asked so that /status and the page answer for the whole tier:
    /// host:port or unix:/path, repeated or comma-separated; a name resolving to every replica
    /// (a headless Service) stands for each, this tap included [default: none: this tap only].
    #[arg(
        id = "admin.peers",
        long = "admin-peers",
        value_name = "ADDR",
        value_delimiter = ','
    )]
    pub peers: Option<Vec<String>>,
}

impl Options {
    /// Reads a YAML file of options; an empty file is all defaults.
    pub fn from_file(path: &Path) -> Result<Options, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        if text.trim().is_empty() {
            return Ok(Options::default());
        }
        serde_norway::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: name_the_key(&e.to_string()),
        })
    }

    /// These options with every option given in `flags` replacing its value. `flags` are the
    /// matches of a command that flattens [`Options`].
    pub fn with_flags(mut self, flags: &ArgMatches) -> Result<Options, clap::Error> {
        self.update_from_arg_matches(flags)?;
        Ok(self)
    }

    /// Options from flags alone, as a command line would give them (for tests and tools).
    pub fn from_flags<I, T>(args: I) -> Result<Options, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            options: Options,
        }
        let matches = Flags::command().try_get_matches_from(
            std::iter::once(std::ffi::OsString::from("xdstap"))
                .chain(args.into_iter().map(Into::into)),
        )?;
        Options::default().with_flags(&matches)
    }
}

/// serde_norway says `admin.stale_after: "lots": expected ... at line 4 column 18`; this
/// names the key's flag too, as every other option error does.
pub(super) fn name_the_key(message: &str) -> String {
    match message.split_once(": ") {
        Some((key, rest))
            if !key.contains(' ') && option_name(key) != key && rest.starts_with('"') =>
        {
            format!("invalid {} {rest}", option_name(key))
        }
        _ => message.to_string(),
    }
}

impl UpstreamTlsOptions {
    /// The `upstream_tls:` section: present in the file means on, unless it says otherwise.
    fn from_section<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let section = Option::<UpstreamTlsOptions>::deserialize(d)?;
        Ok(
            section.map_or_else(Default::default, |s| UpstreamTlsOptions {
                in_file: true,
                ..s
            }),
        )
    }
}
