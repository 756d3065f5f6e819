//! The streaming xDS decoder on any message of any kind, fed in two pieces, plain or claimed to
//! be gzip or deflate: no panic, and the result does not depend on where it was split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xdstap::xds::decode::MessageDecoder;
use xdstap::xds::scan::MessageKind;
use xdstap::xds::Api;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let kind = match data[0] & 3 {
        0 => MessageKind::Request(Api::Sotw),
        1 => MessageKind::Response(Api::Sotw),
        2 => MessageKind::Request(Api::Delta),
        _ => MessageKind::Response(Api::Delta),
    };
    let encoding = match (data[0] >> 2) & 3 {
        1 => Some("gzip"),
        2 => Some("deflate"),
        _ => None,
    };
    let body = &data[2..];
    let cut = (data[1] as usize).min(body.len());
    let decode = |pieces: &[&[u8]]| {
        let mut d = MessageDecoder::new(
            kind,
            body.len() as u32,
            encoding.is_some(),
            encoding,
            1 << 20,
        );
        for p in pieces {
            d.feed(p);
        }
        format!("{:?}", d.finish())
    };
    let (a, b) = body.split_at(cut);
    assert_eq!(decode(&[body]), decode(&[a, b]));
});
