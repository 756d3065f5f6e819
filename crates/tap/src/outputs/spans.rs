//! OpenTelemetry spans: one per push, from the push to its verdict, exported over OTLP (gRPC or
//! HTTP/protobuf) by `opentelemetry-otlp`'s exporter.
//!
//! The batching is ours rather than the SDK's batch processor, so every dropped span is counted:
//! the sink (on the sinks' thread) hands finished spans to a bounded queue with `try_send`;
//! one export task sends batches. A slow or dead backend fills the queue and costs dropped spans,
//! never forwarding throughput and never unbounded memory.
//!
//! Trace ids: by default every span of one config version (every type, every proxy, every tap
//! with the same control-plane id) shares a trace id derived from the version string, so one trace
//! shows a whole rollout. Pushes without a version (Delta often has none) get a trace each.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Event as SpanEvent, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

use crate::api::NAMES_CAP;
use crate::correlate::{Event, Scope, Timestamp, VerdictKind};
use crate::queue::{Delivered, Sink};
use crate::record::VerdictRecord;
pub use crate::views::traces::{Grouping, TraceIds};

/// OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (Jaeger and the Collector on 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (4318, `/v1/traces`).
    HttpProtobuf,
}

/// Span export settings.
#[derive(Clone, Debug)]
pub struct SpanSettings {
    /// Base URL (`http://jaeger:4317`); `None`: the exporter reads
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: Option<String>,
    /// Transport.
    pub protocol: Protocol,
    /// Trace grouping.
    pub grouping: Grouping,
    /// Mixed into version-derived trace ids: taps in front of different control planes whose
    /// version strings could collide get different traces.
    pub control_plane_id: String,
    /// Spans waiting for export before new ones are dropped.
    pub queue: usize,
    /// Spans per export call.
    pub batch: usize,
    /// Longest a finished span waits for its batch.
    pub interval: Duration,
    /// Per export call.
    pub timeout: Duration,
    /// Write spans as OTLP JSON lines (one `ExportTraceServiceRequest` per batch) to this file
    /// instead of sending them.
    pub file: Option<std::path::PathBuf>,
}

impl Default for SpanSettings {
    fn default() -> Self {
        SpanSettings {
            endpoint: None,
            protocol: Protocol::HttpProtobuf,
            grouping: Grouping::Version,
            control_plane_id: String::new(),
            queue: 2048,
            batch: 512,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
            file: None,
        }
    }
}

/// Export counters.
#[derive(Debug, Default)]
pub struct SpanStats {
    /// Spans the backend accepted.
    pub exported: AtomicU64,
    /// Spans lost: queue full, or their batch failed.
    pub dropped: AtomicU64,
    /// Export calls that failed or timed out.
    pub export_errors: AtomicU64,
}

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("OTLP exporter: {0}")]
pub struct SetupError(String);

/// The resource every span carries: `service.name` (`xdstap` unless `OTEL_SERVICE_NAME` or
/// `OTEL_RESOURCE_ATTRIBUTES` says otherwise), `service.version`, `service.instance.id`,
/// `host.name`, then whatever `OTEL_RESOURCE_ATTRIBUTES` adds.
pub fn resource(instance: &str) -> Resource {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let mut builder = Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", "xdstap"),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", instance.to_string()),
            KeyValue::new("host.name", host),
        ])
        .with_detector(Box::new(
            opentelemetry_sdk::resource::EnvResourceDetector::new(),
        ));
    if let Ok(name) = std::env::var("OTEL_SERVICE_NAME") {
        if !name.is_empty() {
            builder = builder.with_service_name(name);
        }
    }
    builder.build()
}

/// Starts the export task; the returned sink goes to the pipeline. The task ends, after a last
/// flush, when the sink is dropped.
pub fn start(
    settings: SpanSettings,
    stats: Arc<SpanStats>,
) -> Result<(SpanSink, JoinHandle<()>), SetupError> {
    // Headers, compression and the endpoint when not given come from the standard
    // OTEL_EXPORTER_OTLP_* variables, read by the exporter's builder.
    use opentelemetry_otlp::WithExportConfig;
    let instance = format!("{:032x}", instance_seed());
    let resource = resource(&instance);
    let exporter = match &settings.file {
        Some(path) => Exporter::File(JsonLines::create(path, &resource)?),
        None => {
            let mut e = match settings.protocol {
                Protocol::Grpc => {
                    let mut b = opentelemetry_otlp::SpanExporter::builder()
                        .with_tonic()
                        .with_timeout(settings.timeout);
                    if let Some(e) = &settings.endpoint {
                        b = b.with_endpoint(e.clone());
                    }
                    b.build()
                }
                Protocol::HttpProtobuf => {
                    let mut b = opentelemetry_otlp::SpanExporter::builder()
                        .with_http()
                        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                        .with_timeout(settings.timeout);
                    if let Some(e) = &settings.endpoint {
                        b = b.with_endpoint(http_traces_url(e));
                    }
                    b.build()
                }
            }
            .map_err(|e| SetupError(e.to_string()))?;
            e.set_resource(&resource);
            Exporter::Otlp(Box::new(e))
        }
    };
    let (tx, rx) = mpsc::channel(settings.queue.max(1));
    let task = tokio::spawn(export_loop(exporter, rx, settings.clone(), stats.clone()));
    let sink = SpanSink {
        tx,
        stats,
        traces: TraceIds::new(settings.grouping, settings.control_plane_id, &instance),
        scope: InstrumentationScope::builder("xdstap")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
        changes: HashMap::new(),
        last_warning: None,
    };
    Ok((sink, task))
}

