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
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn correlator(api: Api) -> Correlator {
    Correlator::new(
        api,
        StreamContext {
            seq: 1,
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
            context,
            client_version,
            decided_at,
            push,
            ..
        } => {
            assert_eq!(client_version.as_deref(), Some("v1"));
            assert_eq!(*decided_at - push.at, 15);
            // The node from the first request is kept although later requests omit it.
            assert_eq!(context.node.as_ref().unwrap().id, "sidecar~1");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn sotw_back_to_back_pushes_each_get_their_own_answer() {
    let mut c = correlator(Api::Sotw);
    step(&mut c, |c, o| c.on_request(req(CDS, "", "", &[]), 0, o));
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v1", "n1", &[("a", 1)]), 1, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v2", "n2", &[("a", 2)]), 2, o)
    });
    assert!(verdicts(&e).is_empty(), "a newer push decides nothing");
    // The client answers in order: its NACK of n1 comes after n2 went out, and is n1's verdict,
    // marked as overtaken by n2; never an answer to n2.
    let e = step(&mut c, |c, o| {
        c.on_request(nack(CDS, "", "n1", "bad a"), 3, o)
    });
    match &e[..] {
        [Event::Verdict {
            push,
            verdict: Verdict::Nack { error, .. },
            overtaken_by,
            ..
        }] => {
            assert_eq!(push.nonce, "n1");
            assert_eq!(error.message, "bad a");
            assert_eq!(overtaken_by.as_deref(), Some("n2"));
        }
        other => panic!("{other:?}"),
    }
    // n2 is still open, and its own answer decides it.
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "v2", "n2", &[]), 4, o));
    assert_eq!(verdicts(&e), vec![("n2".into(), "ack")]);
}

#[test]
fn sotw_an_answer_to_a_later_push_supersedes_the_earlier_and_a_late_one_is_stale() {
    let mut c = correlator(Api::Sotw);
    step(&mut c, |c, o| c.on_request(req(CDS, "", "", &[]), 0, o));
    for (i, n) in ["n1", "n2", "n3"].iter().enumerate() {
        step(&mut c, |c, o| {
            c.on_response(resp(CDS, &format!("v{i}"), n, &[("a", i as u64)]), 1, o)
        });
    }
    // The client answered only the newest: the two before it will never be answered.
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "v2", "n3", &[]), 2, o));
    assert_eq!(
        verdicts(&e),
        vec![
            ("n1".into(), "superseded"),
            ("n2".into(), "superseded"),
            ("n3".into(), "ack")
        ]
    );
    assert!(
        matches!(&e[0], Event::Verdict { verdict: Verdict::Superseded { by_nonce }, .. } if by_nonce == "n2")
    );
    // An answer naming a superseded push afterwards is stale: it accepts nothing.
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "v0", "n1", &[]), 3, o));
    assert!(matches!(&e[..], [Event::StaleAnswer { nonce, nack: false, .. }] if nonce == "n1"));
}

#[test]
fn sotw_reused_nonces_pair_in_order_and_are_reported() {
    let mut c = correlator(Api::Sotw);
    step(&mut c, |c, o| c.on_request(req(CDS, "", "", &[]), 0, o));
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v1", "n", &[("a", 1)]), 1, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v2", "n", &[("a", 2)]), 2, o)
    });
    assert!(matches!(&e[0], Event::NonceReused { nonce, .. } if nonce == "n"));
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "v1", "n", &[]), 3, o));
    assert!(
        matches!(&e[..], [Event::Verdict { push, verdict: Verdict::Ack, .. }] if push.version == "v1")
    );
    let e = step(&mut c, |c, o| {
        c.on_request(nack(CDS, "v1", "n", "bad"), 4, o)
    });
    assert!(
        matches!(&e[..], [Event::Verdict { push, verdict: Verdict::Nack { .. }, client_version, .. }]
        if push.version == "v2" && client_version.as_deref() == Some("v1"))
    );
}

