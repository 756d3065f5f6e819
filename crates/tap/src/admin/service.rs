//! `xdstap.v1.Tap`: the status board, the rollout view and live verdicts over gRPC, for the
//! CLI and for scripts in any language.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::Admin;
use crate::api::v1::watch_event::Kind;
use crate::api::v1::{self, tap_server};
use crate::views::watch::SHOWN;
use crate::xds::is_type_named;

/// The service over the admin's views.
pub struct TapApi(pub Arc<Admin>);

#[tonic::async_trait]
impl tap_server::Tap for TapApi {
    async fn status(
        &self,
        request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusReport>, Status> {
        let ask = request.into_inner();
        let node = ask.node;
        let only = (!node.is_empty()).then_some(node.as_str());
        let report = match ask.resources {
            true => self.0.local_resources(only),
            false => self.0.local_status(only),
        };
        if only.is_some() && report.nodes.is_empty() {
            return Err(Status::not_found(format!("no node {node:?}")));
        }
        Ok(Response::new(report))
    }

    async fn rollouts(
        &self,
        request: Request<v1::RolloutsRequest>,
    ) -> Result<Response<v1::RolloutReport>, Status> {
        let report = self.0.rollouts(&request.into_inner());
        Ok(Response::new(report))
    }

    async fn objects(
        &self,
        request: Request<v1::ObjectsRequest>,
    ) -> Result<Response<v1::ObjectReport>, Status> {
        match self.0.objects(request.get_ref()) {
            Ok(report) => Ok(Response::new(report)),
            Err(e) => Err(Status::invalid_argument(e.to_string())),
        }
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<v1::WatchEvent, Status>> + Send>>;

    async fn watch(
        &self,
        request: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let filter = request.into_inner();
        for &k in &filter.kinds {
            if v1::watch_event::Kind::try_from(k).map_or(true, |k| k == Kind::Unspecified) {
                return Err(Status::invalid_argument(format!(
                    "kinds: no kind numbered {k}"
                )));
            }
        }
        if filter.node.chars().count() > MAX_PATTERN {
            return Err(Status::invalid_argument(format!(
                "node: a glob of at most {MAX_PATTERN} characters"
            )));
        }
        if filter.types.len() > MAX_TYPES || filter.types.iter().any(|t| t.len() > MAX_PATTERN) {
            return Err(Status::invalid_argument(format!(
                "types: at most {MAX_TYPES}, each at most {MAX_PATTERN} characters"
            )));
        }
        if filter.recent_only {
            let node: Vec<char> = filter.node.chars().collect();
            let recent = (self.0.watchers.recent().into_iter())
                .filter(move |e| wanted(e, &filter, &node))
                .map(|e| Ok(crate::views::watch::bounded(e)));
            return Ok(Response::new(Box::pin(tokio_stream::iter(recent))));
        }
        let Some(seat) = Seat::take(&self.0.seats) else {
            return Err(Status::resource_exhausted(format!(
                "{MAX_WATCHERS} watchers already; try again when one ends"
            )));
        };
        // The glob is taken apart once, not per event.
        let node: Vec<char> = filter.node.chars().collect();
        let mut missed = 0;
        let events = BroadcastStream::new(self.0.watchers.subscribe());
        let stream = events.filter_map(move |e| {
            let _seat = &seat;
            match e {
                Err(BroadcastStreamRecvError::Lagged(n)) => {
                    missed += n;
                    None
                }
                Ok(e) => wanted(&e, &filter, &node).then(|| {
                    let mut w = v1::WatchEvent::clone(&e);
                    w.missed = std::mem::take(&mut missed);
                    Ok(w)
                }),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Watchers at once at most, per tap.
pub const MAX_WATCHERS: usize = 64;
/// The longest node glob or type a watcher may give.
const MAX_PATTERN: usize = 256;
/// The most types a watcher may name.
const MAX_TYPES: usize = 16;

/// A tap's watchers' seats: how many are taken.
pub type Seats = Arc<std::sync::atomic::AtomicUsize>;

/// One of a tap's [`MAX_WATCHERS`] seats (a gRPC watch or a page's `/events`), given back when
/// the watch ends.
pub struct Seat(Seats);

impl Seat {
    /// A seat of `seats`, unless every one is taken.
    pub fn take(seats: &Seats) -> Option<Seat> {
        use std::sync::atomic::Ordering;
        let update = |n: usize| (n < MAX_WATCHERS).then_some(n + 1);
        (seats
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, update)
            .ok())
        .map(|_| Seat(seats.clone()))
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Whether the watcher's `filter` (its node glob taken apart already) lets `w` through.
fn wanted(w: &v1::WatchEvent, filter: &v1::WatchRequest, node_glob: &[char]) -> bool {
    let kind_wanted = match filter.kinds.is_empty() {
        true => SHOWN.contains(&w.kind()),
        false => filter.kinds.contains(&w.kind),
    };
    kind_wanted
        && is_type_named(&filter.types, &w.type_url)
        && (node_glob.is_empty() || glob_chars(node_glob, &w.node))
}

/// Whether `text` matches the pattern `p` (taken apart into characters already), where `*` is
/// any run of characters and `?` any one.
fn glob_chars(p: &[char], text: &str) -> bool {
    let t: Vec<char> = text.chars().collect();
    // The last `*` seen and where in `text` it took over; on a mismatch it takes one more.
    let (mut i, mut j, mut star) = (0, 0, None);
    while j < t.len() {
        match p.get(i) {
            Some('*') => {
                star = Some((i, j));
                i += 1;
            }
            Some(&c) if c == '?' || c == t[j] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((si, sj)) => {
                    i = si + 1;
                    j = sj + 1;
                    star = Some((si, sj + 1));
                }
                None => return false,
            },
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    fn glob(pattern: &str, text: &str) -> bool {
        super::glob_chars(&pattern.chars().collect::<Vec<_>>(), text)
    }

    #[test]
    fn globs() {
        assert!(glob("*", ""));
        assert!(glob(
            "sidecar~*~reviews-*",
            "sidecar~10.0.0.1~reviews-v1-abc.default"
        ));
        assert!(!glob(
            "sidecar~*~ratings-*",
            "sidecar~10.0.0.1~reviews-v1-abc.default"
        ));
        assert!(glob("envoy-?", "envoy-2"));
        assert!(!glob("envoy-?", "envoy-22"));
        assert!(glob("*a*b", "xaxxab"));
        assert!(!glob("a", "ab"));
        assert!(glob("exact", "exact"));
    }
}
