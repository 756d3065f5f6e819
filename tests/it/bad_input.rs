//! Hostile and broken input: each case is forwarded as it came (the upstream decides what to do
//! with it, as without the tap), what the tap cannot follow stops its observation of that
//! connection and is counted, and a healthy stream on the same tap still works.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use support::raw;
use support::scripted::{response, Scripted};
use support::tap::{TapOptions, XdsTap};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use xdstap::proxy::counter;

const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

async fn setup() -> (XdsTap, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let server = raw::serve_tcp(listener, raw::Log::default());
    (XdsTap::start(TapOptions::new(&upstream)).await, server)
}

/// A healthy exchange through the tap: the body comes back whole.
async fn healthy(tap: &XdsTap) {
    let mut client = raw::client(TcpStream::connect(&tap.tap.addr).await.unwrap()).await;
    let body = Bytes::from(vec![7u8; 100_000]);
    let (_, data, trailers) = tokio::time::timeout(
        Duration::from_secs(10),
        raw::exchange(&mut client, "/echo", body.clone()),
    )
    .await
    .expect("a healthy stream is not held up")
    .unwrap();
    assert_eq!(data, body);
    assert_eq!(trailers.unwrap().get("grpc-status").unwrap(), "0");
}

fn grpc(flag: u8, body: &[u8]) -> Bytes {
    let mut out = vec![flag];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out.into()
}

/// Sends `body` on an ADS stream (with extra request headers) and returns what came back.
async fn ads_exchange(tap: &XdsTap, headers: &[(&str, &str)], body: Bytes) -> Vec<u8> {
    let client = raw::client(TcpStream::connect(&tap.tap.addr).await.unwrap()).await;
    let mut c = client.ready().await.unwrap();
    let mut req = raw::request(ADS);
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            http::HeaderValue::from_str(v).unwrap(),
        );
    }
    let (resp, mut send) = c.send_request(req, false).unwrap();
    send.send_data(body, true).unwrap();
    let mut recv = resp.await.unwrap().into_body();
    let mut out = Vec::new();
    while let Some(chunk) = support::within(30, "the next DATA", recv.data()).await {
        let chunk = chunk.unwrap();
        let _ = recv.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    out
}

/// Not HTTP/2: the bytes go to the upstream as they were sent, the upstream closes, and the
/// close is passed on (the client reads its end, not an error); the tap counts each connection
/// it could not observe.
#[tokio::test]
async fn bytes_that_are_not_http2_and_a_bad_preface_are_passed_on_and_counted() {
    let sent: [&[u8]; 3] = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n",
        &[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5], // a TLS hello
    ];
    // An upstream that reads until it has one of them whole, keeps it, and closes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let kept = got.clone();
    let _upstream = tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut read = Vec::new();
            let mut buf = [0u8; 256];
            while !sent.iter().any(|b| *b == read) {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read.extend_from_slice(&buf[..n]),
                }
            }
            kept.lock().unwrap().push(read);
        }
    });
    let tap = XdsTap::start(TapOptions::new(&upstream)).await;
    for bytes in sent {
        let mut s = TcpStream::connect(&tap.tap.addr).await.unwrap();
        s.write_all(bytes).await.unwrap();
        let mut back = Vec::new();
        let end = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut back)).await;
        let end = end.expect("the connection was closed");
        assert!(
            end.is_ok(),
            "the upstream's close arrives as a close: {end:?}"
        );
        assert!(
            back.is_empty(),
            "nothing but the upstream's close: {back:?}"
        );
    }
    assert_eq!(
        *got.lock().unwrap(),
        sent.map(<[u8]>::to_vec),
        "what the upstream read"
    );
    support::eventually(5, "three unobservable connections counted", || {
        (tap.tap.stats.stopped("not_http2") == 3).then_some(())
    })
    .await;
}

