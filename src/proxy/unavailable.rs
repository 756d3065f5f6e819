//! The one case where the tap speaks HTTP/2 itself: the upstream cannot be reached for a new
//! client connection. Each request on it gets a gRPC UNAVAILABLE naming the upstream and the
//! reason (a 502 for non-gRPC), and a GOAWAY at once sends the client's next stream to a new
//! connection, which dials again: as a client talking to the control plane directly would see
//! a refused connection, then reconnect.

use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::Reason;
use http::{HeaderMap, HeaderValue, Response};

use super::headers::Headers;
use super::listen::Io;
use super::{Shared, Side, StreamEnd, StreamInfo};

/// grpc-message is percent-encoded: bytes outside printable ASCII, and `%` itself.
const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

pub(super) async fn answer(io: Io, why: String, shared: Arc<Shared>, peer: String) {
    let handshake = h2::server::handshake(io);
    let Ok(Ok(mut conn)) = tokio::time::timeout(shared.settings.connect_timeout, handshake).await
    else {
        return;
    };
    conn.graceful_shutdown();
    let upstream = shared.connector.endpoint().to_string();
    while let Some(Ok((request, mut respond))) = conn.accept().await {
        let headers = Headers {
            path: Some(request.uri().path().to_string()),
            content_type: request
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(String::from),
            ..Headers::default()
        };
        let id = shared
            .next_stream
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut observer = shared.observer.on_stream(&StreamInfo {
            id,
            path: headers.path.as_deref().unwrap_or(""),
            headers: &headers,
            downstream: &peer,
            upstream: &upstream,
        });
        reply(&mut respond, headers.is_grpc(), &why);
        observer.on_end(&StreamEnd::Failed {
            by: Side::Upstream,
            message: why.clone(),
        });
    }
}

fn unavailable_trailers(message: &str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("14"));
    let encoded = percent_encoding::utf8_percent_encode(message, GRPC_MESSAGE).to_string();
    if let Ok(value) = HeaderValue::from_str(&encoded) {
        trailers.insert("grpc-message", value);
    }
    trailers
}

/// A trailers-only UNAVAILABLE for gRPC, a 502 otherwise.
fn reply(respond: &mut SendResponse<Bytes>, is_grpc: bool, message: &str) {
    let mut response = Response::new(());
    if is_grpc {
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.extend(unavailable_trailers(message));
    } else {
        *response.status_mut() = http::StatusCode::BAD_GATEWAY;
    }
    if respond.send_response(response, true).is_err() {
        respond.send_reset(Reason::INTERNAL_ERROR);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn grpc_message_is_percent_encoded() {
        let t = super::unavailable_trailers("a b%ç");
        assert_eq!(t["grpc-message"], "a b%25%C3%A7");
    }
}