#[test]
fn stream_end_supersedes_the_overtaken_and_leaves_the_newest_unanswered() {
    let mut c = correlator(Api::Sotw);
    step(&mut c, |c, o| c.on_request(req(CDS, "", "", &[]), 0, o));
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v1", "n1", &[("a", 1)]), 1, o)
    });
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v2", "n2", &[("a", 2)]), 2, o)
    });
    let e = step(&mut c, |c, o| c.on_stream_end(Some(1), "cancelled", 3, o));
    assert_eq!(
        verdicts(&e),
        vec![("n1".into(), "superseded"), ("n2".into(), "unanswered")]
    );
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
                    scope,
                    rejected,
                    applied,
                    ..
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
            assert_eq!(*scope, Scope::Partial);
            assert_eq!(rejected.len(), 1);
            assert_eq!(rejected[0].name, "b");
            assert!(rejected[0].reason.starts_with("Proto constraint"));
            assert_eq!(applied, &vec!["a".to_string(), "c".into()]);
        }
        other => panic!("{other:?}"),
    }
    // Without a name in the message, every changed resource is a suspect; a removal counts.
    // The client runs a and c of v2 (and v1's b), so v3 changes a and removes b and c.
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v3", "n3", &[("a", 1)]), 5, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_request(nack(CDS, "v1", "n3", "something is wrong"), 6, o)
    });
    match &e[..] {
        [Event::Verdict {
            verdict: Verdict::Nack {
                suspects, scope, ..
            },
            ..
        }] => {
            assert_eq!(suspects, &vec!["a".to_string(), "b".into(), "c".into()]);
            assert_eq!(*scope, Scope::Unknown);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_delta_partial_nack_leaves_the_valid_part_running() {
    let mut c = correlator(Api::Delta);
    step(&mut c, |c, o| c.on_request(req(CDS, "", "", &[]), 0, o));
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v1", "n1", &[("a", 1), ("b", 1)]), 1, o)
    });
    step(&mut c, |c, o| c.on_request(req(CDS, "", "n1", &[]), 2, o));
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v2", "n2", &[("a", 2), ("b", 2)]), 3, o)
    });
    let msg = "Error adding/updating cluster(s) b: malformed IP address: not-an-ip";
    step(&mut c, |c, o| c.on_request(nack(CDS, "", "n2", msg), 4, o));
    // v3 carries a as v2 had it (what runs: no change) and b as v1 had it (what runs too).
    step(&mut c, |c, o| {
        c.on_response(resp(CDS, "v3", "n3", &[("a", 2), ("b", 1), ("x", 1)]), 5, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_request(nack(CDS, "", "n3", "nope about x"), 6, o)
    });
    match &e[..] {
        [Event::Verdict {
            verdict: Verdict::Nack { changed, .. },
            ..
        }] => assert_eq!(changed, &vec!["x".to_string()]),
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

/// A push that crossed the client's reset (the tap saw the reset first): pushed all the same,
/// and Unanswered at once by the stream's end, for SotW and Delta; nothing else happens after.
#[test]
fn a_push_after_the_streams_end_is_pushed_and_unanswered_by_that_end() {
    for api in [Api::Sotw, Api::Delta] {
        let mut c = correlator(api);
        step(&mut c, |c, o| c.on_request(req(EDS, "", "", &["a"]), 0, o));
        let e = step(&mut c, |c, o| {
            c.on_stream_end(None, "reset by client (HTTP/2 Cancel)", 5, o)
        });
        assert!(matches!(&e[..], [Event::StreamEnd { .. }]), "{e:?}");
        let e = step(&mut c, |c, o| {
            c.on_response(resp(EDS, "v1", "n1", &[("a", 1)]), 6, o)
        });
        assert!(
            matches!(&e[0], Event::Push { push, .. } if push.nonce == "n1"),
            "{e:?}"
        );
        assert_eq!(verdicts(&e), vec![("n1".into(), "unanswered")], "{api:?}");
        assert!(
            matches!(&e[1], Event::Verdict { verdict: Verdict::Unanswered { grpc_status: None, message }, .. }
            if message == "reset by client (HTTP/2 Cancel); the push crossed the stream's end"),
            "{e:?}"
        );
        assert_eq!(e.len(), 2, "no second stream end: {e:?}");
        let e = step(&mut c, |c, o| {
            c.on_request(req(EDS, "v1", "n1", &["a"]), 7, o)
        });
        assert!(
            e.is_empty(),
            "an answer after the end counts for nothing: {e:?}"
        );
    }
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
            client_version: Some(running),
            ..
        }] => {
            // Delta says no version: the client runs the last push it accepted, in push order.
            assert_eq!(running, "v2");
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
    assert!(matches!(&e[..], [Event::UnmatchedAnswer { nonce, .. }] if nonce == "never-seen"));
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
    for (message, name) in [
        ("Error adding/updating cluster(s) a: bad", "a"),
        ("cluster ab: bad", "a"),
        ("rejected b.", "b"),
        ("rejected b..", "b"),
        ("a.b. done", "a.b"),
        ("secret kubernetes://x: bad", "kubernetes://x"),
    ] {
        assert_eq!(
            Mentions::of(message).names(name),
            mentions(message, name),
            "{message:?} {name:?}"
        );
    }
}

/// What a client model did with one push: answered it (ACK or NACK), or dropped it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Client {
    Ack,
    Nack,
    Skip,
}

