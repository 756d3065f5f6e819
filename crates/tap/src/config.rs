//! The options, defined once: [`Options`] is both the flags (clap) and the YAML file's keys
//! (serde), and every flag's clap id is its YAML key (`admin.stale_after` is `--stale-after`).
//! A file is read into `Options`, the flags given replace what they name, and
//! [`Options::resolve`] validates the result into a [`Config`], one function per section. Every
//! error names the option, its flag and the bad value; `main` exits 64 (EX_USAGE) on any of them.
//! `values` holds the types options parse into, `options` what was given, `resolve` what it
//! means.

use std::fmt;
use std::path::PathBuf;

pub use crate::outputs::spans::{Grouping, Protocol, SpanSettings};
use crate::proxy::Settings;
pub use crate::views::board::StatusSettings;
pub use crate::views::rollout::RolloutSettings;

/// Admin connections open at once at most (watchers and CSDS streams hold one each), whatever
/// the open-files limit.
pub const MAX_CONNECTIONS: usize = 256;

/// Admin connections allowed under a limit of `open_files` descriptors: an eighth of it (from 4
/// to [`MAX_CONNECTIONS`]), so the rest stays for the xDS side, where each client holds two.
pub fn connections_for(open_files: u64) -> usize {
    let share = usize::try_from(open_files / 8).unwrap_or(usize::MAX);
    share.clamp(4, MAX_CONNECTIONS)
}

mod options;
mod resolve;
mod values;

pub use options::{AdminOptions, LogOptions, Options, SpanOptions, TlsOptions, UpstreamTlsOptions};
pub use resolve::{AdminSettings, Config};
pub use values::{
    AdminAddress, Count, HumanDuration, LogFormat, Parsed, Size, UnknownName, ValueError,
};

/// Where the admin server listens unless told otherwise.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9977";
/// Events waiting for the sinks unless told otherwise.
pub const DEFAULT_EVENT_QUEUE: usize = 16_384;
/// The largest message decoded unless told otherwise (bigger ones are forwarded and counted).
pub const DEFAULT_DECODE_LIMIT: u64 = 256 << 20;
/// Bytes forwarded and waiting to be observed unless told otherwise.
pub const DEFAULT_OBSERVE_BACKLOG: u64 = 2 << 20;

/// Worker threads unless `--threads` says otherwise: one is the cheapest per byte.
pub const DEFAULT_THREADS: usize = 1;

/// The log filter unless `--log-level` says otherwise.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// Each option's default as `--help` shows it (by arg id, which is its YAML key), taken from
/// the values [`Options::resolve`] falls back on, so help and behaviour cannot drift apart.
pub fn defaults() -> Vec<(&'static str, String)> {
    let (proxy, status) = (Settings::default(), StatusSettings::default());
    let (spans, rollout) = (SpanSettings::default(), RolloutSettings::default());
    let d = |d: std::time::Duration| HumanDuration(d).to_string();
    vec![
        ("drain_delay", d(proxy.drain_delay)),
        ("shutdown_grace", d(proxy.shutdown_grace)),
        ("connect_timeout", d(proxy.connect_timeout)),
        ("threads", DEFAULT_THREADS.to_string()),
        ("log.format", LogFormat::default().to_string()),
        ("log.level", DEFAULT_LOG_LEVEL.to_string()),
        ("decode_limit", Size(DEFAULT_DECODE_LIMIT).to_string()),
        ("observe_backlog", Size(DEFAULT_OBSERVE_BACKLOG).to_string()),
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
    let command = <Options as clap::Args>::augment_args(clap::Command::new("xdstap"));
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::CommandFactory;

    use super::options::name_the_key;
    use super::*;
    use crate::proxy::Endpoint;

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
        assert_eq!("10m".parse::<HumanDuration>().unwrap().to_string(), "10m");
        assert_eq!(
            "500ms".parse::<HumanDuration>().unwrap().to_string(),
            "500ms"
        );
        assert_eq!("1000".parse::<Size>().unwrap().to_string(), "1000");
    }

    #[test]
    fn the_documented_config_file_states_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/xdstap.yaml");
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
        let d = |s: &str| s.parse::<HumanDuration>().map(|d| d.0);
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
