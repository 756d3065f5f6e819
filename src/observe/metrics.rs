//! Prometheus metrics (prometheus-client, OpenMetrics text). Push counts and push->answer
//! latency are updated by a sink on the queue's task; the forwarder's and observer's counters
//! are read at scrape time. No per-node label: per-node detail lives in `/status`.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::board::{StatusBoard, SyncState};
use super::spans::SpanStats;
use super::{Sink, TapStats};
use crate::correlate::Event;
use crate::proxy::ProxyStats;
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
    pub tap: Arc<TapStats>,
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

fn read(c: &AtomicU64) -> u64 {
    c.load(std::sync::atomic::Ordering::Relaxed)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(&[(&str, &str)], u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in values {
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ConstCounter::new(*v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(&[(&str, &str)], i64)],
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in values {
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ConstGauge::new(*v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for Sources {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (p, t, s) = (&self.proxy, &self.tap, &self.spans);
        counter(
            &mut e,
            "xdstap_forwarded_bytes",
            "Bytes forwarded, by direction (request: client to control plane).",
            &[
                (&[("direction", "request")], read(&p.request_bytes)),
                (&[("direction", "response")], read(&p.response_bytes)),
            ],
        )?;
        counter(
            &mut e,
            "xdstap_forwarded_messages",
            "gRPC messages forwarded, by direction.",
            &[
                (&[("direction", "request")], read(&t.request_messages)),
                (&[("direction", "response")], read(&t.response_messages)),
            ],
        )?;
        counter(
            &mut e,
            "xdstap_connections",
            "Client connections accepted.",
            &[(&[], read(&p.connections_total))],
        )?;
        gauge(
            &mut e,
            "xdstap_connections_active",
            "Client connections open.",
            &[(&[], read(&p.connections_active) as i64)],
        )?;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            gauge(
                &mut e,
                "xdstap_tasks",
                "Tasks alive in the runtime (a leak shows here).",
                &[(&[], rt.metrics().num_alive_tasks() as i64)],
            )?;
        }
        counter(
            &mut e,
            "xdstap_streams",
            "HTTP/2 streams forwarded (any method).",
            &[(&[], read(&p.streams_total))],
        )?;
        gauge(
            &mut e,
            "xdstap_xds_streams_active",
            "xDS streams open, by API.",
            &[
                (&[("api", "sotw")], read(&t.streams_sotw) as i64),
                (&[("api", "delta")], read(&t.streams_delta) as i64),
            ],
        )?;
        counter(
            &mut e,
            "xdstap_upstream_connect_errors",
            "Failed connections to the control plane.",
            &[(&[], read(&p.upstream_connect_errors))],
        )?;
        counter(
            &mut e,
            "xdstap_handshake_errors",
            "Client connections that failed the TLS or HTTP/2 handshake.",
            &[(&[], read(&p.handshake_errors))],
        )?;
        counter(
            &mut e,
            "xdstap_connection_errors",
            "Client connections that ended with an error after the handshake (protocol violation, flood, broken socket).",
            &[(&[], read(&p.connection_errors))],
        )?;
        counter(
            &mut e,
            "xdstap_decoded_messages",
            "xDS messages decoded.",
            &[(&[], read(&t.decoded))],
        )?;
        counter(
            &mut e,
            "xdstap_decode_errors",
            "xDS messages forwarded but not decoded, by reason.",
            &[
                (&[("reason", "invalid_protobuf")], read(&t.decode_invalid)),
                (&[("reason", "encoding")], read(&t.decode_encoding)),
                (&[("reason", "too_large")], read(&t.decode_too_large)),
                (&[("reason", "framing")], read(&t.framing_errors)),
            ],
        )?;
        counter(
            &mut e,
            "xdstap_unmatched_answers",
            "Answers naming a nonce the tap never saw pushed.",
            &[(&[], read(&t.unmatched_answers))],
        )?;
        counter(
            &mut e,
            "xdstap_nonce_reuses",
            "Pushes whose nonce repeated one still open or recently decided (a control-plane fault).",
            &[(&[], read(&t.nonce_reuses))],
        )?;
        counter(
            &mut e,
            "xdstap_dropped_events",
            "Correlation events dropped because the sinks fell behind.",
            &[(&[], read(&t.dropped_events))],
        )?;
        counter(
            &mut e,
            "xdstap_spans_exported",
            "Spans the OTLP backend accepted.",
            &[(&[], read(&s.exported))],
        )?;
        counter(
            &mut e,
            "xdstap_dropped_spans",
            "Spans dropped: export queue full or export failed.",
            &[(&[], read(&s.dropped))],
        )?;
        counter(
            &mut e,
            "xdstap_span_export_errors",
            "Failed or timed-out OTLP export calls.",
            &[(&[], read(&s.export_errors))],
        )?;
        let counts = self.status.counts(super::now());
        let states = [
            SyncState::Synced,
            SyncState::Pending,
            SyncState::NotSent,
            SyncState::Nacked,
            SyncState::Stale,
        ];
        let labels: Vec<[(&str, &str); 1]> = states
            .iter()
            .map(|s| [("state", state_label(*s))])
            .collect();
        let values: Vec<(&[(&str, &str)], i64)> = states
            .iter()
            .zip(labels.iter())
            .map(|(s, l)| (&l[..], counts.get(s).copied().unwrap_or(0) as i64))
            .collect();
        gauge(
            &mut e,
            "xdstap_clients",
            "Client nodes by their worst type's sync state.",
            &values,
        )?;
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
