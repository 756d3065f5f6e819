//! The binary: `demo --json` plays the story; bad config exits 64 naming the option and value.

use std::process::Command;

fn xdstap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xdstap"))
}

/// Runs `xdstap demo --json` with `args`; returns the summary and every event line.
fn demo(args: &[&str]) -> (serde_json::Value, Vec<serde_json::Value>) {
    let out = xdstap()
        .args(["demo", "--json"])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.last().unwrap().clone();
    (last, lines)
}

fn check_story(summary: &serde_json::Value, events: &[serde_json::Value]) {
    let s = &summary["summary"];
    assert_eq!(s["ok"], true, "{s}");
    assert_eq!(s["suspects"], serde_json::json!(["b"]));
    assert_eq!(s["kept_version"], "v1");
    let steps: Vec<(String, Vec<String>)> = serde_json::from_value(s["steps"].clone()).unwrap();
    let mut initial = steps[0].1.clone();
    initial.sort();
    assert_eq!(initial, ["CDS v1 ack", "LDS v1 ack"]);
    assert_eq!(steps[1].1, ["CDS v2 nack"]);
    assert_eq!(steps[2].1, ["CDS v3 ack"]);
    // Back to back, bad then good: the late NACK is v4's own verdict, then v5's ACK.
    assert_eq!(steps[3].1, ["CDS v4 nack", "CDS v5 ack"]);
    let v4 = events
        .iter()
        .find(|e| e["event"] == "verdict" && e["push"]["version"] == "v4")
        .unwrap();
    assert!(v4["overtaken_by"].is_string(), "{v4}");
    assert_eq!(v4["client_version"], "v3");
    let restart = &steps[4].1;
    for v in [
        "CDS resubscribe v5",
        "LDS resubscribe v1",
        "CDS v6 ack",
        "LDS v6 ack",
    ] {
        assert!(restart.contains(&v.to_string()), "{restart:?}");
    }
    // Every event is a JSON line too; the NACK carries the client's version and error.
    let nack = events.iter().find(|e| e["verdict"] == "nack").unwrap();
    assert_eq!(nack["client_version"], "v1");
    assert_eq!(nack["suspects"], serde_json::json!(["b"]));
    // v7 is NACKed in part: b rejected as it is added, a and c applied.
    assert_eq!(steps[5].1, ["CDS v7 nack"]);
    let v7 = events
        .iter()
        .find(|e| e["event"] == "verdict" && e["push"]["version"] == "v7")
        .unwrap();
    assert_eq!(v7["nack_scope"], "partial", "{v7}");
    assert_eq!(v7["rejected"][0]["name"], "b", "{v7}");
    assert!(
        (v7["rejected"][0]["reason"].as_str().unwrap())
            .starts_with("malformed IP address: not-an-ip"),
        "{v7}"
    );
    assert_eq!(v7["applied"], serde_json::json!(["a", "c"]), "{v7}");
    // The status the demo ends with: LDS SYNCED on v6, CDS NACKED in part on v7.
    let node = &summary["status"]["nodes"][0];
    assert_eq!(node["state"], "NACKED");
    for t in node["types"].as_array().unwrap() {
        assert_eq!(t["version_accepted"], "v6", "{t}");
        match t["type"].as_str().unwrap() {
            "CDS" => {
                assert_eq!(t["nack"]["scope"], "PARTIAL", "{t}");
                assert_eq!(t["nack"]["rejected"], serde_json::json!(["b"]), "{t}");
            }
            _ => assert_eq!(t["state"], "SYNCED", "{t}"),
        }
    }
    // Spans went to a local file of OTLP JSON lines: one span per verdict.
    let spans = s["spans"].as_str().unwrap();
    let path = spans.split(" (").next().unwrap();
    let text = std::fs::read_to_string(path).unwrap();
    let _ = std::fs::remove_file(path);
    let mut names = Vec::new();
    for line in text.lines() {
        let batch: serde_json::Value = serde_json::from_str(line).unwrap();
        for rs in batch["resourceSpans"].as_array().unwrap() {
            for ss in rs["scopeSpans"].as_array().unwrap() {
                for span in ss["spans"].as_array().unwrap() {
                    names.push(span["name"].as_str().unwrap().to_string());
                }
            }
        }
    }
    let verdicts = events.iter().filter(|e| e["event"] == "verdict").count();
    assert_eq!(names.len(), verdicts, "{names:?}");
    assert_eq!(s["spans_exported"], verdicts);
    assert!(names.iter().any(|n| n == "xds.push CDS"));
}

#[test]
fn demo_with_the_builtin_client() {
    let (summary, events) = demo(&["--client", "builtin"]);
    check_story(&summary, &events);
    let s = &summary["summary"];
    assert_eq!(s["client"], "builtin");
    assert_eq!(
        s["nack_message"],
        "name: \"b\"\nconnect_timeout {\n}\n: Proto constraint validation failed \
         (ClusterValidationError.ConnectTimeout: value must be greater than 0s)"
    );
}

