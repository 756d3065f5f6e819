//! The `xdstap` binary: parse the command line, set up logging, run. Exits 64 (EX_USAGE) on any
//! bad flag, file or value, naming it.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use xdstap::cli::{Cli, Command};
use xdstap::config::{Config, FileConfig, LogFormat};
use xdstap::proxy::{Connector, Listener, Proxy};

const EX_USAGE: u8 = 64;
/// EX_UNAVAILABLE: the tap's admin server could not be asked.
const EX_UNAVAILABLE: u8 = 69;
/// Events waiting for the sinks before new ones are dropped (and counted).
const EVENT_QUEUE: usize = 16_384;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::CheckConfig(args) => {
            let file = match FileConfig::load(&args.file) {
                Ok(f) => f,
                Err(e) => return usage_error(e),
            };
            match Config::resolve(file, args.options.overrides()).and_then(|c| {
                check_tls(&c)?;
                Ok(c)
            }) {
                Ok(c) => {
                    println!(
                        "{}: valid (listen {}, upstream {})",
                        args.file.display(),
                        c.listen,
                        c.upstream
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => usage_error(e),
            }
        }
        Command::Demo(args) => {
            use std::io::IsTerminal;
            let color = match args.color.as_str() {
                "always" => true,
                "never" => false,
                "auto" => std::io::stdout().is_terminal(),
                other => {
                    return usage_error(format!(
                        "invalid --color {other:?}: expected auto, always or never"
                    ))
                }
            };
            init_logging(LogFormat::Text, "error");
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("xdstap: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let client = match (args.client.as_str(), args.envoy) {
                ("auto", Some(p)) | ("envoy", Some(p)) => {
                    xdstap::demo::ClientChoice::Envoy(Some(p))
                }
                ("auto", None) => xdstap::demo::ClientChoice::Auto,
                ("envoy", None) => xdstap::demo::ClientChoice::Envoy(None),
                ("builtin", None) => xdstap::demo::ClientChoice::Builtin,
                ("builtin", Some(_)) => {
                    return usage_error("--envoy cannot be used with --client builtin")
                }
                (other, _) => {
                    return usage_error(format!(
                        "invalid --client {other:?}: expected auto, envoy or builtin"
                    ))
                }
            };
            let spans =
                match xdstap::config::spans_from_flags(args.otlp_endpoint, args.otlp_protocol) {
                    Ok(s) => s,
                    Err(e) => return usage_error(e),
                };
            match runtime.block_on(xdstap::demo::run(xdstap::demo::DemoOptions {
                json: args.json,
                color,
                client,
                spans,
            })) {
                Ok(outcome) if outcome.ok => ExitCode::SUCCESS,
                Ok(_) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("xdstap demo: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Status(args) => {
            let wide = match args.output.as_str() {
                "table" => false,
                "wide" => true,
                "json" => false,
                other => {
                    return usage_error(format!(
                        "invalid --output {other:?}: expected table, wide or json"
                    ))
                }
            };
            match xdstap::status::fetch(&args.admin, args.node.as_deref()) {
                Ok(report) => {
                    if args.output == "json" {
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&report).unwrap_or_default()
                        );
                    } else {
                        print!("{}", xdstap::status::render(&report, wide));
                    }
                    if xdstap::status::has_problems(&report) {
                        ExitCode::from(1)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(xdstap::status::FetchError::Address(a, e)) => {
                    usage_error(format!("invalid --admin {a:?}: {e}"))
                }
                Err(e) => {
                    eprintln!("xdstap status: {e}");
                    ExitCode::from(EX_UNAVAILABLE)
                }
            }
        }
        Command::Run(args) => {
            let file = match args.config.as_deref().map(FileConfig::load).transpose() {
                Ok(f) => f.unwrap_or_default(),
                Err(e) => return usage_error(e),
            };
            let config = match Config::resolve(file, args.options.overrides()) {
                Ok(c) => c,
                Err(e) => return usage_error(e),
            };
            init_logging(config.log_format, &config.log_level);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(config.threads)
                .enable_all()
                .build();
            let runtime = match runtime {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("xdstap: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(RunError::Usage(e)) => usage_error(e),
                Err(RunError::Other(e)) => {
                    tracing::error!("{e:#}");
                    eprintln!("xdstap: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn usage_error(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("xdstap: {e}");
    ExitCode::from(EX_USAGE)
}

enum RunError {
    Usage(xdstap::config::ConfigError),
    Other(anyhow::Error),
}

/// Builds the TLS pieces, so a bad certificate file is a usage error naming the option.
fn check_tls(config: &Config) -> Result<TlsParts, xdstap::config::ConfigError> {
    use xdstap::config::ConfigError;
    let acceptor = match &config.tls {
        Some(t) => Some(t.acceptor().map_err(|e| ConfigError::Invalid {
            option: "tls (--tls-cert/--tls-key/--tls-client-ca)".into(),
            value: t.cert.display().to_string(),
            reason: e.to_string(),
        })?),
        None => None,
    };
    let connector =
        match &config.upstream_tls {
            Some(t) => Some(t.connector(config.upstream.host()).map_err(|e| {
                ConfigError::Invalid {
                    option:
                        "upstream_tls (--upstream-ca/--upstream-cert/--upstream-key/--upstream-sni)"
                            .into(),
                    value: config.upstream.to_string(),
                    reason: e.to_string(),
                }
            })?),
            None => None,
        };
    Ok(TlsParts {
        acceptor,
        connector,
    })
}

struct TlsParts {
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    connector: Option<(
        tokio_rustls::TlsConnector,
        tokio_rustls::rustls::pki_types::ServerName<'static>,
    )>,
}

async fn run(config: Config) -> Result<(), RunError> {
    let tls = check_tls(&config).map_err(RunError::Usage)?;
    let listener = Listener::bind(&config.listen, tls.acceptor)
        .await
        .map_err(|e| RunError::Other(anyhow::anyhow!("cannot listen on {}: {e}", config.listen)))?;
    let mut sinks: Vec<Box<dyn xdstap::observe::Sink>> = Vec::new();
    if let Some(path) = &config.event_log {
        let log = xdstap::observe::eventlog::EventLog::open(path).map_err(|e| {
            RunError::Usage(xdstap::config::ConfigError::Invalid {
                option: "event_log (--event-log)".into(),
                value: path.display().to_string(),
                reason: e.to_string(),
            })
        })?;
        sinks.push(Box::new(log));
    }
    let span_stats = Arc::new(xdstap::observe::spans::SpanStats::default());
    let mut exporter = None;
    if let Some(settings) = config.spans.clone() {
        let endpoint = settings
            .endpoint
            .clone()
            .unwrap_or_else(|| "OTEL_EXPORTER_OTLP_ENDPOINT".into());
        let (sink, task) = xdstap::observe::spans::start(settings, span_stats.clone())
            .map_err(|e| RunError::Other(e.into()))?;
        tracing::info!(%endpoint, "Exporting spans");
        sinks.push(Box::new(sink));
        exporter = Some(task);
    }
    let status = xdstap::observe::status::StatusBoard::new(
        config
            .admin
            .as_ref()
            .map(|a| a.status.clone())
            .unwrap_or_default(),
    );
    sinks.push(Box::new(status.clone()));
    // Bind the admin server before anything is forwarded, so a bad address fails the start.
    let admin_listener = match &config.admin {
        Some(a) => Some(
            xdstap::admin::AdminListener::bind(&a.address)
                .await
                .map_err(|e| {
                    RunError::Other(anyhow::anyhow!(
                        "cannot listen on admin address {} (--admin): {e}",
                        a.address
                    ))
                })?,
        ),
        None => None,
    };
    // The metrics read the pipeline's counters, which exist once it starts; the sink that
    // counts pushes joins the sinks through a handle filled in below.
    let pushes = xdstap::observe::metrics::PushSlot::default();
    sinks.push(Box::new(pushes.clone()));
    let pipeline = xdstap::tap::Pipeline::start(
        xdstap::tap::PipelineOptions {
            queue_capacity: EVENT_QUEUE,
            decode_limit: config.decode_limit,
            recorded_events: 0,
        },
        sinks,
    );
    let observer: Arc<dyn xdstap::proxy::Observe> = pipeline.tap.clone();
    let proxy = Proxy::new(
        listener,
        Connector::new(config.upstream.clone(), tls.connector),
        config.proxy.clone(),
        observer,
    );
    let (registry, push_metrics) =
        xdstap::observe::metrics::registry(xdstap::observe::metrics::Sources {
            proxy: proxy.stats(),
            tap: pipeline.stats.clone(),
            spans: span_stats.clone(),
            status: status.clone(),
        });
    pushes.fill(push_metrics);
    let admin_task = admin_listener.map(|l| {
        tracing::info!(admin = %l.local_addr(), "Admin server listening (/status /metrics /healthz /readyz)");
        tokio::spawn(xdstap::admin::serve(
            l,
            Arc::new(xdstap::admin::Admin {
                status: status.clone(),
                registry,
                upstream: config.upstream.clone(),
            }),
        ))
    });
    tracing::info!(listen = %proxy.local_addr(), upstream = %config.upstream, "Listening");
    proxy.serve(shutdown_signal()).await;
    pipeline.close().await;
    if let Some(t) = admin_task {
        t.abort();
    }
    if let Some(task) = exporter {
        if tokio::time::timeout(std::time::Duration::from_secs(15), task)
            .await
            .is_err()
        {
            tracing::warn!("span export did not finish flushing within 15s");
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
