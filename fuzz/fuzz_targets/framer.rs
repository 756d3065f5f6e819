//! The gRPC deframer on any bytes, split anywhere: no panic, and any split into pieces yields
//! the same events as feeding the bytes whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xdstap::grpc::{Deframed, Deframer};

#[derive(Debug, PartialEq)]
enum Seen {
    Start(bool, u32),
    Body(Vec<u8>),
    End,
    Error,
}

fn run(pieces: &[&[u8]]) -> Vec<Seen> {
    let mut d = Deframer::new();
    let mut out = Vec::new();
    let mut body = Vec::new();
    for p in pieces {
        let r = d.feed(p, &mut |e| match e {
            Deframed::Start { compressed, len } => out.push(Seen::Start(compressed, len)),
            Deframed::Body(b) => body.extend_from_slice(b),
            Deframed::End => {
                out.push(Seen::Body(std::mem::take(&mut body)));
                out.push(Seen::End);
            }
        });
        if r.is_err() {
            out.push(Seen::Error);
            break;
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let cut = data[0] as usize % data.len();
    let rest = &data[1..];
    let cut = cut.min(rest.len());
    let whole = run(&[rest]);
    let (a, b) = rest.split_at(cut);
    let split = run(&[a, b]);
    let bytes: Vec<&[u8]> = rest.chunks(1).collect();
    let one_by_one = run(&bytes);
    assert_eq!(whole, split);
    assert_eq!(whole, one_by_one);
});
