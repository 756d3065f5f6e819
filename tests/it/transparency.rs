//! The tap is invisible: bodies, header fields, trailers, statuses and reset codes arrive
//! unchanged, for any method, in both directions, at any size, and resets propagate.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use h2::Reason;
use support::echo::{self, digest, pattern};
use support::raw;
use support::tap::{Tap, TapOptions};
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use xdstap::proxy::counter;

async fn echo_upstream() -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (addr, echo::serve_tcp(listener).await)
}

async fn channel(url: String) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn unary_body_metadata_and_error_status_pass_unchanged() {
    let (upstream, _stop) = echo_upstream().await;
    let tap = Tap::start(&upstream).await;
    let mut client = echo::client(channel(tap.url()).await);

    client.ready().await.unwrap();
    let body = pattern(1, 100_000);
    let mut req = tonic::Request::new(body.clone());
    req.metadata_mut()
        .insert("x-custom", "value-1".parse().unwrap());
    let resp = client
        .unary(req, echo::path(echo::UNARY), echo::BytesCodec)
        .await
        .unwrap();
    assert_eq!(resp.metadata().get("x-echo-custom").unwrap(), "value-1");
    assert_eq!(digest(resp.get_ref()), digest(&body));

    client.ready().await.unwrap();
    let mut req = tonic::Request::new(Bytes::from_static(b"x"));
    req.metadata_mut().insert("x-fail", "9".parse().unwrap());
    let status = client
        .unary(req, echo::path(echo::UNARY), echo::BytesCodec)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(status.message(), "failed on purpose: ünïcode %");
    assert_eq!(status.metadata().get("x-trailer").unwrap(), "kept");
    assert_eq!(counter(&tap.stats.streams_total), 2);
}

