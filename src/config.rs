//! Settings from a YAML file and from flags, flags winning, validated into typed values.
//! Every error names the option, where it came from, and the bad value; `main` exits 64
//! (EX_USAGE) on any of them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::observe::spans::{Grouping, Protocol, SpanSettings};
use crate::observe::status::StatusSettings;
use crate::proxy::{ClientTls, Endpoint, ServerTls, Settings};

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
    /// The config file is not valid YAML for our schema (unknown key, wrong type, ...).
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What serde said, with line and column.
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

/// The YAML file. Every key is optional; flags override keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Where clients connect: `host:port` or `unix:/path`.
    pub listen: Option<String>,
    /// The control plane: `host:port` or `unix:/path`.
    pub upstream: Option<String>,
    /// Downstream TLS.
    pub tls: Option<FileServerTls>,
    /// Upstream TLS.
    pub upstream_tls: Option<FileClientTls>,
    /// HTTP/2 tuning.
    pub http2: Option<FileHttp2>,
    /// Grace period for open streams at shutdown, e.g. `10s`.
    pub shutdown_grace: Option<String>,
    /// Upstream connect timeout, e.g. `10s`.
    pub connect_timeout: Option<String>,
    /// Worker threads.
    pub threads: Option<serde_norway::Value>,
    /// Logging.
    pub log: Option<FileLog>,
    /// Largest xDS message decoded, e.g. `256MiB`; larger ones are forwarded and counted.
    pub decode_limit: Option<serde_norway::Value>,
    /// JSON-lines file getting one line per verdict.
    pub event_log: Option<PathBuf>,
    /// OpenTelemetry span export.
    pub spans: Option<FileSpans>,
    /// The admin server and the status view.
    pub admin: Option<FileAdmin>,
}

/// `admin:` in the YAML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAdmin {
    /// `host:port`, `unix:/path`, or `off`.
    pub address: Option<String>,
    /// A push unanswered this long is STALE, e.g. `30s`.
    pub stale_after: Option<String>,
    /// Disconnected nodes leave the status view after this long, e.g. `10m`.
    pub forget_after: Option<String>,
    /// At most this many nodes are kept.
    pub max_nodes: Option<usize>,
}

/// Validated admin settings.
#[derive(Debug, Clone)]
pub struct AdminSettings {
    /// Where the admin server listens.
    pub address: Endpoint,
    /// How the status board ages entries.
    pub status: StatusSettings,
}

/// `spans:` in the YAML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpans {
    /// OTLP endpoint, e.g. `http://jaeger:4317` (grpc) or `http://collector:4318` (http).
    pub endpoint: Option<String>,
    /// `grpc` or `http/protobuf`.
    pub protocol: Option<String>,
    /// `version` (one trace per config version) or `push`.
    pub grouping: Option<String>,
    /// Mixed into version-derived trace ids.
    pub control_plane_id: Option<String>,
    /// Spans waiting for export before new ones are dropped.
    pub queue_size: Option<usize>,
    /// Write spans to this file as OTLP JSON lines instead of sending them.
    pub file: Option<PathBuf>,
}

/// `tls:` in the YAML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileServerTls {
    /// PEM certificate chain.
    pub cert: Option<PathBuf>,
    /// PEM private key.
    pub key: Option<PathBuf>,
    /// PEM CA bundle; set to require client certificates.
    pub client_ca: Option<PathBuf>,
}

/// `upstream_tls:` in the YAML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileClientTls {
    /// Use TLS upstream (default true when the section is present).
    pub enabled: Option<bool>,
    /// PEM CA bundle; system roots when unset.
    pub ca: Option<PathBuf>,
    /// PEM client certificate.
    pub cert: Option<PathBuf>,
    /// PEM client key.
    pub key: Option<PathBuf>,
    /// SNI and verified name; the upstream host when unset.
    pub sni: Option<String>,
}

/// `http2:` in the YAML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHttp2 {
    /// Per-stream window, bytes or `16MiB`.
    pub stream_window: Option<serde_norway::Value>,
    /// Per-connection window.
    pub connection_window: Option<serde_norway::Value>,
    /// Largest DATA frame we accept.
    pub max_frame_size: Option<serde_norway::Value>,
}

