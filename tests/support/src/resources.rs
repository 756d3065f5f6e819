//! Real Envoy resources built with envoy-types: clusters (EDS over ADS), endpoints, listeners,
//! routes and secrets, plus a cluster Envoy really rejects (`connect_timeout: 0s`).

use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
use envoy_types::pb::envoy::config::core::v3::{
    address, api_config_source, config_source, data_source, grpc_service, socket_address, Address,
    AggregatedConfigSource, ApiConfigSource, ApiVersion, ConfigSource, DataSource, GrpcService,
    SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    route, route_action, route_match, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager, http_filter, HttpConnectionManager, HttpFilter, Rds,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, Secret, TlsCertificate,
};
use envoy_types::pb::google::protobuf::{Any, Duration};
use prost::{Message, Name};

pub const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const SDS: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// Push order, as istiod does it: clusters, their endpoints, listeners, routes, secrets.
pub const ORDER: [&str; 5] = [CDS, EDS, LDS, RDS, SDS];

pub fn any<M: Message + Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

fn ads() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        resource_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    }
}

fn socket(port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: "127.0.0.1".into(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// An EDS cluster fed over ADS. `connect_timeout_ms == 0` makes Envoy reject it.
pub fn cluster(name: &str, connect_timeout_ms: i64) -> (String, Any) {
    let c = Cluster {
        name: name.into(),
        connect_timeout: Some(Duration {
            seconds: connect_timeout_ms / 1000,
            nanos: ((connect_timeout_ms % 1000) * 1_000_000) as i32,
        }),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: String::new(),
        }),
        ..Default::default()
    };
    (name.into(), any(&c))
}

/// An EDS cluster whose endpoints come over a per-type stream of their own (SotW `GRPC` or
/// `DELTA_GRPC`) to the bootstrap's cluster `xds`: Envoy opens the stream when the cluster is
/// added and resets it when the cluster is removed.
pub fn per_type_cluster(name: &str, delta: bool) -> (String, Any) {
    let mut c = Cluster::decode(&*cluster(name, 1000).1.value).unwrap();
    let api_type = match delta {
        true => api_config_source::ApiType::DeltaGrpc,
        false => api_config_source::ApiType::Grpc,
    };
    let source = ApiConfigSource {
        api_type: api_type as i32,
        transport_api_version: ApiVersion::V3 as i32,
        grpc_services: vec![GrpcService {
            target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                grpc_service::EnvoyGrpc {
                    cluster_name: "xds".into(),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }],
        ..Default::default()
    };
    c.eds_cluster_config = Some(cluster::EdsClusterConfig {
        eds_config: Some(ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::ApiConfigSource(
                source,
            )),
            resource_api_version: ApiVersion::V3 as i32,
            ..Default::default()
        }),
        service_name: String::new(),
    });
    (name.into(), any(&c))
}

/// An EDS cluster fed over ADS whose endpoints Envoy waits for at most `fetch_timeout_ms`
/// (`initial_fetch_timeout`) before it takes the cluster without them.
pub fn warming_cluster(name: &str, fetch_timeout_ms: i64) -> (String, Any) {
    let mut c = Cluster::decode(&*cluster(name, 1000).1.value).unwrap();
    if let Some(eds) = c
        .eds_cluster_config
        .as_mut()
        .and_then(|e| e.eds_config.as_mut())
    {
        eds.initial_fetch_timeout = Some(Duration {
            seconds: fetch_timeout_ms / 1000,
            nanos: ((fetch_timeout_ms % 1000) * 1_000_000) as i32,
        });
    }
    (name.into(), any(&c))
}

/// A STATIC cluster with its endpoint inline: nothing to warm, so Envoy answers its push at
/// once. `connect_timeout_ms == 0` makes Envoy reject it.
pub fn static_cluster(name: &str, connect_timeout_ms: i64, port: u32) -> Any {
    static_cluster_at(name, connect_timeout_ms, "127.0.0.1", port)
}

