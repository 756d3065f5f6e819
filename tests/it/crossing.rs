//! A push that crosses the client's RST_STREAM on the wire: the client resets its per-type
//! stream (SotW and Delta) while the control plane, not yet aware of it, sends its response;
//! the tap sees the reset first, forwards the response as the wire allows, and records the
//! push as pushed and unanswered, the stream's end named, in its events and its event log.
//! The control plane here is a raw HTTP/2 peer, so that its response goes out after the reset
//! has passed the tap, every time: first with a hand-made client, then with a real Envoy whose
//! per-type EDS stream Envoy itself resets when a CDS push removes the cluster it fed.

use std::sync::{Arc, Mutex};

use crate::support;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use support::envoy::Envoy;
use support::otlp::Receiver;
use support::resources::{endpoints, per_type_cluster, static_cluster, CDS};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use xdstap::correlate::{Event, Verdict};
use xdstap::xds::wire::bytes as field;

const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const SOTW: &str = "/envoy.service.endpoint.v3.EndpointDiscoveryService/StreamEndpoints";
const DELTA: &str = "/envoy.service.endpoint.v3.EndpointDiscoveryService/DeltaEndpoints";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The push: SotW's DiscoveryResponse or Delta's DeltaDiscoveryResponse, one endpoint
/// assignment `a`, nonce `n1`, gRPC-framed.
fn push(delta: bool) -> Vec<u8> {
    let mut cla = Vec::new();
    field(&mut cla, 1, b"a");
    let mut m = Vec::new();
    if delta {
        let mut resource = Vec::new();
        let mut any = Vec::new();
        field(&mut any, 1, EDS.as_bytes());
        field(&mut any, 2, &cla);
        field(&mut resource, 1, b"1");
        field(&mut resource, 2, &any);
        field(&mut resource, 3, b"a");
        field(&mut m, 1, b"v1");
        field(&mut m, 2, &resource);
    } else {
        let mut any = Vec::new();
        field(&mut any, 1, EDS.as_bytes());
        field(&mut any, 2, &cla);
        field(&mut m, 1, b"v1");
        field(&mut m, 2, &any);
    }
    field(&mut m, 4, EDS.as_bytes());
    field(&mut m, 5, b"n1");
    support::raw::grpc(&m).to_vec()
}

/// A control plane that answers stream 1 only once the client's RST_STREAM for it has come
/// through the tap: its response crosses the reset.
async fn crossing_upstream(listener: TcpListener, delta: bool) {
    let (mut s, _) = listener.accept().await.unwrap();
    s.write_all(&frame(4, 0, 0, &[])).await.unwrap();
    s.write_all(&frame(4, 1, 0, &[])).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // The client's preface, then frames until an RST_STREAM on stream 1.
    let mut at = 24;
    'read: loop {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the tap closed before the reset came");
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= at + 9 {
            let len = u32::from_be_bytes([0, buf[at], buf[at + 1], buf[at + 2]]) as usize;
            let (kind, stream) = (
                buf[at + 3],
                u32::from_be_bytes(buf[at + 5..at + 9].try_into().unwrap()),
            );
            if kind == 3 && stream == 1 {
                break 'read;
            }
            at += 9 + len;
        }
    }
    // :status 200 (indexed), content-type: application/grpc (literal, name indexed).
    let mut block = vec![0x88, 0x0f, 0x10, 0x10];
    block.extend_from_slice(b"application/grpc");
    s.write_all(&frame(1, 4, 1, &block)).await.unwrap();
    s.write_all(&frame(0, 0, 1, &push(delta))).await.unwrap();
    // Held open until the tap closes it.
    tokio::spawn(async move { while s.read(&mut chunk).await.is_ok_and(|n| n > 0) {} });
}

/// A tap from `upstream` writing its event log to `log`, with `extra` flags.
async fn logging_tap(
    upstream: &str,
    log: &std::path::Path,
    extra: &[&str],
) -> support::tap::XdsTap {
    let log = log.display().to_string();
    let mut flags = vec!["--listen", "127.0.0.1:0", "--upstream", upstream];
    flags.extend(["--admin", "off", "--event-log", &log]);
    flags.extend_from_slice(extra);
    support::tap::XdsTap::with_flags(&flags).await
}

