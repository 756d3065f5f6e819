//! The options, defined once: [`Options`] is both the flags (clap) and the YAML file's keys
//! (serde), and every flag's clap id is its YAML key (`admin.stale_after` is `--stale-after`).
//! A file is read into `Options`, the flags given replace what they name, and
//! [`Options::resolve`] validates the result into a [`Config`], one function per section. Every
//! error names the option, its flag and the bad value; `main` exits 64 (EX_USAGE) on any of them.

use std::ffi::OsStr;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use clap::builder::{TypedValueParser, ValueParserFactory};
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches};
use serde::Deserialize;

use crate::observe::board::StatusSettings;
use crate::observe::rollout::RolloutSettings;
use crate::observe::spans::{Grouping, Protocol, SpanSettings, UnknownName};
use crate::proxy::{ClientTls, Endpoint, ServerTls, Settings};

/// Where the admin server listens unless told otherwise.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9977";
/// Events waiting for the sinks unless told otherwise.
pub const DEFAULT_EVENT_QUEUE: usize = 16_384;
/// The largest message decoded unless told otherwise (bigger ones are forwarded and counted).
pub const DEFAULT_DECODE_LIMIT: u64 = 256 << 20;

/// Worker threads unless `--threads` says otherwise: one is the cheapest per byte.
pub const DEFAULT_THREADS: usize = 1;

/// The log filter unless `--log-level` says otherwise.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// Each option's default as `--help` shows it (by arg id, which is its YAML key), taken from
/// the values [`Options::resolve`] falls back on, so help and behaviour cannot drift apart.
pub fn defaults() -> Vec<(&'static str, String)> {
    let (proxy, status) = (Settings::default(), StatusSettings::default());
    let (spans, rollout) = (SpanSettings::default(), RolloutSettings::default());
    let d = |d: std::time::Duration| Duration(d).to_string();
    vec![
        ("shutdown_grace", d(proxy.shutdown_grace)),
        ("connect_timeout", d(proxy.connect_timeout)),
        ("threads", DEFAULT_THREADS.to_string()),
        ("log.format", LogFormat::default().to_string()),
        ("log.level", DEFAULT_LOG_LEVEL.to_string()),
        ("decode_limit", Size(DEFAULT_DECODE_LIMIT).to_string()),
        ("event_queue", DEFAULT_EVENT_QUEUE.to_string()),
        ("spans.grouping", spans.grouping.to_string()),
        ("spans.queue_size", spans.queue.to_string()),
        ("admin.address", DEFAULT_ADMIN.to_string()),
        ("admin.stale_after", d(status.stale_after)),
        ("admin.forget_after", d(status.forget_after)),
        ("admin.max_nodes", status.max_nodes.to_string()),
        ("admin.rollout_versions", rollout.versions.to_string()),
    ]
}

/// `command` with each option's help ending in its default from [`defaults`], wherever a
/// subcommand takes the option.
pub fn with_defaults(mut command: clap::Command) -> clap::Command {
    let names: Vec<String> = (command.get_subcommands())
        .map(|s| s.get_name().to_string())
        .collect();
    for (id, value) in defaults() {
        for name in &names {
            command = command.mut_subcommand(name, |sub| {
                if !sub.get_arguments().any(|a| a.get_id() == id) {
                    return sub;
                }
                sub.mut_arg(id, |a| {
                    let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                    a.help(format!("{help} [default: {value}]"))
                })
            });
        }
    }
    command
}

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The config file is not valid YAML for our schema (unknown key, wrong type, bad value).
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong, with line and column.
        message: String,
    },
    /// A value is wrong.
    #[error("invalid {option} {value:?}: {reason}")]
    Invalid {
        /// The option as written in YAML, with its flag (`listen (--listen)`).
        option: String,
        /// The value given.
        value: String,
        /// Why it is wrong and what would do.
        reason: String,
    },
    /// A required option is missing.
    #[error("missing {option}: {hint}")]
    Missing {
        /// The option.
        option: String,
        /// How to give it.
        hint: String,
    },
}

