//! Resources carrying the metadata control planes write into them to name the Kubernetes
//! objects they were made from, written as those control planes write it:
//! - istiod (istio/istio `pilot/pkg/networking/util/util.go`, `BuildConfigInfoMetadata` and
//!   `AddConfigInfoMetadata`; `pilot/pkg/networking/core/cluster_builder.go` for the
//!   `services` list): `filter_metadata["istio"]["config"]` =
//!   `/apis/networking.istio.io/v1/namespaces/NS/destination-rule/NAME` on a cluster,
//!   `.../virtual-service/NAME` on each route; `["istio"]["services"]` = a list of
//!   {host, name, namespace} on a cluster, `["istio"]["subset"]` its subset.
//! - Envoy Gateway (envoyproxy/gateway `internal/xds/translator`, documented in its
//!   "Metadata in XDS resources" design): `filter_metadata["envoy-gateway"]["resources"]` = a
//!   list of {kind, name, namespace, sectionName}: the Gateway and its listener on a virtual
//!   host, the HTTPRoute and its rule on a route.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::config::route::v3::{
    route, route_action, route_match, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost,
};
use envoy_types::pb::google::protobuf::{value, Any, BoolValue, ListValue, Struct, Value};
use prost::Message;

use super::resources::{any, static_cluster, static_cluster_at};

fn text(s: &str) -> Value {
    Value {
        kind: Some(value::Kind::StringValue(s.into())),
    }
}

fn object(fields: &[(&str, Value)]) -> Struct {
    Struct {
        fields: fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    }
}

fn list(items: Vec<Value>) -> Value {
    Value {
        kind: Some(value::Kind::ListValue(ListValue { values: items })),
    }
}

fn nested(s: Struct) -> Value {
    Value {
        kind: Some(value::Kind::StructValue(s)),
    }
}

fn metadata(filter: &str, s: Struct) -> Metadata {
    Metadata {
        filter_metadata: [(filter.to_string(), s)].into_iter().collect(),
        ..Default::default()
    }
}

/// istiod's path of an Istio config object.
fn istio_path(kind: &str, namespace: &str, name: &str) -> String {
    format!("/apis/networking.istio.io/v1/namespaces/{namespace}/{kind}/{name}")
}

/// An Istio outbound cluster for `subset` of `host` (service `service` in `namespace`), made
/// from DestinationRule `namespace/dr`, STATIC on `port`; `bad` gives it an address that is
/// no IP, which Envoy rejects as it adds the cluster.
pub fn istio_cluster(
    name: &str,
    (service, namespace, dr, subset): (&str, &str, &str, &str),
    port: u32,
    bad: bool,
) -> (String, Any) {
    let bytes = match bad {
        true => static_cluster_at(name, 1000, "not-an-ip", port),
        false => static_cluster(name, 1000, port),
    };
    let mut c = Cluster::decode(&*bytes.value).unwrap();
    let host = format!("{service}.{namespace}.svc.cluster.local");
    let svc = object(&[
        ("host", text(&host)),
        ("name", text(service)),
        ("namespace", text(namespace)),
    ]);
    c.metadata = Some(metadata(
        "istio",
        object(&[
            (
                "config",
                text(&istio_path("destination-rule", namespace, dr)),
            ),
            ("services", list(vec![nested(svc)])),
            ("subset", text(subset)),
        ]),
    ));
    (name.into(), any(&c))
}

/// A plain STATIC cluster with no metadata; `bad` as above.
pub fn plain_cluster(name: &str, port: u32, bad: bool) -> (String, Any) {
    let a = match bad {
        true => static_cluster_at(name, 1000, "not-an-ip", port),
        false => static_cluster(name, 1000, port),
    };
    (name.into(), a)
}

/// A route sending every path to `cluster`, named `name`, with `metadata`.
fn route_to(name: &str, prefix: &str, cluster: &str, metadata: Option<Metadata>) -> Route {
    Route {
        name: name.into(),
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix(prefix.into())),
            ..Default::default()
        }),
        action: Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.into())),
            ..Default::default()
        })),
        metadata,
        ..Default::default()
    }
}

/// Route configuration `name` as istiod builds it for a sidecar's port: one virtual host for
/// `host`, a route per (route name, prefix, cluster, VirtualService name), each route made from
/// its VirtualService in `namespace`. Clusters are validated (`validate_clusters`), so a route
/// to a cluster Envoy does not have is rejected: `route: unknown cluster 'X'`.
pub fn istio_routes(
    name: &str,
    host: &str,
    namespace: &str,
    routes: &[(&str, &str, &str, &str)],
) -> (String, Any) {
    let r = RouteConfiguration {
        name: name.into(),
        validate_clusters: Some(BoolValue { value: true }),
        virtual_hosts: vec![VirtualHost {
            name: format!("{host}:9080"),
            domains: vec![host.into()],
            routes: (routes.iter())
                .map(|(route, prefix, cluster, vs)| {
                    let config = istio_path("virtual-service", namespace, vs);
                    let m = metadata("istio", object(&[("config", text(&config))]));
                    route_to(route, prefix, cluster, Some(m))
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    (name.into(), any(&r))
}

/// Envoy Gateway's `resources` list of one object.
fn eg(kind: &str, namespace: &str, name: &str, section: &str) -> Metadata {
    let one = object(&[
        ("kind", text(kind)),
        ("name", text(name)),
        ("namespace", text(namespace)),
        ("sectionName", text(section)),
    ]);
    metadata(
        "envoy-gateway",
        object(&[("resources", list(vec![nested(one)]))]),
    )
}

/// A virtual host of Gateway `namespace/gateway`'s listener `section` for `domain`, with an
/// HTTPRoute's rule per (route namespace, route name, rule, cluster).
pub struct EgHost<'a> {
    pub gateway: (&'a str, &'a str),
    pub section: &'a str,
    pub domain: &'a str,
    pub routes: Vec<(&'a str, &'a str, &'a str, &'a str)>,
}

/// Route configuration `name` as Envoy Gateway builds it for a Gateway listener: a virtual host
/// per [`EgHost`] (its metadata the Gateway and listener), a route per HTTPRoute rule (its
/// metadata the HTTPRoute and rule), clusters validated as above.
pub fn eg_routes(name: &str, hosts: &[EgHost<'_>]) -> (String, Any) {
    let r = RouteConfiguration {
        name: name.into(),
        validate_clusters: Some(BoolValue { value: true }),
        virtual_hosts: (hosts.iter())
            .map(|h| {
                let (gw_ns, gw) = h.gateway;
                VirtualHost {
                    name: format!("{gw_ns}/{gw}/{}/{}", h.section, h.domain.replace('.', "_")),
                    domains: vec![h.domain.into()],
                    routes: (h.routes.iter())
                        .map(|(ns, route, rule, cluster)| {
                            let rname = format!("httproute/{ns}/{route}/rule/{rule}/match/0");
                            let m = eg("HTTPRoute", ns, route, rule);
                            route_to(&rname, "/", cluster, Some(m))
                        })
                        .collect(),
                    metadata: Some(eg("Gateway", gw_ns, gw, h.section)),
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    };
    (name.into(), any(&r))
}
