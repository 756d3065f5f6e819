//! What is said of a tap that does not answer, in one wording a person understands, the same in
//! the CLI and in a tier's `/status` (which the page shows as it is): a port nothing listens
//! on is refused, a peer that accepts and says nothing gave no answer within the time it was
//! given, an HTTP/1 server and a gRPC server without xdstap's API are not an xdstap, named
//! for what answered.

use crate::support;

use support::control_plane::ControlPlane;
use support::resources::Snapshot;
use support::tap::XdsTap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A server that answers whatever comes with an HTTP/1.1 error, as web servers do to HTTP/2's
/// preface, and closes.
async fn http1_server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    addr
}

/// A server that accepts and never says a word.
async fn mute_server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_do_not_answer_are_named_in_one_wording() {
    let refused = support::free_addr();
    let mute = mute_server().await;
    let http1 = http1_server().await;
    // A real gRPC server (the tests' control plane), which serves ADS and nothing of xdstap's.
    let (_cp, grpc, _server) =
        ControlPlane::listening(Snapshot::standard("v1", 1000, 1000, 9)).await;
    let expected = |within: &str| {
        [
            (
                refused.clone(),
                format!("{refused}: refused (nothing listens there)"),
            ),
            (mute.clone(), format!("{mute}: no answer within {within} s")),
            (
                http1.clone(),
                format!("{http1}: not an xdstap (an HTTP/1 server answered)"),
            ),
            (
                grpc.clone(),
                format!("{grpc}: not an xdstap (a gRPC server without xdstap's API answered)"),
            ),
        ]
    };

    // The CLI: each asked alone, its words on standard error; exit 69 (unavailable).
    let mut asks = tokio::task::JoinSet::new();
    for (admin, said) in expected("10") {
        asks.spawn(async move {
            let (code, out, err) = support::xdstap(&["status", "--admin", &admin]).await;
            assert_eq!(code, 69, "{admin}: {out}{err}");
            assert_eq!(err.trim(), format!("xdstap status: {said}"), "{admin}");
        });
    }
    while let Some(done) = asks.join_next().await {
        done.unwrap();
    }

    // A tier's /status (the page's source): the same words, the mute peer given 2 s.
    let (_cp2, cp_addr, _server2) =
        ControlPlane::listening(Snapshot::standard("v1", 1000, 1000, 9)).await;
    let peers = [&refused, &mute, &http1, &grpc]
        .map(|s| s.as_str())
        .join(",");
    let flags = [
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &cp_addr,
        "--admin",
        "127.0.0.1:0",
        "--admin-peers",
        &peers,
    ];
    let tap = XdsTap::with_flags(&flags).await;
    let (code, body) = support::http_get(&tap.admin, "/status").await;
    assert_eq!(code, 200, "{body}");
    let report: xdstap::api::v1::StatusReport = serde_json::from_str(&body).unwrap();
    for (admin, said) in expected("2") {
        let t = report.taps.iter().find(|t| t.admin == admin);
        assert_eq!(
            t.map(|t| t.error.as_str()),
            Some(said.as_str()),
            "{:?}",
            report.taps
        );
    }
    tap.close().await;
}
