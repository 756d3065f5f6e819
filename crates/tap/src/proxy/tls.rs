//! rustls configuration for both sides, built from PEM files. ALPN is `h2` on both sides: xDS
//! over TLS is always HTTP/2.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// A TLS file or setting that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or held nothing usable.
    #[error("{what} {path}: {reason}")]
    File {
        /// Which file this is (certificate, key, CA).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// rustls refused the combination (key does not match certificate, ...).
    #[error("{0}")]
    Config(String),
    /// The SNI name is not a valid DNS name or IP address.
    #[error("invalid server name {0:?}")]
    ServerName(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |reason: String| TlsError::File {
        what,
        path: path.into(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no PEM certificate found".into()));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        what: "private key",
        path: path.into(),
        reason: e.to_string(),
    })
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certs("CA bundle", path)? {
        store.add(cert).map_err(|e| TlsError::File {
            what: "CA bundle",
            path: path.into(),
            reason: e.to_string(),
        })?;
    }
    Ok(store)
}

/// Downstream TLS: the tap's certificate, and optionally a CA that client certificates must chain
/// to (mTLS).
#[derive(Clone, Debug, Default)]
pub struct ServerTls {
    /// PEM certificate chain presented to clients.
    pub cert: PathBuf,
    /// PEM private key for `cert`.
    pub key: PathBuf,
    /// PEM CA bundle; when set, clients must present a certificate that chains to it.
    pub client_ca: Option<PathBuf>,
}

impl ServerTls {
    /// Reads the files and builds an acceptor.
    pub fn acceptor(&self) -> Result<TlsAcceptor, TlsError> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                        .build()
                        .map_err(|e| {
                            TlsError::Config(format!("client CA {}: {e}", ca.display()))
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs("certificate", &self.cert)?, key(&self.key)?)
            .map_err(|e| TlsError::Config(format!("certificate {}: {e}", self.cert.display())))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// Upstream TLS: which CAs to trust, an optional client certificate, an optional SNI override.
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    /// PEM CA bundle to verify the upstream; the system roots when unset.
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain, for an upstream that requires mTLS.
    pub cert: Option<PathBuf>,
    /// PEM private key for `cert`.
    pub key: Option<PathBuf>,
    /// Server name to send and verify; the upstream host when unset.
    pub sni: Option<String>,
}

impl ClientTls {
    /// Reads the files and builds a connector with the server name to use for `default_host`.
    pub fn connector(
        &self,
        default_host: Option<&str>,
    ) -> Result<(TlsConnector, ServerName<'static>), TlsError> {
        let roots = match &self.ca {
            Some(ca) => roots(ca)?,
            None => {
                let mut store = RootCertStore::empty();
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    let _ = store.add(cert);
                }
                if store.is_empty() {
                    return Err(TlsError::Config(
                        "no system CA certificates found; set upstream_tls.ca".into(),
                    ));
                }
                store
            }
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots);
        let mut config = match (&self.cert, &self.key) {
            (Some(cert), Some(key_path)) => builder
                .with_client_auth_cert(certs("client certificate", cert)?, key(key_path)?)
                .map_err(|e| {
                    TlsError::Config(format!("client certificate {}: {e}", cert.display()))
                })?,
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(TlsError::Config(
                    "a client certificate needs both cert and key".into(),
                ))
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let name = self
            .sni
            .as_deref()
            .or(default_host)
            .ok_or_else(|| TlsError::ServerName("(none): set upstream_tls.sni".into()))?;
        let server_name = ServerName::try_from(name.to_string())
            .map_err(|_| TlsError::ServerName(name.to_string()))?;
        Ok((TlsConnector::from(Arc::new(config)), server_name))
    }
}
