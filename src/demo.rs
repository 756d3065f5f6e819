//! `xdstap demo`: the whole story in one process. An embedded SotW ADS control plane serves
//! real Envoy config through the tap (assembled by [`xdstap::server`], as `xdstap run` does) to a
//! real Envoy, installed into the project-local `.envoy/` when none is found, or, where none can
//! run, a built-in client that says it is a stand-in.
//!
//! - [`messages`]: the hand-encoded Envoy config and xDS messages, and the gRPC pipe.
//! - [`control_plane`]: the embedded ADS server.
//! - [`client`]: the built-in stand-in client.
//! - [`envoy`]: finding, installing, bootstrapping and running a real Envoy (the tests' too).
//! - [`printer`]: the timeline.
//! - [`story`]: the steps, and what they must show.

pub mod client;
pub mod control_plane;
pub mod envoy;
pub mod messages;
pub mod printer;
pub mod story;

pub use story::{run, DemoOptions};