/// The YAML key of an option with its flag: `admin.stale_after (--stale-after)`.
pub fn option_name(id: &str) -> String {
    let command = Options::augment_args(clap::Command::new("xdstap"));
    let long = command
        .get_arguments()
        .find(|a| a.get_id() == id)
        .and_then(|a| a.get_long().map(String::from));
    match long {
        Some(long) => format!("{id} (--{long})"),
        None => id.to_string(),
    }
}

fn invalid(id: &str, value: impl fmt::Display, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        option: option_name(id),
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn missing(ids: &[&str], hint: &str) -> ConfigError {
    let names: Vec<String> = ids.iter().map(|id| option_name(id)).collect();
    ConfigError::Missing {
        option: names.join(" and "),
        hint: hint.into(),
    }
}

/// The value parser of every typed option: the type's own `FromStr`, with an error that names
/// the option (the arg's id is its YAML key), its flag and the value.
#[derive(Clone)]
pub struct Parsed<T>(PhantomData<fn() -> T>);

impl<T> TypedValueParser for Parsed<T>
where
    T: FromStr + Clone + Send + Sync + 'static,
    T::Err: fmt::Display,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let id = arg.map_or("", |a| a.get_id().as_str());
        let text = value.to_string_lossy();
        text.parse().map_err(|reason: T::Err| {
            let mut e = invalid(id, &text, reason.to_string());
            // A subcommand's own flag (not an option of `run`): named by its flag.
            if let (ConfigError::Invalid { option, .. }, Some(long)) =
                (&mut e, arg.and_then(|a| a.get_long()))
            {
                if option == id {
                    *option = format!("--{long}");
                }
            }
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{e}\n"))
                .with_cmd(cmd)
        })
    }
}

/// Deserializes `T` from a YAML string or number through its `FromStr`; the error carries the
/// value and the reason, and [`Options::from_file`] adds the key and its flag.
fn from_scalar<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    struct Scalar<T>(PhantomData<T>);
    impl<T: FromStr<Err: fmt::Display>> serde::de::Visitor<'_> for Scalar<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or a number")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<T, E> {
            s.parse()
                .map_err(|reason| E::custom(format!("{s:?}: {reason}")))
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<T, E> {
            self.visit_str(&n.to_string())
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<T, E> {
            self.visit_str(&n.to_string())
        }
        fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<T, E> {
            self.visit_str(&n.to_string())
        }
    }
    d.deserialize_any(Scalar(PhantomData))
}

/// Makes a `FromStr` type an option value: clap parses it with [`Parsed`], serde with
/// [`from_scalar`].
macro_rules! option_value {
    ($($t:ty),*) => {$(
        impl ValueParserFactory for $t {
            type Parser = Parsed<$t>;
            fn value_parser() -> Parsed<$t> {
                Parsed(PhantomData)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                from_scalar(d)
            }
        }
    )*};
}

option_value!(
    Endpoint,
    Size,
    Duration,
    Count,
    AdminAddress,
    LogFormat,
    Protocol,
    Grouping
);

/// Why a string is not a value of an option's type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not of the form: what is.
    #[error("expected {0}")]
    Expected(&'static str),
    /// A number with a unit the type does not know.
    #[error("unknown unit {unit:?}; use {known}")]
    Unit {
        /// The unit given.
        unit: String,
        /// The units there are.
        known: &'static str,
    },
    /// Too large (or negative).
    #[error("out of range")]
    Range,
    /// Neither `off` nor an address.
    #[error("{0} (or off)")]
    Admin(#[from] crate::proxy::AddressError),
}

/// A byte size: `1048576`, `64KiB`, `16MiB`, `1GiB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let s = s.trim();
        let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
        let n: u64 = number
            .parse()
            .map_err(|_| ValueError::Expected("a size such as 65536, 64KiB or 16MiB"))?;
        let factor = match unit.trim() {
            "" | "B" => 1,
            "KiB" | "K" => 1 << 10,
            "MiB" | "M" => 1 << 20,
            "GiB" | "G" => 1 << 30,
            other => {
                return Err(ValueError::Unit {
                    unit: other.to_string(),
                    known: "KiB, MiB or GiB",
                })
            }
        };
        n.checked_mul(factor).map(Size).ok_or(ValueError::Range)
    }
}

