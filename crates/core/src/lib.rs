//! # xdstap-core
//!
//! What xdstap knows of gRPC and xDS, with no I/O, no clock and no async runtime: the bytes of
//! a stream's messages go in, in the slices they arrive in, and events come out. The tap crate
//! (`xdstap`) feeds it from the connections it relays; its tests, benches and fuzz targets
//! drive it directly.
//!
//! Along the data flow:
//! - [`grpc`]: gRPC message framing, streamed.
//! - [`xds`]: method classification, the streaming decoder of the four xDS messages, and the
//!   interner that keeps a fleet's identical pushes once.
//! - [`correlate`]: the state machine that pairs every push with the answer that decides it.
//!   Time is an argument.
//!
//! Cargo keeps it so: this crate depends on no runtime, and nothing here can reach the tap.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod correlate;
pub mod grpc;
pub mod xds;
