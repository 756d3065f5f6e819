//! From a NACK to the user's object, with real Envoys (SotW and Delta ADS, one tap) and a
//! control plane that writes metadata exactly as istiod and Envoy Gateway do
//! (`support/metadata.rs` cites their sources): a DestinationRule's cluster Envoy rejects as
//! it adds it (CDS, partial), a VirtualService's route to a cluster Envoy does not have (RDS),
//! an HTTPRoute rule's route to a missing cluster and two Gateway listeners with one domain
//! (Envoy Gateway's format), a cluster with no metadata. Each NACK names exactly the objects
//! behind it in `/status` (node detail and the per-object view, cleared once fixed), `xdstap
//! status`, `xdstap rollout`, `xdstap wait` (exit 1), `xdstap watch`, the event log, the spans
//! and the `xdstap_rejected_objects` metric.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support;
use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::metadata::{eg_routes, istio_cluster, istio_routes, plain_cluster, EgHost};
use support::otlp::Receiver;
use support::resources::{listener, Snapshot, CDS, LDS, RDS};
use support::tap::XdsTap;
use xdstap::config::{Protocol, SpanSettings};

const NODES: [(&str, bool); 2] = [("envoy-sotw", false), ("envoy-delta", true)];
const DR_CLUSTER: &str = "outbound|9080|v2|reviews.default.svc.cluster.local";
const MISSING: &str = "outbound|9080|v3|reviews.default.svc.cluster.local";
const EG_CLUSTER: &str = "httproute/default/backend/rule/0";
const GATEWAY: (&str, &str) = ("envoy-gateway-system", "eg");

/// What a version breaks.
#[derive(Clone, Copy, PartialEq)]
enum Breaks {
    Nothing,
    /// The DestinationRule's cluster (an address that is no IP) and the VirtualService's route
    /// (to a cluster Envoy does not have).
    IstioClusterAndRoute,
    /// The HTTPRoute rule's route (to a missing cluster) and the cluster with no metadata.
    RouteRuleAndPlainCluster,
    /// A second Gateway listener with the first one's domain.
    GatewayListeners,
}

fn snapshot(version: &str, breaks: Breaks) -> Snapshot {
    let port = 9;
    let dr = ("reviews", "default", "reviews", "v2");
    let reviews_to = match breaks {
        Breaks::IstioClusterAndRoute => MISSING,
        _ => DR_CLUSTER,
    };
    let rule_to = match breaks {
        Breaks::RouteRuleAndPlainCluster => "httproute/default/backend/rule/9",
        _ => EG_CLUSTER,
    };
    let mut hosts = vec![EgHost {
        gateway: GATEWAY,
        section: "http",
        domain: "www.example.com",
        routes: vec![("default", "backend", "canary", rule_to)],
    }];
    if breaks == Breaks::GatewayListeners {
        hosts.push(EgHost {
            gateway: GATEWAY,
            section: "https",
            domain: "www.example.com",
            routes: vec![("default", "backend", "canary", EG_CLUSTER)],
        });
    }
    Snapshot::new(version)
        .with(
            CDS,
            istio_cluster(DR_CLUSTER, dr, port, breaks == Breaks::IstioClusterAndRoute),
        )
        .with(
            CDS,
            plain_cluster("plain", port, breaks == Breaks::RouteRuleAndPlainCluster),
        )
        .with(CDS, plain_cluster(EG_CLUSTER, port, false))
        .with(LDS, listener("http", "istio-routes"))
        .with(LDS, listener("gw", "eg-routes"))
        .with(
            RDS,
            istio_routes(
                "istio-routes",
                "reviews.default.svc.cluster.local",
                "default",
                &[
                    ("reviews-v2", "/reviews", reviews_to, "reviews"),
                    ("ratings", "/ratings", "plain", "ratings"),
                ],
            ),
        )
        .with(RDS, eg_routes("eg-routes", &hosts))
}

/// Labels, sorted, to compare as sets.
fn set<S: AsRef<str>>(labels: &[S]) -> BTreeSet<String> {
    labels.iter().map(|l| l.as_ref().to_string()).collect()
}

struct Stage {
    tap: XdsTap,
    cp: ControlPlane,
    log: std::path::PathBuf,
    spans: Receiver,
    watch: support::Lines,
    /// What watch printed so far.
    watched: Vec<serde_json::Value>,
    _watcher: support::Child,
    _envoys: Vec<Envoy>,
    _dir: support::TempDir,
}

