//! Where the tap listens and what it accepts: TCP or Unix sockets, plaintext (h2c with prior
//! knowledge) or TLS. Accepting never runs a handshake; the connection task does.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio_rustls::TlsAcceptor;

/// Any byte stream a connection runs on.
pub trait AsyncIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncIo for T {}

/// A boxed connection: TCP, Unix, or either under TLS.
pub type Io = Box<dyn AsyncIo>;

/// How long a new connection may stay silent before it is closed: an xDS client speaks first
/// (the HTTP/2 preface), as does an admin client; one that never does holds a descriptor and,
/// on the xDS listener, would hold a connection to the control plane too.
pub const FIRST_BYTES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits at most `timeout` for the peer's first bytes; gives back the connection with them
/// still to be read, or `None` when the peer said nothing (or closed) in time.
pub async fn first_bytes(mut io: Io, timeout: std::time::Duration) -> Option<Io> {
    use tokio::io::AsyncReadExt;
    let mut first = vec![0u8; 4096];
    match tokio::time::timeout(timeout, io.read(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {
            first.truncate(n);
            Some(Box::new(Prefixed { first, pos: 0, io }))
        }
        _ => None,
    }
}

/// A connection whose first bytes were read already: they are read again first.
struct Prefixed {
    first: Vec<u8>,
    pos: usize,
    io: Io,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        if self.pos < self.first.len() {
            let n = (self.first.len() - self.pos).min(buf.remaining());
            let pos = self.pos;
            buf.put_slice(&self.first[pos..pos + n]);
            self.pos += n;
            if self.pos == self.first.len() {
                self.first = Vec::new();
                self.pos = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, data)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

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

/// Why a string is not an [`Endpoint`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// `unix:` and nothing after it.
    #[error("a unix: address needs a path, e.g. unix:/var/run/xds.sock")]
    NoPath,
    /// No `:` at all.
    #[error("expected host:port or unix:/path")]
    NoPort,
    /// `:15010`.
    #[error("the host is empty; write 127.0.0.1:PORT or [::1]:PORT")]
    EmptyHost,
    /// `::1:80`.
    #[error("an IPv6 address needs brackets, e.g. [::1]:15010")]
    Brackets,
    /// A port that is not a number from 0 to 65535.
    #[error("the port {0:?} is not a number from 0 to 65535")]
    Port(String),
}

impl FromStr for Endpoint {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Self, AddressError> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(AddressError::NoPath);
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(AddressError::NoPort);
        };
        if host.is_empty() {
            return Err(AddressError::EmptyHost);
        }
        if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
            return Err(AddressError::Brackets);
        }
        port.parse::<u16>()
            .map_err(|_| AddressError::Port(port.to_string()))?;
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
    /// The listener, its path, and the (device, inode) of the socket file it created, so that
    /// only that file is ever removed.
    Unix(UnixListener, PathBuf, (u64, u64)),
}

/// A bound listening socket, with TLS if configured.
pub struct Listener {
    socket: Socket,
    tls: Option<TlsAcceptor>,
}

impl Listener {
    /// Binds `endpoint`, plaintext until [`Listener::with_tls`]. A Unix socket file that nobody
    /// listens on any more (left by an earlier run) is replaced; a live socket or any other
    /// file at that path is an error, and is left as it is.
    pub async fn bind(endpoint: &Endpoint) -> io::Result<Self> {
        let socket = match endpoint {
            Endpoint::Tcp(addr) => Socket::Tcp(bind_tcp(addr).await?),
            Endpoint::Unix(path) => {
                remove_stale_socket(path)?;
                let listener = UnixListener::bind(path)?;
                Socket::Unix(listener, path.clone(), file_id(path)?)
            }
        };
        Ok(Listener { socket, tls: None })
    }

    /// Lets only the tap's own user connect to a Unix socket (0600), whatever the umask: the
    /// admin socket answers for every node of the mesh. TCP is untouched.
    pub fn owner_only(self) -> io::Result<Self> {
        if let Socket::Unix(_, path, _) = &self.socket {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
        Ok(self)
    }

    /// Accepts TLS on this listener when `tls` is given.
    pub fn with_tls(mut self, tls: Option<TlsAcceptor>) -> Self {
        self.tls = tls;
        self
    }

    /// The bound address, with the real port when bound to port 0.
    pub fn local_addr(&self) -> String {
        match &self.socket {
            Socket::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            Socket::Unix(_, path, _) => format!("unix:{}", path.display()),
        }
    }

    pub(crate) fn tls(&self) -> Option<TlsAcceptor> {
        self.tls.clone()
    }

    /// Accepts one connection; returns it and the peer's address for logs.
    pub async fn accept(&self) -> io::Result<(Io, String)> {
        match &self.socket {
            Socket::Tcp(l) => {
                let (stream, peer) = l.accept().await?;
                // xDS is request/response chatter: never let Nagle hold an ACK back.
                stream.set_nodelay(true)?;
                Ok((Box::new(stream), peer.to_string()))
            }
            Socket::Unix(l, path, _) => {
                let (stream, _) = l.accept().await?;
                Ok((Box::new(stream), format!("unix:{}", path.display())))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Only the socket file this listener created: not one that replaced it since.
        if let Socket::Unix(_, path, id) = &self.socket {
            if file_id(path).is_ok_and(|now| now == *id) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Connections the kernel holds for the tap before it accepts them (capped by
/// `net.core.somaxconn`): when a control plane restarts, every proxy reconnects at once, and
/// a SYN that finds the queue full is dropped and sent again only a second later.
const BACKLOG: u32 = 4096;

/// Binds `addr` (resolved; the first address that binds) and listens with [`BACKLOG`].
async fn bind_tcp(addr: &str) -> io::Result<TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        let socket = match a {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr} resolves to no address"),
        )
    }))
}

fn file_id(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

/// Removes a socket file nobody listens on; refuses, naming the path, when the file is not a
/// socket or a process still accepts on it.
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; not touching it",
                path.display()
            ),
        ));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("another process listens on {}", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path),
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
