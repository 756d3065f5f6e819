//! A CSDS client built from Envoy's own protos (envoy-types' tonic client) and the per-resource
//! view it reads: (short type, name) -> version, config status, client status, error details.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
use envoy_types::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse, ConfigStatus,
};

/// One resource as CSDS reports it: (version, config status, client status, error details).
pub type Reported = (String, ConfigStatus, ClientResourceStatus, String);

/// (short type, name) -> what CSDS reports of it.
pub type Seen = BTreeMap<(String, String), Reported>;

/// Every resource of one client.
pub fn resources(c: &ClientConfig) -> Seen {
    (c.generic_xds_configs.iter())
        .map(|g| {
            let key = (
                xdstap::xds::short_type(&g.type_url).to_string(),
                g.name.clone(),
            );
            let error = g
                .error_state
                .as_ref()
                .map(|e| e.details.clone())
                .unwrap_or_default();
            let reported = (
                g.version_info.clone(),
                g.config_status(),
                g.client_status(),
                error,
            );
            (key, reported)
        })
        .collect()
}

/// The client `id` in an answer; panics naming it when absent.
pub fn node<'a>(r: &'a ClientStatusResponse, id: &str) -> &'a ClientConfig {
    (r.config.iter())
        .find(|c| c.node.as_ref().is_some_and(|n| n.id == id))
        .unwrap_or_else(|| panic!("no {id} in {r:?}"))
}

/// Every client the tap at `admin` knows, over CSDS's unary call.
pub async fn fetch(admin: &str) -> ClientStatusResponse {
    let mut client = ClientStatusDiscoveryServiceClient::connect(format!("http://{admin}"))
        .await
        .unwrap();
    (client
        .fetch_client_status(ClientStatusRequest::default())
        .await)
        .unwrap()
        .into_inner()
}
