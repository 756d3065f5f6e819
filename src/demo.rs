//! `xdstap demo`: the whole story in one process. An embedded SotW ADS control plane and a
//! built-in xDS client (a stand-in for Envoy that validates clusters the way Envoy does for the
//! demo's one rejected case: `connect_timeout` must be greater than 0s) talk through the real tap
//! on loopback. The driver plays the script; what is printed comes from the tap's own events.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::correlate::{Event, Verdict};
use crate::proxy::{Connector, Endpoint, Listener, Proxy, Settings};
use crate::tap::Pipeline;
use crate::xds::short_type;

const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const NODE: &str = "demo-client~127.0.0.1~builtin.demo~demo.svc.cluster.local";

/// Minimal protobuf writing, for the demo's own messages.
mod pb {
    pub fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    pub fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
        varint(out, ((field as u64) << 3) | 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }
    pub fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
        varint(out, (field as u64) << 3);
        varint(out, v);
    }
    /// (field, wire type, varint value or bytes) of each top-level field.
    pub fn fields(mut b: &[u8]) -> Vec<(u32, u64, Vec<u8>)> {
        let mut out = Vec::new();
        let read = |b: &mut &[u8]| -> Option<u64> {
            let mut v = 0u64;
            for shift in (0..64).step_by(7) {
                let (&x, rest) = b.split_first()?;
                *b = rest;
                v |= ((x & 0x7f) as u64) << shift;
                if x & 0x80 == 0 {
                    return Some(v);
                }
            }
            None
        };
        while !b.is_empty() {
            let Some(tag) = read(&mut b) else { break };
            match tag & 7 {
                0 => out.push(((tag >> 3) as u32, read(&mut b).unwrap_or(0), vec![])),
                2 => {
                    let n = read(&mut b).unwrap_or(0) as usize;
                    let n = n.min(b.len());
                    out.push(((tag >> 3) as u32, 0, b[..n].to_vec()));
                    b = &b[n..];
                }
                1 => b = &b[8.min(b.len())..],
                5 => b = &b[4.min(b.len())..],
                _ => break,
            }
        }
        out
    }
}

/// An EDS-less cluster (STATIC type 0) with a connect timeout; name field 1, connect_timeout 4.
fn cluster(name: &str, timeout_ms: u64) -> Vec<u8> {
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
    c
}

fn listener(name: &str) -> Vec<u8> {
    let mut l = Vec::new();
    pb::bytes(&mut l, 1, name.as_bytes());
    l
}

fn any(type_url: &str, value: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    pb::bytes(&mut a, 1, type_url.as_bytes());
    pb::bytes(&mut a, 2, value);
    a
}

fn response(type_url: &str, version: &str, nonce: &str, resources: &[Vec<u8>]) -> Vec<u8> {
    let mut m = Vec::new();
    pb::bytes(&mut m, 1, version.as_bytes());
    for r in resources {
        pb::bytes(&mut m, 2, &any(type_url, r));
    }
    pb::bytes(&mut m, 4, type_url.as_bytes());
    pb::bytes(&mut m, 5, nonce.as_bytes());
    m
}

