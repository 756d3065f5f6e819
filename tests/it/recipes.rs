//! The deployment recipes in config/: every Envoy bootstrap in them passes the real Envoy's
//! `--mode validate`, and every xdstap config in them passes `xdstap check-config`; the
//! Dockerfile builds and runs what the manifests expect.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

fn recipe(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config")
        .join(path)
}

fn envoy_validates(bootstrap: &Path) {
    let out = Command::new(support::envoy::binary())
        .args(["--mode", "validate", "-c"])
        .arg(bootstrap)
        .output()
        .expect("run envoy");
    assert!(
        out.status.success(),
        "{} is not valid for Envoy:\n{}{}",
        bootstrap.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn xdstap_accepts(config: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_xdstap"))
        .arg("check-config")
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `data` entries of every ConfigMap in a multi-document Kubernetes manifest.
fn config_maps(manifest: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v: serde_norway::Value = serde::Deserialize::deserialize(doc).unwrap();
        if v["kind"].as_str() != Some("ConfigMap") {
            continue;
        }
        let name = v["metadata"]["name"].as_str().unwrap().to_string();
        if let Some(data) = v["data"].as_mapping() {
            for (k, val) in data {
                out.push((
                    name.clone(),
                    k.as_str().unwrap().to_string(),
                    val.as_str().unwrap().to_string(),
                ));
            }
        }
    }
    out
}

#[test]
fn plain_unix_socket_and_failover_envoy_bootstraps_are_valid() {
    envoy_validates(&recipe("envoy-bootstrap.yaml"));
    envoy_validates(&recipe("envoy-bootstrap-unix.yaml"));
    envoy_validates(&recipe("envoy-bootstrap-failover.yaml"));
    envoy_validates(&recipe("envoy-bootstrap-failover-unix.yaml"));
    xdstap_accepts(&recipe("xdstap.yaml"));
}

/// Every manifest under `config/` (a YAML file with a `kind:`), and whether Kubernetes' own
/// schemas accept it: `kubernetes-validate --strict` as `scripts/install-k8s-validate` installs it.
fn kubernetes_accepts(manifest: &Path) -> Result<(), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .env("PYTHONPATH", root.join(".kv"))
        .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
        .args(["--kubernetes-version", "1.33"])
        .arg(manifest)
        .output()
        .expect("run kubernetes-validate (scripts/install-k8s-validate installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match out.status.success() {
        true => Ok(()),
        false => Err(text),
    }
}

#[test]
fn every_kubernetes_manifest_passes_the_kubernetes_schemas() {
    let mut manifests = Vec::new();
    for dir in ["kubernetes", "istio"] {
        for entry in std::fs::read_dir(recipe(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                manifests.push(path);
            }
        }
    }
    manifests.sort();
    assert!(manifests.len() >= 2, "{manifests:?}");
    for m in &manifests {
        if let Err(why) = kubernetes_accepts(m) {
            panic!("{} fails the Kubernetes schemas:\n{why}", m.display());
        }
    }
    // The validator rejects what Kubernetes would: a field a Deployment has not, a wrong type.
    let dir = support::TempDir::new("k8s");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: { name: x }\nspec:\n  replicas: two\n  \
         selector: { matchLabels: { app: x } }\n  template:\n    metadata: { labels: { app: x } }\n    \
         spec: { containers: [ { name: x, image: x, readinessProbes: {} } ] }\n",
    )
    .unwrap();
    let why = kubernetes_accepts(&bad).expect_err("a bad Deployment accepted");
    assert!(why.contains("replicas") || why.contains("two"), "{why}");
}

#[test]
fn the_kubernetes_and_istio_manifests_carry_valid_configs() {
    let dir = support::TempDir::new("recipes");
    let mut envoys = 0;
    let mut taps = 0;
    for manifest in [
        "kubernetes/xdstap-with-jaeger.yaml",
        "istio/xdstap-in-front-of-istiod.yaml",
    ] {
        for (map, key, body) in config_maps(&recipe(manifest)) {
            let file = dir.path().join(format!("{map}-{key}"));
            std::fs::write(&file, body).unwrap();
            match key.as_str() {
                "envoy.yaml" => {
                    envoy_validates(&file);
                    envoys += 1;
                }
                "xdstap.yaml" => {
                    xdstap_accepts(&file);
                    taps += 1;
                }
                other => panic!("{manifest}: unexpected ConfigMap key {other}"),
            }
        }
    }
    assert_eq!((envoys, taps), (1, 2));
}

/// The Dockerfile builds what the manifests run (no container engine here, so its parts are
/// checked): the lock file is current for its `--locked` build of the `xdstap` binary; the
/// image runs `run --config /etc/xdstap/xdstap.yaml`, where every manifest mounts its
/// configuration and passes that file; it exposes the ports the manifests name (15010 for xDS,
/// 9977 for the admin address, the default's port); and its build context leaves out what a
/// checkout grows (target/, the test peers' installs).
#[test]
fn the_dockerfile_builds_and_runs_what_the_manifests_expect() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("cargo build --release --locked --bin xdstap"),
        "{dockerfile}"
    );
    // Offline: a test needs no network; scripts/test fetched every crate of the lock file.
    let locked = Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .current_dir(root)
        .stdout(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        locked.status.success(),
        "Cargo.lock is not current for --locked: {}",
        String::from_utf8_lossy(&locked.stderr)
    );
    assert!(
        dockerfile.contains(r#"CMD ["run", "--config", "/etc/xdstap/xdstap.yaml"]"#),
        "{dockerfile}"
    );
    let admin_port = xdstap::config::DEFAULT_ADMIN.rsplit(':').next().unwrap();
    assert!(
        dockerfile.contains(&format!("EXPOSE 15010 {admin_port}")),
        "{dockerfile}"
    );
    for manifest in [
        "config/kubernetes/xdstap-with-jaeger.yaml",
        "config/istio/xdstap-in-front-of-istiod.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(manifest)).unwrap();
        assert!(
            text.contains(r#"args: ["run", "--config", "/etc/xdstap/xdstap.yaml""#)
                && text.contains("mountPath: /etc/xdstap }")
                && text.contains("containerPort: 15010")
                && text.contains(&format!("containerPort: {admin_port}")),
            "{manifest} runs what the image does not"
        );
    }
    let ignored = std::fs::read_to_string(root.join(".dockerignore")).unwrap();
    for dir in ["target", ".envoy", ".grpc", ".kv", "fuzz/target"] {
        assert!(
            ignored.lines().any(|l| l == dir),
            "{dir} in the build context"
        );
    }
}
