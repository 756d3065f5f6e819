//! TLS failures on either side name the side and the reason: with an expired, wrong-name or
//! unknown-CA certificate from the control plane, the client's connection closes before the
//! handshake (as a server it cannot reach would) and `/readyz` names the upstream and the
//! reason; an expired or unknown-CA client certificate, a client that rejects
//! the tap's expired certificate, and plaintext sent to the TLS listener are each refused and
//! logged by the `xdstap` binary as a client TLS failure with the reason.

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};

use bytes::Bytes;
use support::certs::{self, Pki};
use support::raw;
use support::tap::{TapOptions, XdsTap};
use xdstap::proxy::counter;
use xdstap::proxy::{ClientTls, ServerTls};

/// A TLS upstream (raw h2 behind rustls) presenting `cert`.
async fn tls_upstream(cert: &Path, key: &Path) -> String {
    let acceptor = ServerTls {
        cert: cert.into(),
        key: key.into(),
        client_ca: None,
    }
    .acceptor()
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    raw::serve_conn(tls, raw::Log::default()).await;
                }
            });
        }
    });
    addr
}

/// What a tap whose upstream presents `cert` does: the bytes a client got before its
/// connection closed, and what `/readyz` says.
async fn upstream_failure(trusted_ca: &Path, cert: &Path, key: &Path) -> (Option<usize>, String) {
    let upstream = tls_upstream(cert, key).await;
    let mut options = TapOptions::new(&upstream);
    options.upstream_tls = Some(ClientTls {
        ca: Some(trusted_ca.into()),
        sni: Some("localhost".into()),
        ..Default::default()
    });
    let tap = XdsTap::start(options).await;
    let seen = raw::bytes_before_close(&tap.tap.addr).await;
    let (code, body) = support::http_get(&tap.admin, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(counter(&tap.tap.stats.upstream_connect_errors), 1);
    tap.close().await;
    (seen, body)
}

#[tokio::test]
async fn upstream_certificate_problems_close_the_client_and_readyz_names_side_and_reason() {
    let dir = support::TempDir::new("tls-errors-up");
    let pki = certs::make(dir.path());
    let expired = upstream_failure(&pki.ca, &pki.expired_cert, &pki.expired_key).await;
    let wrong = upstream_failure(&pki.ca, &pki.wrong_name_cert, &pki.wrong_name_key).await;
    // A good certificate, from a CA the tap is not told to trust.
    let unknown_ca = upstream_failure(&pki.other_ca, &pki.server_cert, &pki.server_key).await;
    for ((seen, msg), reason) in [
        (expired, "expired"),
        (wrong, "not valid for name"),
        (unknown_ca, "unknownissuer"),
    ] {
        assert_eq!(seen, Some(0), "closed before the handshake ({reason})");
        let lower = msg.to_lowercase();
        assert!(
            lower.contains("upstream") && lower.contains("tls handshake failed"),
            "names the side: {msg}"
        );
        assert!(lower.contains(reason), "names the reason ({reason}): {msg}");
    }
}

/// The binary with TLS on its listener (a Unix socket), client certificates required.
fn tls_tap(
    dir: &Path,
    pki: &Pki,
    cert: &Path,
    key: &Path,
) -> (support::Child, std::path::PathBuf, std::path::PathBuf) {
    let sock = dir.join("tap.sock");
    let stderr = dir.join("stderr.log");
    let child = support::Child(
        Command::new(env!("CARGO_BIN_EXE_xdstap"))
            .args(["run", "--listen"])
            .arg(format!("unix:{}", sock.display()))
            .args(["--upstream", "127.0.0.1:9", "--admin", "off", "--tls-cert"])
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .arg("--tls-client-ca")
            .arg(&pki.ca)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap(),
    );
    (child, sock, stderr)
}

/// Connects over TLS with `client`; whatever the client sees, returns once it is over.
async fn try_tls(sock: &Path, client: ClientTls) {
    let (connector, name) = client.connector(Some("localhost")).unwrap();
    let io = tokio::net::UnixStream::connect(sock).await.unwrap();
    if let Ok(tls) = connector.connect(name, io).await {
        if let Ok((mut send, conn)) = h2::client::handshake(tls).await {
            tokio::spawn(conn);
            let _ = raw::exchange(&mut send, "/echo", Bytes::from_static(b"x")).await;
        }
    }
}

async fn log_line(stderr: &Path, n: usize) -> String {
    support::eventually(10, "a client TLS failure in the log", || {
        let text = std::fs::read_to_string(stderr).ok()?;
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("Client TLS handshake failed"))
            .collect();
        (lines.len() >= n).then(|| lines[n - 1].to_string())
    })
    .await
}

