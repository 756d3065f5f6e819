//! Cluster field 25 as istiod writes it, hand-encoded for the benches' pushes: filter metadata
//! `istio` with `config` (the DestinationRule) and `services` (host, name, namespace).

use xdstap::xds::wire::bytes as field;

/// The metadata of a cluster for Service `service` in `namespace`, made from the
/// DestinationRule of the same name, as field 25 of a Cluster, encoded.
pub fn metadata(service: &str, namespace: &str) -> Vec<u8> {
    let string = |s: &str| {
        let mut v = Vec::new();
        field(&mut v, 3, s.as_bytes());
        v
    };
    let entry = |key: &str, value: &[u8]| {
        let mut e = Vec::new();
        field(&mut e, 1, key.as_bytes());
        field(&mut e, 2, value);
        let mut f = Vec::new();
        field(&mut f, 1, &e);
        f
    };
    let host = format!("{service}.{namespace}.svc.cluster.local");
    let mut svc = entry("host", &string(&host));
    svc.extend(entry("name", &string(service)));
    svc.extend(entry("namespace", &string(namespace)));
    let (mut value, mut list, mut list_value) = (Vec::new(), Vec::new(), Vec::new());
    field(&mut value, 5, &svc);
    field(&mut list, 1, &value);
    field(&mut list_value, 6, &list);
    let config =
        format!("/apis/networking.istio.io/v1/namespaces/{namespace}/destination-rule/{service}");
    let mut istio = entry("config", &string(&config));
    istio.extend(entry("services", &list_value));
    let mut filter = Vec::new();
    field(&mut filter, 1, b"istio");
    field(&mut filter, 2, &istio);
    let mut metadata = Vec::new();
    field(&mut metadata, 1, &filter);
    let mut out = Vec::new();
    field(&mut out, 25, &metadata);
    out
}
