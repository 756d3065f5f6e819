//! `envoy.service.status.v3.ClientStatusDiscoveryService`, as a control plane would serve it:
//! one `ClientConfig` per node the tap has seen, a `GenericXdsConfig` per resource with its
//! version and statuses. Names, versions and statuses only: no resource contents, Secrets
//! included (the tap never keeps any).

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::Admin;
use crate::api::csds::{
    self, client_config::GenericXdsConfig, client_status_discovery_service_server as server,
    string_matcher::MatchPattern,
};
use crate::views::board::resources::{ClientStatus, ConfigStatus, NodeResources};

/// The service over the status board.
pub struct Csds(pub Arc<Admin>);

#[tonic::async_trait]
impl server::ClientStatusDiscoveryService for Csds {
    type StreamClientStatusStream =
        Pin<Box<dyn Stream<Item = Result<csds::ClientStatusResponse, Status>> + Send>>;

    async fn stream_client_status(
        &self,
        request: Request<Streaming<csds::ClientStatusRequest>>,
    ) -> Result<Response<Self::StreamClientStatusStream>, Status> {
        let admin = self.0.clone();
        let requests = request.into_inner();
        let answers = requests.map(move |r| r.and_then(|r| answer(&admin, &r)));
        Ok(Response::new(Box::pin(answers)))
    }

    async fn fetch_client_status(
        &self,
        request: Request<csds::ClientStatusRequest>,
    ) -> Result<Response<csds::ClientStatusResponse>, Status> {
        answer(&self.0, request.get_ref()).map(Response::new)
    }
}

/// The nodes a request's matchers select (none: every node), with their resources.
fn answer(
    admin: &Admin,
    request: &csds::ClientStatusRequest,
) -> Result<csds::ClientStatusResponse, Status> {
    let matchers: Vec<&csds::StringMatcher> = (request.node_matchers.iter())
        .map(|m| {
            m.node_id.as_ref().ok_or_else(|| {
                Status::invalid_argument("node_matchers: only node_id matchers are served")
            })
        })
        .collect::<Result<_, _>>()?;
    for m in &matchers {
        if m.match_pattern.is_none() {
            return Err(Status::invalid_argument(
                "node_matchers.node_id: exact, prefix, suffix or contains is needed",
            ));
        }
    }
    let wanted = |id: &str| matchers.is_empty() || matchers.iter().any(|m| matches(m, id));
    let config = (admin.status.resources(wanted).into_iter())
        .map(client_config)
        .collect();
    Ok(csds::ClientStatusResponse { config })
}

fn matches(m: &csds::StringMatcher, id: &str) -> bool {
    let fold = |s: &str| match m.ignore_case {
        true => s.to_lowercase(),
        false => s.to_string(),
    };
    let id = fold(id);
    match &m.match_pattern {
        Some(MatchPattern::Exact(s)) => id == fold(s),
        Some(MatchPattern::Prefix(s)) => id.starts_with(&fold(s)),
        Some(MatchPattern::Suffix(s)) => id.ends_with(&fold(s)),
        Some(MatchPattern::Contains(s)) => id.contains(&fold(s)),
        None => false,
    }
}

fn timestamp(ns: u64) -> csds::Timestamp {
    csds::Timestamp {
        seconds: (ns / 1_000_000_000) as i64,
        nanos: (ns % 1_000_000_000) as i32,
    }
}

fn client_config(n: NodeResources) -> csds::ClientConfig {
    let (name, version) = match n.user_agent.rsplit_once(' ') {
        Some((name, version)) => (name.to_string(), version.to_string()),
        None => (n.user_agent.clone(), String::new()),
    };
    let generic_xds_configs = (n.resources.into_iter())
        .map(|r| GenericXdsConfig {
            type_url: r.type_url,
            name: r.name,
            version_info: r.version,
            last_updated: Some(timestamp(r.last_updated)),
            config_status: match r.config {
                ConfigStatus::Synced => csds::ConfigStatus::Synced,
                ConfigStatus::NotSent => csds::ConfigStatus::NotSent,
                ConfigStatus::Stale => csds::ConfigStatus::Stale,
                ConfigStatus::Error => csds::ConfigStatus::Error,
                ConfigStatus::Unspecified => csds::ConfigStatus::Unknown,
            } as i32,
            client_status: match r.client {
                ClientStatus::Acked | ClientStatus::Warming => csds::ClientResourceStatus::Acked,
                ClientStatus::Nacked => csds::ClientResourceStatus::Nacked,
                ClientStatus::Requested => csds::ClientResourceStatus::Requested,
                ClientStatus::ReceivedError => csds::ClientResourceStatus::ReceivedError,
                ClientStatus::DoesNotExist | ClientStatus::Expired => {
                    csds::ClientResourceStatus::DoesNotExist
                }
                ClientStatus::Unknown | ClientStatus::Unspecified => {
                    csds::ClientResourceStatus::Unknown
                }
            } as i32,
            error_state: r
                .error
                .map(|(details, version_info, at)| csds::UpdateFailureState {
                    last_update_attempt: Some(timestamp(at)),
                    details,
                    version_info,
                }),
        })
        .collect();
    csds::ClientConfig {
        node: Some(csds::Node {
            id: n.id,
            cluster: n.cluster,
            user_agent_name: name,
            user_agent_version: version,
        }),
        generic_xds_configs,
    }
}
