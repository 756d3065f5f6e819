//! Byte for byte: every byte the client writes arrives at the upstream, and every byte the
//! upstream writes at the client, identical (recorded after TLS, where there is TLS), over TCP,
//! TLS on both sides, and Unix sockets on both sides. On one connection: a unary call with
//! trailers, a bidi stream, 64 MiB each way, resets by either side, PINGs, a SETTINGS change,
//! and the upstream's GOAWAY closing the connection.

use crate::support;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::Reason;
use http::{HeaderMap, Request, Response};
use support::certs;
use support::tap::{Tap, TapOptions};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use xdstap::proxy::{ClientTls, Endpoint, ServerTls};

type Bytes2 = Arc<Mutex<Vec<u8>>>;

/// A byte stream that keeps a copy of everything read from it and written to it.
struct Recorded<T> {
    io: T,
    read: Bytes2,
    written: Bytes2,
}

impl<T> Recorded<T> {
    /// `io`, recording into `(read, written)`.
    fn new(io: T, (read, written): &(Bytes2, Bytes2)) -> Self {
        Recorded {
            io,
            read: read.clone(),
            written: written.clone(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Recorded<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // The tape is held across the read, so that no one compares tapes while bytes are
        // read but not yet recorded.
        let tape = self.read.clone();
        let mut tape = tape.lock().unwrap();
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            tape.extend_from_slice(&buf.filled()[before..]);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Recorded<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        // Held across the write: bytes on the wire are on the tape before anyone compares.
        let tape = self.written.clone();
        let mut tape = tape.lock().unwrap();
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            tape.extend_from_slice(&buf[..n]);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

async fn read_all(body: &mut h2::RecvStream) -> Result<Vec<u8>, h2::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = support::within(30, "the next DATA", body.data()).await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Sends `data` as the flow-control window allows.
async fn send_all(send: &mut h2::SendStream<Bytes>, mut data: Bytes) {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let n = std::future::poll_fn(|cx| send.poll_capacity(cx))
            .await
            .unwrap()
            .unwrap();
        send.send_data(data.split_to(n.min(data.len())), false)
            .unwrap();
    }
}

/// The upstream: `/echo` answers the whole body back with headers and trailers, `/bidi` echoes
/// each piece as it comes, `/reset` resets with REFUSED_STREAM, `/hang` waits for the client's
/// reset. A message on `goaway` makes it send GOAWAY and close once its streams are done.
async fn upstream<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: T,
    goaway: tokio::sync::oneshot::Receiver<()>,
) {
    let mut conn = h2::server::handshake(io).await.unwrap();
    let mut goaway = std::pin::pin!(goaway);
    let mut going = false;
    loop {
        let next = tokio::select! {
            r = conn.accept() => r,
            _ = &mut goaway, if !going => {
                going = true;
                conn.graceful_shutdown();
                continue;
            }
        };
        let Some(Ok((req, mut respond))) = next else {
            break;
        };
        tokio::spawn(async move {
            let (parts, mut body) = req.into_parts();
            match parts.uri.path() {
                "/reset" => respond.send_reset(Reason::REFUSED_STREAM),
                "/hang" => {
                    let _ = std::future::poll_fn(|cx| respond.poll_reset(cx)).await;
                }
                "/bidi" => {
                    let mut send = respond.send_response(Response::new(()), false).unwrap();
                    while let Some(Ok(chunk)) =
                        support::within(30, "the next DATA", body.data()).await
                    {
                        let _ = body.flow_control().release_capacity(chunk.len());
                        send_all(&mut send, chunk).await;
                    }
                    send.send_data(Bytes::new(), true).unwrap();
                }
                _ => {
                    let data = read_all(&mut body).await.unwrap();
                    let _ = support::within(30, "the trailers", body.trailers()).await;
                    let mut resp = Response::new(());
                    resp.headers_mut().insert("x-resp", "1".parse().unwrap());
                    let mut send = respond.send_response(resp, false).unwrap();
                    send_all(&mut send, Bytes::from(data)).await;
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", "0".parse().unwrap());
                    send.send_trailers(trailers).unwrap();
                }
            }
        });
    }
    // Drive the connection until it closes.
    std::future::poll_fn(|cx| conn.poll_closed(cx)).await.ok();
}

fn request(path: &str) -> Request<()> {
    Request::builder()
        .method("POST")
        .uri(format!("http://wire.example{path}"))
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

/// Plays every case on one client connection through the tap, then has the upstream GOAWAY.
async fn play<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: T,
    goaway: tokio::sync::oneshot::Sender<()>,
    tapes: &Tapes,
) {
    let (client, mut conn) = h2::client::handshake(io).await.unwrap();
    let mut ping = conn.ping_pong().unwrap();
    // A PING round trip while the connection is driven: the first SETTINGS are acknowledged by
    // then, and a SETTINGS change mid-connection may go.
    {
        let pong = ping.ping(h2::Ping::opaque());
        tokio::pin!(pong);
        tokio::select! {
            r = &mut pong => drop(r.unwrap()),
            r = &mut conn => panic!("the connection ended: {r:?}"),
        }
    }
    conn.set_initial_window_size(1 << 20).unwrap();
    let driver = tokio::spawn(conn);
    ping.ping(h2::Ping::opaque()).await.unwrap();

    // Unary, with trailers.
    let mut c = client.clone().ready().await.unwrap();
    let (resp, mut send) = c.send_request(request("/echo"), false).unwrap();
    send.send_data(Bytes::from_static(b"hello"), false).unwrap();
    let mut trailers = HeaderMap::new();
    trailers.insert("x-req-trailer", "r".parse().unwrap());
    send.send_trailers(trailers).unwrap();
    let mut body = resp.await.unwrap().into_body();
    assert_eq!(read_all(&mut body).await.unwrap(), b"hello");
    assert!(support::within(30, "the trailers", body.trailers())
        .await
        .unwrap()
        .is_some());

    // Bidi: each piece comes back before the next goes.
    let mut c = client.clone().ready().await.unwrap();
    let (resp, mut send) = c.send_request(request("/bidi"), false).unwrap();
    send.send_data(Bytes::from_static(b"one"), false).unwrap();
    let mut body = resp.await.unwrap().into_body();
    for piece in [&b"one"[..], b"two", b"three"] {
        if piece != b"one" {
            send.send_data(Bytes::copy_from_slice(piece), false)
                .unwrap();
        }
        let got = support::within(30, "the next DATA", body.data())
            .await
            .unwrap()
            .unwrap();
        let _ = body.flow_control().release_capacity(got.len());
        assert_eq!(&got[..], piece);
    }
    send.send_data(Bytes::new(), true).unwrap();
    assert!(read_all(&mut body).await.unwrap().is_empty());

    // 64 MiB each way.
    let big: Bytes = (0..64u32 << 20)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let mut c = client.clone().ready().await.unwrap();
    let (resp, mut send) = c.send_request(request("/echo"), false).unwrap();
    let sending = {
        let big = big.clone();
        tokio::spawn(async move {
            send_all(&mut send, big).await;
            send.send_data(Bytes::new(), true).unwrap();
        })
    };
    let mut body = resp.await.unwrap().into_body();
    assert_eq!(read_all(&mut body).await.unwrap().len(), big.len());
    sending.await.unwrap();

    // Resets: by the upstream, and by the client.
    let mut c = client.clone().ready().await.unwrap();
    let (resp, _send) = c.send_request(request("/reset"), false).unwrap();
    let refused = resp.await.unwrap_err();
    assert_eq!(refused.reason(), Some(Reason::REFUSED_STREAM));
    let mut c = client.clone().ready().await.unwrap();
    let (_resp, mut send) = c.send_request(request("/hang"), false).unwrap();
    send.send_data(Bytes::from_static(b"then cancel"), false)
        .unwrap();
    ping.ping(h2::Ping::opaque()).await.unwrap();
    send.send_reset(Reason::CANCEL);
    ping.ping(h2::Ping::opaque()).await.unwrap();

    // A last round trip: each side has read everything the other wrote before it, and the
    // upstream writes nothing unasked.
    ping.ping(h2::Ping::opaque()).await.unwrap();
    let quiet = tapes.same("before the GOAWAY");

    // The upstream's GOAWAY ends the connection.
    drop(client);
    goaway.send(()).unwrap();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(20), driver)
        .await
        .expect("the connection closes after the upstream's GOAWAY");
    tapes.goaway_after(quiet);
}

/// What each side wrote and read, recorded at its socket (after TLS).
#[derive(Default)]
struct Tapes {
    client: (Bytes2, Bytes2),
    upstream: (Bytes2, Bytes2),
}

impl Tapes {
    /// Both ways, what one side wrote is what the other read, exactly; returns how much the
    /// upstream had written. The writer's tape is taken first: while it is held, that side
    /// can write nothing more for the other to read.
    fn same(&self, when: &str) -> usize {
        let (client_read, client_written) = &self.client;
        let (upstream_read, upstream_written) = &self.upstream;
        let (cw, ur) = (
            client_written.lock().unwrap(),
            upstream_read.lock().unwrap(),
        );
        assert!(
            cw.len() > 64 << 20,
            "{when}: the client wrote {} bytes",
            cw.len()
        );
        assert!(
            *cw == *ur,
            "{when}: the upstream read {} bytes of the client's {}",
            ur.len(),
            cw.len()
        );
        let (uw, cr) = (
            upstream_written.lock().unwrap(),
            client_read.lock().unwrap(),
        );
        assert!(
            uw.len() > 64 << 20,
            "{when}: the upstream wrote {} bytes",
            uw.len()
        );
        assert!(
            *uw == *cr,
            "{when}: the client read {} bytes of the upstream's {}",
            cr.len(),
            uw.len()
        );
        uw.len()
    }

