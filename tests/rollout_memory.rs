//! Memory at fleet scale, measured by a counting allocator. The rollout view: 10,000 nodes each
//! pushed 100 versions (1% of the answers NACKs, 1% never answered) stay within a stated bound,
//! with the default 10 versions kept per type and with all 100 kept. The correlators and the
//! status board: 500 streams each pushed the same 2,000-cluster CDS and then a push every one
//! of them NACKs in part hold a few KiB per node, the push once for all. Nodes that have gone:
//! 10,000 hold at most 2 KiB each. Its own test binary, so that the allocator counts nothing
//! else; the measurements take turns.

use std::sync::Arc;

use xdstap_support::alloc::{live, peak, reset_peak, Counting};

use xdstap::correlate::{Context, Correlator, Event, Push, StreamContext, Verdict};
use xdstap::views::board::{StatusBoard, StatusSettings};
use xdstap::views::rollout::{RolloutSettings, Rollouts};
use xdstap::xds::{Api, ErrorDetail, Interner, Node, Request, Resources, Response, CLUSTER};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One measurement at a time: the allocator counts the whole process.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

const NODES: usize = 10_000;
const VERSIONS: usize = 100;
const MIB: f64 = 1024.0 * 1024.0;

/// Every push and answer of the fleet through a view keeping `kept` versions: (bytes the view
/// holds at the end, the most it held beyond the baseline on the way, the view's report size).
fn fleet(kept: usize) -> (usize, usize, usize) {
    let contexts: Vec<Context> = (0..NODES)
        .map(|i| Context {
            stream: Arc::new(StreamContext {
                seq: i as u64,
                api: Some(Api::Sotw),
                ..Default::default()
            }),
            node: Some(Arc::new(Node {
                id: format!(
                    "sidecar~10.0.{}.{}~reviews-v1-{i:05}.default~default.svc.cluster.local",
                    i / 256,
                    i % 256
                ),
                ..Default::default()
            })),
            type_url: CLUSTER.into(),
            time: 0,
        })
        .collect();
    let base = live();
    reset_peak();
    let view = Rollouts::new(RolloutSettings {
        versions: kept,
        ..Default::default()
    });
    let s = 1_000_000_000u64;
    for v in 0..VERSIONS {
        let push = Arc::new(Push {
            type_url: CLUSTER.into(),
            version: format!("2026-12-01T10:{:02}:00Z/{v}", v % 60),
            nonce: v.to_string(),
            at: v as u64 * s,
            resources: Default::default(),
            removed: vec![],
            bytes: 0,
            control_plane: None,
            resource_errors: vec![],
            resent_rejected: 0,
            objects_changed: None,
        });
        for (i, context) in contexts.iter().enumerate() {
            let context = Context {
                time: push.at,
                ..context.clone()
            };
            view.apply(&Event::Push {
                context: context.clone(),
                push: push.clone(),
            });
            if i % 100 == 7 {
                continue; // never answered
            }
            let verdict = match i % 100 {
                3 => Verdict::Nack {
                    error: ErrorDetail {
                        code: 13,
                        message: format!("cluster b{}: value must be greater than 0s", i % 3),
                    },
                    suspects: vec!["b".into()],
                    changed: vec!["b".into()],
                    scope: xdstap::correlate::Scope::Unknown,
                    rejected: vec![],
                    applied: vec![],
                    objects: vec![],
                },
                _ => Verdict::Ack,
            };
            view.apply(&Event::Verdict {
                context,
                push: push.clone(),
                verdict,
                decided_at: push.at + (i as u64 % 1000) * 1_000_000,
                client_version: Some("v0".into()),
                overtaken_by: None,
                waiting_for: vec![],
            });
        }
    }
    let held = live() - base;
    let peak = peak() - base;
    let report = view.report(VERSIONS as u64 * s, &Default::default());
    let newest = &report.rollouts[0];
    assert_eq!(report.rollouts.len(), kept);
    assert_eq!(newest.pushed, NODES as u64, "counts stay exact");
    assert_eq!(newest.nacked, NODES as u64 / 100);
    assert_eq!(newest.pending, NODES as u64 / 100);
    assert_eq!(newest.acked, NODES as u64 * 98 / 100);
    assert_eq!(newest.nacks.len(), 3, "grouped by message");
    assert!(newest.behind.len() <= 20, "lists are capped");
    let listed = serde_json::to_vec(&report).unwrap().len();
    drop(view);
    (held, peak, listed)
}

#[test]
fn ten_thousand_nodes_times_a_hundred_versions() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    // The default of 10 versions kept, then every version.
    for (kept, bound_mib) in [(10, 16), (VERSIONS, 128)] {
        let (held, peak, report) = fleet(kept);
        println!(
            "rollout view, {NODES} nodes x {VERSIONS} versions, {kept} kept: holds {:.1} MiB \
             (peak {:.1} MiB), report {:.0} KiB",
            held as f64 / MIB,
            peak as f64 / MIB,
            report as f64 / 1024.0
        );
        assert!(
            peak < bound_mib << 20,
            "{kept} versions kept: peak {peak} B, bound {bound_mib} MiB"
        );
    }
}

