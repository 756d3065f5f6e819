//! A tonic test service without generated code (a bytes codec and hand-routed methods): unary,
//! server streaming and bidi streaming, for transparency tests through the tap.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes};
use tokio_stream::{Stream, StreamExt};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Request, Response, Status, Streaming};

pub const UNARY: &str = "/test.Echo/Unary";
pub const SERVER_STREAM: &str = "/test.Echo/ServerStream";
pub const BIDI: &str = "/test.Echo/Bidi";

/// Messages are raw bytes.
#[derive(Clone, Copy, Default)]
pub struct BytesCodec;

pub struct BytesEncoder;
pub struct BytesDecoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for BytesDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = BytesEncoder;
    type Decoder = BytesDecoder;
    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }
    fn decoder(&mut self) -> BytesDecoder {
        BytesDecoder
    }
}

/// Deterministic content for message `i` of `size` bytes, so both ends can check digests.
pub fn pattern(i: u64, size: usize) -> Bytes {
    let mut out = Vec::with_capacity(size);
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(size);
    Bytes::from(out)
}

pub fn digest(b: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(b)
}

type BoxStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

/// The service. Unary echoes the body and metadata `x-custom` as `x-echo-custom`; metadata
/// `x-fail: CODE` makes it fail with that code, message `failed on purpose: ünïcode %` and a
/// trailer `x-trailer: kept`. ServerStream reads `count:size` and sends `count` messages of
/// `pattern(i, size)`. Bidi echoes every message.
#[derive(Clone, Default)]
pub struct Echo;

impl tonic::server::NamedService for Echo {
    const NAME: &'static str = "test.Echo";
}

struct UnarySvc;
impl tonic::server::UnaryService<Bytes> for UnarySvc {
    type Response = Bytes;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Response<Bytes>, Status>> + Send>>;
    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        Box::pin(async move {
            if let Some(code) = request.metadata().get("x-fail") {
                let code: i32 = code.to_str().unwrap().parse().unwrap();
                let mut meta = tonic::metadata::MetadataMap::new();
                meta.insert("x-trailer", "kept".parse().unwrap());
                return Err(Status::with_metadata(
                    tonic::Code::from(code),
                    "failed on purpose: ünïcode %",
                    meta,
                ));
            }
            let custom = request.metadata().get("x-custom").cloned();
            let mut response = Response::new(request.into_inner());
            if let Some(v) = custom {
                response.metadata_mut().insert("x-echo-custom", v);
            }
            Ok(response)
        })
    }
}

struct ServerStreamSvc;
impl tonic::server::ServerStreamingService<Bytes> for ServerStreamSvc {
    type Response = Bytes;
    type ResponseStream = BoxStream;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Response<BoxStream>, Status>> + Send>>;
    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        Box::pin(async move {
            let spec = String::from_utf8(request.into_inner().to_vec()).unwrap();
            let (count, size) = spec.split_once(':').unwrap();
            let (count, size): (u64, usize) = (count.parse().unwrap(), size.parse().unwrap());
            let stream = tokio_stream::iter(0..count).map(move |i| Ok(pattern(i, size)));
            Ok(Response::new(Box::pin(stream) as BoxStream))
        })
    }
}

struct BidiSvc;
impl tonic::server::StreamingService<Bytes> for BidiSvc {
    type Response = Bytes;
    type ResponseStream = BoxStream;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Response<BoxStream>, Status>> + Send>>;
    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        Box::pin(async move {
            let stream = request.into_inner();
            Ok(Response::new(Box::pin(stream) as BoxStream))
        })
    }
}

fn server_grpc() -> tonic::server::Grpc<BytesCodec> {
    tonic::server::Grpc::new(BytesCodec)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX)
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let path = req.uri().path().to_string();
        Box::pin(async move {
            let mut grpc = server_grpc();
            Ok(match path.as_str() {
                UNARY => grpc.unary(UnarySvc, req).await,
                SERVER_STREAM => grpc.server_streaming(ServerStreamSvc, req).await,
                BIDI => grpc.streaming(BidiSvc, req).await,
                _ => Status::unimplemented(path).into_http(),
            })
        })
    }
}

/// A client for the service over a tonic channel.
pub fn client(
    channel: tonic::transport::Channel,
) -> tonic::client::Grpc<tonic::transport::Channel> {
    tonic::client::Grpc::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX)
}

pub fn path(p: &'static str) -> http::uri::PathAndQuery {
    http::uri::PathAndQuery::from_static(p)
}

/// Serves Echo on a bound TCP listener until the returned sender is dropped or fired.
pub async fn serve_tcp(listener: tokio::net::TcpListener) -> tokio::sync::oneshot::Sender<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .initial_stream_window_size(Some(1 << 20))
            .add_service(Echo)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    tx
}

/// Serves Echo on a Unix socket.
pub async fn serve_unix(path: &std::path::Path) -> tokio::sync::oneshot::Sender<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(Echo)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    tx
}
