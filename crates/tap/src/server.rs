//! The assembly: a [`Config`] and a bound [`Listener`] become a running tap (the forwarder, the
//! observing pipeline, its sinks and the admin server), as `main`, the demo and the tests run it.
//! The only module that wires the others together; `command` is the `xdstap` command line
//! over it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::admin::Admin;
use crate::config::{option_name, Config, ConfigError};
use crate::observer::Observer;
use crate::observer::ObserverStats;
use crate::outputs::eventlog::EventLog;
use crate::outputs::metrics::Sources;
pub use crate::outputs::spans::SetupError;
use crate::outputs::spans::{SpanStats, TraceIds};
use crate::proxy::{Connector, Listener, Observe, Proxy, ProxyStats};
use crate::queue::Sink;
use crate::views::board::StatusBoard;
use crate::views::rollout::Rollouts;
use crate::views::watch::Watchers;

/// How long the span exporter gets to deliver what is queued at shutdown.
const SPAN_FLUSH: Duration = Duration::from_secs(15);

/// Why the tap could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting cannot be used (a TLS file, the event log's path): a usage error.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The admin address could not be bound.
    #[error("cannot listen on {option} {address}: {source}")]
    Admin {
        /// `admin.address (--admin)`.
        option: String,
        /// The address.
        address: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The span exporter could not be set up.
    #[error(transparent)]
    Spans(#[from] SetupError),
    /// The sinks' thread could not be started.
    #[error("cannot start the sinks' thread: {0}")]
    Sinks(std::io::Error),
}

impl StartError {
    /// Whether the user's settings are at fault (exit 64) rather than the machine.
    pub fn is_usage(&self) -> bool {
        matches!(self, StartError::Config(_))
    }
}

/// A tap to be started: its config, and what callers add (sinks, an observer wrapper).
pub struct Server {
    config: Config,
    sinks: Vec<Box<dyn Sink>>,
    wrap: Option<ObserverWrap>,
}

/// Puts an observer in front of the tap's own.
type ObserverWrap = Box<dyn FnOnce(Arc<dyn Observe>) -> Arc<dyn Observe> + Send>;

/// A started tap: listening, observing, serving its admin endpoints. [`Running::serve`] runs it
/// until shutdown.
pub struct Running {
    proxy: Proxy,
    pipeline: Pipeline,
    status: StatusBoard,
    rollouts: Rollouts,
    tap_stats: Arc<ObserverStats>,
    span_stats: Arc<SpanStats>,
    admin: Option<(String, tokio::task::JoinHandle<()>)>,
    exporter: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// A tap for `config`.
    pub fn new(config: Config) -> Server {
        Server {
            config,
            sinks: Vec::new(),
            wrap: None,
        }
    }

    /// Adds a sink that sees every event (the demo's recorder, a test's), each once the tap's own
    /// views (status board, rollouts, metrics) and the sinks added before it have applied it.
    pub fn with_sink(mut self, sink: Box<dyn Sink>) -> Server {
        self.sinks.push(sink);
        self
    }

    /// Puts `wrap`'s observer in front of the tap's own, for tools that record the traffic the
    /// tap sees (the tests' fuzz-seed capture).
    pub fn wrap_observer(
        mut self,
        wrap: impl FnOnce(Arc<dyn Observe>) -> Arc<dyn Observe> + Send + 'static,
    ) -> Server {
        self.wrap = Some(Box::new(wrap));
        self
    }

    /// Starts everything on the current runtime; nothing is forwarded before every part is up,
    /// so a bad TLS file or admin address fails the start.
    pub async fn start(self, listener: Listener) -> Result<Running, StartError> {
        let config = self.config;
        let acceptor = config.tls_acceptor()?;
        let connector = Connector::new(config.upstream.clone(), config.upstream_connector()?);
        // The caller's sinks come after the tap's own views, so one that sees an event can read
        // the status board, rollouts and metrics with that event applied.
        let extra = self.sinks;
        let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
        let span_stats = Arc::new(SpanStats::default());
        let (exporter, traces) = outputs(&config, &span_stats, &mut sinks)?.unzip();
        let status_settings = config
            .admin
            .as_ref()
            .map(|a| a.status.clone())
            .unwrap_or_default();
        let status = StatusBoard::new(status_settings);
        sinks.push(Box::new(status.clone()));
        let rollout_settings = (config.admin.as_ref())
            .map(|a| a.rollouts.clone())
            .unwrap_or_default();
        let rollouts = Rollouts::new(rollout_settings);
        sinks.push(Box::new(rollouts.clone()));
        let watchers = Watchers::new(traces.clone());
        if config.admin.is_some() {
            sinks.push(Box::new(watchers.clone()));
        }
        let admin_listener = bind_admin(&config).await?;
        let proxy_stats = Arc::new(ProxyStats::default());
        let tap_stats = Arc::new(ObserverStats::default());
        let (registry, push_metrics) = crate::outputs::metrics::registry(Sources {
            proxy: proxy_stats.clone(),
            tap: tap_stats.clone(),
            spans: span_stats.clone(),
            status: status.clone(),
        });
        sinks.push(Box::new(push_metrics));
        sinks.extend(extra);
        let pipeline = Pipeline::start(
            PipelineOptions {
                queue_capacity: config.event_queue,
                decode_limit: config.decode_limit,
                observe_backlog: config.observe_backlog,
            },
            tap_stats.clone(),
            sinks,
        )
        .map_err(StartError::Sinks)?;
        let mut observer: Arc<dyn Observe> = pipeline.observer.clone();
        if let Some(wrap) = self.wrap {
            observer = wrap(observer);
        }
        let listener = listener.with_tls(acceptor);
        let checker = connector.clone();
        let proxy = Proxy::new(
            listener,
            connector,
            config.proxy.clone(),
            observer,
            proxy_stats.clone(),
        );
        let admin = admin_listener.map(|l| {
            let address = l.local_addr();
            tracing::info!(admin = %address, "Admin server listening (/status /rollouts /metrics /healthz /readyz, gRPC)");
            let admin = Arc::new(Admin {
                status: status.clone(),
                rollouts: rollouts.clone(),
                watchers,
                registry,
                upstream: config.upstream.clone(),
                ready: crate::admin::ready::Readiness::new(config.upstream.clone(), checker),
                proxy: proxy_stats,
                traces,
                trace_url: config.admin.as_ref().and_then(|a| a.trace_url.clone()),
                seats: Default::default(),
                name: tap_name(&address),
                instance: crate::admin::instance_id(),
                started_at: crate::clock::now(),
                peers: config.admin.as_ref().map(|a| a.peers.clone()).unwrap_or_default(),
                fleet: Default::default(),
            });
            let most = config.admin.as_ref().map_or(crate::config::MAX_CONNECTIONS, |a| a.max_connections);
            (address, tokio::spawn(crate::admin::serve(l, admin, most)))
        });
        tracing::info!(listen = %proxy.local_addr(), upstream = %config.upstream, "Listening");
        Ok(Running {
            proxy,
            pipeline,
            status,
            rollouts,
            tap_stats,
            span_stats,
            admin,
            exporter,
        })
    }
}

/// The event log and the span exporter, when configured, as sinks; the exporter's task, and the
/// trace ids its spans carry.
fn outputs(
    config: &Config,
    span_stats: &Arc<SpanStats>,
    sinks: &mut Vec<Box<dyn Sink>>,
) -> Result<Option<(tokio::task::JoinHandle<()>, TraceIds)>, StartError> {
    if let Some(path) = &config.event_log {
        let log = EventLog::open(path).map_err(|e| ConfigError::Invalid {
            option: option_name("event_log"),
            value: path.display().to_string(),
            reason: e.to_string(),
        })?;
        sinks.push(Box::new(log));
    }
    let Some(settings) = config.spans.clone() else {
        return Ok(None);
    };
    let endpoint = (settings.endpoint.clone())
        .or_else(|| settings.file.as_ref().map(|f| f.display().to_string()))
        .unwrap_or_else(|| "OTEL_EXPORTER_OTLP_ENDPOINT".into());
    let (sink, task) = crate::outputs::spans::start(settings, span_stats.clone())?;
    tracing::info!(%endpoint, "Exporting spans");
    let traces = sink.trace_ids();
    sinks.push(Box::new(sink));
    Ok(Some((task, traces)))
}

/// The admin server's listener, when it is on.
async fn bind_admin(config: &Config) -> Result<Option<Listener>, StartError> {
    let Some(a) = &config.admin else {
        return Ok(None);
    };
    let bound = Listener::bind(&a.address).await;
    let listener = (bound.and_then(Listener::owner_only)).map_err(|source| StartError::Admin {
        option: option_name("admin.address"),
        address: a.address.to_string(),
        source,
    })?;
    Ok(Some(listener))
}

impl Running {
    /// Where clients connect (`127.0.0.1:PORT` with the real port, or `unix:/path`).
    pub fn local_addr(&self) -> String {
        self.proxy.local_addr()
    }

    /// Where the admin server listens, when it is on.
    pub fn admin_addr(&self) -> Option<&str> {
        self.admin.as_ref().map(|(a, _)| a.as_str())
    }

    /// The live status board.
    pub fn status(&self) -> StatusBoard {
        self.status.clone()
    }

    /// The rollout view.
    pub fn rollouts(&self) -> Rollouts {
        self.rollouts.clone()
    }

    /// The forwarder's counters.
    pub fn proxy_stats(&self) -> Arc<ProxyStats> {
        self.proxy.stats()
    }

    /// The way to hold observing while forwarding goes on: see [`crate::Gate`].
    pub fn observer_gate(&self) -> crate::Gate {
        self.pipeline.observer.gate()
    }

    /// The observer's counters.
    pub fn tap_stats(&self) -> Arc<ObserverStats> {
        self.tap_stats.clone()
    }

    /// The span exporter's counters.
    pub fn span_stats(&self) -> Arc<SpanStats> {
        self.span_stats.clone()
    }

    /// Forwards until `shutdown` resolves; then stops accepting, gives open streams the grace
    /// period, delivers every queued event, and flushes the spans.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        self.proxy.serve(shutdown).await;
        self.pipeline.close().await;
        if let Some((_, task)) = self.admin {
            task.abort();
        }
        if let Some(task) = self.exporter {
            if tokio::time::timeout(SPAN_FLUSH, task).await.is_err() {
                tracing::warn!("span export did not finish flushing within {SPAN_FLUSH:?}");
            }
        }
    }
}

