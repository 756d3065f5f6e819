//! The demo's built-in xDS client, a stand-in for Envoy where none can run: subscribes to CDS
//! and LDS over SotW ADS, ACKs what validates, NACKs what does not (keeping its last accepted
//! version), and after the stream ends reconnects stating the versions it has, like Envoy.

use std::collections::HashMap;
use std::time::Duration;

use super::messages::{request, validate, Pipe, ADS, CDS, LDS};
use xdstap_core::xds::wire as pb;

/// A response as the built-in client read it, with its validation result.
struct Received {
    type_url: String,
    version: String,
    nonce: String,
    error: Option<String>,
}

fn read_response(msg: &[u8]) -> Received {
    let fields = pb::fields(msg);
    let get = |n: u32| {
        fields
            .iter()
            .find(|f| f.0 == n)
            .map(|f| String::from_utf8_lossy(&f.2).into_owned())
            .unwrap_or_default()
    };
    let type_url = get(4);
    let resources: Vec<Vec<u8>> = (fields.iter().filter(|f| f.0 == 2))
        .filter_map(|f| pb::fields(&f.2).into_iter().find(|a| a.0 == 2).map(|v| v.2))
        .collect();
    let error = validate(&type_url, &resources);
    Received {
        version: get(1),
        nonce: get(5),
        type_url,
        error,
    }
}

async fn open_stream(tap: &str) -> anyhow::Result<Pipe> {
    let io = tokio::net::TcpStream::connect(tap).await?;
    io.set_nodelay(true)?;
    let (client, conn) = h2::client::handshake(io).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await?;
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{tap}{ADS}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let (resp, send) = client.send_request(req, false)?;
    let recv = resp.await?.into_body();
    Ok(Pipe::new(send, recv))
}

/// How long the built-in client takes to apply a response before it answers.
const APPLY_TIME: Duration = Duration::from_millis(3);

/// Runs the client against the tap at `tap` until aborted.
pub async fn run(tap: String) {
    let mut accepted: HashMap<String, String> = HashMap::new();
    loop {
        if let Ok(mut pipe) = open_stream(&tap).await {
            let v = |t: &str| accepted.get(t).cloned().unwrap_or_default();
            let opened = pipe
                .send(&request(CDS, &v(CDS), "", true, None))
                .and_then(|()| pipe.send(&request(LDS, &v(LDS), "", false, None)));
            if opened.is_ok() {
                while let Ok(msg) = pipe.recv().await {
                    let r = read_response(&msg);
                    // Envoy takes a few milliseconds to apply a config before it answers; so does
                    // this stand-in, so a control plane that ends the stream right after a push
                    // leaves that push unanswered, as it would with Envoy.
                    tokio::time::sleep(APPLY_TIME).await;
                    let answer = match &r.error {
                        None => {
                            accepted.insert(r.type_url.clone(), r.version.clone());
                            request(&r.type_url, &r.version, &r.nonce, false, None)
                        }
                        Some(e) => {
                            let kept = accepted.get(&r.type_url).cloned().unwrap_or_default();
                            request(&r.type_url, &kept, &r.nonce, false, Some(e))
                        }
                    };
                    if pipe.send(&answer).is_err() {
                        break;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
