//! The CLI's way to a running tap: its gRPC API on the admin address, over TCP or a Unix
//! socket, on a small runtime of its own.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::codegen::Service;
use tonic::transport::{Channel, Uri};

use super::{EX_UNAVAILABLE, EX_USAGE};
use xdstap::api::csds::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
use xdstap::api::v1::tap_client::TapClient;
use xdstap::proxy::{AddressError, Endpoint};

/// How long a connect to the tap may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer read from a tap: a fleet's rollouts with every node listed, or its CSDS,
/// run to tens of megabytes (gRPC's default limit is 4 MiB).
const MAX_ANSWER: usize = 1 << 30;

/// Why the tap could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// Bad `--admin`.
    #[error("invalid --admin {admin:?}: {reason}")]
    Address {
        /// The address given.
        admin: String,
        /// What is wrong with it.
        reason: AddressError,
    },
    /// An address tonic cannot make a URI of.
    #[error("invalid --admin {admin:?}: {reason}")]
    Uri {
        /// The address given.
        admin: String,
        /// Why.
        reason: http::uri::InvalidUri,
    },
    /// No connection.
    #[error("cannot reach the tap's admin server at {admin}: {why}")]
    Connect {
        /// The address.
        admin: String,
        /// The innermost cause (refused, no such file).
        why: String,
    },
    /// The call failed.
    #[error("the tap at {admin} answered: {}", status.message())]
    Call {
        /// The address.
        admin: String,
        /// The tap's answer.
        status: tonic::Status,
    },
    /// Several taps asked, and none answered.
    #[error("no tap answered: {}", .0.join("; "))]
    Nobody(Vec<String>),
}

impl AskError {
    /// 64 for a bad address, 69 when the tap cannot be reached or failed.
    pub fn exit(&self, command: &str) -> ExitCode {
        match self {
            AskError::Address { .. } | AskError::Uri { .. } => {
                eprintln!("error: {self}");
                ExitCode::from(EX_USAGE)
            }
            AskError::Call { status, .. } if status.code() == tonic::Code::NotFound => {
                eprintln!("xdstap {command}: {self}");
                ExitCode::from(super::EX_NO_NODE)
            }
            _ => {
                eprintln!("xdstap {command}: {self}");
                ExitCode::from(EX_UNAVAILABLE)
            }
        }
    }
}

/// A connected client of the tap at `admin`.
#[derive(Clone)]
pub struct AdminClient {
    /// The generated client.
    pub client: TapClient<Channel>,
    /// CSDS on the same connection.
    pub csds: ClientStatusDiscoveryServiceClient<Channel>,
    /// The address, for messages.
    pub admin: String,
}

impl AdminClient {
    /// Connects to `endpoint`, named `admin` in messages.
    pub async fn connect_to(endpoint: &Endpoint, admin: &str) -> Result<AdminClient, AskError> {
        let failed = |e: tonic::transport::Error| {
            // The innermost source says why (refused, no such file).
            let mut why: &dyn std::error::Error = &e;
            while let Some(inner) = why.source() {
                why = inner;
            }
            AskError::Connect {
                admin: admin.into(),
                why: why.to_string(),
            }
        };
        let channel = match endpoint {
            Endpoint::Tcp(a) => {
                let uri = format!("http://{a}");
                (Channel::from_shared(uri).map_err(|reason| AskError::Uri {
                    admin: admin.into(),
                    reason,
                })?)
                .connect_timeout(CONNECT_TIMEOUT)
                .connect()
                .await
                .map_err(failed)?
            }
            // The URI is not used: the connector dials the socket.
            Endpoint::Unix(path) => (Channel::from_static("http://xdstap.admin"))
                .connect_timeout(CONNECT_TIMEOUT)
                .connect_with_connector(UnixConnector(path.clone()))
                .await
                .map_err(failed)?,
        };
        Ok(AdminClient {
            csds: ClientStatusDiscoveryServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_ANSWER),
            client: TapClient::new(channel).max_decoding_message_size(MAX_ANSWER),
            admin: admin.to_string(),
        })
    }

    /// A failed call, as an error naming the tap.
    pub fn failed(&self, status: tonic::Status) -> AskError {
        AskError::Call {
            admin: self.admin.clone(),
            status,
        }
    }
}

/// Dials a Unix socket for tonic.
#[derive(Clone)]
struct UnixConnector(PathBuf);

impl Service<Uri> for UnixConnector {
    type Response = TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            tokio::net::UnixStream::connect(path)
                .await
                .map(TokioIo::new)
        })
    }
}

/// Runs `f` on a one-thread runtime: the CLI's commands are small clients.
pub fn block_on<F: Future>(f: F) -> Result<F::Output, ExitCode> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Ok(rt.block_on(f)),
        Err(e) => {
            eprintln!("xdstap: cannot start the runtime: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}
