//! Forwarding one stream: request half and response half driven from one task by one poll
//! function, so no half is ever dropped mid-chunk and a reset on either side reaches the other
//! with the same error code.
//!
//! ```text
//!  client ──DATA──> [Pump: down_body -> up_send]  ──DATA──> upstream
//!  client <─DATA─── [Pump: up_body -> down_send]  <─DATA─── upstream
//! ```
//!
//! A pump takes a chunk only when it has none pending, shows it to the observer, then sends it
//! as the receiver's flow-control window allows, and only then releases the same number of bytes
//! of window to the sender. So a stalled receiver stalls the sender, and the tap holds at most
//! one stream window per direction.

use std::future::{poll_fn, Future};
use std::sync::Mutex;
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Request, Response};

use super::upstream::UpstreamConn;
use super::{
    strip_hop_by_hop, Decrement, Direction, ProxyStats, Shared, Side, StreamEnd, StreamInfo,
    StreamObserver,
};

type Observer = Mutex<Box<dyn StreamObserver>>;

/// Why a pump stopped early.
enum PumpError {
    /// The peer we read from reset the stream.
    RecvReset(Reason),
    /// The peer we write to reset the stream.
    SendReset(Reason),
    /// The connection we read from failed.
    RecvFailed(h2::Error),
    /// The connection we write to failed.
    SendFailed(h2::Error),
}

/// One direction of a stream.
struct Pump {
    recv: RecvStream,
    send: SendStream<Bytes>,
    direction: Direction,
    pending: Option<Bytes>,
    data_done: bool,
    finished: bool,
}

