//! # xdstap-cli
//!
//! The `xdstap` command, built on the tap (the `xdstap` crate) the way any embedder builds on
//! it: through its public API only, which Cargo holds (this crate sees nothing else).
//! - [`cli`]: subcommands and flags; its `command` owns the process (logging, limits, signals,
//!   exit codes) and runs a tap; `status`, `rollout`, `wait` and `watch` ask running taps
//!   over their gRPC API, like any remote client.
//! - [`demo`]: `xdstap demo`: an embedded control plane, a real Envoy, the story; and the Envoy
//!   launcher the tests use too.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod cli;
pub mod demo;

pub use cli::command::main;
