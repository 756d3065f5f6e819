//! What a real Envoy 1.40 says, and runs, when one EDS or RDS resource of a push fails as it is
//! added, over SotW and Delta ADS: three endpoints (`e2` with an address that is no IP) and three
//! route configurations (`r2` with two wildcard virtual hosts), each push changing the other two
//! validly. Envoy's messages name the route but not the endpoints, and what of the push lands
//! depends on which of Envoy's watches run before the failing one, so the tap reads both as
//! scope unknown, never "whole" nor "partial": the named resource is NACKED, the others UNKNOWN,
//! and nothing the tap says a resource runs is contradicted by what Envoy runs. Then the other
//! forms: a name twice in a CDS push, a resource of another type, an SDS certificate that does
//! not load.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support;
use crate::support::csds;
use crate::support::envoy::{Envoy, Xds};
use crate::support::resources::{any, cluster, endpoints, listener, route, CDS, EDS, LDS, RDS};
use crate::support::scripted::{delta_response, response, Scripted};
use crate::support::tap::{TapOptions, XdsTap};
use envoy_types::pb::envoy::admin::v3::ClientResourceStatus as Client;
use envoy_types::pb::envoy::config::core::v3::address;
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use serde_json::Value;

const NAMES: [&str; 3] = ["1", "2", "3"];

/// Endpoints of `name` whose one address is no IP: valid protobuf, rejected when added.
fn bad_endpoints(name: &str) -> Any {
    let mut c = ClusterLoadAssignment::decode(&*endpoints(name, 9).1.value).unwrap();
    if let Some(lb_endpoint::HostIdentifier::Endpoint(e)) =
        &mut c.endpoints[0].lb_endpoints[0].host_identifier
    {
        if let Some(address::Address::SocketAddress(s)) =
            e.address.as_mut().and_then(|a| a.address.as_mut())
        {
            s.address = "not-an-ip".into();
        }
    }
    any(&c)
}

/// Routes `name` with two virtual hosts for `*`: valid protobuf, rejected when added.
fn bad_routes(name: &str) -> Any {
    let mut r = RouteConfiguration::decode(&*route(name, "e1").1.value).unwrap();
    let mut again = r.virtual_hosts[0].clone();
    again.name = "again".into();
    r.virtual_hosts.push(again);
    any(&r)
}

/// Version `v` of each type: endpoints on port 9 (v1) or 10 (v2), routes to `e1` or `e2`.
fn resources(type_url: &str, v: &str) -> Vec<(String, Any)> {
    NAMES
        .iter()
        .map(|i| match (type_url, v, *i) {
            (CDS, _, _) => cluster(&format!("e{i}"), 1000),
            (LDS, _, _) => listener(&format!("L{i}"), &format!("r{i}")),
            (EDS, "2", "2") => ("e2".into(), bad_endpoints("e2")),
            (EDS, _, _) => endpoints(&format!("e{i}"), if v == "1" { 9 } else { 10 }),
            (RDS, "2", "2") => ("r2".into(), bad_routes("r2")),
            _ => route(&format!("r{i}"), if v == "1" { "e1" } else { "e2" }),
        })
        .collect()
}

fn delta(type_url: &str, nonce: &str, v: &str) -> DeltaDiscoveryResponse {
    let wrapped = (resources(type_url, v).into_iter())
        .map(|(name, a)| Resource {
            name,
            version: v.into(),
            resource: Some(a),
            ..Default::default()
        })
        .collect();
    DeltaDiscoveryResponse {
        system_version_info: v.into(),
        ..delta_response(type_url, nonce, wrapped, &[])
    }
}

fn sotw(
    type_url: &str,
    nonce: &str,
    v: &str,
) -> envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse {
    let any = resources(type_url, v).into_iter().map(|(_, a)| a).collect();
    response(type_url, v, nonce, any)
}

/// What Envoy runs, as the version whose content it is: endpoints by their port (from
/// `/clusters`), routes by the cluster they send to (from config_dump).
async fn envoy_runs(envoy: &Envoy) -> BTreeMap<String, &'static str> {
    let mut out = BTreeMap::new();
    for line in envoy.clusters().await.lines() {
        for i in NAMES {
            if line.starts_with(&format!("e{i}::127.0.0.1:")) && line.ends_with("::cx_active::0") {
                let v = if line.contains(":10::") { "2" } else { "1" };
                out.insert(format!("e{i}"), v);
            }
        }
    }
    let dump: Value = serde_json::from_str(&envoy.get("/config_dump").await).unwrap();
    for c in dump["configs"].as_array().unwrap() {
        for r in c["dynamic_route_configs"].as_array().into_iter().flatten() {
            let config = &r["route_config"];
            let to = &config["virtual_hosts"][0]["routes"][0]["route"]["cluster"];
            let v = if to == "e2" { "2" } else { "1" };
            out.insert(config["name"].as_str().unwrap().to_string(), v);
        }
    }
    out
}

