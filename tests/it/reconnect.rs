//! A reconnect tells the truth. A real Envoy runs clusters `a` and `b` (endpoints from EDS)
//! through the tap; the control plane restarts, and Envoy reconnects stating the version it
//! runs. Its clusters did not change, so nothing is new: the resync CDS push waits for no
//! endpoints (no warming, an ACK waiting for nothing), though Envoy's answer may come before the
//! endpoints are pushed again. The resubscribe, with the version Envoy stated, is in the event
//! log and in `xdstap watch`. What the tap knows Envoy runs carries over to the new stream:
//! a later push that changes `a` alone waits for `a`'s endpoints alone. On Delta, what Envoy
//! ran carries over by the resource versions it states: a NACK is blamed on what changed.

use crate::support;

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::resources::{Snapshot, CDS};
use support::tap::XdsTap;
use xdstap::correlate::Event;

/// The events of streams after `after` (by the tap's stream ids).
fn later(tap: &XdsTap, after: u64) -> Vec<Event> {
    (tap.events().into_iter())
        .filter(|e| e.context().stream.seq > after)
        .collect()
}

/// Envoy's ACK of CDS v1, and the tap's last stream id by then (the stream it came on).
async fn acked_v1(tap: &XdsTap) -> (support::tap::Verdict, u64) {
    let ack = support::eventually(20, "Envoy's ACK of CDS v1", || {
        tap.verdicts().into_iter().find(|v| {
            v.type_url == CDS && v.verdict == xdstap::correlate::Verdict::Ack && v.version == "v1"
        })
    })
    .await;
    let stream = (tap.events().iter())
        .map(|e| e.context().stream.seq)
        .max()
        .unwrap();
    (ack, stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_envoy_whose_clusters_did_not_change_waits_for_nothing() {
    let (cp, cp_addr, server) =
        ControlPlane::listening(Snapshot::standard("v1", 1000, 1000, 9)).await;
    let dir = support::TempDir::new("reconnect");
    let log = dir.path().join("verdicts.jsonl");
    let mut config = support::tap::config("127.0.0.1:0", &cp_addr);
    config.event_log = Some(log.clone());
    let tap = XdsTap::with_config(config, vec![]).await;
    let _envoy = Envoy::start("node-1", Xds::Tcp(tap.tap.addr.clone()), false).await;
    let (first, first_stream) = acked_v1(&tap).await;
    let (_watch, watched) = support::watch_into(&tap.admin, dir.path()).await;

    // The control plane restarts on its address; Envoy reconnects through the tap.
    cp.stop(server).await;
    let listener = tokio::net::TcpListener::bind(&cp_addr).await.unwrap();
    let _server = cp.serve(listener);
    let resync = support::eventually(20, "Envoy's ACK of CDS v1 on its new stream", || {
        later(&tap, first_stream).into_iter().find_map(|e| match e {
            Event::Verdict {
                context,
                push,
                verdict: xdstap::correlate::Verdict::Ack,
                waiting_for,
                ..
            } if context.type_url == CDS && push.version == "v1" => Some(waiting_for),
            _ => None,
        })
    })
    .await;
    assert!(resync.is_empty(), "the resync ACK waited for {resync:?}");
    let events = later(&tap, first_stream);
    let stated = events.iter().find_map(|e| match e {
        Event::Resubscribe {
            context, version, ..
        } if context.type_url == CDS => Some(version.clone()),
        _ => None,
    });
    assert_eq!(stated.as_deref(), Some("v1"), "{events:#?}");
    let warmed: Vec<&Event> = (events.iter())
        .filter(|e| matches!(e, Event::Warming { clusters, .. } if !clusters.is_empty()))
        .collect();
    assert!(warmed.is_empty(), "nothing changed, yet {warmed:#?}");

    // In the event log and in `xdstap watch`, with the version Envoy stated.
    let lines = support::eventually(10, "the resubscribe in the event log", || {
        let text = std::fs::read_to_string(&log).ok()?;
        let found: Vec<serde_json::Value> = (text.lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|v: &serde_json::Value| v["event"] == "resubscribe" && v["type"] == "CDS")
            .collect();
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(lines[0]["version"], "v1", "{lines:?}");
    assert_eq!(lines[0]["node"], "node-1", "{lines:?}");
    support::eventually(10, "the resubscribe in xdstap watch", || {
        let text = std::fs::read_to_string(&watched).ok()?;
        (text.lines())
            .find(|l| l.contains("node-1  CDS  RESUBSCRIBE  v1"))
            .map(drop)
    })
    .await;

    // What Envoy runs carried over: a push changing `a` alone waits for `a` alone.
    cp.set(Snapshot::standard("v2", 2000, 1000, 9));
    let waits = support::eventually(20, "the v2 CDS push's warming", || {
        later(&tap, first_stream).into_iter().find_map(|e| match e {
            Event::Warming {
                version, clusters, ..
            } if version == "v2" => Some(clusters),
            _ => None,
        })
    })
    .await;
    assert_eq!(waits, ["a"]);
    assert_eq!(first.node, "node-1");
    tap.close().await;
}

/// The same for Delta, where the client states the version of each resource it has. A real
/// Envoy on Delta ADS takes v1, the control plane restarts and Envoy reconnects stating what it
/// has; the control plane then pushes every cluster again (as a Delta server that computes no
/// difference does), `a` broken and `b` as it was. Envoy rejects the push, and the tap blames
/// `a` alone: it knows by content that Envoy ran `b` as pushed, from the ledger of the stream
/// that ended. A tap that did not know would count both as changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_delta_envoy_is_blamed_against_what_it_ran() {
    let (cp, cp_addr, server) =
        ControlPlane::listening(Snapshot::standard("v1", 1000, 1000, 9)).await;
    let tap = XdsTap::start(support::tap::TapOptions::new(&cp_addr)).await;
    let _envoy = Envoy::start("node-d", Xds::Tcp(tap.tap.addr.clone()), true).await;
    let (_, first_stream) = acked_v1(&tap).await;

    cp.stop(server).await;
    let listener = tokio::net::TcpListener::bind(&cp_addr).await.unwrap();
    let _server = cp.serve(listener);
    let stated = support::eventually(20, "Envoy's Delta resubscribe to CDS", || {
        later(&tap, first_stream).into_iter().find_map(|e| match e {
            Event::Resubscribe {
                context, versions, ..
            } if context.type_url == CDS => Some(versions),
            _ => None,
        })
    })
    .await;
    let mut names: Vec<&str> = stated.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["a", "b"], "{stated:?}");

    cp.push_delta_in_full();
    cp.set(Snapshot::standard("v2", 0, 1000, 9));
    let (pushed, changed) = support::eventually(20, "Envoy's NACK of CDS v2", || {
        later(&tap, first_stream).into_iter().find_map(|e| match e {
            Event::Verdict {
                context,
                push,
                verdict: xdstap::correlate::Verdict::Nack { changed, .. },
                ..
            } if context.type_url == CDS && push.version == "v2" => {
                let pushed: Vec<String> = push.resources.iter().map(|r| r.name.into()).collect();
                Some((pushed, changed))
            }
            _ => None,
        })
    })
    .await;
    assert_eq!(pushed, ["a", "b"], "the control plane pushed both");
    assert_eq!(changed, ["a"], "b ran as pushed");
    tap.close().await;
}
