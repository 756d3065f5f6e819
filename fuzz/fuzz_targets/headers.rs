//! HPACK header blocks as the relay reads them (one decoder per direction, kept in step with
//! the peer's table): any sequence of blocks, any table size the peers agree. No panic; a block
//! either fails (and the caller stops observing) or gives back at most what the block could
//! decode to within the bound: the kept values come to at most `MAX_HEADER_LIST` bytes of the
//! wire, three times that once invalid UTF-8 is replaced.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xdstap::proxy::{HeaderReader, MAX_HEADER_LIST};

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, mut rest)) = data.split_first() else {
        return;
    };
    let mut reader = HeaderReader::default();
    reader.allow_table_size(u32::from(knobs) << 9);
    // Blocks: a two-byte length, then that many bytes (the last one takes what is left).
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let block = &rest[2..2 + n];
        rest = &rest[2 + n..];
        match reader.read(block) {
            Ok(h) => {
                let kept: usize = [
                    &h.path,
                    &h.status,
                    &h.content_type,
                    &h.grpc_encoding,
                    &h.grpc_status,
                    &h.grpc_message,
                ]
                .iter()
                .filter_map(|v| v.as_ref().map(String::len))
                .sum();
                assert!(kept <= 3 * MAX_HEADER_LIST, "kept {kept} bytes of fields");
            }
            // The decoder's state is lost with a failed block, as in the relay.
            Err(_) => return,
        }
    }
});
