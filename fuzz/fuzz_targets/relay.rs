//! The relay's reading of a connection, on any bytes both ways, split anywhere: frames and HPACK
//! header blocks read, streams opened and ended for their observers, the tap's GOAWAY asked for
//! at some point. No panic; what would be written each way is exactly what was read (the one
//! piece that is not, the tap's GOAWAY, only toward the client, at most once); every stream an
//! observer saw open it saw end once.
#![no_main]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use xdstap::proxy::{
    ConnectionReader, Direction, Headers, Observe, ProxyStats, StreamEnd, StreamInfo,
    StreamObserver, PREFACE,
};

/// Streams opened and ended, by observer.
#[derive(Default)]
struct Ledger {
    opened: AtomicU64,
    ends: Mutex<Vec<u64>>,
}

struct Books(Arc<Ledger>);

struct Watcher(Arc<Ledger>, u64, bool);

impl Observe for Books {
    fn on_stream(&self, info: &StreamInfo<'_>) -> Box<dyn StreamObserver> {
        self.0.opened.fetch_add(1, Ordering::Relaxed);
        Box::new(Watcher(self.0.clone(), info.seq, false))
    }
}

impl StreamObserver for Watcher {
    fn on_data(&mut self, _: Direction, _: &Bytes) {
        assert!(!self.2, "data after the end");
    }
    fn on_response_headers(&mut self, _: &Headers) {}
    fn on_end(&mut self, _: &StreamEnd) {
        assert!(!self.2, "a second end");
        self.2 = true;
        self.0.ends.lock().unwrap().push(self.1);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, rest)) = data.split_first() else {
        return;
    };
    // Half the bytes each way; the client's start with the preface, most of the time.
    let (a, b) = rest.split_at(rest.len() / 2);
    let mut client = if knobs & 1 == 0 {
        PREFACE.to_vec()
    } else {
        Vec::new()
    };
    client.extend_from_slice(a);
    let sides = [Bytes::from(client), Bytes::copy_from_slice(b)];
    let piece = 1 + (knobs as usize >> 1) % 97;
    let drain_after = (knobs as usize >> 4) % 5;

    let ledger = Arc::new(Ledger::default());
    let mut seen = ConnectionReader::new(
        Arc::new(Books(ledger.clone())),
        Arc::new(ProxyStats::default()),
        Arc::new(AtomicU64::new(1)),
        "fuzz".into(),
        "upstream".into(),
    );
    let mut out: [VecDeque<Bytes>; 2] = Default::default();
    let mut pos = [0usize; 2];
    let mut round = 0;
    while pos[0] < sides[0].len() || pos[1] < sides[1].len() {
        for (d, direction) in [Direction::Request, Direction::Response]
            .into_iter()
            .enumerate()
        {
            let end = (pos[d] + piece + round % 7).min(sides[d].len());
            if end > pos[d] {
                seen.pass(direction, sides[d].slice(pos[d]..end), &mut out[d]);
                pos[d] = end;
            }
        }
        round += 1;
        if round == drain_after {
            seen.drain();
        }
        if let Some(goaway) = seen.goaway_when_idle() {
            out[1].push_back(goaway);
        }
    }
    drop(seen);

    for (d, side) in sides.iter().enumerate() {
        let range = side.as_ptr() as usize..side.as_ptr() as usize + side.len();
        let (read, injected): (Vec<&Bytes>, Vec<&Bytes>) = out[d]
            .iter()
            .filter(|p| !p.is_empty())
            .partition(|p| range.contains(&(p.as_ptr() as usize)));
        let written: Vec<u8> = read.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(
            &written[..],
            &side[..],
            "the bytes written are the bytes read"
        );
        match d {
            0 => assert!(injected.is_empty(), "nothing added toward the upstream"),
            _ => assert!(injected.len() <= 1, "one GOAWAY at most"),
        }
    }
    let ends = ledger.ends.lock().unwrap();
    assert_eq!(ends.len() as u64, ledger.opened.load(Ordering::Relaxed));
});
