//! The upstream side: dialing the control plane (TCP or Unix, optionally TLS) and keeping one
//! HTTP/2 connection per downstream connection, redialed lazily when it fails, so a client
//! connection maps to exactly one upstream connection as if the tap were not there.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use h2::client::SendRequest;
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::Mutex;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use super::batch::Gate;
use super::listen::{Endpoint, Io};
use super::{ProxyStats, Settings};

/// Why the upstream could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// TCP or Unix connect failed.
    #[error("upstream {upstream}: connect failed: {source}")]
    Connect {
        /// The upstream address.
        upstream: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The TLS handshake with the upstream failed.
    #[error("upstream {upstream}: TLS handshake failed: {source}")]
    Tls {
        /// The upstream address.
        upstream: String,
        /// What rustls said.
        source: std::io::Error,
    },
    /// The HTTP/2 handshake with the upstream failed.
    #[error("upstream {upstream}: HTTP/2 handshake failed: {source}")]
    Http2 {
        /// The upstream address.
        upstream: String,
        /// What h2 said.
        source: h2::Error,
    },
    /// Connecting took longer than the connect timeout.
    #[error("upstream {upstream}: connect timed out after {after:?}")]
    Timeout {
        /// The upstream address.
        upstream: String,
        /// The timeout.
        after: std::time::Duration,
    },
}

/// Dials the upstream.
pub struct Connector {
    endpoint: Endpoint,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl Connector {
    /// A connector to `endpoint`, with TLS when `tls` is given.
    pub fn new(endpoint: Endpoint, tls: Option<(TlsConnector, ServerName<'static>)>) -> Self {
        Connector { endpoint, tls }
    }

    /// The upstream address as users wrote it.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Opens a byte stream to the upstream (TCP or Unix, then TLS if configured).
    pub async fn dial(&self) -> Result<(Io, Gate), ConnectError> {
        let upstream = || self.endpoint.to_string();
        let (io, gate) = match &self.endpoint {
            Endpoint::Tcp(addr) => {
                let s = TcpStream::connect(addr.as_str()).await.map_err(|source| {
                    ConnectError::Connect {
                        upstream: upstream(),
                        source,
                    }
                })?;
                let _ = s.set_nodelay(true);
                self.tls_over(s).await?
            }
            Endpoint::Unix(path) => {
                let s =
                    UnixStream::connect(path)
                        .await
                        .map_err(|source| ConnectError::Connect {
                            upstream: upstream(),
                            source,
                        })?;
                self.tls_over(s).await?
            }
        };
        Ok((io, gate))
    }

    /// Wraps a dialed socket for reading and writing in batches, then TLS if configured.
    async fn tls_over<T>(&self, s: T) -> Result<(Io, Gate), ConnectError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (s, gate) = super::batch::wrap(s);
        match &self.tls {
            Some((tls, name)) => {
                let s = tls
                    .connect(name.clone(), s)
                    .await
                    .map_err(|source| ConnectError::Tls {
                        upstream: self.endpoint.to_string(),
                        source,
                    })?;
                Ok((Box::new(s), gate))
            }
            None => Ok((s, gate)),
        }
    }

    async fn connect_h2(&self, settings: &Settings) -> Result<SendRequest<Bytes>, ConnectError> {
        let (io, gate) = self.dial().await?;
        let (send, mut conn) = h2::client::Builder::new()
            .initial_window_size(settings.stream_window)
            .initial_connection_window_size(settings.connection_window)
            .max_frame_size(settings.max_frame_size)
            .max_header_list_size(settings.max_header_list_size)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|source| ConnectError::Http2 {
                upstream: self.endpoint.to_string(),
                source,
            })?;
        let upstream = self.endpoint.to_string();
        tokio::spawn(async move {
            let driven =
                std::future::poll_fn(|cx| gate.poll(cx, |cx| Pin::new(&mut conn).poll(cx)));
            if let Err(e) = driven.await {
                tracing::debug!(%upstream, error = %e, "Upstream connection ended with an error");
            }
        });
        Ok(send)
    }
}

/// The upstream connection of one downstream connection.
pub(crate) struct UpstreamConn {
    connector: Arc<super::Connector>,
    /// The live sender and a generation number, so a stream that saw a connection die only
    /// clears that connection, not a newer one another stream just dialed.
    current: Mutex<(u64, Option<SendRequest<Bytes>>)>,
}

impl UpstreamConn {
    pub(crate) fn new(connector: Arc<Connector>) -> Self {
        UpstreamConn {
            connector,
            current: Mutex::new((0, None)),
        }
    }

    /// A sender ready for one new stream; dials when there is no live connection. A dead
    /// connection is replaced once; the stream fails if the fresh one cannot be had either.
    pub(crate) async fn ready(
        &self,
        settings: &Settings,
        stats: &ProxyStats,
    ) -> Result<SendRequest<Bytes>, ConnectError> {
        for _ in 0..2 {
            let (generation, sender) = {
                let mut current = self.current.lock().await;
                match &current.1 {
                    Some(s) => (current.0, s.clone()),
                    None => {
                        let connect = self.connector.connect_h2(settings);
                        let sender =
                            match tokio::time::timeout(settings.connect_timeout, connect).await {
                                Ok(Ok(s)) => s,
                                Ok(Err(e)) => {
                                    ProxyStats::add(&stats.upstream_connect_errors, 1);
                                    return Err(e);
                                }
                                Err(_) => {
                                    ProxyStats::add(&stats.upstream_connect_errors, 1);
                                    return Err(ConnectError::Timeout {
                                        upstream: self.connector.endpoint.to_string(),
                                        after: settings.connect_timeout,
                                    });
                                }
                            };
                        current.0 += 1;
                        current.1 = Some(sender.clone());
                        (current.0, sender)
                    }
                }
            };
            match sender.ready().await {
                Ok(sender) => return Ok(sender),
                Err(e) => {
                    tracing::debug!(error = %e, "Upstream connection is gone, redialing");
                    let mut current = self.current.lock().await;
                    if current.0 == generation {
                        current.1 = None;
                    }
                }
            }
        }
        Err(ConnectError::Connect {
            upstream: self.connector.endpoint.to_string(),
            source: std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection lost"),
        })
    }
}
