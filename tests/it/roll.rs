//! A tap tier rolled under load loses nothing. Debian's haproxy (installed by the test command)
//! balances four real Envoys (two SotW, two Delta) over two `xdstap` processes, taking a tap out
//! when its `/readyz` fails; the control plane pushes a new version every second; each tap in
//! turn gets SIGTERM while pushes are in flight and is started again on its addresses.
//!
//! - Every answer a tap saw an Envoy send (its event log: each ACK and NACK with its nonce) is in
//!   the control plane's own record: none lost when a tap closes a connection (it half-closes
//!   and reads the control plane's side until it closes, instead of dropping a socket with bytes
//!   unread, whose reset would lose them).
//! - Every Envoy runs every version within 2 s of its push, by its own stats
//!   (`cluster_manager.cds.version_text`, sampled every 50 ms).
//! - After the roll, `xdstap status` over both taps lists each Envoy once, SYNCED.
//!
//! The taps drain with `--drain-delay 1s`: `/readyz` says 503 at once, haproxy (checking every
//! 200 ms) stops sending new connections there, and only then does the tap stop accepting and
//! close its connections, so the Envoys it closes reach the other tap at the first try: haproxy
//! counts no connection error, retry or redispatch (with `--drain-delay 0s` it redispatched 5
//! connections a roll here, which a balancer without retries, such as kube-proxy, would fail).

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::resources::Snapshot;

/// Cluster `a` differs in every version, so each push changes what Envoy runs.
fn snapshot(version: u32) -> Snapshot {
    Snapshot::standard(&version.to_string(), 1000 + i64::from(version), 1000, 9)
}

/// One `xdstap run` process on fixed addresses, its verdicts in an event log of its own.
struct TapProcess {
    child: support::Child,
    admin: String,
    /// What it wrote to stderr, shown if it never becomes ready.
    stderr: PathBuf,
}

impl TapProcess {
    async fn start(listen: &str, admin: &str, upstream: &str, log: &Path) -> TapProcess {
        let child = support::Child(
            std::process::Command::new(env!("CARGO_BIN_EXE_xdstap"))
                .args([
                    "run",
                    "--listen",
                    listen,
                    "--admin",
                    admin,
                    "--upstream",
                    upstream,
                ])
                .args([
                    "--drain-delay",
                    "1s",
                    "--shutdown-grace",
                    "5s",
                    "--event-log",
                ])
                .arg(log)
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(log.with_extension("stderr")).unwrap())
                .spawn()
                .unwrap(),
        );
        let tap = TapProcess {
            child,
            admin: admin.into(),
            stderr: log.with_extension("stderr"),
        };
        tap.ready().await;
        tap
    }

    /// Waits until its `/readyz` says 200.
    async fn ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Ok(mut s)) = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::net::TcpStream::connect(&self.admin),
            )
            .await
            {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let ask = b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
                let mut answer = String::new();
                if s.write_all(ask).await.is_ok()
                    && s.read_to_string(&mut answer).await.is_ok()
                    && answer.starts_with("HTTP/1.1 200")
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "the tap at {} never became ready; it wrote:\n{}",
            self.admin,
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
    }

    /// SIGTERM, and waits for the process to exit.
    fn stop(mut self) {
        let child = &mut self.child;
        tokio::task::block_in_place(|| child.terminate());
    }
}

