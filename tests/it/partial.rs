//! What a NACK leaves running, per resource, with real Envoys (SotW and Delta ADS, one tap):
//! a push that changes `a` validly, breaks `b` at add time (a STATIC address that is no IP) and
//! adds `c` is NACKed, yet Envoy runs v2's `a` and `c`; a proto-validation failure rejects a
//! whole push; the fix and a removal land. After every step the tap's CSDS says, resource by
//! resource, the version whose content Envoy runs, compared by content with Envoy's own
//! config_dump (not by Envoy's version labels); `/status` tells a partial NACK from a whole one
//! and names what was rejected and what applied. The same for listeners: a valid change to
//! `l1` lands while `l2`, with two identical filter chains, is rejected. A control plane that
//! pushes rejected content again and again is counted as a resend loop. `nack_forms`: EDS and
//! RDS add-time errors, whose scope is unknown; `ttl`: TTLs and heartbeats; `warming`: listeners
//! that wait for the routes and secrets they name.

use crate::support;

mod nack_forms;
mod ttl;
mod warming;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::address;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use prost::Message;
use serde_json::Value;
use support::control_plane::ControlPlane;
use support::csds;
use support::envoy::{Envoy, Xds};
use support::resources::{
    any, listener, route, static_cluster, static_cluster_at, Snapshot, CDS, LDS, RDS,
};
use support::tap::{TapOptions, XdsTap};

const NODES: [(&str, bool); 2] = [("envoy-sotw", false), ("envoy-delta", true)];

/// What of a resource's content the test tells versions apart by.
type Content = String;

fn cluster_content(c: &Cluster) -> Content {
    let timeout = c
        .connect_timeout
        .as_ref()
        .map_or(0, |d| d.seconds * 1000 + i64::from(d.nanos) / 1_000_000);
    let host = (c.load_assignment.as_ref())
        .and_then(|l| l.endpoints.first())
        .and_then(|e| e.lb_endpoints.first())
        .and_then(|e| match &e.host_identifier {
            Some(lb_endpoint::HostIdentifier::Endpoint(e)) => e.address.as_ref(),
            _ => None,
        })
        .and_then(|a| match &a.address {
            Some(address::Address::SocketAddress(s)) => Some(s.address.clone()),
            _ => None,
        })
        .unwrap_or_default();
    format!("timeout {timeout}ms, host {host}")
}

fn listener_content(l: &Listener) -> Content {
    let limit = l
        .per_connection_buffer_limit_bytes
        .as_ref()
        .map_or(0, |v| v.value);
    format!("buffer {limit}, {} chains", l.filter_chains.len())
}

fn content(type_url: &str, any: &Any) -> Content {
    match type_url {
        CDS => cluster_content(&Cluster::decode(&*any.value).unwrap()),
        _ => listener_content(&Listener::decode(&*any.value).unwrap()),
    }
}

