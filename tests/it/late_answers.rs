//! Every answer belongs to its own push, with a real Envoy over SotW. The scripted control
//! plane writes two CDS pushes back to back, before it reads any request, so the second goes
//! out before the first is answered (the tap's own events show it: the first's verdict is
//! overtaken by the second); Envoy answers each in turn. Bad then good: the first gets a NACK
//! span with Envoy's text, the second an ACK. Good then bad: ACK (late) then NACK, and the
//! status shows the type NACKED running the first's version, as Envoy's own config says. A
//! control plane that reuses a nonce: verdicts and status follow Envoy, the reuse is counted.
//! A stream cancelled, and a tap stopped, with pushes pending: each push an `unanswered` span.
//! Every verdict is checked against the control plane's record of the answers.

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use support::envoy::{Envoy, Xds};
use support::otlp::{Received, Receiver};
use support::resources::{static_cluster, CDS, LDS};
use support::scripted::{response, Scripted};
use support::tap::XdsTap;
use xdstap::api::v1::{StatusReport, SyncState, TypeStatus};
use xdstap::correlate::{Event, Verdict};
use xdstap::outputs::spans::{Protocol, SpanSettings};

const REJECTED: &str = "ClusterValidationError.ConnectTimeout: value must be greater than 0s";

/// A CDS push of clusters `a` (valid, its timeout marking the version) and `b`, whose timeout
/// of 0 makes Envoy reject the push when `bad`.
fn push(version: &str, nonce: &str, bad: bool) -> DiscoveryResponse {
    let stamp: i64 = version.bytes().map(i64::from).sum::<i64>() % 900 + 100;
    let b = if bad { 0 } else { 1000 };
    response(
        CDS,
        version,
        nonce,
        vec![static_cluster("a", stamp, 9), static_cluster("b", b, 9)],
    )
}

struct Setup {
    cp: Scripted,
    tap: XdsTap,
    envoy: Envoy,
    receiver: Receiver,
    _server: tokio::task::JoinHandle<()>,
}

/// Envoy -> tap (spans to an OTLP receiver) -> scripted control plane, Envoy on v0.
async fn setup(grace: Duration) -> Setup {
    let (cp, tap, receiver, server) = tap_to_scripted(grace).await;
    let envoy = Envoy::start("late-1", Xds::Tcp(tap.tap.addr.clone()), false).await;
    verdict_of(&tap, "n0").await;
    Setup {
        cp,
        tap,
        envoy,
        receiver,
        _server: server,
    }
}

/// The tap (spans to an OTLP receiver, open streams given `grace` at shutdown) in front of a
/// scripted control plane that answers the first CDS request with v0.
async fn tap_to_scripted(
    grace: Duration,
) -> (Scripted, XdsTap, Receiver, tokio::task::JoinHandle<()>) {
    let receiver = Receiver::grpc().await;
    let cp = Scripted::default();
    cp.on_first(push("v0", "n0", false));
    cp.on_first(response(LDS, "v0", "l0", vec![]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let server = cp.serve(listener);
    let mut config = support::tap::config("127.0.0.1:0", &upstream);
    config.proxy.shutdown_grace = grace;
    config.spans = Some(SpanSettings {
        endpoint: Some(receiver.endpoint.clone()),
        protocol: Protocol::Grpc,
        interval: Duration::from_millis(100),
        ..Default::default()
    });
    let tap = XdsTap::with_config(config, vec![]).await;
    (cp, tap, receiver, server)
}

/// The verdict of the push with `nonce` (the first such push not yet taken, for reused nonces),
/// waiting for it: (verdict, client version, overtaken by).
async fn verdict_of(tap: &XdsTap, nonce: &str) -> (Verdict, Option<String>, Option<String>) {
    verdicts_of(tap, nonce, 1).await.remove(0)
}

async fn verdicts_of(
    tap: &XdsTap,
    nonce: &str,
    n: usize,
) -> Vec<(Verdict, Option<String>, Option<String>)> {
    support::eventually(20, &format!("{n} verdict(s) for nonce {nonce}"), || {
        let found: Vec<_> = tap
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Verdict {
                    push,
                    verdict,
                    client_version,
                    overtaken_by,
                    ..
                } if push.nonce == nonce => Some((verdict, client_version, overtaken_by)),
                _ => None,
            })
            .collect();
        (found.len() >= n).then_some(found)
    })
    .await
}

/// The control plane's record of the answers naming `nonce`, waiting for `n` of them.
async fn recorded(cp: &Scripted, nonce: &str, n: usize) -> Vec<Option<String>> {
    support::eventually(
        10,
        &format!("the control plane to record {n} answer(s) to {nonce}"),
        || {
            let a = cp.answers_to(nonce);
            (a.len() >= n).then(|| a.into_iter().map(|a| a.error).collect())
        },
    )
    .await
}

/// Checks the tap's verdict against the control plane's record of Envoy's answer.
fn same_as_recorded(verdict: &Verdict, answer: &Option<String>) {
    match (verdict, answer) {
        (Verdict::Ack, None) => {}
        (Verdict::Nack { error, .. }, Some(message)) => {
            assert_eq!(
                &error.message, message,
                "the tap passes Envoy's text on as is"
            );
            assert!(message.contains(REJECTED), "{message}");
        }
        other => panic!("the tap says {:?}, Envoy answered {:?}", other.0, other.1),
    }
}

