//! Attribution as the scanner reads it off the wire, one test per way it went wrong: resources
//! encoded byte by byte as control planes and patches write them, scanned as the tap scans a
//! push, and the objects read back from what the scanner kept.

use super::*;
use crate::xds::scan::{MessageKind, Scanner};
use crate::xds::wire::{bytes as field, uint};
use crate::xds::{Api, Message, CLUSTER, ROUTES};

/// A `google.protobuf.Value` holding a string.
fn string(s: &str) -> Vec<u8> {
    let mut v = Vec::new();
    field(&mut v, 3, s.as_bytes());
    v
}

/// A `Value` holding a list of values.
fn list(items: &[Vec<u8>]) -> Vec<u8> {
    let mut l = Vec::new();
    for i in items {
        field(&mut l, 1, i);
    }
    let mut v = Vec::new();
    field(&mut v, 6, &l);
    v
}

/// A `Value` holding null.
fn null() -> Vec<u8> {
    let mut v = Vec::new();
    uint(&mut v, 1, 0);
    v
}

/// A `google.protobuf.Struct` of `(key, Value)` fields, in this order.
fn structure(fields: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut s = Vec::new();
    for (k, v) in fields {
        let mut e = Vec::new();
        field(&mut e, 1, k.as_bytes());
        field(&mut e, 2, v);
        field(&mut s, 1, &e);
    }
    s
}

/// A `Value` holding a struct.
fn object_value(fields: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut v = Vec::new();
    field(&mut v, 5, &structure(fields));
    v
}

/// An `envoy.config.core.v3.Metadata` of `(filter, struct)` entries, in this order.
fn metadata(filters: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut m = Vec::new();
    for (name, s) in filters {
        let mut e = Vec::new();
        field(&mut e, 1, name.as_bytes());
        field(&mut e, 2, s);
        field(&mut m, 1, &e);
    }
    m
}

/// A Cluster named `name` with `metadata` (field 25).
fn cluster(name: &str, metadata: &[u8]) -> Vec<u8> {
    let mut c = Vec::new();
    field(&mut c, 1, name.as_bytes());
    field(&mut c, 25, metadata);
    c
}

/// A route named `name` sending to `to`, mirroring to `mirrors`, with `metadata`.
fn route(name: &str, to: &str, mirrors: &[&str], metadata: &[u8]) -> Vec<u8> {
    let mut action = Vec::new();
    field(&mut action, 1, to.as_bytes());
    for m in mirrors {
        let mut policy = Vec::new();
        field(&mut policy, 1, m.as_bytes());
        field(&mut action, 30, &policy);
    }
    let mut r = Vec::new();
    field(&mut r, 2, &action);
    field(&mut r, 4, metadata);
    field(&mut r, 14, name.as_bytes());
    r
}

/// A route configuration `name` of one virtual host holding `routes`.
fn route_configuration(name: &str, routes: &[Vec<u8>]) -> Vec<u8> {
    let mut vh = Vec::new();
    field(&mut vh, 1, b"vh");
    field(&mut vh, 2, b"reviews.default.svc.cluster.local");
    for r in routes {
        field(&mut vh, 3, r);
    }
    let mut rc = Vec::new();
    field(&mut rc, 1, name.as_bytes());
    field(&mut rc, 2, &vh);
    rc
}

/// A SotW response of resources of `type_url`, scanned as the tap scans a push: each
/// resource's origins, and how often a bound cut something.
fn scan(type_url: &str, resources: &[Vec<u8>]) -> (Vec<Option<Arc<Origins>>>, u32) {
    let mut msg = Vec::new();
    for r in resources {
        let mut any = Vec::new();
        field(&mut any, 1, type_url.as_bytes());
        field(&mut any, 2, r);
        field(&mut msg, 2, &any);
    }
    field(&mut msg, 4, type_url.as_bytes());
    field(&mut msg, 5, b"1");
    // Fed in small pieces, as frames cut it.
    let mut scanner = Scanner::new(MessageKind::Response(Api::Sotw), Some(msg.len() as u64));
    for piece in msg.chunks(7) {
        scanner.feed(piece);
    }
    let Ok(Message::Response(r)) = scanner.finish() else {
        panic!("the response scans");
    };
    let origins = (0..r.resources.len())
        .map(|i| r.resources.origins_of(i).cloned())
        .collect();
    (origins, r.origins_cut)
}

