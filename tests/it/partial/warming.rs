//! Listeners that wait for what they name, with a real Envoy over SotW ADS: after start-up, a
//! listener naming routes (RDS) that were never pushed and one naming a TLS secret (SDS) not
//! pushed yet warm in Envoy's config_dump, and the tap says WARMING, naming what each waits
//! for, while the listeners that have all they need are ACKED; once the routes and the secret
//! come, both serve and the tap says ACKED. (Envoy's start-up, where one missing route keeps
//! every first listener warming, is not modelled: the tap judges each listener by its own.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support;
use crate::support::envoy::{Envoy, Xds};
use crate::support::resources::{
    listener, route, secret, static_cluster, tls_listener, CDS, LDS, RDS, SDS,
};
use crate::support::scripted::{response, Scripted};
use crate::support::tap::{TapOptions, XdsTap};

/// Each dynamic listener: warming (true) or active.
async fn envoy_listeners(envoy: &Envoy) -> BTreeMap<String, bool> {
    let dump = envoy.config_dump().await;
    let mut out = BTreeMap::new();
    for c in dump["configs"].as_array().unwrap() {
        for d in c["dynamic_listeners"].as_array().into_iter().flatten() {
            let warming = d["warming_state"].is_object() && !d["active_state"].is_object();
            out.insert(d["name"].as_str().unwrap().to_string(), warming);
        }
    }
    out
}

/// Each listener the tap lists: (warming, its error).
async fn tap_listeners(tap: &XdsTap, node: &str) -> BTreeMap<String, (bool, String)> {
    let (_, body) = support::http_get(&tap.admin, &format!("/status?node={node}")).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    (v["nodes"][0]["resources"].as_array().into_iter().flatten())
        .filter(|r| r["type"] == "LDS")
        .map(|r| {
            let warming = r["client"] == "WARMING";
            let error = r["error"].as_str().unwrap_or("").to_string();
            (r["name"].as_str().unwrap().to_string(), (warming, error))
        })
        .collect()
}

/// Waits until Envoy's listeners are `want` (name -> warming), then returns the tap's view.
async fn settle(
    envoy: &Envoy,
    tap: &XdsTap,
    want: &[(&str, bool)],
) -> BTreeMap<String, (bool, String)> {
    let want: BTreeMap<String, bool> = want.iter().map(|(n, w)| (n.to_string(), *w)).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let envoy_has = envoy_listeners(envoy).await;
        let tap_says = tap_listeners(tap, "warming").await;
        let tap_warming: BTreeMap<String, bool> =
            tap_says.iter().map(|(n, (w, _))| (n.clone(), *w)).collect();
        if envoy_has == want && tap_warming == want {
            return tap_says;
        }
        assert!(
            Instant::now() < deadline,
            "Envoy {envoy_has:?}, the tap {tap_says:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_warm_for_the_routes_and_secrets_they_name() {
    let cp = Scripted::default();
    let a = static_cluster("a", 1000, 9);
    cp.on_first(response(CDS, "1", "c1", vec![a]));
    cp.on_first(response(LDS, "1", "l1", vec![listener("L1", "r1").1]));
    cp.on_first(response(RDS, "1", "r1", vec![route("r1", "a").1]));
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = server.local_addr().unwrap().to_string();
    let _server = cp.serve(server);
    let tap = XdsTap::start(TapOptions::new(&upstream)).await;
    let envoy = Envoy::start("warming", Xds::Tcp(tap.tap.addr.clone()), false).await;
    settle(&envoy, &tap, &[("L1", false)]).await;
    // L2 names routes never pushed, L3 a secret not pushed yet.
    let v2 = vec![
        listener("L1", "r1").1,
        listener("L2", "r2").1,
        tls_listener("L3", "s3", "a").1,
    ];
    cp.send(vec![response(LDS, "2", "l2", v2)]).await;
    let says = settle(&envoy, &tap, &[("L1", false), ("L2", true), ("L3", true)]).await;
    assert_eq!(says["L2"].1, "warming: waits for RDS r2");
    assert_eq!(says["L3"].1, "warming: waits for SDS s3");
    assert_eq!(says["L1"].1, "");
    // The routes and the secret come: every listener serves.
    let dir = support::TempDir::new("warming");
    let pki = support::certs::make(&dir.0);
    let (cert, key) = (
        std::fs::read_to_string(&pki.server_cert).unwrap(),
        std::fs::read_to_string(&pki.server_key).unwrap(),
    );
    cp.send(vec![
        response(RDS, "2", "r2", vec![route("r1", "a").1, route("r2", "a").1]),
        response(SDS, "1", "s1", vec![secret("s3", &cert, &key).1]),
    ])
    .await;
    let says = settle(&envoy, &tap, &[("L1", false), ("L2", false), ("L3", false)]).await;
    assert!(says.values().all(|(_, e)| e.is_empty()), "{says:?}");
    tap.close().await;
}