fn request(type_url: &str, version: &str, nonce: &str, node: bool, error: Option<&str>) -> Vec<u8> {
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
struct Pipe {
    send: SendStream<Bytes>,
    recv: RecvStream,
    buf: BytesMut,
}

impl Pipe {
    fn send(&mut self, msg: &[u8]) -> anyhow::Result<()> {
        self.send
            .send_data(Bytes::from(crate::grpc::encode(msg)), false)?;
        Ok(())
    }
    async fn recv(&mut self) -> anyhow::Result<Vec<u8>> {
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

/// The built-in client's validation: what Envoy says of a cluster whose connect_timeout is 0s.
fn validate(type_url: &str, resource: &[u8]) -> Option<String> {
    if type_url != CDS {
        return None;
    }
    let fields = pb::fields(resource);
    let name = fields
        .iter()
        .find(|f| f.0 == 1)
        .map(|f| String::from_utf8_lossy(&f.2).into_owned())?;
    let timeout = fields.iter().find(|f| f.0 == 4).map(|f| pb::fields(&f.2));
    let positive = timeout.is_some_and(|d| d.iter().any(|(_, v, _)| *v > 0));
    (!positive).then(|| {
        format!(
            "Error adding/updating cluster(s) {name}: Proto constraint validation failed \
             (ClusterValidationError.ConnectTimeout: value must be greater than 0s)"
        )
    })
}

/// A response as the built-in client read it, with its validation result.
struct Received {
    type_url: String,
    version: String,
    nonce: String,
    error: Option<String>,
}

/// The built-in client reads and validates one response.
async fn client_read(pipe: &mut Pipe) -> anyhow::Result<Received> {
    let msg = pipe.recv().await?;
    let fields = pb::fields(&msg);
    let get = |n: u32| {
        fields
            .iter()
            .find(|f| f.0 == n)
            .map(|f| String::from_utf8_lossy(&f.2).into_owned())
            .unwrap_or_default()
    };
    let type_url = get(4);
    let error = fields
        .iter()
        .filter(|f| f.0 == 2)
        .filter_map(|f| {
            pb::fields(&f.2)
                .into_iter()
                .find(|a| a.0 == 2)
                .and_then(|v| validate(&type_url, &v.2))
        })
        .next();
    Ok(Received {
        version: get(1),
        nonce: get(5),
        type_url,
        error,
    })
}

/// The built-in client answers like Envoy: ACK with the pushed version, or NACK keeping the last
/// accepted one.
fn client_reply(
    pipe: &mut Pipe,
    r: &Received,
    accepted: &mut std::collections::HashMap<String, String>,
) -> anyhow::Result<()> {
    match &r.error {
        None => {
            accepted.insert(r.type_url.clone(), r.version.clone());
            pipe.send(&request(&r.type_url, &r.version, &r.nonce, false, None))
        }
        Some(e) => {
            let kept = accepted.get(&r.type_url).cloned().unwrap_or_default();
            pipe.send(&request(&r.type_url, &kept, &r.nonce, false, Some(e)))
        }
    }
}

async fn client_answer(
    pipe: &mut Pipe,
    accepted: &mut std::collections::HashMap<String, String>,
) -> anyhow::Result<()> {
    let r = client_read(pipe).await?;
    client_reply(pipe, &r, accepted)
}

/// Options of `xdstap demo`.
#[derive(Debug, Clone, Default)]
pub struct DemoOptions {
    /// One JSON object per line instead of the timeline.
    pub json: bool,
    /// Colour in the timeline.
    pub color: bool,
}

struct Printer {
    json: bool,
    color: bool,
    start: u64,
    seen: usize,
}

impl Printer {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    fn say(&self, s: &str) {
        if !self.json {
            println!("{s}");
        }
    }

    /// Prints events not yet printed.
    fn events(&mut self, events: &[Event]) {
        for e in &events[self.seen..] {
            if self.json {
                println!("{}", serde_json::to_string(e).unwrap_or_default());
                continue;
            }
            let at = e.context();
            let t = format!("+{:7.3}s", at.time.saturating_sub(self.start) as f64 / 1e9);
            let ty = short_type(&at.type_url);
            let line = match e {
                Event::Subscribe { .. } => format!("{t}  {ty:4} subscribe"),
                Event::Resubscribe { version, .. } => format!("{t}  {ty:4} resubscribe after reconnect, client has {version}"),
                Event::SubscriptionChange { names, .. } => format!("{t}  {ty:4} subscription change: {}", names.join(",")),
                Event::Push { push, .. } => format!(
                    "{t}  {ty:4} push {} ({} resources: {}) nonce {}",
                    push.version,
                    push.resources.len(),
                    push.resources.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(","),
                    push.nonce
                ),
                Event::Verdict { push, verdict, decided_at, client_version, .. } => {
                    let ms = decided_at.saturating_sub(push.at) as f64 / 1e6;
                    match verdict {
                        Verdict::Ack => self.paint("32", &format!("{t}  {ty:4} ACK  {} ({ms:.1} ms)", push.version)),
                        Verdict::Nack { error, suspects, changed } => self.paint(
                            "31;1",
                            &format!(
                                "{t}  {ty:4} NACK {} ({ms:.1} ms): client stays on {}\n             error: {}\n             suspects: {}   changed since last ACK: {}",
                                push.version,
                                client_version.as_deref().unwrap_or("?"),
                                error.message,
                                suspects.join(","),
                                changed.join(",")
                            ),
                        ),
                        Verdict::Superseded { by_nonce } => self.paint("33", &format!("{t}  {ty:4} superseded {} by nonce {by_nonce}", push.version)),
                        Verdict::Unanswered { grpc_status, message } => self.paint(
                            "33",
                            &format!("{t}  {ty:4} unanswered {} (stream ended: grpc-status {grpc_status:?}, {message})", push.version),
                        ),
                    }
                }
                Event::StaleAnswer { nonce, pending_nonce, .. } => {
                    self.paint("33", &format!("{t}  {ty:4} stale answer to nonce {nonce} while {pending_nonce} is pending (not an ACK of it)"))
                }
                Event::StreamEnd { .. } => continue,
            };
            println!("{line}");
        }
        self.seen = events.len();
    }
}

/// What the demo found, for `--json` and the exit status.
#[derive(Debug, Default, serde::Serialize)]
pub struct Outcome {
    /// Whether every step played as expected.
    pub ok: bool,
    /// Step name and verdicts observed.
    pub steps: Vec<(String, Vec<String>)>,
    /// Suspects of the NACK in step 2.
    pub suspects: Vec<String>,
    /// The NACK message.
    pub nack_message: String,
}

async fn wait_for(
    pipeline: &Pipeline,
    printer: &mut Printer,
    mut done: impl FnMut(&[Event]) -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let events = pipeline.recorder.events();
        printer.events(&events);
        if done(&events) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("the tap did not report the expected events in 10 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn verdicts_since(events: &[Event], from: usize) -> Vec<String> {
    events[from.min(events.len())..]
        .iter()
        .filter_map(|e| match e {
            Event::Verdict {
                at, push, verdict, ..
            } => Some(format!(
                "{} {} {}",
                short_type(&at.type_url),
                push.version,
                verdict.name()
            )),
            Event::StaleAnswer { at, .. } => {
                Some(format!("{} stale-answer", short_type(&at.type_url)))
            }
            Event::Resubscribe { at, version, .. } => Some(format!(
                "{} resubscribe {version}",
                short_type(&at.type_url)
            )),
            _ => None,
        })
        .collect()
}

/// Control plane side: accepts h2 connections on `listener`, hands streams to the driver.
fn serve_control_plane(listener: TcpListener) -> mpsc::Receiver<Pipe> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((io, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(io).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let mut head = http::Response::new(());
                    head.headers_mut().insert(
                        "content-type",
                        http::HeaderValue::from_static("application/grpc"),
                    );
                    let Ok(send) = respond.send_response(head, false) else {
                        continue;
                    };
                    let _ = tx
                        .send(Pipe {
                            send,
                            recv: req.into_body(),
                            buf: BytesMut::new(),
                        })
                        .await;
                }
            });
        }
    });
    rx
}