/// One push as a client model saw it.
struct Sent {
    /// Type index.
    t: usize,
    version: String,
    nonce: String,
    /// What the client did with it (`None`: it never got to it).
    what: Option<Client>,
}

/// Plays `ops` between a control plane and a client that answers each type's pushes in the
/// order they came (skipping some, when `ops` says so), then ends the stream. `ops` are
/// (type 0..2, nonce label, what the client does); an op either pushes (`None`) or lets the
/// client take the oldest push of that type it holds. Returns every push in send order and
/// every event.
fn play_in_order(ops: &[(usize, u8, Option<Client>)]) -> (Vec<Sent>, Vec<Event>) {
    let types = [CDS, EDS];
    let mut c = correlator(Api::Sotw);
    let mut out = Vec::new();
    let mut now = 0;
    let mut sent: Vec<Sent> = Vec::new();
    let mut held: [std::collections::VecDeque<usize>; 2] = Default::default();
    let mut running = [String::new(), String::new()];
    for t in types {
        c.on_request(req(t, "", "", &[]), now, &mut out);
    }
    for &(t, label, what) in ops {
        assert!(c.held() <= 2 * (MAX_OPEN_SOTW + REMEMBERED_NONCES));
        now += 1;
        let Some(what) = what else {
            let (version, nonce) = (format!("v{}", sent.len()), format!("n{label}"));
            let r = resp(types[t], &version, &nonce, &[("a", sent.len() as u64)]);
            c.on_response(r, now, &mut out);
            held[t].push_back(sent.len());
            sent.push(Sent {
                t,
                version,
                nonce,
                what: None,
            });
            continue;
        };
        let Some(i) = held[t].pop_front() else {
            continue;
        };
        let p = &mut sent[i];
        p.what = Some(what);
        let request = match what {
            Client::Ack => {
                running[t] = p.version.clone();
                req(types[t], &p.version, &p.nonce, &[])
            }
            Client::Nack => nack(types[t], &running[t], &p.nonce, "rejected"),
            Client::Skip => continue,
        };
        c.on_request(request, now, &mut out);
    }
    c.on_stream_end(Some(14), "gone", now + 1, &mut out);
    (sent, out)
}

/// Each push's one verdict, in send order (panics on a second verdict or an unsent push).
fn one_verdict_each(events: &[Event]) -> Vec<Verdict> {
    let mut pushes: Vec<(*const Push, Option<Verdict>)> = Vec::new();
    for e in events {
        match e {
            Event::Push { push, .. } => pushes.push((Arc::as_ptr(push), None)),
            Event::Verdict { push, verdict, .. } => {
                let slot = pushes
                    .iter_mut()
                    .find(|(p, _)| *p == Arc::as_ptr(push))
                    .expect("a verdict for a push that went out");
                assert!(slot.1.is_none(), "a second verdict for one push");
                slot.1 = Some(verdict.clone());
            }
            _ => {}
        }
    }
    pushes
        .into_iter()
        .map(|(_, v)| v.expect("every push has a verdict by the end of its stream"))
        .collect()
}

fn in_order_ops(
    labels: u8,
    skips: bool,
) -> impl proptest::strategy::Strategy<Value = Vec<(usize, u8, Option<Client>)>> {
    use proptest::prelude::*;
    let client = if skips {
        prop_oneof![Just(Client::Ack), Just(Client::Nack), Just(Client::Skip)].boxed()
    } else {
        prop_oneof![Just(Client::Ack), Just(Client::Nack)].boxed()
    };
    proptest::collection::vec((0usize..2, 0..labels, proptest::option::of(client)), 0..40)
        .prop_filter("at most the open bound per type", |ops| {
            (0..2)
                .all(|t| ops.iter().filter(|o| o.0 == t && o.2.is_none()).count() <= MAX_OPEN_SOTW)
        })
}

