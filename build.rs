//! Generates the gRPC code of `proto/` (the tap's own API, and the CSDS subset it serves) with
//! prost and tonic, compiling the protos with protox: no system `protoc` is needed; and their
//! encoded descriptors, which the admin server's reflection service serves.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/xdstap/v1/tap.proto",
        "proto/envoy/service/status/v3/csds.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    // The descriptors themselves, for gRPC server reflection on the admin address.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("descriptors.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
