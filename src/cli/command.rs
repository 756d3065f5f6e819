//! The `xdstap` command: parse the command line, set up logging and the runtime, run the
//! command asked for. Exits 64 (EX_USAGE) on any bad flag, file or value, naming it.

use std::process::ExitCode;

use crate::cli::{Cli, Color, Command, EX_USAGE};
use clap::{ArgMatches, CommandFactory, FromArgMatches};
use xdstap::config::{Config, LogFormat, Options};
use xdstap::proxy::Listener;

/// The `xdstap` binary's `main`: runs the command its arguments name.
pub fn main() -> ExitCode {
    let parsed = xdstap::config::with_defaults(Cli::command())
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    let (cli, matches) = match parsed {
        Ok(p) => p,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let flags = matches.subcommand().map(|(_, m)| m);
    match cli.command {
        Command::CheckConfig(args) => check_config(&args.file, flags),
        Command::Run(args) => match config(args.config.as_deref(), flags) {
            Ok(config) => run(config),
            Err(code) => code,
        },
        Command::Demo(args) => demo(args),
        Command::Status(args) => crate::cli::status::run(&args),
        Command::Rollout(args) => crate::cli::rollout::run(&args),
        Command::Wait(args) => crate::cli::wait::run(&args),
        Command::Watch(args) => crate::cli::watch::run(&args),
    }
}

fn usage_error(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(EX_USAGE)
}

/// The file's options (if any) with the flags given on top, validated.
fn config(file: Option<&std::path::Path>, flags: Option<&ArgMatches>) -> Result<Config, ExitCode> {
    let options = match file {
        Some(f) => Options::from_file(f).map_err(usage_error)?,
        None => Options::default(),
    };
    let options = match flags {
        Some(m) => options.with_flags(m).map_err(usage_error)?,
        None => options,
    };
    options.resolve().map_err(usage_error)
}

fn check_config(file: &std::path::Path, flags: Option<&ArgMatches>) -> ExitCode {
    let config = match config(Some(file), flags) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Err(e) = (config.check_outputs())
        .and(config.tls_acceptor().map(drop))
        .and(config.upstream_connector().map(drop))
    {
        return usage_error(e);
    }
    println!(
        "{}: valid (listen {}, upstream {})",
        file.display(),
        config.listen,
        config.upstream
    );
    ExitCode::SUCCESS
}

/// Raises the soft limit of open files to the hard one: each client holds one descriptor, and
/// one more to the control plane. Returns the limit in effect, when it can be read.
#[allow(unsafe_code)] // the library forbids it; two libc calls here, each with its SAFETY note
fn raise_open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    let was = limit.rlim_cur;
    if was >= limit.rlim_max {
        return Some(was);
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: as above.
    match unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
        true => {
            tracing::info!(
                from = was,
                to = limit.rlim_max,
                "Raised the open files limit"
            );
            Some(limit.rlim_max)
        }
        false => {
            tracing::warn!(limit = was, "Could not raise the open files limit");
            Some(was)
        }
    }
}

fn runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        builder.worker_threads(n);
    }
    builder.enable_all().build().map_err(|e| {
        eprintln!("xdstap: cannot start the runtime: {e}");
        ExitCode::FAILURE
    })
}

fn run(config: Config) -> ExitCode {
    if let Err(e) = config.check_outputs() {
        return usage_error(e);
    }
    init_logging(config.log_format, &config.log_level);
    let mut config = config;
    if let (Some(open_files), Some(admin)) = (raise_open_files_limit(), config.admin.as_mut()) {
        admin.max_connections = xdstap::config::connections_for(open_files);
    }
    let runtime = match runtime(Some(config.threads)) {
        Ok(r) => r,
        Err(code) => return code,
    };
    runtime.block_on(async {
        let listener = match Listener::bind(&config.listen).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("cannot listen on {}: {e}", config.listen);
                return ExitCode::FAILURE;
            }
        };
        match xdstap::run(config, listener, shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.is_usage() => usage_error(e),
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        }
    })
}

fn demo(args: crate::cli::DemoArgs) -> ExitCode {
    use std::io::IsTerminal;
    if args.client == crate::cli::Client::Builtin && args.envoy.is_some() {
        return usage_error("--envoy cannot be used with --client builtin");
    }
    let spans = match args.spans.resolve() {
        Ok(s) => s,
        Err(e) => return usage_error(e),
    };
    init_logging(LogFormat::Text, "error");
    let options = crate::demo::DemoOptions {
        json: args.json,
        color: match args.color {
            Color::Always => true,
            Color::Never => false,
            Color::Auto => std::io::stdout().is_terminal(),
        },
        client: args.client,
        envoy: args.envoy,
        spans,
        admin: args.admin,
    };
    let runtime = match runtime(None) {
        Ok(r) => r,
        Err(code) => return code,
    };
    match runtime.block_on(crate::demo::run(options)) {
        Ok(outcome) if outcome.ok => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("xdstap demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The first SIGTERM, SIGINT or SIGHUP starts a graceful stop (open streams get the grace to
/// finish); a second one of any stops the process at once.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(term), Ok(int), Ok(hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    let mut signals = [term, int, hup];
    let first = next_signal(&mut signals).await;
    tracing::info!("{first} received: stopping gracefully (a second signal stops at once)");
    tokio::spawn(async move {
        let second = next_signal(&mut signals).await;
        tracing::warn!("{second} received: stopping now");
        std::process::exit(1);
    });
}

/// The name of the next of SIGTERM, SIGINT, SIGHUP to arrive.
async fn next_signal(signals: &mut [tokio::signal::unix::Signal; 3]) -> &'static str {
    let [term, int, hup] = signals;
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = hup.recv() => "SIGHUP",
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
