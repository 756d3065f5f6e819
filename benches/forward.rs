//! Forwarding throughput, direct versus through the tap: a control plane pushes 4 MiB
//! DiscoveryResponses on ADS streams, each push answered by the client (an ACK naming its nonce)
//! before the next goes out, as a real xDS exchange runs. One stream, and 32 streams on 32
//! connections (32 proxies behind one tap), moving at once.
//!
//! Three ways: `direct` (client to control plane, the limit), `tap` (the forwarder with no
//! observer) and `tap_decode` (the forwarder with the xDS decoder and correlator, the product).
//! Client, control plane and tap share this process and the machine's cores, so the tap's cost
//! shows up as lost throughput.
//!
//! Run: `cargo bench --bench forward`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use tokio::net::{TcpListener, TcpStream};
use xdstap::proxy::{Connector, Endpoint, Listener, NoObserver, Observe, Proxy, Settings};
use xdstap::server::{Pipeline, PipelineOptions};
use xdstap::xds::wire::bytes as field;

const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const CDS: &[u8] = b"type.googleapis.com/envoy.config.cluster.v3.Cluster";
const PUSH_SIZE: usize = 4 << 20;

/// A push split in two: the shared part (gRPC prefix, version, ~4 MiB of clusters) and the
/// per-push tail (type URL and a fixed-width nonce), so the server sends a fresh nonce each time
/// without copying 4 MiB.
struct PushTemplate {
    head: Bytes,
}

impl PushTemplate {
    fn new() -> Self {
        let mut body = Vec::with_capacity(PUSH_SIZE + 4096);
        field(&mut body, 1, b"bench-v1");
        let mut i = 0;
        while body.len() < PUSH_SIZE {
            let mut c = Vec::new();
            field(
                &mut c,
                1,
                format!("outbound|8080||service-{i}.bench.svc.cluster.local").as_bytes(),
            );
            field(&mut c, 33, &[0x5a; 1900]);
            let mut any = Vec::new();
            field(&mut any, 1, CDS);
            field(&mut any, 2, &c);
            field(&mut body, 2, &any);
            i += 1;
        }
        let total = body.len() + Self::tail(0).len();
        let mut head = Vec::with_capacity(5 + body.len());
        head.push(0);
        head.extend_from_slice(&(total as u32).to_be_bytes());
        head.extend_from_slice(&body);
        PushTemplate { head: head.into() }
    }

    fn tail(nonce: u64) -> Vec<u8> {
        let mut t = Vec::new();
        field(&mut t, 4, CDS);
        field(&mut t, 5, format!("{nonce:016}").as_bytes());
        t
    }

    fn wire_len(&self) -> usize {
        self.head.len() + Self::tail(0).len()
    }
}

/// The client's answer to push `nonce` (0: the first request).
fn request(nonce: u64) -> Bytes {
    let mut m = Vec::new();
    if nonce > 0 {
        field(&mut m, 1, b"bench-v1");
    }
    field(&mut m, 4, CDS);
    if nonce > 0 {
        field(&mut m, 5, format!("{nonce:016}").as_bytes());
    }
    let mut out = vec![0];
    out.extend_from_slice(&(m.len() as u32).to_be_bytes());
    out.extend_from_slice(&m);
    out.into()
}

/// The control plane: on every request message on a stream, one push.
async fn control_plane(listener: TcpListener, push: Arc<PushTemplate>) {
    loop {
        let (s, _) = listener.accept().await.unwrap();
        let _ = s.set_nodelay(true);
        let push = push.clone();
        tokio::spawn(async move {
            let Ok(mut conn) = h2::server::handshake(s).await else {
                return;
            };
            while let Some(Ok((req, mut respond))) = conn.accept().await {
                let push = push.clone();
                tokio::spawn(async move {
                    let mut body = req.into_body();
                    let resp = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(())
                        .unwrap();
                    let Ok(mut send) = respond.send_response(resp, false) else {
                        return;
                    };
                    let mut buf = BytesMut::new();
                    let mut nonce = 0u64;
                    while let Some(Ok(chunk)) = body.data().await {
                        let _ = body.flow_control().release_capacity(chunk.len());
                        buf.extend_from_slice(&chunk);
                        while buf.len() >= 5 {
                            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                            if buf.len() < 5 + len {
                                break;
                            }
                            buf.advance(5 + len);
                            nonce += 1;
                            if send.send_data(push.head.clone(), false).is_err()
                                || send
                                    .send_data(PushTemplate::tail(nonce).into(), false)
                                    .is_err()
                            {
                                return;
                            }
                        }
                    }
                });
            }
        });
    }
}