/// The labels of every object a resource's origins name.
fn labels(origins: &Option<Arc<Origins>>) -> Vec<String> {
    let Some(o) = origins else { return vec![] };
    (o.parts.iter())
        .flat_map(|p| p.objects.iter())
        .map(ObjectRef::label)
        .collect()
}

fn istio(config: &str) -> (&'static str, Vec<u8>) {
    ("istio", structure(&[("config", string(config))]))
}

const DR: &str = "/apis/networking.istio.io/v1/namespaces/default/destination-rule/reviews";

/// A route's mirror cluster is a cluster it sends to: Envoy's "unknown shadow cluster" names
/// the route that mirrors to it, not every route of the configuration.
#[test]
fn a_mirror_cluster_ties_its_route_to_the_message() {
    let vs = |name: &str| {
        metadata(&[istio(&format!(
            "/apis/networking.istio.io/v1/namespaces/default/virtual-service/{name}"
        ))])
    };
    let rc = route_configuration(
        "istio-routes",
        &[
            route("r1", "good", &[], &vs("ratings")),
            route("r2", "good", &["shadow"], &vs("reviews")),
        ],
    );
    let (origins, _) = scan(ROUTES, &[rc]);
    let message = "route: unknown shadow cluster 'shadow'";
    let mut out = Vec::new();
    behind(
        "istio-routes",
        origins[0].as_deref(),
        &Words::of(message),
        &mut out,
    );
    let named: Vec<String> = out.iter().map(|o| o.object.label()).collect();
    assert_eq!(named, ["VirtualService default/reviews"], "{out:?}");
    assert!(out[0].named);
}

/// Metadata of the wrong shape names nothing rather than an object with a part missing: a
/// list where a string belongs, a null namespace, no namespace for a namespaced kind.
#[test]
fn metadata_of_the_wrong_shape_names_no_object() {
    let services = |item: Vec<u8>| ("istio", structure(&[("services", list(&[item]))]));
    let eg = |fields: &[(&str, Vec<u8>)]| {
        let item = object_value(fields);
        ("envoy-gateway", structure(&[("resources", list(&[item]))]))
    };
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        (
            "a list where the namespace's string belongs",
            metadata(&[services(object_value(&[
                ("name", string("reviews")),
                ("namespace", list(&[string("default")])),
            ]))]),
            vec![],
        ),
        (
            "a null namespace",
            metadata(&[services(object_value(&[
                ("name", string("reviews")),
                ("namespace", null()),
            ]))]),
            vec![],
        ),
        (
            "the config path as a list",
            metadata(&[("istio", structure(&[("config", list(&[string(DR)]))]))]),
            vec![],
        ),
        (
            "a namespaced kind with no namespace",
            metadata(&[eg(&[
                ("kind", string("HTTPRoute")),
                ("name", string("backend")),
            ])]),
            vec![],
        ),
        (
            "a cluster-scoped kind needs none",
            metadata(&[eg(&[
                ("kind", string("GatewayClass")),
                ("name", string("eg")),
            ])]),
            vec!["GatewayClass eg"],
        ),
        (
            "the right shape",
            metadata(&[services(object_value(&[
                ("name", string("reviews")),
                ("namespace", string("default")),
            ]))]),
            vec!["Service default/reviews"],
        ),
    ];
    for (what, m, want) in cases {
        let (origins, _) = scan(CLUSTER, &[cluster("c", &m)]);
        assert_eq!(labels(&origins[0]), want, "{what}");
    }
}