#[tokio::test]
async fn server_streaming_and_100_concurrent_bidi_streams() {
    let (upstream, _stop) = echo_upstream().await;
    let tap = Tap::start(&upstream).await;
    let client = echo::client(channel(tap.url()).await);

    let mut c = client.clone();
    c.ready().await.unwrap();
    let resp = c
        .server_streaming(
            tonic::Request::new(Bytes::from_static(b"20:100000")),
            echo::path(echo::SERVER_STREAM),
            echo::BytesCodec,
        )
        .await
        .unwrap();
    let got: Vec<Bytes> = resp.into_inner().map(|m| m.unwrap()).collect().await;
    assert_eq!(got.len(), 20);
    for (i, m) in got.iter().enumerate() {
        assert_eq!(
            digest(m),
            digest(&pattern(i as u64, 100_000)),
            "message {i}"
        );
    }

    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..100u64 {
        let mut c = client.clone();
        tasks.spawn(async move {
            let sent: Vec<Bytes> = (0..10)
                .map(|i| pattern(s * 100 + i, ((s * 7919 + i * 104_729) % 70_000) as usize))
                .collect();
            c.ready().await.unwrap();
            let out = tokio_stream::iter(sent.clone());
            let resp = c
                .streaming(
                    tonic::Request::new(out),
                    echo::path(echo::BIDI),
                    echo::BytesCodec,
                )
                .await
                .unwrap();
            let got: Vec<Bytes> = resp.into_inner().map(|m| m.unwrap()).collect().await;
            let a: Vec<u64> = sent.iter().map(|b| digest(b)).collect();
            let b: Vec<u64> = got.iter().map(|b| digest(b)).collect();
            assert_eq!(a, b, "stream {s}");
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    assert_eq!(counter(&tap.stats.streams_total), 101);
}

#[tokio::test]
async fn one_64_mib_message_each_way() {
    let (upstream, _stop) = echo_upstream().await;
    let tap = Tap::start(&upstream).await;
    let mut client = echo::client(channel(tap.url()).await);
    let big = pattern(64, 64 << 20);
    client.ready().await.unwrap();
    let resp = client
        .streaming(
            tonic::Request::new(tokio_stream::iter(vec![big.clone()])),
            echo::path(echo::BIDI),
            echo::BytesCodec,
        )
        .await
        .unwrap();
    let got: Vec<Bytes> = resp.into_inner().map(|m| m.unwrap()).collect().await;
    assert_eq!(got.len(), 1);
    assert_eq!(digest(&got[0]), digest(&big));
    assert!(counter(&tap.stats.request_bytes) > 64 << 20);
    assert!(counter(&tap.stats.response_bytes) > 64 << 20);
}

#[tokio::test]
async fn header_fields_trailers_and_any_path_are_exact() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let log = raw::Log::default();
    let _server = raw::serve_tcp(listener, log.clone());
    let tap = Tap::start(&upstream).await;
    let mut client = raw::client(tokio::net::TcpStream::connect(&tap.addr).await.unwrap()).await;

    let body = pattern(3, 300_000);
    let (resp, data, trailers) = raw::exchange(&mut client, "/echo", body.clone())
        .await
        .unwrap();
    assert_eq!(resp.headers().get("x-resp").unwrap(), "1");
    assert_eq!(data.len(), body.len());
    assert_eq!(digest(&data), digest(&body));
    let trailers = trailers.unwrap();
    assert_eq!(trailers.get("x-trailer").unwrap(), "t1");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");

    let seen = log.lock().unwrap()[0].clone();
    let sent = raw::request("/echo");
    assert_eq!(seen.path, "/echo");
    for (name, _) in sent.headers() {
        let a: Vec<_> = sent.headers().get_all(name).iter().collect();
        let b: Vec<_> = seen.headers.get_all(name).iter().collect();
        assert_eq!(a, b, "header {name}");
    }
    assert_eq!(seen.trailers.unwrap().get("x-req-trailer").unwrap(), "r1");
    assert_eq!(seen.body_digest, digest(&body));
}

/// A server that ends the call while the client is still sending (response, trailers, then
/// RST_STREAM NO_ERROR, as gRPC servers do): the client still gets the whole response and the
/// status, and is told to stop sending with the same NO_ERROR.
#[tokio::test]
async fn a_whole_response_then_no_error_reset_arrives_whole() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let _server = raw::serve_tcp(listener, raw::Log::default());
    let tap = Tap::start(&upstream).await;
    let client = raw::client(tokio::net::TcpStream::connect(&tap.addr).await.unwrap()).await;
    for _ in 0..20 {
        let mut c = client.clone().ready().await.unwrap();
        let (resp, mut stream) = c
            .send_request(raw::request("/finish-early"), false)
            .unwrap();
        stream
            .send_data(Bytes::from_static(b"still sending"), false)
            .unwrap();
        let resp = resp.await.unwrap();
        let mut body = resp.into_body();
        let mut data = Vec::new();
        while let Some(chunk) = support::within(10, "the body", body.data()).await {
            data.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(data, b"done");
        let trailers = support::within(10, "the trailers", body.trailers())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(trailers.get("grpc-status").unwrap(), "14");
        assert_eq!(trailers.get("grpc-message").unwrap(), "going away");
        let reset = match std::future::poll_fn(|cx| stream.poll_reset(cx)).await {
            Ok(reason) => Some(reason),
            Err(e) => e.reason(),
        };
        assert_eq!(reset, Some(Reason::NO_ERROR), "told to stop sending");
    }
}

#[tokio::test]
async fn resets_propagate_with_the_same_code_both_ways() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let log = raw::Log::default();
    let _server = raw::serve_tcp(listener, log.clone());
    let tap = Tap::start(&upstream).await;
    let client = raw::client(tokio::net::TcpStream::connect(&tap.addr).await.unwrap()).await;

    // Upstream resets: the client sees the upstream's code.
    let mut c = client.clone().ready().await.unwrap();
    let (resp, _stream) = c.send_request(raw::request("/reset/11"), false).unwrap();
    let err = resp.await.unwrap_err();
    assert_eq!(err.reason(), Some(Reason::ENHANCE_YOUR_CALM), "{err}");

    // Client resets: the upstream sees the client's code.
    let mut c = client.clone().ready().await.unwrap();
    let (_resp, mut stream) = c.send_request(raw::request("/hang"), false).unwrap();
    stream
        .send_data(Bytes::from_static(b"partial"), false)
        .unwrap();
    support::eventually(5, "the upstream stream to open", || {
        (counter(&tap.stats.request_bytes) >= 7).then_some(())
    })
    .await;
    stream.send_reset(Reason::HTTP_1_1_REQUIRED);
    let seen = support::eventually(5, "the upstream to see the reset", || {
        log.lock()
            .unwrap()
            .iter()
            .find(|s| s.path == "/hang")
            .cloned()
    })
    .await;
    assert_eq!(seen.reset, Some(Reason::HTTP_1_1_REQUIRED));
}

/// An upstream the tap cannot reach looks to the client like a server it cannot reach: its
/// connection closes before the tap says a byte of HTTP/2, so its own connection backoff
/// applies (a handshake followed by UNAVAILABLE sent grpcio's C-core into retries without
/// backoff). Once the upstream is up, the next connection works.
#[tokio::test]
async fn an_unreachable_upstream_closes_the_connection_before_the_handshake_then_recovers() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    drop(listener);
    let tap = Tap::start(&upstream).await;
    assert_eq!(
        raw::bytes_before_close(&tap.addr).await,
        Some(0),
        "closed with nothing said"
    );
    assert_eq!(counter(&tap.stats.upstream_connect_errors), 1);

    // The upstream comes up on the same port: a new connection works.
    let listener = TcpListener::bind(&upstream).await.unwrap();
    let _stop = echo::serve_tcp(listener).await;
    let mut client = echo::client(channel(tap.url()).await);
    client.ready().await.unwrap();
    let resp = client
        .unary(
            tonic::Request::new(Bytes::from_static(b"again")),
            echo::path(echo::UNARY),
            echo::BytesCodec,
        )
        .await
        .unwrap();
    assert_eq!(resp.get_ref(), &Bytes::from_static(b"again"));
}

