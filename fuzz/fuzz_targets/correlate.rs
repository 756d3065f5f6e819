//! The correlator on any sequence of requests, responses and a stream end, over a small
//! alphabet of types, versions and nonces (so answers match pushes often): no panic, every push
//! gets exactly one verdict by the end of its stream, and every verdict is for a push that went
//! out.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use xdstap::correlate::{Correlator, Event, StreamContext};
use xdstap::xds::{Api, ErrorDetail, Node, Request, ResourceRef, Response};

const TYPES: [&str; 4] = [
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "type.googleapis.com/envoy.config.listener.v3.Listener",
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
];

fuzz_target!(|data: &[u8]| {
    let Some((&first, ops)) = data.split_first() else {
        return;
    };
    let api = if first & 1 == 0 {
        Api::Sotw
    } else {
        Api::Delta
    };
    let mut c = Correlator::new(api, StreamContext::default());
    let mut out = Vec::new();
    let mut now = 1u64;
    for op in ops.chunks(3) {
        let [a, b, d] = [op[0], *op.get(1).unwrap_or(&0), *op.get(2).unwrap_or(&0)];
        now += 1 + (d as u64);
        let type_url = TYPES[(a >> 4) as usize & 3].to_string();
        let nonce = if b & 7 == 0 {
            String::new()
        } else {
            format!("n{}", b & 7)
        };
        let version = format!("v{}", (b >> 3) & 3);
        match a & 3 {
            0 | 1 => c.on_request(
                Request {
                    type_url,
                    version_info: version,
                    response_nonce: nonce,
                    node: (a & 4 != 0).then(|| Node {
                        id: "n".into(),
                        ..Default::default()
                    }),
                    error_detail: (a & 8 != 0).then(|| ErrorDetail {
                        code: 3,
                        message: "bad r1".into(),
                    }),
                    resource_names: (0..(d & 3)).map(|i| format!("r{i}")).collect(),
                    ..Default::default()
                },
                now,
                &mut out,
            ),
            2 => {
                let mut resources = xdstap::xds::Resources::default();
                for i in 0..(d & 3) {
                    resources.push(ResourceRef {
                        name: format!("r{i}"),
                        version: None,
                        digest: (b as u64) ^ i as u64,
                        // Some are bare wrappers: heartbeats when all are.
                        bare: a & 32 != 0,
                        ..Default::default()
                    });
                    // Clusters fed by EDS, some under a service name of their own.
                    if d & (4 << i) != 0 {
                        resources.mark_eds((a & 64 != 0).then_some("r0"));
                    }
                }
                c.on_response(
                    Response {
                        type_url,
                        version_info: version,
                        nonce,
                        resources,
                        ..Default::default()
                    },
                    now,
                    &mut out,
                )
            }
            _ => c.on_stream_end(Some(14), "gone", now, &mut out),
        }
    }
    c.on_stream_end(None, "end", now + 1, &mut out);
    // Each push has exactly one verdict, and only pushes get verdicts; warming is of CDS pushes
    // that went out.
    let mut pushed: HashMap<*const xdstap::correlate::Push, u32> = HashMap::new();
    let mut open_cds: Vec<String> = Vec::new();
    for e in &out {
        match e {
            Event::Push { push, .. } => {
                pushed.insert(std::sync::Arc::as_ptr(push), 0);
                if push.type_url == TYPES[0] {
                    open_cds.push(push.nonce.clone());
                }
            }
            Event::Warming { context, nonce, .. } => {
                assert_eq!(context.type_url, TYPES[0]);
                assert!(open_cds.contains(nonce), "warming of a push that went out");
            }
            Event::Verdict { push, .. } => {
                let n = pushed
                    .get_mut(&std::sync::Arc::as_ptr(push))
                    .expect("a verdict for a push that went out");
                *n += 1;
                assert_eq!(*n, 1, "one verdict per push");
            }
            _ => {}
        }
    }
    assert!(pushed.values().all(|n| *n == 1), "every push decided");
});