/// Names are data a patch writes: a command is printed only where every word of it is a
/// Kubernetes name (so nothing in it can run when pasted), and a list shows a name that is not
/// plain quoted, so no name can pass for a second object.
#[test]
fn names_that_are_no_kubernetes_names_are_quoted_and_get_no_command() {
    let dr = |name: &str| {
        let path =
            format!("/apis/networking.istio.io/v1/namespaces/default/destination-rule/{name}");
        metadata(&[istio(&path)])
    };
    let hostile = ["x;touch${IFS}pwned", "$(reboot)", "a && b", "x`id`"];
    for name in hostile {
        let (origins, _) = scan(CLUSTER, &[cluster("c", &dr(name))]);
        let o = &origins[0].as_ref().unwrap().parts[0].objects[0];
        assert_eq!(o.kubectl(), None, "{name}");
        assert_eq!(
            o.label(),
            format!("DestinationRule default/{name:?}"),
            "{name}"
        );
    }
    // Envoy Gateway's names are free strings: one that reads as a second object is one
    // quoted word, so a list of labels joined by ", " cannot be read as two.
    let forged = "x, Service default/y";
    let item = object_value(&[
        ("kind", string("HTTPRoute")),
        ("name", string(forged)),
        ("namespace", string("default")),
    ]);
    let eg = metadata(&[("envoy-gateway", structure(&[("resources", list(&[item]))]))]);
    let (origins, _) = scan(CLUSTER, &[cluster("c", &eg)]);
    let o = &origins[0].as_ref().unwrap().parts[0].objects[0];
    assert_eq!(o.label(), "HTTPRoute default/\"x, Service default/y\"");
    assert_eq!(o.kubectl(), None);
    let (origins, _) = scan(CLUSTER, &[cluster("c", &dr("reviews"))]);
    let o = &origins[0].as_ref().unwrap().parts[0].objects[0];
    assert_eq!(
        o.kubectl().as_deref(),
        Some("kubectl get destinationrule.networking.istio.io reviews -n default -o yaml")
    );
    // A namespace that is no DNS label gets no command either.
    let path = "/apis/networking.istio.io/v1/namespaces/$(id)/destination-rule/reviews";
    let (origins, _) = scan(CLUSTER, &[cluster("c", &metadata(&[istio(path)]))]);
    let o = &origins[0].as_ref().unwrap().parts[0].objects[0];
    assert_eq!(
        (o.kubectl(), o.label()),
        (None, "DestinationRule \"$(id)\"/reviews".into())
    );
}

/// The `istio` and `envoy-gateway` entries are read whatever comes before them and however
/// large: another filter's 100 KB first, a 100 KB annotation inside the item, either order.
#[test]
fn objects_are_read_whatever_the_size_and_order_of_other_metadata() {
    let big = "x".repeat(100 << 10);
    let other = ("other.filter", structure(&[("blob", string(&big))]));
    let eg_item = object_value(&[
        ("annotations", object_value(&[("note", string(&big))])),
        ("kind", string("HTTPRoute")),
        ("name", string("backend")),
        ("namespace", string("default")),
        ("sectionName", string("rule-0")),
    ]);
    let eg = (
        "envoy-gateway",
        structure(&[("resources", list(&[eg_item]))]),
    );
    for (what, m) in [
        (
            "another filter's 100 KB first",
            metadata(&[other.clone(), istio(DR)]),
        ),
        ("the same after", metadata(&[istio(DR), other.clone()])),
        (
            "a 100 KB annotation in the item",
            metadata(&[other.clone(), eg.clone()]),
        ),
    ] {
        let (origins, cut) = scan(CLUSTER, &[cluster("c", &m)]);
        assert_eq!(labels(&origins[0]).len(), 1, "{what}");
        assert_eq!(cut, 0, "{what}");
    }
    let (origins, _) = scan(CLUSTER, &[cluster("c", &metadata(&[other, eg]))]);
    assert_eq!(
        labels(&origins[0]),
        ["HTTPRoute default/backend section rule-0"]
    );
}