impl fmt::Display for Size {
    /// In the largest unit that divides it: `256MiB`, `1000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match [(30, "GiB"), (20, "MiB"), (10, "KiB")]
            .into_iter()
            .find(|(shift, _)| n != 0 && n.is_multiple_of(1u64 << shift))
        {
            Some((shift, unit)) => write!(f, "{}{unit}", n >> shift),
            None => write!(f, "{n}"),
        }
    }
}

/// A duration: `10s`, `500ms`, `2m`, `1h`; a bare number is seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Duration(pub std::time::Duration);

impl FromStr for Duration {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let s = s.trim();
        let split = s
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        let n: f64 = number
            .parse()
            .map_err(|_| ValueError::Expected("a duration such as 10s, 500ms or 2m"))?;
        let secs = match unit.trim() {
            "ms" => n / 1000.0,
            "" | "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            other => {
                return Err(ValueError::Unit {
                    unit: other.to_string(),
                    known: "ms, s, m or h",
                })
            }
        };
        if !secs.is_finite() || !(0.0..=86_400.0 * 365.0).contains(&secs) {
            return Err(ValueError::Range);
        }
        Ok(Duration(std::time::Duration::from_secs_f64(secs)))
    }
}

impl fmt::Display for Duration {
    /// As it is written: `10s`, `10m`, `1h`, `500ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        match (d.as_secs(), d.subsec_nanos()) {
            (s, 0) if s != 0 && s.is_multiple_of(3600) => write!(f, "{}h", s / 3600),
            (s, 0) if s != 0 && s.is_multiple_of(60) => write!(f, "{}m", s / 60),
            _ => write!(f, "{d:?}"),
        }
    }
}

impl Duration {
    /// The duration, or an error naming option `id` when it is zero.
    fn positive(self, id: &str) -> Result<std::time::Duration, ConfigError> {
        if self.0.is_zero() {
            return Err(invalid(id, self, "must be greater than 0"));
        }
        Ok(self.0)
    }
}

/// A whole number of things (threads, nodes, spans): at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Count(pub usize);

impl FromStr for Count {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        match s.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(Count(n)),
            _ => Err(ValueError::Expected("a whole number of at least 1")),
        }
    }
}

/// `host:port`, `unix:/path`, or `off`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminAddress {
    /// No admin server.
    Off,
    /// Listen here.
    At(Endpoint),
}

impl FromStr for AdminAddress {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        if s == "off" {
            return Ok(AdminAddress::Off);
        }
        Ok(AdminAddress::At(s.parse()?))
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

impl FromStr for LogFormat {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(ValueError::Expected("text or json")),
        }
    }
}

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
    /// Time open streams get to finish after SIGTERM/SIGINT.
    #[arg(long, value_name = "DURATION")]
    pub shutdown_grace: Option<Duration>,
    /// Upstream connect timeout, TCP + TLS + HTTP/2 handshake.
    #[arg(long, value_name = "DURATION")]
    pub connect_timeout: Option<Duration>,
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
    pub stale_after: Option<Duration>,
    /// Disconnected nodes leave the status view after this long.
    #[arg(
        id = "admin.forget_after",
        long = "forget-after",
        value_name = "DURATION"
    )]
    pub forget_after: Option<Duration>,
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
}

/// Validated settings for `xdstap run`.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen.
    pub listen: Endpoint,
    /// Where to forward.
    pub upstream: Endpoint,
    /// Downstream TLS, if any.
    pub tls: Option<ServerTls>,
    /// Upstream TLS, if any.
    pub upstream_tls: Option<ClientTls>,
    /// HTTP/2 and timing settings.
    pub proxy: Settings,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log_level: String,
    /// Largest message decoded, bytes.
    pub decode_limit: u64,
    /// Runtime worker threads.
    pub threads: usize,
    /// JSON-lines verdict log, if any.
    pub event_log: Option<PathBuf>,
    /// Events waiting for the sinks before new ones are dropped.
    pub event_queue: usize,
    /// Span export, when an endpoint is configured (here or by OTEL_EXPORTER_OTLP_*).
    pub spans: Option<SpanSettings>,
    /// The admin server; `None` when turned off.
    pub admin: Option<AdminSettings>,
}

