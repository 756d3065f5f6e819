//! Every verdict, SotW and Delta, without sockets.

use super::*;
use crate::xds::{ErrorDetail, Request, ResourceRef, Response};

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

fn req(type_url: &str, version: &str, nonce: &str, names: &[&str]) -> Request {
    Request {
        type_url: type_url.into(),
        version_info: version.into(),
        response_nonce: nonce.into(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn nack(type_url: &str, kept: &str, nonce: &str, message: &str) -> Request {
    Request {
        error_detail: Some(ErrorDetail {
            code: 13,
            message: message.into(),
        }),
        ..req(type_url, kept, nonce, &[])
    }
}

fn resp(type_url: &str, version: &str, nonce: &str, resources: &[(&str, u64)]) -> Response {
    Response {
        type_url: type_url.into(),
        version_info: version.into(),
        nonce: nonce.into(),
        resources: resources
            .iter()
            .map(|(n, d)| ResourceRef {
                name: n.to_string(),
                version: None,
                digest: *d,
            })
            .collect(),
        ..Default::default()
    }
}

fn correlator(api: Api) -> Correlator {
    Correlator::new(
        api,
        StreamContext {
            stream_id: 1,
            api: Some(api),
            ..Default::default()
        },
    )
}

/// Runs a step and returns its events.
fn step(c: &mut Correlator, f: impl FnOnce(&mut Correlator, &mut Vec<Event>)) -> Vec<Event> {
    let mut out = Vec::new();
    f(c, &mut out);
    out
}

fn verdicts(events: &[Event]) -> Vec<(String, &'static str)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Verdict { push, verdict, .. } => Some((push.nonce.clone(), verdict.name())),
            _ => None,
        })
        .collect()
}

#[test]
fn sotw_subscribe_push_ack() {
    let mut c = correlator(Api::Sotw);
    let mut first = req(CDS, "", "", &[]);
    first.node = Some(Node {
        id: "sidecar~1".into(),
        ..Default::default()
    });
    let e = step(&mut c, |c, o| c.on_request(first, 1, o));
    assert!(matches!(&e[..], [Event::Subscribe { .. }]));
    let e = step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v1", "n1", &[("a", 1)]), 10, o)
    });
    assert!(matches!(&e[..], [Event::Push { .. }]));
    let e = step(&mut c, |c, o| {
        c.on_request(req(CDS, "v1", "n1", &[]), 25, o)
    });
    assert_eq!(verdicts(&e), vec![("n1".into(), "ack")]);
    match &e[0] {
        Event::Verdict {
            at,
            client_version,
            decided_at,
            push,
            ..
        } => {
            assert_eq!(client_version.as_deref(), Some("v1"));
            assert_eq!(*decided_at - push.at, 15);
            // The node from the first request is kept although later requests omit it.
            assert_eq!(at.node.as_ref().unwrap().id, "sidecar~1");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn sotw_back_to_back_pushes_then_an_answer_to_the_first_is_stale() {
    let mut c = correlator(Api::Sotw);
    step(&mut c, |c, o| c.on_request(req(CDS, "", "", &[]), 0, o));
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v1", "n1", &[("a", 1)]), 1, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v2", "n2", &[("a", 2)]), 2, o)
    });
    assert_eq!(verdicts(&e), vec![("n1".into(), "superseded")]);
    // Envoy ACKs the older nonce after the newer push went out: not an ACK of v2.
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "v1", "n1", &[]), 3, o));
    assert!(
        matches!(&e[..], [Event::StaleAnswer { nonce, pending_nonce, nack: false, .. }]
        if nonce == "n1" && pending_nonce == "n2")
    );
    // v2 is still pending, and its own answer decides it.
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "v2", "n2", &[]), 4, o));
    assert_eq!(verdicts(&e), vec![("n2".into(), "ack")]);
}

