//! The shipped Prometheus rules against a real Prometheus (Debian's, installed by the test
//! command) scraping a real tap that carries a real Envoy: the scrape finds the tap up; a push
//! Envoy rejects makes `XdsConfigRejected` and `XdsObjectRejected` fire, and the fix resolves
//! them; every rule's expression and every PromQL query in docs/operating.md runs without error
//! and returns data. The rules' `for:` durations are cut to a second here (the same rules
//! otherwise, byte for byte), so firing takes seconds, not minutes; `promtool test rules` shows
//! the real durations (scripts/test runs it); each NACK alert names the tap (the scrape's
//! instance) and the command to run against it. The control plane's outage is played with the
//! rules as shipped, `for:` and intervals unchanged: its alert fires and ends within a minute
//! of the outage's start and end. Also: `promtool check config` accepts the scrape
//! configs shipped, plain and as the tier's ConfigMap, whose rules are the same text. Every
//! series the tap exports is in docs/operating.md's metrics table, and none has a per-node
//! label.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support;
use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::metadata::istio_cluster;
use support::resources::{Snapshot, CDS};
use support::tap::{TapOptions, XdsTap};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The shipped rules with every `for:` cut to one second.
fn quick_rules() -> String {
    let rules = std::fs::read_to_string(root().join("config/prometheus/rules.yml")).unwrap();
    let lines: Vec<String> = (rules.lines())
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 1s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_string(),
        })
        .collect();
    lines.join("\n") + "\n"
}

/// Every expression of the rules file: (name, expression).
fn rule_expressions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("config/prometheus/rules.yml")).unwrap();
    let rules: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    let mut out = Vec::new();
    for g in rules["groups"].as_sequence().unwrap() {
        for r in g["rules"].as_sequence().unwrap() {
            let name = (r["record"].as_str())
                .or(r["alert"].as_str())
                .unwrap()
                .to_string();
            out.push((name, r["expr"].as_str().unwrap().to_string()));
        }
    }
    out
}

/// Every line of the ```promql blocks of docs/operating.md.
fn documented_queries() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("docs/operating.md")).unwrap();
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        match (inside, line.trim()) {
            (false, "```promql") => inside = true,
            (true, "```") => inside = false,
            (true, q) if !q.is_empty() && !q.starts_with('#') => out.push(q.to_string()),
            _ => {}
        }
    }
    out
}

/// A Prometheus server of our own on a loopback port.
struct Prometheus {
    _child: support::Child,
    addr: String,
    dir: support::TempDir,
}

impl Prometheus {
    /// Scraping the tap every second, with the rules' `for:` cut to a second.
    async fn start(tap_admin: &str) -> Prometheus {
        Prometheus::start_with(tap_admin, &quick_rules(), "1s").await
    }

    /// Scraping and evaluating every `interval`, with `rules`.
    async fn start_with(tap_admin: &str, rules: &str, interval: &str) -> Prometheus {
        let dir = support::TempDir::new("prometheus");
        std::fs::write(dir.path().join("rules.yml"), rules).unwrap();
        let config = format!(
            "global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n\
             rule_files:\n- rules.yml\n\
             scrape_configs:\n- job_name: xdstap\n  static_configs:\n  - targets: ['{tap_admin}']\n"
        );
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let addr = support::free_addr();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("run prometheus (scripts/install-prometheus installs it)");
        let p = Prometheus {
            _child: support::Child(child),
            addr,
            dir,
        };
        support::eventually_async(30, "Prometheus ready", || async {
            let (code, _) = support::try_http_get(&p.addr, "/-/ready").await.ok()?;
            (code == 200).then_some(())
        })
        .await;
        p
    }