/// Runs the tap for `config` on `listener` until `shutdown` resolves.
pub async fn run(
    config: Config,
    listener: Listener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    Server::new(config)
        .start(listener)
        .await?
        .serve(shutdown)
        .await;
    Ok(())
}

/// A running observation pipeline: the observer to give the proxy, and the sinks it feeds.
pub struct Pipeline {
    observer: Arc<Observer>,
    sinks: crate::queue::Sinks,
}

/// How a [`Pipeline`] is set up.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    /// Events waiting for the sinks before new ones are dropped and counted.
    pub queue_capacity: usize,
    /// Largest message decoded, bytes.
    pub decode_limit: u64,
    /// Bytes forwarded and waiting to be observed (see [`Observer::new`]).
    pub observe_backlog: u64,
}

impl Pipeline {
    /// Starts the sinks (log lines, then `sinks`) on their own thread; the observer counts
    /// into `stats`.
    pub fn start(
        options: PipelineOptions,
        stats: Arc<ObserverStats>,
        sinks: Vec<Box<dyn crate::queue::Sink>>,
    ) -> std::io::Result<Pipeline> {
        let mut all: Vec<Box<dyn crate::queue::Sink>> = vec![Box::new(crate::outputs::LogSink)];
        all.extend(sinks);
        let (events, sinks) = crate::queue::Sinks::start(options.queue_capacity, all)?;
        Ok(Pipeline {
            observer: Arc::new(Observer::new(
                events,
                stats,
                options.decode_limit,
                usize::try_from(options.observe_backlog).unwrap_or(usize::MAX),
            )?),
            sinks,
        })
    }

    /// The observer for [`crate::proxy::Proxy::new`].
    pub fn observer(&self) -> Arc<dyn Observe> {
        self.observer.clone()
    }

    /// Observes what was forwarded, delivers what is queued, then drops the sinks (exporters
    /// flush on drop of their sink).
    pub async fn close(self) {
        self.observer.flush().await;
        self.sinks.close().await;
    }
}

/// How this tap names itself among a tier's: its admin address, or, listening on every
/// interface (as in a pod), its host name with the port.
fn tap_name(address: &str) -> String {
    let text = address.to_string();
    let any = ["0.0.0.0:", "[::]:"].iter().any(|p| text.starts_with(p));
    match (any, std::env::var("HOSTNAME")) {
        (true, Ok(host)) if !host.is_empty() => {
            let port = text.rsplit(':').next().unwrap_or("");
            format!("{host}:{port}")
        }
        _ => text,
    }
}
