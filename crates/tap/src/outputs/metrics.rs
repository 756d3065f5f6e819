//! Prometheus metrics (prometheus-client, OpenMetrics text). Push counts and push->answer
//! latency are updated by a sink on the sinks' thread; the forwarder's and observer's counters
//! are read at scrape time. No per-node label: per-node detail lives in `/status`.

use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::spans::SpanStats;
use crate::api::v1::SyncState;
use crate::correlate::Event;
use crate::observer::ObserverStats;
use crate::proxy::counter;
use crate::proxy::ProxyStats;
use crate::queue::Sink;
use crate::views::board::StatusBoard;
use crate::xds::short_type;

/// Labels of push metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PushLabels {
    /// `CDS`, `EDS`, ... (the type URL for others).
    pub r#type: String,
    /// `ack`, `nack`, `superseded`, `unanswered`.
    pub verdict: &'static str,
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ]
    .into_iter()
}

/// Metrics fed by events.
#[derive(Clone)]
pub struct PushMetrics {
    pushes: Family<PushLabels, Counter>,
    latency: Family<PushLabels, Histogram, fn() -> Histogram>,
}

impl Sink for PushMetrics {
    fn on_event(&mut self, event: &Event) {
        self.record(event);
    }
}

impl PushMetrics {
    /// Counts a verdict.
    pub fn record(&self, event: &Event) {
        if let Event::Verdict {
            push,
            verdict,
            decided_at,
            ..
        } = event
        {
            // A heartbeat's answer is no push's latency.
            if push.heartbeat() {
                return;
            }
            let labels = PushLabels {
                r#type: short_type(&push.type_url).to_string(),
                verdict: verdict.name(),
            };
            self.pushes.get_or_create(&labels).inc();
            self.latency
                .get_or_create(&labels)
                .observe(decided_at.saturating_sub(push.at) as f64 / 1e9);
        }
    }
}

/// What the scrape-time collector reads.
#[derive(Clone)]
pub struct Sources {
    /// The forwarder's counters.
    pub proxy: Arc<ProxyStats>,
    /// The observer's counters.
    pub tap: Arc<ObserverStats>,
    /// Span export counters.
    pub spans: Arc<SpanStats>,
    /// Client states.
    pub status: StatusBoard,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sources")
    }
}

/// One family read at scrape time: counter or gauge, and its samples (labels, value).
struct Scraped {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Vec<(&'static str, &'static str)>, u64)>,
}

/// A family with one unlabelled sample.
fn one(name: &'static str, help: &'static str, kind: MetricType, value: u64) -> Scraped {
    Scraped {
        name,
        help,
        kind,
        samples: vec![(vec![], value)],
    }
}