    /// After the quiet point at `at`: the client read the upstream's GOAWAY as it was sent
    /// (the client may close before reading what the upstream wrote after it).
    fn goaway_after(&self, at: usize) {
        let (uw, cr) = (
            self.upstream.1.lock().unwrap(),
            self.client.0.lock().unwrap(),
        );
        assert!(cr.len() >= at + 17, "the client read no GOAWAY");
        assert_eq!(
            cr[..],
            uw[..cr.len()],
            "what the client read is what the upstream wrote"
        );
        assert_eq!(
            cr[at + 3],
            0x7,
            "the frame after the quiet point is a GOAWAY"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_bytes_arrive_as_sent() {
    let tapes = Tapes::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (goaway_tx, goaway) = tokio::sync::oneshot::channel();
    let up = tapes.upstream.clone();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        upstream(Recorded::new(s, &up), goaway).await;
    });
    let tap = Tap::start(&addr).await;
    let io = tokio::net::TcpStream::connect(&tap.addr).await.unwrap();
    io.set_nodelay(true).unwrap();
    play(Recorded::new(io, &tapes.client), goaway_tx, &tapes).await;
    server.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_bytes_arrive_as_sent() {
    let tapes = Tapes::default();
    let dir = support::TempDir::new("wire-unix");
    let path = dir.path().join("upstream.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let (goaway_tx, goaway) = tokio::sync::oneshot::channel();
    let up = tapes.upstream.clone();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        upstream(Recorded::new(s, &up), goaway).await;
    });
    let mut options = TapOptions::new(&format!("unix:{}", path.display()));
    let tap_sock = dir.path().join("tap.sock");
    options.listen = Endpoint::Unix(tap_sock.clone());
    let _tap = Tap::with(options).await;
    let io = tokio::net::UnixStream::connect(&tap_sock).await.unwrap();
    play(Recorded::new(io, &tapes.client), goaway_tx, &tapes).await;
    server.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_bytes_arrive_as_sent() {
    let tapes = Tapes::default();
    let dir = support::TempDir::new("wire-tls");
    let pki = certs::make(dir.path());
    let server_tls = ServerTls {
        cert: pki.server_cert.clone(),
        key: pki.server_key.clone(),
        client_ca: None,
    };
    let acceptor = server_tls.acceptor().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (goaway_tx, goaway) = tokio::sync::oneshot::channel();
    let up = tapes.upstream.clone();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        let tls = acceptor.accept(s).await.unwrap();
        upstream(Recorded::new(tls, &up), goaway).await;
    });
    let mut options = TapOptions::new(&addr);
    options.tls = Some(server_tls.clone());
    let trust = ClientTls {
        ca: Some(pki.ca.clone()),
        sni: Some("localhost".into()),
        ..Default::default()
    };
    options.upstream_tls = Some(trust.clone());
    let tap = Tap::with(options).await;
    let (connector, name) = trust.connector(None).unwrap();
    let tcp = tokio::net::TcpStream::connect(&tap.addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    play(Recorded::new(tls, &tapes.client), goaway_tx, &tapes).await;
    server.await.unwrap();
}