async fn client_stream(tap: &str) -> anyhow::Result<Pipe> {
    let io = tokio::net::TcpStream::connect(tap).await?;
    let (client, conn) = h2::client::handshake(io).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await?;
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{tap}{ADS}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let (resp, send) = client.send_request(req, false)?;
    // Response headers come when the control plane accepts the stream.
    let send_side = send;
    let resp = tokio::spawn(resp);
    let recv = resp.await??.into_body();
    Ok(Pipe {
        send: send_side,
        recv,
        buf: BytesMut::new(),
    })
}

/// Plays the story; prints the timeline (or JSON) and returns the outcome.
pub async fn run(options: DemoOptions) -> anyhow::Result<Outcome> {
    let pipeline = Pipeline::start(
        crate::tap::PipelineOptions {
            queue_capacity: 4096,
            recorded_events: 10_000,
            ..Default::default()
        },
        vec![],
    );
    let cp_listener = TcpListener::bind("127.0.0.1:0").await?;
    let cp_addr = cp_listener.local_addr()?.to_string();
    let mut streams = serve_control_plane(cp_listener);
    let tap_listener = Listener::bind(&Endpoint::Tcp("127.0.0.1:0".into()), None).await?;
    let proxy = Proxy::new(
        tap_listener,
        Connector::new(Endpoint::Tcp(cp_addr.clone()), None),
        Settings::default(),
        pipeline.tap.clone(),
    );
    let tap_addr = proxy.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let proxy_task = tokio::spawn(proxy.serve(async {
        let _ = stop_rx.await;
    }));
    let mut printer = Printer {
        json: options.json,
        color: options.color,
        start: crate::tap::now(),
        seen: 0,
    };
    let mut outcome = Outcome::default();
    printer.say(&format!(
        "xdstap demo: built-in xDS client (a stand-in for Envoy) -> tap {tap_addr} -> embedded control plane {cp_addr}\n"
    ));

    let mut client = client_stream(&tap_addr).await?;
    let mut accepted = std::collections::HashMap::new();
    let mut nonce = 0u32;
    let mut next_nonce = || {
        nonce += 1;
        format!("{nonce}")
    };

    // Step 1: initial config -> ACK on every type.
    printer.say("1. Initial config: CDS and LDS at v1");
    let mark = 0;
    client.send(&request(CDS, "", "", true, None))?;
    client.send(&request(LDS, "", "", false, None))?;
    let mut cp = streams
        .recv()
        .await
        .ok_or_else(|| anyhow::anyhow!("control plane got no stream"))?;
    cp.recv().await?;
    cp.recv().await?;
    cp.send(&response(
        CDS,
        "v1",
        &next_nonce(),
        &[cluster("a", 1000), cluster("b", 1000)],
    ))?;
    cp.send(&response(LDS, "v1", &next_nonce(), &[listener("http")]))?;
    client_answer(&mut client, &mut accepted).await?;
    client_answer(&mut client, &mut accepted).await?;
    wait_for(&pipeline, &mut printer, |e| {
        verdicts_since(e, mark).len() >= 2
    })
    .await?;
    let v = verdicts_since(&pipeline.recorder.events(), mark);
    let ok1 = v.contains(&"CDS v1 ack".into()) && v.contains(&"LDS v1 ack".into());
    outcome.steps.push(("initial".into(), v));

    // Step 2: a harmless change to `a` with an invalid `b` -> the whole CDS response is NACKed.
    printer.say("\n2. v2 changes cluster a (timeout 1s -> 2s) and, in the same push, breaks cluster b (timeout 0s)");
    let mark = pipeline.recorder.events().len();
    cp.send(&response(
        CDS,
        "v2",
        &next_nonce(),
        &[cluster("a", 2000), cluster("b", 0)],
    ))?;
    client_answer(&mut client, &mut accepted).await?;
    wait_for(&pipeline, &mut printer, |e| {
        !verdicts_since(e, mark).is_empty()
    })
    .await?;
    let events = pipeline.recorder.events();
    let nack = events[mark..].iter().find_map(|e| match e {
        Event::Verdict {
            verdict:
                Verdict::Nack {
                    error,
                    suspects,
                    changed,
                },
            client_version,
            ..
        } => Some((
            error.clone(),
            suspects.clone(),
            changed.clone(),
            client_version.clone(),
        )),
        _ => None,
    });
    let ok2 = match &nack {
        Some((error, suspects, changed, kept)) => {
            outcome.suspects = suspects.clone();
            outcome.nack_message = error.message.clone();
            printer.say(&format!(
                "   -> the client rejected the whole push and stays on {}; suspect: {}. The harmless change to {} never landed.",
                kept.as_deref().unwrap_or("?"),
                suspects.join(","),
                changed.iter().filter(|c| !suspects.contains(c)).cloned().collect::<Vec<_>>().join(",")
            ));
            suspects == &vec!["b".to_string()] && kept.as_deref() == Some("v1")
        }
        None => false,
    };
    outcome
        .steps
        .push(("bad push".into(), verdicts_since(&events, mark)));

    // Step 3: the fix -> ACK.
    printer.say("\n3. v3 fixes cluster b");
    let mark = pipeline.recorder.events().len();
    cp.send(&response(
        CDS,
        "v3",
        &next_nonce(),
        &[cluster("a", 2000), cluster("b", 1000)],
    ))?;
    client_answer(&mut client, &mut accepted).await?;
    wait_for(&pipeline, &mut printer, |e| {
        !verdicts_since(e, mark).is_empty()
    })
    .await?;
    let v = verdicts_since(&pipeline.recorder.events(), mark);
    let ok3 = v == vec!["CDS v3 ack".to_string()];
    outcome.steps.push(("fix".into(), v));

    // Step 4a: two pushes back to back; the client answers the first after the second went out.
    printer.say("\n4. v4 and v5 pushed back to back, then a control-plane restart");
    let mark = pipeline.recorder.events().len();
    cp.send(&response(
        CDS,
        "v4",
        &next_nonce(),
        &[cluster("a", 3000), cluster("b", 1000)],
    ))?;
    cp.send(&response(
        CDS,
        "v5",
        &next_nonce(),
        &[cluster("a", 4000), cluster("b", 1000)],
    ))?;
    // Like Envoy in SotW: both arrive before the first is answered.
    let first = client_read(&mut client).await?;
    let second = client_read(&mut client).await?;
    client_reply(&mut client, &first, &mut accepted)?;
    client_reply(&mut client, &second, &mut accepted)?;
    wait_for(&pipeline, &mut printer, |e| {
        verdicts_since(e, mark).len() >= 3
    })
    .await?;
    let v = verdicts_since(&pipeline.recorder.events(), mark);
    let ok4 = v
        == vec![
            "CDS v4 superseded".to_string(),
            "CDS stale-answer".into(),
            "CDS v5 ack".into(),
        ];
    outcome.steps.push(("back to back".into(), v));

    // Step 4b: the control plane goes away mid-push and comes back; the client resubscribes.
    let mark = pipeline.recorder.events().len();
    cp.send(&response(
        LDS,
        "v6",
        &next_nonce(),
        &[listener("http"), listener("https")],
    ))?;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("14"));
    trailers.insert(
        "grpc-message",
        http::HeaderValue::from_static("control plane restarting"),
    );
    wait_for(&pipeline, &mut printer, |e| {
        e[mark..].iter().any(|x| matches!(x, Event::Push { .. }))
    })
    .await?;
    cp.send.send_trailers(trailers)?;
    let _ = client.recv().await?; // the LDS push, left unanswered
    let _ = client.recv().await; // the stream's end
    drop(cp);
    drop(client);
    let mut client = client_stream(&tap_addr).await?;
    client.send(&request(CDS, &accepted[CDS], "", true, None))?;
    let mut cp = streams
        .recv()
        .await
        .ok_or_else(|| anyhow::anyhow!("control plane got no stream"))?;
    cp.recv().await?;
    cp.send(&response(
        CDS,
        "v6",
        &next_nonce(),
        &[cluster("a", 4000), cluster("b", 1000)],
    ))?;
    client_answer(&mut client, &mut accepted).await?;
    wait_for(&pipeline, &mut printer, |e| {
        verdicts_since(e, mark).iter().any(|v| v == "CDS v6 ack")
    })
    .await?;
    let v = verdicts_since(&pipeline.recorder.events(), mark);
    let ok5 = v.contains(&"LDS v6 unanswered".to_string())
        && v.contains(&"CDS resubscribe v5".to_string())
        && v.contains(&"CDS v6 ack".to_string());
    outcome.steps.push(("restart".into(), v));

    outcome.ok = ok1 && ok2 && ok3 && ok4 && ok5;
    drop(client);
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), proxy_task).await;
    if options.json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "summary": &outcome }))?
        );
    } else {
        println!("\nWhat happened:");
        println!("  v1 was accepted everywhere; v2 was rejected as a whole because cluster b is invalid,");
        println!("  so the harmless change to cluster a never landed until v3; v4 was superseded by v5 and");
        println!("  the client's late answer to v4 was not taken as acceptance of v5; when the control plane");
        println!("  restarted, the pending LDS push was left unanswered and the client resubscribed stating v5.");
        println!(
            "\nStory played as expected: {}",
            if outcome.ok { "yes" } else { "NO" }
        );
    }
    Ok(outcome)
}