impl Stage {
    async fn start() -> Stage {
        let dir = support::TempDir::new("objects");
        let log = dir.path().join("events.jsonl");
        let (cp, cp_addr, _server) = ControlPlane::listening(snapshot("v1", Breaks::Nothing)).await;
        let spans = Receiver::grpc().await;
        let mut config = support::tap::config("127.0.0.1:0", &cp_addr);
        config.event_log = Some(log.clone());
        config.spans = Some(SpanSettings {
            endpoint: Some(spans.endpoint.clone()),
            protocol: Protocol::Grpc,
            interval: Duration::from_millis(100),
            ..Default::default()
        });
        let tap = XdsTap::with_config(config, vec![]).await;
        let (watcher, watch, _) = support::watching(
            &["--admin", &tap.admin, "--verdict", "nack", "-o", "json"],
            1,
        );
        let mut envoys = Vec::new();
        for (node, delta) in NODES {
            envoys.push(Envoy::start(node, Xds::Tcp(tap.tap.addr.clone()), delta).await);
        }
        let stage = Stage {
            tap,
            cp,
            log,
            spans,
            watch,
            watched: Vec::new(),
            _watcher: watcher,
            _envoys: envoys,
            _dir: dir,
        };
        for t in ["CDS", "LDS", "RDS"] {
            stage.answered("v1", t, "ack").await;
        }
        stage
    }

    /// Waits until every node answered `version` of `ty` with `verdict`.
    async fn answered(&self, version: &str, ty: &str, verdict: &str) {
        support::eventually(30, &format!("{ty} {version} {verdict} from both"), || {
            let records: Vec<serde_json::Value> = (std::fs::read_to_string(&self.log))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            NODES
                .iter()
                .all(|(node, _)| {
                    records.iter().any(|r| {
                        r["node"] == *node
                            && r["type"] == ty
                            && r["version"] == version
                            && r["verdict"] == verdict
                    })
                })
                .then_some(())
        })
        .await;
    }

    /// Checks that every view and output names exactly `want` behind each node's NACK of
    /// `version` of `ty`.
    async fn check(&mut self, version: &str, ty: &str, want: &[&str]) {
        self.answered(version, ty, "nack").await;
        let want = set(want);
        // The event log.
        let text = std::fs::read_to_string(&self.log).unwrap();
        for (node, _) in NODES {
            let r: serde_json::Value = (text.lines())
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|r| {
                    r["node"] == node
                        && r["type"] == ty
                        && r["version"] == version
                        && r["verdict"] == "nack"
                })
                .unwrap();
            let labels: Vec<String> = (r["objects"].as_array().into_iter().flatten())
                .map(|o| {
                    let section = o["section"].as_str().unwrap_or("");
                    let mut l = format!(
                        "{} {}/{}",
                        text_of(&o["kind"]),
                        text_of(&o["namespace"]),
                        text_of(&o["name"])
                    );
                    if !section.is_empty() {
                        l.push_str(&format!(" section {section}"));
                    }
                    l
                })
                .collect();
            assert_eq!(set(&labels), want, "event log, {node} {ty} {version}: {r}");
        }
        // /status: each node's NACK, and the per-object view.
        let report = support::status(&self.tap.admin).await;
        for (node, _) in NODES {
            let n = report.nodes.iter().find(|n| n.id == node).unwrap();
            let t = n.types.iter().find(|t| t.r#type == ty).unwrap();
            let nack = t
                .nack
                .as_ref()
                .unwrap_or_else(|| panic!("{node} {ty}: {t:?}"));
            assert_eq!(nack.version, version);
            let labels: Vec<String> = nack.objects.iter().map(|o| o.label()).collect();
            assert_eq!(set(&labels), want, "/status {node} {ty}");
            for o in &nack.objects {
                assert!(o.kubectl.starts_with("kubectl get "), "{o:?}");
            }
        }
        for label in &want {
            let r = (report.rejected_objects.iter())
                .find(|r| r.object.as_ref().is_some_and(|o| &o.label() == label))
                .unwrap_or_else(|| panic!("{label} not in {:?}", report.rejected_objects));
            assert_eq!(r.nodes, 2, "{label}: {r:?}");
            assert!(r.types.contains(&ty.to_string()), "{r:?}");
        }
        // The spans.
        for (node, _) in NODES {
            let span = support::eventually(20, &format!("{node} {ty} {version} nack span"), || {
                (self.spans.spans().into_iter()).find(|s| {
                    s.text("xds.node.id").as_deref() == Some(node)
                        && s.text("xds.type").as_deref() == Some(ty)
                        && s.text("xds.version").as_deref() == Some(version)
                        && s.text("xds.verdict").as_deref() == Some("nack")
                })
            })
            .await;
            assert_eq!(
                set(&span.strings("xds.objects")),
                want,
                "span of {node} {ty}"
            );
        }
        // `xdstap watch -o json`.
        let mine = |e: &serde_json::Value| e["type"] == ty && e["version"] == version;
        while self.watched.iter().filter(|e| mine(e)).count() < NODES.len() {
            let line = self
                .watch
                .next(20, &format!("watch's {ty} {version} NACKs"));
            self.watched.push(serde_json::from_str(&line).unwrap());
        }
        for e in self.watched.iter().filter(|e| mine(e)) {
            let labels: Vec<String> = (e["objects"].as_array().into_iter().flatten())
                .map(|o| {
                    serde_json::from_value::<xdstap::api::v1::Origin>(o.clone())
                        .unwrap()
                        .label()
                })
                .collect();
            assert_eq!(set(&labels), want, "watch: {e}");
        }
        // `xdstap rollout` and `xdstap wait` (exit 1 for the NACK), as people read them.
        let admin = self.tap.admin.clone();
        let (_, out, _) = support::xdstap(&["rollout", version, "-t", ty, "--admin", &admin]).await;
        for label in &want {
            assert!(
                out.contains(&format!("  {label}: rejected by 2 nodes (kubectl get ")),
                "rollout: {label}\n{out}"
            );
        }
        let args = [
            "wait",
            "--version",
            version,
            "-t",
            ty,
            "--timeout",
            "20s",
            "--admin",
            &admin,
        ];
        let (code, out, err) = support::xdstap(&args).await;
        assert_eq!(code, 1, "{out}{err}");
        match want.is_empty() {
            true => assert!(
                out.contains("[no object named in the metadata]"),
                "wait:\n{out}"
            ),
            false => {
                let listed: Vec<&str> = want.iter().map(String::as_str).collect();
                assert!(out.contains("[made from "), "wait:\n{out}");
                for label in listed {
                    assert!(out.contains(label), "wait: {label}\n{out}");
                }
            }
        }
    }