/// `http://host:4318` -> `http://host:4318/v1/traces`, as the OTLP spec does for the base
/// endpoint variable; a URL with a path is taken as is.
fn http_traces_url(base: &str) -> String {
    let after_scheme = base.split_once("://").map_or(base, |(_, rest)| rest);
    if after_scheme.trim_end_matches('/').contains('/') {
        base.to_string()
    } else {
        format!("{}/v1/traces", base.trim_end_matches('/'))
    }
}

fn instance_seed() -> u128 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut seed = Vec::new();
    seed.extend_from_slice(&now.to_le_bytes());
    seed.extend_from_slice(&std::process::id().to_le_bytes());
    seed.extend_from_slice(
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap_or_default()
            .as_bytes(),
    );
    xxh3_128(&seed)
}

/// Where batches go.
enum Exporter {
    /// An OTLP backend (boxed: one per process, and much larger than the file variant).
    Otlp(Box<opentelemetry_otlp::SpanExporter>),
    /// A local file of OTLP JSON lines.
    File(JsonLines),
}

impl Exporter {
    async fn export(&mut self, batch: Vec<SpanData>) -> Result<(), String> {
        match self {
            Exporter::Otlp(e) => e.export(batch).await.map_err(|e| e.to_string()),
            Exporter::File(f) => f.write(batch).map_err(|e| e.to_string()),
        }
    }

    fn shutdown(&mut self, timeout: Duration) {
        match self {
            Exporter::Otlp(e) => {
                let _ = e.shutdown_with_timeout(timeout);
            }
            Exporter::File(f) => {
                let _ = std::io::Write::flush(&mut f.out);
            }
        }
    }
}

/// OTLP JSON lines: each batch one `ExportTraceServiceRequest` in the OTLP JSON encoding, the
/// format the OpenTelemetry Collector's file exporter writes and its OTLP JSON file receiver reads.
struct JsonLines {
    out: std::io::BufWriter<std::fs::File>,
    resource: opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema,
}

impl JsonLines {
    fn create(path: &std::path::Path, resource: &Resource) -> Result<JsonLines, SetupError> {
        use std::os::unix::fs::OpenOptionsExt;
        // Owner only when the tap creates it, whatever the umask.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| SetupError(format!("span file {}: {e}", path.display())))?;
        Ok(JsonLines {
            out: std::io::BufWriter::new(file),
            resource: resource.into(),
        })
    }

    fn write(&mut self, batch: Vec<SpanData>) -> std::io::Result<()> {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use std::io::Write;
        let request = ExportTraceServiceRequest {
            resource_spans:
                opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope(
                    batch,
                    &self.resource,
                ),
        };
        serde_json::to_writer(&mut self.out, &request)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}

async fn export_loop(
    mut exporter: Exporter,
    mut rx: mpsc::Receiver<SpanData>,
    settings: SpanSettings,
    stats: Arc<SpanStats>,
) {
    let mut warned: Option<Instant> = None;
    let mut batch = Vec::with_capacity(settings.batch);
    loop {
        let deadline = tokio::time::Instant::now() + settings.interval;
        let mut closed = false;
        while batch.len() < settings.batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) => {
                    closed = true;
                    break;
                }
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            let n = batch.len() as u64;
            let sent = std::mem::replace(&mut batch, Vec::with_capacity(settings.batch));
            let result = tokio::time::timeout(settings.timeout, exporter.export(sent)).await;
            let failure = match result {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(format!("no answer within {:?}", settings.timeout)),
            };
            match failure {
                None => {
                    stats.exported.fetch_add(n, Ordering::Relaxed);
                }
                Some(why) => {
                    stats.export_errors.fetch_add(1, Ordering::Relaxed);
                    stats.dropped.fetch_add(n, Ordering::Relaxed);
                    if warned.is_none_or(|t| t.elapsed() >= WARN_INTERVAL) {
                        warned = Some(Instant::now());
                        tracing::warn!(
                            dropped_total = stats.dropped.load(Ordering::Relaxed),
                            "span export failed, {n} spans dropped: {why}"
                        );
                    }
                }
            }
        }
        if closed {
            break;
        }
    }
    exporter.shutdown(settings.timeout);
}

