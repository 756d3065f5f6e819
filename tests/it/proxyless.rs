//! A real proxyless gRPC client (PyPI's grpcio 1.85, C-core, installed into `.grpc/` by the test
//! command) through the tap, SotW ADS: its channel to `xds:///svc` subscribes to the listener,
//! the clusters c1 and c2 its route splits between, and their endpoints. A push that changes c1
//! and makes c2 STATIC (a discovery type gRPC does not take) is NACKed in C-core's own words
//! naming c2 by its index; gRPC uses the valid c1 all the same (gRFC A46). The tap's view, per
//! resource (CSDS through envoy-types' client), equals the client's own CSDS.

use crate::support;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    route, route_action, route_match, weighted_cluster::ClusterWeight, Route, RouteAction,
    RouteConfiguration, RouteMatch, VirtualHost, WeightedCluster,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager, http_filter, HttpConnectionManager, HttpFilter,
};
use envoy_types::pb::google::protobuf::UInt32Value;
use support::control_plane::ControlPlane;
use support::csds;
use support::resources::{any, cluster, endpoints, static_cluster, Snapshot, CDS, EDS, LDS};
use support::tap::{TapOptions, XdsTap};

const NODE: &str = "grpc-client";

/// The listener a gRPC client resolves `xds:///svc` to: an API listener whose inline route
/// splits between clusters c1 and c2.
fn api_listener() -> (String, envoy_types::pb::google::protobuf::Any) {
    let weight = |name: &str| ClusterWeight {
        name: name.into(),
        weight: Some(UInt32Value { value: 50 }),
        ..Default::default()
    };
    let routes = RouteConfiguration {
        name: "svc-routes".into(),
        virtual_hosts: vec![VirtualHost {
            name: "svc".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix(String::new())),
                    ..Default::default()
                }),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(route_action::ClusterSpecifier::WeightedClusters(
                        WeightedCluster {
                            clusters: vec![weight("c1"), weight("c2")],
                            ..Default::default()
                        },
                    )),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let hcm = HttpConnectionManager {
        route_specifier: Some(http_connection_manager::RouteSpecifier::RouteConfig(routes)),
        http_filters: vec![HttpFilter {
            name: "router".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(
                any(&Router::default()),
            )),
            ..Default::default()
        }],
        ..Default::default()
    };
    let l = Listener {
        name: "svc".into(),
        api_listener: Some(ApiListener {
            api_listener: Some(any(&hcm)),
        }),
        ..Default::default()
    };
    ("svc".into(), any(&l))
}

/// The client's process; its standard input held open until the test ends.
struct Client {
    child: Child,
    csds: String,
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_client(dir: &std::path::Path, tap: &str) -> Client {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let site = root.join(".grpc");
    assert!(
        site.join("grpc").exists(),
        "no grpcio at {}: run scripts/test (it installs grpcio==1.85.1 there)",
        site.display()
    );
    let bootstrap = dir.join("bootstrap.json");
    let json = serde_json::json!({
        "xds_servers": [{
            "server_uri": tap,
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }],
        "node": {"id": NODE, "cluster": "proxyless"},
    });
    std::fs::write(&bootstrap, json.to_string()).unwrap();
    let mut child = Command::new("python3")
        .arg(root.join("tests/it/proxyless/client.py"))
        .arg("xds:///svc")
        .env("PYTHONPATH", &site)
        .env("GRPC_XDS_BOOTSTRAP", &bootstrap)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
    Client {
        child,
        csds: format!("127.0.0.1:{port}"),
    }
}

/// (type, name) -> (version, client status) of the CDS resources in a CSDS answer for `node`
/// (the client's own CSDS answers for itself alone).
fn clusters(
    r: &envoy_types::pb::envoy::service::status::v3::ClientStatusResponse,
    node: Option<&str>,
) -> BTreeMap<String, (String, String)> {
    let c = match node {
        Some(id) => csds::node(r, id),
        None => &r.config[0],
    };
    (csds::resources(c).into_iter())
        .filter(|((t, _), _)| t == "CDS")
        .map(|((_, name), (version, _, status, _))| {
            (name, (version, status.as_str_name().to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxyless_clients_own_csds_equals_the_taps_view() {
    let snapshot = |v: &str, c1_ms: i64, c2_static: bool| {
        let c2 = match c2_static {
            true => ("c2".to_string(), static_cluster("c2", 1000, 9)),
            false => cluster("c2", 1000),
        };
        Snapshot::new(v)
            .with(LDS, api_listener())
            .with(CDS, cluster("c1", c1_ms))
            .with(CDS, c2)
            .with(EDS, endpoints("c1", 9))
            .with(EDS, endpoints("c2", 9))
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(snapshot("1", 1000, false));
    let _server = cp.serve(listener);
    let tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let dir = support::TempDir::new("proxyless");
    let client = start_client(dir.path(), &tap.tap.addr);
    let answer = |version: &'static str| {
        let cp = cp.clone();
        async move {
            support::eventually(30, &format!("the client's answer to CDS {version}"), || {
                let sent = cp.sent();
                let push = (sent.iter())
                    .rev()
                    .find(|s| s.type_url == CDS && s.version == version)?;
                cp.answer_to(&push.nonce)
            })
            .await
        }
    };
    assert_eq!(answer("1").await.error, None, "gRPC takes v1");

    cp.set(snapshot("2", 2000, true));
    let nack = answer("2").await;
    let (_, message) = nack.error.expect("gRPC rejects c2");
    assert!(
        message.contains("resource index 1: c2: INVALID_ARGUMENT"),
        "C-core's own words: {message}"
    );

    // Both views settle: the client's own CSDS and the tap's, resource by resource.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (own, seen) = loop {
        let own = clusters(&csds::fetch(&client.csds).await, None);
        let seen = clusters(&csds::fetch(&tap.admin).await, Some(NODE));
        let wanted: BTreeMap<String, (String, String)> = [
            ("c1".to_string(), ("2".to_string(), "ACKED".to_string())),
            ("c2".to_string(), ("1".to_string(), "NACKED".to_string())),
        ]
        .into();
        if own == wanted && seen == own {
            break (own, seen);
        }
        assert!(
            Instant::now() < deadline,
            "the client's CSDS {own:?} and the tap's {seen:?} never both said {wanted:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(own, seen);
    let (_, body) = support::http_get(&tap.admin, &format!("/status?node={NODE}")).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cds = (v["nodes"][0]["types"].as_array().unwrap().iter())
        .find(|t| t["type"] == "CDS")
        .unwrap();
    assert_eq!(cds["nack"]["scope"], "partial", "{cds}");
    assert_eq!(cds["nack"]["rejected"], serde_json::json!(["c2"]), "{cds}");
    assert_eq!(cds["nack"]["applied"], serde_json::json!(["c1"]), "{cds}");
    drop(client);
    tap.close().await;
}
