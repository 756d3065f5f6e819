//! The upstream side: dialing the control plane (TCP or Unix, optionally TLS), once per
//! downstream connection, so a client connection maps to exactly one upstream connection as if
//! the tap were not there.

use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use super::listen::{Endpoint, Io};

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
#[derive(Clone)]
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

    /// Opens a byte stream to the upstream (TCP or Unix, then TLS if configured) within
    /// `timeout`.
    pub async fn dial(&self, timeout: std::time::Duration) -> Result<Io, ConnectError> {
        match tokio::time::timeout(timeout, self.connect()).await {
            Ok(r) => r,
            Err(_) => Err(ConnectError::Timeout {
                upstream: self.endpoint.to_string(),
                after: timeout,
            }),
        }
    }

    async fn connect(&self) -> Result<Io, ConnectError> {
        let failed = |source| ConnectError::Connect {
            upstream: self.endpoint.to_string(),
            source,
        };
        match &self.endpoint {
            Endpoint::Tcp(addr) => {
                let s = TcpStream::connect(addr.as_str()).await.map_err(failed)?;
                let _ = s.set_nodelay(true);
                self.tls_over(s).await
            }
            Endpoint::Unix(path) => {
                let s = UnixStream::connect(path).await.map_err(failed)?;
                self.tls_over(s).await
            }
        }
    }

    async fn tls_over<T>(&self, s: T) -> Result<Io, ConnectError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        match &self.tls {
            Some((tls, name)) => {
                let s = tls
                    .connect(name.clone(), s)
                    .await
                    .map_err(|source| ConnectError::Tls {
                        upstream: self.endpoint.to_string(),
                        source,
                    })?;
                Ok(Box::new(s))
            }
            None => Ok(Box::new(s)),
        }
    }
}
