mod support;
use std::time::Duration;
use support::envoy::{Envoy, Xds};
use support::resources::{listener, route, static_cluster, CDS, LDS, RDS};
use support::scripted::{response, Scripted};
use support::tap::{TapOptions, XdsTap};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lds() {
    let cp = Scripted::default();
    cp.on_first(response(CDS, "1", "c1", vec![static_cluster("a", 1000, 9)]));
    cp.on_first(response(
        LDS,
        "1",
        "l1",
        vec![listener("L1", "r1").1, listener("L2", "r2").1],
    ));
    cp.on_first(response(RDS, "1", "r1", vec![route("r2", "a").1]));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap().to_string();
    let _s = cp.serve(l);
    let tap = XdsTap::start(TapOptions::new(&up)).await;
    let envoy = Envoy::start("lds", Xds::Tcp(tap.tap.addr.clone()), false).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    dump(&envoy).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    for r in cp.requests() {
        eprintln!(
            "REQ {} {} {} {:?}",
            r.type_url.rsplit('.').next().unwrap(),
            r.version_info,
            r.response_nonce,
            r.error
        );
    }
    let v = envoy.config_dump().await;
    for c in v["configs"].as_array().unwrap() {
        for d in c["dynamic_listeners"].as_array().into_iter().flatten() {
            eprintln!(
                "L {} active={} warming={}",
                d["name"],
                d["active_state"].is_object(),
                d["warming_state"].is_object()
            );
        }
    }
    let (_, s) = support::http_get(&tap.admin, "/status?node=lds").await;
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    for t in v["nodes"][0]["types"].as_array().unwrap() {
        eprintln!("TAP {} {}", t["type"], t["state"]);
    }
    for t in v["nodes"][0]["resources"].as_array().unwrap() {
        eprintln!("RES {}", t);
    }
    tap.close().await;
}
async fn dump(envoy: &Envoy) {
    let v = envoy.config_dump().await;
    for c in v["configs"].as_array().unwrap() {
        for d in c["dynamic_listeners"].as_array().into_iter().flatten() {
            eprintln!(
                "EARLY L {} active={} warming={}",
                d["name"],
                d["active_state"].is_object(),
                d["warming_state"].is_object()
            );
        }
    }
}