/// A header block past the tap's bound (64 KiB) is forwarded like any other: the upstream
/// answers it, and the tap stops observing that connection (counted), which keeps working.
#[tokio::test]
async fn an_oversized_header_block_stops_observation_not_forwarding() {
    let (tap, _server) = setup().await;
    let client = raw::client(TcpStream::connect(&tap.tap.addr).await.unwrap()).await;
    let mut c = client.clone().ready().await.unwrap();
    let mut req = raw::request("/echo");
    req.headers_mut().insert(
        "x-huge",
        http::HeaderValue::from_str(&"h".repeat(100 << 10)).unwrap(),
    );
    let (resp, _) = c.send_request(req, true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(
        resp.status(),
        http::StatusCode::OK,
        "the upstream answered it"
    );
    assert_eq!(tap.tap.stats.stopped("header_block_too_large"), 1);
    // The same connection still carries a stream, unobserved.
    let mut client = client;
    let (_, data, _) = raw::exchange(&mut client, "/echo", Bytes::from_static(b"ok"))
        .await
        .unwrap();
    assert_eq!(data, b"ok");
    healthy(&tap).await;
}

#[tokio::test]
async fn a_length_prefix_claiming_4_gib_is_forwarded_and_counted_at_once() {
    let (tap, _server) = setup().await;
    // A prefix claiming u32::MAX bytes, then a little of that "message": the stream ends first.
    let mut wire = vec![0u8, 0xff, 0xff, 0xff, 0xff];
    wire.extend_from_slice(b"not really four gigabytes");
    let echoed = ads_exchange(&tap, &[], Bytes::from(wire.clone())).await;
    assert_eq!(echoed, wire, "forwarded byte for byte");
    tap.observer.caught_up().await;
    assert_eq!(
        xdstap::proxy::counter(&tap.stats.decode_too_large),
        2,
        "the request and its echo, each counted as its prefix passed"
    );
    healthy(&tap).await;
}

#[tokio::test]
async fn invalid_protobuf_and_an_unknown_encoding_are_forwarded_and_counted() {
    let (tap, _server) = setup().await;
    // Field 1 claims 100 bytes and there are 3.
    let bad = grpc(0, &[0x0a, 100, 1, 2, 3]);
    assert_eq!(ads_exchange(&tap, &[], bad.clone()).await, bad.to_vec());
    tap.observer.caught_up().await;
    assert_eq!(
        xdstap::proxy::counter(&tap.stats.decode_invalid),
        2,
        "request and echoed response"
    );

    let snappy = grpc(1, b"\x00\x01\x02snappy-bytes");
    let echoed = ads_exchange(&tap, &[("grpc-encoding", "snappy")], snappy.clone()).await;
    assert_eq!(echoed, snappy.to_vec());
    tap.observer.caught_up().await;
    assert!(xdstap::proxy::counter(&tap.stats.decode_encoding) >= 1);
    assert_eq!(xdstap::proxy::counter(&tap.stats.decoded), 0);
    healthy(&tap).await;
}

/// A flood of one-byte DATA frames on one stream. The tap forwards it in order within the window
/// or, when more small frames pile up than its overhead budget allows, the upstream's HTTP/2
/// (h2 here) cuts that connection with GOAWAY ENHANCE_YOUR_CALM, which the tap passes on with
/// the close, as without it. Either way, streams on other connections are not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_flood_on_one_stream_leaves_the_others_alone() {
    let (tap, _server) = setup().await;
    let client = raw::client(TcpStream::connect(&tap.tap.addr).await.unwrap()).await;
    let mut c = client.clone().ready().await.unwrap();
    let (resp, mut send) = c.send_request(raw::request("/echo"), false).unwrap();
    let frames = 50_000u32;
    let flood = tokio::spawn(async move {
        for i in 0..frames {
            send.reserve_capacity(1);
            if std::future::poll_fn(|cx| send.poll_capacity(cx))
                .await
                .is_none()
            {
                return;
            }
            if send
                .send_data(Bytes::from(vec![(i % 251) as u8]), false)
                .is_err()
            {
                return;
            }
        }
        let _ = send.send_data(Bytes::new(), true);
    });
    for _ in 0..3 {
        healthy(&tap).await;
    }
    flood.await.unwrap();
    let mut status: Option<http::HeaderValue> = None;
    let status_ref = &mut status;
    let outcome = async {
        let resp = resp.await?;
        *status_ref = resp.headers().get("grpc-status").cloned();
        let mut recv = resp.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = support::within(30, "the next DATA", recv.data()).await {
            let chunk = chunk?;
            let _ = recv.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        if let Ok(Some(t)) = support::within(30, "the trailers", recv.trailers()).await {
            if status_ref.is_none() {
                *status_ref = t.get("grpc-status").cloned();
            }
        }
        Ok::<_, h2::Error>(got)
    }
    .await;
    let want: Vec<u8> = (0..frames).map(|i| (i % 251) as u8).collect();
    match outcome {
        Ok(got) => assert_eq!(got, want, "the bytes arrived whole and unaltered"),
        // The upstream's flood protection: its GOAWAY reached the client as sent, or the closed
        // connection after it.
        Err(e) => assert!(
            e.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM) || e.is_io() || e.is_go_away(),
            "only the upstream's flood protection may cut it: {e}"
        ),
    }
    let _ = status;
    healthy(&tap).await;
    assert!(counter(&tap.tap.stats.peak_buffered) <= xdstap::proxy::READ_CHUNK as u64);
}