/// haproxy in TCP mode on `front`, balancing over the taps' listeners and checking each tap's
/// `/readyz` every 200 ms.
fn haproxy(dir: &Path, front: &str, taps: &[(&str, &str)]) -> support::Child {
    let port = |addr: &str| addr.rsplit_once(':').unwrap().1.to_string();
    let mut config = format!(
        "global\n  maxconn 1000\n  stats socket {}\n\ndefaults\n  mode tcp\n  timeout connect 1s\n  \
         timeout client 1h\n  timeout server 1h\n  retries 3\n  option redispatch\n\n\
         frontend xds\n  bind {front}\n  default_backend taps\n\nbackend taps\n  \
         balance roundrobin\n  option httpchk GET /readyz\n  http-check expect status 200\n  \
         default-server inter 200ms fall 1 rise 1\n",
        dir.join("haproxy.sock").display()
    );
    for (i, (listen, admin)) in taps.iter().enumerate() {
        config += &format!("  server tap{i} {listen} check port {}\n", port(admin));
    }
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, config).unwrap();
    support::Child(
        std::process::Command::new("haproxy")
            .arg("-f")
            .arg(&path)
            .arg("-db")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("haproxy.log")).unwrap())
            .spawn()
            .expect("haproxy: run scripts/test, which installs it"),
    )
}

/// haproxy's own counts for the tap servers: connection errors, retries and redispatches (the
/// `econ`, `wretr` and `wredis` columns of `show stat`).
async fn haproxy_failures(dir: &Path) -> (u64, u64, u64) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(dir.join("haproxy.sock"))
        .await
        .unwrap();
    s.write_all(b"show stat\n").await.unwrap();
    let mut csv = String::new();
    s.read_to_string(&mut csv).await.unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap()
        .trim_start_matches("# ")
        .split(',')
        .collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (econ, wretr, wredis) = (column("econ"), column("wretr"), column("wredis"));
    let mut sum = (0, 0, 0);
    for row in lines.map(|l| l.split(',').collect::<Vec<_>>()) {
        if row.len() > wredis && row[1].starts_with("tap") {
            let n = |i: usize| row[i].parse::<u64>().unwrap_or(0);
            sum = (sum.0 + n(econ), sum.1 + n(wretr), sum.2 + n(wredis));
        }
    }
    sum
}

/// The CDS version an Envoy runs, by its own stats.
async fn running(envoy: &Envoy) -> Option<u32> {
    let body = envoy
        .get("/stats?filter=^cluster_manager\\.cds\\.version_text$")
        .await;
    let value = body.split_once(": ")?.1.trim().trim_matches('"');
    value.parse().ok()
}

/// When each Envoy was first seen running each version.
type Seen = Arc<Mutex<BTreeMap<(String, u32), Instant>>>;

