//! # xdstap
//!
//! A transparent tap between xDS clients and their control plane. It forwards HTTP/2 unchanged,
//! decodes the xDS messages as they pass, and pairs every config push with the ACK or NACK that
//! answers it.
//!
//! # Layout
//! - [`proxy`]: listen, dial upstream, forward streams frame by frame; knows no gRPC or xDS.
//! - [`config`]: the YAML file and flags, validated into settings; errors name the option.
//! - [`cli`]: the command line.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod proxy;
pub mod grpc;