/// An HTTP/2 frame header and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len() as u32;
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The HPACK reference bomb, written by hand: a first block puts a 4,000-byte `:path` into the
/// dynamic table (index 62); every later block is 16,000 one-byte references to it, each a
/// new stream: 64 MB of fields from 16 KB of wire, `blocks` times.
fn hpack_bomb(blocks: u32) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(4, 0, 0, &[]));
    // :method POST, :scheme http, :path (indexed name 4) with a 4,000-byte literal value, added
    // to the table; :authority and content-type without indexing.
    let mut first = vec![0x83, 0x86, 0x44, 0x7f, 0xa1, 0x1e];
    first.extend(std::iter::repeat_n(b'a', 4000));
    first.extend([0x01, 0x01, b'x', 0x0f, 0x10, 0x10]);
    first.extend(b"application/grpc");
    out.extend(frame(1, 0x5, 1, &first));
    let mut bomb = vec![0x83, 0x86];
    bomb.extend(std::iter::repeat_n(0xbe, 16_000));
    for k in 0..blocks {
        out.extend(frame(1, 0x5, 3 + 2 * k, &bomb));
    }
    out
}

/// The `xdstap` binary on loopback with `args` (under `nofile` open files when given, by
/// prlimit), its log in `log`: (process, listen, admin).
async fn tap_process_with(
    args: &[&str],
    upstream: &str,
    nofile: Option<u32>,
    log: std::process::Stdio,
) -> (support::Child, String, String) {
    let (listen, admin) = (support::free_addr(), support::free_addr());
    let mut command = match nofile {
        Some(n) => {
            let mut c = std::process::Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}"))
                .arg(env!("CARGO_BIN_EXE_xdstap"));
            c
        }
        None => std::process::Command::new(env!("CARGO_BIN_EXE_xdstap")),
    };
    let child = support::Child(
        command
            .args([
                "run",
                "--listen",
                &listen,
                "--admin",
                &admin,
                "--upstream",
                upstream,
            ])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    support::eventually(10, "the tap listening", || {
        std::net::TcpStream::connect(&admin).ok().map(|_| ())
    })
    .await;
    (child, listen, admin)
}

async fn tap_process(threads: &str, upstream: &str) -> (support::Child, String, String) {
    tap_process_with(
        &["--threads", threads],
        upstream,
        None,
        std::process::Stdio::null(),
    )
    .await
}

/// A control plane with one cluster, and a real Envoy through `listen` once it has it.
async fn envoy_through(cp: &Scripted, listen: &str, node: &str) -> support::envoy::Envoy {
    use support::envoy::{Envoy, Xds};
    let envoy = Envoy::start(node, Xds::Tcp(listen.to_string()), false).await;
    support::eventually(20, "Envoy's first ACK", || {
        (cp.requests().iter())
            .any(|r| r.version_info == "0" && r.type_url == support::resources::CDS)
            .then_some(())
    })
    .await;
    envoy
}

/// Pushes version `round` to every stream and returns how long the answer took: from the push
/// to when the control plane read the answer (not when this test, polling, saw it).
async fn push_answered_in(cp: &Scripted, round: i64) -> Duration {
    use support::resources::{static_cluster, CDS};
    let nonce = format!("p{round}");
    let t0 = std::time::Instant::now();
    let cluster = static_cluster("a", 1000 + round, 9);
    cp.send(vec![response(
        CDS,
        &round.to_string(),
        &nonce,
        vec![cluster],
    )])
    .await;
    let answer = support::eventually(10, "Envoy's answer", || {
        cp.answers_to(&nonce).first().cloned()
    })
    .await;
    answer.at.saturating_duration_since(t0)
}