proptest::proptest! {
    /// Reading a message's words once gives what searching it for each name gives, for any
    /// message and name over an alphabet of word and non-word characters.
    #[test]
    fn mentions_read_once_agree_with_searching(
        message in "[ab.:| ]{0,24}",
        name in "[ab.:|]{0,4}",
    ) {
        proptest::prop_assert_eq!(Mentions::of(&message).names(&name), mentions(&message, &name));
    }

    /// SotW, unique nonces, a client answering in order and skipping some: every push it
    /// answered gets that answer (late or not), every push it skipped is superseded or, the
    /// newest of its type at the end, unanswered; one verdict each.
    #[test]
    fn in_order_answers_decide_their_own_push(ops in in_order_ops(u8::MAX, true)) {
        // Unique nonces: relabel each push by its position.
        let mut n = 0u8;
        let ops: Vec<_> = ops.into_iter().map(|(t, _, w)| {
            let label = n;
            if w.is_none() { n = n.wrapping_add(1); }
            (t, label, w)
        }).collect();
        let (sent, events) = play_in_order(&ops);
        let verdicts = one_verdict_each(&events);
        for (i, (Sent { t, what, .. }, v)) in sent.iter().zip(&verdicts).enumerate() {
            let newest = !sent[i + 1..].iter().any(|s| s.t == *t);
            match what {
                Some(Client::Ack) => proptest::prop_assert_eq!(v, &Verdict::Ack),
                Some(Client::Nack) => proptest::prop_assert!(matches!(v, Verdict::Nack { .. }), "{v:?}"),
                Some(Client::Skip) | None if newest && !matches!(what, Some(Client::Skip)) => {
                    proptest::prop_assert!(matches!(v, Verdict::Unanswered { .. }), "{v:?}")
                }
                _ => proptest::prop_assert!(
                    matches!(v, Verdict::Superseded { .. } | Verdict::Unanswered { .. }),
                    "{v:?}"
                ),
            }
            if matches!(what, Some(Client::Skip)) && !newest {
                proptest::prop_assert!(matches!(v, Verdict::Superseded { .. }), "{v:?}");
            }
        }
    }

    /// SotW, a control plane reusing nonces (two labels for every push), a client answering
    /// every push in order: answers pair with pushes in order, so each push gets its own.
    #[test]
    fn reused_nonces_pair_in_order(ops in in_order_ops(2, false)) {
        let (sent, events) = play_in_order(&ops);
        let verdicts = one_verdict_each(&events);
        for (Sent { what, .. }, v) in sent.iter().zip(&verdicts) {
            match what {
                Some(Client::Ack) => proptest::prop_assert_eq!(v, &Verdict::Ack),
                Some(Client::Nack) => proptest::prop_assert!(matches!(v, Verdict::Nack { .. }), "{v:?}"),
                _ => proptest::prop_assert!(
                    matches!(v, Verdict::Superseded { .. } | Verdict::Unanswered { .. }),
                    "{v:?}"
                ),
            }
        }
        // A push reuses a nonce when an earlier push of its type carried the same label: with
        // at most the open bound of pushes per type, every earlier one is still open or
        // remembered.
        let reuses = events.iter().filter(|e| matches!(e, Event::NonceReused { .. })).count();
        let expected: usize = (0..2)
            .map(|t| {
                let labels: Vec<u8> =
                    ops.iter().filter(|o| o.0 == t && o.2.is_none()).map(|o| o.1).collect();
                (1..labels.len()).filter(|&i| labels[..i].contains(&labels[i])).count()
            })
            .sum();
        proptest::prop_assert_eq!(reuses, expected);
    }

    /// Any interleaving of requests, responses and stream ends over a small alphabet, either
    /// API: at most one verdict per push and exactly one by the end, none for a push never
    /// sent, an ACK or NACK only from an answer naming that push's nonce (a stale answer
    /// accepts nothing), and bounded memory.
    #[test]
    fn any_interleaving_keeps_the_invariants(
        delta in proptest::bool::ANY,
        ops in proptest::collection::vec((0u8..4, 0u8..4, 0u8..4, 0u8..3), 0..80),
    ) {
        let api = if delta { Api::Delta } else { Api::Sotw };
        let types = [CDS, EDS];
        let mut c = correlator(api);
        let mut all = Vec::new();
        for (i, &(kind, ty, nonce, names)) in ops.iter().enumerate() {
            let t = types[ty as usize % 2];
            let nonce = if nonce == 0 { String::new() } else { format!("n{nonce}") };
            let names: Vec<String> = (0..names).map(|n| format!("r{n}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut out = Vec::new();
            match kind {
                0 => c.on_request(req(t, "v", &nonce, &names), i as u64, &mut out),
                1 => c.on_request(nack(t, "v", &nonce, "bad r1"), i as u64, &mut out),
                2 => c.on_response(resp(t, &format!("v{i}"), &nonce, &[("r1", i as u64)]), i as u64, &mut out),
                _ => c.on_stream_end(None, "end", i as u64, &mut out),
            }
            for e in &out {
                if let Event::Verdict { push, verdict: Verdict::Ack | Verdict::Nack { .. }, .. } = e {
                    proptest::prop_assert!(kind < 2, "an answer verdict from a response");
                    proptest::prop_assert_eq!(&push.nonce, &nonce, "an answer decides only the push it names");
                    let is_nack = matches!(e, Event::Verdict { verdict: Verdict::Nack { .. }, .. });
                    proptest::prop_assert_eq!(kind == 1, is_nack);
                }
            }
            all.extend(out);
            let bound = match api { Api::Sotw => MAX_OPEN_SOTW, Api::Delta => MAX_OPEN_DELTA };
            proptest::prop_assert!(c.held() <= 2 * (bound + REMEMBERED_NONCES));
        }
        c.on_stream_end(None, "end", u64::MAX, &mut all);
        one_verdict_each(&all);
    }
}

/// A CDS response of clusters `(name, digest, eds service)`: `None` a static cluster,
/// `Some("")` an EDS cluster under its own name.
fn clusters(version: &str, nonce: &str, list: &[(&str, u64, Option<&str>)]) -> Response {
    let mut r = resp(CDS, version, nonce, &[]);
    for (name, digest, eds) in list {
        r.resources.push_parts(name, None, *digest);
        if let Some(service) = eds {
            r.resources.mark_eds(Some(service));
        }
    }
    r
}

fn warming(events: &[Event]) -> Vec<(String, Vec<String>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Warming {
                nonce,
                clusters,
                context,
                ..
            } => {
                assert_eq!(context.type_url, CDS);
                Some((nonce.clone(), clusters.clone()))
            }
            _ => None,
        })
        .collect()
}