impl Config {
    /// What `run` needs of the outputs, checked without opening them: the directories of the
    /// event log and the spans file exist, and the OTLP endpoint is a URL. `check-config` runs
    /// it, so that what it calls valid `run` does not reject.
    pub fn check_outputs(&self) -> Result<(), ConfigError> {
        let in_a_directory = |id: &str, path: &std::path::Path| {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => std::path::Path::new("."),
            };
            match dir.is_dir() {
                true => Ok(()),
                false => Err(ConfigError::Invalid {
                    option: option_name(id),
                    value: path.display().to_string(),
                    reason: format!("the directory {} does not exist", dir.display()),
                }),
            }
        };
        if let Some(path) = &self.event_log {
            in_a_directory("event_log", path)?;
        }
        let Some(spans) = &self.spans else {
            return Ok(());
        };
        if let Some(path) = &spans.file {
            in_a_directory("spans.file", path)?;
        }
        // The exporter reads the variables itself when no endpoint is given.
        let endpoint = (spans.endpoint.clone())
            .or_else(|| env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"));
        if let Some(endpoint) = endpoint.as_deref().filter(|_| spans.file.is_none()) {
            let uri = endpoint.parse::<http::Uri>().ok();
            let ok = uri.is_some_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
            });
            if !ok {
                return Err(ConfigError::Invalid {
                    option: option_name("spans.endpoint") + " or OTEL_EXPORTER_OTLP_ENDPOINT",
                    value: endpoint.to_string(),
                    reason: "expected an http:// or https:// URL, e.g. http://127.0.0.1:4317"
                        .into(),
                });
            }
        }
        Ok(())
    }

    /// The downstream TLS acceptor, reading the PEM files: an error names the options.
    pub fn tls_acceptor(&self) -> Result<Option<tokio_rustls::TlsAcceptor>, ConfigError> {
        let Some(t) = &self.tls else { return Ok(None) };
        t.acceptor().map(Some).map_err(|e| ConfigError::Invalid {
            option: ["tls.cert", "tls.key", "tls.client_ca"]
                .map(option_name)
                .join(", "),
            value: t.cert.display().to_string(),
            reason: e.to_string(),
        })
    }

    /// The upstream TLS connector and server name, reading the PEM files: an error names the
    /// options.
    pub fn upstream_connector(&self) -> Result<Option<UpstreamTls>, ConfigError> {
        let Some(t) = &self.upstream_tls else {
            return Ok(None);
        };
        t.connector(self.upstream.host())
            .map(Some)
            .map_err(|e| ConfigError::Invalid {
                option: [
                    "upstream_tls.ca",
                    "upstream_tls.cert",
                    "upstream_tls.key",
                    "upstream_tls.sni",
                ]
                .map(option_name)
                .join(", "),
                value: self.upstream.to_string(),
                reason: e.to_string(),
            })
    }
}

/// A TLS connector and the server name it sends.
pub type UpstreamTls = (
    tokio_rustls::TlsConnector,
    tokio_rustls::rustls::pki_types::ServerName<'static>,
);

/// Validated admin settings.
#[derive(Debug, Clone)]
pub struct AdminSettings {
    /// Where the admin server listens.
    pub address: Endpoint,
    /// How the status board ages entries.
    pub status: StatusSettings,
    /// What the rollout view keeps.
    pub rollouts: RolloutSettings,
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

    /// Validates everything into a [`Config`].
    pub fn resolve(self) -> Result<Config, ConfigError> {
        let listen = self.listen.ok_or_else(|| {
            missing(
                &["listen"],
                "where clients connect, e.g. 127.0.0.1:15010 or unix:/var/run/xdstap.sock",
            )
        })?;
        let upstream = self.upstream.ok_or_else(|| {
            missing(
                &["upstream"],
                "the control plane, e.g. istiod.istio-system.svc:15010",
            )
        })?;
        let (log_format, log_level) = self.log.resolve()?;
        Ok(Config {
            listen,
            upstream,
            tls: self.tls.resolve()?,
            upstream_tls: self.upstream_tls.resolve()?,
            proxy: proxy_settings(
                self.shutdown_grace,
                self.connect_timeout,
                self.max_connections,
            )?,
            log_format,
            log_level,
            decode_limit: self.decode_limit.map_or(DEFAULT_DECODE_LIMIT, |s| s.0),
            threads: threads(self.threads)?,
            event_log: self.event_log,
            event_queue: self.event_queue.map_or(DEFAULT_EVENT_QUEUE, |c| c.0),
            spans: self.spans.resolve()?,
            admin: self.admin.resolve()?,
        })
    }
}