/// An upstream that dies closes the client's connection, as it would without the tap; the
/// client's next connection dials again and, the upstream back, works.
#[tokio::test]
async fn upstream_killed_mid_stream_then_restarted() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let log = raw::Log::default();
    let server = raw::serve_tcp(listener, log.clone());
    let tap = Tap::start(&upstream).await;
    let client = raw::client(tokio::net::TcpStream::connect(&tap.addr).await.unwrap()).await;

    let mut c = client.clone().ready().await.unwrap();
    let (resp, mut stream) = c.send_request(raw::request("/hang"), false).unwrap();
    stream
        .send_data(Bytes::from_static(b"partial"), false)
        .unwrap();
    support::eventually(5, "bytes to reach upstream", || {
        (counter(&tap.stats.request_bytes) >= 7).then_some(())
    })
    .await;
    server.abort();
    let _ = server.await;
    // The killed upstream's connection ends the client's: the stream fails with it.
    let ended = tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .expect("the stream ends when the upstream dies");
    assert!(ended.is_err(), "{ended:?}");

    let listener = TcpListener::bind(&upstream).await.unwrap();
    let _server = raw::serve_tcp(listener, log.clone());
    let mut again = raw::client(tokio::net::TcpStream::connect(&tap.addr).await.unwrap()).await;
    let (_, data, _) = raw::exchange(&mut again, "/echo", Bytes::from_static(b"after restart"))
        .await
        .unwrap();
    assert_eq!(data, b"after restart");
}

/// Flow control is the peers' own: a reader that stops stalls the writer, and the tap, which
/// reads again only once a chunk is written on, holds at most one chunk per direction.
#[tokio::test]
async fn a_reader_that_stops_stalls_the_writer_and_the_tap_holds_one_chunk() {
    let (upstream, _stop) = echo_upstream().await;
    let tap = Tap::with(TapOptions::new(&upstream)).await;
    let chunk = xdstap::proxy::READ_CHUNK as u64;
    let mut client = echo::client(channel(tap.url()).await);
    client.ready().await.unwrap();
    // 256 messages of 1 MiB: 256 MiB the server wants to write.
    let resp = client
        .server_streaming(
            tonic::Request::new(Bytes::from_static(b"256:1048576")),
            echo::path(echo::SERVER_STREAM),
            echo::BytesCodec,
        )
        .await
        .unwrap();
    let mut stream = resp.into_inner();
    let first = support::within(10, "the first message", stream.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.len(), 1 << 20);
    // Stop reading. Wait until forwarding stalls (no progress for 500 ms).
    let mut last = counter(&tap.stats.response_bytes);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = counter(&tap.stats.response_bytes);
        if now == last {
            break;
        }
        last = now;
    }
    let peak = counter(&tap.stats.peak_buffered);
    assert!(peak <= chunk, "peak buffered {peak} > one chunk {chunk}");
    assert!(
        last < 64 << 20,
        "forwarded {last} bytes to a reader that stopped"
    );
    // Reading again drains everything.
    let mut n = 1;
    while let Some(m) = support::within(10, "the next message", stream.next()).await {
        assert_eq!(digest(&m.unwrap()), digest(&pattern(n, 1 << 20)));
        n += 1;
    }
    assert_eq!(n, 256);
    assert!(counter(&tap.stats.peak_buffered) <= chunk);
}

