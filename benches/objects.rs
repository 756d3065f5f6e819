//! What following objects costs at fleet scale: 1,000 SotW streams each pushed the same
//! 2,000-cluster CDS (v1) and then a push that changes one DestinationRule's cluster (v2), every
//! cluster carrying the metadata istiod writes, against the same pushes with as many filler
//! bytes in its place (a control plane that writes none). Each push is decoded as the tap
//! decodes it (the scanner, with the fleet's interner), correlated, and folded into the status
//! board. Measured, by a counting allocator and the clock:
//! - per push (v2, after v1): decode + correlate + board, microseconds, with and without metadata;
//! - memory per stream once both pushes are answered (correlator, board, the fleet's shared
//!   sets), and what the objects cost beyond the filler, per object;
//! - the object view when asked: one object with every node it reaches (what `wait --object`
//!   polls), and the listing of every object (what the page shows).
//!
//! Run: `cargo bench --bench objects`. Under `cargo test` it runs a small smoke version.

use std::sync::Arc;
use std::time::Instant;

use xdstap::correlate::{Correlator, StreamContext};
use xdstap::views::board::{StatusBoard, StatusSettings};
use xdstap::xds::scan::{MessageKind, Scanner};
use xdstap::xds::{Api, Interner, Message, Node, Request, CLUSTER};
use xdstap_support::alloc::{live, Counting};
use xdstap_support::cds::push;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// `wire` decoded as the tap decodes a response: in 16 KiB pieces, with the fleet's interner.
fn decode(wire: &[u8], interner: &Arc<Interner>) -> xdstap::xds::Response {
    let mut s = Scanner::new(MessageKind::Response(Api::Sotw), Some(wire.len() as u64));
    s.set_interner(interner.clone());
    for piece in wire.chunks(16 << 10) {
        s.feed(piece);
    }
    match s.finish() {
        Ok(Message::Response(r)) => r,
        other => panic!("a response: {other:?}"),
    }
}

fn ack(version: &str) -> Request {
    Request {
        type_url: CLUSTER.into(),
        version_info: version.into(),
        response_nonce: version.into(),
        ..Default::default()
    }
}

/// What one configuration measured.
struct Measured {
    /// v2's push, decoded, correlated and folded, per stream, microseconds.
    push_us: f64,
    /// Bytes held per stream once both pushes are answered.
    per_stream: f64,
    /// Bytes held in all.
    held: usize,
    /// One object with every node it reaches, milliseconds (median of 9).
    one_ms: f64,
    /// Every object, counted, milliseconds (median of 5).
    listing_ms: f64,
    objects: usize,
}

fn run(streams: usize, clusters: usize, metadata: bool) -> Measured {
    let v1 = push(clusters, "v1", "v1", metadata, false);
    let v2 = push(clusters, "v2", "v2", metadata, true);
    let base = live();
    let interner = Arc::new(Interner::default());
    let board = StatusBoard::new(StatusSettings::default());
    let mut streams_: Vec<Correlator> = (0..streams)
        .map(|i| {
            let ctx = StreamContext {
                seq: i as u64 + 1,
                api: Some(Api::Sotw),
                ..Default::default()
            };
            Correlator::new(Api::Sotw, ctx).with_interner(interner.clone())
        })
        .collect();
    let s = 1_000_000_000u64;
    let mut events = Vec::new();
    for (i, c) in streams_.iter_mut().enumerate() {
        let subscribe = Request {
            node: Some(Node {
                id: format!(
                    "sidecar~10.0.{}.{}~app-{i}.default~default.svc.cluster.local",
                    i / 256,
                    i % 256
                ),
                cluster: "app".into(),
                user_agent: "envoy 1.40.0".into(),
            }),
            type_url: CLUSTER.into(),
            ..Default::default()
        };
        c.on_request(subscribe, s, &mut events);
        c.on_response(decode(&v1, &interner), s, &mut events);
        c.on_request(ack("v1"), s, &mut events);
        for e in events.drain(..) {
            board.apply(&e);
        }
    }
    let started = Instant::now();
    for c in streams_.iter_mut() {
        c.on_response(decode(&v2, &interner), 3 * s, &mut events);
        c.on_request(ack("v2"), 3 * s, &mut events);
        for e in events.drain(..) {
            board.apply(&e);
        }
    }
    let push_us = started.elapsed().as_secs_f64() * 1e6 / streams as f64;
    let held = live().saturating_sub(base);
    let (mut one, mut listing) = (Vec::new(), Vec::new());
    let spec: xdstap::ObjectSpec = "destinationrule/namespace-0/service-0".parse().unwrap();
    let mut objects = 0;
    for k in 0..9 {
        let t = Instant::now();
        let r = board.objects(4 * s, std::slice::from_ref(&spec), Some(2 * s));
        one.push(t.elapsed().as_secs_f64() * 1e3);
        if metadata {
            assert_eq!(r.objects[0].taken as usize, streams, "every node took v2");
        }
        if k < 5 {
            let t = Instant::now();
            let all = board.objects(4 * s, &[], None);
            listing.push(t.elapsed().as_secs_f64() * 1e3);
            objects = all.objects.len();
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    drop(streams_);
    Measured {
        push_us,
        per_stream: held as f64 / streams as f64,
        held,
        one_ms: median(&mut one),
        listing_ms: median(&mut listing),
        objects,
    }
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (streams, clusters) = match bench {
        true => (1000, 2000),
        false => (20, 200),
    };
    println!("{streams} streams x {clusters} clusters, v1 then v2 (one DestinationRule's cluster changed)");
    // Alternating, three rounds each way: this machine's noise shows in the spread.
    let rounds = if bench { 3 } else { 1 };
    for round in 1..=rounds {
        for metadata in [false, true] {
            let m = run(streams, clusters, metadata);
            let what = if metadata {
                "istiod metadata"
            } else {
                "filler bytes  "
            };
            println!(
                "round {round} {what}: push {:7.1} us/stream   held {:6.1} KiB/stream ({:.1} MiB)   \
                 one object {:6.2} ms   every object ({}) {:7.2} ms",
                m.push_us,
                m.per_stream / 1024.0,
                m.held as f64 / (1024.0 * 1024.0),
                m.one_ms,
                m.objects,
                m.listing_ms
            );
        }
    }
}
