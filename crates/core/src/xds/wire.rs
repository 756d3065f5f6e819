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
