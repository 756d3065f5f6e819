//! The status view, metrics and admin server: two real Envoys through one tap, one of them
//! given a config it rejects; a client that never answers turning STALE; `/metrics` parsed and
//! checked against the control plane's records; the admin server on loopback by default.

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::http_get as get;
use support::resources::{Snapshot, CDS};
use support::tap::XdsTap;
use xdstap::api::v1::{StatusReport, SyncState};
use xdstap::views::board::StatusSettings;

/// The tap as `xdstap run` assembles it, its admin server on a loopback port.
struct Monitored {
    tap: XdsTap,
    admin: String,
}

async fn monitored(upstream: &str, settings: StatusSettings) -> Monitored {
    let mut config = support::tap::config("127.0.0.1:0", upstream);
    config.admin.as_mut().unwrap().status = settings;
    let tap = XdsTap::with_config(config, vec![]).await;
    Monitored {
        admin: tap.admin.clone(),
        tap,
    }
}

async fn report(admin: &str) -> StatusReport {
    support::status(admin).await
}

fn state(r: &StatusReport, node: &str, ty: &str) -> Option<SyncState> {
    r.nodes
        .iter()
        .find(|n| n.id == node)?
        .types
        .iter()
        .find(|t| t.r#type == ty)
        .map(|t| t.state())
}

async fn wait_report(admin: &str, what: &str, f: impl Fn(&StatusReport) -> bool) -> StatusReport {
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let r = report(admin).await;
        if f(&r) {
            return r;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "status never showed {what}:\n{}",
                xdstap_cli::cli::status::render(&r, true)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `xdstap status ARGS`: (exit code, stdout).
async fn status_cli(args: Vec<String>) -> (i32, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_xdstap"))
            .arg("status")
            .args(&args)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8(out.stdout).unwrap(),
        )
    })
    .await
    .unwrap()
}

const TYPES: [&str; 4] = ["CDS", "EDS", "LDS", "RDS"];

