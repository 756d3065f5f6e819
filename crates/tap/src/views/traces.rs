//! How the tap's spans are put into traces, known to the views as well as to the span output:
//! the page and watch link each verdict and each version to the trace its span is in, with no
//! span at hand.

use opentelemetry::trace::TraceId;
use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

/// How spans are grouped into traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// One trace per config version, across types, proxies and taps.
    Version,
    /// One trace per push.
    Push,
}

impl std::fmt::Display for Grouping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Grouping::Version => "version",
            Grouping::Push => "push",
        })
    }
}

/// How the tap's spans are put into traces: the trace id of a push's span, which the page links
/// to (`--trace-url`) as the exporter sends it.
#[derive(Clone, Debug)]
pub struct TraceIds {
    grouping: Grouping,
    control_plane_id: String,
    /// This tap's instance, hashed: pushes' traces are its own.
    pub instance: u64,
}

impl TraceIds {
    /// Traces grouped by `grouping`, versions named within `control_plane_id`, pushes within
    /// this tap's `instance`.
    pub fn new(grouping: Grouping, control_plane_id: String, instance: &str) -> Self {
        TraceIds {
            grouping,
            control_plane_id,
            instance: xxh3_64(instance.as_bytes()),
        }
    }

    /// The trace of the span of the push `nonce` of `type_url` on `stream`, version `version`.
    pub fn of(&self, version: &str, stream: u64, type_url: &str, nonce: &str) -> TraceId {
        let key = match self.grouping {
            Grouping::Version if !version.is_empty() => {
                format!("version\0{}\0{}", self.control_plane_id, version)
            }
            _ => format!("push\0{}\0{stream}\0{type_url}\0{nonce}", self.instance),
        };
        TraceId::from(xxh3_128(key.as_bytes()).max(1))
    }

    /// The one trace of every push of `version`, when spans are grouped by version.
    pub fn of_version(&self, version: &str) -> Option<TraceId> {
        (self.grouping == Grouping::Version && !version.is_empty())
            .then(|| self.of(version, 0, "", ""))
    }
}
