//! A real proxyless gRPC client: PyPI's grpcio 1.85 (C-core), installed into `.grpc/` by the
//! test command, running `tests/it/proxyless/client.py`: its channel to `xds:///svc` subscribes
//! through the xDS server its bootstrap names, and it serves its own CSDS on a loopback port.
//! With the API listener such a client resolves `svc` to.

use std::process::{Child, Command, Stdio};

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

use super::resources::any;

/// The listener a gRPC client resolves `xds:///svc` to: an API listener whose inline route
/// splits between clusters c1 and c2.
pub fn api_listener() -> (String, envoy_types::pb::google::protobuf::Any) {
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

/// The client's process, killed when dropped; its standard input held open until then.
pub struct Client {
    child: Child,
    /// Its own CSDS server.
    pub csds: String,
}

impl Client {
    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client whose xDS server is `server` (host:port), as node `node`, its bootstrap in `dir`;
/// its standard error goes to `stderr`, with `env` set (`GRPC_TRACE`, say).
pub fn start(
    dir: &std::path::Path,
    server: &str,
    node: &str,
    stderr: Stdio,
    env: &[(&str, &str)],
) -> Client {
    let root = super::root();
    let site = root.join(".grpc");
    assert!(
        site.join("grpc").exists(),
        "no grpcio at {}: run scripts/test (it installs grpcio==1.85.1 there)",
        site.display()
    );
    let bootstrap = dir.join(format!("bootstrap-{node}.json"));
    let json = serde_json::json!({
        "xds_servers": [{
            "server_uri": server,
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }],
        "node": {"id": node, "cluster": "proxyless"},
    });
    std::fs::write(&bootstrap, json.to_string()).unwrap();
    let mut child = Command::new("python3")
        .arg(root.join("tests/it/proxyless/client.py"))
        .arg("xds:///svc")
        .env("PYTHONPATH", &site)
        .env("GRPC_XDS_BOOTSTRAP", &bootstrap)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("python3");
    let line =
        super::Lines::new(child.stdout.take().unwrap()).next(60, "the grpcio client's CSDS port");
    let port: u16 = line.trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
    Client {
        child,
        csds: format!("127.0.0.1:{port}"),
    }
}