fn all_synced(r: &StatusReport, node: &str) -> bool {
    TYPES
        .iter()
        .all(|t| state(r, node, t) == Some(SyncState::Synced))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_one_rejects_its_config() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let m = monitored(&cp_addr, StatusSettings::default()).await;
    let _one = Envoy::start("node-1", Xds::Tcp(m.tap.tap.addr.clone()), false).await;
    let _two = Envoy::start("node-2", Xds::Tcp(m.tap.tap.addr.clone()), false).await;
    let r = wait_report(&m.admin, "both nodes SYNCED", |r| {
        all_synced(r, "node-1") && all_synced(r, "node-2")
    })
    .await;
    let n1 = r.nodes.iter().find(|n| n.id == "node-1").unwrap();
    assert!(n1.connected);
    assert_eq!(n1.cluster, "test-cluster");
    assert!(n1.user_agent.starts_with("envoy"), "{}", n1.user_agent);
    let (code, out) = status_cli(vec!["--admin".into(), m.admin.clone()]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("NODE"), "{out}");

    // Only node-2's config differs: a harmless change to `a` with an invalid `b`.
    cp.set_for_node("node-2", Snapshot::standard("v2", 2000, 0, 9));
    let r = wait_report(&m.admin, "node-2 CDS NACKED", |r| {
        state(r, "node-2", "CDS") == Some(SyncState::Nacked)
    })
    .await;
    let n2 = r.nodes.iter().find(|n| n.id == "node-2").unwrap();
    assert_eq!(n2.state(), SyncState::Nacked);
    let cds = n2.types.iter().find(|t| t.r#type == "CDS").unwrap();
    let nack = cds.nack.clone().unwrap();
    let recorded = cp
        .answer_eventually(cds.nonce.as_deref().unwrap())
        .await
        .error
        .unwrap();
    assert_eq!(nack.message, recorded.1, "Envoy's own message");
    assert!(nack
        .message
        .contains("ConnectTimeout: value must be greater than 0s"));
    assert_eq!(nack.suspects, ["b"]);
    assert_eq!(nack.version, "v2");
    assert_eq!(cds.version_sent.as_deref(), Some("v2"));
    assert_eq!(
        cds.version_accepted.as_deref(),
        Some("v1"),
        "it stayed on v1"
    );
    assert!(all_synced(&r, "node-1"), "only node-2 and only CDS");
    for t in ["LDS", "RDS"] {
        assert_eq!(state(&r, "node-2", t), Some(SyncState::Synced));
    }

    let (code, out) = status_cli(vec!["--admin".into(), m.admin.clone()]).await;
    assert_eq!(code, 1, "non-zero while a node is NACKED:\n{out}");
    println!("xdstap status while node-2 is NACKED:\n{out}");
    let row = out.lines().find(|l| l.starts_with("node-2")).unwrap();
    assert!(row.contains("NACKED"), "{out}");
    let row1 = out.lines().find(|l| l.starts_with("node-1")).unwrap();
    assert!(!row1.contains("NACKED"), "{out}");
    assert!(
        out.contains("node-2 CDS NACKED")
            && out.contains("ConnectTimeout: value must be greater than 0s")
            && out.contains("[suspects: b]")
            && out.contains("rejected v2, running v1"),
        "{out}"
    );
    let (code, json) = status_cli(vec![
        "--admin".into(),
        m.admin.clone(),
        "-o".into(),
        "json".into(),
    ])
    .await;
    assert_eq!(code, 1);
    let parsed: StatusReport = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed.nodes.len(), 2);
    let (code, out) = status_cli(vec![
        "--admin".into(),
        m.admin.clone(),
        "--node".into(),
        "node-1".into(),
        "-o".into(),
        "wide".into(),
    ])
    .await;
    assert_eq!(code, 0, "node-1 alone is fine:\n{out}");
    assert!(
        out.contains("SYNCED v1") && !out.contains("node-2"),
        "{out}"
    );
    let (code, _) = status_cli(vec![
        "--admin".into(),
        m.admin.clone(),
        "--node".into(),
        "node-9".into(),
    ])
    .await;
    assert_eq!(code, 3, "an unknown node has an exit code of its own");

    // The fix: both SYNCED, exit 0.
    cp.set_for_node("node-2", Snapshot::standard("v3", 2000, 1000, 9));
    wait_report(&m.admin, "both SYNCED after the fix", |r| {
        all_synced(r, "node-1") && all_synced(r, "node-2")
    })
    .await;
    let (code, out) = status_cli(vec!["--admin".into(), m.admin.clone()]).await;
    assert_eq!(code, 0, "{out}");

    // /metrics parses, and its push counts are the control plane's, once every answer the
    // control plane has is counted (the sinks' thread counts it a moment after it passed).
    let sent = cp.sent();
    let requests = cp.requests();
    let answered = (sent.iter())
        .filter(|s| {
            let answer = |r: &&support::control_plane::Recorded| r.response_nonce == s.nonce;
            requests
                .iter()
                .any(|r| r.type_url == s.type_url && answer(&r))
        })
        .count() as f64;
    let metrics = support::eventually_async(10, "every answer counted", || async {
        let (code, text) = get(&m.admin, "/metrics").await;
        assert_eq!(code, 200);
        let metrics = support::prom::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let counted: f64 = (TYPES.iter())
            .flat_map(|ty| ["ack", "nack"].map(|v| (ty, v)))
            .map(|(ty, v)| metrics.get("xdstap_pushes_total", &[("type", ty), ("verdict", v)]))
            .sum();
        (counted >= answered).then_some(metrics)
    })
    .await;
    for ty in TYPES {
        let url = support::resources::ORDER
            .iter()
            .find(|u| xdstap::xds::short_type(u) == ty)
            .unwrap();
        let nonces: Vec<&str> = sent
            .iter()
            .filter(|s| s.type_url == *url)
            .map(|s| s.nonce.as_str())
            .collect();
        // A push's answer is the first request naming its nonce; later ones with the same
        // nonce are subscription changes (EDS names after a CDS update), not answers.
        let answers: Vec<_> = nonces
            .iter()
            .filter_map(|n| {
                requests
                    .iter()
                    .find(|r| r.type_url == *url && r.response_nonce == *n)
            })
            .collect();
        let acks = answers.iter().filter(|r| r.error.is_none()).count() as f64;
        let nacks = answers.iter().filter(|r| r.error.is_some()).count() as f64;
        assert_eq!(
            metrics.get("xdstap_pushes_total", &[("type", ty), ("verdict", "ack")]),
            acks,
            "{ty} acks"
        );
        assert_eq!(
            metrics.get("xdstap_pushes_total", &[("type", ty), ("verdict", "nack")]),
            nacks,
            "{ty} nacks"
        );
        assert_eq!(
            metrics.get(
                "xdstap_push_answer_seconds_count",
                &[("type", ty), ("verdict", "ack")]
            ),
            acks
        );
    }
    assert_eq!(
        metrics.get(
            "xdstap_pushes_total",
            &[("type", "CDS"), ("verdict", "nack")]
        ),
        1.0
    );
    assert_eq!(
        metrics.get("xdstap_xds_streams_active", &[("api", "sotw")]),
        2.0
    );
    assert_eq!(metrics.get("xdstap_clients", &[("state", "synced")]), 2.0);
    assert!(metrics.get("xdstap_forwarded_bytes_total", &[("direction", "response")]) > 0.0);
    assert!(
        metrics.get(
            "xdstap_forwarded_messages_total",
            &[("direction", "request")]
        ) > 0.0
    );
    assert_eq!(
        metrics.get(
            "xdstap_decode_errors_total",
            &[("reason", "invalid_protobuf")]
        ),
        0.0
    );
    assert_eq!(
        metrics.types.get("xdstap_pushes").map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        metrics
            .types
            .get("xdstap_push_answer_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    let _ = CDS;
}

/// A client that subscribes and never answers: PENDING, then STALE past the threshold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_answers_turns_stale() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let m = monitored(
        &cp_addr,
        StatusSettings {
            stale_after: Duration::from_millis(500),
            ..Default::default()
        },
    )
    .await;
    let io = tokio::net::TcpStream::connect(&m.tap.tap.addr)
        .await
        .unwrap();
    let mut client = support::raw::client(io).await;
    let path = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
    let (resp, mut send) = client
        .send_request(support::raw::request(path), false)
        .unwrap();
    send.send_data(support::raw::subscribe("silent"), false)
        .unwrap();
    let mut body = resp.await.unwrap().into_body();
    // Read the push and never answer it.
    let chunk = support::within(10, "the push", body.data())
        .await
        .unwrap()
        .unwrap();
    let _ = body.flow_control().release_capacity(chunk.len());
    // The board learns of the push on the sinks' thread, a moment after it was forwarded.
    wait_report(&m.admin, "silent CDS PENDING", |r| {
        state(r, "silent", "CDS") == Some(SyncState::Pending)
    })
    .await;
    let r = wait_report(&m.admin, "silent CDS STALE", |r| {
        state(r, "silent", "CDS") == Some(SyncState::Stale)
    })
    .await;
    let t = &r.nodes[0].types[0];
    assert_eq!(t.version_sent.as_deref(), Some("v1"));
    assert!(t.pending_since.is_some());
    let (code, out) = status_cli(vec!["--admin".into(), m.admin.clone()]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("silent CDS STALE: push v1"), "{out}");
    let (_, text) = get(&m.admin, "/metrics").await;
    let metrics = support::prom::parse(&text).unwrap();
    assert_eq!(metrics.get("xdstap_clients", &[("state", "stale")]), 1.0);
    drop(send);
}

