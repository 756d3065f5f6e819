//! Spans over OTLP, received by real OTLP receivers (opentelemetry-proto's gRPC service and an
//! OTLP/HTTP endpoint): two real Envoys through one tap, SotW over OTLP/gRPC and Delta over
//! OTLP/HTTP; a backend that never answers; and a canary private key that must appear nowhere.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::otlp::{Received, Receiver};
use support::resources::{Snapshot, CDS};
use support::tap::{TapOptions, XdsTap};
use xdstap::outputs::spans::{Protocol, SpanSettings, SpanStats};

fn settings(endpoint: &str, protocol: Protocol) -> SpanSettings {
    SpanSettings {
        endpoint: Some(endpoint.into()),
        protocol,
        interval: Duration::from_millis(100),
        ..Default::default()
    }
}

async fn wait_span(
    receiver: &Receiver,
    what: &str,
    f: impl Fn(&Received) -> bool,
) -> Vec<Received> {
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let found: Vec<Received> = receiver.spans().into_iter().filter(|s| f(s)).collect();
        if !found.is_empty() {
            return found;
        }
        if std::time::Instant::now() > deadline {
            let seen: Vec<String> = receiver
                .spans()
                .iter()
                .map(|s| {
                    format!(
                        "{} {:?} {:?} {:?}",
                        s.span.name,
                        s.text("xds.node.id"),
                        s.text("xds.version"),
                        s.text("xds.verdict")
                    )
                })
                .collect();
            panic!("no span: {what}; received: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn is(s: &Received, node: &str, ty: &str, version: &str, verdict: &str) -> bool {
    s.text("xds.node.id").as_deref() == Some(node)
        && s.text("xds.type").as_deref() == Some(ty)
        && s.text("xds.version").as_deref() == Some(version)
        && s.text("xds.verdict").as_deref() == Some(verdict)
}

async fn story(delta: bool, receiver: Receiver, protocol: Protocol) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let stats = Arc::new(SpanStats::default());
    let (sink, _export) =
        xdstap::outputs::spans::start(settings(&receiver.endpoint, protocol), stats.clone())
            .unwrap();
    let tap = XdsTap::with_sinks(TapOptions::new(&cp_addr), vec![Box::new(sink)]).await;
    let one = Envoy::start("node-1", Xds::Tcp(tap.tap.addr.clone()), delta).await;
    let two = Envoy::start("node-2", Xds::Tcp(tap.tap.addr.clone()), delta).await;

    // 1. Good config: ACK spans for every type, with the attributes; one trace for v1.
    let mut v1 = Vec::new();
    for node in ["node-1", "node-2"] {
        for ty in ["CDS", "EDS", "LDS", "RDS"] {
            let s = wait_span(&receiver, &format!("{node} {ty} v1 ack"), |s| {
                is(s, node, ty, "v1", "ack")
            })
            .await;
            v1.push(s[0].clone());
        }
    }
    let cds = v1
        .iter()
        .find(|s| is(s, "node-1", "CDS", "v1", "ack"))
        .unwrap();
    assert_eq!(cds.span.name, "xds.push CDS");
    assert_eq!(cds.text("rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        cds.text("rpc.service").as_deref(),
        Some("envoy.service.discovery.v3.AggregatedDiscoveryService")
    );
    let method = if delta {
        "DeltaAggregatedResources"
    } else {
        "StreamAggregatedResources"
    };
    assert_eq!(cds.text("rpc.method").as_deref(), Some(method));
    assert_eq!(cds.text("xds.type_url").as_deref(), Some(CDS));
    assert_eq!(
        cds.text("xds.api").as_deref(),
        Some(if delta { "delta" } else { "sotw" })
    );
    assert_eq!(cds.text("xds.resource_count").as_deref(), Some("2"));
    let mut names = cds.strings("xds.resource_names");
    names.sort();
    assert_eq!(names, ["a", "b"]);
    let nonce = cds.text("xds.nonce").unwrap();
    assert!(
        cp.sent().iter().any(|s| s.nonce == nonce),
        "the span's nonce is one the control plane sent"
    );
    assert_eq!(
        cds.text("xds.node.cluster").as_deref(),
        Some("test-cluster")
    );
    assert!(
        cds.text("xds.node.user_agent")
            .unwrap()
            .starts_with("envoy"),
        "{:?}",
        cds.text("xds.node.user_agent")
    );
    assert!(cds.text("xds.stream.id").is_some());
    assert!(cds
        .text("client.address")
        .unwrap()
        .starts_with("127.0.0.1:"));
    assert_eq!(
        cds.text("server.address").as_deref(),
        Some(cp_addr.as_str())
    );
    if !delta {
        assert_eq!(cds.text("xds.client_version").as_deref(), Some("v1"));
    }
    assert!(cds.span.end_time_unix_nano >= cds.span.start_time_unix_nano);
    assert!(cds.span.events.iter().any(|e| e.name == "xds.ack"));
    assert_eq!(cds.resource_text("service.name").as_deref(), Some("xdstap"));
    assert_eq!(
        cds.resource_text("service.version").as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert!(cds.resource_text("service.instance.id").is_some());
    assert!(cds.resource_text("host.name").is_some());
    let status = cds.span.status.clone().unwrap_or_default();
    assert_eq!(status.code, 1, "ACK spans have status OK");
    let trace = cds.trace_id();
    for s in &v1 {
        assert_eq!(
            s.trace_id(),
            trace,
            "every v1 span, every type and both Envoys, in one trace: {} {:?}",
            s.span.name,
            s.text("xds.node.id")
        );
    }
    assert!(v1
        .iter()
        .any(|s| is(s, "node-2", "LDS", "v1", "ack") && s.trace_id() == trace));

    // 2. A harmless change to `a` with an invalid `b`: one error span per Envoy, Envoy's text.
    cp.set(Snapshot::standard("v2", 2000, 0, 9));
    for node in ["node-1", "node-2"] {
        let nacks = wait_span(&receiver, &format!("{node} CDS v2 nack"), |s| {
            is(s, node, "CDS", "v2", "nack")
        })
        .await;
        assert_eq!(nacks.len(), 1, "one span per push");
        let s = &nacks[0];
        let status = s.span.status.clone().unwrap();
        assert_eq!(status.code, 2, "NACK spans have status ERROR");
        let recorded = cp
            .answer_eventually(&s.text("xds.nonce").unwrap())
            .await
            .error
            .unwrap();
        assert_eq!(
            status.message, recorded.1,
            "the status message is Envoy's text"
        );
        assert!(status
            .message
            .contains("ConnectTimeout: value must be greater than 0s"));
        assert_eq!(
            s.text("xds.error.message").as_deref(),
            Some(recorded.1.as_str())
        );
        assert_eq!(s.strings("xds.suspects"), ["b"]);
        let mut changed = s.strings("xds.changed");
        changed.sort();
        assert_eq!(changed, ["a", "b"]);
        if !delta {
            assert_eq!(s.text("xds.client_version").as_deref(), Some("v1"));
        }
        assert!(s.span.events.iter().any(|e| e.name == "xds.nack"));
    }

    // 3. The fix: ACK spans again, in v3's trace (the control plane pushes the changed types).
    cp.set(Snapshot::standard("v3", 2000, 1000, 9));
    let mut v3 = Vec::new();
    for node in ["node-1", "node-2"] {
        for ty in ["CDS", "EDS"] {
            let s = wait_span(&receiver, &format!("{node} {ty} v3 ack"), |s| {
                is(s, node, ty, "v3", "ack")
            })
            .await;
            v3.push(s[0].trace_id());
        }
    }
    assert!(v3.iter().all(|t| *t == v3[0]), "{v3:?}");
    assert_ne!(v3[0], trace, "another version, another trace");
    drop((one, two));
    if protocol == Protocol::HttpProtobuf {
        let requests = receiver.requests.lock().unwrap().clone();
        assert!(requests
            .iter()
            .all(|(path, ct)| path == "/v1/traces" && ct == "application/x-protobuf"));
    }
    assert_eq!(xdstap::proxy::counter(&stats.dropped), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_sotw_spans_over_otlp_grpc() {
    story(false, Receiver::grpc().await, Protocol::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_delta_spans_over_otlp_http() {
    story(true, Receiver::http().await, Protocol::HttpProtobuf).await;
}

/// A backend that accepts connections and never answers: forwarding is never held up (every
/// push answered within the export timeout), spans are dropped and counted, and at
/// most the queue and one batch are ever held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_costs_spans_not_forwarding() {
    let blackhole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", blackhole.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        loop {
            let (c, _) = blackhole.accept().await.unwrap();
            conns.push(c);
        }
    });
    let stats = Arc::new(SpanStats::default());
    let queue = 16;
    let batch = 8;
    let (sink, export) = xdstap::outputs::spans::start(
        SpanSettings {
            queue,
            batch,
            timeout: Duration::from_millis(500),
            ..settings(&endpoint, Protocol::Grpc)
        },
        stats.clone(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v0", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let tap = XdsTap::with_sinks(TapOptions::new(&cp_addr), vec![Box::new(sink)]).await;
    let envoy = Envoy::start("node-1", Xds::Tcp(tap.tap.addr.clone()), false).await;
    envoy
        .wait_stat("cluster_manager.cds.update_success", 1, 20)
        .await;
    let pushes = 60;
    for i in 1..=pushes {
        cp.set(Snapshot::standard(&format!("v{i}"), 1000 + i, 1000, 9));
        envoy
            .wait_stat("cluster_manager.cds.update_success", i as u64 + 1, 20)
            .await;
    }
    // Envoy got every version, and forwarding was never held up by the dead backend: each
    // push was answered within the export timeout (500 ms) that an export in the way
    // would have cost it.
    let answered: Vec<u64> = (tap.events().into_iter())
        .filter_map(|e| match e {
            xdstap::correlate::Event::Verdict {
                push,
                verdict: xdstap::correlate::Verdict::Ack,
                decided_at,
                ..
            } => Some((decided_at - push.at) / 1_000_000),
            _ => None,
        })
        .collect();
    assert!(answered.len() > pushes as usize, "{} acks", answered.len());
    let slowest = answered.iter().max().copied().unwrap_or_default();
    assert!(slowest < 500, "a push waited {slowest} ms for its answer");
    drop(envoy);
    let recorder = tap.recorder.clone();
    tap.close().await;
    // Every verdict, including the pushes left unanswered when Envoy went away, made a span.
    let spans = recorder
        .events()
        .iter()
        .filter(|e| matches!(e, xdstap::correlate::Event::Verdict { .. }))
        .count() as u64;
    tokio::time::timeout(Duration::from_secs(30), export)
        .await
        .expect("the export task ends after its last (failed) flush")
        .unwrap();
    let dropped = xdstap::proxy::counter(&stats.dropped);
    let exported = xdstap::proxy::counter(&stats.exported);
    assert_eq!(exported, 0);
    assert_eq!(dropped, spans, "every span is accounted for as dropped");
    assert!(
        xdstap::proxy::counter(&stats.export_errors) > 0,
        "export calls timed out"
    );
    // At most `queue` spans wait and `batch` are in flight: the rest were dropped at once, so
    // dropped-at-the-queue = spans - (exports attempted * batch) stays large.
    let errors = xdstap::proxy::counter(&stats.export_errors);
    assert!(
        errors * (batch as u64) < spans,
        "only {errors} batches were attempted for {spans} spans: the rest never queued"
    );
    held.abort();
}

/// An SDS Secret's private key, pushed through the `xdstap` binary with span export, event log
/// and debug logging on: it appears in no span, no log line, no event log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_private_key_appears_in_no_output() {
    use std::process::{Command, Stdio};
    let dir = support::TempDir::new("canary");
    let pki = support::certs::make(dir.path());
    let cert_pem = std::fs::read_to_string(&pki.server_cert).unwrap();
    let key_pem = std::fs::read_to_string(&pki.server_key).unwrap();
    // The canary: a stretch of the private key's base64 body.
    let body: String = key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let canary = body[10..50].to_string();
    let receiver = Receiver::grpc().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9).with(
        support::resources::SDS,
        support::resources::secret("gateway-cert", &cert_pem, &key_pem),
    ));
    let _server = cp.serve(listener);
    let sock = dir.path().join("tap.sock");
    let events = dir.path().join("events.jsonl");
    let stderr = dir.path().join("stderr.log");
    let mut tap = support::Child(
        Command::new(env!("CARGO_BIN_EXE_xdstap"))
            .args(["run", "--listen"])
            .arg(format!("unix:{}", sock.display()))
            .args([
                "--upstream",
                &cp_addr,
                "--otlp-endpoint",
                &receiver.endpoint,
            ])
            .args([
                "--otlp-protocol",
                "grpc",
                "--log-level",
                "debug",
                "--admin",
                "127.0.0.1:0",
                "--event-log",
            ])
            .arg(&events)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap(),
    );
    support::listening(&sock).await;
    let envoy = Envoy::start_sds("node-1", Xds::Unix(sock.clone()), "gateway-cert").await;
    let span = wait_span(&receiver, "SDS ack span", |s| {
        s.text("xds.type").as_deref() == Some("SDS")
            && s.text("xds.verdict").as_deref() == Some("ack")
    })
    .await;
    assert_eq!(span[0].strings("xds.resource_names"), ["gateway-cert"]);
    drop(envoy);
    // SIGTERM, so the tap flushes and exits as in production.
    tap.terminate();

    let log = std::fs::read_to_string(&stderr).unwrap();
    let event_log = std::fs::read_to_string(&events).unwrap();
    assert!(
        event_log.contains("gateway-cert"),
        "the secret's name is logged: {event_log}"
    );
    assert!(
        log.contains("SDS"),
        "debug logging saw the SDS exchange:\n{log}"
    );
    let mut spans = String::new();
    for s in receiver.spans() {
        spans.push_str(&format!("{:?}", s.span));
    }
    for (what, text) in [("log", &log), ("event log", &event_log), ("spans", &spans)] {
        assert!(
            !text.contains(&canary),
            "the private key leaked into the {what}"
        );
        assert!(!text.contains("PRIVATE KEY"), "key material in the {what}");
    }
}

/// Spans still waiting for their batch when the tap shuts down are delivered, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_waiting_spans() {
    let receiver = Receiver::http().await;
    let stats = Arc::new(SpanStats::default());
    let (sink, export) = xdstap::outputs::spans::start(
        SpanSettings {
            // Nothing would leave before shutdown on its own.
            interval: Duration::from_secs(3600),
            ..settings(&receiver.endpoint, Protocol::HttpProtobuf)
        },
        stats.clone(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let tap = XdsTap::with_sinks(TapOptions::new(&cp_addr), vec![Box::new(sink)]).await;
    let envoy = Envoy::start("node-1", Xds::Tcp(tap.tap.addr.clone()), false).await;
    envoy
        .wait_stat("cluster_manager.cds.update_success", 1, 20)
        .await;
    support::eventually(20, "four acks", || {
        (tap.verdicts().len() >= 4).then_some(())
    })
    .await;
    assert!(
        receiver.spans().is_empty(),
        "nothing exported before shutdown"
    );
    let recorder = tap.recorder.clone();
    tap.close().await;
    tokio::time::timeout(Duration::from_secs(20), export)
        .await
        .unwrap()
        .unwrap();
    let verdicts = recorder
        .events()
        .iter()
        .filter(|e| matches!(e, xdstap::correlate::Event::Verdict { .. }))
        .count();
    assert_eq!(receiver.spans().len(), verdicts);
    assert_eq!(xdstap::proxy::counter(&stats.exported), verdicts as u64);
    drop(envoy);
}

/// PGP and OpenSSH private keys quoted by Envoy in a NACK (each the "address" of a cluster it
/// rejects, so its message repeats it): through the `xdstap` binary, the NACK shows in
/// `/status`, `/rollouts`, CSDS, spans, the event log, the log and `xdstap watch`, and neither key
/// does, anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgp_and_openssh_keys_in_a_nack_appear_in_no_output() {
    use std::process::{Command, Stdio};
    use support::resources::{static_cluster, static_cluster_at, LDS};
    use support::scripted::{response, Scripted};
    let pgp = "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGPGPCANARYxyzzy\n=Ab1c\n-----END PGP PRIVATE KEY BLOCK-----";
    let ssh = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaCANARYplugh\n-----END OPENSSH PRIVATE KEY-----";
    let canaries = ["PGPCANARYxyzzy", "b3BlbnNzaCANARYplugh"];
    let dir = support::TempDir::new("keys");
    let receiver = Receiver::grpc().await;
    let cp = Scripted::default();
    cp.on_first(response(CDS, "1", "n1", vec![static_cluster("a", 1000, 9)]));
    cp.on_first(response(LDS, "1", "l1", vec![]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let _server = cp.serve(listener);
    let admin = support::free_addr();
    let sock = dir.path().join("tap.sock");
    let events = dir.path().join("events.jsonl");
    let stderr = dir.path().join("stderr.log");
    let _tap = support::Child(
        Command::new(env!("CARGO_BIN_EXE_xdstap"))
            .args(["run", "--listen"])
            .arg(format!("unix:{}", sock.display()))
            .args(["--upstream", &cp_addr, "--admin", &admin])
            .args([
                "--otlp-endpoint",
                &receiver.endpoint,
                "--otlp-protocol",
                "grpc",
            ])
            .args(["--log-level", "debug", "--event-log"])
            .arg(&events)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap(),
    );
    support::listening(&sock).await;
    let _envoy = Envoy::start("keys", Xds::Unix(sock.clone()), false).await;
    support::eventually(20, "the ACK of v1", || cp.answers_to("n1").first().cloned()).await;
    let (mut watch, watch_out) = support::watch_into(&admin, dir.path()).await;
    let bad = vec![
        static_cluster("a", 1000, 9),
        static_cluster_at("p", 1000, pgp, 9),
        static_cluster_at("s", 1000, ssh, 9),
    ];
    cp.send(vec![response(CDS, "2", "n2", bad)]).await;
    let answer = support::eventually(20, "the NACK", || cp.answers_to("n2").first().cloned()).await;
    let message = answer.error.expect("NACKed");
    assert!(
        message.contains(canaries[0]) && message.contains(canaries[1]),
        "{message}"
    );
    wait_span(&receiver, "the NACK span", |s| {
        s.text("xds.verdict").as_deref() == Some("nack")
    })
    .await;
    let (_, status) = support::http_get(&admin, "/status").await;
    assert!(
        status.contains("cluster(s) p: malformed IP address"),
        "{status}"
    );
    let (_, rollouts) = support::http_get(&admin, "/rollouts").await;
    assert!(rollouts.contains("[redacted private key]"), "{rollouts}");
    let csds = format!("{:?}", support::csds::fetch(&admin).await);
    support::eventually(10, "the NACK in watch", || {
        let out = std::fs::read_to_string(&watch_out).unwrap_or_default();
        out.contains("NACK").then_some(())
    })
    .await;
    watch.terminate();
    let watched = std::fs::read_to_string(&watch_out).unwrap();
    let (_, csds_status, _) =
        support::xdstap(&["status", "--admin", &admin, "--node", "keys", "--resources"]).await;
    let log = std::fs::read_to_string(&stderr).unwrap();
    let event_log = std::fs::read_to_string(&events).unwrap();
    let spans: String = receiver
        .spans()
        .iter()
        .map(|s| format!("{:?}", s.span))
        .collect();
    let lines: Vec<String> = watched.lines().map(String::from).collect();
    assert!(lines.iter().any(|l| l.contains("redacted")), "{watched}");
    for (what, text) in [
        ("status", &status),
        ("rollouts", &rollouts),
        ("CSDS", &csds),
        ("status --resources", &csds_status),
        ("watch", &watched),
        ("log", &log),
        ("event log", &event_log),
        ("spans", &spans),
    ] {
        for canary in canaries {
            assert!(
                !text.contains(canary),
                "a private key in the {what}:\n{text}"
            );
        }
        assert!(
            !text.contains("PRIVATE KEY"),
            "key armor in the {what}:\n{text}"
        );
    }
}

/// A tap tier answers as one trace: two taps with the same `--control-plane-id`, each in front
/// of the same control plane with a real Envoy behind it, export to one OTLP receiver, and a
/// version's pushes through either tap are spans of one trace; a tap with another control-plane
/// id puts the same version in a trace of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_taps_with_one_control_plane_id_give_one_trace_per_version() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let receiver = Receiver::grpc().await;
    let mut taps = Vec::new();
    let mut envoys = Vec::new();
    for (node, id) in [
        ("tier-1", "istiod-a"),
        ("tier-2", "istiod-a"),
        ("other", "istiod-b"),
    ] {
        let settings = SpanSettings {
            control_plane_id: id.into(),
            ..settings(&receiver.endpoint, Protocol::Grpc)
        };
        let (sink, export) =
            xdstap::outputs::spans::start(settings, Arc::new(SpanStats::default())).unwrap();
        let tap = XdsTap::with_sinks(TapOptions::new(&cp_addr), vec![Box::new(sink)]).await;
        envoys.push(Envoy::start(node, Xds::Tcp(tap.tap.addr.clone()), false).await);
        taps.push((tap, export));
    }
    let trace = |node: &'static str| {
        let receiver = &receiver;
        async move {
            let s = wait_span(receiver, &format!("{node} CDS v1 ack"), |s| {
                is(s, node, "CDS", "v1", "ack")
            })
            .await;
            s[0].trace_id()
        }
    };
    let (one, two, other) = (
        trace("tier-1").await,
        trace("tier-2").await,
        trace("other").await,
    );
    assert_eq!(one, two, "one version, two taps of one tier: one trace");
    assert_ne!(
        one, other,
        "another control plane's version 1 is another trace"
    );
    drop(envoys);
}

/// With no span flag or key, the OpenTelemetry environment turns export on, as the SDKs read
/// it: `OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_EXPORTER_OTLP_PROTOCOL` given to the `xdstap`
/// binary, a real Envoy through it, and its CDS push's span reaches the receiver over gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_otel_environment_turns_spans_on() {
    use std::process::{Command, Stdio};
    let dir = support::TempDir::new("otel-env");
    let receiver = Receiver::grpc().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let _server = cp.serve(listener);
    let sock = dir.path().join("tap.sock");
    let mut tap = support::Child(
        Command::new(env!("CARGO_BIN_EXE_xdstap"))
            .args(["run", "--listen"])
            .arg(format!("unix:{}", sock.display()))
            .args(["--upstream", &cp_addr, "--admin", "off"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    support::listening(&sock).await;
    let envoy = Envoy::start("node-1", Xds::Unix(sock.clone()), false).await;
    let span = wait_span(&receiver, "the CDS ack span", |s| {
        s.text("xds.type").as_deref() == Some("CDS")
            && s.text("xds.verdict").as_deref() == Some("ack")
    })
    .await;
    assert_eq!(span[0].text("xds.node.id").as_deref(), Some("node-1"));
    assert_eq!(span[0].text("xds.version").as_deref(), Some("v1"));
    drop(envoy);
    tap.terminate();
}