/// A STATIC cluster whose one endpoint is `address:port`: an address that is no IP
/// (`not-an-ip`) passes proto validation and makes Envoy reject the cluster as it adds it.
pub fn static_cluster_at(name: &str, connect_timeout_ms: i64, address: &str, port: u32) -> Any {
    let mut assignment = load_assignment(name, port);
    if let Some(lb_endpoint::HostIdentifier::Endpoint(e)) =
        &mut assignment.endpoints[0].lb_endpoints[0].host_identifier
    {
        if let Some(address::Address::SocketAddress(s)) =
            e.address.as_mut().and_then(|a| a.address.as_mut())
        {
            s.address = address.into();
        }
    }
    let c = Cluster {
        name: name.into(),
        connect_timeout: Some(Duration {
            seconds: connect_timeout_ms / 1000,
            nanos: ((connect_timeout_ms % 1000) * 1_000_000) as i32,
        }),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32,
        )),
        load_assignment: Some(assignment),
        ..Default::default()
    };
    any(&c)
}

fn load_assignment(cluster: &str, port: u32) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: cluster.into(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: vec![LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(socket(port)),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub fn endpoints(cluster: &str, port: u32) -> (String, Any) {
    (cluster.into(), any(&load_assignment(cluster, port)))
}

/// An HTTP listener on an ephemeral loopback port whose routes come from RDS `route`.
pub fn listener(name: &str, route: &str) -> (String, Any) {
    let hcm = HttpConnectionManager {
        stat_prefix: name.into(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: Some(ads()),
            route_config_name: route.into(),
        })),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(
                any(&Router::default()),
            )),
            ..Default::default()
        }],
        ..Default::default()
    };
    let l = Listener {
        name: name.into(),
        address: Some(socket(0)),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    (name.into(), any(&l))
}

pub fn route(name: &str, cluster: &str) -> (String, Any) {
    let r = RouteConfiguration {
        name: name.into(),
        virtual_hosts: vec![VirtualHost {
            name: "all".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                        cluster.into(),
                    )),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    (name.into(), any(&r))
}

/// A TCP listener to `cluster` whose TLS certificate is the SDS secret `secret` (over ADS):
/// Envoy warms it until the secret comes.
pub fn tls_listener(name: &str, secret: &str, cluster: &str) -> (String, Any) {
    use envoy_types::pb::envoy::config::core::v3::{transport_socket, TransportSocket};
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        tcp_proxy, TcpProxy,
    };
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
    };
    let proxy = TcpProxy {
        stat_prefix: name.into(),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.into())),
        ..Default::default()
    };
    let tls = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![SdsSecretConfig {
                name: secret.into(),
                sds_config: Some(ads()),
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let l = Listener {
        name: name.into(),
        address: Some(socket(0)),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.tcp_proxy".into(),
                config_type: Some(filter::ConfigType::TypedConfig(any(&proxy))),
            }],
            transport_socket: Some(TransportSocket {
                name: "envoy.transport_sockets.tls".into(),
                config_type: Some(transport_socket::ConfigType::TypedConfig(any(&tls))),
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    (name.into(), any(&l))
}

/// A TLS certificate secret with an inline private key (the canary in secret-safety tests).
pub fn secret(name: &str, cert_pem: &str, key_pem: &str) -> (String, Any) {
    let inline = |s: &str| DataSource {
        specifier: Some(data_source::Specifier::InlineString(s.into())),
        ..Default::default()
    };
    let s = Secret {
        name: name.into(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline(cert_pem)),
            private_key: Some(inline(key_pem)),
            ..Default::default()
        })),
    };
    (name.into(), any(&s))
}

/// A snapshot: one version string and the resources of each type.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub version: String,
    pub resources: std::collections::BTreeMap<&'static str, Vec<(String, Any)>>,
}

impl Snapshot {
    pub fn new(version: &str) -> Self {
        Snapshot {
            version: version.into(),
            ..Default::default()
        }
    }
    pub fn with(mut self, type_url: &'static str, resource: (String, Any)) -> Self {
        self.resources.entry(type_url).or_default().push(resource);
        self
    }
    /// Clusters `a` and `b` (timeouts in ms; 0 is rejected), their endpoints on `port`, and
    /// listener `http` routing to `a`.
    pub fn standard(version: &str, a_timeout_ms: i64, b_timeout_ms: i64, port: u32) -> Self {
        Snapshot::new(version)
            .with(CDS, cluster("a", a_timeout_ms))
            .with(CDS, cluster("b", b_timeout_ms))
            .with(EDS, endpoints("a", port))
            .with(EDS, endpoints("b", port))
            .with(LDS, listener("http", "local"))
            .with(RDS, route("local", "a"))
    }
    pub fn of(&self, type_url: &str) -> &[(String, Any)] {
        self.resources
            .get(type_url)
            .map(|v| v.as_slice())
            .unwrap_or(&[])
    }
}
