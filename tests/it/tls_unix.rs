//! TLS on both sides (certificates made here with rcgen), mTLS refusal, and Unix sockets on both
//! sides.

use crate::support;

use bytes::Bytes;
use support::certs;
use support::raw;
use support::tap::{Tap, TapOptions};
use xdstap::proxy::{ClientTls, Endpoint, ServerTls};

/// An upstream raw h2 server behind TLS (server certificate for localhost).
async fn tls_upstream(pki: &certs::Pki) -> (String, raw::Log) {
    let acceptor = ServerTls {
        cert: pki.server_cert.clone(),
        key: pki.server_key.clone(),
        client_ca: Some(pki.ca.clone()),
    }
    .acceptor()
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let log = raw::Log::default();
    let l2 = log.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let log = l2.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    raw::serve_conn(tls, log).await;
                }
            });
        }
    });
    (addr, log)
}

#[tokio::test]
async fn mtls_on_both_sides_and_a_client_without_certificate_is_refused() {
    let dir = support::TempDir::new("tls");
    let pki = certs::make(dir.path());
    let (upstream, log) = tls_upstream(&pki).await;

    let mut options = TapOptions::new(&upstream);
    options.tls = Some(ServerTls {
        cert: pki.server_cert.clone(),
        key: pki.server_key.clone(),
        client_ca: Some(pki.ca.clone()),
    });
    options.upstream_tls = Some(ClientTls {
        ca: Some(pki.ca.clone()),
        cert: Some(pki.client_cert.clone()),
        key: Some(pki.client_key.clone()),
        sni: Some("localhost".into()),
    });
    let tap = Tap::with(options).await;

    let client_tls = ClientTls {
        ca: Some(pki.ca.clone()),
        cert: Some(pki.client_cert.clone()),
        key: Some(pki.client_key.clone()),
        sni: None,
    };
    let (connector, name) = client_tls.connector(Some("localhost")).unwrap();
    let tcp = tokio::net::TcpStream::connect(&tap.addr).await.unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut client = raw::client(tls).await;
    let (_, data, trailers) = raw::exchange(&mut client, "/echo", Bytes::from_static(b"over tls"))
        .await
        .unwrap();
    assert_eq!(data, b"over tls");
    assert_eq!(trailers.unwrap().get("x-trailer").unwrap(), "t1");
    assert_eq!(log.lock().unwrap().len(), 1);

    // No client certificate: the handshake is refused (TLS 1.3 reports it on first read).
    let no_cert = ClientTls {
        ca: Some(pki.ca.clone()),
        ..Default::default()
    };
    let (connector, name) = no_cert.connector(Some("localhost")).unwrap();
    let tcp = tokio::net::TcpStream::connect(&tap.addr).await.unwrap();
    // Whatever the client side sees first, no request may get through, and the tap counts it.
    let before = log.lock().unwrap().len();
    if let Ok(tls) = connector.connect(name, tcp).await {
        if let Ok((send, conn)) = h2::client::handshake(tls).await {
            tokio::spawn(conn);
            let mut send = send;
            let attempt = raw::exchange(&mut send, "/echo", Bytes::from_static(b"no cert")).await;
            assert!(
                attempt.is_err(),
                "a client without certificate got an answer"
            );
        }
    }
    assert_eq!(
        log.lock().unwrap().len(),
        before,
        "a request without client certificate reached upstream"
    );
    support::eventually(5, "handshake error counted", || {
        (xdstap::proxy::counter(&tap.stats.handshake_errors) >= 1).then_some(())
    })
    .await;

    // A server certificate from another CA is not trusted by the tap's upstream side.
    let mut options = TapOptions::new(&upstream);
    options.upstream_tls = Some(ClientTls {
        ca: Some(pki.other_ca.clone()),
        sni: Some("localhost".into()),
        ..Default::default()
    });
    let bad = Tap::with(options).await;
    // The client's connection closes before the handshake; the reason is the tap's to tell
    // (tests/it/tls_errors.rs reads it from /readyz).
    assert_eq!(raw::bytes_before_close(&bad.addr).await, Some(0));
    assert_eq!(
        xdstap::proxy::counter(&bad.stats.upstream_connect_errors),
        1
    );
}

#[tokio::test]
async fn unix_sockets_on_both_sides() {
    let dir = support::TempDir::new("unix");
    let upstream_path = dir.path().join("cp.sock");
    let _stop = support::echo::serve_unix(&upstream_path).await;
    let mut options = TapOptions::new(&format!("unix:{}", upstream_path.display()));
    let listen_path = dir.path().join("tap.sock");
    options.listen = Endpoint::Unix(listen_path.clone());
    let tap = Tap::with(options).await;
    assert_eq!(tap.addr, format!("unix:{}", listen_path.display()));

    let mut client =
        raw::client(tokio::net::UnixStream::connect(&listen_path).await.unwrap()).await;
    // A gRPC unary call to the tonic Echo service, framed by hand.
    let body = Bytes::from(xdstap::grpc::encode(b"over unix"));
    let (resp, data, trailers) = raw::exchange(&mut client, support::echo::UNARY, body.clone())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(data, body.to_vec());
    assert_eq!(trailers.unwrap().get("grpc-status").unwrap(), "0");
}
