//! Byte integrity under load: 2,000 ADS streams (200 connections x 10) through one tap, for a
//! bounded time (XDSTAP_LOAD_SECS, 15 s by default; 60 s for the figure), pushes of
//! random size sent in random DATA-frame splits and answered with ACKs or (1 in 10) NACKs, also
//! split at random; each client's last answer says it is the last (resource name `__last__`),
//! and the control plane then ends the call. Every message's digest is compared on both ends: nothing altered, nothing
//! lost; and the tap's verdict counts equal what the clients answered.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use support::tap::{TapOptions, XdsTap};
use tokio::net::{TcpListener, TcpStream};
use xdstap::correlate::{Event, Verdict};
use xdstap::xds::wire;

const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const CDS: &[u8] = b"type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// xorshift64*: reproducible per stream, no extra crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn digest(b: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(b)
}

fn framed(m: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(m.len() as u32).to_be_bytes());
    out.extend_from_slice(m);
    out
}

/// Sends `data` in DATA frames of random sizes.
fn send_split(send: &mut h2::SendStream<Bytes>, rng: &mut Rng, data: Vec<u8>, eos: bool) -> bool {
    let mut data = Bytes::from(data);
    while !data.is_empty() {
        let n = (1 + rng.below(4096) as usize).min(data.len());
        let piece = data.split_to(n);
        let last = data.is_empty();
        if send.send_data(piece, eos && last).is_err() {
            return false;
        }
    }
    true
}

/// Pulls whole gRPC messages out of `buf`.
fn messages(buf: &mut BytesMut) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while buf.len() >= 5 {
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if buf.len() < 5 + len {
            break;
        }
        buf.advance(5);
        out.push(buf.split_to(len).to_vec());
    }
    out
}

type Digests = Arc<Mutex<HashMap<String, Vec<u64>>>>;

fn record(d: &Digests, key: &str, v: u64) {
    d.lock()
        .unwrap()
        .entry(key.to_string())
        .or_default()
        .push(v);
}

/// The control plane: answers every request with a push of random size in random splits,
/// except the last request of a stream (sent with END_STREAM), which gets the trailers.
async fn control_plane(listener: TcpListener, sent: Digests, received: Digests) {
    loop {
        let Ok((s, _)) = listener.accept().await else {
            return;
        };
        let (sent, received) = (sent.clone(), received.clone());
        tokio::spawn(async move {
            let Ok(mut conn) = h2::server::handshake(s).await else {
                return;
            };
            while let Some(Ok((req, mut respond))) = conn.accept().await {
                let key = req.headers()["x-stream-key"].to_str().unwrap().to_string();
                let (sent, received) = (sent.clone(), received.clone());
                tokio::spawn(async move {
                    let mut rng = Rng(digest(key.as_bytes()) | 1);
                    let mut body = req.into_body();
                    let head = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(())
                        .unwrap();
                    let Ok(mut send) = respond.send_response(head, false) else {
                        return;
                    };
                    let mut buf = BytesMut::new();
                    let mut n = 0u64;
                    while let Some(Ok(chunk)) =
                        support::within(30, "the next DATA", body.data()).await
                    {
                        let _ = body.flow_control().release_capacity(chunk.len());
                        buf.extend_from_slice(&chunk);
                        for m in messages(&mut buf) {
                            record(&received, &key, digest(&m));
                            // The client marks its last answer (HTTP/2 need not deliver its
                            // END_STREAM with the last bytes).
                            if wire::fields(&m)
                                .iter()
                                .any(|f| f.0 == 3 && f.2 == b"__last__")
                            {
                                continue;
                            }
                            n += 1;
                            let mut push = Vec::new();
                            wire::bytes(&mut push, 1, format!("v{n}").as_bytes());
                            for i in 0..(1 + rng.below(8)) {
                                let mut c = Vec::new();
                                wire::bytes(&mut c, 1, format!("c{i}").as_bytes());
                                wire::bytes(&mut c, 33, &vec![n as u8; rng.below(4096) as usize]);
                                let mut any = Vec::new();
                                wire::bytes(&mut any, 1, CDS);
                                wire::bytes(&mut any, 2, &c);
                                wire::bytes(&mut push, 2, &any);
                            }
                            wire::bytes(&mut push, 4, CDS);
                            wire::bytes(&mut push, 5, format!("{key}-{n}").as_bytes());
                            record(&sent, &key, digest(&push));
                            if !send_split(&mut send, &mut rng, framed(&push), false) {
                                return;
                            }
                        }
                    }
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", "0".parse().unwrap());
                    let _ = send.send_trailers(trailers);
                });
            }
        });
    }
}

#[derive(Default)]
struct Answers {
    acks: AtomicU64,
    nacks: AtomicU64,
}

