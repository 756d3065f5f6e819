//! Several taps asked as one, as people read it: `--admin` names them (repeated,
//! comma-separated, or a DNS name that resolves to every replica); the asking and merging are
//! the tap crate's ([`xdstap::fanin`], which a tap's admin server uses for its peers too); here,
//! what a partial answer says and how it exits.

use std::process::ExitCode;

use xdstap::api::v1::TapAnswer;
pub use xdstap::fanin::{is_partial, rollouts, split, status, Fleet};

/// Says on standard error, for `command`, which taps did not answer, when some did not; and
/// whether some did not.
pub fn warn_partial(command: &str, taps: &[TapAnswer]) -> bool {
    let partial = is_partial(taps);
    if partial {
        eprintln!("xdstap {command}: {}", not_all(taps));
    }
    partial
}

/// `partial answer: N of M taps did not answer (A, B)`.
pub fn not_all(taps: &[TapAnswer]) -> String {
    let missing: Vec<&str> = (taps.iter())
        .filter(|t| !t.error.is_empty())
        .map(|t| t.admin.as_str())
        .collect();
    format!(
        "partial answer: {} of {} taps did not answer ({})",
        missing.len(),
        taps.len(),
        missing.join(", ")
    )
}

/// A command's exit code: 1 when something is wrong, else 4 when some tap did not answer (an
/// all-clear from some taps is no all-clear), else 0.
pub fn exit(problem: bool, partial: bool) -> ExitCode {
    ExitCode::from(match (problem, partial) {
        (true, _) => 1,
        (false, true) => super::EX_PARTIAL,
        (false, false) => 0,
    })
}

/// The exit code of an answer that found nothing: `code`, or 4 when some tap did not answer
/// (it may hold what was asked for).
pub fn not_found(code: u8, partial: bool) -> ExitCode {
    ExitCode::from(if partial { super::EX_PARTIAL } else { code })
}

/// The lines that name the taps that answered on several addresses (one tap, whatever it is
/// called), for under a table; none when each answered on one.
pub fn also_lines(taps: &[TapAnswer]) -> String {
    let mut out = String::new();
    for t in taps.iter().filter(|t| !t.also.is_empty()) {
        out.push_str(&format!(
            "\ntap {} also answered as {} (counted once)",
            t.admin,
            t.also.join(", ")
        ));
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// The lines that name the taps that did not answer (none when all did), for under a table.
pub fn missing_lines(taps: &[TapAnswer]) -> String {
    let missing: Vec<&TapAnswer> = taps.iter().filter(|t| !t.error.is_empty()).collect();
    if missing.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\nPARTIAL: {} of {} taps did not answer; what they see is missing above:\n",
        missing.len(),
        taps.len()
    );
    for t in missing {
        out.push_str(&format!("  {}\n", t.error));
    }
    out
}
