//! `/readyz`: whether the control plane answers HTTP/2. One connection to it is kept open for
//! the purpose and asked again only once it closes, so probes (a kubelet's every few seconds,
//! a load balancer's every second) cost the control plane nothing: no dial, no handshake, no
//! reset per probe. A dial happens at the first probe and after the kept connection ends.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::proxy::{Connector, Endpoint, Io};

/// How long a readiness answer is reused before the kept connection is looked at again.
const ANSWER_FOR: Duration = Duration::from_secs(1);

/// How long a dial, and the control plane's answer to the tap's PING, may take.
const WITHIN: Duration = Duration::from_secs(1);

/// The readiness check of one upstream.
pub struct Readiness {
    upstream: Endpoint,
    connector: Connector,
    /// Held across a dial: one dial at a time, whatever the number of probes.
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The kept connection: its request handle (dropping it would close the connection) and
    /// the task driving it, which ends when the connection does.
    kept: Option<(
        h2::client::SendRequest<bytes::Bytes>,
        tokio::task::JoinHandle<()>,
    )>,
    /// The last answer and when it was given.
    last: Option<(Instant, Result<(), String>)>,
}

impl Readiness {
    /// A check of `upstream`, dialled with `connector` as the tap dials it (TLS included).
    pub fn new(upstream: Endpoint, connector: Connector) -> Self {
        Readiness {
            upstream,
            connector,
            state: tokio::sync::Mutex::default(),
        }
    }

    /// Whether the control plane answers HTTP/2: the kept connection is open, or a new one
    /// answered the tap's PING within a second. A change is logged once, naming the likely
    /// cause.
    pub async fn check(&self) -> Result<(), String> {
        let mut state = self.state.lock().await;
        if let Some((_, r)) = state
            .last
            .as_ref()
            .filter(|(at, _)| at.elapsed() < ANSWER_FOR)
        {
            return r.clone();
        }
        let open = (state.kept.as_ref()).is_some_and(|(_, driver)| !driver.is_finished());
        let now = match open {
            true => Ok(()),
            false => {
                state.kept = None;
                match answers(&self.connector).await {
                    Ok(kept) => {
                        state.kept = Some(kept);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
        };
        let changed = (state.last.as_ref()).is_none_or(|(_, r)| r.is_ok() != now.is_ok());
        match (&now, changed) {
            (Err(e), true) => tracing::warn!(upstream = %self.upstream, "Not ready: {e}"),
            (Ok(()), true) if state.last.is_some() => {
                tracing::info!(upstream = %self.upstream, "Ready: the upstream answers HTTP/2")
            }
            _ => {}
        }
        state.last = Some((Instant::now(), now.clone()));
        now
    }
}

/// Dials the upstream and says the HTTP/2 preface and one PING: ready when the PING's answer
/// comes back within a second; the connection is then kept. Otherwise why not, with the likely
/// cause read from the first bytes the upstream sent.
async fn answers(
    connector: &Connector,
) -> Result<
    (
        h2::client::SendRequest<bytes::Bytes>,
        tokio::task::JoinHandle<()>,
    ),
    String,
> {
    let io = connector.dial(WITHIN).await.map_err(|e| e.to_string())?;
    let first = Arc::new(Mutex::new(Vec::new()));
    let io = FirstBytes {
        io,
        first: first.clone(),
    };
    let answered = async {
        let (send, mut connection) = h2::client::handshake(io).await?;
        let mut ping = connection.ping_pong().expect("taken once, here");
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        match ping.ping(h2::Ping::opaque()).await {
            Ok(_) => Ok((send, driver)),
            Err(e) => {
                driver.abort();
                Err(e)
            }
        }
    };
    let why = match tokio::time::timeout(WITHIN, answered).await {
        Ok(Ok(kept)) => return Ok(kept),
        Ok(Err(e)) => Some(e),
        Err(_) => None,
    };
    let first = first.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Err(match (first.as_slice(), why) {
        // Go's TLS server (istiod's) answers a plaintext HTTP-looking hello with HTTP/1.0 400.
        (f, _) if f.starts_with(b"HTTP/") => "it answered HTTP/1, as a TLS server answers \
             plaintext: a TLS port (istiod's 15012?) needs --upstream-tls"
            .into(),
        ([0x15 | 0x16, ..], _) => {
            "it answered with TLS: a TLS port (istiod's 15012?) needs --upstream-tls".into()
        }
        ([], None) => {
            "no HTTP/2 answer within 1s: TLS on the other side, or not an xDS server?".into()
        }
        ([], Some(e)) => format!(
            "it closed the connection without an HTTP/2 answer ({e}): TLS on the other side, \
             or not an xDS server?"
        ),
        (_, _) => "it answered, but not with HTTP/2: not an xDS server?".into(),
    })
}

/// A connection that remembers the first bytes it read, to name what answered when it is not
/// HTTP/2.
struct FirstBytes {
    io: Io,
    first: Arc<Mutex<Vec<u8>>>,
}

impl AsyncRead for FirstBytes {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.len() < 16 {
            let new = &buf.filled()[before..];
            let take = new.len().min(16 - first.len());
            first.extend_from_slice(&new[..take]);
        }
        polled
    }
}

impl AsyncWrite for FirstBytes {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, data)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
