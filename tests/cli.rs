//! The binary: `demo --json` plays the story; bad config exits 64 naming the option and value.

use std::process::Command;

fn xdstap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xdstap"))
}

#[test]
fn demo_json_reports_each_step_and_the_suspect() {
    let out = xdstap().args(["demo", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    let s = &v["summary"];
    assert_eq!(s["ok"], true);
    assert_eq!(s["suspects"], serde_json::json!(["b"]));
    assert!(s["nack_message"]
        .as_str()
        .unwrap()
        .contains("ConnectTimeout"));
    let steps: Vec<(String, Vec<String>)> = serde_json::from_value(s["steps"].clone()).unwrap();
    assert_eq!(steps[1].1, vec!["CDS v2 nack"]);
    assert_eq!(
        steps[3].1,
        vec!["CDS v4 superseded", "CDS stale-answer", "CDS v5 ack"]
    );
    // Every event line is JSON too, and the NACK event carries Envoy-style error details.
    let nack = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["verdict"] == "nack")
        .unwrap();
    assert_eq!(nack["client_version"], "v1");
    assert_eq!(nack["error"]["code"], 13);
}

#[test]
fn bad_values_exit_64_naming_option_and_value() {
    let out = xdstap()
        .args(["run", "--listen", "127.0.0.1:0", "--upstream", "nowhere"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("upstream (--upstream)") && err.contains("\"nowhere\""),
        "{err}"
    );

    let dir = std::env::temp_dir().join(format!("xdstap-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "listen: 127.0.0.1:1\nupstream: 127.0.0.1:2\nhttp2:\n  stream_window: lots\n",
    )
    .unwrap();
    let out = xdstap().arg("check-config").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("http2.stream_window") && err.contains("lots"),
        "{err}"
    );

    std::fs::write(&file, "listen: 127.0.0.1:1\nupstrem: 127.0.0.1:2\n").unwrap();
    let out = xdstap().arg("check-config").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("upstrem"));

    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/xdstap.yaml");
    let out = xdstap().args(["check-config", example]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_example_envoy_bootstrap_is_valid_for_the_real_envoy() {
    let envoy = std::env::var("ENVOY_BIN")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/.envoy/envoy/_bin/envoy").into());
    let out = Command::new(envoy)
        .args([
            "--mode",
            "validate",
            "-c",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/envoy-bootstrap.yaml"),
        ])
        .output()
        .expect("run envoy (scripts/test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