fn scripted() -> Scripted {
    use support::resources::{static_cluster, CDS, LDS};
    let cp = Scripted::default();
    cp.on_first(response(CDS, "0", "n0", vec![static_cluster("a", 1000, 9)]));
    cp.on_first(response(LDS, "0", "l0", vec![]));
    cp
}

/// Writes `bytes` to the tap at `listen` on a fresh connection while reading whatever comes
/// back, then closes it; says whether the tap took every byte.
fn write_through(listen: &str, bytes: std::sync::Arc<Vec<u8>>) -> std::thread::JoinHandle<bool> {
    let listen = listen.to_string();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&listen).unwrap();
        let mut sink = s.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            while matches!(sink.read(&mut buf), Ok(n) if n > 0) {}
        });
        let wrote = s.write_all(&bytes).is_ok();
        let _ = s.shutdown(std::net::Shutdown::Both);
        let _ = reader.join();
        wrote
    })
}

/// Resident memory of process `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    (status.lines().find(|l| l.starts_with("VmRSS:")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Open descriptors of process `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// 1,000 connections that never send the HTTP/2 preface: the tap dials the control plane for
/// none of them (its descriptors grow by one each, not two), a real Envoy's pushes through the
/// same tap are answered within 100 ms, and a silent connection is closed after 10 s, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_speak_cost_one_descriptor_and_stall_nothing() {
    let cp = scripted();
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let (tap, listen, admin) = tap_process("1", &upstream).await;
    let _envoy = envoy_through(&cp, &listen, "silent").await;
    let before = fds(tap.id());
    let silent: Vec<std::net::TcpStream> = (0..1000)
        .map(|_| std::net::TcpStream::connect(&listen).unwrap())
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fds(tap.id()) < before + 1000 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let during = fds(tap.id());
    assert!(
        during >= before + 1000 && during < before + 1100,
        "{before} -> {during} descriptors"
    );
    for round in 1..=5 {
        let took = push_answered_in(&cp, round).await;
        assert!(took < Duration::from_millis(100), "a push took {took:?}");
    }
    support::eventually(20, "the silent connections closed", || {
        (fds(tap.id()) < before + 10).then_some(())
    })
    .await;
    let (_, text) = support::http_get(&admin, "/metrics").await;
    let m = support::prom::parse(&text).unwrap();
    assert_eq!(
        m.get("xdstap_silent_connections_total", &[]),
        1000.0,
        "{text}"
    );
    drop(silent);
}

/// With `--max-connections 3`, a real Envoy and two clients that spoke HTTP/2 hold the three
/// places: a fourth connection is closed at once (counted, logged once), the Envoy's pushes are
/// still answered, and once a client leaves a new connection is relayed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_a_new_connection_is_closed_at_once() {
    use std::io::{Read, Write};
    let cp = scripted();
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let log = support::TempDir::new("max-conn");
    let log_path = log.path().join("tap.log");
    let stdio = std::fs::File::create(&log_path).unwrap().into();
    let (_tap, listen, admin) =
        tap_process_with(&["--max-connections", "3"], &upstream, None, stdio).await;
    let _envoy = envoy_through(&cp, &listen, "limited").await;
    // A client that spoke: the preface and SETTINGS out, the upstream's SETTINGS back.
    let speak = || -> std::io::Result<(std::net::TcpStream, u8)> {
        let mut c = std::net::TcpStream::connect(&listen)?;
        c.set_read_timeout(Some(Duration::from_secs(5)))?;
        c.write_all(xdstap::proxy::PREFACE)?;
        c.write_all(&frame(4, 0, 0, &[]))?;
        let mut head = [0u8; 9];
        c.read_exact(&mut head)?;
        Ok((c, head[3]))
    };
    let (first, kind) = speak().unwrap();
    assert_eq!(kind, 4, "the upstream's SETTINGS through the tap");
    let (_second, kind) = speak().unwrap();
    assert_eq!(kind, 4);
    let t0 = std::time::Instant::now();
    assert!(
        speak().is_err(),
        "a fourth connection is closed, not relayed"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "closed in {:?}",
        t0.elapsed()
    );
    let took = push_answered_in(&cp, 1).await;
    assert!(took < Duration::from_millis(100), "a push took {took:?}");
    drop(first);
    support::eventually(5, "a place free again", || speak().ok()).await;
    let (_, text) = support::http_get(&admin, "/metrics").await;
    let m = support::prom::parse(&text).unwrap();
    assert!(
        m.get("xdstap_refused_connections_total", &[]) >= 1.0,
        "{text}"
    );
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(text.matches("max_connections open").count(), 1, "{text}");
}