/// A bound that is hit is counted: more strings than a metadata keeps.
#[test]
fn a_bound_hit_is_counted() {
    let items: Vec<Vec<u8>> = (0..40)
        .map(|i| {
            object_value(&[
                ("name", string(&format!("s{i}"))),
                ("namespace", string("default")),
            ])
        })
        .collect();
    let m = metadata(&[("istio", structure(&[("services", list(&items))]))]);
    let (origins, cut) = scan(CLUSTER, &[cluster("c", &m)]);
    assert!(cut > 0, "a cut of 80 strings to {MAX_FIELDS} is counted");
    assert_eq!(labels(&origins[0]).len(), MAX_OBJECTS);
}

/// The DestinationRule istiod generates from Gateway API backend policies names the Service
/// (or ServiceEntry) they target, not a DestinationRule no user wrote.
#[test]
fn a_generated_destination_rule_names_what_its_policies_target() {
    for (name, want) in [
        (
            "echo~istio-autogenerated-k8s-gateway",
            "Service default/echo (via its Gateway API backend policies)",
        ),
        (
            "external-service~external-example-com~istio-autogenerated-k8s-gateway",
            "ServiceEntry default/external-service (via its Gateway API backend policies)",
        ),
    ] {
        let path =
            format!("/apis/networking.istio.io/v1/namespaces/default/destination-rule/{name}");
        let (origins, _) = scan(CLUSTER, &[cluster("c", &metadata(&[istio(&path)]))]);
        assert_eq!(labels(&origins[0]), [want]);
        let o = &origins[0].as_ref().unwrap().parts[0].objects[0];
        assert_eq!(
            o.kubectl().as_deref(),
            Some("kubectl get backendtlspolicy.gateway.networking.k8s.io -n default -o yaml")
        );
    }
}

/// The objects a push changes against the last: those of the clusters it adds, changes by
/// content or leaves out; none for a push that repeats the last.
#[test]
fn a_push_changes_the_objects_of_what_it_adds_changes_or_removes() {
    let dr = |name: &str| {
        let path =
            format!("/apis/networking.istio.io/v1/namespaces/default/destination-rule/{name}");
        metadata(&[istio(&path)])
    };
    let set = |clusters: &[(&str, &str)]| {
        let resources: Vec<Vec<u8>> = (clusters.iter())
            .map(|(name, port)| {
                let mut c = cluster(name, &dr(name));
                // Other content, the same metadata.
                field(&mut c, 2, port.as_bytes());
                c
            })
            .collect();
        let mut msg = Vec::new();
        for r in &resources {
            let mut any = Vec::new();
            field(&mut any, 1, CLUSTER.as_bytes());
            field(&mut any, 2, r);
            field(&mut msg, 2, &any);
        }
        let mut scanner = Scanner::new(MessageKind::Response(Api::Sotw), Some(msg.len() as u64));
        scanner.feed(&msg);
        match scanner.finish() {
            Ok(Message::Response(r)) => r.resources,
            _ => panic!("the response scans"),
        }
    };
    let names =
        |c: Changed| -> Vec<String> { c.objects.iter().map(|o| o.name.to_string()).collect() };
    let v1 = set(&[("a", "1"), ("b", "1"), ("c", "1")]);
    assert_eq!(
        names(Changed::between(
            &v1,
            &set(&[("a", "1"), ("b", "1"), ("c", "1")])
        )),
        Vec::<String>::new()
    );
    assert_eq!(
        names(Changed::between(
            &v1,
            &set(&[("a", "1"), ("b", "2"), ("c", "1")])
        )),
        ["b"]
    );
    assert_eq!(
        names(Changed::between(
            &v1,
            &set(&[("a", "1"), ("b", "1"), ("c", "1"), ("d", "1")])
        )),
        ["d"]
    );
    assert_eq!(
        names(Changed::between(&v1, &set(&[("a", "1"), ("c", "1")]))),
        ["b"]
    );
    assert_eq!(
        names(Changed::between(&v1, &set(&[("a", "1"), ("b", "1")]))),
        ["c"]
    );
    // Reordered, the same content: nothing changed.
    assert_eq!(
        names(Changed::between(
            &v1,
            &set(&[("c", "1"), ("a", "1"), ("b", "1")])
        )),
        Vec::<String>::new()
    );
}
