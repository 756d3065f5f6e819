//! Generates the gRPC code of `proto/` (the tap's own API, and the CSDS subset it serves) with
//! prost and tonic, compiling the protos with protox: no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/xdstap/v1/tap.proto",
        "proto/envoy/service/status/v3/csds.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