/// Samples every Envoy's version every 50 ms until `stop` is set.
fn sample(envoys: Arc<Vec<Envoy>>, seen: Seen, stop: Arc<std::sync::atomic::AtomicBool>) {
    tokio::spawn(async move {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            for e in envoys.iter() {
                if let Some(v) = running(e).await {
                    let mut seen = seen.lock().unwrap();
                    seen.entry((e.node.clone(), v)).or_insert_with(Instant::now);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_a_tap_tier_behind_haproxy_loses_no_answer() {
    let (cp, upstream, _server) = ControlPlane::listening(snapshot(1)).await;
    let dir = support::TempDir::new("roll");
    let addrs: Vec<(String, String)> = (0..2)
        .map(|_| (support::free_addr(), support::free_addr()))
        .collect();
    let logs: Vec<PathBuf> = (0..4)
        .map(|i| dir.path().join(format!("verdicts-{i}.jsonl")))
        .collect();
    let mut taps = Vec::new();
    for (i, (listen, admin)) in addrs.iter().enumerate() {
        taps.push(Some(
            TapProcess::start(listen, admin, &upstream, &logs[i]).await,
        ));
    }
    let front = support::free_addr();
    let pairs: Vec<(&str, &str)> = addrs
        .iter()
        .map(|(l, a)| (l.as_str(), a.as_str()))
        .collect();
    let _haproxy = haproxy(dir.path(), &front, &pairs);
    support::eventually(10, "haproxy listening", || {
        std::net::TcpStream::connect(&front).ok().map(drop)
    })
    .await;
    let mut envoys = Vec::new();
    for (node, delta) in [
        ("sotw-1", false),
        ("delta-1", true),
        ("sotw-2", false),
        ("delta-2", true),
    ] {
        envoys.push(Envoy::start(node, Xds::Tcp(front.clone()), delta).await);
    }
    let envoys = Arc::new(envoys);
    for e in envoys.iter() {
        let deadline = Instant::now() + Duration::from_secs(20);
        while running(e).await != Some(1) {
            assert!(Instant::now() < deadline, "{} never ran version 1", e.node);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let seen: Seen = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    sample(envoys.clone(), seen.clone(), stop.clone());
    // A push a second; each tap stopped (drained) and started again, in turn, in between.
    let mut pushed: Vec<(u32, Instant)> = Vec::new();
    let mut version = 1;
    let push = |version: &mut u32, pushed: &mut Vec<(u32, Instant)>| {
        *version += 1;
        cp.set(snapshot(*version));
        pushed.push((*version, Instant::now()));
    };
    for (i, (listen, admin)) in addrs.iter().enumerate() {
        // Stopped while a push is in flight: the tap waits for its answers, forwards them,
        // then closes.
        push(&mut version, &mut pushed);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let stopping = taps[i].take().unwrap();
        let stopped = tokio::spawn(async move { stopping.stop() });
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(700)).await;
            push(&mut version, &mut pushed);
        }
        stopped.await.unwrap();
        taps[i] = Some(TapProcess::start(listen, admin, &upstream, &logs[2 + i]).await);
        tokio::time::sleep(Duration::from_secs(1)).await;
        push(&mut version, &mut pushed);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (errors, retries, redispatches) = haproxy_failures(dir.path()).await;
    eprintln!(
        "haproxy: {errors} connection errors, {retries} retries, {redispatches} redispatches"
    );
    assert_eq!(
        (errors, retries, redispatches),
        (0, 0, 0),
        "haproxy sent a connection to a tap that had stopped accepting"
    );

    // Every Envoy ran every version within 2 s of its push.
    let seen = seen.lock().unwrap().clone();
    for e in envoys.iter() {
        for (v, at) in &pushed {
            let first = (seen.iter())
                .filter(|((node, w), _)| *node == e.node && w >= v)
                .map(|(_, t)| *t)
                .min();
            let took = first.map(|t| t.saturating_duration_since(*at));
            eprintln!("{} ran version {v} {took:?} after its push", e.node);
            assert!(
                took.is_some_and(|t| t < Duration::from_secs(2)),
                "{} ran version {v} {took:?} after its push",
                e.node
            );
        }
    }

    // Every answer a tap saw is in the control plane's record.
    let recorded: std::collections::HashSet<String> = cp
        .requests()
        .into_iter()
        .map(|r| r.response_nonce)
        .collect();
    let mut answers = 0;
    for log in &logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if !matches!(v["verdict"].as_str(), Some("ack" | "nack")) {
                continue;
            }
            answers += 1;
            let nonce = v["nonce"].as_str().unwrap();
            assert!(
                recorded.contains(nonce),
                "{} answered {nonce} through a tap ({}); the control plane never got it",
                v["node"],
                log.display()
            );
        }
    }
    eprintln!("{answers} answers seen by the taps, every one recorded by the control plane");
    assert!(
        answers >= 4 * pushed.len(),
        "{answers} answers for {} pushes",
        pushed.len()
    );

    // Over both taps, each Envoy once, SYNCED.
    let admins: Vec<String> = addrs.iter().map(|(_, a)| a.clone()).collect();
    let (code, out, err) =
        support::xdstap(&["status", "--admin", &admins.join(","), "-o", "json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut nodes: Vec<(String, String)> = (v["nodes"].as_array().unwrap().iter())
        .map(|n| {
            (
                n["id"].as_str().unwrap().into(),
                n["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    nodes.sort();
    let expected: Vec<(String, String)> = ["delta-1", "delta-2", "sotw-1", "sotw-2"]
        .iter()
        .map(|n| (n.to_string(), "SYNCED".to_string()))
        .collect();
    assert_eq!(nodes, expected, "{out}");
    for tap in taps.into_iter().flatten() {
        tap.stop();
    }
}