/// The same, read from Envoy's config_dump JSON.
fn dumped_content(type_url: &str, v: &Value) -> Content {
    match type_url {
        CDS => {
            let timeout = v["connect_timeout"].as_str().unwrap_or("0s");
            let ms = (timeout.trim_end_matches('s').parse::<f64>().unwrap() * 1000.0).round();
            let host = &v["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                ["address"]["socket_address"]["address"];
            format!("timeout {ms}ms, host {}", host.as_str().unwrap_or(""))
        }
        _ => format!(
            "buffer {}, {} chains",
            v["per_connection_buffer_limit_bytes"].as_u64().unwrap_or(0),
            v["filter_chains"].as_array().map_or(0, Vec::len)
        ),
    }
}

/// name -> content of what Envoy runs of `type_url`, from its config_dump.
async fn envoy_runs(envoy: &Envoy, type_url: &str) -> BTreeMap<String, Content> {
    let dump = envoy.config_dump().await;
    let mut out = BTreeMap::new();
    for c in dump["configs"].as_array().unwrap() {
        let kind = c["@type"].as_str().unwrap_or("");
        if type_url == CDS && kind.ends_with("ClustersConfigDump") {
            for d in c["dynamic_active_clusters"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let cluster = &d["cluster"];
                let name = cluster["name"].as_str().unwrap().to_string();
                out.insert(name, dumped_content(CDS, cluster));
            }
        }
        if type_url == LDS && kind.ends_with("ListenersConfigDump") {
            for d in c["dynamic_listeners"].as_array().into_iter().flatten() {
                // Active, or applied and waiting for its routes.
                let state = if d["active_state"].is_object() {
                    &d["active_state"]
                } else {
                    &d["warming_state"]
                };
                if let Some(l) = state["listener"].as_object() {
                    let name = d["name"].as_str().unwrap().to_string();
                    out.insert(name, dumped_content(LDS, &Value::Object(l.clone())));
                }
            }
        }
    }
    out
}

/// The content of the resource `name` that the tap says runs at `version`: SotW versions are
/// the snapshot's, Delta's the control plane's per-resource digest.
fn content_of(steps: &[Snapshot], type_url: &str, name: &str, version: &str) -> Option<Content> {
    let digest = |a: &Any| format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&a.value));
    steps.iter().find_map(|s| {
        let (_, any) = s.of(type_url).iter().find(|(n, _)| n == name)?;
        (s.version == version || digest(any) == version).then(|| content(type_url, any))
    })
}

/// name -> content of what the tap says `node` runs of `type_url` (CSDS), with each
/// resource's own client status and error.
fn tap_says(
    r: &envoy_types::pb::envoy::service::status::v3::ClientStatusResponse,
    node: &str,
    type_url: &str,
    steps: &[Snapshot],
) -> BTreeMap<String, Content> {
    let short = xdstap::xds::short_type(type_url);
    (csds::resources(csds::node(r, node)).into_iter())
        .filter(|((t, _), (version, ..))| t == short && !version.is_empty())
        .map(|((_, name), (version, ..))| {
            let c = content_of(steps, type_url, &name, &version)
                .unwrap_or_else(|| format!("unknown version {version}"));
            (name, c)
        })
        .collect()
}