fn waiting_for(events: &[Event]) -> Vec<String> {
    match events.iter().find(|e| matches!(e, Event::Verdict { .. })) {
        Some(Event::Verdict { waiting_for, .. }) => waiting_for.clone(),
        _ => panic!("no verdict in {events:?}"),
    }
}

fn as_node(id: &str, r: Request) -> Request {
    Request {
        node: Some(Node {
            id: id.into(),
            ..Default::default()
        }),
        ..r
    }
}

/// A stream of `node` that takes CDS `version` (`clusters`) and ends, recorded in `ledger`.
fn ran(ledger: &Arc<Ledger>, node: &str, version: &str, clusters_: &[(&str, u64, Option<&str>)]) {
    let mut c = correlator(Api::Sotw).with_ledger(ledger.clone());
    step(&mut c, |c, o| {
        c.on_request(as_node(node, req(CDS, "", "", &[])), 0, o)
    });
    step(&mut c, |c, o| {
        c.on_response(clusters(version, "was", clusters_), 0, o)
    });
    step(&mut c, |c, o| {
        c.on_request(req(CDS, version, "was", &[]), 0, o)
    });
    step(&mut c, |c, o| c.on_stream_end(None, "gone", 0, o));
}

/// A reconnecting client runs what its last stream ended on when it states that version: the
/// same clusters pushed again are nothing new and wait for nothing, a changed one does, and a
/// NACK is blamed against what it ran. Stating a version the tap does not know (its last
/// stream went through another tap), nothing is said to wait, and every resource counts as
/// changed.
#[test]
fn a_reconnecting_client_runs_what_its_last_stream_ended_on() {
    let ledger = Arc::new(Ledger::default());
    let v7 = [("a", 1, Some("")), ("b", 2, Some("")), ("s", 3, None)];
    ran(&ledger, "n", "v7", &v7);
    assert_eq!(ledger.entries(), 1);
    let mut c = correlator(Api::Sotw).with_ledger(ledger.clone());
    let e = step(&mut c, |c, o| {
        c.on_request(as_node("n", req(CDS, "v7", "", &[])), 1, o)
    });
    assert!(matches!(&e[..], [Event::Resubscribe { version, .. }] if version == "v7"));
    let e = step(&mut c, |c, o| {
        c.on_response(clusters("v7", "r1", &v7), 2, o)
    });
    assert!(warming(&e).is_empty(), "nothing changed: {e:?}");
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "v7", "r1", &[]), 3, o));
    assert!(waiting_for(&e).is_empty());
    let v8 = [("a", 1, Some("")), ("b", 20, Some("")), ("s", 3, None)];
    let e = step(&mut c, |c, o| {
        c.on_response(clusters("v8", "r2", &v8), 4, o)
    });
    assert_eq!(warming(&e), [("r2".into(), vec!["b".into()])]);
    let e = step(&mut c, |c, o| {
        c.on_request(nack(CDS, "v7", "r2", "no good"), 5, o)
    });
    match &e[0] {
        Event::Verdict {
            verdict: Verdict::Nack { changed, .. },
            ..
        } => assert_eq!(changed, &["b"]),
        other => panic!("{other:?}"),
    }

    // Another node, or a version the ledger does not have for it: not known.
    for (node, version) in [("m", "v7"), ("n", "v6")] {
        let mut c = correlator(Api::Sotw).with_ledger(ledger.clone());
        step(&mut c, |c, o| {
            c.on_request(as_node(node, req(CDS, version, "", &[])), 1, o)
        });
        let e = step(&mut c, |c, o| {
            c.on_response(clusters("v8", "u1", &v8), 2, o)
        });
        assert!(warming(&e).is_empty(), "{node} {version}: {e:?}");
        let e = step(&mut c, |c, o| {
            c.on_request(nack(CDS, version, "u1", "no good"), 3, o)
        });
        match &e[0] {
            Event::Verdict {
                verdict: Verdict::Nack { changed, .. },
                ..
            } => assert_eq!(changed.len(), 3, "{node} {version}"),
            other => panic!("{other:?}"),
        }
    }
}