fn threads(n: Option<Count>) -> Result<usize, ConfigError> {
    match n {
        None => Ok(DEFAULT_THREADS),
        Some(Count(n)) if n <= 256 => Ok(n),
        Some(Count(n)) => Err(invalid(
            "threads",
            n,
            "expected a whole number from 1 to 256",
        )),
    }
}

/// serde_norway says `admin.stale_after: "lots": expected ... at line 4 column 18`; this
/// names the key's flag too, as every other option error does.
fn name_the_key(message: &str) -> String {
    match message.split_once(": ") {
        Some((key, rest))
            if !key.contains(' ') && option_name(key) != key && rest.starts_with('"') =>
        {
            format!("invalid {} {rest}", option_name(key))
        }
        _ => message.to_string(),
    }
}

impl TlsOptions {
    fn resolve(self) -> Result<Option<ServerTls>, ConfigError> {
        match (self.cert, self.key) {
            (Some(cert), Some(key)) => Ok(Some(ServerTls {
                cert,
                key,
                client_ca: self.client_ca,
            })),
            (None, None) if self.client_ca.is_none() => Ok(None),
            (None, None) => Err(missing(
                &["tls.cert", "tls.key"],
                "tls.client_ca requires the tap's own certificate and key",
            )),
            (Some(_), None) => Err(missing(
                &["tls.key"],
                "tls.cert was given without its private key",
            )),
            (None, Some(_)) => Err(missing(
                &["tls.cert"],
                "tls.key was given without its certificate",
            )),
        }
    }
}

impl UpstreamTlsOptions {
    fn from_section<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let section = Option::<UpstreamTlsOptions>::deserialize(d)?;
        Ok(
            section.map_or_else(Default::default, |s| UpstreamTlsOptions {
                in_file: true,
                ..s
            }),
        )
    }

    fn resolve(self) -> Result<Option<ClientTls>, ConfigError> {
        let enabled = self.enabled.unwrap_or(self.in_file)
            || self.ca.is_some()
            || self.cert.is_some()
            || self.sni.is_some();
        if !enabled {
            return Ok(None);
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err(missing(
                &["upstream_tls.cert", "upstream_tls.key"],
                "a client certificate needs both",
            ));
        }
        Ok(Some(ClientTls {
            ca: self.ca,
            cert: self.cert,
            key: self.key,
            sni: self.sni,
        }))
    }
}

fn proxy_settings(
    shutdown_grace: Option<Duration>,
    connect_timeout: Option<Duration>,
    max_connections: Option<Count>,
) -> Result<Settings, ConfigError> {
    let defaults = Settings::default();
    Ok(Settings {
        shutdown_grace: shutdown_grace.map_or(defaults.shutdown_grace, |d| d.0),
        connect_timeout: match connect_timeout {
            Some(d) => d.positive("connect_timeout")?,
            None => defaults.connect_timeout,
        },
        max_connections: max_connections.map(|c| c.0),
    })
}

