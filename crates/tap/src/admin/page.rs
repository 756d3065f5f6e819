//! The live page at `/`: the fleet's sync state, the rollouts and verdicts as they come. Three
//! files compiled into the binary (`page/`: HTML, CSS, a script with no dependencies), the
//! page's settings at `/ui/config`, and `/events`, verdicts as server-sent events: the tap's
//! recent ones first, then every quarter second those decided meanwhile (in a storm the NACKs
//! first and a sample of the rest, the others counted). The page reads `/status` and `/rollouts` like
//! any client. Every answer carries a Content-Security-Policy that lets the page load and fetch
//! from the tap alone and run no inline script; the script writes network strings as text.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{Full, StreamBody};
use hyper::body::Frame;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::{BroadcastStream, IntervalStream};
use tokio_stream::StreamExt;
use tonic::body::Body;

use super::service::Seat;
use super::Admin;
use crate::api::v1::watch_event::Kind;
use crate::api::v1::WatchEvent;
use crate::views::watch::bounded;

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/page.js");
const STYLE: &str = include_str!("page/page.css");

/// Nothing from anywhere but the tap; no inline script or style, no frames, no forms.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
                      frame-ancestors 'none'";

/// How often `/events` says it is alive when nothing happens.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The page's answer for `path`, or none when it is not the page's.
pub fn serve(admin: &Admin, path: &str) -> Option<Response<Body>> {
    Some(match path {
        "/" | "/index.html" => file("text/html; charset=utf-8", INDEX),
        "/ui/page.js" => file("text/javascript; charset=utf-8", SCRIPT),
        "/ui/page.css" => file("text/css; charset=utf-8", STYLE),
        "/ui/config" => {
            let config =
                serde_json::json!({ "trace_url": admin.trace_url.clone().unwrap_or_default() });
            file("application/json", &config.to_string())
        }
        "/events" => events(admin),
        _ => return None,
    })
}

fn guarded(status: StatusCode, content_type: &str) -> http::response::Builder {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-security-policy", POLICY)
        .header("x-content-type-options", "nosniff")
        .header("referrer-policy", "no-referrer")
        .header("cache-control", "no-store")
}

fn file(content_type: &str, text: &str) -> Response<Body> {
    (guarded(StatusCode::OK, content_type))
        .body(Body::new(Full::new(Bytes::from(text.to_string()))))
        .expect("static parts")
}

/// One server-sent event of `data`.
fn event(data: &str) -> Result<Frame<Bytes>, Infallible> {
    Ok(Frame::data(Bytes::from(format!("data: {data}\n\n"))))
}

/// How long `/events` gathers verdicts into one message.
const BATCH: Duration = Duration::from_millis(250);
/// Per message at most: every NACK up to the first, the others up to the second; past them
/// only counted. A storm of thousands a second costs each page a few messages a second.
const BATCH_NACKS: usize = 50;
const BATCH_OTHERS: usize = 20;

/// One message of `/events`: verdicts as the API shows them ([`bounded`]), oldest first, and
/// how many more were decided than listed.
#[derive(serde::Serialize)]
struct Batch<'a> {
    verdicts: &'a [WatchEvent],
    more: u64,
}

fn batch(verdicts: &[WatchEvent], more: u64) -> Result<Frame<Bytes>, Infallible> {
    event(&serde_json::to_string(&Batch { verdicts, more }).unwrap_or_default())
}

/// What one message of `/events` carries of the events that came within a [`BATCH`]: the
/// verdicts, at most [`BATCH_NACKS`] NACKs and [`BATCH_OTHERS`] others, in time order, each
/// [`bounded`]; and how many more there were (those left out, and those the page missed).
fn verdicts_of(
    chunk: Vec<Result<std::sync::Arc<WatchEvent>, BroadcastStreamRecvError>>,
) -> (Vec<WatchEvent>, u64) {
    let (mut nacks, mut others, mut more) = (Vec::new(), Vec::new(), 0u64);
    for e in chunk {
        let e = match e {
            Ok(e) => e,
            Err(BroadcastStreamRecvError::Lagged(n)) => {
                more += n;
                continue;
            }
        };
        let kind = e.kind();
        if !kind.is_verdict() {
            continue;
        }
        let (list, cap) = match kind == Kind::Nack {
            true => (&mut nacks, BATCH_NACKS),
            false => (&mut others, BATCH_OTHERS),
        };
        match list.len() < cap {
            true => list.push(bounded(WatchEvent::clone(&e))),
            false => more += 1,
        }
    }
    nacks.extend(others);
    nacks.sort_by(|a, b| a.time.cmp(&b.time));
    (nacks, more)
}

/// The verdicts as server-sent events: the recent ones, then a message every [`BATCH`] with
/// what was decided meanwhile (NACKs first to be kept), a comment when nothing happens for a
/// while. It takes one of the watchers' seats.
fn events(admin: &Admin) -> Response<Body> {
    let Some(seat) = Seat::take(&admin.seats) else {
        return (guarded(StatusCode::SERVICE_UNAVAILABLE, "text/plain"))
            .body(Body::new(Full::new(Bytes::from_static(
                b"too many watchers; try again when one ends\n",
            ))))
            .expect("static parts");
    };
    // Subscribed before the recent ones are read: nothing falls between (a verdict may come
    // twice; the page drops the second).
    let live = BroadcastStream::new(admin.watchers.subscribe());
    let recent = admin.watchers.recent();
    let head = [
        Ok(Frame::data(Bytes::from_static(b"retry: 1000\n\n"))),
        batch(&recent, 0),
    ];
    let live = live.chunks_timeout(4096, BATCH).map(move |chunk| {
        let _seat = &seat;
        let (verdicts, more) = verdicts_of(chunk);
        batch(&verdicts, more)
    });
    let alive = IntervalStream::new(tokio::time::interval(KEEP_ALIVE))
        .map(|_| Ok(Frame::data(Bytes::from_static(b": alive\n\n"))));
    let body = StreamBody::new(tokio_stream::iter(head).chain(live.merge(alive)));
    (guarded(StatusCode::OK, "text/event-stream"))
        .body(Body::new(body))
        .expect("static parts")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn event(kind: Kind, i: usize) -> Result<Arc<WatchEvent>, BroadcastStreamRecvError> {
        Ok(Arc::new(WatchEvent {
            time: format!("2026-12-03T12:00:{:02}.{i:06}Z", i / 1000),
            node: format!("n{i}"),
            kind: kind as i32,
            ..Default::default()
        }))
    }

    /// A burst of 100 NACKs and 100 ACKs within one batch, a warming event and 7 missed: the
    /// message carries 50 NACKs and 20 ACKs in time order and says 137 more.
    #[test]
    fn a_batch_keeps_fifty_nacks_and_twenty_others() {
        let mut chunk = Vec::new();
        for i in 0..100 {
            chunk.push(event(Kind::Ack, 2 * i));
            chunk.push(event(Kind::Nack, 2 * i + 1));
        }
        chunk.push(event(Kind::Warming, 500));
        chunk.push(Err(BroadcastStreamRecvError::Lagged(7)));
        let (verdicts, more) = verdicts_of(chunk);
        let count = |k: Kind| verdicts.iter().filter(|w| w.kind() == k).count();
        assert_eq!(
            (count(Kind::Nack), count(Kind::Ack)),
            (BATCH_NACKS, BATCH_OTHERS)
        );
        assert_eq!(verdicts.len(), 70, "no warming event");
        assert!(
            verdicts.windows(2).all(|w| w[0].time <= w[1].time),
            "in time order"
        );
        assert_eq!(more, 50 + 80 + 7);
    }
}