/// `log:` in the YAML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLog {
    /// `text` or `json`.
    pub format: Option<String>,
    /// A tracing filter such as `info` or `xdstap=debug`.
    pub level: Option<String>,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Values given on the command line; `None` means "not given".
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub upstream: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub upstream_tls: bool,
    pub upstream_ca: Option<PathBuf>,
    pub upstream_cert: Option<PathBuf>,
    pub upstream_key: Option<PathBuf>,
    pub upstream_sni: Option<String>,
    pub stream_window: Option<String>,
    pub connection_window: Option<String>,
    pub max_frame_size: Option<String>,
    pub shutdown_grace: Option<String>,
    pub connect_timeout: Option<String>,
    pub threads: Option<String>,
    pub log_format: Option<String>,
    pub log_level: Option<String>,
    pub decode_limit: Option<String>,
    pub event_log: Option<PathBuf>,
    pub otlp_endpoint: Option<String>,
    pub otlp_protocol: Option<String>,
    pub trace_grouping: Option<String>,
    pub control_plane_id: Option<String>,
    pub spans_file: Option<PathBuf>,
    pub admin: Option<String>,
    pub stale_after: Option<String>,
    pub forget_after: Option<String>,
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
    /// Largest message decoded.
    pub decode_limit: u64,
    /// Runtime worker threads.
    pub threads: usize,
    /// JSON-lines verdict log, if any.
    pub event_log: Option<PathBuf>,
    /// Span export, when an endpoint is configured (here or by OTEL_EXPORTER_OTLP_*).
    pub spans: Option<SpanSettings>,
    /// The admin server; `None` when turned off.
    pub admin: Option<AdminSettings>,
}

impl FileConfig {
    /// Reads and parses a YAML config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        if text.trim().is_empty() {
            return Ok(FileConfig::default());
        }
        serde_norway::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string(),
        })
    }
}

