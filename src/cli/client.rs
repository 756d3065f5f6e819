//! The CLI's way to running taps: the tap crate's fan-in ([`xdstap::fanin`]) on a small
//! runtime of its own, and what its errors mean as exit codes.

use std::future::Future;
use std::process::ExitCode;

use super::{EX_UNAVAILABLE, EX_USAGE};
pub use xdstap::fanin::{AdminClient, AskError};

/// Runs `f` on a one-thread runtime: the CLI's commands are small clients.
pub fn block_on<F: Future>(f: F) -> Result<F::Output, ExitCode> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Ok(rt.block_on(f)),
        Err(e) => {
            eprintln!("xdstap: cannot start the runtime: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// A failed ask as the command's exit: 64 for a bad `--admin`, 3 for a node no tap knows, 69
/// when the tap cannot be reached or failed; said on standard error.
pub trait Exit {
    /// Says why, for `command`, and gives the exit code.
    fn exit(&self, command: &str) -> ExitCode;
}

impl Exit for AskError {
    fn exit(&self, command: &str) -> ExitCode {
        match self {
            AskError::Address { .. } | AskError::Uri { .. } => {
                eprintln!("error: --admin: {self}");
                ExitCode::from(EX_USAGE)
            }
            AskError::Call { status, .. } if status.code() == tonic::Code::NotFound => {
                eprintln!("xdstap {command}: {self}");
                ExitCode::from(super::EX_NO_NODE)
            }
            _ => {
                eprintln!("xdstap {command}: {self}");
                ExitCode::from(EX_UNAVAILABLE)
            }
        }
    }
}