/// Each client-side failure is logged naming its reason (a tap each, since a tap logs the first
/// failure at once and then a count every few seconds); a burst of them is one line, not one
/// line each: the first failure after 5 s says how many there were.
#[tokio::test]
async fn client_side_certificate_problems_are_logged_with_side_and_reason() {
    let dir = support::TempDir::new("tls-errors-down");
    let pki = certs::make(dir.path());
    let expired = ClientTls {
        ca: Some(pki.ca.clone()),
        cert: Some(pki.expired_client_cert.clone()),
        key: Some(pki.expired_client_key.clone()),
        sni: None,
    };
    // A client certificate from a CA the tap does not trust.
    let stranger = ClientTls {
        ca: Some(pki.ca.clone()),
        cert: Some(pki.stranger_cert.clone()),
        key: Some(pki.stranger_key.clone()),
        sni: None,
    };
    for (i, (client, reason)) in [(expired, "expired"), (stranger, "unknownissuer")]
        .into_iter()
        .enumerate()
    {
        let dir = dir.path().join(i.to_string());
        std::fs::create_dir(&dir).unwrap();
        let (_tap, sock, stderr) = tls_tap(&dir, &pki, &pki.server_cert, &pki.server_key);
        support::listening(&sock).await;
        try_tls(&sock, client).await;
        let line = log_line(&stderr, 1).await;
        assert!(line.to_lowercase().contains(reason), "{line}");
    }

    // Plaintext HTTP/2 to the TLS listener: refused, and said so.
    let (_tap, sock, stderr) = tls_tap(dir.path(), &pki, &pki.server_cert, &pki.server_key);
    support::listening(&sock).await;
    let plaintext = || async {
        let io = tokio::net::UnixStream::connect(&sock).await.unwrap();
        match h2::client::handshake(io).await {
            Err(_) => true,
            Ok((mut send, conn)) => {
                tokio::spawn(conn);
                raw::exchange(&mut send, "/echo", Bytes::from_static(b"x"))
                    .await
                    .is_err()
            }
        }
    };
    assert!(plaintext().await, "plaintext got through a TLS listener");
    let line = log_line(&stderr, 1).await;
    assert!(line.contains("times=1"), "{line}");
    // The tap's window began before it wrote that line.
    let first = std::time::Instant::now();
    // A fleet that trusts the wrong root: twenty more at once log nothing of their own; the
    // first failure past the 5 s window logs them all with its own count.
    for _ in 0..20 {
        assert!(plaintext().await);
    }
    tokio::time::sleep(std::time::Duration::from_secs(5).saturating_sub(first.elapsed())).await;
    assert!(plaintext().await);
    let line = log_line(&stderr, 2).await;
    assert!(line.contains("times=21"), "{line}");
    let lines = std::fs::read_to_string(&stderr).unwrap();
    let failures = lines.matches("Client TLS handshake failed").count();
    assert_eq!(failures, 2, "{lines}");
}

#[tokio::test]
async fn a_client_rejecting_the_taps_expired_certificate_is_logged() {
    let dir = support::TempDir::new("tls-errors-own");
    let pki = certs::make(dir.path());
    let (_tap, sock, stderr) = tls_tap(dir.path(), &pki, &pki.expired_cert, &pki.expired_key);
    support::listening(&sock).await;
    try_tls(
        &sock,
        ClientTls {
            ca: Some(pki.ca.clone()),
            cert: Some(pki.client_cert.clone()),
            key: Some(pki.client_key.clone()),
            sni: None,
        },
    )
    .await;
    let line = log_line(&stderr, 1).await;
    assert!(
        line.to_lowercase().contains("expired"),
        "the client's alert: {line}"
    );
}

