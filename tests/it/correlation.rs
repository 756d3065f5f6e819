//! Real Envoy through the tap, SotW ADS and Delta ADS: every verdict the tap gives is checked
//! against what the scripted control plane recorded of Envoy's answers.

use crate::support;

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::resources::{Snapshot, CDS, EDS, LDS, RDS};
use support::tap::{TapOptions, Verdict, XdsTap};
use xdstap::correlate::{Event, Verdict as V};

async fn wait_verdict(
    tap: &XdsTap,
    envoy: &Envoy,
    what: &str,
    f: impl Fn(&Verdict) -> bool,
) -> Verdict {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    loop {
        if let Some(v) = tap.verdicts().into_iter().find(|v| f(v)) {
            return v;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "no verdict: {what}\nverdicts: {:#?}\nenvoy log:\n{}",
                tap.verdicts(),
                envoy.log()
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// Every ack/nack the tap gave matches Envoy's answer as the control plane saw it; every
/// unanswered or superseded push really has no answer (and the push that superseded it was
/// sent).
fn check_against_control_plane(tap: &XdsTap, cp: &ControlPlane) {
    for v in tap.verdicts() {
        let answer = cp.answer_to(&v.nonce);
        match &v.verdict {
            V::Ack => {
                let a = answer
                    .unwrap_or_else(|| panic!("tap says ack, control plane saw no answer: {v:?}"));
                assert!(a.error.is_none(), "tap says ack, envoy nacked: {v:?}");
            }
            V::Nack { error, .. } => {
                let a = answer
                    .unwrap_or_else(|| panic!("tap says nack, control plane saw no answer: {v:?}"));
                let (code, message) = a.error.expect("envoy acked what the tap calls a nack");
                assert_eq!((error.code, &error.message), (code, &message));
            }
            V::Unanswered { .. } => {
                assert!(answer.is_none(), "answered push called unanswered: {v:?}")
            }
            // Replaced before its answer: the control plane heard none naming it, and it did
            // send the push that replaced it.
            V::Superseded { by_nonce } => {
                assert!(answer.is_none(), "answered push called superseded: {v:?}");
                assert!(
                    cp.sent().iter().any(|s| s.nonce == *by_nonce),
                    "superseded by {by_nonce}, which the control plane never sent: {v:?}"
                );
            }
        }
    }
}

async fn story(delta: bool) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(Snapshot::standard("v1", 1000, 1000, 9));
    let server = cp.serve(listener);
    let tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let envoy = Envoy::start("node-1", Xds::Tcp(tap.tap.addr.clone()), delta).await;

    // 1. Good config: an ACK for every type pushed.
    for t in [CDS, EDS, LDS, RDS] {
        let v = wait_verdict(&tap, &envoy, t, |v| {
            v.type_url == t && v.version == "v1" && v.verdict == V::Ack
        })
        .await;
        assert_eq!(v.node, "node-1");
        if !delta {
            assert_eq!(v.client_version.as_deref(), Some("v1"));
        }
    }

    // 2. A harmless change to `a` pushed with an invalid `b`: NACK, Envoy's own text, stays on v1.
    cp.set(Snapshot::standard("v2", 2000, 0, 9));
    let v = wait_verdict(&tap, &envoy, "CDS nack", |v| {
        v.type_url == CDS && v.version == "v2" && v.verdict != V::Ack
    })
    .await;
    let V::Nack {
        error,
        suspects,
        changed,
        scope,
        ..
    } = &v.verdict
    else {
        panic!("expected nack: {v:?}")
    };
    assert_eq!(
        *scope,
        xdstap::correlate::Scope::Whole,
        "proto validation rejects the whole push"
    );
    assert!(
        error
            .message
            .contains("ConnectTimeout: value must be greater than 0s"),
        "{}",
        error.message
    );
    assert!(suspects.contains(&"b".to_string()), "{suspects:?}");
    assert!(!suspects.contains(&"a".to_string()), "{suspects:?}");
    assert!(
        changed.contains(&"a".to_string()) && changed.contains(&"b".to_string()),
        "{changed:?}"
    );
    if !delta {
        assert_eq!(v.client_version.as_deref(), Some("v1"));
    }
    let recorded = cp.answer_eventually(&v.nonce).await.error.unwrap();
    assert_eq!(
        error.message, recorded.1,
        "the NACK text is Envoy's own, as sent"
    );

    // 3. The fix: ACK.
    cp.set(Snapshot::standard("v3", 2000, 1000, 9));
    wait_verdict(&tap, &envoy, "CDS ack v3", |v| {
        v.type_url == CDS && v.version == "v3" && v.verdict == V::Ack
    })
    .await;

    // 4. Control plane restarted: Envoy reconnects through the tap and states what it has.
    cp.stop(server).await;
    let listener = tokio::net::TcpListener::bind(&cp_addr).await.unwrap();
    let _server = cp.serve(listener);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let resub = loop {
        let found = tap.events().into_iter().find_map(|e| match e {
            Event::Resubscribe {
                context,
                version,
                versions,
                ..
            } if context.type_url == CDS => Some((version, versions)),
            _ => None,
        });
        if let Some(r) = found {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no resubscribe; streams total {} active {} conns {} connect errors {};",
            xdstap::proxy::counter(&tap.tap.stats.streams_total),
            xdstap::proxy::counter(&tap.tap.stats.streams_active),
            xdstap::proxy::counter(&tap.tap.stats.connections_total),
            xdstap::proxy::counter(&tap.tap.stats.upstream_connect_errors)
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no resubscribe; events {:#?}; envoy log:\n{}",
            tap.events()
                .iter()
                .rev()
                .take(3)
                .map(|e| format!("{e:?}").chars().take(300).collect::<String>())
                .collect::<Vec<_>>(),
            envoy
                .log()
                .lines()
                .rev()
                .take(15)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    };
    if delta {
        let names: Vec<&str> = resub.1.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"a") && names.contains(&"b"), "{resub:?}");
        // The tap sees the request before it forwards it: wait for the control plane's record.
        let cp_side =
            support::eventually(10, "the control plane to record the resubscribe", || {
                cp.requests()
                    .into_iter()
                    .rev()
                    .find(|r| r.type_url == CDS && !r.initial_versions.is_empty())
            })
            .await;
        let stated: Vec<(String, String)> = cp_side.initial_versions.into_iter().collect();
        let mut ours = resub.1.clone();
        ours.sort();
        assert_eq!(ours, stated);
    } else {
        assert_eq!(resub.0, "v3");
    }
    wait_verdict(&tap, &envoy, "CDS ack after restart", |v| {
        v.type_url == CDS
            && v.version == "v3"
            && v.verdict == V::Ack
            && tap
                .verdicts()
                .iter()
                .filter(|w| w.type_url == CDS && w.verdict == V::Ack)
                .count()
                >= 2
    })
    .await;
    check_against_control_plane(&tap, &cp);
}

#[tokio::test]
async fn envoy_sotw_ads_verdicts() {
    story(false).await;
}

#[tokio::test]
async fn envoy_delta_ads_verdicts() {
    story(true).await;
}
