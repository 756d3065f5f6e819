//! The real-peer harness every test and bench links (a crate of its own, compiled once): a
//! tonic test service, the tap started in-process or as the `xdstap` binary, certificates, a
//! real Envoy, scripted ADS control planes, OTLP receivers, the benches' L4 relay.
pub mod alloc;
pub mod browser;
pub mod cds;
pub mod certs;
pub mod control_plane;
pub mod csds;
pub mod echo;
pub mod envoy;
pub mod grpc;
pub mod l4;
pub mod metadata;
pub mod otlp;
pub mod prom;
pub mod raw;
pub mod resources;
pub mod scripted;
pub mod tap;

/// The repository's root (the workspace's).
pub fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `xdstap` binary cargo built beside the test or bench that runs (`target/PROFILE/`, the
/// parent of the `deps/` it runs from).
pub fn bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the running test's path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/PROFILE/deps");
    dir.join(format!("xdstap{}", std::env::consts::EXE_SUFFIX))
}

/// A fresh temporary directory under target/, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "xdstap-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `check` every 20 ms until it returns Some or `secs` pass; panics with `what` otherwise.
pub async fn eventually<T>(secs: u64, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = check() {
            return v;
        }
        if std::time::Instant::now() > deadline {
            panic!("timed out after {secs}s waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `read` (a stream's next message, a body's next chunk), given `secs` to come; panics naming
/// `what` when it does not: every read in a test has a deadline of its own.
pub async fn within<T>(secs: u64, what: &str, read: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(std::time::Duration::from_secs(secs), read).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs}s waiting for {what}"),
    }
}

/// Awaits `check` every 20 ms until it returns Some or `secs` pass; panics with `what` otherwise.
pub async fn eventually_async<T, F>(secs: u64, what: &str, mut check: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if std::time::Instant::now() > deadline {
            panic!("timed out after {secs}s waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until a process listens on the Unix socket at `path`. The file appears at bind(), a
/// moment before listen(), and a connect in between is refused; /proc/net/unix tells the two
/// apart (the accepting flag, 0x10000) without connecting, so no probe shows in the tap's logs.
pub async fn listening(path: &std::path::Path) {
    let what = format!("a listener on {}", path.display());
    eventually(10, &what, || {
        let table = std::fs::read_to_string("/proc/net/unix").ok()?;
        table
            .lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .any(|f| f.len() == 8 && f[3] == "00010000" && std::path::Path::new(f[7]) == path)
            .then_some(())
    })
    .await
}

/// A child process killed (and reaped) when dropped, so a failing test leaves nothing running.
pub struct Child(pub std::process::Child);

impl Child {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
    /// SIGTERM and wait, as a service manager stops it.
    pub fn terminate(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `xdstap watch --admin ADMIN` writing to `dir/watch.out`, once it says it is watching: the
/// process and the file.
pub async fn watch_into(admin: &str, dir: &std::path::Path) -> (Child, std::path::PathBuf) {
    let (out, err) = (dir.join("watch.out"), dir.join("watch.err"));
    let child = Child(
        std::process::Command::new(bin())
            .args(["watch", "--admin", admin])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap(),
    );
    eventually(10, "watch started", || {
        let said = std::fs::read_to_string(&err).unwrap_or_default();
        said.contains("watching the tap").then_some(())
    })
    .await;
    (child, out)
}

/// `xdstap watch ARGS` in the background, its output piped, once it has said on standard error
/// which of its `taps` it watches (a line each, within 10 s): the process, its output, what it
/// said.
pub fn watching(args: &[&str], taps: usize) -> (Child, Lines, String) {
    let mut child = std::process::Command::new(bin())
        .arg("watch")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let err = Lines::new(child.stderr.take().unwrap());
    let mut said = String::new();
    for _ in 0..taps {
        said.push_str(&err.next(10, "watch to say what it watches"));
    }
    let out = Lines::new(child.stdout.take().unwrap());
    (Child(child), out, said)
}

/// The lines a child process writes to a pipe, read on a thread of their own, so that a test
/// waits for the next one with a deadline instead of blocking on the pipe for good.
pub struct Lines(std::sync::mpsc::Receiver<String>);

impl Lines {
    /// Starts reading `pipe`.
    pub fn new(pipe: impl std::io::Read + Send + 'static) -> Lines {
        use std::io::BufRead;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send(line + "\n").is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    /// The next line (with its newline), waiting at most `secs`; panics naming `what` when
    /// none comes in time or the pipe ends.
    pub fn next(&self, secs: u64, what: &str) -> String {
        let wait = std::time::Duration::from_secs(secs);
        match self.0.recv_timeout(wait) {
            Ok(line) => line,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("no line in {secs}s waiting for {what}")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                panic!("the output ended waiting for {what}")
            }
        }
    }

    /// The next line if one comes within `millis`.
    pub fn try_next(&self, millis: u64) -> Option<String> {
        (self.0)
            .recv_timeout(std::time::Duration::from_millis(millis))
            .ok()
    }

    /// Every line until the pipe ends, which must be within `secs`.
    pub fn rest(&self, secs: u64) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        let mut out = String::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.0.recv_timeout(left) {
                Ok(line) => out.push_str(&line),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return out,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the output did not end within {secs}s: {out}")
                }
            }
        }
    }
}

/// A loopback address with a port free a moment ago, for a process the test starts (or starts
/// again) on it. The port is below the kernel's ephemeral range, so no connection that some
/// other test opens meanwhile can take it as its local port, and no two calls in this process
/// give the same one.
pub fn free_addr() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    // The 8,192 ports below the range (none under 1024), starting where this process's id
    // points, so that two test binaries start apart.
    let base = low.saturating_sub(8192).max(1024);
    let span = low
        .checked_sub(base)
        .filter(|s| *s > 0)
        .expect("an ephemeral range above 1024");
    let start = std::process::id() % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let addr = format!("127.0.0.1:{}", base + (start + n) % span);
        if std::net::TcpListener::bind(&addr).is_ok() {
            return addr;
        }
    }
    panic!("no free port between {base} and {low}");
}

/// The tap's `/status`, read back from its JSON.
pub async fn status(admin: &str) -> xdstap::api::v1::StatusReport {
    let (code, body) = http_get(admin, "/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// GET `path` from an HTTP/1.1 server at `addr` (the tap's admin server): (status, body).
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    try_http_get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

/// As [`http_get`], with the connection's errors returned: for a server of someone else's
/// (Prometheus) whose connections the test may see refused or reset while it starts.
pub async fn try_http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok((code, body.to_string()));
    }
    // A chunked body: each chunk's size in hex on a line, the chunk, CRLF; a size 0 ends it.
    let (mut out, mut rest) = (String::new(), body);
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    Ok((code, out))
}

/// `xdstap ARGS` run to its end: (exit code, stdout, stderr).
pub async fn xdstap(args: &[&str]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(bin())
            .args(&args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    })
    .await
    .unwrap()
}
