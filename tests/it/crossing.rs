//! A push that crosses the client's RST_STREAM on the wire: the client resets its per-type
//! stream (SotW and Delta) while the control plane, not yet aware of it, sends its response;
//! the tap sees the reset first, forwards the response as the wire allows, and records the
//! push as pushed and unanswered, the stream's end named, in its events and its event log.
//! The control plane here is a raw HTTP/2 peer, so that its response goes out after the reset
//! has passed the tap, every time.

use crate::support;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_that_crosses_the_clients_reset_is_recorded_as_unanswered() {
    for delta in [false, true] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(crossing_upstream(listener, delta));
        let dir = support::TempDir::new("crossing");
        let log = dir.path().join("events.jsonl");
        let log_flag = log.display().to_string();
        let flags = [
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &upstream,
            "--admin",
            "off",
            "--event-log",
            &log_flag,
        ];
        let tap = support::tap::XdsTap::with_flags(&flags).await;
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
        let lines = std::fs::read_to_string(&log).unwrap();
        let line = (lines.lines())
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|l| l["nonce"] == "n1")
            .unwrap_or_else(|| panic!("no line for the push: {lines}"));
        assert_eq!(line["verdict"], "unanswered", "{line}");
        assert_eq!(line["node"], "crossing-node", "{line}");
    }
}