/// A push of `clusters` Istio-like clusters as the scanner gives it to one stream: its own
/// decoded copy, `bad` changed (version 2).
fn cds(version: &str, nonce: &str, clusters: usize, bad: bool) -> Response {
    let mut resources = Resources::default();
    for i in 0..clusters {
        let name = format!("outbound|8080||svc-{i}.ns-{}.svc.cluster.local", i % 50);
        resources.push_parts(&name, None, i as u64);
    }
    if bad {
        resources.push_parts("bad", None, 7);
    }
    Response {
        type_url: CLUSTER.into(),
        version_info: version.into(),
        nonce: nonce.into(),
        resources,
        ..Default::default()
    }
}

#[test]
fn a_fleet_nacking_the_same_push_in_part_holds_it_once() {
    const STREAMS: usize = 500;
    const CLUSTERS: usize = 2_000;
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let base = live();
    let interner = Arc::new(Interner::default());
    let board = StatusBoard::new(StatusSettings::default());
    let message = "Error adding/updating cluster(s) bad: malformed IP address: not-an-ip";
    let mut streams = Vec::new();
    let mut events = Vec::new();
    for i in 0..STREAMS {
        let context = StreamContext {
            seq: i as u64,
            api: Some(Api::Sotw),
            ..Default::default()
        };
        let mut c = Correlator::new(Api::Sotw, context).with_interner(interner.clone());
        let request = |version: &str, nonce: &str, error: Option<&str>| Request {
            node: (nonce.is_empty()).then(|| Node {
                id: format!(
                    "sidecar~10.0.{}.{}~reviews-{i:05}.default",
                    i / 256,
                    i % 256
                ),
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
        };
        c.on_request(request("", "", None), 1, &mut events);
        c.on_response(cds("1", "n1", CLUSTERS, false), 2, &mut events);
        c.on_request(request("1", "n1", None), 3, &mut events);
        c.on_response(cds("2", "n2", CLUSTERS, true), 4, &mut events);
        c.on_request(request("1", "n2", Some(message)), 5, &mut events);
        for e in events.drain(..) {
            board.apply(&e);
        }
        streams.push(c);
    }
    let held = live() - base;
    let per_node = held / STREAMS;
    println!(
        "{STREAMS} streams x {CLUSTERS} clusters, NACKed in part: correlators and board hold \
         {:.1} MiB, {:.1} KiB per node",
        held as f64 / MIB,
        per_node as f64 / 1024.0
    );
    // What every node runs, as CSDS reads it: v2 but for `bad`, which never ran.
    let nodes = board.resources(|_| true);
    assert_eq!(nodes.len(), STREAMS);
    let one = &nodes[0].resources;
    assert_eq!(one.len(), CLUSTERS + 1);
    assert!((one.iter()).all(|r| (r.name == "bad") == r.version.is_empty()));
    assert!(per_node < 16 << 10, "{per_node} B per node");
    drop((streams, board));
}

/// Nodes that have gone cost little: 10,000 streams, each a node of its own, each pushed the
/// same 100-cluster CDS, answering it, and ending, as the tap with its admin address on keeps
/// them (status board, rollout view, the correlators' ledger): at most 2 KiB per node, 20 MB
/// for the 10,000.
#[test]
fn ten_thousand_disconnected_nodes_hold_little() {
    const GONE: usize = 10_000;
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let interner = Arc::new(Interner::default());
    let ledger = Arc::new(xdstap::correlate::Ledger::default());
    let board = StatusBoard::new(StatusSettings::default());
    let view = Rollouts::new(RolloutSettings::default());
    let push = cds("1", "n1", 100, false);
    let base = live();
    let mut events = Vec::new();
    for i in 0..GONE {
        let context = StreamContext {
            seq: i as u64,
            api: Some(Api::Sotw),
            service: "envoy.service.discovery.v3.AggregatedDiscoveryService".into(),
            method: "StreamAggregatedResources".into(),
            downstream: format!("10.0.{}.{}:{}", i / 256, i % 256, 40000 + i % 1000),
            upstream: "istiod.istio-system.svc:15010".into(),
        };
        let mut c = Correlator::new(Api::Sotw, context)
            .with_interner(interner.clone())
            .with_ledger(ledger.clone());
        let request = |version: &str, nonce: &str| Request {
            node: nonce.is_empty().then(|| Node {
                id: format!(
                    "sidecar~10.0.{}.{}~reviews-{i:05}.default~default.svc.cluster.local",
                    i / 256,
                    i % 256
                ),
                cluster: "reviews.default".into(),
                user_agent: "envoy 1.40.0".into(),
            }),
            type_url: CLUSTER.into(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        };
        c.on_request(request("", ""), 1, &mut events);
        c.on_response(push.clone(), 2, &mut events);
        c.on_request(request("1", "n1"), 3, &mut events);
        c.on_stream_end(Some(14), "gone", 4, &mut events);
        for e in events.drain(..) {
            board.apply(&e);
            xdstap::queue::Sink::on_event(&mut view.clone(), &e);
        }
    }
    let held = live() - base;
    let per_node = held / GONE;
    println!(
        "{GONE} disconnected nodes: board, rollout view and ledger hold {:.1} MiB, {per_node} B \
         per node",
        held as f64 / MIB
    );
    assert_eq!(board.report(5, None).nodes.len(), GONE);
    assert!(per_node <= 2048, "{per_node} B per node");
    drop((board, view, ledger));
}