/// Drop warnings are logged at most this often.
const WARN_INTERVAL: Duration = Duration::from_secs(30);
/// Subscription changes waiting for their next push, at most this many streams x types.
const MAX_CHANGE_KEYS: usize = 4096;

/// Turns verdict events into spans and hands them to the export task.
pub struct SpanSink {
    tx: mpsc::Sender<SpanData>,
    stats: Arc<SpanStats>,
    traces: TraceIds,
    scope: InstrumentationScope,
    /// (stream, type_url) -> subscription changes seen since that type's last verdict: they
    /// become events of the next push's span (typically the push they asked for).
    changes: HashMap<(u64, String), Vec<SpanEvent>>,
    last_warning: Option<Instant>,
}

fn time(t: Timestamp) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(t)
}

fn strings(names: &[String]) -> Value {
    Value::Array(Array::String(
        names
            .iter()
            .take(NAMES_CAP)
            .map(|n| StringValue::from(n.clone()))
            .collect(),
    ))
}

impl SpanSink {
    /// The trace ids its spans carry.
    pub fn trace_ids(&self) -> TraceIds {
        self.traces.clone()
    }

    fn trace_id(&self, r: &VerdictRecord) -> TraceId {
        (self.traces).of(&r.version, r.stream, &r.subject.type_url, &r.nonce)
    }

    fn span_id(&self, r: &VerdictRecord) -> SpanId {
        let key = format!(
            "span\0{}\0{}\0{}\0{}",
            self.traces.instance, r.stream, r.subject.type_url, r.nonce
        );
        SpanId::from(xxh3_64(key.as_bytes()).max(1))
    }

