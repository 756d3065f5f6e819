//! Framer + streaming decoder + correlator on a realistic SotW CDS push: 2,000 clusters
//! (about 1 MiB), fed in 16 KiB DATA frames as the forwarder hands them over, then its ACK;
//! once as the first stream to get it, once as every further stream of a fleet gets it (the
//! tap's interner has seen its resources: `fleet_repeat`). The same again with every cluster
//! carrying the metadata istiod writes (`istio.config`, `istio.services`) in place of as many
//! filler bytes (`..._istio_metadata`): what reading it costs over bytes merely skipped, which is
//! all a decoder that does not read it pays. Run: `cargo bench --bench decode`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use xdstap::correlate::{Correlator, StreamContext};
use xdstap::grpc::{encode, Deframed, Deframer};
use xdstap::xds::scan::{MessageKind, Scanner};
use xdstap::xds::wire::bytes as field;
use xdstap::xds::{Api, Interner, Message};

use std::sync::Arc;

fn push(metadata: bool) -> Vec<u8> {
    let version = "2026-11-29T12:00:00Z/1042";
    let nonce = "1042-5f1d1c6e-8a3b-4c3e-9d0a-7b1f0e6c2a11";
    encode(&xdstap_support::cds::push(
        2000, version, nonce, metadata, false,
    ))
}

fn ack() -> Vec<u8> {
    let mut m = Vec::new();
    field(&mut m, 1, b"2026-11-29T12:00:00Z/1042");
    field(
        &mut m,
        4,
        b"type.googleapis.com/envoy.config.cluster.v3.Cluster",
    );
    field(&mut m, 5, b"1042-5f1d1c6e-8a3b-4c3e-9d0a-7b1f0e6c2a11");
    encode(&m)
}

fn run(
    wire: &[u8],
    kind: MessageKind,
    interner: Option<&Arc<Interner>>,
    correlator: &mut Correlator,
    out: &mut Vec<xdstap::correlate::Event>,
) {
    let mut deframer = Deframer::new();
    let mut scanner = None;
    for frame in wire.chunks(16 * 1024) {
        deframer
            .feed(frame, &mut |e| match e {
                Deframed::Start { len, .. } => {
                    let mut s = Scanner::new(kind, Some(len as u64));
                    if let Some(i) = interner {
                        s.set_interner(i.clone());
                    }
                    scanner = Some(s);
                }
                Deframed::Body(b) => scanner.as_mut().unwrap().feed(b),
                Deframed::End => match scanner.take().unwrap().finish().unwrap() {
                    Message::Response(r) => correlator.on_response(r, 1, out),
                    Message::Request(r) => correlator.on_request(r, 2, out),
                },
            })
            .unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let ack = ack();
    let mut g = c.benchmark_group("decode");
    for (suffix, metadata) in [("", false), ("_istio_metadata", true)] {
        let push = push(metadata);
        assert_eq!(
            push.len(),
            self::push(false).len(),
            "the same size either way"
        );
        g.throughput(Throughput::Bytes((push.len() + ack.len()) as u64));
        cold_and_repeat(&mut g, suffix, &push, &ack);
    }
    g.finish();
}

fn cold_and_repeat(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    suffix: &str,
    push: &[u8],
    ack: &[u8],
) {
    g.bench_function(format!("cds_push_2000_clusters_and_ack{suffix}"), |b| {
        b.iter(|| {
            let mut correlator = Correlator::new(Api::Sotw, StreamContext::default());
            let mut out = Vec::new();
            run(
                push,
                MessageKind::Response(Api::Sotw),
                None,
                &mut correlator,
                &mut out,
            );
            run(
                ack,
                MessageKind::Request(Api::Sotw),
                None,
                &mut correlator,
                &mut out,
            );
            assert_eq!(out.len(), 2);
            out
        })
    });
    let interner = Arc::new(Interner::default());
    g.bench_function(format!("fleet_repeat{suffix}"), |b| {
        b.iter(|| {
            let mut correlator = Correlator::new(Api::Sotw, StreamContext::default())
                .with_interner(interner.clone());
            let mut out = Vec::new();
            let sotw = (
                MessageKind::Response(Api::Sotw),
                MessageKind::Request(Api::Sotw),
            );
            run(push, sotw.0, Some(&interner), &mut correlator, &mut out);
            run(ack, sotw.1, Some(&interner), &mut correlator, &mut out);
            assert_eq!(out.len(), 2);
            out
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