/// The NACK message Envoy sent for `nonce`.
async fn nacked(cp: &Scripted, nonce: &str) -> String {
    let a = support::eventually(20, &format!("Envoy's answer to {nonce}"), || {
        cp.answers_to(nonce).first().cloned()
    })
    .await;
    a.error.unwrap_or_else(|| panic!("{nonce} was not NACKed"))
}

/// Runs the story over one API; returns what Envoy applied of each v2 (names at v2).
async fn story(node: &str, delta_api: bool) -> (Vec<String>, Vec<String>) {
    let cp = Scripted::default();
    for t in [CDS, EDS, LDS, RDS] {
        match delta_api {
            true => cp.on_first_delta(delta(t, &format!("{t}-1"), "1")),
            false => cp.on_first(sotw(t, &format!("{t}-1"), "1")),
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let _server = cp.serve(listener);
    let tap = XdsTap::start(TapOptions::new(&upstream)).await;
    let envoy = Envoy::start(node, Xds::Tcp(tap.tap.addr.clone()), delta_api).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while envoy_runs(&envoy).await.len() < 6 {
        assert!(Instant::now() < deadline, "v1 never ran: {}", envoy.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut applied = Vec::new();
    for (t, short, form) in [
        (EDS, "EDS", "malformed IP address: not-an-ip"),
        (
            RDS,
            "RDS",
            "Only a single wildcard domain is permitted in route r2",
        ),
    ] {
        let nonce = format!("{t}-2");
        match delta_api {
            true => cp.send_delta(vec![delta(t, &nonce, "2")]).await,
            false => cp.send(vec![sotw(t, &nonce, "2")]).await,
        }
        let message = nacked(&cp, &nonce).await;
        assert!(message.starts_with(form), "{short}: {message}");
        // The tap's answer, once it has seen the NACK.
        let nack = tap_nack(&tap, node, short, "2").await;
        assert_eq!(nack["scope"], "UNKNOWN", "{short}: {nack}");
        let prefix = if t == EDS { "e" } else { "r" };
        // Envoy's config_dump and the tap's CSDS, once they agree on what the tap claims runs.
        let (runs, seen) = support::eventually_async(10, "Envoy and the tap to agree", || async {
            let runs = envoy_runs(&envoy).await;
            let r = csds::fetch(&tap.admin).await;
            let seen = csds::resources(csds::node(&r, node));
            let agree = NAMES.iter().all(|i| {
                let name = format!("{prefix}{i}");
                match seen.get(&(short.to_string(), name.clone())) {
                    Some((version, _, Client::Acked | Client::Nacked, _)) => {
                        runs.get(&name).copied() == Some(version.as_str())
                    }
                    _ => true,
                }
            });
            agree.then_some((runs, seen))
        })
        .await;
        for i in NAMES {
            let name = format!("{prefix}{i}");
            let (version, _, client, _) = seen[&(short.to_string(), name.clone())].clone();
            let envoy_has = runs[&name];
            match client {
                // What the tap says runs, runs.
                Client::Acked | Client::Nacked => assert_eq!(version, envoy_has, "{short} {name}"),
                Client::Unknown => {}
                other => panic!("{short} {name}: {other:?}"),
            }
            // Only the resource the message names is NACKED; for the others nothing is claimed.
            let want = match (t, i) {
                (RDS, "2") => Client::Nacked,
                _ => Client::Unknown,
            };
            assert_eq!(client, want, "{short} {name}");
            if envoy_has == "2" {
                applied.push(name);
            }
        }
    }
    tap.close().await;
    let (eds, rds) = applied.into_iter().partition(|n| n.starts_with('e'));
    (eds, rds)
}

/// What lands of the valid part depends on the order of Envoy's watches, which the client alone
/// knows (measured here: over SotW none of the endpoints and one of the two valid routes; over
/// Delta no endpoints and both valid routes, and in another run the valid endpoints and no
/// route): no one scope fits, and the tap says unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eds_and_rds_add_time_errors_leave_an_unknown_part_running() {
    let (sotw_eds, sotw_rds) = story("forms-sotw", false).await;
    let (delta_eds, delta_rds) = story("forms-delta", true).await;
    eprintln!("applied: SotW EDS {sotw_eds:?} RDS {sotw_rds:?}; Delta EDS {delta_eds:?} RDS {delta_rds:?}");
}

/// The tap's NACK of `short` at `version` on `node`, once it has it.
async fn tap_nack(tap: &XdsTap, node: &str, short: &str, version: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = support::http_get(&tap.admin, &format!("/status?node={node}")).await;
        let v: Value = serde_json::from_str(&body).unwrap();
        let types = v["nodes"][0]["types"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let nack = types
            .iter()
            .find(|x| x["type"] == short)
            .map(|x| x["nack"].clone());
        if let Some(n) = nack.filter(|n| n["version"] == version) {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "no NACK of {short} {version} in {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Envoy's clusters: name -> connect timeout, by its config_dump.
async fn envoy_timeouts(envoy: &Envoy) -> BTreeMap<String, String> {
    let dump = envoy.config_dump().await;
    let mut out = BTreeMap::new();
    for c in dump["configs"].as_array().unwrap() {
        for d in c["dynamic_active_clusters"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let name = d["cluster"]["name"].as_str().unwrap().to_string();
            out.insert(
                name,
                d["cluster"]["connect_timeout"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    out
}

/// A name twice in one CDS push: Envoy runs the first copy and names the name; a resource of
/// another type in the push: nothing of it lands (whole), and the response Envoy quotes in its
/// message is not kept; an SDS certificate that does not load: Envoy's message names no
/// resource, so the scope is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_wrong_types_and_bad_certificates() {
    use crate::support::resources::{secret, static_cluster, SDS};
    let dir = support::TempDir::new("forms");
    let pki = support::certs::make(&dir.0);
    let (cert, key) = (
        std::fs::read_to_string(&pki.server_cert).unwrap(),
        std::fs::read_to_string(&pki.server_key).unwrap(),
    );
    let cp = Scripted::default();
    let c = |name: &str, ms: i64| static_cluster(name, ms, 9);
    cp.on_first(response(CDS, "1", "c1", vec![c("a", 1000), c("b", 1000)]));
    cp.on_first(response(LDS, "1", "l1", vec![]));
    cp.on_first(response(
        SDS,
        "1",
        "s1",
        vec![secret("cert", &cert, &key).1],
    ));
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let tap = XdsTap::start(TapOptions::new(&upstream)).await;
    let envoy = Envoy::start_sds("forms", Xds::Tcp(tap.tap.addr.clone()), "cert").await;
    let _ = support::eventually(20, "v1 of CDS answered", || {
        cp.answers_to("c1").first().cloned()
    })
    .await;
    // Duplicates: a changes, b goes, c twice (2 s, then 3 s).
    cp.send(vec![response(
        CDS,
        "2",
        "dup",
        vec![c("a", 2000), c("c", 2000), c("c", 3000)],
    )])
    .await;
    let message = nacked(&cp, "dup").await;
    assert_eq!(
        message,
        "Error adding/updating cluster(s) c: duplicate cluster c found"
    );
    let nack = tap_nack(&tap, "forms", "CDS", "2").await;
    assert_eq!(nack["scope"], "PARTIAL", "{nack}");
    assert_eq!(nack["rejected"], serde_json::json!(["c"]), "{nack}");
    let want: BTreeMap<String, String> = [("a", "2s"), ("c", "2s")]
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .into();
    assert_eq!(envoy_timeouts(&envoy).await, want);
    let r = csds::fetch(&tap.admin).await;
    let seen = csds::resources(csds::node(&r, "forms"));
    let cds: Vec<(String, String)> = (seen.iter())
        .filter(|((t, _), _)| t == "CDS")
        .map(|((_, n), r)| (n.clone(), r.0.clone()))
        .collect();
    // Both run version 2's content (c its first copy); b is gone.
    assert_eq!(
        cds,
        [("a".to_string(), "2".to_string()), ("c".into(), "2".into())]
    );
    // A listener in a CDS push: nothing lands.
    cp.send(vec![response(
        CDS,
        "3",
        "wrong",
        vec![c("a", 4000), listener("L", "r").1],
    )])
    .await;
    let message = nacked(&cp, "wrong").await;
    assert!(
        message.contains(" does not match the message-wide type URL "),
        "{message}"
    );
    assert!(
        message.contains("resources {"),
        "Envoy quotes the response: {message}"
    );
    let nack = tap_nack(&tap, "forms", "CDS", "3").await;
    assert_eq!(nack["scope"], "WHOLE", "{nack}");
    let kept = nack["message"].as_str().unwrap();
    assert!(
        kept.ends_with(
            "the message-wide type URL type.googleapis.com/envoy.config.cluster.v3.Cluster"
        ),
        "{kept}"
    );
    assert_eq!(envoy_timeouts(&envoy).await, want);
    // A certificate that does not load.
    let bad = "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n";
    cp.send(vec![response(
        SDS,
        "2",
        "bad-cert",
        vec![secret("cert", bad, &key).1],
    )])
    .await;
    let message = nacked(&cp, "bad-cert").await;
    assert_eq!(message, "Failed to load certificate chain from <inline>");
    let nack = tap_nack(&tap, "forms", "SDS", "2").await;
    assert_eq!(nack["scope"], "UNKNOWN", "{nack}");
    tap.close().await;
}

/// ECDS: a listener whose HTTP filter `buffer` takes its config from ECDS over ADS, pushed a
/// config of a type the filter does not take (Envoy names no resource: unknown), then one that
/// fails proto validation (whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecds_forms() {
    use envoy_types::pb::envoy::config::core::v3::{
        config_source, AggregatedConfigSource, ApiVersion, ConfigSource, ExtensionConfigSource,
        TypedExtensionConfig,
    };
    use envoy_types::pb::envoy::config::listener::v3::{filter, Listener};
    use envoy_types::pb::envoy::extensions::filters::http::buffer::v3::Buffer;
    use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        http_filter, HttpConnectionManager, HttpFilter,
    };
    use envoy_types::pb::google::protobuf::UInt32Value;
    use prost::Name;
    const ECDS: &str = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
    let mut l = Listener::decode(&*listener("L", "r1").1.value).unwrap();
    let Some(filter::ConfigType::TypedConfig(hcm_any)) =
        l.filter_chains[0].filters[0].config_type.as_mut()
    else {
        panic!()
    };
    let mut hcm = HttpConnectionManager::decode(&*hcm_any.value).unwrap();
    let ads = ConfigSource {
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        resource_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    };
    hcm.http_filters.insert(
        0,
        HttpFilter {
            name: "buffer".into(),
            config_type: Some(http_filter::ConfigType::ConfigDiscovery(
                ExtensionConfigSource {
                    config_source: Some(ads),
                    type_urls: vec![Buffer::type_url()],
                    ..Default::default()
                },
            )),
            ..Default::default()
        },
    );
    *hcm_any = any(&hcm);
    let ext = |typed: Any| {
        any(&TypedExtensionConfig {
            name: "buffer".into(),
            typed_config: Some(typed),
        })
    };
    let buffer = |bytes: Option<u32>| {
        any(&Buffer {
            max_request_bytes: bytes.map(|value| UInt32Value { value }),
        })
    };
    let cp = Scripted::default();
    cp.on_first(response(CDS, "1", "c1", vec![cluster("e1", 1000).1]));
    cp.on_first(response(EDS, "1", "e1", vec![endpoints("e1", 9).1]));
    cp.on_first(response(LDS, "1", "l1", vec![any(&l)]));
    cp.on_first(response(RDS, "1", "r1", vec![route("r1", "e1").1]));
    cp.on_first(response(ECDS, "1", "x1", vec![ext(buffer(Some(1024)))]));
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let tap = XdsTap::start(TapOptions::new(&upstream)).await;
    let _envoy = Envoy::start("ecds", Xds::Tcp(tap.tap.addr.clone()), false).await;
    let first = support::eventually(20, "Envoy's answer to x1", || {
        cp.answers_to("x1").first().cloned()
    })
    .await;
    assert_eq!(first.error, None);
    cp.send(vec![response(
        ECDS,
        "2",
        "x2",
        vec![ext(any(&Router::default()))],
    )])
    .await;
    let message = nacked(&cp, "x2").await;
    assert_eq!(
        message,
        "Error: filter config has type URL envoy.extensions.filters.http.router.v3.Router but \
         expect envoy.extensions.filters.http.buffer.v3.Buffer."
    );
    let nack = tap_nack(&tap, "ecds", "ECDS", "2").await;
    assert_eq!(nack["scope"], "UNKNOWN", "{nack}");
    cp.send(vec![response(ECDS, "3", "x3", vec![ext(buffer(None))])])
        .await;
    let message = nacked(&cp, "x3").await;
    assert!(
        message.contains("Proto constraint validation failed (BufferValidationError"),
        "{message}"
    );
    let nack = tap_nack(&tap, "ecds", "ECDS", "3").await;
    assert_eq!(nack["scope"], "WHOLE", "{nack}");
    tap.close().await;
}
