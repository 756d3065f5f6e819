//! # xdstap
//!
//! A transparent tap between xDS clients and their control plane. It forwards HTTP/2 unchanged,
//! decodes the xDS messages as they pass, and pairs every config push with the ACK or NACK that
//! answers it.
//!
//! # Layout
//! Along the data flow; each module imports only from those before it.
//! - [`proxy`]: listen, dial upstream, forward streams frame by frame; knows no gRPC or xDS.
//! - [`grpc`]: gRPC message framing, streamed.
//! - [`xds`]: method classification and the streaming decoder of the four xDS messages.
//! - [`correlate`]: the pure state machine that pairs pushes with answers.
//! - [`observe`]: the bounded event queue and its sinks: log lines, the JSON-lines event log,
//!   OTLP spans, the status board, Prometheus metrics.
//! - [`tap`]: the proxy's observer: framing -> decode -> correlate -> queue, inline.
//! - [`admin`]: the admin HTTP server (`/status`, `/metrics`, `/healthz`, `/readyz`).
//! - [`config`], [`cli`]: settings and the command line; [`status`]: `xdstap status`.
//! - [`demo`]: the embedded control plane and client of `xdstap demo`.
#![forbid(unsafe_code)]

pub mod admin;
pub mod cli;
pub mod config;
pub mod correlate;
pub mod demo;
pub mod grpc;
pub mod observe;
pub mod proxy;
pub mod status;
pub mod tap;
pub mod xds;
