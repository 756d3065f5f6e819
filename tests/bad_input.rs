//! Hostile and broken input: each case is forwarded as it came (the upstream decides what to do
//! with it, as without the tap), what the tap cannot follow stops its observation of that
//! connection and is counted, and a healthy stream on the same tap still works.

mod support;

use std::time::Duration;

use bytes::Bytes;
use support::raw;
use support::tap::{get, TapOptions, XdsTap};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use xdstap::observe::TapStats;

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

/// Writes `bytes` on a fresh connection and expects it closed (by the upstream, passed on).
async fn closed_after(tap: &XdsTap, bytes: &[u8]) {
    let mut s = TcpStream::connect(&tap.tap.addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue, // the tap's SETTINGS or GOAWAY before it closes
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection was closed");
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
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.unwrap();
        let _ = recv.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    out
}

/// Not HTTP/2: the bytes go to the upstream, which closes, and the close is passed on; the tap
/// counts each connection it could not observe.
#[tokio::test]
async fn bytes_that_are_not_http2_and_a_bad_preface_are_passed_on_and_counted() {
    let (tap, _server) = setup().await;
    closed_after(&tap, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    closed_after(&tap, b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n").await;
    closed_after(&tap, &[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5]).await; // a TLS hello
    support::eventually(5, "three unobservable connections counted", || {
        (tap.tap.stats.stopped("not_http2") == 3).then_some(())
    })
    .await;
    healthy(&tap).await;
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
    assert_eq!(
        TapStats::get(&tap.stats.decode_too_large),
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
    assert_eq!(
        TapStats::get(&tap.stats.decode_invalid),
        2,
        "request and echoed response"
    );

    let snappy = grpc(1, b"\x00\x01\x02snappy-bytes");
    let echoed = ads_exchange(&tap, &[("grpc-encoding", "snappy")], snappy.clone()).await;
    assert_eq!(echoed, snappy.to_vec());
    assert!(TapStats::get(&tap.stats.decode_encoding) >= 1);
    assert_eq!(TapStats::get(&tap.stats.decoded), 0);
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
        while let Some(chunk) = recv.data().await {
            let chunk = chunk?;
            let _ = recv.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        if let Ok(Some(t)) = recv.trailers().await {
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
    assert!(get(&tap.tap.stats.peak_buffered) <= xdstap::proxy::READ_CHUNK as u64);
}