    /// The per-object view and the metric: exactly `want` rejected now.
    async fn rejected_now(&self, want: &[&str]) {
        let want = set(want);
        let report = support::status(&self.tap.admin).await;
        let now: Vec<String> = (report.rejected_objects.iter())
            .filter_map(|r| r.object.as_ref().map(|o| o.label()))
            .collect();
        assert_eq!(set(&now), want, "{:?}", report.rejected_objects);
        let (code, text) = support::http_get(&self.tap.admin, "/metrics").await;
        assert_eq!(code, 200);
        let metrics = support::prom::parse(&text).unwrap();
        assert_eq!(
            metrics.get("xdstap_rejected_objects", &[]),
            want.len() as f64
        );
        let (_, out, _) = support::xdstap(&["status", "--admin", &self.tap.admin]).await;
        for label in &want {
            assert!(
                out.contains(&format!("{label}: rejected by 2 node(s) since ")),
                "{out}"
            );
        }
        if want.is_empty() {
            assert!(!out.contains("Rejected now"), "{out}");
        }
    }
}

fn text_of(v: &serde_json::Value) -> &str {
    v.as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_nack_names_the_objects_behind_it() {
    let mut stage = Stage::start().await;
    stage.rejected_now(&[]).await;

    stage.cp.set(snapshot("v2", Breaks::IstioClusterAndRoute));
    let (dr, svc, vs) = (
        "DestinationRule default/reviews",
        "Service default/reviews",
        "VirtualService default/reviews",
    );
    stage.check("v2", "CDS", &[dr, svc]).await;
    // The route to the missing cluster, not the route beside it (VirtualService ratings).
    stage.check("v2", "RDS", &[vs]).await;
    stage.rejected_now(&[dr, svc, vs]).await;
    // What people read (shown with --nocapture; the README quotes it).
    let admin = stage.tap.admin.clone();
    for args in [vec!["status"], vec!["rollout", "v2", "-t", "CDS,RDS"]] {
        let (_, out, _) = support::xdstap(&[&args[..], &["--admin", &admin]].concat()).await;
        println!("$ xdstap {}\n{out}", args.join(" "));
    }

    stage
        .cp
        .set(snapshot("v3", Breaks::RouteRuleAndPlainCluster));
    stage.check("v3", "CDS", &[]).await;
    let rule = "HTTPRoute default/backend section canary";
    stage.check("v3", "RDS", &[rule]).await;
    let (_, out, _) = support::xdstap(&["status", "--admin", &stage.tap.admin]).await;
    assert!(
        out.lines()
            .any(|l| l.contains("CDS NACKED") && l.ends_with("[no object named in the metadata]")),
        "{out}"
    );
    stage.rejected_now(&[rule]).await;

    stage.cp.set(snapshot("v4", Breaks::GatewayListeners));
    let listeners = [
        "Gateway envoy-gateway-system/eg section http",
        "Gateway envoy-gateway-system/eg section https",
    ];
    stage.check("v4", "RDS", &listeners).await;
    // v4's clusters are all good again: the CDS NACK of v3 is answered by an ACK.
    stage.answered("v4", "CDS", "ack").await;
    stage.rejected_now(&listeners).await;

    // v5 changes the routes only. Its clusters mean what v4's did, so the control plane may
    // or may not push them again (a Struct's keys are encoded in a map's random order, so the
    // same metadata can be other bytes): only the routes' answer is waited for.
    stage.cp.set(snapshot("v5", Breaks::Nothing));
    stage.answered("v5", "RDS", "ack").await;
    stage.rejected_now(&[]).await;
    stage.tap.close().await;
}