#[test]
fn sotw_nack_keeps_the_old_version_and_blames_the_named_resource() {
    let mut c = correlator(Api::Sotw);
    step(&mut c, |c, o| c.on_request(req(CDS, "", "", &[]), 0, o));
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v1", "n1", &[("a", 1), ("b", 1)]), 1, o)
    });
    step(&mut c, |c, o| c.on_request(req(CDS, "v1", "n1", &[]), 2, o));
    // a changes harmlessly, b becomes invalid, c is new.
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v2", "n2", &[("a", 2), ("b", 2), ("c", 1)]), 3, o)
    });
    let msg = "Error adding/updating cluster(s) b: Proto constraint validation failed \
               (ClusterValidationError.ConnectTimeout: value must be greater than 0s)";
    let e = step(&mut c, |c, o| {
        c.on_request(nack(CDS, "v1", "n2", msg), 4, o)
    });
    match &e[..] {
        [Event::Verdict {
            verdict:
                Verdict::Nack {
                    error,
                    suspects,
                    changed,
                },
            client_version,
            push,
            ..
        }] => {
            assert_eq!(client_version.as_deref(), Some("v1"));
            assert_eq!(push.version, "v2");
            assert_eq!(error.code, 13);
            assert_eq!(error.message, msg);
            assert_eq!(suspects, &vec!["b".to_string()]);
            assert_eq!(changed, &vec!["a".to_string(), "b".into(), "c".into()]);
        }
        other => panic!("{other:?}"),
    }
    // Without a name in the message, every changed resource is a suspect; a removal counts.
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v3", "n3", &[("a", 1)]), 5, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_request(nack(CDS, "v1", "n3", "something is wrong"), 6, o)
    });
    match &e[..] {
        [Event::Verdict {
            verdict: Verdict::Nack { suspects, .. },
            ..
        }] => assert_eq!(suspects, &vec!["b".to_string()]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn sotw_same_nonce_with_other_names_is_a_subscription_change_not_an_ack() {
    let mut c = correlator(Api::Sotw);
    step(&mut c, |c, o| c.on_request(req(EDS, "", "", &["a"]), 0, o));
    step(&mut c, |c, o| {
        c.on_response(resp(EDS, "v1", "n1", &[("a", 1)]), 1, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_request(req(EDS, "v1", "n1", &["a"]), 2, o)
    });
    assert_eq!(verdicts(&e), vec![("n1".into(), "ack")]);
    let e = step(&mut c, |c, o| {
        c.on_request(req(EDS, "v1", "n1", &["a", "b"]), 3, o)
    });
    assert!(matches!(&e[..], [Event::SubscriptionChange { names, .. }] if names.len() == 2));
    // The same request again is a repeat: nothing.
    let e = step(&mut c, |c, o| {
        c.on_request(req(EDS, "v1", "n1", &["a", "b"]), 4, o)
    });
    assert!(e.is_empty());
}

#[test]
fn reconnect_states_versions_sotw_and_delta() {
    let mut c = correlator(Api::Sotw);
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "v7", "", &[]), 0, o));
    assert!(matches!(&e[..], [Event::Resubscribe { version, .. }] if version == "v7"));

    let mut d = correlator(Api::Delta);
    let mut first = req(CDS, "", "", &[]);
    first.initial_resource_versions = vec![("a".into(), "1".into()), ("b".into(), "2".into())];
    let e = step(&mut d, |c, o| c.on_request(first, 0, o));
    assert!(matches!(&e[..], [Event::Resubscribe { versions, .. }] if versions.len() == 2));
}

#[test]
fn stream_end_leaves_pending_pushes_unanswered() {
    let mut c = correlator(Api::Sotw);
    step(&mut c, |c, o| c.on_request(req(CDS, "", "", &[]), 0, o));
    step(&mut c, |c, o| c.on_request(req(EDS, "", "", &["a"]), 0, o));
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v1", "n1", &[("a", 1)]), 1, o)
    });
    step(&mut c, |c, o| {
        c.on_response(resp(EDS, "v1", "n2", &[("a", 1)]), 1, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_stream_end(Some(14), "upstream gone", 9, o)
    });
    assert_eq!(
        verdicts(&e),
        vec![("n1".into(), "unanswered"), ("n2".into(), "unanswered")]
    );
    assert!(
        matches!(&e[0], Event::Verdict { verdict: Verdict::Unanswered { grpc_status: Some(14), message }, .. }
        if message == "upstream gone")
    );
}

#[test]
fn delta_answers_each_nonce_and_blames_within_the_push() {
    let mut c = correlator(Api::Delta);
    step(&mut c, |c, o| c.on_request(req(CDS, "", "", &[]), 0, o));
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v1", "n1", &[("a", 1), ("b", 1)]), 1, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v2", "n2", &[("c", 1)]), 2, o)
    });
    assert!(
        verdicts(&e).is_empty(),
        "delta pushes do not supersede each other"
    );
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "", "n2", &[]), 3, o));
    assert_eq!(verdicts(&e), vec![("n2".into(), "ack")]);
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "", "n1", &[]), 4, o));
    assert_eq!(verdicts(&e), vec![("n1".into(), "ack")]);
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v3", "n3", &[("a", 2), ("bad", 1)]), 5, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_request(nack(CDS, "", "n3", "cluster bad: invalid"), 6, o)
    });
    match &e[..] {
        [Event::Verdict {
            verdict: Verdict::Nack {
                suspects, changed, ..
            },
            client_version: None,
            ..
        }] => {
            assert_eq!(suspects, &vec!["bad".to_string()]);
            assert_eq!(changed, &vec!["a".to_string(), "bad".into()]);
        }
        other => panic!("{other:?}"),
    }
    // A later (un)subscribe without a nonce is a subscription change.
    let mut sub = req(EDS, "", "", &["x"]);
    step(&mut c, |c, o| c.on_request(sub.clone(), 7, o));
    sub.resource_names = vec!["y".into()];
    sub.unsubscribe = vec!["x".into()];
    let e = step(&mut c, |c, o| c.on_request(sub, 8, o));
    assert!(
        matches!(&e[..], [Event::SubscriptionChange { unsubscribed, .. }] if unsubscribed == &vec!["x".to_string()])
    );
}

#[test]
fn an_answer_to_an_unseen_push_is_counted_not_judged() {
    let mut c = correlator(Api::Sotw);
    let e = step(&mut c, |c, o| {
        c.on_request(req(CDS, "v1", "never-seen", &[]), 0, o)
    });
    assert!(e.is_empty());
    assert_eq!(c.unmatched_answers, 1);
}

#[test]
fn names_are_found_as_whole_words() {
    assert!(mentions("Error adding/updating cluster(s) a: bad", "a"));
    assert!(mentions(
        "cluster outbound|80||foo.svc failed.",
        "outbound|80||foo.svc"
    ));
    assert!(!mentions("value must be greater", "a"));
    assert!(!mentions("cluster ab: bad", "a"));
    assert!(mentions("rejected b.", "b"));
}