/// The event log's line for the push `nonce`.
fn log_line(log: &std::path::Path, nonce: &str) -> serde_json::Value {
    let lines = std::fs::read_to_string(log).unwrap();
    (lines.lines())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["nonce"] == nonce)
        .unwrap_or_else(|| panic!("no line for the push {nonce}: {lines}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_that_crosses_the_clients_reset_is_recorded_as_unanswered() {
    for delta in [false, true] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(crossing_upstream(listener, delta));
        let dir = support::TempDir::new("crossing");
        let log = dir.path().join("events.jsonl");
        let tap = logging_tap(&upstream, &log, &[]).await;
        let io = TcpStream::connect(&tap.tap.addr).await.unwrap();
        let client = support::raw::client(io).await;
        let mut client = client.ready().await.unwrap();
        let path = if delta { DELTA } else { SOTW };
        let (_, mut send) = client
            .send_request(support::raw::request(path), false)
            .unwrap();
        let mut node = Vec::new();
        field(&mut node, 1, b"crossing-node");
        let mut request = Vec::new();
        match delta {
            // DeltaDiscoveryRequest: 1 node, 2 type_url, 3 resource_names_subscribe.
            true => {
                field(&mut request, 1, &node);
                field(&mut request, 2, EDS.as_bytes());
                field(&mut request, 3, b"a");
            }
            // DiscoveryRequest: 2 node, 3 resource_names, 4 type_url.
            false => {
                field(&mut request, 2, &node);
                field(&mut request, 3, b"a");
                field(&mut request, 4, EDS.as_bytes());
            }
        }
        send.send_data(support::raw::grpc(&request), false).unwrap();
        // The tap must have seen the request before the reset.
        support::eventually(10, "the request observed", || {
            tap.events()
                .iter()
                .any(|e| matches!(e, Event::Subscribe { .. }))
                .then_some(())
        })
        .await;
        send.send_reset(h2::Reason::CANCEL);
        support::within(20, "the control plane's crossing response", server)
            .await
            .unwrap();

        let verdict = support::eventually(10, "the crossing push's verdict", || {
            tap.events().into_iter().find_map(|e| match e {
                Event::Verdict { push, verdict, .. } if push.nonce == "n1" => Some(verdict),
                _ => None,
            })
        })
        .await;
        let Verdict::Unanswered { message, .. } = &verdict else {
            panic!("delta {delta}: {verdict:?}");
        };
        assert!(
            message.starts_with("reset by client") && message.ends_with("crossed the stream's end"),
            "{message}"
        );
        assert!(
            tap.events()
                .iter()
                .any(|e| matches!(e, Event::Push { push, .. } if push.nonce == "n1")),
            "pushed"
        );
        tap.close().await;
        let line = log_line(&log, "n1");
        assert_eq!(line["verdict"], "unanswered", "{line}");
        assert_eq!(line["node"], "crossing-node", "{line}");
    }
}

/// A control plane for a real Envoy on per-type streams (SotW or Delta), on raw HTTP/2 so that
/// it can answer a stream the client has reset. CDS gets cluster `a`, whose endpoints come over
/// an EDS stream of their own; when Envoy asks for them, CDS replaces `a` by a static `b`, so
/// Envoy removes `a` and resets its EDS stream; once that reset has come through the tap, the
/// endpoints go out on the stream all the same.
#[derive(Clone)]
struct Plane {
    delta: bool,
    state: Arc<Mutex<PlaneState>>,
    crossed: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct PlaneState {
    /// Per connection, what writes to it.
    writers: Vec<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>,
    /// (connection, stream) of the CDS stream and of `a`'s EDS stream.
    cds: Option<(usize, u32)>,
    eds: Option<(usize, u32)>,
    /// Streams that have had their response headers.
    answered: Vec<(usize, u32)>,
    crossed: bool,
    /// The response nonce of every request.
    answered_nonces: Vec<String>,
}

impl Plane {
    fn response(
        &self,
        type_url: &str,
        version: &str,
        nonce: &str,
        add: Vec<(String, Any)>,
        remove: &[&str],
    ) -> Vec<u8> {
        let m = match self.delta {
            true => DeltaDiscoveryResponse {
                system_version_info: version.into(),
                resources: (add.into_iter())
                    .map(|(name, any)| Resource {
                        name,
                        version: version.into(),
                        resource: Some(any),
                        ..Default::default()
                    })
                    .collect(),
                type_url: type_url.into(),
                removed_resources: remove.iter().map(|n| n.to_string()).collect(),
                nonce: nonce.into(),
                ..Default::default()
            }
            .encode_to_vec(),
            false => DiscoveryResponse {
                version_info: version.into(),
                resources: add.into_iter().map(|(_, any)| any).collect(),
                type_url: type_url.into(),
                nonce: nonce.into(),
                ..Default::default()
            }
            .encode_to_vec(),
        };
        support::raw::grpc(&m).to_vec()
    }

