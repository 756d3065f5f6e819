//! The rollout view fed by the correlator's own events.

use super::*;
use crate::correlate::{Correlator, StreamContext};
use crate::xds::{Api, ErrorDetail, Node, Request, ResourceRef, Response, CLUSTER, ENDPOINTS};

const S: u64 = 1_000_000_000;

fn req(node: Option<&str>, version: &str, nonce: &str, error: Option<&str>) -> Request {
    Request {
        node: node.map(|id| Node {
            id: id.into(),
            ..Default::default()
        }),
        type_url: CLUSTER.into(),
        version_info: version.into(),
        response_nonce: nonce.into(),
        error_detail: error.map(|m| ErrorDetail {
            code: 13,
            message: m.into(),
        }),
        ..Default::default()
    }
}

fn resp(type_url: &str, version: &str, nonce: &str, names: &[&str]) -> Response {
    Response {
        type_url: type_url.into(),
        version_info: version.into(),
        nonce: nonce.into(),
        resources: (names.iter())
            .map(|n| ResourceRef {
                name: n.to_string(),
                version: None,
                digest: n.len() as u64 + version.len() as u64,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// One node's ADS stream, feeding `view`.
struct Client<'a> {
    view: &'a Rollouts,
    c: Correlator,
}

impl<'a> Client<'a> {
    fn connect(view: &'a Rollouts, id: &str, stream: u64, has: &str, now: u64) -> Self {
        let mut c = Correlator::new(
            Api::Sotw,
            StreamContext {
                seq: stream,
                ..Default::default()
            },
        );
        let mut out = Vec::new();
        c.on_request(req(Some(id), has, "", None), now, &mut out);
        let mut me = Client { view, c };
        me.feed(out);
        me
    }

    fn feed(&mut self, events: Vec<Event>) {
        for e in &events {
            self.view.apply(e);
        }
    }

    fn push(&mut self, version: &str, nonce: &str, names: &[&str], now: u64) {
        let mut out = Vec::new();
        (self.c).on_response(resp(CLUSTER, version, nonce, names), now, &mut out);
        self.feed(out);
    }

    fn answer(&mut self, version: &str, nonce: &str, error: Option<&str>, now: u64) {
        let mut out = Vec::new();
        self.c
            .on_request(req(None, version, nonce, error), now, &mut out);
        self.feed(out);
    }

    fn end(&mut self, now: u64) {
        let mut out = Vec::new();
        self.c
            .on_stream_end(Some(14), "control plane gone", now, &mut out);
        self.feed(out);
    }
}

fn one(view: &Rollouts, now: u64, version: &str) -> v1::Rollout {
    let ask = v1::RolloutsRequest {
        version: version.into(),
        every_node: true,
        ..Default::default()
    };
    let mut r = view.report(now, &ask).rollouts;
    assert_eq!(r.len(), 1, "{r:?}");
    r.remove(0)
}

#[test]
fn who_acked_who_nacked_and_who_was_never_pushed() {
    let view = Rollouts::new(RolloutSettings::default());
    let mut a = Client::connect(&view, "a", 1, "", 0);
    let mut b = Client::connect(&view, "b", 2, "", 0);
    let mut c = Client::connect(&view, "c", 3, "", 0);
    let _never = Client::connect(&view, "never", 4, "", 0);
    for (k, n) in [&mut a, &mut b, &mut c].into_iter().enumerate() {
        n.push("v1", "1", &["x"], S + k as u64 * S);
        n.answer("v1", "1", None, 2 * S + k as u64 * S);
    }
    a.push("v2", "2", &["x", "bad"], 10 * S);
    b.push("v2", "2", &["x", "bad"], 10 * S);
    c.push("v2", "2", &["x", "bad"], 10 * S);
    a.answer("v2", "2", None, 11 * S);
    let envoy = "Proto constraint validation failed: bad: value must be greater than 0s";
    b.answer(
        "v1",
        "2",
        Some(&format!("{envoy} goo.gle/debugonly")),
        12 * S,
    );
    let r = one(&view, 13 * S, "v2");
    assert_eq!(
        (
            r.pushed,
            r.acked,
            r.nacked,
            r.pending,
            r.superseded,
            r.unanswered
        ),
        (3, 1, 1, 1, 0, 0)
    );
    assert_eq!(r.acked_nodes, ["a"]);
    // The NACK first, then the pending node; `never` was not pushed v2 and is nowhere.
    let behind: Vec<(&str, &str, Option<&str>)> = (r.behind.iter())
        .map(|n| (n.node.as_str(), n.state().label(), n.running.as_deref()))
        .collect();
    assert_eq!(
        behind,
        [("b", "nacked", Some("v1")), ("c", "pending", Some("v1"))]
    );
    assert_eq!(r.behind[1].waiting_seconds, 3.0);
    c.answer(
        "v1",
        "2",
        Some(&format!("{envoy}  goo.gle/debugproto")),
        14 * S,
    );
    let r = one(&view, 15 * S, "v2");
    assert_eq!(r.nacks.len(), 1, "one message, two spellings of its marker");
    assert_eq!(r.nacks[0].nodes, 2);
    assert_eq!(r.nacks[0].examples, ["b", "c"]);
    assert_eq!(r.nacks[0].suspects, ["bad"]);
    assert_eq!(r.latency_max_ms, 4000.0);
    assert_eq!(r.latency_p50_ms, 2000.0);
    let v1 = one(&view, 15 * S, "v1");
    assert_eq!((v1.pushed, v1.acked), (3, 3));
    let of_type = |t: &str| v1::RolloutsRequest {
        types: vec![t.into()],
        ..Default::default()
    };
    assert_eq!(view.report(15 * S, &of_type("LDS")).rollouts.len(), 0);
    assert_eq!(view.report(15 * S, &of_type("cds")).rollouts.len(), 2);
    // Every node, acked ones too, with its answer's latency and its NACK group.
    let nodes: Vec<(&str, &str, Option<f64>, u32)> = (r.nodes.iter())
        .map(|n| {
            (
                n.node.as_str(),
                n.state().label(),
                n.latency_ms,
                n.nack_group,
            )
        })
        .collect();
    assert_eq!(
        nodes,
        [
            ("a", "acked", Some(1000.0), 0),
            ("b", "nacked", Some(2000.0), 1),
            ("c", "nacked", Some(4000.0), 1)
        ]
    );
    assert_eq!(r.moved_on, 0);
    // a answered 1 s after v2 went out: one node running v2 at 1 s.
    let curve: Vec<(f64, u64)> = r.acceptance.iter().map(|p| (p.seconds, p.nodes)).collect();
    assert_eq!(curve, [(1.0, 1)]);
    // b takes v3: done with v2, which c still has not left.
    b.push("v3", "3", &["x"], 16 * S);
    b.answer("v3", "3", None, 17 * S);
    let r = one(&view, 18 * S, "v2");
    assert_eq!((r.nacked, r.moved_on), (2, 1));
    assert!(view.report(18 * S, &Default::default()).rollouts[0]
        .nodes
        .is_empty());
}

#[test]
fn unanswered_then_pushed_again_on_a_new_stream() {
    let view = Rollouts::new(RolloutSettings::default());
    let mut a = Client::connect(&view, "a", 1, "", 0);
    a.push("v1", "1", &["x"], S);
    a.push("v2", "2", &["y"], 2 * S);
    a.end(3 * S);
    let v1 = one(&view, 3 * S, "v1");
    let v2 = one(&view, 3 * S, "v2");
    assert_eq!((v1.superseded, v2.unanswered), (1, 1));
    // The control plane restarts; the client says it has nothing, gets v2 again and takes it.
    let mut a = Client::connect(&view, "a", 2, "", 4 * S);
    a.push("v2", "x", &["y"], 5 * S);
    assert_eq!(one(&view, 5 * S, "v2").pending, 1);
    a.answer("v2", "x", None, 6 * S);
    let v2 = one(&view, 6 * S, "v2");
    assert_eq!((v2.acked, v2.unanswered, v2.pending), (1, 0, 0));
    // A reconnect stating v2 keeps it acked even when v2 is pushed again.
    a.end(7 * S);
    let mut a = Client::connect(&view, "a", 3, "v2", 8 * S);
    a.push("v2", "y", &["y"], 9 * S);
    assert_eq!(one(&view, 9 * S, "v2").acked, 1);
}

#[test]
fn a_pending_cds_push_names_the_clusters_it_warms() {
    let view = Rollouts::new(RolloutSettings::default());
    // A client that runs clusters (v0 here) holds its CDS answer while new ones warm.
    let mut a = Client::connect(&view, "a", 1, "", 0);
    a.push("v0", "0", &["old"], 0);
    a.answer("v0", "0", None, 0);
    let mut cds = resp(CLUSTER, "v1", "1", &[]);
    cds.resources.push_parts("web", None, 1);
    cds.resources.mark_eds(None);
    let mut out = Vec::new();
    a.c.on_response(cds, S, &mut out);
    a.feed(out);
    let r = one(&view, 2 * S, "v1");
    assert_eq!(r.behind[0].waiting_for, ["web"]);
    let mut out = Vec::new();
    a.c.on_response(resp(ENDPOINTS, "e1", "e", &["web"]), 3 * S, &mut out);
    a.feed(out);
    assert!(one(&view, 3 * S, "v1").behind[0].waiting_for.is_empty());
}

#[test]
fn versions_are_bounded_and_their_strings_go_with_them() {
    let view = Rollouts::new(RolloutSettings {
        versions: 3,
        ..Default::default()
    });
    let mut clients: Vec<Client<'_>> = (0..4)
        .map(|i| Client::connect(&view, &format!("n{i}"), i, "", 0))
        .collect();
    for v in 0..10u64 {
        for c in &mut clients {
            let (version, nonce) = (format!("v{v}"), v.to_string());
            c.push(&version, &nonce, &["x"], v * S);
            c.answer(&version, &nonce, None, v * S + 1);
        }
    }
    let versions: Vec<String> = (view
        .report(10 * S, &Default::default())
        .rollouts
        .into_iter())
    .map(|r| r.version)
    .collect();
    assert_eq!(versions, ["v9", "v8", "v7"]);
    let book = view.lock();
    // Four node ids, one type URL, and the versions still held (kept or running).
    assert!(book.strings.len() <= 4 + 1 + 3, "{:?}", book.strings);
}