/// 300 admin clients that send part of their headers and stop, against a tap allowed 256 open
/// files: the admin server holds at most an eighth of the limit (32; the rest wait in the
/// kernel's backlog, holding no descriptor), so the xDS listener still accepts a new Envoy,
/// which gets its config within a second of starting, and its pushes are answered within
/// 100 ms; the log says so at most once per 5 s instead of 30 times a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_admin_clients_under_a_low_file_limit_stop_no_config() {
    let cp = scripted();
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let dir = support::TempDir::new("nofile");
    let log = dir.path().join("tap.log");
    let stdio = std::process::Stdio::from(std::fs::File::create(&log).unwrap());
    let (tap, listen, admin) = tap_process_with(&[], &upstream, Some(256), stdio).await;
    // Connecting at once: past the admin server's share and the listener's backlog, the rest
    // retry their SYNs until a place frees; each holds on to what it got.
    let slow: Vec<_> = (0..300)
        .map(|_| {
            let admin = admin.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let mut s = tokio::net::TcpStream::connect(&admin).await.ok()?;
                let _ = s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n").await;
                Some(s)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let held = fds(tap.id());
    assert!(held < 64, "the tap holds {held} descriptors");
    let started = std::time::Instant::now();
    let _envoy = envoy_through(&cp, &listen, "late").await;
    let took = started.elapsed();
    eprintln!("a new Envoy had its config {took:?} after it started");
    assert!(
        took < Duration::from_secs(1),
        "the new Envoy's config took {took:?}"
    );
    for round in 1..=5 {
        let took = push_answered_in(&cp, round).await;
        assert!(took < Duration::from_millis(100), "a push took {took:?}");
    }
    for s in slow {
        s.abort();
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let failures = text.matches("Accept failed").count();
    assert!(failures <= 2, "{failures} accept failures logged:\n{text}");
}

/// One client's HPACK references must not stall the others: with one and two attackers, on one
/// worker thread and on two, a push to a real Envoy through the same tap is answered within
/// 100 ms of the control plane sending it while the bombs go through (each taken whole),
/// and observation of each attacking connection stops, counted as `header_list`; the tap's
/// memory stays under 64 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpack_reference_bomb_stalls_no_other_connection() {
    let cp = scripted();
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let bomb = std::sync::Arc::new(hpack_bomb(500));
    let mut round = 0;
    for threads in ["1", "2"] {
        let (tap, listen, admin) = tap_process(threads, &upstream).await;
        let envoy = envoy_through(&cp, &listen, &format!("bombed-{threads}")).await;
        for attackers in [1usize, 2] {
            let writers: Vec<_> = (0..attackers)
                .map(|_| write_through(&listen, bomb.clone()))
                .collect();
            // Pushes while the bombs go through, each answered in time.
            tokio::time::sleep(Duration::from_millis(50)).await;
            for _ in 0..5 {
                round += 1;
                let took = push_answered_in(&cp, round).await;
                eprintln!("threads {threads}, {attackers} attacker(s): push answered in {took:?}");
                assert!(
                    took < Duration::from_millis(100),
                    "threads {threads}, {attackers} attacker(s): a push took {took:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            for w in writers {
                assert!(w.join().unwrap(), "the tap took the bomb whole");
            }
        }
        let kib = rss_kib(tap.id());
        eprintln!("threads {threads}: the tap's RSS after the bombs {kib} KiB");
        assert!(kib < 64 << 10, "the tap holds {kib} KiB");
        let (_, text) = support::http_get(&admin, "/metrics").await;
        let m = support::prom::parse(&text).unwrap();
        let stopped = m.get(
            "xdstap_observation_stopped_total",
            &[("reason", "header_list")],
        );
        assert_eq!(stopped, 3.0, "{text}");
        drop(envoy);
    }
}

/// A request header block for `path`, by hand (no dynamic table).
fn request_block(path: &str) -> Vec<u8> {
    let mut b = vec![0x83, 0x86, 0x04, path.len() as u8];
    b.extend(path.as_bytes());
    b.extend([0x01, 0x01, b'x', 0x0f, 0x10, 0x10]);
    b.extend(b"application/grpc");
    b
}

/// The attacks of many small pieces: a header block continued 1 byte at a time, 1-byte DATA
/// frames on an ADS stream, and empty gRPC messages 5 bytes each; `size` bytes in all.
fn small_pieces(kind: &str, size: usize) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(4, 0, 0, &[]));
    let block = request_block(ADS);
    match kind {
        "continuation" => {
            out.extend(frame(1, 0, 1, &block[..1]));
            for b in block[1..].iter().cycle().take(size) {
                out.extend(frame(9, 0, 1, &[*b]));
            }
        }
        "data" => {
            out.extend(frame(1, 0x4, 1, &block));
            let message = grpc(0, &[]);
            for b in message.iter().cycle().take(size / 10) {
                out.extend(frame(0, 0, 1, &[*b]));
            }
        }
        "nested" => {
            // One request whose node's metadata is a message nested about `size / 6` deep.
            fn varint(mut n: usize, out: &mut Vec<u8>) {
                while n >= 0x80 {
                    out.push((n as u8) | 0x80);
                    n >>= 7;
                }
                out.push(n as u8);
            }
            // Built from the inside out: each level is a tag and the length of what it holds.
            let mut prefixes: Vec<Vec<u8>> = Vec::new();
            let mut held = 0usize;
            while held < size / 2 {
                let mut p = vec![0x0a];
                varint(held, &mut p);
                held += p.len();
                prefixes.push(p);
            }
            let nested: Vec<u8> = prefixes.into_iter().rev().flatten().collect();
            let mut node = vec![0x1a];
            varint(nested.len(), &mut node);
            node.extend(nested);
            let mut request = vec![0x12];
            varint(node.len(), &mut request);
            request.extend(node);
            out.extend(frame(1, 0x4, 1, &block));
            for chunk in grpc(0, &request).chunks(16_000) {
                out.extend(frame(0, 0, 1, chunk));
            }
        }
        _ => {
            out.extend(frame(1, 0x4, 1, &block));
            let messages: Vec<u8> = (0..size / 5).flat_map(|_| grpc(0, &[]).to_vec()).collect();
            for chunk in messages.chunks(16_000) {
                out.extend(frame(0, 0, 1, chunk));
            }
        }
    }
    out
}