/// With no --admin, the admin server listens on 127.0.0.1:9977 only, and /readyz tells an
/// unreachable upstream by name. The tap runs in a network namespace of its own (`unshare
/// --net`, its loopback up), so the fixed default port is its own whatever else runs here;
/// the test reads the namespace's sockets from /proc and asks over HTTP from inside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_server_listens_on_loopback_by_default() {
    let dir = support::TempDir::new("admin");
    let sock = dir.path().join("tap.sock");
    let stderr = dir.path().join("stderr.log");
    // An upstream nobody listens on: the namespace has nothing else.
    let upstream = "127.0.0.1:9";
    let script = format!(
        "ip link set lo up && exec {} run --listen unix:{} --upstream {upstream}",
        env!("CARGO_BIN_EXE_xdstap"),
        sock.display()
    );
    let tap = support::Child(
        Command::new("unshare")
            .args(["--net", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap(),
    );
    let pid = tap.id();
    let line = support::eventually(10, "the admin log line", || {
        std::fs::read_to_string(&stderr)
            .ok()?
            .lines()
            .find(|l| l.contains("Admin server listening"))
            .map(String::from)
    })
    .await;
    assert!(line.contains("admin=127.0.0.1:9977"), "{line}");
    // The kernel's view: a listening socket on port 9977 bound to 127.0.0.1, none on 0.0.0.0.
    let tcp = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
    let listening: Vec<&str> = tcp
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f[3] == "0A" && f[1].ends_with(":26F9")
        })
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(listening, ["0100007F:26F9"], "{tcp}");
    // Asked from inside the namespace.
    let get = |path: &str| {
        let ask = format!(
            "import urllib.request, urllib.error\n\
             try:\n    r = urllib.request.urlopen('http://127.0.0.1:9977{path}', timeout=5)\n    \
             print(r.status); print(r.read().decode())\n\
             except urllib.error.HTTPError as e:\n    print(e.code); print(e.read().decode())\n"
        );
        let out = Command::new("nsenter")
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args(["python3", "-c", &ask])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (code, body) = text.split_once('\n').unwrap_or_else(|| panic!("{out:?}"));
        (code.parse::<u16>().unwrap(), body.trim_end().to_string())
    };
    assert_eq!(get("/healthz"), (200, "ok".to_string()));
    let (code, body) = get("/readyz");
    assert_eq!(code, 503);
    assert!(body.contains(upstream), "{body}");
    drop(tap);
}