/// One client stream: subscribe, then answer every push until the deadline; the last answer
/// half-closes the stream.
async fn client_stream(
    client: h2::client::SendRequest<Bytes>,
    key: String,
    deadline: Instant,
    received: Digests,
    sent: Digests,
    answers: Arc<Answers>,
) {
    let mut rng = Rng(digest(format!("client-{key}").as_bytes()) | 1);
    let mut client = client.ready().await.unwrap();
    let mut req = support::raw::request(ADS);
    req.headers_mut()
        .insert("x-stream-key", key.parse().unwrap());
    let (resp, mut send) = client.send_request(req, false).unwrap();
    let mut first = Vec::new();
    let mut node = Vec::new();
    wire::bytes(&mut node, 1, format!("node-{key}").as_bytes());
    wire::bytes(&mut first, 2, &node);
    wire::bytes(&mut first, 4, CDS);
    record(&sent, &key, digest(&first));
    assert!(send_split(&mut send, &mut rng, framed(&first), false));
    let mut body = resp.await.unwrap().into_body();
    let mut buf = BytesMut::new();
    let mut accepted = String::new();
    let mut rounds = 0u32;
    'read: while let Some(chunk) = support::within(30, "the next DATA", body.data()).await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        for m in messages(&mut buf) {
            record(&received, &key, digest(&m));
            let fields = wire::fields(&m);
            let text = |n: u32| {
                fields
                    .iter()
                    .find(|f| f.0 == n)
                    .map(|f| String::from_utf8(f.2.clone()).unwrap())
                    .unwrap()
            };
            let (version, nonce) = (text(1), text(5));
            let mut answer = Vec::new();
            if rng.below(10) == 0 {
                wire::bytes(&mut answer, 1, accepted.as_bytes());
                wire::bytes(&mut answer, 4, CDS);
                wire::bytes(&mut answer, 5, nonce.as_bytes());
                let mut status = Vec::new();
                wire::uint(&mut status, 1, 3);
                wire::bytes(&mut status, 2, b"rejected c0 at random");
                wire::bytes(&mut answer, 6, &status);
                answers.nacks.fetch_add(1, Ordering::Relaxed);
            } else {
                accepted = version.clone();
                wire::bytes(&mut answer, 1, version.as_bytes());
                wire::bytes(&mut answer, 4, CDS);
                wire::bytes(&mut answer, 5, nonce.as_bytes());
                answers.acks.fetch_add(1, Ordering::Relaxed);
            }
            rounds += 1;
            let last = Instant::now() >= deadline || rounds >= 100_000;
            if last {
                wire::bytes(&mut answer, 3, b"__last__");
            }
            record(&sent, &key, digest(&answer));
            assert!(send_split(&mut send, &mut rng, framed(&answer), last));
            if last {
                break 'read;
            }
        }
    }
    // Read to the end: the control plane's trailers.
    while let Some(chunk) = support::within(30, "the next DATA", body.data()).await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
    }
    assert!(buf.is_empty(), "no push after the last answer");
    let trailers = support::within(30, "the trailers", body.trailers())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(trailers["grpc-status"], "0");
}

/// Counts verdicts as the tap reports them (the recorder keeps only the last ones).
#[derive(Clone, Default)]
struct Count(Arc<Mutex<HashMap<&'static str, u64>>>);

impl xdstap::queue::Sink for Count {
    fn on_event(&mut self, event: &Event) {
        if let Event::Verdict { verdict, .. } = event {
            *self.0.lock().unwrap().entry(verdict.name()).or_default() += 1;
            if let Verdict::Nack { error, .. } = verdict {
                assert_eq!(error.message, "rejected c0 at random");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_streams_lose_and_alter_nothing() {
    let secs: u64 = std::env::var("XDSTAP_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15)
        .min(120);
    let (cp_sent, cp_received, cl_sent, cl_received): (Digests, Digests, Digests, Digests) =
        Default::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    tokio::spawn(control_plane(
        listener,
        cp_sent.clone(),
        cp_received.clone(),
    ));
    let count = Count::default();
    let tap = XdsTap::with_sinks(TapOptions::new(&upstream), vec![Box::new(count.clone())]).await;

    let answers = Arc::new(Answers::default());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..200 {
        let io = TcpStream::connect(&tap.tap.addr).await.unwrap();
        let client = support::raw::client(io).await;
        for s in 0..10 {
            tasks.spawn(client_stream(
                client.clone(),
                format!("{c}-{s}"),
                deadline,
                cl_received.clone(),
                cl_sent.clone(),
                answers.clone(),
            ));
        }
    }
    let finished = tokio::time::timeout(Duration::from_secs(secs + 120), async {
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    })
    .await;
    assert!(finished.is_ok(), "every stream finished");

    // Nothing altered, nothing lost, in order, both ways.
    let (pushes, requests) = {
        let (cp_sent, cl_received) = (cp_sent.lock().unwrap(), cl_received.lock().unwrap());
        let (cl_sent, cp_received) = (cl_sent.lock().unwrap(), cp_received.lock().unwrap());
        assert_eq!(cl_received.len(), 2000);
        let mut pushes = 0;
        let mut requests = 0;
        for (key, sent) in cp_sent.iter() {
            assert_eq!(Some(sent), cl_received.get(key), "pushes on stream {key}");
            pushes += sent.len();
        }
        for (key, sent) in cl_sent.iter() {
            assert_eq!(Some(sent), cp_received.get(key), "requests on stream {key}");
            requests += sent.len();
        }
        (pushes, requests)
    };
    // The tap's verdicts are the clients' answers.
    let acks = answers.acks.load(Ordering::Relaxed);
    let nacks = answers.nacks.load(Ordering::Relaxed);
    support::eventually(20, "every verdict delivered", || {
        let c = count.0.lock().unwrap();
        (c.get("ack").copied().unwrap_or(0) + c.get("nack").copied().unwrap_or(0) >= acks + nacks)
            .then_some(())
    })
    .await;
    let c = count.0.lock().unwrap().clone();
    println!(
        "{secs} s, 2,000 streams: {pushes} pushes and {requests} requests compared by digest, \
         0 altered, 0 lost; verdicts {c:?} = {acks} acks + {nacks} nacks answered"
    );
    assert_eq!(c.get("ack").copied().unwrap_or(0), acks);
    assert_eq!(c.get("nack").copied().unwrap_or(0), nacks);
    assert_eq!(c.get("superseded"), None);
    assert_eq!(c.get("unanswered"), None);
    assert_eq!(xdstap::proxy::counter(&tap.stats.dropped_events), 0);
}
