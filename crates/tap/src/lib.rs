//! # xdstap
//!
//! A transparent tap between xDS clients and their control plane. It forwards HTTP/2 unchanged,
//! decodes the xDS messages as they pass, and pairs every config push with the ACK or NACK that
//! answers it.
//!
//! # Layout
//! Along the data flow:
//! - [`proxy`]: listen, dial upstream, forward streams; knows HTTP/2 and nothing of gRPC or xDS.
//! - `grpc`, `xds`, `correlate`: the core, from the `xdstap-core` crate (gRPC message framing,
//!   the streaming decoder of the four xDS messages, the pure state machine that pairs pushes
//!   with answers); no runtime, no clock, no I/O, as Cargo holds.
//! - `observer`: the proxy's observer: framing -> decode -> correlate, inline, events handed
//!   to the queue; the observing side's counters and clock.
//! - `record`: one verdict as one flat record, built once on the sinks' thread for every
//!   output and view that reads it.
//! - `queue`: the bounded event queue and the sinks' thread that drains it.
//! - `views`: what the tap keeps to be asked: the status board (and the object view it
//!   answers), the rollout view, the watchers, and the trace each verdict's span is in.
//! - `outputs`: what the tap writes for others: log lines, the JSON-lines event log, OTLP
//!   spans, Prometheus metrics.
//! - [`api`]: the gRPC code generated from `proto/` (the tap's own API, CSDS), and the one
//!   projection of the core's verdicts into its messages, which the record and every view read.
//! - `clock`: the tap's one clock, and the one way it writes times.
//! - `admin`: the admin server, HTTP/1.1 and HTTP/2 on one address: `/status`, `/rollouts`,
//!   `/metrics`, `/healthz`, `/readyz`, and over gRPC the tap's API and CSDS.
//! - [`config`]: the options (flags and YAML keys, one definition) and their validation.
//! - [`fanin`]: several taps asked as one over their API (the CLI's commands, and `/status` of
//!   a tap with `admin.peers`), their reports merged.
//! - [`server`]: the assembly: a config and a listener become a running tap ([`run`]).
//!
//! The command line (`xdstap run`, the commands that ask a running tap, the demo) is the
//! `xdstap-cli` crate, which uses this one as any embedder does.
//!
//! # Embedding
//! A program runs a tap with [`Server`], adds sinks of its own (each event, on the sinks'
//! thread) and reads the views while it runs; every type it needs is named from here:
//! ```
//! use xdstap::core::correlate::{Event, Verdict};
//!
//! /// Counts the NACKs the tap sees.
//! struct Nacks(u64);
//!
//! impl xdstap::Sink for Nacks {
//!     fn on_event(&mut self, event: &Event) {
//!         if let Event::Verdict { verdict: Verdict::Nack { .. }, .. } = event {
//!             self.0 += 1;
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> anyhow::Result<()> {
//! let flags = [
//!     "--listen", "127.0.0.1:0",
//!     "--upstream", "istiod.istio-system:15010",
//!     "--admin", "off",
//! ];
//! let config = xdstap::config::Options::from_flags(flags)?.resolve()?;
//! let listener = xdstap::proxy::Listener::bind(&config.listen).await?;
//! let running = xdstap::Server::new(config)
//!     .with_sink(Box::new(Nacks(0)))
//!     .start(listener)
//!     .await?;
//! let board: xdstap::StatusBoard = running.status();
//! assert!(board.report(xdstap::now(), None).nodes.is_empty());
//! // Serves until the future given resolves: a signal, a channel; here, at once.
//! running.serve(std::future::ready(())).await;
//! # Ok(())
//! # }
//! ```
//!
//! # One-way rules
//! Checked by `tests/it/layout.rs`:
//! - `proxy` imports nothing from the core, `observer`, `queue`, `views` or `outputs`.
//! - `observer` -> `queue` (and the `record` it builds) -> `views` -> `outputs`: each uses
//!   nothing after it (but the observer its queue), and none uses `admin`, which serves them.
//! - the core reads no clock; its `correlate` imports only from `xds`.
//! - The command line is another crate (`xdstap-cli`), which sees only this public API.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod api;
pub mod config;
pub mod fanin;
pub mod proxy;
pub mod server;

// The one clock, and how times are written.
mod clock;

// Modules the public API does not need: public with the `internals` feature (the crate's own
// tests, benches and fuzz targets turn it on; no stability is promised), private without.
// Declared one by one, not by a macro, so that rustfmt sees (and formats) every one.
#[cfg(feature = "internals")]
pub mod admin;
#[cfg(not(feature = "internals"))]
mod admin;
#[cfg(feature = "internals")]
pub mod observer;
#[cfg(not(feature = "internals"))]
mod observer;
#[cfg(feature = "internals")]
pub mod outputs;
#[cfg(not(feature = "internals"))]
mod outputs;
#[cfg(feature = "internals")]
pub mod queue;
#[cfg(not(feature = "internals"))]
mod queue;
#[cfg(feature = "internals")]
pub mod record;
#[cfg(not(feature = "internals"))]
mod record;
#[cfg(feature = "internals")]
pub mod views;
#[cfg(not(feature = "internals"))]
mod views;

// The core (xdstap-core: framing, decoding, correlation), where the rest of the crate finds it.
#[cfg(feature = "internals")]
pub use xdstap_core::{correlate, grpc, xds};
#[cfg(not(feature = "internals"))]
use xdstap_core::{correlate, grpc, xds};

pub use server::{run, Running, Server};

/// The core the tap is built on (framing, decoding, correlation): the events sinks receive.
pub use xdstap_core as core;

pub use clock::{now, parse_rfc3339, rfc3339};
pub use observer::{Gate, Held, ObserverStats};
pub use outputs::spans::SpanStats;
pub use outputs::{Recorded, Recorder};
pub use queue::{Delivered, Sink};
pub use record::{Subject, VerdictRecord};
pub use views::board::objects::{ObjectSpec, ObjectSpecError};
pub use views::board::resources::{NodeResources, ResourceRow};
pub use views::board::StatusBoard;
pub use views::rollout::Rollouts;