impl LogOptions {
    fn resolve(self) -> Result<(LogFormat, String), ConfigError> {
        let level = self.level.unwrap_or_else(|| DEFAULT_LOG_LEVEL.into());
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&level) {
            return Err(invalid("log.level", &level, e.to_string()));
        }
        Ok((self.format.unwrap_or_default(), level))
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl SpanOptions {
    /// Span settings: these options, then the standard OTEL_* variables. `None` unless an
    /// endpoint or a file is given somewhere; `OTEL_SDK_DISABLED=true` or
    /// `OTEL_TRACES_EXPORTER=none` turn the variables' endpoint off.
    pub fn resolve(self) -> Result<Option<SpanSettings>, ConfigError> {
        let from_env = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none");
        if self.file.is_none() && self.endpoint.is_none() && (from_env.is_none() || disabled) {
            return Ok(None);
        }
        if let Some(e) = &self.endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(invalid(
                    "spans.endpoint",
                    e,
                    "expected a URL such as http://127.0.0.1:4317",
                ));
            }
        }
        let defaults = SpanSettings::default();
        let protocol = match self.protocol {
            Some(p) => p,
            None => match env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            {
                Some(p) => p
                    .parse()
                    .map_err(|reason: UnknownName| ConfigError::Invalid {
                        option: "OTEL_EXPORTER_OTLP_PROTOCOL (environment)".into(),
                        value: p,
                        reason: reason.to_string(),
                    })?,
                None => defaults.protocol,
            },
        };
        Ok(Some(SpanSettings {
            endpoint: self.endpoint,
            file: self.file,
            protocol,
            grouping: self.grouping.unwrap_or(defaults.grouping),
            control_plane_id: self.control_plane_id.unwrap_or_default(),
            queue: self.queue_size.map_or(defaults.queue, |c| c.0),
            ..defaults
        }))
    }
}

impl AdminOptions {
    fn resolve(self) -> Result<Option<AdminSettings>, ConfigError> {
        let address = match self.address {
            Some(AdminAddress::Off) => return Ok(None),
            Some(AdminAddress::At(a)) => a,
            None => DEFAULT_ADMIN.parse().expect("a valid default"),
        };
        let defaults = StatusSettings::default();
        let status = StatusSettings {
            stale_after: match self.stale_after {
                Some(d) => d.positive("admin.stale_after")?,
                None => defaults.stale_after,
            },
            forget_after: self.forget_after.map_or(defaults.forget_after, |d| d.0),
            max_nodes: self.max_nodes.map_or(defaults.max_nodes, |c| c.0),
        };
        let defaults = RolloutSettings::default();
        let rollouts = RolloutSettings {
            versions: self.rollout_versions.map_or(defaults.versions, |c| c.0),
            max_nodes: status.max_nodes,
            ..defaults
        };
        Ok(Some(AdminSettings {
            address,
            status,
            rollouts,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Options {
        serde_norway::from_str(text).unwrap()
    }

    fn flags(args: &[&str]) -> Options {
        Options::from_flags(args).unwrap()
    }

    #[test]
    fn help_shows_the_defaults_resolve_uses() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(subcommand)]
            command: Sub,
        }
        #[derive(clap::Subcommand)]
        enum Sub {
            Run(Options),
        }
        let command = with_defaults(Flags::command());
        let run = command.find_subcommand("run").unwrap();
        for (id, value) in defaults() {
            let arg = (run.get_arguments().find(|a| a.get_id() == id))
                .unwrap_or_else(|| panic!("{id} is no option"));
            let help = arg.get_help().unwrap().to_string();
            assert!(
                help.ends_with(&format!(" [default: {value}]")),
                "{id}: {help}"
            );
            assert_eq!(help.matches("[default:").count(), 1, "{id}: {help}");
        }
        // A value the table shows parses back to itself.
        assert_eq!("256MiB".parse::<Size>().unwrap().to_string(), "256MiB");
        assert_eq!("10m".parse::<Duration>().unwrap().to_string(), "10m");
        assert_eq!("500ms".parse::<Duration>().unwrap().to_string(), "500ms");
        assert_eq!("1000".parse::<Size>().unwrap().to_string(), "1000");
    }

    #[test]
    fn the_documented_config_file_states_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/xdstap.yaml");
        let documented = Options::from_file(&path).unwrap().resolve().unwrap();
        let bare = yaml("listen: 127.0.0.1:15010\nupstream: 127.0.0.1:18000\n")
            .resolve()
            .unwrap();
        assert_eq!(format!("{documented:?}"), format!("{bare:?}"));
    }

