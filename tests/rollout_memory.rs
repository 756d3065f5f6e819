//! The rollout view's memory, measured by a counting allocator: 10,000 nodes each pushed 100
//! versions (1% of the answers NACKs, 1% never answered) stay within a stated bound, with the
//! default 10 versions kept per type and with all 100 kept. Its own test binary, so that the
//! allocator counts nothing else.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use xdstap::correlate::{Context, Event, Push, StreamContext, Verdict};
use xdstap::observe::rollout::{RolloutSettings, Rollouts};
use xdstap::xds::{Api, ErrorDetail, Node, CLUSTER};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const NODES: usize = 10_000;
const VERSIONS: usize = 100;
const MIB: f64 = 1024.0 * 1024.0;

/// Every push and answer of the fleet through a view keeping `kept` versions: (bytes the view
/// holds at the end, the most it held beyond the baseline on the way, the view's report size).
fn fleet(kept: usize) -> (usize, usize, usize) {
    let contexts: Vec<Context> = (0..NODES)
        .map(|i| Context {
            stream: Arc::new(StreamContext {
                stream_id: i as u64,
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
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
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
        });
        for (i, at) in contexts.iter().enumerate() {
            let at = Context {
                time: push.at,
                ..at.clone()
            };
            view.apply(&Event::Push {
                at: at.clone(),
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
                },
                _ => Verdict::Ack,
            };
            view.apply(&Event::Verdict {
                at,
                push: push.clone(),
                verdict,
                decided_at: push.at + (i as u64 % 1000) * 1_000_000,
                client_version: Some("v0".into()),
                overtaken_by: None,
                waiting_for: vec![],
            });
        }
    }
    let held = LIVE.load(Ordering::Relaxed) - base;
    let peak = PEAK.load(Ordering::Relaxed) - base;
    let report = view.report(VERSIONS as u64 * s, None, &[]);
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