fn invalid(option: &str, flag: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        option: format!("{option} ({flag})"),
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn endpoint(option: &str, flag: &str, value: &str) -> Result<Endpoint, ConfigError> {
    value
        .parse()
        .map_err(|reason: String| invalid(option, flag, value, reason))
}

/// Parses `10s`, `500ms`, `2m`, `1h`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = number
        .parse()
        .map_err(|_| "expected a duration such as 10s, 500ms or 2m".to_string())?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        other => return Err(format!("unknown unit {other:?}; use ms, s, m or h")),
    };
    if !secs.is_finite() || !(0.0..=86_400.0 * 365.0).contains(&secs) {
        return Err("out of range".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a byte size: `1048576`, `64KiB`, `16MiB`, `1GiB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, ""),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| "expected a size such as 65536, 64KiB or 16MiB".to_string())?;
    let factor = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        other => return Err(format!("unknown unit {other:?}; use KiB, MiB or GiB")),
    };
    n.checked_mul(factor).ok_or_else(|| "too large".to_string())
}

fn yaml_scalar(v: &serde_norway::Value) -> String {
    match v {
        serde_norway::Value::String(s) => s.clone(),
        serde_norway::Value::Number(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

fn window(
    option: &str,
    flag: &str,
    value: Option<String>,
    default: u32,
    min: u32,
    max: u32,
) -> Result<u32, ConfigError> {
    let Some(value) = value else {
        return Ok(default);
    };
    let n = parse_size(&value).map_err(|r| invalid(option, flag, &value, r))?;
    if n < min as u64 || n > max as u64 {
        return Err(invalid(
            option,
            flag,
            &value,
            format!("must be between {min} and {max} bytes"),
        ));
    }
    Ok(n as u32)
}

impl Config {
    /// Merges a file (if any) with flags and validates the result.
    pub fn resolve(file: FileConfig, flags: Overrides) -> Result<Config, ConfigError> {
        let listen = flags
            .listen
            .or(file.listen)
            .ok_or_else(|| ConfigError::Missing {
                option: "listen (--listen)".into(),
                hint: "where clients connect, e.g. 127.0.0.1:15010 or unix:/var/run/xdstap.sock"
                    .into(),
            })?;
        let listen = endpoint("listen", "--listen", &listen)?;
        let upstream = flags
            .upstream
            .or(file.upstream)
            .ok_or_else(|| ConfigError::Missing {
                option: "upstream (--upstream)".into(),
                hint: "the control plane, e.g. istiod.istio-system.svc:15010".into(),
            })?;
        let upstream = endpoint("upstream", "--upstream", &upstream)?;

        let ftls = file.tls.unwrap_or_default();
        let cert = flags.tls_cert.or(ftls.cert);
        let key = flags.tls_key.or(ftls.key);
        let client_ca = flags.tls_client_ca.or(ftls.client_ca);
        let tls = match (cert, key) {
            (Some(cert), Some(key)) => Some(ServerTls {
                cert,
                key,
                client_ca,
            }),
            (None, None) if client_ca.is_none() => None,
            (None, None) => {
                return Err(ConfigError::Missing {
                    option: "tls.cert (--tls-cert) and tls.key (--tls-key)".into(),
                    hint: "tls.client_ca requires the tap's own certificate and key".into(),
                })
            }
            (Some(_), None) => {
                return Err(ConfigError::Missing {
                    option: "tls.key (--tls-key)".into(),
                    hint: "tls.cert was given without its private key".into(),
                })
            }
            (None, Some(_)) => {
                return Err(ConfigError::Missing {
                    option: "tls.cert (--tls-cert)".into(),
                    hint: "tls.key was given without its certificate".into(),
                })
            }
        };

        let section = file.upstream_tls;
        let utls = section.as_ref();
        let enabled = flags.upstream_tls
            || flags.upstream_ca.is_some()
            || flags.upstream_cert.is_some()
            || flags.upstream_sni.is_some()
            || utls.is_some_and(|t| t.enabled.unwrap_or(true));
        let upstream_tls = if enabled {
            let t = ClientTls {
                ca: flags.upstream_ca.or(utls.and_then(|t| t.ca.clone())),
                cert: flags.upstream_cert.or(utls.and_then(|t| t.cert.clone())),
                key: flags.upstream_key.or(utls.and_then(|t| t.key.clone())),
                sni: flags.upstream_sni.or(utls.and_then(|t| t.sni.clone())),
            };
            if t.cert.is_some() != t.key.is_some() {
                return Err(ConfigError::Missing {
                    option:
                        "upstream_tls.cert (--upstream-cert) and upstream_tls.key (--upstream-key)"
                            .into(),
                    hint: "a client certificate needs both".into(),
                });
            }
            Some(t)
        } else {
            None
        };

        let h2 = file.http2.unwrap_or_default();
        let defaults = Settings::default();
        let stream_window = window(
            "http2.stream_window",
            "--stream-window",
            flags
                .stream_window
                .or(h2.stream_window.as_ref().map(yaml_scalar)),
            defaults.stream_window,
            65_535,
            (1 << 31) - 1,
        )?;
        let connection_window = window(
            "http2.connection_window",
            "--connection-window",
            flags
                .connection_window
                .or(h2.connection_window.as_ref().map(yaml_scalar)),
            defaults.connection_window,
            65_535,
            (1 << 31) - 1,
        )?;
        let max_frame_size = window(
            "http2.max_frame_size",
            "--max-frame-size",
            flags
                .max_frame_size
                .or(h2.max_frame_size.as_ref().map(yaml_scalar)),
            defaults.max_frame_size,
            16_384,
            (1 << 24) - 1,
        )?;
        let duration =
            |option: &str, flag: &str, value: Option<String>, default: Duration| match value {
                None => Ok(default),
                Some(v) => parse_duration(&v).map_err(|r| invalid(option, flag, &v, r)),
            };
        let shutdown_grace = duration(
            "shutdown_grace",
            "--shutdown-grace",
            flags.shutdown_grace.or(file.shutdown_grace),
            defaults.shutdown_grace,
        )?;
        let connect_timeout = duration(
            "connect_timeout",
            "--connect-timeout",
            flags.connect_timeout.or(file.connect_timeout),
            defaults.connect_timeout,
        )?;
        if connect_timeout.is_zero() {
            return Err(invalid(
                "connect_timeout",
                "--connect-timeout",
                "0",
                "must be greater than 0",
            ));
        }

        let flog = file.log.unwrap_or_default();
        let log_format = match flags.log_format.or(flog.format).as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(invalid(
                    "log.format",
                    "--log-format",
                    other,
                    "expected text or json",
                ))
            }
        };
        let log_level = flags
            .log_level
            .or(flog.level)
            .unwrap_or_else(|| "info".into());
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log_level) {
            return Err(invalid(
                "log.level",
                "--log-level",
                &log_level,
                e.to_string(),
            ));
        }

        let threads = match flags.threads.or(file.threads.as_ref().map(yaml_scalar)) {
            None => 1,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=256).contains(&n) => n,
                _ => {
                    return Err(invalid(
                        "threads",
                        "--threads",
                        &v,
                        "expected a whole number from 1 to 256",
                    ))
                }
            },
        };
        let decode_limit = match flags
            .decode_limit
            .or(file.decode_limit.as_ref().map(yaml_scalar))
        {
            None => crate::tap::DEFAULT_DECODE_LIMIT,
            Some(v) => {
                parse_size(&v).map_err(|r| invalid("decode_limit", "--decode-limit", &v, r))?
            }
        };

        let fadmin = file.admin.unwrap_or_default();
        let admin_address = flags
            .admin
            .or(fadmin.address)
            .unwrap_or_else(|| crate::admin::DEFAULT_ADMIN.into());
        let admin = if admin_address == "off" {
            None
        } else {
            let address = endpoint("admin.address", "--admin", &admin_address)?;
            let mut status = StatusSettings::default();
            if let Some(v) = flags.stale_after.or(fadmin.stale_after) {
                status.stale_after = parse_duration(&v)
                    .map_err(|r| invalid("admin.stale_after", "--stale-after", &v, r))?;
                if status.stale_after.is_zero() {
                    return Err(invalid(
                        "admin.stale_after",
                        "--stale-after",
                        &v,
                        "must be greater than 0",
                    ));
                }
            }
            if let Some(v) = flags.forget_after.or(fadmin.forget_after) {
                status.forget_after = parse_duration(&v)
                    .map_err(|r| invalid("admin.forget_after", "--forget-after", &v, r))?;
            }
            if let Some(n) = fadmin.max_nodes {
                if n == 0 {
                    return Err(invalid(
                        "admin.max_nodes",
                        "config file",
                        "0",
                        "must be at least 1",
                    ));
                }
                status.max_nodes = n;
            }
            Some(AdminSettings { address, status })
        };
        let spans = spans(
            file.spans.unwrap_or_default(),
            SpanFlags {
                file: flags.spans_file,
                endpoint: flags.otlp_endpoint,
                protocol: flags.otlp_protocol,
                grouping: flags.trace_grouping,
                control_plane_id: flags.control_plane_id,
            },
        )?;

        Ok(Config {
            listen,
            upstream,
            tls,
            upstream_tls,
            proxy: Settings {
                stream_window,
                connection_window,
                max_frame_size,
                shutdown_grace,
                connect_timeout,
                ..defaults
            },
            log_format,
            log_level,
            decode_limit,
            threads,
            event_log: flags.event_log.or(file.event_log),
            spans,
            admin,
        })
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Span settings: flags, then the file, then the standard OTEL_* variables. Off unless an
/// endpoint is given somewhere; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it
/// off.
/// Span settings from flags and the standard OTEL_* variables alone (for `xdstap demo`):
/// `None` when no endpoint is given anywhere.
pub fn spans_from_flags(
    endpoint: Option<String>,
    protocol: Option<String>,
) -> Result<Option<SpanSettings>, ConfigError> {
    spans(
        FileSpans::default(),
        SpanFlags {
            file: None,
            endpoint,
            protocol,
            grouping: None,
            control_plane_id: None,
        },
    )
}

struct SpanFlags {
    file: Option<PathBuf>,
    endpoint: Option<String>,
    protocol: Option<String>,
    grouping: Option<String>,
    control_plane_id: Option<String>,
}

fn spans(file: FileSpans, flags: SpanFlags) -> Result<Option<SpanSettings>, ConfigError> {
    let endpoint = flags.endpoint.or(file.endpoint);
    let to_file = flags.file.or(file.file);
    let from_env =
        env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none");
    if to_file.is_none() && endpoint.is_none() && (from_env.is_none() || disabled) {
        return Ok(None);
    }
    if let Some(e) = &endpoint {
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            return Err(invalid(
                "spans.endpoint",
                "--otlp-endpoint",
                e,
                "expected a URL such as http://127.0.0.1:4317",
            ));
        }
    }
    let mut settings = SpanSettings {
        endpoint,
        file: to_file,
        ..Default::default()
    };
    if let Some(p) = flags.protocol.or(file.protocol) {
        settings.protocol = p
            .parse::<Protocol>()
            .map_err(|r| invalid("spans.protocol", "--otlp-protocol", &p, r))?;
    } else if let Some(p) =
        env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
    {
        settings.protocol = p
            .parse::<Protocol>()
            .map_err(|r| invalid("OTEL_EXPORTER_OTLP_PROTOCOL", "environment", &p, r))?;
    }
    if let Some(g) = flags.grouping.or(file.grouping) {
        settings.grouping = g
            .parse::<Grouping>()
            .map_err(|r| invalid("spans.grouping", "--trace-grouping", &g, r))?;
    }
    if let Some(id) = flags.control_plane_id.or(file.control_plane_id) {
        settings.control_plane_id = id;
    }
    if let Some(q) = file.queue_size {
        if q == 0 {
            return Err(invalid(
                "spans.queue_size",
                "config file",
                "0",
                "must be at least 1",
            ));
        }
        settings.queue = q;
    }
    Ok(Some(settings))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(listen: &str, upstream: &str) -> Overrides {
        Overrides {
            listen: Some(listen.into()),
            upstream: Some(upstream.into()),
            ..Default::default()
        }
    }

    #[test]
    fn flags_override_file() {
        let file: FileConfig = serde_norway::from_str(
            "listen: 127.0.0.1:1\nupstream: 127.0.0.1:2\nhttp2:\n  stream_window: 1MiB\nshutdown_grace: 3s\n",
        )
        .unwrap();
        let c = Config::resolve(file, flags("127.0.0.1:9", "unix:/tmp/cp.sock")).unwrap();
        assert_eq!(c.listen, Endpoint::Tcp("127.0.0.1:9".into()));
        assert_eq!(c.upstream, Endpoint::Unix("/tmp/cp.sock".into()));
        assert_eq!(c.proxy.stream_window, 1 << 20);
        assert_eq!(c.proxy.shutdown_grace, Duration::from_secs(3));
    }

    #[test]
    fn threads_default_to_one_and_are_checked() {
        let c = Config::resolve(FileConfig::default(), flags("127.0.0.1:9", "127.0.0.1:10"));
        assert_eq!(c.unwrap().threads, 1);
        let file: FileConfig =
            serde_norway::from_str("listen: 127.0.0.1:1\nupstream: 127.0.0.1:2\nthreads: 4\n")
                .unwrap();
        assert_eq!(
            Config::resolve(file, Overrides::default()).unwrap().threads,
            4
        );
        for bad in ["0", "two", "100000"] {
            let mut f = flags("127.0.0.1:9", "127.0.0.1:10");
            f.threads = Some(bad.into());
            let e = Config::resolve(FileConfig::default(), f)
                .unwrap_err()
                .to_string();
            assert!(e.contains("threads (--threads)") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn errors_name_the_option_and_value() {
        let mut f = flags("127.0.0.1:9", "127.0.0.1:10");
        f.stream_window = Some("12 parsecs".into());
        let e = Config::resolve(FileConfig::default(), f)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("http2.stream_window (--stream-window)") && e.contains("12 parsecs"),
            "{e}"
        );
        let e = Config::resolve(FileConfig::default(), flags("nowhere", "127.0.0.1:1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("listen (--listen)") && e.contains("\"nowhere\""),
            "{e}"
        );
        let e = serde_norway::from_str::<FileConfig>("listn: x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("listn"), "{e}");
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("7 days").is_err());
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("65535").unwrap(), 65535);
        assert!(parse_size("1TB").is_err());
    }
}
