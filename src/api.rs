//! The gRPC messages and services of `proto/`, generated at build time (`build.rs`): the tap's
//! own API (`xdstap.v1.Tap`), which the CLI reads, and the part of CSDS the tap serves; and the
//! views' reports converted to and from its messages.

mod convert;

/// Every message and service of `proto/`, as an encoded `FileDescriptorSet`: what gRPC server
/// reflection serves, so `grpcurl` lists and calls the API without the protos at hand.
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

/// `xdstap.v1`: status, rollouts and watch.
#[allow(clippy::all, missing_docs)]
pub mod tap {
    tonic::include_proto!("xdstap.v1");
}

/// `envoy.service.status.v3`: the Client Status Discovery Service, the fields the tap fills.
#[allow(clippy::all, missing_docs)]
pub mod csds {
    tonic::include_proto!("envoy.service.status.v3");
}