#[tokio::test]
async fn shutdown_lets_open_streams_finish() {
    let (upstream, _stop) = echo_upstream().await;
    let tap = Tap::start(&upstream).await;
    let mut client = echo::client(channel(tap.url()).await);
    client.ready().await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let resp = client
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            echo::path(echo::BIDI),
            echo::BytesCodec,
        )
        .await
        .unwrap();
    let mut inbound = resp.into_inner();
    tx.send(Bytes::from_static(b"before")).await.unwrap();
    let echoed = support::within(10, "the echo before", inbound.next()).await;
    assert_eq!(echoed.unwrap().unwrap(), Bytes::from_static(b"before"));
    let addr = tap.addr.clone();
    let shutdown = tokio::spawn(tap.shutdown());
    // New connections are refused once the listener is closed, the open stream still works.
    support::eventually_async(5, "new connections refused", || async {
        tokio::net::TcpStream::connect(&addr)
            .await
            .is_err()
            .then_some(())
    })
    .await;
    tx.send(Bytes::from_static(b"during")).await.unwrap();
    let echoed = support::within(10, "the echo during", inbound.next()).await;
    assert_eq!(echoed.unwrap().unwrap(), Bytes::from_static(b"during"));
    drop(tx);
    assert!(support::within(10, "the stream's end", inbound.next())
        .await
        .is_none());
    tokio::time::timeout(Duration::from_secs(5), shutdown)
        .await
        .unwrap()
        .unwrap();
}

/// A tap that stops never drops a socket with bytes unread, which would make the kernel reset
/// the connection and the control plane lose what it had not yet read (a proxy's last ACK):
/// here the control plane reads nothing for a second while it floods the client without end,
/// the client reads nothing either, and the tap's grace runs out with most of the client's 2 MiB still on their
/// way (a small receive window holds them in the tap's kernel and queue);
/// still every byte the client sent before its connection ended reaches the control plane,
/// followed by a clean end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_tap_loses_nothing_the_client_sent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A small receive window: what the tap writes past it waits in the tap's kernel, unsent.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(16).unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let control_plane = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let (mut read, mut write) = s.into_split();
        // More than every buffer on the way holds: some stays unread in the tap's socket. Not
        // HTTP/2 frames: the tap stops observing, so nothing settles and the grace runs out.
        let flood = tokio::spawn(async move {
            let chunk = vec![0xffu8; 64 << 10];
            while write.write_all(&chunk).await.is_ok() {}
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut got = Vec::new();
        let end = support::within(30, "the upstream side's end", read.read_to_end(&mut got)).await;
        flood.abort();
        (got, end.map(drop).map_err(|e| e.kind()))
    });
    let mut options = TapOptions::new(&upstream);
    options.settings.shutdown_grace = Duration::from_millis(200);
    let tap = Tap::with(options).await;
    let client = tokio::net::TcpStream::connect(&tap.addr).await.unwrap();
    let mut sent = xdstap::proxy::PREFACE.to_vec();
    // More than the control plane's receive window: the tap holds some of it, written to its
    // kernel but not yet sent, when its grace runs out.
    sent.extend((0..2u32 << 20).map(|i| (i % 251) as u8));
    let (mut client_read, mut client_write) = client.into_split();
    let to_send = sent.clone();
    let writer = tokio::spawn(async move {
        client_write.write_all(&to_send).await.unwrap();
        client_write
    });
    // The tap has read every byte (into its queue and its kernel) before it is told to stop.
    support::eventually(5, "the client's bytes relayed", || {
        (counter(&tap.stats.request_bytes) == sent.len() as u64).then_some(())
    })
    .await;
    let client_write = writer.await.unwrap();
    let stopping = tokio::spawn(tap.shutdown());
    // The client, as Envoy does, closes once the tap has closed its side.
    let mut sink = vec![0u8; 1 << 20];
    while matches!(support::within(30, "the tap's side closed", client_read.read(&mut sink)).await, Ok(n) if n > 0)
    {
    }
    drop((client_read, client_write));
    let (got, end) = control_plane.await.unwrap();
    assert_eq!(end, Ok(()), "a clean end, not a reset");
    assert_eq!(got.len(), sent.len());
    assert!(got == sent, "the bytes differ");
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .unwrap()
        .unwrap();
}