/// One ADS stream of a client: sends a request, reads a whole push, answers it, `rounds` times.
struct Stream {
    send: h2::SendStream<Bytes>,
    recv: h2::RecvStream,
    answered: u64,
}

impl Stream {
    async fn open(addr: &str) -> Stream {
        let io = TcpStream::connect(addr).await.unwrap();
        io.set_nodelay(true).unwrap();
        let (client, conn) = h2::client::Builder::new()
            .initial_window_size(16 << 20)
            .initial_connection_window_size(24 << 20)
            .handshake(io)
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut client = client.ready().await.unwrap();
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://xds{ADS}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (resp, send) = client.send_request(req, false).unwrap();
        let mut stream = Stream {
            send,
            recv: resp.await.unwrap().into_body(),
            answered: 0,
        };
        stream.send.send_data(request(0), false).unwrap();
        stream
    }

    /// Reads one push of `len` bytes and answers it.
    async fn round(&mut self, len: usize) {
        let mut got = 0;
        while got < len {
            let chunk = self.recv.data().await.unwrap().unwrap();
            let _ = self.recv.flow_control().release_capacity(chunk.len());
            got += chunk.len();
        }
        assert_eq!(got, len, "a push arrived whole and alone");
        self.answered += 1;
        self.send.send_data(request(self.answered), false).unwrap();
    }
}

async fn start_tap(upstream: &str, observer: Arc<dyn Observe>) -> String {
    let listener = Listener::bind(&Endpoint::Tcp("127.0.0.1:0".into()))
        .await
        .unwrap();
    let proxy = Proxy::new(
        listener,
        Connector::new(upstream.parse().unwrap(), None),
        Settings::default(),
        observer,
        Arc::default(),
    );
    let addr = proxy.local_addr();
    tokio::spawn(proxy.serve(std::future::pending()));
    addr
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let push = Arc::new(PushTemplate::new());
    let push_len = push.wire_len();
    let stats = Arc::new(xdstap::observer::ObserverStats::default());
    let (direct, tap, tap_decode, _pipeline) = rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let direct = listener.local_addr().unwrap().to_string();
        tokio::spawn(control_plane(listener, push.clone()));
        let tap = start_tap(&direct, Arc::new(NoObserver)).await;
        let options = PipelineOptions {
            queue_capacity: 16_384,
            decode_limit: xdstap::config::DEFAULT_DECODE_LIMIT,
            observe_backlog: xdstap::config::DEFAULT_OBSERVE_BACKLOG,
        };
        let pipeline = Pipeline::start(options, stats.clone(), Vec::new()).unwrap();
        let tap_decode = start_tap(&direct, pipeline.observer()).await;
        (direct, tap, tap_decode, pipeline)
    });

    for streams in [1usize, 32] {
        let mut g = c.benchmark_group(format!("forward_4MiB_pushes/{streams}_streams"));
        g.sampling_mode(SamplingMode::Flat)
            .sample_size(10)
            .warm_up_time(Duration::from_secs(2))
            .measurement_time(Duration::from_secs(if streams == 1 { 6 } else { 15 }))
            .throughput(Throughput::Bytes((push_len * streams) as u64));
        for (name, addr) in [
            ("direct", &direct),
            ("tap", &tap),
            ("tap_decode", &tap_decode),
        ] {
            g.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let mut opened = Vec::new();
                        for _ in 0..streams {
                            opened.push(Stream::open(addr).await);
                        }
                        // The first push answers the opening request; not timed.
                        for s in opened.iter_mut() {
                            s.round(push_len).await;
                        }
                        let start = Instant::now();
                        let mut tasks = tokio::task::JoinSet::new();
                        for mut s in opened {
                            tasks.spawn(async move {
                                for _ in 0..iters {
                                    s.round(push_len).await;
                                }
                                s
                            });
                        }
                        let mut done = Vec::new();
                        while let Some(s) = tasks.join_next().await {
                            done.push(s.unwrap());
                        }
                        let elapsed = start.elapsed();
                        drop(done);
                        elapsed
                    })
                })
            });
        }
        g.finish();
    }
    let decoded = xdstap::proxy::counter(&stats.decoded);
    assert!(
        decoded > 0,
        "the decoding tap decoded the pushes and answers it forwarded"
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
