//! `xdstap wait --version V`: what `istioctl x wait` should have been. It asks the tap's
//! rollout view a few times a second and returns once every node that was pushed V (of the
//! types asked for) has answered it:
//! - 0 when every one accepted it, or moved on to a newer push before answering (superseded);
//! - 1 as soon as any node rejected it: a NACK is a failure, never progress;
//! - 2 on timeout, naming who is pending and who never answered.
//!
//! Nodes never pushed V are not waited for. Until V has been pushed at all, it waits for its
//! first push (up to the timeout). A node whose stream ended before it answered (the control
//! plane restarted, say) is waited for until V is pushed to it again on its new stream. Once
//! nothing is pending it still waits `--settle` past V's last push, for nodes the control plane
//! has yet to push it to.

use super::client::Exit;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::client::block_on;
use super::fleet::{self, Fleet};
use super::rollout::details;
use super::{WaitArgs, EX_PARTIAL};
use xdstap::api::v1::Rollout;

/// How often the taps are asked.
const POLL: Duration = Duration::from_millis(100);

/// Where a rollout, or an object, stands for `wait`.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every node pushed the version accepted it or moved on; every node an object reaches
    /// took it. Nothing more expected.
    Accepted,
    /// Some node rejected it.
    Rejected,
    /// Not yet.
    Waiting,
}

/// The verdict on the rollouts of one version (one per type), `settle` past their last push.
pub fn outcome(rollouts: &[Rollout], settle: Duration) -> Outcome {
    if rollouts.iter().any(|r| r.nacked > 0) {
        return Outcome::Rejected;
    }
    let settled = |r: &Rollout| {
        r.pending == 0 && r.unanswered == 0 && r.since_last_push_seconds >= settle.as_secs_f64()
    };
    match !rollouts.is_empty() && rollouts.iter().all(settled) {
        true => Outcome::Accepted,
        false => Outcome::Waiting,
    }
}

/// `xdstap wait`.
pub fn run(args: &WaitArgs) -> ExitCode {
    block_on(wait(args)).unwrap_or_else(|code| code)
}

async fn wait(args: &WaitArgs) -> ExitCode {
    let started = Instant::now();
    let deadline = started + args.timeout.0;
    let mut taps = match Fleet::resolve(&args.admin.admin).await {
        Ok(f) => f,
        Err(e) => return e.exit("wait"),
    };
    let Some(version) = args.version.as_deref() else {
        return super::objects::wait(args, &mut taps, started).await;
    };
    loop {
        let report = match super::rollout::fetch(&mut taps, Some(version), &args.types).await {
            Ok(r) => r,
            Err(e) => return e.exit("wait"),
        };
        let report = super::printable_copy(&report);
        let rollouts = &report.rollouts;
        // A tap that did not answer may hold nodes still to answer: never done without it.
        let partial = fleet::is_partial(&report.taps);
        let outcome = match outcome(rollouts, args.settle.0) {
            Outcome::Accepted if partial => Outcome::Waiting,
            o => o,
        };
        match outcome {
            Outcome::Accepted => {
                for r in rollouts {
                    println!("{}", summary(r));
                }
                return ExitCode::SUCCESS;
            }
            Outcome::Rejected => {
                eprintln!("xdstap wait: version {version} was rejected");
                for r in rollouts {
                    println!("{}", summary(r));
                    print!("{}", details(r, false));
                }
                print!("{}", fleet::missing_lines(&report.taps));
                return ExitCode::from(1);
            }
            Outcome::Waiting if Instant::now() >= deadline => {
                return timed_out(args, version, started, &report);
            }
            Outcome::Waiting => tokio::time::sleep(POLL).await,
        }
    }
}

/// What stands in the way at the deadline: 4 when only taps that do not answer do, else 2.
fn timed_out(
    args: &WaitArgs,
    version: &str,
    started: Instant,
    report: &xdstap::api::v1::RolloutReport,
) -> ExitCode {
    let waited = humantime(started.elapsed());
    let rollouts = &report.rollouts;
    let partial = fleet::is_partial(&report.taps);
    let only_taps = partial && outcome(rollouts, args.settle.0) == Outcome::Accepted;
    if only_taps {
        eprintln!(
            "xdstap wait: timed out after {waited}: every tap that answered says version {} is \
             taken, but {}",
            version,
            fleet::not_all(&report.taps)
        );
    } else if rollouts.is_empty() {
        eprintln!(
            "xdstap wait: timed out after {waited}: version {} was never pushed{}",
            version,
            match args.types.is_empty() {
                true => String::new(),
                false => format!(" as {}", args.types.join(", ")),
            }
        );
    } else {
        eprintln!("xdstap wait: timed out after {waited}");
    }
    for r in rollouts {
        println!("{}", summary(r));
        print!("{}", details(r, false));
    }
    print!("{}", fleet::missing_lines(&report.taps));
    ExitCode::from(if only_taps { EX_PARTIAL } else { 2 })
}

fn humantime(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// One line per type: `CDS v2: 3 of 3 nodes acked (p50 12ms, max 40ms)`.
pub fn summary(r: &Rollout) -> String {
    let mut parts = vec![format!("{} acked", r.acked)];
    for (n, what) in [
        (r.nacked, "nacked"),
        (r.superseded, "superseded"),
        (r.pending, "pending"),
        (r.unanswered, "unanswered"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    format!(
        "{} {}: {} node{} pushed it: {} (push to answer p50 {:.1}ms, max {:.1}ms)",
        r.r#type,
        r.version,
        r.pushed,
        if r.pushed == 1 { "" } else { "s" },
        parts.join(", "),
        r.latency_p50_ms,
        r.latency_max_ms
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(pending: u64, nacked: u64, unanswered: u64, since: f64) -> Rollout {
        Rollout {
            pushed: 3,
            pending,
            nacked,
            unanswered,
            acked: 3 - pending - nacked - unanswered,
            since_last_push_seconds: since,
            ..Default::default()
        }
    }

    #[test]
    fn outcomes() {
        let s = Duration::from_secs(1);
        assert_eq!(outcome(&[], s), Outcome::Waiting, "never pushed yet");
        assert_eq!(outcome(&[rollout(0, 0, 0, 2.0)], s), Outcome::Accepted);
        assert_eq!(
            outcome(&[rollout(0, 0, 0, 0.5)], s),
            Outcome::Waiting,
            "settling"
        );
        assert_eq!(outcome(&[rollout(1, 0, 0, 2.0)], s), Outcome::Waiting);
        assert_eq!(outcome(&[rollout(0, 0, 1, 2.0)], s), Outcome::Waiting);
        assert_eq!(
            outcome(&[rollout(2, 1, 0, 0.0)], s),
            Outcome::Rejected,
            "at once"
        );
        let both = [rollout(0, 0, 0, 2.0), rollout(1, 0, 0, 2.0)];
        assert_eq!(outcome(&both, s), Outcome::Waiting, "every type");
    }
}