/// The ledger keeps at most its bound of entries, the ones recorded longest ago going first.
#[test]
fn the_ledger_is_bounded() {
    let ledger = Ledger::default();
    let set = Accepted::Push(Arc::new(Resources::default()));
    for i in 0..ledger::MAX_ENTRIES + 10 {
        ledger.record(&format!("node-{i}"), CDS, "v1", set.clone());
    }
    assert!(
        ledger.entries() <= ledger::MAX_ENTRIES,
        "{}",
        ledger.entries()
    );
    assert!(
        ledger.recall("node-0", CDS, "v1").is_none(),
        "the oldest went"
    );
    let last = format!("node-{}", ledger::MAX_ENTRIES + 9);
    assert!(ledger.recall(&last, CDS, "v1").is_some());
    assert!(ledger.recall(&last, CDS, "v2").is_none(), "another version");
    assert!(ledger.recall(&last, EDS, "v1").is_none(), "another type");
}

#[test]
fn cds_push_waits_for_the_endpoints_of_the_clusters_it_adds_or_changes() {
    // A client that starts does not hold its first CDS answer: nothing warms.
    let mut fresh = correlator(Api::Sotw);
    step(&mut fresh, |c, o| c.on_request(req(CDS, "", "", &[]), 1, o));
    let e = step(&mut fresh, |c, o| {
        c.on_response(clusters("v1", "c1", &[("a", 1, Some(""))]), 2, o)
    });
    assert!(warming(&e).is_empty(), "{e:?}");
    // One that reconnects saying it runs v0, which its last stream through the tap ended on,
    // does: the ledger knows v0 had none of these clusters.
    let ledger = Arc::new(Ledger::default());
    ran(&ledger, "n", "v0", &[("old", 7, Some(""))]);
    let mut c = correlator(Api::Sotw).with_ledger(ledger);
    step(&mut c, |c, o| {
        c.on_request(as_node("n", req(CDS, "v0", "", &[])), 1, o)
    });
    let v1 = [("a", 1, Some("")), ("b", 2, Some("b-svc")), ("s", 3, None)];
    let e = step(&mut c, |c, o| {
        c.on_response(clusters("v1", "c1", &v1), 2, o)
    });
    assert_eq!(
        warming(&e),
        [("c1".into(), vec!["a".into(), "b-svc".into()])]
    );
    // Endpoints come one by one; each strikes its name off.
    let e = step(&mut c, |c, o| {
        c.on_response(resp(EDS, "e1", "e1", &[("a", 9)]), 3, o)
    });
    assert_eq!(warming(&e), [("c1".into(), vec!["b-svc".into()])]);
    let e = step(&mut c, |c, o| {
        c.on_response(resp(EDS, "e2", "e2", &[("zzz", 9)]), 4, o)
    });
    assert!(warming(&e).is_empty(), "nothing it waits for came");
    let e = step(&mut c, |c, o| {
        c.on_response(resp(EDS, "e3", "e3", &[("a", 9), ("b-svc", 8)]), 5, o)
    });
    assert_eq!(warming(&e), [("c1".into(), vec![])]);
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "v1", "c1", &[]), 6, o));
    assert_eq!(verdicts(&e), [("c1".into(), "ack")]);
    assert!(waiting_for(&e).is_empty());

    // v2 changes `a` only: only `a` warms; no EDS comes and the ACK (after the client's fetch
    // timeout) says so.
    let v2 = [
        ("a", 10, Some("")),
        ("b", 2, Some("b-svc")),
        ("s", 30, None),
    ];
    let e = step(&mut c, |c, o| {
        c.on_response(clusters("v2", "c2", &v2), 7, o)
    });
    assert_eq!(warming(&e), [("c2".into(), vec!["a".into()])]);
    let e = step(&mut c, |c, o| c.on_request(req(CDS, "v2", "c2", &[]), 8, o));
    assert_eq!(waiting_for(&e), ["a"]);
    assert!(
        c.warming.is_empty(),
        "warming is followed no more once decided"
    );

    // The same clusters in another order: nothing changed, nothing warms.
    let v3 = [
        ("s", 30, None),
        ("b", 2, Some("b-svc")),
        ("a", 10, Some("")),
    ];
    let e = step(&mut c, |c, o| {
        c.on_response(clusters("v3", "c3", &v3), 9, o)
    });
    assert!(warming(&e).is_empty(), "{e:?}");

    // A NACKed push's clusters warm no more; a push superseded while warming neither.
    let v4 = [("a", 11, Some(""))];
    let v5 = [("a", 12, Some(""))];
    step(&mut c, |c, o| {
        c.on_request(req(CDS, "v3", "c3", &[]), 10, o)
    });
    step(&mut c, |c, o| {
        c.on_response(clusters("v4", "c4", &v4), 11, o)
    });
    step(&mut c, |c, o| {
        c.on_response(clusters("v5", "c5", &v5), 12, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_request(nack(CDS, "v3", "c5", "bad a"), 13, o)
    });
    assert_eq!(
        verdicts(&e),
        [("c4".into(), "superseded"), ("c5".into(), "nack")]
    );
    let e = step(&mut c, |c, o| {
        c.on_response(resp(EDS, "e4", "e4", &[("a", 9)]), 14, o)
    });
    assert!(warming(&e).is_empty(), "{e:?}");
}