#[test]
fn the_metrics_parser_is_strict() {
    let ok = "# HELP a_x A.\n# TYPE a_x counter\na_x_total{type=\"CDS\",verdict=\"ack\"} 3\n# TYPE g gauge\ng 1.5\n# EOF\n";
    let m = support::prom::parse(ok).unwrap();
    assert_eq!(
        m.get("a_x_total", &[("type", "CDS"), ("verdict", "ack")]),
        3.0
    );
    assert_eq!(m.get("g", &[]), 1.5);
    assert!(
        support::prom::parse("a 1\n# EOF\n").is_err(),
        "undeclared family"
    );
    assert!(
        support::prom::parse("# TYPE a gauge\na{x=1} 1\n# EOF\n").is_err(),
        "unquoted label"
    );
    assert!(
        support::prom::parse("# TYPE a gauge\na one\n# EOF\n").is_err(),
        "bad value"
    );
    assert!(
        support::prom::parse("# TYPE a gauge\na 1\n").is_err(),
        "no EOF"
    );
}

/// An ADS stream through `listen` opened with `first`: the sender for later requests, and the
/// responses.
async fn ads_stream(
    listen: &str,
    first: envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest,
) -> (
    tokio::sync::mpsc::Sender<envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest>,
    tonic::Streaming<envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse>,
) {
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{listen}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(first).await.unwrap();
    let responses = client
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, responses)
}