#[test]
fn demo_with_a_real_envoy() {
    let envoy = std::env::var("ENVOY_BIN")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/.envoy/envoy/_bin/envoy").into());
    let (summary, events) = demo(&["--envoy", &envoy]);
    check_story(&summary, &events);
    let s = &summary["summary"];
    assert_eq!(s["client"], "envoy");
    assert!(
        s["user_agent"].as_str().unwrap().starts_with("envoy 1.40"),
        "{}",
        s["user_agent"]
    );
    // Envoy's own text, with its dump of the rejected cluster.
    let message = s["nack_message"].as_str().unwrap();
    assert!(
        message.contains("name: \"b\"")
            && message.ends_with(
                "Proto constraint validation failed (ClusterValidationError.ConnectTimeout: \
                 value must be greater than 0s)"
            ),
        "{message}"
    );
}

#[test]
fn demo_without_an_envoy_when_one_is_required() {
    let out = xdstap()
        .args(["demo", "--envoy", "/nonexistent/envoy"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/envoy"));
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
        "listen: 127.0.0.1:1\nupstream: 127.0.0.1:2\nadmin:\n  stale_after: lots\n",
    )
    .unwrap();
    let out = xdstap().arg("check-config").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("admin.stale_after (--stale-after)") && err.contains("lots"),
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

/// `--threads N` runs N runtime workers (default one), counted in /proc once it listens.
#[test]
fn threads_set_the_worker_count() {
    use std::io::BufRead;
    for (flag, want) in [(None, 1), (Some("3"), 3)] {
        let mut cmd = xdstap();
        cmd.args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "127.0.0.1:1",
        ])
        .args(["--admin", "off", "--log-level", "info"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
        if let Some(n) = flag {
            cmd.args(["--threads", n]);
        }
        let mut child = cmd.spawn().unwrap();
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        assert!(
            lines.any(|l| l.unwrap().contains("Listening")),
            "never listened"
        );
        // A worker names itself once it runs, which may be just after the tap listens.
        let count = || {
            std::fs::read_dir(format!("/proc/{}/task", child.id()))
                .unwrap()
                .filter(|t| {
                    let comm = t.as_ref().unwrap().path().join("comm");
                    std::fs::read_to_string(comm).is_ok_and(|c| c.starts_with("tokio-r"))
                })
                .count()
        };
        let mut workers = count();
        for _ in 0..100 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            workers = count();
            if workers >= want {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        workers = workers.max(count());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(workers, want, "--threads {flag:?}");
    }
}

/// `--admin unix:PATH` never removes what it did not create: on a regular file, or on a socket
/// another process listens on, the tap refuses to start, names the path, and leaves it be; a
/// socket file nobody listens on any more (left by a killed tap) is replaced.
#[test]
fn admin_unix_never_removes_a_file_it_did_not_create() {
    let dir = std::env::temp_dir().join(format!("xdstap-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let start = |path: &std::path::Path| {
        xdstap()
            .args([
                "run",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "127.0.0.1:1",
            ])
            .arg("--admin")
            .arg(format!("unix:{}", path.display()))
            .output()
            .unwrap()
    };

    let file = dir.join("precious.txt");
    std::fs::write(&file, "keep me\n").unwrap();
    let out = start(&file);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&file.display().to_string()) && err.contains("not a socket"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me\n");

    let live = dir.join("live.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let out = start(&live);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&live.display().to_string()), "{err}");
    std::os::unix::net::UnixStream::connect(&live).expect("the live socket is still there");

    let stale = dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let mut child = xdstap()
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "127.0.0.1:1",
        ])
        .arg("--admin")
        .arg(format!("unix:{}", stale.display()))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.unwrap().contains("Admin server listening")),
        "a stale socket is replaced"
    );
    std::os::unix::net::UnixStream::connect(&stale).expect("the tap listens on it");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(dir);
}

/// The Envoy the demo installs is the one the test command installs.
#[test]
fn one_pinned_envoy() {
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/install-envoy"
    ))
    .unwrap();
    assert!(
        script.contains(xdstap_cli::demo::envoy::PINNED),
        "scripts/install-envoy does not install {}",
        xdstap_cli::demo::envoy::PINNED
    );
}

/// `check-config` checks what `run` would reject: an event log or spans file in a directory
/// that does not exist, and an OTLP endpoint that is no URL (from the flag or the environment),
/// each named; `run` refuses them the same way, before it listens.
#[test]
fn check_config_checks_what_run_checks() {
    let dir = std::env::temp_dir().join(format!("xdstap-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tap.yaml");
    std::fs::write(&file, "listen: 127.0.0.1:0\nupstream: 127.0.0.1:2\n").unwrap();
    /// Flags, environment, and the option the error must name.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case<'_>; 3] = [
        (
            &["--event-log", "/nonexistent/dir/events.jsonl"],
            &[],
            "event_log (--event-log)",
        ),
        (
            &["--spans-file", "/nonexistent/dir/spans.jsonl"],
            &[],
            "spans.file (--spans-file)",
        ),
        (
            &[],
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "::::")],
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
    ];
    for (flags, env, named) in cases {
        for command in ["check-config", "run"] {
            let mut c = xdstap();
            match command {
                "check-config" => c.arg("check-config").arg(&file),
                _ => c.args(["run", "--config"]).arg(&file),
            };
            let out = c.args(flags).envs(env.iter().copied()).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{command} {flags:?}: {err}");
            assert!(err.contains(named), "{command} {flags:?}: {err}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