    #[test]
    fn flags_override_file() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            options: Options,
        }
        let file = yaml(
            "listen: 127.0.0.1:1\nupstream: 127.0.0.1:2\nadmin:\n  stale_after: 5s\nshutdown_grace: 3s\n",
        );
        let matches = Flags::command()
            .try_get_matches_from([
                "x",
                "--listen",
                "127.0.0.1:9",
                "--upstream",
                "unix:/tmp/cp.sock",
            ])
            .unwrap();
        let c = file.with_flags(&matches).unwrap().resolve().unwrap();
        assert_eq!(c.listen, Endpoint::Tcp("127.0.0.1:9".into()));
        assert_eq!(c.upstream, Endpoint::Unix("/tmp/cp.sock".into()));
        assert_eq!(
            c.admin.unwrap().status.stale_after,
            std::time::Duration::from_secs(5)
        );
        assert_eq!(c.proxy.shutdown_grace, std::time::Duration::from_secs(3));
    }

    #[test]
    fn threads_default_to_one_and_are_checked() {
        let c = flags(&["--listen", "127.0.0.1:9", "--upstream", "127.0.0.1:10"]);
        assert_eq!(c.resolve().unwrap().threads, 1);
        let file = yaml("listen: 127.0.0.1:1\nupstream: 127.0.0.1:2\nthreads: 4\n");
        assert_eq!(file.resolve().unwrap().threads, 4);
        for bad in ["0", "two"] {
            let e = Options::from_flags(["--threads", bad])
                .unwrap_err()
                .to_string();
            assert!(e.contains("threads (--threads)") && e.contains(bad), "{e}");
        }
        let e = flags(&[
            "--listen",
            "127.0.0.1:9",
            "--upstream",
            "127.0.0.1:10",
            "--threads",
            "100000",
        ])
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("threads (--threads)") && e.contains("100000"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_option_and_value() {
        let e = Options::from_flags(["--decode-limit", "12 parsecs"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("decode_limit (--decode-limit)") && e.contains("12 parsecs"),
            "{e}"
        );
        let e = Options::from_flags(["--listen", "nowhere"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("listen (--listen)") && e.contains("\"nowhere\""),
            "{e}"
        );
        let e = serde_norway::from_str::<Options>("listn: x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("listn"), "{e}");
        let e = name_the_key(
            &serde_norway::from_str::<Options>("admin:\n  forget_after: huge\n")
                .unwrap_err()
                .to_string(),
        );
        assert!(
            e.starts_with("invalid admin.forget_after (--forget-after) \"huge\""),
            "{e}"
        );
        let e = flags(&[
            "--listen",
            "127.0.0.1:9",
            "--upstream",
            "127.0.0.1:10",
            "--tls-cert",
            "c.pem",
        ])
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains("tls.key (--tls-key)"), "{e}");
    }

    #[test]
    fn upstream_tls_is_on_by_section_or_flag() {
        let base = ["--listen", "127.0.0.1:9", "--upstream", "h:1"];
        assert!(flags(&base).resolve().unwrap().upstream_tls.is_none());
        let mut on = base.to_vec();
        on.push("--upstream-tls");
        assert!(flags(&on).resolve().unwrap().upstream_tls.is_some());
        let mut sni = base.to_vec();
        sni.extend(["--upstream-sni", "istiod"]);
        assert!(flags(&sni).resolve().unwrap().upstream_tls.is_some());
    }

    #[test]
    fn parses_units() {
        let d = |s: &str| s.parse::<Duration>().map(|d| d.0);
        assert_eq!(d("500ms").unwrap(), std::time::Duration::from_millis(500));
        assert_eq!(d("2m").unwrap(), std::time::Duration::from_secs(120));
        assert_eq!(d("7").unwrap(), std::time::Duration::from_secs(7));
        assert!(d("7 days").is_err());
        assert_eq!("16MiB".parse::<Size>().unwrap().0, 16 << 20);
        assert_eq!("65535".parse::<Size>().unwrap().0, 65535);
        assert!("1TB".parse::<Size>().is_err());
        let o = yaml("decode_limit: 1024\nadmin:\n  address: \"off\"\n  stale_after: 5\n");
        assert_eq!(o.decode_limit, Some(Size(1024)));
        assert_eq!(o.admin.address, Some(AdminAddress::Off));
    }
}