    /// Writes `message` on (connection, stream), after response headers the first time.
    fn send(&self, state: &mut PlaneState, (conn, stream): (usize, u32), message: Vec<u8>) {
        let mut out = Vec::new();
        if !state.answered.contains(&(conn, stream)) {
            state.answered.push((conn, stream));
            // :status 200 (indexed), content-type: application/grpc (literal, name indexed).
            let mut block = vec![0x88, 0x0f, 0x10, 0x10];
            block.extend_from_slice(b"application/grpc");
            out.extend(frame(1, 4, stream, &block));
        }
        out.extend(frame(0, 0, stream, &message));
        let _ = state.writers[conn].send(out);
    }

    /// One gRPC message from the client on (connection, stream).
    fn on_request(&self, at: (usize, u32), bytes: &[u8]) {
        let (type_url, names, nonce) = match self.delta {
            true => {
                let r = DeltaDiscoveryRequest::decode(bytes).unwrap();
                (r.type_url, r.resource_names_subscribe, r.response_nonce)
            }
            false => {
                let r = DiscoveryRequest::decode(bytes).unwrap();
                (r.type_url, r.resource_names, r.response_nonce)
            }
        };
        let mut state = self.state.lock().unwrap();
        state.answered_nonces.push(nonce);
        if type_url == CDS && state.cds.is_none() {
            state.cds = Some(at);
            let a = per_type_cluster("a", self.delta);
            let push = self.response(CDS, "1", "cds-1", vec![a], &[]);
            self.send(&mut state, at, push);
        } else if type_url == EDS && state.eds.is_none() && names.iter().any(|n| n == "a") {
            state.eds = Some(at);
            let b = ("b".to_string(), static_cluster("b", 1000, 9));
            let push = self.response(CDS, "2", "cds-2", vec![b], &["a"]);
            let cds = state.cds.unwrap();
            self.send(&mut state, cds, push);
        }
    }

    /// The client reset (connection, stream): `a`'s EDS stream gets its endpoints now.
    fn on_reset(&self, at: (usize, u32)) {
        let mut state = self.state.lock().unwrap();
        if state.eds != Some(at) || state.crossed {
            return;
        }
        state.crossed = true;
        let push = self.response(EDS, "1", "eds-crossing", vec![endpoints("a", 9)], &[]);
        self.send(&mut state, at, push);
        self.crossed.notify_one();
    }

    async fn serve(self, listener: TcpListener) {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(self.clone().connection(s));
        }
    }

    async fn connection(self, s: TcpStream) {
        let (mut r, mut w) = s.into_split();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if w.write_all(&b).await.is_err() {
                    break;
                }
            }
        });
        // SETTINGS: streams may take 1 GiB unread; the connection's window up as far.
        let mut settings = vec![0, 4];
        settings.extend_from_slice(&(1u32 << 30).to_be_bytes());
        let _ = tx.send(frame(4, 0, 0, &settings));
        let _ = tx.send(frame(8, 0, 0, &((1u32 << 30) - 65_535).to_be_bytes()));
        let conn = {
            let mut state = self.state.lock().unwrap();
            state.writers.push(tx.clone());
            state.writers.len() - 1
        };
        let mut buf = Vec::new();
        let mut at = 24;
        let mut bodies: std::collections::HashMap<u32, Vec<u8>> = Default::default();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = match r.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= at + 9 {
                let len = u32::from_be_bytes([0, buf[at], buf[at + 1], buf[at + 2]]) as usize;
                if buf.len() < at + 9 + len {
                    break;
                }
                let (kind, flags) = (buf[at + 3], buf[at + 4]);
                let stream =
                    u32::from_be_bytes(buf[at + 5..at + 9].try_into().unwrap()) & !(1 << 31);
                let payload = buf[at + 9..at + 9 + len].to_vec();
                at += 9 + len;
                match kind {
                    // DATA (padding, if any, stripped): gRPC messages, each handled whole.
                    0 => {
                        let payload = match flags & 0x8 {
                            0 => &payload[..],
                            _ => &payload[1..payload.len() - payload[0] as usize],
                        };
                        let body = bodies.entry(stream).or_default();
                        body.extend_from_slice(payload);
                        while body.len() >= 5 {
                            let m = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
                            if body.len() < 5 + m {
                                break;
                            }
                            let message: Vec<u8> = body.drain(..5 + m).skip(5).collect();
                            self.on_request((conn, stream), &message);
                        }
                    }
                    3 => self.on_reset((conn, stream)),
                    4 if flags & 1 == 0 => {
                        let _ = tx.send(frame(4, 1, 0, &[]));
                    }
                    6 if flags & 1 == 0 => {
                        let _ = tx.send(frame(6, 1, 0, &payload));
                    }
                    _ => {}
                }
            }
        }
    }
}