/// A node id with ESC and a newline, and a NACK message with an OSC sequence and a newline,
/// sent by a client through the `xdstap` binary: `xdstap status`, `xdstap rollout`,
/// `xdstap watch` and the text log show them escaped (no raw control character, no forged
/// line), while `-o json` carries the strings as JSON does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_strings_cannot_forge_terminal_lines() {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use envoy_types::pb::google::rpc::Status;
    use support::resources::{static_cluster, LDS};
    use support::scripted::{response, Scripted};
    let node = "evil\u{1b}[2J\nFORGED ROW";
    let message = "bad\u{1b}]0;pwned\u{7}\nINFO forged line";
    let cp = Scripted::default();
    cp.on_first(response(CDS, "1", "n1", vec![static_cluster("a", 1000, 9)]));
    cp.on_first(response(LDS, "1", "l1", vec![]));
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let (listen, admin) = (support::free_addr(), support::free_addr());
    let dir = support::TempDir::new("forged");
    let stderr = dir.path().join("stderr.log");
    let _tap = support::Child(
        Command::new(env!("CARGO_BIN_EXE_xdstap"))
            .args([
                "run",
                "--listen",
                &listen,
                "--admin",
                &admin,
                "--upstream",
                &upstream,
            ])
            .args(["--log-format", "text"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap(),
    );
    support::eventually(10, "the tap listening", || {
        std::net::TcpStream::connect(&admin).ok().map(|_| ())
    })
    .await;
    let (mut watch, watch_out) = support::watch_into(&admin, dir.path()).await;
    let hello = DiscoveryRequest {
        node: Some(Node {
            id: node.into(),
            ..Default::default()
        }),
        type_url: CDS.into(),
        ..Default::default()
    };
    let (tx, mut responses) = ads_stream(&listen, hello).await;
    let first = support::within(10, "the first push", responses.message())
        .await
        .unwrap()
        .unwrap();
    tx.send(DiscoveryRequest {
        type_url: CDS.into(),
        response_nonce: first.nonce.clone(),
        error_detail: Some(Status {
            code: 13,
            message: message.into(),
            details: vec![],
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    support::eventually(10, "the NACK at the control plane", || {
        cp.answers_to("n1").first().cloned()
    })
    .await;
    support::eventually(10, "the NACK in watch", || {
        let out = std::fs::read_to_string(&watch_out).unwrap_or_default();
        out.contains("NACK").then_some(())
    })
    .await;
    watch.terminate();
    let (_, status, _) = support::xdstap(&["status", "--admin", &admin]).await;
    let (_, rollout, _) = support::xdstap(&["rollout", "1", "--admin", &admin]).await;
    let (_, json, _) = support::xdstap(&["status", "--admin", &admin, "-o", "json"]).await;
    let watched = std::fs::read_to_string(&watch_out).unwrap();
    let log = std::fs::read_to_string(&stderr).unwrap();
    for (what, text) in [
        ("status", &status),
        ("rollout", &rollout),
        ("watch", &watched),
        ("log", &log),
    ] {
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "raw control in {what}:\n{text}"
        );
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("FORGED ROW") || l.starts_with("INFO forged")),
            "a forged line in {what}:\n{text}"
        );
        // The log writes `&str` values in their Debug form.
        let escaped = match what {
            "log" => "evil\\u{1b}[2J\\nFORGED ROW",
            _ => "evil\\u{1b}[2J\\u{a}FORGED ROW",
        };
        assert!(
            text.contains(escaped),
            "the node id, escaped, in {what}:\n{text}"
        );
    }
    // A message's line breaks are layout: on one line in a table, its controls escaped.
    assert!(
        status.contains("bad\\u{1b}]0;pwned\\u{7} INFO forged line"),
        "{status}"
    );
    assert!(
        log.contains("bad\\u{1b}]0;pwned\\u{7}\\u{a}INFO forged line"),
        "{log}"
    );
    // JSON is JSON: the strings parse back as sent.
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["nodes"][0]["id"], node);
}

/// The admin address serves gRPC server reflection (v1 and v1alpha), so grpcurl lists and calls
/// the tap's API and CSDS without the protos: the services are listed, and the file that
/// defines `xdstap.v1.Tap` comes back with its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_is_listed_over_server_reflection() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient as Alpha;
    let m = monitored("127.0.0.1:9", StatusSettings::default()).await;
    let channel = (tonic::transport::Channel::from_shared(format!("http://{}", m.admin)))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel.clone());
    let ask = |request: MessageRequest| {
        tokio_stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(request),
        }])
    };
    let mut answers = (client
        .server_reflection_info(ask(MessageRequest::ListServices(String::new())))
        .await)
        .unwrap()
        .into_inner();
    let listed = support::within(10, "the services listed", answers.message()).await;
    let listed = match listed.unwrap().unwrap().message_response {
        Some(MessageResponse::ListServicesResponse(l)) => l.service,
        other => panic!("{other:?}"),
    };
    let mut names: Vec<String> = listed.into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "envoy.service.status.v3.ClientStatusDiscoveryService",
            "grpc.reflection.v1.ServerReflection",
            "xdstap.v1.Tap"
        ]
    );
    let symbol = MessageRequest::FileContainingSymbol("xdstap.v1.Tap".into());
    let mut answers = (client.server_reflection_info(ask(symbol)).await)
        .unwrap()
        .into_inner();
    let files = support::within(10, "the file descriptors", answers.message()).await;
    let files = match files.unwrap().unwrap().message_response {
        Some(MessageResponse::FileDescriptorResponse(f)) => f.file_descriptor_proto,
        other => panic!("{other:?}"),
    };
    let text = String::from_utf8_lossy(&files.concat()).into_owned();
    for name in [
        "xdstap/v1/tap.proto",
        "StatusReport",
        "RolloutReport",
        "WatchEvent",
    ] {
        assert!(text.contains(name), "{name} not described");
    }
    // Older clients (grpcurl before v1) ask v1alpha.
    let mut alpha = Alpha::new(channel);
    let request = tonic_reflection::pb::v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    };
    let mut answers = (alpha
        .server_reflection_info(tokio_stream::iter([request]))
        .await)
        .unwrap()
        .into_inner();
    let answer = support::within(10, "the v1alpha answer", answers.message())
        .await
        .unwrap()
        .expect("v1alpha answers");
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse as AlphaResponse;
    match answer.message_response {
        Some(AlphaResponse::ListServicesResponse(l)) => {
            let names: Vec<&str> = l.service.iter().map(|s| s.name.as_str()).collect();
            assert!(names.contains(&"xdstap.v1.Tap"), "{names:?}");
        }
        other => panic!("v1alpha answered no list of services: {other:?}"),
    }
}

