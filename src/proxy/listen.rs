//! Where the tap listens and what it accepts: TCP or Unix sockets, plaintext (h2c with prior
//! knowledge) or TLS. Accepting never runs a handshake; the connection task does.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio_rustls::TlsAcceptor;

use super::batch::Gate;

/// Any byte stream a connection runs on.
pub trait AsyncIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncIo for T {}

/// A boxed connection: TCP, Unix, or either under TLS.
pub type Io = Box<dyn AsyncIo>;

/// A socket address as users write it: `host:port` or `unix:/path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `host:port`; the host is resolved at each connect.
    Tcp(String),
    /// `unix:/path/to/socket`.
    Unix(PathBuf),
}

impl Endpoint {
    /// The host part of a TCP endpoint (brackets of an IPv6 literal removed).
    pub fn host(&self) -> Option<&str> {
        match self {
            Endpoint::Tcp(addr) => {
                let host = addr.rsplit_once(':').map(|(h, _)| h)?;
                Some(host.trim_start_matches('[').trim_end_matches(']'))
            }
            Endpoint::Unix(_) => None,
        }
    }
}

impl FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("a unix: address needs a path, e.g. unix:/var/run/xds.sock".into());
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err("expected host:port or unix:/path".into());
        };
        if host.is_empty() {
            return Err("the host is empty; write 127.0.0.1:PORT or [::1]:PORT".into());
        }
        if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
            return Err("an IPv6 address needs brackets, e.g. [::1]:15010".into());
        }
        port.parse::<u16>()
            .map_err(|_| format!("the port {port:?} is not a number from 0 to 65535"))?;
        Ok(Endpoint::Tcp(s.to_string()))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(addr) => f.write_str(addr),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

enum Socket {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// A bound listening socket, with TLS if configured.
pub struct Listener {
    socket: Socket,
    tls: Option<TlsAcceptor>,
}

impl Listener {
    /// Binds `endpoint`. A stale Unix socket file left by an earlier run is replaced; any other
    /// file at that path is an error.
    pub async fn bind(endpoint: &Endpoint, tls: Option<TlsAcceptor>) -> io::Result<Self> {
        let socket = match endpoint {
            Endpoint::Tcp(addr) => Socket::Tcp(TcpListener::bind(addr.as_str()).await?),
            Endpoint::Unix(path) => {
                remove_stale_socket(path)?;
                Socket::Unix(UnixListener::bind(path)?, path.clone())
            }
        };
        Ok(Listener { socket, tls })
    }

    /// The bound address, with the real port when bound to port 0.
    pub fn local_addr(&self) -> String {
        match &self.socket {
            Socket::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            Socket::Unix(_, path) => format!("unix:{}", path.display()),
        }
    }

    pub(crate) fn tls(&self) -> Option<TlsAcceptor> {
        self.tls.clone()
    }

    /// Accepts one connection; returns it, the gate that gathers its writes, and the peer's
    /// address for logs.
    pub async fn accept(&self) -> io::Result<(Io, Gate, String)> {
        match &self.socket {
            Socket::Tcp(l) => {
                let (stream, peer) = l.accept().await?;
                // xDS is request/response chatter: never let Nagle hold an ACK back.
                stream.set_nodelay(true)?;
                let (io, gate) = super::batch::wrap(stream);
                Ok((io, gate, peer.to_string()))
            }
            Socket::Unix(l, path) => {
                let (stream, _) = l.accept().await?;
                let (io, gate) = super::batch::wrap(stream);
                Ok((io, gate, format!("unix:{}", path.display())))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Socket::Unix(_, path) = &self.socket {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn remove_stale_socket(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        assert_eq!(
            "127.0.0.1:15010".parse(),
            Ok(Endpoint::Tcp("127.0.0.1:15010".into()))
        );
        assert_eq!("[::1]:0".parse(), Ok(Endpoint::Tcp("[::1]:0".into())));
        assert_eq!(
            "unix:/tmp/x.sock".parse(),
            Ok(Endpoint::Unix("/tmp/x.sock".into()))
        );
        assert!("15010".parse::<Endpoint>().is_err());
        assert!("host:99999".parse::<Endpoint>().is_err());
        assert!("::1:80".parse::<Endpoint>().is_err());
        assert!("unix:".parse::<Endpoint>().is_err());
        assert_eq!(Endpoint::Tcp("[::1]:5".into()).host(), Some("::1"));
    }
}
