//! Protobuf wire encoding by hand, for the few messages xdstap writes itself (the demo's control
//! plane and client) and for tests and benches that build xDS messages byte by byte. Decoding
//! of what passes through the tap is the streaming [`super::scan`]ner's job, not this.

/// Appends `v` as a base-128 varint.
pub fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends length-delimited field `field` (wire type 2).
pub fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    varint(out, ((field as u64) << 3) | 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Appends varint field `field` (wire type 0).
pub fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    varint(out, (field as u64) << 3);
    varint(out, v);
}

/// Cluster field 25 as istiod writes it, encoded: the filter metadata `istio` with `config`
/// (the DestinationRule of `service`'s name in `namespace`) and `services` (its host, name and
/// namespace). What the demo's clusters and the benches' pushes carry.
pub fn istio_cluster_metadata(service: &str, namespace: &str) -> Vec<u8> {
    let string = |s: &str| {
        let mut v = Vec::new();
        bytes(&mut v, 3, s.as_bytes());
        v
    };
    let entry = |key: &str, value: &[u8]| {
        let mut e = Vec::new();
        bytes(&mut e, 1, key.as_bytes());
        bytes(&mut e, 2, value);
        let mut f = Vec::new();
        bytes(&mut f, 1, &e);
        f
    };
    let host = format!("{service}.{namespace}.svc.cluster.local");
    let mut svc = entry("host", &string(&host));
    svc.extend(entry("name", &string(service)));
    svc.extend(entry("namespace", &string(namespace)));
    let (mut value, mut list, mut list_value) = (Vec::new(), Vec::new(), Vec::new());
    bytes(&mut value, 5, &svc);
    bytes(&mut list, 1, &value);
    bytes(&mut list_value, 6, &list);
    let config =
        format!("/apis/networking.istio.io/v1/namespaces/{namespace}/destination-rule/{service}");
    let mut istio = entry("config", &string(&config));
    istio.extend(entry("services", &list_value));
    let mut filter = Vec::new();
    bytes(&mut filter, 1, b"istio");
    bytes(&mut filter, 2, &istio);
    let mut metadata = Vec::new();
    bytes(&mut metadata, 1, &filter);
    let mut out = Vec::new();
    bytes(&mut out, 25, &metadata);
    out
}

/// Each top-level varint or length-delimited field as (field number, varint value or 0, bytes or
/// empty); fixed-width fields are skipped, and reading stops at the first malformed tag.
pub fn fields(mut b: &[u8]) -> Vec<(u32, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let read = |b: &mut &[u8]| -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&x, rest) = b.split_first()?;
            *b = rest;
            v |= ((x & 0x7f) as u64) << shift;
            if x & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    };
    while !b.is_empty() {
        let Some(tag) = read(&mut b) else { break };
        match tag & 7 {
            0 => out.push(((tag >> 3) as u32, read(&mut b).unwrap_or(0), vec![])),
            2 => {
                let n = read(&mut b).unwrap_or(0) as usize;
                let n = n.min(b.len());
                out.push(((tag >> 3) as u32, 0, b[..n].to_vec()));
                b = &b[n..];
            }
            1 => b = &b[8.min(b.len())..],
            5 => b = &b[4.min(b.len())..],
            _ => break,
        }
    }
    out
}