/// Envoy's own CDS version, from its admin (`cluster_manager.cds.version_text`).
async fn envoy_cds_version(envoy: &Envoy) -> String {
    let text = envoy
        .get("/stats?filter=cluster_manager.cds.version_text")
        .await;
    text.lines()
        .find_map(|l| l.strip_prefix("cluster_manager.cds.version_text: "))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("no CDS version_text in {text:?}"))
}

async fn report(admin: &str) -> StatusReport {
    support::status(admin).await
}

fn cds(r: &StatusReport) -> TypeStatus {
    r.nodes[0]
        .types
        .iter()
        .find(|t| t.r#type == "CDS")
        .unwrap()
        .clone()
}

/// CDS as `/status` shows it once it has caught up with `version` (the board is a sink of the
/// same queue the test reads verdicts from).
async fn cds_at(admin: &str, version: &str) -> TypeStatus {
    for _ in 0..200 {
        let t = cds(&report(admin).await);
        if t.version_sent.as_deref() == Some(version) && t.pending_since.is_none() {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("status never caught up with {version}");
}

async fn span(receiver: &Receiver, nonce: &str) -> Received {
    support::eventually(20, &format!("the span of nonce {nonce}"), || {
        receiver
            .spans()
            .into_iter()
            .find(|s| s.text("xds.nonce").as_deref() == Some(nonce))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_pushes_each_get_their_own_answer() {
    let s = setup(Duration::from_secs(10)).await;
    let (mut bad_good, mut good_bad) = (0, 0);
    let mut round = 0;
    while (bad_good < 3 || good_bad < 3) && round < 20 {
        round += 1;
        // Bad then good.
        let (a, b) = (format!("bg{round}a"), format!("bg{round}b"));
        s.cp.send(vec![push(&a, &a, true), push(&b, &b, false)])
            .await;
        let (va, kept_a, over_a) = verdict_of(&s.tap, &a).await;
        let (vb, _, over_b) = verdict_of(&s.tap, &b).await;
        same_as_recorded(&va, &recorded(&s.cp, &a, 1).await[0]);
        same_as_recorded(&vb, &recorded(&s.cp, &b, 1).await[0]);
        assert!(matches!(va, Verdict::Nack { .. }), "{va:?}");
        assert_eq!(vb, Verdict::Ack);
        // Envoy rejects `a` and keeps what it ran: the last round's good-then-bad first push,
        // in the first round the version it started with.
        match round {
            1 => assert!(
                kept_a
                    .as_deref()
                    .is_some_and(|k| !k.starts_with("bg") && !k.starts_with("gb")),
                "{kept_a:?}"
            ),
            _ => assert_eq!(
                kept_a,
                Some(format!("gb{}a", round - 1)),
                "Envoy kept the last good push"
            ),
        }
        assert_eq!(over_b, None);
        if over_a.as_deref() == Some(b.as_str()) {
            bad_good += 1;
            let nack = span(&s.receiver, &a).await;
            assert_eq!(nack.text("xds.verdict").as_deref(), Some("nack"));
            assert_eq!(nack.text("xds.overtaken_by").as_deref(), Some(b.as_str()));
            let status = nack.span.status.clone().unwrap();
            assert_eq!(status.code, 2, "ERROR");
            assert!(status.message.contains(REJECTED), "{}", status.message);
            let ack = span(&s.receiver, &b).await;
            assert_eq!(ack.text("xds.verdict").as_deref(), Some("ack"));
        }

        // Good then bad.
        let (a, b) = (format!("gb{round}a"), format!("gb{round}b"));
        s.cp.send(vec![push(&a, &a, false), push(&b, &b, true)])
            .await;
        let (va, _, over_a) = verdict_of(&s.tap, &a).await;
        let (vb, kept_b, _) = verdict_of(&s.tap, &b).await;
        same_as_recorded(&va, &recorded(&s.cp, &a, 1).await[0]);
        same_as_recorded(&vb, &recorded(&s.cp, &b, 1).await[0]);
        assert_eq!(va, Verdict::Ack);
        assert!(matches!(vb, Verdict::Nack { .. }), "{vb:?}");
        assert_eq!(
            kept_b.as_deref(),
            Some(a.as_str()),
            "Envoy stays on the first"
        );
        if over_a.as_deref() == Some(b.as_str()) {
            good_bad += 1;
        }
        // The status names what Envoy runs: the first push's version, NACKED by the second.
        let envoy_runs = envoy_cds_version(&s.envoy).await;
        assert_eq!(envoy_runs, a);
        let t = cds_at(&s.tap.admin, &b).await;
        assert_eq!(t.state(), SyncState::Nacked);
        assert_eq!(t.version_accepted.as_deref(), Some(envoy_runs.as_str()));
        assert_eq!(t.nack.unwrap().version, b);
    }
    assert!(
        bad_good >= 3 && good_bad >= 3,
        "the second push went out before the first was answered too rarely: \
         bad-good {bad_good}, good-bad {good_bad} in {round} rounds"
    );
    drop(s.envoy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_nonce_pairs_answers_in_order_and_is_counted() {
    let s = setup(Duration::from_secs(10)).await;
    let (mut overtaken, mut reuses, mut round) = (0, 0, 0);
    let mut last = String::new();
    while overtaken < 2 && round < 20 {
        round += 1;
        // Two different pushes with one nonce, back to back: Envoy accepts the first and
        // rejects the second, naming the same nonce twice.
        let nonce = format!("same{round}");
        let (good, bad) = (format!("r{round}a"), format!("r{round}b"));
        s.cp.send(vec![push(&good, &nonce, false), push(&bad, &nonce, true)])
            .await;
        reuses += 1;
        let verdicts = verdicts_of(&s.tap, &nonce, 2).await;
        let answers = recorded(&s.cp, &nonce, 2).await;
        same_as_recorded(&verdicts[0].0, &answers[0]);
        same_as_recorded(&verdicts[1].0, &answers[1]);
        assert_eq!(verdicts[1].1.as_deref(), Some(good.as_str()));
        if verdicts[0].2.as_deref() == Some(nonce.as_str()) {
            overtaken += 1;
        }
        assert_eq!(envoy_cds_version(&s.envoy).await, good);
        let t = cds_at(&s.tap.admin, &bad).await;
        assert_eq!(t.state(), SyncState::Nacked);
        assert_eq!(t.version_accepted.as_deref(), Some(good.as_str()));
        assert_eq!(t.nonce_reuses, reuses);
        last = nonce;
    }
    assert!(overtaken >= 2, "never back to back in {round} rounds");

    // The nonce once more, after both were answered: its answer decides the new push.
    s.cp.send(vec![push("r-again", &last, false)]).await;
    reuses += 1;
    let verdicts = verdicts_of(&s.tap, &last, 3).await;
    same_as_recorded(&verdicts[2].0, &recorded(&s.cp, &last, 3).await[2]);
    assert_eq!(verdicts[2].0, Verdict::Ack);
    assert_eq!(envoy_cds_version(&s.envoy).await, "r-again");
    let t = cds_at(&s.tap.admin, "r-again").await;
    assert_eq!(t.state(), SyncState::Synced);
    assert_eq!(t.version_accepted.as_deref(), Some("r-again"));
    assert_eq!(t.nonce_reuses, reuses);
    assert_eq!(xdstap::proxy::counter(&s.tap.stats.nonce_reuses), reuses);
    let (_, metrics) = support::http_get(&s.tap.admin, "/metrics").await;
    assert!(
        metrics.contains(&format!("xdstap_nonce_reuses_total {reuses}")),
        "{metrics}"
    );
}

/// A raw gRPC client's ADS stream through the tap: subscribes to CDS as `node` and reads the
/// push, which it never answers.
async fn subscribed(tap: &str, node: &str) -> (h2::SendStream<bytes::Bytes>, h2::RecvStream) {
    let io = tokio::net::TcpStream::connect(tap).await.unwrap();
    let mut client = support::raw::client(io).await;
    let path = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
    let (resp, mut send) = client
        .send_request(support::raw::request(path), false)
        .unwrap();
    send.send_data(support::raw::subscribe(node), false)
        .unwrap();
    let mut body = resp.await.unwrap().into_body();
    let chunk = support::within(30, "the next DATA", body.data())
        .await
        .unwrap()
        .unwrap();
    let _ = body.flow_control().release_capacity(chunk.len());
    (send, body)
}

/// The span of `node`'s pending push, once received.
async fn unanswered_span(receiver: &Receiver, node: &str) -> Received {
    support::eventually(20, &format!("the span of {node}'s push"), || {
        receiver
            .spans()
            .into_iter()
            .find(|s| s.text("xds.node.id").as_deref() == Some(node))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_pending_at_a_cancel_or_a_shutdown_get_unanswered_spans() {
    let (_cp, tap, receiver, _server) = tap_to_scripted(Duration::from_millis(300)).await;
    // A client cancels its stream with a push pending.
    let (mut cancelled, _body) = subscribed(&tap.tap.addr, "cancels").await;
    cancelled.send_reset(h2::Reason::CANCEL);
    let span = unanswered_span(&receiver, "cancels").await;
    assert_eq!(span.text("xds.verdict").as_deref(), Some("unanswered"));
    let why = span.text("xds.end_message").unwrap();
    assert!(why.contains("reset by client (HTTP/2 CANCEL)"), "{why}");

    // A client holds its push unanswered while the tap stops: the grace period passes, the
    // stream is cut, and its push is decided before the spans are flushed.
    let (_held, _held_body) = subscribed(&tap.tap.addr, "outlives-the-tap").await;
    tap.close().await;
    let span = unanswered_span(&receiver, "outlives-the-tap").await;
    assert_eq!(span.text("xds.verdict").as_deref(), Some("unanswered"));
    let why = span.text("xds.end_message").unwrap();
    assert!(why.contains("the tap stopped"), "{why}");
}