/// Watch filters are bounded: a node glob past 256 characters (a 2 MB one among them; gRPC
/// refuses 4 MB itself) is refused naming the field, over the API and from `xdstap watch`; 64
/// watchers watch at once, the next is told so, and a seat frees when a watch ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_filters_and_watchers_are_bounded() {
    use xdstap::api::v1::tap_client::TapClient;
    use xdstap::api::v1::WatchRequest;
    let m = monitored("127.0.0.1:9", StatusSettings::default()).await;
    let mut client = TapClient::connect(format!("http://{}", m.admin))
        .await
        .unwrap();
    // Past 4 MiB the gRPC layer refuses the request itself; below, the filter's bound.
    for (glob, code) in [
        ("*a".repeat(2 << 20), tonic::Code::OutOfRange),
        ("*a".repeat(1 << 20), tonic::Code::InvalidArgument),
    ] {
        let request = WatchRequest {
            node: glob,
            ..Default::default()
        };
        let refused = client.watch(request).await.expect_err("refused");
        assert_eq!(refused.code(), code, "{refused:?}");
    }
    let request = WatchRequest {
        node: "*".repeat(257),
        ..Default::default()
    };
    let refused = client.watch(request).await.expect_err("refused");
    assert!(refused.message().starts_with("node: "), "{refused:?}");
    let long = "x".repeat(300);
    let (code, _, err) = support::xdstap(&["watch", "--admin", &m.admin, "--node", &long]).await;
    assert_ne!(code, 0);
    assert!(
        err.contains("node: a glob of at most 256 characters"),
        "{err}"
    );
    let mut open = Vec::new();
    let exhausted = loop {
        match client.watch(WatchRequest::default()).await {
            Ok(s) => open.push(s.into_inner()),
            Err(e) => break e,
        }
        assert!(open.len() <= 64, "more than 64 watchers let in");
    };
    assert_eq!(
        exhausted.code(),
        tonic::Code::ResourceExhausted,
        "{exhausted:?}"
    );
    assert_eq!(open.len(), 64, "watchers let in");
    // One ends: its seat is free again.
    drop(open.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while client.watch(WatchRequest::default()).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the seat never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(open);
    m.tap.close().await;
}