impl Pump {
    fn new(recv: RecvStream, send: SendStream<Bytes>, direction: Direction) -> Self {
        Pump {
            recv,
            send,
            direction,
            pending: None,
            data_done: false,
            finished: false,
        }
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        observer: &Observer,
        stats: &ProxyStats,
    ) -> Poll<Result<(), PumpError>> {
        if self.finished {
            return Poll::Ready(Ok(()));
        }
        loop {
            if let Some(chunk) = &mut self.pending {
                self.send.reserve_capacity(chunk.len());
                let mut capacity = self.send.capacity();
                if capacity == 0 {
                    match self.send.poll_capacity(cx) {
                        Poll::Ready(Some(Ok(_))) => capacity = self.send.capacity(),
                        Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(classify_send(e))),
                        Poll::Ready(None) => return Poll::Ready(Err(self.send_closed(cx))),
                        Poll::Pending => return self.poll_send_reset(cx),
                    }
                    if capacity == 0 {
                        continue;
                    }
                }
                let piece = chunk.split_to(capacity.min(chunk.len()));
                let n = piece.len();
                if let Err(e) = self.send.send_data(piece, false) {
                    return Poll::Ready(Err(classify_send(e)));
                }
                // Only now may the sender send more: the bytes have left our hands.
                let _ = self.recv.flow_control().release_capacity(n);
                let counter = match self.direction {
                    Direction::Request => &stats.request_bytes,
                    Direction::Response => &stats.response_bytes,
                };
                ProxyStats::add(counter, n as u64);
                if chunk.is_empty() {
                    self.pending = None;
                }
                continue;
            }
            if !self.data_done {
                match self.recv.poll_data(cx) {
                    Poll::Ready(Some(Ok(chunk))) => {
                        let held = self.recv.flow_control().used_capacity() as u64;
                        stats
                            .peak_stream_buffered
                            .fetch_max(held, std::sync::atomic::Ordering::Relaxed);
                        if chunk.is_empty() {
                            continue;
                        }
                        observer
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .on_data(self.direction, &chunk);
                        self.pending = Some(chunk);
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(classify_recv(e))),
                    Poll::Ready(None) => self.data_done = true,
                    Poll::Pending => return self.poll_send_reset(cx),
                }
                continue;
            }
            return match self.recv.poll_trailers(cx) {
                Poll::Ready(Ok(trailers)) => {
                    let sent = match trailers {
                        Some(mut trailers) => {
                            strip_hop_by_hop(&mut trailers);
                            observer
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .on_trailers(self.direction, &trailers);
                            self.send.send_trailers(trailers)
                        }
                        None => self.send.send_data(Bytes::new(), true),
                    };
                    if let Err(e) = sent {
                        return Poll::Ready(Err(classify_send(e)));
                    }
                    self.finished = true;
                    Poll::Ready(Ok(()))
                }
                Poll::Ready(Err(e)) => Poll::Ready(Err(classify_recv(e))),
                Poll::Pending => self.poll_send_reset(cx),
            };
        }
    }

    /// While waiting on the source, notice the destination resetting the stream.
    fn poll_send_reset(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PumpError>> {
        match self.send.poll_reset(cx) {
            Poll::Ready(Ok(reason)) => Poll::Ready(Err(PumpError::SendReset(reason))),
            Poll::Ready(Err(e)) => Poll::Ready(Err(classify_send(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn send_closed(&mut self, cx: &mut Context<'_>) -> PumpError {
        match self.send.poll_reset(cx) {
            Poll::Ready(Ok(reason)) => PumpError::SendReset(reason),
            Poll::Ready(Err(e)) => classify_send(e),
            Poll::Pending => PumpError::SendReset(Reason::CANCEL),
        }
    }
}

fn classify_recv(e: h2::Error) -> PumpError {
    match e.reason() {
        Some(reason) if e.is_reset() && e.is_remote() => PumpError::RecvReset(reason),
        _ => PumpError::RecvFailed(e),
    }
}

fn classify_send(e: h2::Error) -> PumpError {
    match e.reason() {
        Some(reason) if e.is_reset() && e.is_remote() => PumpError::SendReset(reason),
        _ => PumpError::SendFailed(e),
    }
}

enum ResponseHalf {
    Waiting(h2::client::ResponseFuture),
    Streaming(Pump),
    Done,
}

/// How the joint poll ended.
enum Outcome {
    Complete,
    Request(PumpError),
    Response(PumpError),
    UpstreamFailed(h2::Error),
    ClientReset(Reason),
}

pub(super) async fn forward(
    id: u64,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    upstream: &UpstreamConn,
    shared: &Shared,
    peer: &str,
) {
    let stats = &*shared.stats;
    ProxyStats::add(&stats.streams_total, 1);
    ProxyStats::add(&stats.streams_active, 1);
    let _active = Decrement(&stats.streams_active);

    let (mut parts, down_body) = request.into_parts();
    let upstream_addr = shared.connector.endpoint().to_string();
    let observer: Observer = Mutex::new(shared.observer.on_stream(&StreamInfo {
        id,
        path: parts.uri.path(),
        headers: &parts.headers,
        downstream: peer,
        upstream: &upstream_addr,
    }));
    let is_grpc = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let end = |observer: &Observer, end: StreamEnd| {
        observer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .on_end(&end);
    };

    let sender = match upstream.ready(&shared.settings, stats).await {
        Ok(sender) => sender,
        Err(e) => {
            tracing::warn!(stream = id, path = parts.uri.path(), error = %e, "Upstream unavailable");
            reply_unavailable(&mut respond, is_grpc, &e.to_string());
            end(
                &observer,
                StreamEnd::Failed {
                    by: Side::Upstream,
                    message: e.to_string(),
                },
            );
            return;
        }
    };
    strip_hop_by_hop(&mut parts.headers);
    let end_of_stream = down_body.is_end_stream();
    let mut sender = sender;
    let (response, up_send) =
        match sender.send_request(Request::from_parts(parts, ()), end_of_stream) {
            Ok(pair) => pair,
            Err(e) => {
                let message = format!("upstream {upstream_addr}: {e}");
                reply_unavailable(&mut respond, is_grpc, &message);
                end(
                    &observer,
                    StreamEnd::Failed {
                        by: Side::Upstream,
                        message,
                    },
                );
                return;
            }
        };
    let mut request_half = Pump::new(down_body, up_send, Direction::Request);
    request_half.finished = end_of_stream;
    let mut response_half = ResponseHalf::Waiting(response);

    // An upstream that has sent (or is sending) its whole response may reset the request half
    // with NO_ERROR to stop the client's upload (RFC 9113 §8.1; gRPC servers do this when they
    // end a call the client has not half-closed). The response still goes through whole.
    let mut request_stopped = false;
    let outcome = poll_fn(|cx| {
        let request_done = request_stopped
            || match request_half.poll(cx, &observer, stats) {
                Poll::Ready(Ok(())) => true,
                Poll::Ready(Err(PumpError::SendReset(Reason::NO_ERROR))) => {
                    request_stopped = true;
                    true
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Outcome::Request(e)),
                Poll::Pending => false,
            };
        loop {
            match &mut response_half {
                ResponseHalf::Waiting(future) => match std::pin::Pin::new(future).poll(cx) {
                    Poll::Ready(Ok(response)) => {
                        let (mut head, up_body) = response.into_parts();
                        strip_hop_by_hop(&mut head.headers);
                        observer
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .on_response_headers(&head.headers);
                        let eos = up_body.is_end_stream();
                        match respond.send_response(Response::from_parts(head, ()), eos) {
                            Ok(down_send) if !eos => {
                                response_half = ResponseHalf::Streaming(Pump::new(
                                    up_body,
                                    down_send,
                                    Direction::Response,
                                ));
                            }
                            Ok(_) => response_half = ResponseHalf::Done,
                            Err(e) => {
                                return Poll::Ready(Outcome::Response(classify_send(e)));
                            }
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Outcome::UpstreamFailed(e)),
                    Poll::Pending => {
                        if let Poll::Ready(Ok(reason)) = respond.poll_reset(cx) {
                            return Poll::Ready(Outcome::ClientReset(reason));
                        }
                        return Poll::Pending;
                    }
                },
                ResponseHalf::Streaming(pump) => match pump.poll(cx, &observer, stats) {
                    Poll::Ready(Ok(())) => response_half = ResponseHalf::Done,
                    Poll::Ready(Err(e)) => return Poll::Ready(Outcome::Response(e)),
                    Poll::Pending => return Poll::Pending,
                },
                ResponseHalf::Done if request_done => return Poll::Ready(Outcome::Complete),
                ResponseHalf::Done => return Poll::Pending,
            }
        }
    })
    .await;

    // Pass the end on to the side that did not cause it, with the same code.
    let reset_upstream = |pump: &mut Pump, reason| pump.send.send_reset(reason);
    let stream_end = match outcome {
        // With the request stopped, dropping its body below makes h2 pass the NO_ERROR reset on
        // to the client once the response has gone out (an explicit reset would discard it).
        Outcome::Complete => StreamEnd::Complete,
        Outcome::ClientReset(reason) => {
            reset_upstream(&mut request_half, reason);
            StreamEnd::Reset {
                by: Side::Client,
                reason: reason.into(),
            }
        }
        Outcome::Request(PumpError::RecvReset(reason)) => {
            reset_upstream(&mut request_half, reason);
            StreamEnd::Reset {
                by: Side::Client,
                reason: reason.into(),
            }
        }
        Outcome::Request(PumpError::RecvFailed(e)) => {
            reset_upstream(&mut request_half, Reason::CANCEL);
            StreamEnd::Failed {
                by: Side::Client,
                message: e.to_string(),
            }
        }
        Outcome::Request(PumpError::SendReset(reason)) => {
            reset_downstream(&mut respond, &mut response_half, reason);
            StreamEnd::Reset {
                by: Side::Upstream,
                reason: reason.into(),
            }
        }
        Outcome::Request(PumpError::SendFailed(e)) | Outcome::UpstreamFailed(e)
            if e.is_reset() && e.is_remote() =>
        {
            let reason = e.reason().unwrap_or(Reason::INTERNAL_ERROR);
            reset_downstream(&mut respond, &mut response_half, reason);
            StreamEnd::Reset {
                by: Side::Upstream,
                reason: reason.into(),
            }
        }
        Outcome::Request(PumpError::SendFailed(e)) | Outcome::UpstreamFailed(e) => {
            let message = format!("upstream {upstream_addr}: {e}");
            fail_downstream(&mut respond, &mut response_half, is_grpc, &message);
            StreamEnd::Failed {
                by: Side::Upstream,
                message,
            }
        }
        Outcome::Response(PumpError::RecvReset(reason)) => {
            reset_downstream(&mut respond, &mut response_half, reason);
            StreamEnd::Reset {
                by: Side::Upstream,
                reason: reason.into(),
            }
        }
        Outcome::Response(PumpError::RecvFailed(e)) => {
            let message = format!("upstream {upstream_addr}: {e}");
            fail_downstream(&mut respond, &mut response_half, is_grpc, &message);
            StreamEnd::Failed {
                by: Side::Upstream,
                message,
            }
        }
        Outcome::Response(PumpError::SendReset(reason)) => {
            reset_upstream(&mut request_half, reason);
            StreamEnd::Reset {
                by: Side::Client,
                reason: reason.into(),
            }
        }
        Outcome::Response(PumpError::SendFailed(e)) => {
            reset_upstream(&mut request_half, Reason::CANCEL);
            StreamEnd::Failed {
                by: Side::Client,
                message: e.to_string(),
            }
        }
    };
    if !matches!(stream_end, StreamEnd::Complete) {
        tracing::debug!(stream = id, end = ?stream_end, "Stream ended abnormally");
    }
    end(&observer, stream_end);
}

fn reset_downstream(respond: &mut SendResponse<Bytes>, half: &mut ResponseHalf, reason: Reason) {
    match half {
        ResponseHalf::Streaming(pump) => pump.send.send_reset(reason),
        _ => respond.send_reset(reason),
    }
}

/// The upstream connection failed under the stream. Before response headers a gRPC client gets
/// a trailers-only UNAVAILABLE naming the upstream; after them, trailers saying the same; a
/// non-gRPC client gets a 502 or a reset.
fn fail_downstream(
    respond: &mut SendResponse<Bytes>,
    half: &mut ResponseHalf,
    is_grpc: bool,
    message: &str,
) {
    match half {
        ResponseHalf::Waiting(_) => reply_unavailable(respond, is_grpc, message),
        ResponseHalf::Streaming(pump) if is_grpc => {
            if pump
                .send
                .send_trailers(unavailable_trailers(message))
                .is_err()
            {
                pump.send.send_reset(Reason::INTERNAL_ERROR);
            }
        }
        ResponseHalf::Streaming(pump) => pump.send.send_reset(Reason::INTERNAL_ERROR),
        ResponseHalf::Done => {}
    }
}

fn unavailable_trailers(message: &str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("14"));
    // grpc-message is percent-encoded: bytes outside printable ASCII, and '%' itself.
    const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
    let encoded = percent_encoding::utf8_percent_encode(message, GRPC_MESSAGE).to_string();
    if let Ok(value) = HeaderValue::from_str(&encoded) {
        trailers.insert("grpc-message", value);
    }
    trailers
}

fn reply_unavailable(respond: &mut SendResponse<Bytes>, is_grpc: bool, message: &str) {
    let response = if is_grpc {
        let mut response = Response::new(());
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.extend(unavailable_trailers(message));
        response
    } else {
        let mut response = Response::new(());
        *response.status_mut() = http::StatusCode::BAD_GATEWAY;
        response
    };
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
