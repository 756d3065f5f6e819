//! The demo's messages, hand-encoded with [`xdstap_core::xds::wire`]: the Envoy config its control
//! plane serves (clusters, a listener), the xDS requests and responses, and the [`Pipe`] that
//! carries whole gRPC messages over one HTTP/2 stream.

use bytes::{Buf, Bytes, BytesMut};
use h2::{RecvStream, SendStream};

use xdstap_core::xds::wire as pb;

/// The ADS method the demo speaks (SotW).
pub const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// The cluster type URL.
pub const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// The listener type URL.
pub const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
/// The built-in client's node id.
pub const NODE: &str = "demo-client~127.0.0.1~builtin.demo~demo.svc.cluster.local";

/// The namespace of the demo's objects: each cluster is made from the DestinationRule of its
/// name there, as istiod writes it into the cluster's metadata.
pub const NAMESPACE: &str = "demo";

/// A STATIC cluster (type 0, no endpoints) with a connect timeout; name field 1,
/// connect_timeout 4, and istiod's metadata naming DestinationRule and Service `demo/NAME`
/// (25). Envoy rejects a timeout of 0s.
pub fn cluster(name: &str, timeout_ms: u64) -> Vec<u8> {
    let mut c = Vec::new();
    pb::bytes(&mut c, 1, name.as_bytes());
    let mut d = Vec::new();
    if timeout_ms >= 1000 {
        pb::uint(&mut d, 1, timeout_ms / 1000);
    }
    if !timeout_ms.is_multiple_of(1000) {
        pb::uint(&mut d, 2, (timeout_ms % 1000) * 1_000_000);
    }
    pb::bytes(&mut c, 4, &d);
    c.extend(pb::istio_cluster_metadata(name, NAMESPACE));
    c
}

/// A STATIC cluster like [`cluster`] whose one endpoint is `address` port 80 (load_assignment
/// 33: endpoints 2, lb_endpoints 2, endpoint 1, address 1, socket_address 1: address 2, port 3).
/// Envoy rejects an address that is no IP as it adds the cluster, and still adds the others.
pub fn cluster_at(name: &str, timeout_ms: u64, address: &str) -> Vec<u8> {
    let mut socket = Vec::new();
    pb::bytes(&mut socket, 2, address.as_bytes());
    pb::uint(&mut socket, 3, 80);
    let mut nested = socket;
    for field in [1, 1, 1, 2] {
        let mut outer = Vec::new();
        pb::bytes(&mut outer, field, &nested);
        nested = outer;
    }
    let mut assignment = Vec::new();
    pb::bytes(&mut assignment, 1, name.as_bytes());
    pb::bytes(&mut assignment, 2, &nested);
    let mut c = cluster(name, timeout_ms);
    pb::bytes(&mut c, 33, &assignment);
    c
}

/// A listener Envoy accepts: 127.0.0.1 on an ephemeral port, TCP-proxying to cluster `a`.
pub fn listener(name: &str) -> Vec<u8> {
    let mut socket = Vec::new();
    pb::bytes(&mut socket, 2, b"127.0.0.1");
    pb::uint(&mut socket, 3, 0);
    let mut address = Vec::new();
    pb::bytes(&mut address, 1, &socket);
    let mut tcp_proxy = Vec::new();
    pb::bytes(&mut tcp_proxy, 1, name.as_bytes());
    pb::bytes(&mut tcp_proxy, 2, b"a");
    let mut filter = Vec::new();
    pb::bytes(&mut filter, 1, b"envoy.filters.network.tcp_proxy");
    pb::bytes(&mut filter, 4, &any(TCP_PROXY, &tcp_proxy));
    let mut chain = Vec::new();
    pb::bytes(&mut chain, 3, &filter);
    let mut l = Vec::new();
    pb::bytes(&mut l, 1, name.as_bytes());
    pb::bytes(&mut l, 2, &address);
    pb::bytes(&mut l, 3, &chain);
    l
}

fn any(type_url: &str, value: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    pb::bytes(&mut a, 1, type_url.as_bytes());
    pb::bytes(&mut a, 2, value);
    a
}