    /// The span of one verdict.
    pub fn span(&mut self, delivered: &Delivered<'_>) -> Option<SpanData> {
        let Event::Verdict {
            push, decided_at, ..
        } = delivered.event
        else {
            return None;
        };
        // A heartbeat every few seconds per node is no config change to trace.
        if push.heartbeat() {
            return None;
        }
        let r = delivered.record()?;
        let (attributes, answer, status) = describe(r);
        let mut events = SpanEvents::default();
        if let Some(changes) = self.changes.remove(&(r.stream, r.subject.type_url.clone())) {
            events.events.extend(changes);
        }
        events.events.push(SpanEvent::new(
            format!("xds.{}", r.verdict.name()),
            time(*decided_at),
            answer,
            0,
        ));
        Some(SpanData {
            span_context: SpanContext::new(
                self.trace_id(r),
                self.span_id(r),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Owned(format!("xds.push {}", r.subject.short_type)),
            start_time: time(push.at),
            end_time: time(*decided_at),
            attributes,
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        })
    }

    fn note_change(&mut self, event: &Event) {
        let Event::SubscriptionChange {
            context,
            names,
            unsubscribed,
        } = event
        else {
            return;
        };
        if self.changes.len() >= MAX_CHANGE_KEYS {
            self.changes.clear();
        }
        let list = self
            .changes
            .entry((context.stream.seq, context.type_url.clone()))
            .or_default();
        if list.len() < 16 {
            list.push(SpanEvent::new(
                "xds.subscription_change",
                time(context.time),
                vec![
                    KeyValue::new("xds.names", strings(names)),
                    KeyValue::new("xds.unsubscribed", strings(unsubscribed)),
                ],
                0,
            ));
        }
    }
}

/// What of a NACKed push was rejected and what landed all the same.
fn scope(r: &VerdictRecord) -> [(&'static str, Option<Value>); 6] {
    let partial = r.nack_scope == Some(Scope::Partial);
    let objects = |f: fn(&crate::api::v1::Origin) -> String| {
        let all: Vec<String> = r.objects.iter().map(f).filter(|s| !s.is_empty()).collect();
        (!all.is_empty()).then(|| strings(&all))
    };
    [
        (
            "xds.nack_scope",
            r.nack_scope.map(|s| Value::from(s.as_str())),
        ),
        ("xds.rejected", partial.then(|| strings(&r.rejected))),
        ("xds.applied", partial.then(|| strings(&r.applied))),
        // The objects the rejected resources were made from: `DestinationRule default/r`.
        ("xds.objects", objects(|o| o.label())),
        ("xds.objects.kubectl", objects(|o| o.kubectl.clone())),
        // Any verdict: the objects whose resources the push changed for this client.
        (
            "xds.objects.changed",
            (!r.objects_changed.is_empty()).then(|| strings(&r.objects_changed)),
        ),
    ]
}

/// A verdict's span attributes, the attributes of its answer event, and its status (OK for an
/// ACK, ERROR with the client's message for a NACK).
fn describe(r: &VerdictRecord) -> (Vec<KeyValue>, Vec<KeyValue>, Status) {
    let mut attributes = vec![
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("rpc.service", r.service.clone()),
        KeyValue::new("rpc.method", r.method.clone()),
        KeyValue::new("xds.type_url", r.subject.type_url.clone()),
        KeyValue::new("xds.type", r.subject.short_type.clone()),
        KeyValue::new("xds.api", r.subject.api.map_or("", |a| a.as_str())),
        KeyValue::new("xds.version", r.version.clone()),
        KeyValue::new("xds.nonce", r.nonce.clone()),
        KeyValue::new("xds.resource_count", r.resources as i64),
        KeyValue::new("xds.resource_names", strings(&r.resource_names)),
        KeyValue::new("xds.bytes", r.bytes as i64),
        KeyValue::new("xds.verdict", r.verdict.name()),
        KeyValue::new("xds.node.id", r.subject.node.clone()),
        KeyValue::new("xds.node.cluster", r.subject.node_cluster.clone()),
        KeyValue::new("xds.node.user_agent", r.subject.user_agent.clone()),
        KeyValue::new("xds.stream.id", r.stream as i64),
        KeyValue::new("client.address", r.downstream.clone()),
        KeyValue::new("server.address", r.upstream.clone()),
        KeyValue::new("xds.latency_ms", r.latency_ms),
    ];
    let mut answer = vec![KeyValue::new("xds.verdict", r.verdict.name())];
    // On the span only, then on both the span and its answer event.
    let span_only = [
        (
            "xds.control_plane",
            r.control_plane.clone().map(Value::from),
        ),
        (
            "rpc.grpc.status_code",
            r.grpc_status.map(|c| Value::from(c as i64)),
        ),
        (
            "xds.error.code",
            r.error_code.map(|c| Value::from(c as i64)),
        ),
        (
            "xds.changed",
            (r.error_code.is_some()).then(|| strings(&r.changed)),
        ),
        (
            "xds.removed_names",
            (!r.removed.is_empty()).then(|| strings(&r.removed)),
        ),
    ];
    let both = [
        (
            "xds.client_version",
            r.client_version.clone().map(Value::from),
        ),
        (
            "xds.error.message",
            r.error_message.clone().map(Value::from),
        ),
        (
            "xds.suspects",
            (r.error_code.is_some()).then(|| strings(&r.suspects)),
        ),
        (
            "xds.superseded_by",
            r.superseded_by.clone().map(Value::from),
        ),
        ("xds.overtaken_by", r.overtaken_by.clone().map(Value::from)),
        (
            "xds.waiting_for",
            (!r.waiting_for.is_empty()).then(|| strings(&r.waiting_for)),
        ),
        ("xds.end_message", r.end_message.clone().map(Value::from)),
    ];
    for (key, value) in span_only {
        if let Some(v) = value {
            attributes.push(KeyValue::new(key, v));
        }
    }
    for (key, value) in both.into_iter().chain(scope(r)) {
        if let Some(v) = value {
            attributes.push(KeyValue::new(key, v.clone()));
            answer.push(KeyValue::new(key, v));
        }
    }
    let status = match (&r.error_message, r.verdict) {
        (Some(message), _) => Status::Error {
            description: Cow::Owned(message.clone()),
        },
        (None, VerdictKind::Ack) => Status::Ok,
        _ => Status::Unset,
    };
    (attributes, answer, status)
}

impl Sink for SpanSink {
    fn on_event(&mut self, event: &Event) {
        self.deliver(&Delivered::new(event));
    }

    fn deliver(&mut self, delivered: &Delivered<'_>) {
        if let Event::SubscriptionChange { .. } = delivered.event {
            self.note_change(delivered.event);
            return;
        }
        let Some(span) = self.span(delivered) else {
            return;
        };
        if self.tx.try_send(span).is_err() {
            let dropped = self.stats.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if self
                .last_warning
                .is_none_or(|t| t.elapsed() >= WARN_INTERVAL)
            {
                self.last_warning = Some(Instant::now());
                tracing::warn!(
                    dropped_total = dropped,
                    "span export queue full (backend slow or down): dropping spans"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls_get_the_traces_path() {
        assert_eq!(
            http_traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            http_traces_url("http://127.0.0.1:4318/"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            http_traces_url("http://collector/custom/traces"),
            "http://collector/custom/traces"
        );
    }
}