/// The smaller surfaces: under `umask 000` the admin socket, the event log and the spans file
/// are still the owner's alone (0600); `xdstap status --node` for an unknown id exits 3, not
/// 69; SIGHUP stops gracefully like SIGTERM; with an ADS stream waiting for an answer (so the
/// grace would run its full 10 s), a second signal stops the tap at once; and a stream whose
/// pushes are all answered does not hold the stop up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_only_files_exit_codes_and_signals() {
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use std::os::unix::fs::PermissionsExt;
    use support::resources::{static_cluster, LDS};
    use support::scripted::{response, Scripted};
    let cp = Scripted::default();
    cp.on_first(response(CDS, "1", "n1", vec![static_cluster("a", 1000, 9)]));
    cp.on_first(response(LDS, "1", "l1", vec![]));
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let dir = support::TempDir::new("modes");
    let (sock, events, spans) = (
        dir.path().join("admin.sock"),
        dir.path().join("events.jsonl"),
        dir.path().join("spans.jsonl"),
    );
    let log = dir.path().join("tap.log");
    let listen = support::free_addr();
    let start = || {
        let script = format!(
            "umask 000; exec {} run --listen {listen} --upstream {upstream} --admin unix:{} \
             --event-log {} --spans-file {}",
            env!("CARGO_BIN_EXE_xdstap"),
            sock.display(),
            events.display(),
            spans.display()
        );
        support::Child(
            Command::new("sh")
                .args(["-c", &script])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        )
    };
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let mut tap = start();
    support::listening(&sock).await;
    support::eventually(10, "the event log", || events.exists().then_some(())).await;
    support::eventually(10, "the spans file", || spans.exists().then_some(())).await;
    assert_eq!(mode(&sock), 0o600, "the admin socket");
    assert_eq!(mode(&events), 0o600, "the event log");
    assert_eq!(mode(&spans), 0o600, "the spans file");
    let admin = format!("unix:{}", sock.display());
    let (code, _, err) = support::xdstap(&["status", "--admin", &admin, "--node", "nosuch"]).await;
    assert_eq!(code, 3, "{err}");
    // SIGHUP: a graceful stop.
    let kill = |sig: &str, pid: u32| {
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
    };
    kill("-HUP", tap.id());
    let status = tap.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("SIGHUP received: stopping gracefully"),
        "{text}"
    );
    // With a stream open, the second SIGTERM cuts the grace.
    let _ = std::fs::remove_file(&sock);
    let tap = start();
    support::listening(&sock).await;
    let hello = DiscoveryRequest {
        type_url: CDS.into(),
        ..Default::default()
    };
    let (tx, mut responses) = ads_stream(&listen, hello).await;
    support::within(10, "the first push", responses.message())
        .await
        .unwrap()
        .unwrap();
    let mut tap = tap;
    kill("-TERM", tap.id());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        tap.0.try_wait().unwrap().is_none(),
        "the grace holds the open stream"
    );
    let t0 = std::time::Instant::now();
    kill("-TERM", tap.id());
    let status = tap.0.wait().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "stopped after {:?}",
        t0.elapsed()
    );
    assert!(!status.success());
    drop(tx);
    // A stream whose pushes are all answered waits for nothing: one SIGTERM stops the tap
    // well before the 10 s grace.
    let _ = std::fs::remove_file(&sock);
    let mut tap = start();
    support::listening(&sock).await;
    let hello = DiscoveryRequest {
        type_url: CDS.into(),
        ..Default::default()
    };
    let (tx, mut responses) = ads_stream(&listen, hello).await;
    let push = support::within(10, "the push", responses.message())
        .await
        .unwrap()
        .unwrap();
    tx.send(DiscoveryRequest {
        type_url: CDS.into(),
        version_info: push.version_info.clone(),
        response_nonce: push.nonce.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    support::eventually(10, "the ACK at the control plane", || {
        (!cp.answers_to(&push.nonce).is_empty()).then_some(())
    })
    .await;
    let t0 = std::time::Instant::now();
    kill("-TERM", tap.id());
    let status = tap.0.wait().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "stopped after {:?}",
        t0.elapsed()
    );
    assert!(status.success(), "{status:?}");
    drop(tx);
}

