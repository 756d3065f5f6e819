//! Raw HTTP/2 peers (the h2 crate, no gRPC library) for checks that need exact header fields,
//! trailers and RST_STREAM codes on both ends.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use h2::{Reason, RecvStream};
use http::{HeaderMap, Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};

/// What the raw server saw of one stream.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body_digest: u64,
    pub body_len: usize,
    pub trailers: Option<HeaderMap>,
    pub reset: Option<Reason>,
}

pub type Log = Arc<Mutex<Vec<Seen>>>;

async fn read_body(body: &mut RecvStream) -> Result<Vec<u8>, h2::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Serves h2 on any byte streams. Paths: `/echo` echoes the body with response header
/// `x-resp: 1` and trailers `x-trailer: t1`, `grpc-status: 0`; `/reset/N` resets with code N
/// once the request headers arrive; `/hang` reads the body and never answers (records a reset);
/// `/finish-early` answers whole (data `done`, grpc-status 14) without reading the request, then
/// resets the stream with NO_ERROR.
pub async fn serve_conn<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: T, log: Log) {
    let Ok(mut conn) = h2::server::handshake(io).await else {
        return;
    };
    while let Some(Ok((req, mut respond))) = conn.accept().await {
        let log = log.clone();
        tokio::spawn(async move {
            let (parts, mut body) = req.into_parts();
            let path = parts.uri.path().to_string();
            let mut seen = Seen {
                path: path.clone(),
                headers: parts.headers.clone(),
                ..Default::default()
            };
            if path == "/finish-early" {
                // A whole response while the request is still open, then RST_STREAM(NO_ERROR)
                // to stop the upload, as gRPC servers end a call the client has not half-closed.
                log.lock().unwrap().push(seen);
                let mut resp = Response::new(());
                resp.headers_mut()
                    .insert("content-type", "application/grpc".parse().unwrap());
                let mut send = respond.send_response(resp, false).unwrap();
                send.send_data(Bytes::from_static(b"done"), false).unwrap();
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", "14".parse().unwrap());
                trailers.insert("grpc-message", "going away".parse().unwrap());
                send.send_trailers(trailers).unwrap();
                // Dropping the unread request body now makes h2 reset the stream with NO_ERROR
                // once the response has gone out (an explicit reset would discard it unsent).
                drop(body);
                return;
            }
            if let Some(code) = path.strip_prefix("/reset/") {
                respond.send_reset(Reason::from(code.parse::<u32>().unwrap()));
                log.lock().unwrap().push(seen);
                return;
            }
            match read_body(&mut body).await {
                Ok(b) => {
                    seen.body_digest = super::echo::digest(&b);
                    seen.body_len = b.len();
                    seen.trailers = body.trailers().await.ok().flatten();
                    if path == "/hang" {
                        let reset = std::future::poll_fn(|cx| respond.poll_reset(cx)).await;
                        seen.reset = reset.ok();
                        log.lock().unwrap().push(seen);
                        return;
                    }
                    log.lock().unwrap().push(seen);
                    let mut resp = Response::new(());
                    resp.headers_mut().insert("x-resp", "1".parse().unwrap());
                    resp.headers_mut()
                        .insert("content-type", "application/grpc".parse().unwrap());
                    let mut send = respond.send_response(resp, false).unwrap();
                    send.send_data(Bytes::from(b), false).unwrap();
                    let mut trailers = HeaderMap::new();
                    trailers.insert("x-trailer", "t1".parse().unwrap());
                    trailers.insert("grpc-status", "0".parse().unwrap());
                    send.send_trailers(trailers).unwrap();
                }
                Err(e) => {
                    seen.reset = e.reason();
                    log.lock().unwrap().push(seen);
                }
            }
        });
    }
}

/// A raw server on a TCP listener; the task handle kills it (and every connection) on abort.
pub fn serve_tcp(listener: tokio::net::TcpListener, log: Log) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let (s, _) = listener.accept().await.unwrap();
            conns.spawn(serve_conn(s, log.clone()));
        }
    })
}

/// Opens an h2 client connection on `io`.
pub async fn client<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: T,
) -> h2::client::SendRequest<Bytes> {
    let (send, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

pub fn request(path: &str) -> Request<()> {
    let mut r = Request::builder()
        .method("POST")
        .uri(format!("http://xds.example{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-custom-bin", "AAEC")
        .header("x-multi", "a")
        .body(())
        .unwrap();
    r.headers_mut().append("x-multi", "b".parse().unwrap());
    r
}

/// Sends `body` then trailers, reads the whole answer.
pub async fn exchange(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    body: Bytes,
) -> Result<(Response<()>, Vec<u8>, Option<HeaderMap>), h2::Error> {
    let mut send = send.clone().ready().await?;
    let (resp, mut stream) = send.send_request(request(path), false)?;
    stream.send_data(body, false)?;
    let mut trailers = HeaderMap::new();
    trailers.insert("x-req-trailer", "r1".parse().unwrap());
    stream.send_trailers(trailers)?;
    let resp = resp.await?;
    let (head, mut body) = resp.into_parts();
    let data = read_body(&mut body).await?;
    let trailers = body.trailers().await?;
    Ok((Response::from_parts(head, ()), data, trailers))
}

/// `m` as one uncompressed gRPC message: flag, length, bytes.
pub fn grpc(m: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(m.len() + 5);
    out.push(0);
    out.extend_from_slice(&(m.len() as u32).to_be_bytes());
    out.extend_from_slice(m);
    out.into()
}

/// A first SotW CDS request from `node`, framed.
pub fn subscribe(node: &str) -> Bytes {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use prost::Message;
    let m = DiscoveryRequest {
        node: Some(Node {
            id: node.into(),
            ..Default::default()
        }),
        type_url: super::resources::CDS.into(),
        ..Default::default()
    };
    grpc(&m.encode_to_vec())
}

/// What a client sees of a connection to `addr` once it has said the HTTP/2 preface and its
/// SETTINGS: how many bytes came back before the connection closed (0: closed before the
/// server's handshake, as a server that is not there), or `None` when it stayed open for 5 s.
pub async fn bytes_before_close(addr: &str) -> Option<usize> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut hello = xdstap::proxy::PREFACE.to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    s.write_all(&hello).await.unwrap();
    let mut got = 0;
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got += n,
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), read_all)
        .await
        .ok()
}