/// Waits until, for every node, the tap's per-resource view of `type_url` equals what Envoy
/// runs, by content; returns the last CSDS answer.
async fn agree(
    tap: &XdsTap,
    envoys: &[Envoy],
    type_url: &str,
    steps: &[Snapshot],
    expect: &BTreeMap<&str, &str>,
) -> envoy_types::pb::envoy::service::status::v3::ClientStatusResponse {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = csds::fetch(&tap.admin).await;
        let mut all = true;
        let mut seen = Vec::new();
        for e in envoys {
            let envoy = envoy_runs(e, type_url).await;
            let tap = tap_says(&r, &e.node, type_url, steps);
            let wanted: BTreeMap<String, Content> = (expect.iter())
                .map(|(name, v)| {
                    let c = content_of(steps, type_url, name, v).unwrap();
                    (name.to_string(), c)
                })
                .collect();
            all &= envoy == tap && envoy == wanted;
            seen.push((e.node.clone(), envoy, tap, wanted));
        }
        if all {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "the tap's view never matched what Envoy runs (node, Envoy, tap, expected): \
             {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The answer each node gave to its push of `type_url` at `version`.
async fn answers(cp: &ControlPlane, type_url: &str, version: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for (node, _) in NODES {
        let a = support::eventually(20, &format!("{node}'s answer to {version}"), || {
            let sent = cp.sent();
            let push = (sent.iter()).find(|s| {
                s.type_url == type_url && s.version == version && s.node.as_deref() == Some(node)
            })?;
            cp.answer_to(&push.nonce)
        })
        .await;
        out.push(a.error.map(|(_, m)| m));
    }
    out
}

/// `/status`'s entry for `node`'s `short` type.
async fn status_of(tap: &XdsTap, node: &str, short: &str) -> Value {
    let (code, body) = support::http_get(&tap.admin, "/status").await;
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let n = (v["nodes"].as_array().unwrap().iter())
        .find(|n| n["id"] == node)
        .unwrap_or_else(|| panic!("no {node} in {v}"))
        .clone();
    (n["types"].as_array().unwrap().iter())
        .find(|t| t["type"] == short)
        .unwrap()
        .clone()
}

fn expect<'a>(pairs: &[(&'a str, &'a str)]) -> BTreeMap<&'a str, &'a str> {
    pairs.iter().copied().collect()
}

async fn start(first: Snapshot) -> (ControlPlane, XdsTap, Vec<Envoy>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp_addr = listener.local_addr().unwrap().to_string();
    let cp = ControlPlane::new(first);
    let _server = cp.serve(listener);
    let tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let mut envoys = Vec::new();
    for (node, delta) in NODES {
        envoys.push(Envoy::start(node, Xds::Tcp(tap.tap.addr.clone()), delta).await);
    }
    (cp, tap, envoys)
}

/// Envoy's message for `name`'s own part, as the tap should report it.
fn own_part(message: &str, form: &str, name: &str) -> String {
    let (_, rest) = message
        .split_once(&format!("{form} {name}: "))
        .unwrap_or_else(|| panic!("{message}"));
    rest.trim_end().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_a_nack_leaves_the_valid_part_running() {
    let port = 9;
    let snap = |v: &str, clusters: &[(String, Any)]| {
        let mut s = Snapshot::new(v);
        for c in clusters {
            s = s.with(CDS, c.clone());
        }
        s
    };
    let ok = |n: &str, ms: i64| (n.to_string(), static_cluster(n, ms, port));
    let steps = [
        snap("1", &[ok("a", 1000), ok("b", 1000)]),
        // a changes validly, b fails as Envoy adds it, c is new.
        snap(
            "2",
            &[
                ok("a", 2000),
                ("b".into(), static_cluster_at("b", 1000, "not-an-ip", port)),
                ok("c", 1000),
            ],
        ),
        // a fails proto validation: the whole push is rejected.
        snap("3", &[ok("a", 0), ok("b", 1500), ok("c", 1000)]),
        // The fix.
        snap("4", &[ok("a", 3000), ok("b", 1750), ok("c", 1000)]),
        // c removed.
        snap("5", &[ok("a", 3000), ok("b", 1750)]),
    ];
    let (cp, tap, envoys) = start(steps[0].clone()).await;
    let steps_so_far = |k: usize| &steps[..=k];

    assert_eq!(answers(&cp, CDS, "1").await, [None, None]);
    agree(
        &tap,
        &envoys,
        CDS,
        steps_so_far(0),
        &expect(&[("a", "1"), ("b", "1")]),
    )
    .await;

    cp.set(steps[1].clone());
    let said = answers(&cp, CDS, "2").await;
    let message = said[0].clone().expect("Envoy rejects v2");
    assert!(
        message.starts_with("Error adding/updating cluster(s) b: "),
        "{message}"
    );
    assert!(
        said[1]
            .as_ref()
            .is_some_and(|m| m.contains("cluster(s) b: ")),
        "{said:?}"
    );
    let r = agree(
        &tap,
        &envoys,
        CDS,
        steps_so_far(1),
        &expect(&[("a", "2"), ("b", "1"), ("c", "2")]),
    )
    .await;
    for (i, (node, _)) in NODES.iter().enumerate() {
        let seen = csds::resources(csds::node(&r, node));
        let b = &seen[&("CDS".to_string(), "b".to_string())];
        assert_eq!(b.2, ClientResourceStatus::Nacked, "{node}: {seen:#?}");
        let message = said[i].as_deref().unwrap();
        assert_eq!(
            b.3,
            own_part(message, "cluster(s)", "b"),
            "{node}: b's own part of Envoy's message"
        );
        for name in ["a", "c"] {
            let s = &seen[&("CDS".to_string(), name.to_string())];
            assert_eq!(s.2, ClientResourceStatus::Acked, "{node} {name}: {seen:#?}");
        }
        let t = status_of(&tap, node, "CDS").await;
        assert_eq!(t["state"], "NACKED", "{t}");
        assert_eq!(t["nack"]["scope"], "PARTIAL", "{t}");
        assert_eq!(t["nack"]["rejected"], serde_json::json!(["b"]), "{t}");
        assert_eq!(t["nack"]["applied"], serde_json::json!(["a", "c"]), "{t}");
        // One node's resources over HTTP: what CSDS says, as JSON.
        let (code, body) = support::http_get(&tap.admin, &format!("/status?node={node}")).await;
        assert_eq!(code, 200);
        let v: Value = serde_json::from_str(&body).unwrap();
        let listed: Vec<(String, String)> = (v["nodes"][0]["resources"].as_array().unwrap())
            .iter()
            .filter(|r| r["type"] == "CDS")
            .map(|r| {
                (
                    r["name"].as_str().unwrap().into(),
                    r["client"].as_str().unwrap().into(),
                )
            })
            .collect();
        let want = [("a", "ACKED"), ("b", "NACKED"), ("c", "ACKED")];
        let want: Vec<(String, String)> = (want.iter())
            .map(|(n, c)| (n.to_string(), c.to_string()))
            .collect();
        assert_eq!(listed, want, "{body}");
    }
    // The same for people: one line per resource, with b's own reason; exit 1 for the NACK.
    let (code, out, err) = support::xdstap(&[
        "status",
        "--admin",
        &tap.admin,
        "--node",
        "envoy-sotw",
        "--resources",
    ])
    .await;
    assert_eq!(code, 1, "{out}{err}");
    let line = |name: &str| {
        (out.lines())
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
    };
    assert_eq!(line("a").as_deref(), Some("CDS a 2 ACKED"), "{out}");
    assert_eq!(line("b").as_deref(), Some("CDS b 1 NACKED"), "{out}");
    assert_eq!(line("c").as_deref(), Some("CDS c 2 ACKED"), "{out}");
    // Which nodes run v2's b (none: both rejected it) and v2's a (the SotW node; Delta
    // resources carry their own versions).
    let (code, out, _) =
        support::xdstap(&["rollout", "--admin", &tap.admin, "2", "--resource", "b"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("b from 2: run by 0 of 2 node(s), rejected by 2"),
        "{out}"
    );
    // `wait` fails on a partial NACK, saying what landed.
    let args = [
        "wait",
        "--admin",
        &tap.admin,
        "--version",
        "2",
        "--timeout",
        "10s",
    ];
    let (code, out, err) = support::xdstap(&args).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("CDS 2 partly rejected by 2 nodes (b rejected; a, c applied)"),
        "{out}"
    );
    let (code, out, _) =
        support::xdstap(&["rollout", "--admin", &tap.admin, "2", "--resource", "a"]).await;
    assert_eq!(code, 0, "{out}");
    let sotw = (out.lines()).find(|l| l.starts_with("envoy-sotw")).unwrap();
    assert!(sotw.contains("runs it"), "{out}");
    let (_, out, _) = support::xdstap(&[
        "status",
        "--admin",
        &tap.admin,
        "--node",
        "envoy-sotw",
        "--resources",
    ])
    .await;
    let b = (out.lines()).find(|l| l.contains(" b ")).unwrap();
    assert!(
        b.contains("malformed IP address: not-an-ip") && b.trim_end().ends_with("(rejected 2)"),
        "{b}"
    );

    cp.set(steps[2].clone());
    let said = answers(&cp, CDS, "3").await;
    for m in &said {
        let m = m.as_deref().expect("Envoy rejects v3");
        assert!(m.contains("Proto constraint validation failed"), "{m}");
    }
    agree(
        &tap,
        &envoys,
        CDS,
        steps_so_far(2),
        &expect(&[("a", "2"), ("b", "1"), ("c", "2")]),
    )
    .await;
    for (node, _) in NODES {
        let t = status_of(&tap, node, "CDS").await;
        assert_eq!(t["nack"]["scope"], "WHOLE", "{node}: {t}");
        assert_eq!(t["nack"]["applied"], serde_json::json!([]), "{node}: {t}");
    }

    cp.set(steps[3].clone());
    assert_eq!(answers(&cp, CDS, "4").await, [None, None]);
    agree(
        &tap,
        &envoys,
        CDS,
        steps_so_far(3),
        &expect(&[("a", "4"), ("b", "4"), ("c", "4")]),
    )
    .await;

    cp.set(steps[4].clone());
    assert_eq!(answers(&cp, CDS, "5").await, [None, None]);
    agree(
        &tap,
        &envoys,
        CDS,
        steps_so_far(4),
        &expect(&[("a", "5"), ("b", "5")]),
    )
    .await;
    for (node, _) in NODES {
        assert_eq!(status_of(&tap, node, "CDS").await["state"], "SYNCED");
    }
    tap.close().await;
}

/// Listener `name` with `buffer` bytes per connection, and its one filter chain twice when
/// `twice` (Envoy rejects that as it adds the listener).
fn a_listener(name: &str, port: u16, buffer: u32, twice: bool) -> (String, Any) {
    let mut l = Listener::decode(&*listener(name, "local").1.value).unwrap();
    if let Some(address::Address::SocketAddress(s)) =
        l.address.as_mut().and_then(|a| a.address.as_mut())
    {
        s.port_specifier = Some(
            envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(
                u32::from(port),
            ),
        );
    }
    l.per_connection_buffer_limit_bytes = Some(UInt32Value { value: buffer });
    if twice {
        let chain = l.filter_chains[0].clone();
        l.filter_chains.push(chain);
    }
    (name.into(), any(&l))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_a_valid_change_lands_beside_a_rejected_listener() {
    let (p1, p2) = (free_port(), free_port());
    let snap = |v: &str, l1: u32, l2_twice: bool| {
        Snapshot::new(v)
            .with(CDS, ("a".into(), static_cluster("a", 1000, 9)))
            .with(LDS, a_listener("l1", p1, l1, false))
            .with(LDS, a_listener("l2", p2, 65536, l2_twice))
            .with(RDS, route("local", "a"))
    };
    let steps = [
        snap("1", 1 << 20, false),
        snap("2", 2 << 20, true),
        snap("3", 2 << 20, false),
    ];
    let (cp, tap, envoys) = start(steps[0].clone()).await;
    assert_eq!(answers(&cp, LDS, "1").await, [None, None]);
    agree(
        &tap,
        &envoys,
        LDS,
        &steps[..1],
        &expect(&[("l1", "1"), ("l2", "1")]),
    )
    .await;

    cp.set(steps[1].clone());
    let said = answers(&cp, LDS, "2").await;
    for m in &said {
        let m = m.as_deref().expect("Envoy rejects v2's l2");
        assert!(
            m.starts_with("Error adding/updating listener(s) l2: "),
            "{m}"
        );
    }
    let r = agree(
        &tap,
        &envoys,
        LDS,
        &steps[..2],
        &expect(&[("l1", "2"), ("l2", "1")]),
    )
    .await;
    for (i, (node, _)) in NODES.iter().enumerate() {
        let seen = csds::resources(csds::node(&r, node));
        let l2 = &seen[&("LDS".to_string(), "l2".to_string())];
        assert_eq!(l2.2, ClientResourceStatus::Nacked, "{node}: {seen:#?}");
        assert_eq!(
            l2.3,
            own_part(said[i].as_deref().unwrap(), "listener(s)", "l2")
        );
        let t = status_of(&tap, node, "LDS").await;
        assert_eq!(t["nack"]["scope"], "PARTIAL", "{t}");
        assert_eq!(t["nack"]["rejected"], serde_json::json!(["l2"]), "{t}");
        assert_eq!(t["nack"]["applied"], serde_json::json!(["l1"]), "{t}");
    }

    cp.set(steps[2].clone());
    assert_eq!(answers(&cp, LDS, "3").await, [None, None]);
    agree(
        &tap,
        &envoys,
        LDS,
        &steps[..3],
        &expect(&[("l1", "3"), ("l2", "3")]),
    )
    .await;
    tap.close().await;
}

/// A control plane that ignores NACKs (as go-control-plane does) pushes the rejected content
/// again and again: the tap counts each resend per node and type, in `/status`, `/metrics` and
/// `xdstap status`, and never counts a push of other content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_that_resends_rejected_content_is_a_resend_loop() {
    use support::scripted::{response, Scripted};
    let good = static_cluster("a", 1000, 9);
    let bad = static_cluster_at("b", 1000, "not-an-ip", 9);
    let cp = Scripted::default();
    cp.on_first(response(CDS, "1", "n1", vec![good.clone()]));
    cp.on_first(response(LDS, "1", "l1", vec![]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let _server = cp.serve(listener);
    let receiver = support::otlp::Receiver::grpc().await;
    let flags = [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--upstream",
        &upstream,
    ];
    let options = xdstap::config::Options::from_flags(flags).unwrap();
    let mut config = options.resolve().unwrap();
    config.spans = Some(xdstap::outputs::spans::SpanSettings {
        endpoint: Some(receiver.endpoint.clone()),
        protocol: xdstap::outputs::spans::Protocol::Grpc,
        interval: Duration::from_millis(100),
        ..Default::default()
    });
    let tap = XdsTap::with_config(config, vec![]).await;
    let _envoy = Envoy::start("looped", Xds::Tcp(tap.tap.addr.clone()), false).await;
    support::eventually(20, "the ACK of v1", || {
        cp.answers_to("n1")
            .first()
            .filter(|a| a.error.is_none())
            .cloned()
    })
    .await;
    // The rejected push, then five resends of the same content under new nonces.
    for k in 0..6 {
        let nonce = format!("r{k}");
        cp.send(vec![response(
            CDS,
            "2",
            &nonce,
            vec![good.clone(), bad.clone()],
        )])
        .await;
        let a = support::eventually(20, &format!("Envoy's answer to {nonce}"), || {
            cp.answers_to(&nonce).first().cloned()
        })
        .await;
        assert!(
            a.error.is_some_and(|m| m.contains("cluster(s) b: ")),
            "{nonce}"
        );
    }
    // The span of the first rejection says what it rejected and that nothing else changed.
    let span = support::eventually(20, "the span of r0", || {
        (receiver.spans().into_iter()).find(|s| s.text("xds.nonce").as_deref() == Some("r0"))
    })
    .await;
    assert_eq!(span.text("xds.nack_scope").as_deref(), Some("partial"));
    assert_eq!(span.strings("xds.rejected"), ["b"]);
    assert!(span.strings("xds.applied").is_empty());
    let resends = |t: &Value| t["rejected_resends"].as_u64();
    let t = status_of(&tap, "looped", "CDS").await;
    assert_eq!(resends(&t), Some(5), "{t}");
    assert_eq!(t["nack"]["scope"], "PARTIAL", "{t}");
    let (_, text) = support::http_get(&tap.admin, "/metrics").await;
    let metrics = support::prom::parse(&text).unwrap();
    assert_eq!(metrics.get("xdstap_rejected_resends_total", &[]), 5.0);
    let (code, out, _) = support::xdstap(&["status", "--admin", &tap.admin]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "looped CDS: the control plane pushed content the client had rejected again, 5 time(s)"
        ),
        "{out}"
    );
    // The fix is other content: no resend, and the count stays.
    cp.send(vec![response(CDS, "3", "fix", vec![good.clone()])])
        .await;
    support::eventually(20, "the ACK of the fix", || {
        cp.answers_to("fix")
            .first()
            .filter(|a| a.error.is_none())
            .cloned()
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let t = loop {
        let t = status_of(&tap, "looped", "CDS").await;
        if t["state"] == "SYNCED" || Instant::now() > deadline {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(t["state"], "SYNCED", "{t}");
    assert_eq!(resends(&t), Some(5), "{t}");
    tap.close().await;
}

/// A control plane's `resource_errors` (xRFC TP3) shown per resource until the resource
/// arrives: CSDS RECEIVED_ERROR with the control plane's message, in `/status` and under
/// `xdstap status`; a real Envoy takes the push all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_errors_from_the_control_plane_last_until_the_resource_arrives() {
    use envoy_types::pb::envoy::service::discovery::v3::{ResourceError, ResourceName};
    use envoy_types::pb::google::rpc::Status;
    use support::scripted::{response, Scripted};
    let a = static_cluster("a", 1000, 9);
    let x = static_cluster("x", 1000, 9);
    let cp = Scripted::default();
    cp.on_first(response(CDS, "1", "n1", vec![a.clone()]));
    cp.on_first(response(LDS, "1", "l1", vec![]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let _server = cp.serve(listener);
    let tap = XdsTap::start(TapOptions::new(&upstream)).await;
    let _envoy = Envoy::start("erred", Xds::Tcp(tap.tap.addr.clone()), false).await;
    let acked = |nonce: &'static str| {
        let cp = cp.clone();
        async move {
            let a = support::eventually(20, &format!("Envoy's answer to {nonce}"), || {
                cp.answers_to(nonce).first().cloned()
            })
            .await;
            assert_eq!(a.error, None, "{nonce}");
        }
    };
    acked("n1").await;
    let mut with_error = response(CDS, "2", "n2", vec![a.clone()]);
    with_error.resource_errors = vec![ResourceError {
        resource_name: Some(ResourceName {
            name: "x".into(),
            ..Default::default()
        }),
        error_detail: Some(Status {
            code: 5,
            message: "x: no such service in the registry".into(),
            details: vec![],
        }),
    }];
    cp.send(vec![with_error]).await;
    acked("n2").await;
    let x_of = |r: &envoy_types::pb::envoy::service::status::v3::ClientStatusResponse| {
        let seen = csds::resources(csds::node(r, "erred"));
        seen.get(&("CDS".to_string(), "x".to_string())).cloned()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let x_says = loop {
        let r = csds::fetch(&tap.admin).await;
        if let Some(x) = x_of(&r) {
            break x;
        }
        assert!(Instant::now() < deadline, "x never in CSDS: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(x_says.2, ClientResourceStatus::ReceivedError);
    assert_eq!(x_says.3, "x: no such service in the registry");
    let t = status_of(&tap, "erred", "CDS").await;
    assert_eq!(t["state"], "SYNCED", "{t}");
    assert_eq!(t["resource_errors"][0]["name"], "x", "{t}");
    assert_eq!(t["resource_errors"][0]["code"], 5, "{t}");
    let (_, out, _) = support::xdstap(&["status", "--admin", &tap.admin]).await;
    assert!(
        out.contains("erred CDS: the control plane reports an error for x since"),
        "{out}"
    );
    // A push without x keeps the error; the push that carries x ends it.
    cp.send(vec![response(CDS, "3", "n3", vec![a.clone()])])
        .await;
    acked("n3").await;
    let r = csds::fetch(&tap.admin).await;
    assert_eq!(
        x_of(&r).map(|x| x.2),
        Some(ClientResourceStatus::ReceivedError)
    );
    cp.send(vec![response(CDS, "4", "n4", vec![a.clone(), x.clone()])])
        .await;
    acked("n4").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = csds::fetch(&tap.admin).await;
        if x_of(&r).is_some_and(|x| x.2 == ClientResourceStatus::Acked && x.0 == "4") {
            break;
        }
        assert!(Instant::now() < deadline, "x never ACKED at 4: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t = status_of(&tap, "erred", "CDS").await;
    assert_eq!(t["resource_errors"], serde_json::json!([]), "{t}");
    tap.close().await;
}
