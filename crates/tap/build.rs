//! Generates the gRPC code of the workspace's `proto/` (the tap's own API, and the CSDS subset it serves) with
//! prost and tonic, compiling the protos with protox: no system `protoc` is needed; and their
//! encoded descriptors, which the admin server's reflection service serves. The tap's messages
//! also derive serde: they are the JSON of `/status` and `/rollouts` and of the CLI's `-o json`,
//! so the proto is the one schema. Enum fields (kept as `i32` by prost) read and write their
//! value names.

/// The tap's enum fields, and the serde module (in `src/api.rs`) that names their values.
const ENUM_FIELDS: [(&str, &str); 14] = [
    (
        ".xdstap.v1.ObjectNode.state",
        "crate::api::names::object_standing",
    ),
    (
        ".xdstap.v1.ObjectNodeResource.state",
        "crate::api::names::object_standing",
    ),
    (
        ".xdstap.v1.NodeStatus.state",
        "crate::api::names::sync_state",
    ),
    (
        ".xdstap.v1.TypeStatus.state",
        "crate::api::names::sync_state",
    ),
    (
        ".xdstap.v1.ResourceStatus.config",
        "crate::api::names::config",
    ),
    (
        ".xdstap.v1.ResourceStatus.client",
        "crate::api::names::client",
    ),
    (".xdstap.v1.Nack.scope", "crate::api::names::nack_scope"),
    (
        ".xdstap.v1.NackGroup.scope",
        "crate::api::names::nack_scope",
    ),
    (
        ".xdstap.v1.RolloutNode.state",
        "crate::api::names::standing",
    ),
    (".xdstap.v1.WatchEvent.kind", "crate::api::names::kind"),
    (".xdstap.v1.Origin.format", "crate::api::names::format"),
    (".xdstap.v1.WatchEvent.api", "crate::api::names::api"),
    (
        ".xdstap.v1.WatchEvent.nack_scope",
        "crate::api::names::nack_scope",
    ),
    (
        ".xdstap.v1.WatchRequest.kinds",
        "crate::api::names::kind::list",
    ),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The protos live at the workspace's top, beside the crates that speak them.
    let root = "../../proto";
    let protos = [
        format!("{root}/xdstap/v1/tap.proto"),
        format!("{root}/envoy/service/status/v3/csds.proto"),
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(&protos, [root])?;
    // The descriptors themselves, for gRPC server reflection on the admin address.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("descriptors.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    let mut config = tonic_prost_build::configure().message_attribute(
        ".xdstap.v1",
        "#[derive(serde::Serialize, serde::Deserialize)] #[serde(default)]",
    );
    for (field, with) in ENUM_FIELDS {
        config = config.field_attribute(field, format!("#[serde(with = \"{with}\")]"));
    }
    config.compile_fds(fds)?;
    Ok(())
}