fn per_type_bootstrap(node: &str, tap: &str, delta: bool) -> String {
    let (host, port) = tap.rsplit_once(':').unwrap();
    let api = if delta { "DELTA_GRPC" } else { "GRPC" };
    format!(
        r#"node: {{ id: {node}, cluster: test-cluster }}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
dynamic_resources:
  cds_config:
    resource_api_version: V3
    api_config_source:
      api_type: {api}
      transport_api_version: V3
      grpc_services: [{{ envoy_grpc: {{ cluster_name: xds }} }}]
static_resources:
  clusters:
  - name: xds
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: xds
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: "{host}", port_value: {port} }} }} }}
"#
    )
}

/// A real Envoy on per-type streams, SotW and Delta: a CDS push removes the cluster an EDS
/// stream feeds, Envoy resets that stream, and the endpoints the control plane sends on it
/// cross the reset. The push is in the tap's events, its event log and its spans as pushed and
/// unanswered, the stream's end named, and Envoy takes the CDS push that removed the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_resets_a_per_type_stream_as_a_push_crosses_it() {
    for delta in [false, true] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap().to_string();
        let plane = Plane {
            delta,
            state: Arc::default(),
            crossed: Arc::default(),
        };
        let server = tokio::spawn(plane.clone().serve(listener));
        let receiver = Receiver::grpc().await;
        let dir = support::TempDir::new("crossing-envoy");
        let log = dir.path().join("events.jsonl");
        let otlp = [
            "--otlp-endpoint",
            &receiver.endpoint,
            "--otlp-protocol",
            "grpc",
        ];
        let tap = logging_tap(&upstream, &log, &otlp).await;
        let node = format!("per-type-{}", if delta { "delta" } else { "sotw" });
        let envoy =
            Envoy::start_yaml(&node, &per_type_bootstrap(&node, &tap.tap.addr, delta)).await;
        support::within(
            30,
            "Envoy's reset of a's EDS stream",
            plane.crossed.notified(),
        )
        .await;

        // Envoy runs b, not a: it took the push that removed a.
        support::eventually_async(20, "Envoy runs b without a", || async {
            let clusters = envoy.clusters().await;
            (clusters.contains("b::") && !clusters.contains("\na::")).then_some(())
        })
        .await;
        let ack = support::eventually(10, "cds-2's verdict", || {
            tap.events().into_iter().find_map(|e| match e {
                Event::Verdict { push, verdict, .. } if push.nonce == "cds-2" => Some(verdict),
                _ => None,
            })
        })
        .await;
        assert!(matches!(ack, Verdict::Ack), "delta {delta}: {ack:?}");

        let verdict = support::eventually(10, "the crossing push's verdict", || {
            tap.events().into_iter().find_map(|e| match e {
                Event::Verdict { push, verdict, .. } if push.nonce == "eds-crossing" => {
                    Some(verdict)
                }
                _ => None,
            })
        })
        .await;
        let Verdict::Unanswered { message, .. } = &verdict else {
            panic!("delta {delta}: {verdict:?}");
        };
        assert!(
            message.starts_with("reset by client") && message.ends_with("crossed the stream's end"),
            "{message}"
        );
        assert!(
            !(plane.state.lock().unwrap().answered_nonces.iter()).any(|n| n == "eds-crossing"),
            "Envoy never answered the push"
        );

        let span = support::eventually(40, "the crossing push's span", || {
            receiver
                .spans()
                .into_iter()
                .find(|s| s.text("xds.nonce").as_deref() == Some("eds-crossing"))
        })
        .await;
        assert_eq!(span.text("xds.verdict").as_deref(), Some("unanswered"));
        assert_eq!(span.text("xds.type").as_deref(), Some("EDS"));
        assert_eq!(span.text("xds.node.id").as_deref(), Some(node.as_str()));
        let end = span.text("xds.end_message").unwrap_or_default();
        assert!(end.ends_with("crossed the stream's end"), "{end}");

        drop(envoy);
        tap.close().await;
        server.abort();
        let line = log_line(&log, "eds-crossing");
        assert_eq!(line["verdict"], "unanswered", "{line}");
        assert_eq!(line["node"], node.as_str(), "{line}");
    }
}
