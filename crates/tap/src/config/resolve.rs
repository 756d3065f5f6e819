//! The options validated: [`Options::resolve`] turns what was given into a [`Config`], one
//! function per section, each error naming the option, its flag and the bad value.

use std::path::PathBuf;

use super::options::{
    AdminOptions, LogOptions, Options, SpanOptions, TlsOptions, UpstreamTlsOptions,
};
use super::values::{AdminAddress, Count, HumanDuration, LogFormat};
use super::{
    invalid, missing, option_name, ConfigError, DEFAULT_ADMIN, DEFAULT_DECODE_LIMIT,
    DEFAULT_EVENT_QUEUE, DEFAULT_LOG_LEVEL, DEFAULT_OBSERVE_BACKLOG, DEFAULT_THREADS,
};
use crate::config::UnknownName;
use crate::outputs::spans::SpanSettings;
use crate::proxy::{ClientTls, Endpoint, ServerTls, Settings};
use crate::views::board::StatusSettings;
use crate::views::rollout::RolloutSettings;

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
    /// Bytes forwarded and waiting to be observed before connections wait for the observer.
    pub observe_backlog: u64,
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
    /// The page's link to a trace: a URL with `{trace_id}` in it.
    pub trace_url: Option<String>,
    /// The tier's other taps (admin addresses or names), asked by `/status` and the page.
    pub peers: Vec<String>,
    /// Admin connections open at once at most; past it clients wait in the kernel's backlog.
    /// Not an option: `xdstap run` sets it to a share of the open-files limit
    /// ([`connections_for`](crate::config::connections_for)), so slow admin clients cannot take the descriptors
    /// the xDS side needs.
    pub max_connections: usize,
}

impl Options {
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
                self.drain_delay,
                self.shutdown_grace,
                self.connect_timeout,
                self.max_connections,
            )?,
            log_format,
            log_level,
            decode_limit: self.decode_limit.map_or(DEFAULT_DECODE_LIMIT, |s| s.0),
            observe_backlog: self
                .observe_backlog
                .map_or(DEFAULT_OBSERVE_BACKLOG, |s| s.0),
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
    drain_delay: Option<HumanDuration>,
    shutdown_grace: Option<HumanDuration>,
    connect_timeout: Option<HumanDuration>,
    max_connections: Option<Count>,
) -> Result<Settings, ConfigError> {
    let defaults = Settings::default();
    Ok(Settings {
        drain_delay: drain_delay.map_or(defaults.drain_delay, |d| d.0),
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
        let trace_url = match self.trace_url {
            Some(t) if !(t.starts_with("http://") || t.starts_with("https://")) => {
                return Err(invalid("admin.trace_url", &t, "expected an http(s) URL"));
            }
            Some(t) if !t.contains("{trace_id}") => {
                return Err(invalid(
                    "admin.trace_url",
                    &t,
                    "expected {trace_id} where the trace id goes",
                ));
            }
            t => t,
        };
        let peers: Vec<String> = (self.peers.unwrap_or_default().into_iter())
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect();
        for p in &peers {
            if let Err(reason) = p.parse::<Endpoint>() {
                return Err(invalid("admin.peers", p, reason.to_string()));
            }
        }
        Ok(Some(AdminSettings {
            address,
            status,
            rollouts,
            trace_url,
            peers,
            max_connections: crate::config::MAX_CONNECTIONS,
        }))
    }
}