/// A family with one label taking each of `samples`' values.
fn by(
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    label: &'static str,
    samples: &[(&'static str, u64)],
) -> Scraped {
    Scraped {
        name,
        help,
        kind,
        samples: samples
            .iter()
            .map(|(v, n)| (vec![(label, *v)], *n))
            .collect(),
    }
}

impl Sources {
    /// Everything read at scrape time.
    fn scraped(&self) -> Vec<Scraped> {
        let mut all = self.forwarding();
        all.extend(self.observing());
        all
    }

    /// The forwarder's families.
    fn forwarding(&self) -> Vec<Scraped> {
        use MetricType::{Counter as C, Gauge as G};
        let p = &self.proxy;
        let mut all = vec![
            by(
                "xdstap_forwarded_bytes",
                "Bytes forwarded, by direction (request: client to control plane).",
                C,
                "direction",
                &[
                    ("request", counter(&p.request_bytes)),
                    ("response", counter(&p.response_bytes)),
                ],
            ),
            one(
                "xdstap_connections",
                "Client connections accepted.",
                C,
                counter(&p.connections_total),
            ),
            one(
                "xdstap_connections_active",
                "Client connections open.",
                G,
                counter(&p.connections_active),
            ),
            one(
                "xdstap_streams",
                "HTTP/2 streams forwarded (any method).",
                C,
                counter(&p.streams_total),
            ),
            one(
                "xdstap_upstream_connect_errors",
                "Failed connections to the control plane.",
                C,
                counter(&p.upstream_connect_errors),
            ),
            one(
                "xdstap_upstream_up",
                "1 when the control plane answered the tap's last dial (a client's, or its look \
                 at each scrape and /readyz), 0 when it did not.",
                G,
                counter(&p.upstream_up),
            ),
            one(
                "xdstap_handshake_errors",
                "Client connections that failed the TLS or HTTP/2 handshake.",
                C,
                counter(&p.handshake_errors),
            ),
            one(
                "xdstap_silent_connections",
                "Client connections closed because they sent nothing within 10 s (never dialled upstream).",
                C,
                counter(&p.silent_connections),
            ),
            one(
                "xdstap_refused_connections",
                "Client connections closed on accept because --max-connections were open.",
                C,
                counter(&p.refused_connections),
            ),
            one(
                "xdstap_connection_errors",
                "Client connections that ended with an error after the handshake.",
                C,
                counter(&p.connection_errors),
            ),
            one(
                "xdstap_observer_waits",
                "Times a connection paused reading because the observer was a backlog behind.",
                C,
                counter(&p.observer_waits),
            ),
        ];
        let stopped = [
            "not_http2",
            "header_block",
            "header_block_too_large",
            "header_list",
            "malformed_frame",
            "streams",
        ]
        .map(|r| (r, p.stopped(r)));
        all.push(by(
            "xdstap_observation_stopped",
            "Connections the tap stopped observing, by reason (their bytes flowed on).",
            C,
            "reason",
            &stopped,
        ));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let tasks = rt.metrics().num_alive_tasks() as u64;
            let help = "Tasks alive in the runtime (a leak shows here).";
            all.push(one("xdstap_tasks", help, G, tasks));
        }
        all
    }

    /// What the status board's bound did: nodes evicted, nodes not tracked.
    fn board_bounds(&self) -> [Scraped; 2] {
        use MetricType::Counter as C;
        [
            one(
                "xdstap_nodes_evicted",
                "Disconnected nodes dropped from the status board to stay under max_nodes.",
                C,
                self.status.evicted(),
            ),
            one(
                "xdstap_nodes_untracked",
                "New nodes left off the status board: every node on it was connected (max_nodes).",
                C,
                self.status.untracked(),
            ),
        ]
    }

    /// The observer's, the span exporter's and the status board's families.
    fn observing(&self) -> Vec<Scraped> {
        use MetricType::{Counter as C, Gauge as G};
        let (t, s) = (&self.tap, &self.spans);
        let counted = [
            (
                "xdstap_decoded_messages",
                "xDS messages decoded.",
                &t.decoded,
            ),
            (
                "xdstap_unmatched_answers",
                "Answers naming a nonce the tap never saw pushed.",
                &t.unmatched_answers,
            ),
            (
                "xdstap_nonce_reuses",
                "Pushes whose nonce the control plane had used already (its fault).",
                &t.nonce_reuses,
            ),
            (
                "xdstap_rejected_resends",
                "Pushes of content the client had just NACKed, sent again (a resend loop).",
                &t.rejected_resends,
            ),
            (
                "xdstap_object_metadata_cut",
                "Times a bound of the object reader left part of a resource's metadata out (its \
                 objects may be incomplete).",
                &t.origins_cut,
            ),
            (
                "xdstap_dropped_events",
                "Correlation events dropped because the sinks fell behind.",
                &t.dropped_events,
            ),
            (
                "xdstap_spans_exported",
                "Spans the OTLP backend accepted.",
                &s.exported,
            ),
            (
                "xdstap_dropped_spans",
                "Spans dropped: export queue full or export failed.",
                &s.dropped,
            ),
            (
                "xdstap_span_export_errors",
                "Failed or timed-out OTLP export calls.",
                &s.export_errors,
            ),
        ];
        let mut all: Vec<Scraped> = counted
            .into_iter()
            .map(|(name, help, c)| one(name, help, C, counter(c)))
            .collect();
        all.extend(self.board_bounds());
        all.push(by(
            "xdstap_forwarded_messages",
            "gRPC messages forwarded, by direction.",
            C,
            "direction",
            &[
                ("request", counter(&t.request_messages)),
                ("response", counter(&t.response_messages)),
            ],
        ));
        all.push(by(
            "xdstap_xds_streams_active",
            "xDS streams open, by API.",
            G,
            "api",
            &[
                ("sotw", counter(&t.streams_sotw)),
                ("delta", counter(&t.streams_delta)),
            ],
        ));
        all.push(by(
            "xdstap_decode_errors",
            "xDS messages forwarded but not decoded, by reason.",
            C,
            "reason",
            &[
                ("invalid_protobuf", counter(&t.decode_invalid)),
                ("encoding", counter(&t.decode_encoding)),
                ("too_large", counter(&t.decode_too_large)),
                ("framing", counter(&t.framing_errors)),
            ],
        ));
        all.extend(self.board_states());
        all
    }

    /// The status board's families: nodes by state, and the objects rejected now.
    fn board_states(&self) -> Vec<Scraped> {
        use MetricType::Gauge as G;
        let mut all = Vec::new();
        let counts = self.status.counts(crate::clock::now());
        let states = [
            SyncState::Synced,
            SyncState::NotSent,
            SyncState::Pending,
            SyncState::Nacked,
            SyncState::Stale,
        ]
        .map(|st| (state_label(st), counts.get(&st).copied().unwrap_or(0)));
        let help = "Client nodes by their worst type's sync state.";
        all.push(by("xdstap_clients", help, G, "state", &states));
        let rejected = (self.status.report(crate::clock::now(), None))
            .rejected_objects
            .len() as u64;
        all.push(one(
            "xdstap_rejected_objects",
            "Kubernetes objects (as the resources' metadata names them) behind a NACK on some \
             node now.",
            G,
            rejected,
        ));
        all
    }
}

impl prometheus_client::collector::Collector for Sources {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for f in self.scraped() {
            let mut m = e.encode_descriptor(f.name, f.help, None, f.kind)?;
            for (labels, v) in f.samples {
                let sample = m.encode_family(&labels)?;
                match f.kind {
                    MetricType::Gauge => ConstGauge::new(v as i64).encode(sample)?,
                    _ => ConstCounter::new(v).encode(sample)?,
                }
            }
        }
        Ok(())
    }
}

fn state_label(s: SyncState) -> &'static str {
    match s {
        SyncState::Synced => "synced",
        SyncState::Pending => "pending",
        SyncState::NotSent => "not_sent",
        SyncState::Nacked => "nacked",
        SyncState::Stale => "stale",
        SyncState::Unspecified => "unspecified",
    }
}

/// The registry and the sink that feeds it.
pub fn registry(sources: Sources) -> (Registry, PushMetrics) {
    let mut registry = Registry::default();
    let pushes = Family::<PushLabels, Counter>::default();
    let latency: Family<PushLabels, Histogram, fn() -> Histogram> =
        Family::new_with_constructor(|| Histogram::new(latency_buckets()));
    registry.register(
        "xdstap_pushes",
        "Config pushes by type and verdict.",
        pushes.clone(),
    );
    registry.register(
        "xdstap_push_answer_seconds",
        "Push to verdict, by type and verdict.",
        latency.clone(),
    );
    registry.register_collector(Box::new(sources));
    (registry, PushMetrics { pushes, latency })
}

/// The OpenMetrics text of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}