/// `/readyz` tells the truth about the upstream: a TLS port behind a plaintext tap, and one
/// that accepts and never answers, are not ready, the cause named; the same TLS port dialled
/// with TLS answers HTTP/2 and is ready. Asked 50 times in a row, and 3 x 50 times at once, the
/// tap dials a mute upstream at most about once a second, and an answering one once: it keeps
/// that connection, and dials again only once it closes (`readyz_keeps_one_connection`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_whether_the_upstream_answers_http2() {
    let dir = support::TempDir::new("readyz");
    let pki = certs::make(dir.path());
    let tls = tls_upstream(&pki.server_cert, &pki.server_key).await;
    let plain = XdsTap::start(TapOptions::new(&tls)).await;
    let (code, body) = support::http_get(&plain.admin, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("TLS"), "{body}");
    let mut options = TapOptions::new(&tls);
    options.upstream_tls = Some(ClientTls {
        ca: Some(pki.ca.clone()),
        sni: Some("localhost".into()),
        ..Default::default()
    });
    let secure = XdsTap::start(options).await;
    let (code, body) = support::http_get(&secure.admin, "/readyz").await;
    assert_eq!((code, body.as_str()), (200, "ready\n"));
    // An upstream that accepts and never answers, counting its connections.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(s);
        }
    });
    let mute = XdsTap::start(TapOptions::new(&addr)).await;
    let t0 = std::time::Instant::now();
    for _ in 0..50 {
        let (code, body) = support::http_get(&mute.admin, "/readyz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("no HTTP/2 answer within 1s"), "{body}");
    }
    for _ in 0..3 {
        // Past the reuse of the last answer, so that the probes find none.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let mut probes = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let admin = mute.admin.clone();
            probes.spawn(async move { support::http_get(&admin, "/readyz").await.0 });
        }
        while let Some(code) = probes.join_next().await {
            assert_eq!(code.unwrap(), 503);
        }
    }
    let dials = accepted.load(std::sync::atomic::Ordering::SeqCst);
    let most = t0.elapsed().as_secs() as usize + 2;
    assert!(dials <= most, "{dials} dials in {:?}", t0.elapsed());
    plain.close().await;
    secure.close().await;
    mute.close().await;
}

/// An upstream that answers HTTP/2 is dialled once for any number of probes over seconds: the
/// connection is kept. When the upstream goes away the next probe says so, and when it is back
/// one new connection serves the probes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_keeps_one_connection() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let serve = |listener: tokio::net::TcpListener| {
        let counter = accepted.clone();
        tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((s, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                conns.spawn(raw::serve_conn(s, raw::Log::default()));
            }
        })
    };
    let server = serve(listener);
    let tap = XdsTap::start(TapOptions::new(&addr)).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut probes = 0;
    while std::time::Instant::now() < deadline {
        let (code, body) = support::http_get(&tap.admin, "/readyz").await;
        assert_eq!((code, body.as_str()), (200, "ready\n"));
        probes += 1;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let dials = accepted.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(dials, 1, "{probes} probes over 3 s dialled {dials} times");

    // The upstream goes away (its task and every connection with it).
    server.abort();
    let _ = server.await;
    readyz_becomes(&tap.admin, 503).await;
    let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
    let _server = serve(listener);
    readyz_becomes(&tap.admin, 200).await;
    let before = accepted.load(std::sync::atomic::Ordering::SeqCst);
    for _ in 0..15 {
        let (code, _) = support::http_get(&tap.admin, "/readyz").await;
        assert_eq!(code, 200);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), before);
    tap.close().await;
}

/// Probes `/readyz` every 100 ms until it answers `code`, for at most 5 s.
async fn readyz_becomes(admin: &str, code: u16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (now, body) = support::http_get(admin, "/readyz").await;
        if now == code {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/readyz still says {now} {body:?}, not {code}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