/// A subscription the control plane never answers (here a real Envoy's wildcard LDS, which the
/// control plane leaves unanswered) is STALE once past `--stale-after`, with its own reason
/// line, and `xdstap status` exits 1: a status check does not pass against a control plane
/// that never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_never_answered_turns_stale() {
    use support::resources::static_cluster;
    use support::scripted::{response, Scripted};
    let cp = Scripted::default();
    cp.on_first(response(CDS, "1", "n1", vec![static_cluster("a", 1000, 9)]));
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let settings = StatusSettings {
        stale_after: Duration::from_secs(1),
        ..Default::default()
    };
    let m = monitored(&upstream, settings).await;
    let _envoy = Envoy::start("unanswered", Xds::Tcp(m.tap.tap.addr.clone()), false).await;
    wait_report(&m.admin, "LDS STALE", |r| {
        state(r, "unanswered", "LDS") == Some(SyncState::Stale)
            && state(r, "unanswered", "CDS") == Some(SyncState::Synced)
    })
    .await;
    let (code, out) = status_cli(vec!["--admin".into(), m.admin.clone()]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("unanswered LDS STALE: asked for, never pushed"),
        "{out}"
    );
    m.tap.close().await;
}

/// A tier's `/status` with a peer that accepts and never answers: the peer is named as not
/// answering, and four callers at once have their answers about when one alone has it (one ask
/// of the peers, shared by whoever waited for it), not one wait after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_at_once_share_one_wait_for_a_mute_peer() {
    let mute = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = mute.local_addr().unwrap().to_string();
    let _mute = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = mute.accept().await {
            held.push(s);
        }
    });
    let (_cp, cp_addr, _server) =
        ControlPlane::listening(Snapshot::standard("v1", 1000, 1000, 9)).await;
    let flags = [
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &cp_addr,
        "--admin",
        "127.0.0.1:0",
        "--admin-peers",
        &peer,
    ];
    let tap = XdsTap::with_flags(&flags).await;
    let ask = |admin: String, peer: String| async move {
        let t0 = std::time::Instant::now();
        let (code, body) = get(&admin, "/status").await;
        let took = t0.elapsed();
        assert_eq!(code, 200, "{body}");
        let report: StatusReport = serde_json::from_str(&body).unwrap();
        let named = (report.taps.iter()).find(|t| t.admin == peer);
        assert!(
            named.is_some_and(|t| !t.error.is_empty()),
            "the mute peer is named as not answering: {:?}",
            report.taps
        );
        took
    };
    let alone = ask(tap.admin.clone(), peer.clone()).await;
    assert!(alone >= Duration::from_secs(1), "the peer was waited for");
    let mut at_once = tokio::task::JoinSet::new();
    for _ in 0..4 {
        at_once.spawn(ask(tap.admin.clone(), peer.clone()));
    }
    let mut slowest = Duration::ZERO;
    while let Some(took) = at_once.join_next().await {
        slowest = slowest.max(took.unwrap());
    }
    eprintln!("/status with a mute peer: {alone:?} alone, the slowest of four at once {slowest:?}");
    assert!(
        slowest < alone * 2,
        "four callers took up to {slowest:?}, one alone {alone:?}"
    );
    tap.close().await;
}