    /// GET `path`. A connection refused or reset is tried again for a second (a reset was seen
    /// once in CI, as the test run began and other tests opened hundreds of connections);
    /// past that, the test fails with Prometheus's log.
    async fn get(&self, path: &str) -> (u16, String) {
        let mut tries = 0;
        loop {
            match support::try_http_get(&self.addr, path).await {
                Ok(answer) => return answer,
                Err(e) if tries < 5 => {
                    eprintln!("GET {path} from Prometheus: {e}; trying again");
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(e) => {
                    let log = self.dir.path().join("prometheus.log");
                    let log = std::fs::read_to_string(log).unwrap_or_default();
                    panic!("GET {path} from Prometheus at {}: {e}\n{log}", self.addr);
                }
            }
        }
    }

    /// The result of an instant query: its samples (status success asserted).
    async fn query(&self, q: &str) -> Vec<serde_json::Value> {
        let path = format!("/api/v1/query?query={}", percent_encode(q));
        let (code, body) = self.get(&path).await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        assert!(
            code == 200 && v["status"] == "success",
            "{q}: {code} {body}"
        );
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The alerts firing now, by name.
    async fn firing(&self) -> Vec<String> {
        (self.alerts().await.iter())
            .map(|a| a["labels"]["alertname"].as_str().unwrap().to_string())
            .collect()
    }

    /// The alerts firing now, as Prometheus gives them (labels, annotations).
    async fn alerts(&self) -> Vec<serde_json::Value> {
        let (_, body) = self.get("/api/v1/alerts").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        (v["data"]["alerts"].as_array().into_iter().flatten())
            .filter(|a| a["state"] == "firing")
            .cloned()
            .collect()
    }
}

fn percent_encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_fire_and_resolve_on_a_real_prometheus() {
    let name = "outbound|9080|v2|reviews.default.svc.cluster.local";
    let dr = ("reviews", "default", "reviews", "v2");
    let snap = |v: &str, bad: bool| Snapshot::new(v).with(CDS, istio_cluster(name, dr, 9, bad));
    let (cp, cp_addr, _server) = ControlPlane::listening(snap("v1", false)).await;
    let tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let _envoy = Envoy::start("envoy-1", Xds::Tcp(tap.tap.addr.clone()), false).await;
    let prometheus = Prometheus::start(&tap.admin).await;
    support::eventually_async(30, "the tap scraped and Envoy synced", || async {
        let synced = prometheus
            .query("xdstap_clients{state=\"synced\"} == 1")
            .await;
        (!synced.is_empty()).then_some(())
    })
    .await;
    assert_eq!(prometheus.query("up{job=\"xdstap\"} == 1").await.len(), 1);
    let alerting = ["XdsConfigRejected", "XdsObjectRejected"];
    let firing = prometheus.firing().await;
    assert!(
        !alerting.iter().any(|a| firing.contains(&a.to_string())),
        "{firing:?}"
    );

    // A push Envoy rejects: both alerts fire.
    cp.set(snap("v2", true));
    let firing = support::eventually_async(30, "the NACK alerts firing", || async {
        let firing = prometheus.firing().await;
        alerting
            .iter()
            .all(|a| firing.contains(&a.to_string()))
            .then_some(firing)
    })
    .await;
    // Each names the tap it is about, and the command to run against it.
    for alert in prometheus.alerts().await {
        let name = alert["labels"]["alertname"].as_str().unwrap();
        if alerting.contains(&name) {
            assert_eq!(alert["labels"]["instance"], tap.admin.as_str(), "{alert}");
            let runbook = alert["annotations"]["runbook"].as_str().unwrap();
            let command = format!("`xdstap status --admin {}`", tap.admin);
            assert!(runbook.contains(&command), "{name}: {runbook}");
        }
    }
    for quiet in [
        "XdstapDown",
        "XdsControlPlaneUnreachable",
        "XdstapDroppingEvents",
    ] {
        assert!(!firing.contains(&quiet.to_string()), "{firing:?}");
    }

    // Every rule evaluates, and every series the rules and the docs read has data.
    for (name, expr) in rule_expressions() {
        prometheus.query(&expr).await;
        if !name.starts_with("Xds") {
            assert!(!prometheus.query(&name).await.is_empty(), "recorded {name}");
        }
        // Each series a rule reads is one the tap exports (a misspelt name reads nothing).
        let words = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        for metric in words.filter(|w| w.starts_with("xdstap_")) {
            let series = format!("count({{__name__=\"{metric}\"}})");
            assert!(
                !prometheus.query(&series).await.is_empty(),
                "{name} reads {metric}"
            );
        }
    }
    // Every series the tap exports is in docs/operating.md's table, with no per-node label.
    let documented = std::fs::read_to_string(root().join("docs/operating.md")).unwrap();
    let labels_allowed = [
        "__name__",
        "job",
        "instance",
        "type",
        "verdict",
        "state",
        "api",
        "direction",
        "reason",
        "le",
    ];
    for series in prometheus.query("{job=\"xdstap\"}").await {
        let labels = series["metric"].as_object().unwrap();
        let name = labels["__name__"].as_str().unwrap();
        if ["up", "scrape_", "ALERTS"]
            .iter()
            .any(|p| name.starts_with(p))
        {
            continue;
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| f.ends_with("_seconds"))
            .unwrap_or(name);
        assert!(
            documented.contains(&format!("| `{family}` |")),
            "{family} is not in docs/operating.md's metrics table"
        );
        for label in labels.keys() {
            assert!(
                labels_allowed.contains(&label.as_str()),
                "{name} has label {label}"
            );
        }
    }
    let queries = documented_queries();
    assert!(queries.len() >= 4, "{queries:?}");
    for q in queries {
        assert!(!prometheus.query(&q).await.is_empty(), "no data for {q}");
    }

    // The fix: they resolve.
    cp.set(snap("v3", false));
    support::eventually_async(30, "the NACK alerts resolved", || async {
        let firing = prometheus.firing().await;
        (!alerting.iter().any(|a| firing.contains(&a.to_string()))).then_some(())
    })
    .await;
    tap.close().await;
}

/// The control plane's outage as Prometheus sees it with the rules as shipped (no `for:` cut)
/// and the shipped scrape and evaluation intervals (15 s): XdsControlPlaneUnreachable fires
/// within a minute of the control plane going away, naming the tap, and ends within a minute
/// of its return. No client is connected: the tap's own look at each scrape keeps the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_alert_fires_and_ends_with_the_outage() {
    let shipped = std::fs::read_to_string(root().join("config/prometheus/rules.yml")).unwrap();
    let (cp, cp_addr, server) =
        ControlPlane::listening(Snapshot::standard("v1", 1000, 1000, 9)).await;
    let tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let prometheus = Prometheus::start_with(&tap.admin, &shipped, "15s").await;
    support::eventually_async(60, "the tap scraped, the control plane up", || async {
        let up = prometheus.query("xdstap_upstream_up == 1").await;
        (!up.is_empty()).then_some(())
    })
    .await;
    let unreachable = "XdsControlPlaneUnreachable".to_string();
    assert!(!prometheus.firing().await.contains(&unreachable));

    cp.stop(server).await;
    let gone = std::time::Instant::now();
    let alert = support::eventually_async(90, "the outage alert firing", || async {
        (prometheus.alerts().await.into_iter())
            .find(|a| a["labels"]["alertname"] == unreachable.as_str())
    })
    .await;
    let fired = gone.elapsed();
    eprintln!("XdsControlPlaneUnreachable fired {fired:?} after the control plane went");
    assert!(
        fired < std::time::Duration::from_secs(60),
        "fired after {fired:?}"
    );
    assert_eq!(alert["labels"]["instance"], tap.admin.as_str(), "{alert}");
    let runbook = alert["annotations"]["runbook"].as_str().unwrap();
    assert!(
        runbook.contains(&format!("`xdstap status --admin {}`", tap.admin)),
        "{runbook}"
    );

    let listener = tokio::net::TcpListener::bind(&cp_addr).await.unwrap();
    let _server = cp.serve(listener);
    let back = std::time::Instant::now();
    support::eventually_async(90, "the outage alert resolved", || async {
        (!prometheus.firing().await.contains(&unreachable)).then_some(())
    })
    .await;
    let resolved = back.elapsed();
    eprintln!("XdsControlPlaneUnreachable resolved {resolved:?} after the control plane came back");
    assert!(
        resolved < std::time::Duration::from_secs(60),
        "resolved after {resolved:?}"
    );
    tap.close().await;
}

#[test]
fn the_scrape_configs_shipped_are_valid_and_carry_the_rules() {
    let check = |file: &Path| {
        let out = Command::new("promtool")
            .args(["check", "config"])
            .arg(file)
            .output()
            .expect("run promtool (scripts/install-prometheus installs it)");
        assert!(
            out.status.success(),
            "{}: {}{}",
            file.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    check(&root().join("config/prometheus/prometheus.yml"));
    // The tier's ConfigMap: its two files side by side, checked the same way.
    let text = std::fs::read_to_string(root().join("config/istio/xdstap-prometheus.yaml")).unwrap();
    let map: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    let rules = map["data"]["rules.yml"].as_str().unwrap();
    assert_eq!(
        rules,
        std::fs::read_to_string(root().join("config/prometheus/rules.yml")).unwrap(),
        "the ConfigMap's rules are config/prometheus/rules.yml"
    );
    let dir = support::TempDir::new("promconfig");
    let scrape = map["data"]["prometheus.yml"].as_str().unwrap();
    let rules_path = dir.path().join("rules.yml");
    std::fs::write(&rules_path, rules).unwrap();
    let scrape = scrape.replace(
        "/etc/prometheus/xdstap/rules.yml",
        &rules_path.display().to_string(),
    );
    std::fs::write(dir.path().join("prometheus.yml"), scrape).unwrap();
    check(&dir.path().join("prometheus.yml"));
}
