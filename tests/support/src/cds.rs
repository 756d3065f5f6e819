//! The benches' CDS pushes, hand-encoded: clusters of Istio's shape and size (a long name, about
//! 500 bytes of settings), each carrying the metadata istiod writes or as many filler bytes.

use xdstap::xds::wire::{bytes as field, istio_cluster_metadata};
use xdstap::xds::CLUSTER;

/// Cluster `i` as an encoded `Any`: its metadata when `metadata` (else filler of its size);
/// `changed` gives it other content.
pub fn cluster(i: usize, metadata: bool, changed: bool) -> Vec<u8> {
    let mut c = Vec::new();
    let name = format!(
        "outbound|8080||service-{i}.namespace-{}.svc.cluster.local",
        i % 50
    );
    field(&mut c, 1, name.as_bytes());
    field(&mut c, 4, &[8, if changed { 11 } else { 10 }]);
    let mut filler = 480;
    if metadata {
        let m = istio_cluster_metadata(&format!("service-{i}"), &format!("namespace-{}", i % 50));
        filler -= m.len();
        c.extend(m);
    }
    field(&mut c, 33, &vec![0x5a; filler]);
    let mut any = Vec::new();
    field(&mut any, 1, CLUSTER.as_bytes());
    field(&mut any, 2, &c);
    any
}

/// An encoded DiscoveryResponse of `clusters` clusters (the first changed when `changed`).
pub fn push(clusters: usize, version: &str, nonce: &str, metadata: bool, changed: bool) -> Vec<u8> {
    let mut m = Vec::new();
    field(&mut m, 1, version.as_bytes());
    for i in 0..clusters {
        field(&mut m, 2, &cluster(i, metadata, changed && i == 0));
    }
    field(&mut m, 4, CLUSTER.as_bytes());
    field(&mut m, 5, nonce.as_bytes());
    m
}