/// An encoded DiscoveryResponse of `resources` (each an encoded `Any`).
pub fn response(type_url: &str, version: &str, nonce: &str, resources: &[Vec<u8>]) -> Vec<u8> {
    let mut m = Vec::new();
    pb::bytes(&mut m, 1, version.as_bytes());
    for r in resources {
        pb::bytes(&mut m, 2, &any(type_url, r));
    }
    pb::bytes(&mut m, 4, type_url.as_bytes());
    pb::bytes(&mut m, 5, nonce.as_bytes());
    m
}

/// An encoded DiscoveryRequest answering `nonce` with `version`: an ACK, or with `error` a
/// NACK; with `node`, the demo client's node.
pub fn request(
    type_url: &str,
    version: &str,
    nonce: &str,
    node: bool,
    error: Option<&str>,
) -> Vec<u8> {
    let mut m = Vec::new();
    pb::bytes(&mut m, 1, version.as_bytes());
    if node {
        let mut n = Vec::new();
        pb::bytes(&mut n, 1, NODE.as_bytes());
        pb::bytes(&mut n, 2, b"demo");
        pb::bytes(&mut n, 6, b"xdstap-demo-client");
        pb::bytes(&mut m, 2, &n);
    }
    pb::bytes(&mut m, 4, type_url.as_bytes());
    pb::bytes(&mut m, 5, nonce.as_bytes());
    if let Some(message) = error {
        let mut s = Vec::new();
        pb::uint(&mut s, 1, 13);
        pb::bytes(&mut s, 2, message.as_bytes());
        pb::bytes(&mut m, 6, &s);
    }
    m
}

/// One end of a gRPC stream: send and receive whole messages.
pub struct Pipe {
    /// The sending half.
    pub send: SendStream<Bytes>,
    recv: RecvStream,
    buf: BytesMut,
}

impl Pipe {
    /// A pipe over one stream's halves.
    pub fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        Pipe {
            send,
            recv,
            buf: BytesMut::new(),
        }
    }

    /// Sends one message.
    pub fn send(&mut self, msg: &[u8]) -> anyhow::Result<()> {
        self.send
            .send_data(Bytes::from(xdstap_core::grpc::encode(msg)), false)?;
        Ok(())
    }
    /// The next whole message.
    pub async fn recv(&mut self) -> anyhow::Result<Vec<u8>> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    return Ok(self.buf.split_to(len).to_vec());
                }
            }
            let chunk = self
                .recv
                .data()
                .await
                .ok_or_else(|| anyhow::anyhow!("stream ended"))??;
            let _ = self.recv.flow_control().release_capacity(chunk.len());
            self.buf.extend_from_slice(&chunk);
        }
    }
}

/// The built-in client's validation of a push, as Envoy words it: a cluster whose
/// connect_timeout is 0s fails proto validation and rejects the whole push; a cluster whose
/// endpoint address is no IP is rejected alone as it is added, the others applied.
pub fn validate(type_url: &str, resources: &[Vec<u8>]) -> Option<String> {
    if type_url != CDS {
        return None;
    }
    let mut each = Vec::new();
    for resource in resources {
        let fields = pb::fields(resource);
        let field = |n: u32| fields.iter().find(|f| f.0 == n).map(|f| f.2.clone());
        let name = String::from_utf8_lossy(&field(1).unwrap_or_default()).into_owned();
        let timeout = field(4).map(|d| pb::fields(&d));
        if !timeout.is_some_and(|d| d.iter().any(|(_, v, _)| *v > 0)) {
            return Some(format!(
                "name: \"{name}\"\nconnect_timeout {{\n}}\n: Proto constraint validation failed \
                 (ClusterValidationError.ConnectTimeout: value must be greater than 0s)"
            ));
        }
        let address = field(33).and_then(|la| endpoint_address(&la));
        if let Some(a) = address.filter(|a| a.parse::<std::net::IpAddr>().is_err()) {
            each.push(format!(
                "{name}: malformed IP address: {a}. Consider setting resolver_name or setting \
                 cluster type to 'STRICT_DNS' or 'LOGICAL_DNS'"
            ));
        }
    }
    (!each.is_empty()).then(|| format!("Error adding/updating cluster(s) {}", each.join(", ")))
}

/// The first endpoint's address in a load assignment.
fn endpoint_address(assignment: &[u8]) -> Option<String> {
    let mut b = assignment.to_vec();
    for field in [2, 2, 1, 1, 1, 2] {
        b = pb::fields(&b).into_iter().find(|f| f.0 == field)?.2;
    }
    Some(String::from_utf8_lossy(&b).into_owned())
}