#[test]
fn delta_cds_warms_what_it_carries_and_stream_end_decides_warming_pushes() {
    let mut c = correlator(Api::Delta);
    step(&mut c, |c, o| c.on_request(req(CDS, "", "", &[]), 1, o));
    let e = step(&mut c, |c, o| {
        c.on_response(clusters("", "d1", &[("a", 1, Some(""))]), 2, o)
    });
    assert!(warming(&e).is_empty(), "the client starts: nothing held");
    step(&mut c, |c, o| c.on_request(req(CDS, "", "d1", &[]), 3, o));
    // `a` again unchanged with a new `b`: only `b` warms.
    let both = [("a", 1, Some("")), ("b", 2, Some(""))];
    let e = step(&mut c, |c, o| {
        c.on_response(clusters("", "d2", &both), 4, o)
    });
    assert_eq!(warming(&e), [("d2".into(), vec!["b".into()])]);
    let e = step(&mut c, |c, o| c.on_stream_end(Some(14), "gone", 5, o));
    assert_eq!(verdicts(&e), [("d2".into(), "unanswered")]);
    assert_eq!(waiting_for(&e), ["b"]);
    assert!(c.warming.is_empty());
}

/// A Delta push whose resources carry versions: (name, digest, version).
fn versioned(version: &str, nonce: &str, list: &[(&str, u64, &str)]) -> Response {
    Response {
        type_url: CDS.into(),
        version_info: version.into(),
        nonce: nonce.into(),
        resources: (list.iter())
            .map(|(n, d, v)| ResourceRef {
                name: n.to_string(),
                version: Some(v.to_string()),
                digest: *d,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// A Delta client reconnecting with `stated` (name, version) pairs; its first request's
/// events.
fn delta_reconnect(c: &mut Correlator, node: &str, stated: &[(&str, &str)]) -> Vec<Event> {
    let mut first = as_node(node, req(CDS, "", "", &[]));
    first.initial_resource_versions = (stated.iter())
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    step(c, |c, o| c.on_request(first, 1, o))
}

/// The NACK's `changed` and `applied` lists.
fn nacked(events: &[Event]) -> (Vec<String>, Vec<String>) {
    match events {
        [Event::Verdict {
            verdict: Verdict::Nack {
                changed, applied, ..
            },
            ..
        }] => (changed.clone(), applied.clone()),
        other => panic!("{other:?}"),
    }
}

/// A Delta client that reconnects stating, of every resource, the version its last stream
/// through this tap ended with runs what it ran, by content: a control plane that pushes every
/// resource again (as a full Delta push does) with one bad is blamed for that one alone, and a
/// partial NACK applies nothing that did not change. Stating a version the tap did not see, or
/// a resource it does not know, it is not known, and every resource pushed counts as changed.
#[test]
fn a_reconnecting_delta_client_runs_what_its_last_stream_ended_with() {
    let ledger = Arc::new(Ledger::default());
    let mut c = correlator(Api::Delta).with_ledger(ledger.clone());
    step(&mut c, |c, o| {
        c.on_request(as_node("n", req(CDS, "", "", &[])), 0, o)
    });
    let v1 = [("a", 1, "va1"), ("b", 2, "vb1")];
    step(&mut c, |c, o| {
        c.on_response(versioned("v1", "d1", &v1), 0, o)
    });
    step(&mut c, |c, o| c.on_request(req(CDS, "", "d1", &[]), 0, o));
    // A removal and an update, then the end.
    let mut v2 = versioned("v2", "d2", &[("a", 3, "va2")]);
    v2.removed = vec!["b".into()];
    step(&mut c, |c, o| c.on_response(v2, 0, o));
    step(&mut c, |c, o| c.on_request(req(CDS, "", "d2", &[]), 0, o));
    step(&mut c, |c, o| c.on_stream_end(None, "gone", 0, o));
    assert_eq!(ledger.entries(), 1);

    let full = [("a", 3, "va2"), ("x", 9, "vx1")];
    let mut c = correlator(Api::Delta).with_ledger(ledger.clone());
    let e = delta_reconnect(&mut c, "n", &[("a", "va2")]);
    assert!(matches!(&e[..], [Event::Resubscribe { versions, .. }] if versions.len() == 1));
    step(&mut c, |c, o| {
        c.on_response(versioned("v3", "r1", &full), 2, o)
    });
    let e = step(&mut c, |c, o| {
        c.on_request(nack(CDS, "", "r1", "no good"), 3, o)
    });
    assert_eq!(nacked(&e), (vec!["x".into()], vec![]));

    // Partial: `x` rejected by name; `a` is what ran, so nothing applied.
    let mut c = correlator(Api::Delta).with_ledger(ledger.clone());
    delta_reconnect(&mut c, "n", &[("a", "va2")]);
    step(&mut c, |c, o| {
        c.on_response(versioned("v3", "r1", &full), 2, o)
    });
    let msg = "Error adding/updating cluster(s) x: malformed IP address: not-an-ip";
    let e = step(&mut c, |c, o| c.on_request(nack(CDS, "", "r1", msg), 3, o));
    assert_eq!(nacked(&e), (vec!["x".into()], vec![]));

    // A version it did not end with, a resource it did not have, another node, a version
    // left empty: not known.
    let unknown: [(&str, &[(&str, &str)]); 4] = [
        ("n", &[("a", "va1")]),
        ("n", &[("a", "va2"), ("b", "vb1")]),
        ("m", &[("a", "va2")]),
        ("n", &[("a", "")]),
    ];
    for (node, stated) in unknown {
        let mut c = correlator(Api::Delta).with_ledger(ledger.clone());
        delta_reconnect(&mut c, node, stated);
        step(&mut c, |c, o| {
            c.on_response(versioned("v3", "r1", &full), 2, o)
        });
        let e = step(&mut c, |c, o| {
            c.on_request(nack(CDS, "", "r1", "no good"), 3, o)
        });
        let changed = nacked(&e).0;
        assert_eq!(changed, ["a", "x"], "{node} {stated:?}");
    }
}

/// The ledger keeps at most its bound of Delta resources, the entries recorded longest ago
/// going first; a set larger than the bound is not kept, nor what that node had before.
#[test]
fn the_ledgers_delta_resources_are_bounded() {
    let ledger = Ledger::default();
    let each = ledger::MAX_DELTA_HELD / 4;
    let held: HashMap<String, Held> = (0..each)
        .map(|i| {
            (
                format!("r{i}"),
                Held {
                    digest: i as u64,
                    version: version_digest("v"),
                },
            )
        })
        .collect();
    for i in 0..5 {
        ledger.record_delta(&format!("node-{i}"), CDS, &held);
    }
    let stated = vec![("r7".to_string(), "v".to_string())];
    assert!(
        ledger.recall_delta("node-0", CDS, &stated).is_none(),
        "the oldest went"
    );
    assert_eq!(ledger.entries(), 4);
    let Some(Accepted::Digests(had)) = ledger.recall_delta("node-4", CDS, &stated) else {
        panic!("the newest is kept");
    };
    assert_eq!(had["r7"].digest, 7);
    let too_many: HashMap<String, Held> = (0..=ledger::MAX_DELTA_HELD)
        .map(|i| {
            (
                format!("r{i}"),
                Held {
                    digest: 0,
                    version: 0,
                },
            )
        })
        .collect();
    ledger.record_delta("node-4", CDS, &too_many);
    assert!(ledger.recall_delta("node-4", CDS, &stated).is_none());
    assert_eq!(ledger.entries(), 3);
}