/// Floods of small pieces (CONTINUATION frames of one byte, 1-byte DATA frames, empty gRPC
/// messages) and one deeply nested protobuf message, each 8 MB: a real Envoy's pushes through
/// the same tap, on one worker thread, are answered in time while they go through (the median
/// of five within 100 ms, 250 ms for the messages; about 21 ms measured), and the tap's memory
/// stays under 64 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_small_pieces_stall_no_other_connection() {
    let cp = scripted();
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let (tap, listen, _admin) = tap_process("1", &upstream).await;
    let _envoy = envoy_through(&cp, &listen, "flooded").await;
    let mut round = 0;
    for kind in ["continuation", "data", "messages", "nested"] {
        let bytes = std::sync::Arc::new(small_pieces(kind, 8 << 20));
        let writer = write_through(&listen, bytes);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut took = Vec::new();
        for _ in 0..5 {
            round += 1;
            took.push(push_answered_in(&cp, round).await);
            eprintln!("{kind}: push answered in {:?}", took[took.len() - 1]);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The control plane here decodes the 1.6 million empty messages too, on the two cores
        // the test, the tap and Envoy share (and the other tests, when they run together):
        // its own delay shows in the first push (up to about 90 ms measured), so that flood is
        // given 250 ms. The median of the five: one push held up by the machine's scheduling
        // (2.5 s once, with the whole suite running) is not the flood's doing; a flood that
        // held up the tap held up every push (more than 10 s each before the bounds).
        took.sort();
        let bound = Duration::from_millis(if kind == "messages" { 250 } else { 100 });
        assert!(took[2] < bound, "{kind}: pushes took {took:?}");
        // The upstream may end a flood early (its own limits): what matters is the others.
        let _ = writer.join();
        let kib = rss_kib(tap.id());
        eprintln!("{kind}: the tap's RSS {kib} KiB");
        assert!(kib < 64 << 10, "{kind}: the tap holds {kib} KiB");
    }
}
