//! What each node ran, per SotW type, when its last stream ended: the version it said it runs
//! and the resources behind it (shared with every other holder of the same set). When the node
//! reconnects stating that version, its new stream starts from what it runs instead of from
//! nothing: a cluster it already has is not "new", does not wait for endpoints, and a NACK is
//! blamed against what it really ran.
//!
//! Node ids and versions are kept as 64-bit digests, which is all a lookup needs, in one flat
//! table: an entry costs a few dozen bytes in a single allocation, whatever the names, and
//! nothing of it is scattered among what the connections leave behind. Bounded: past
//! [`MAX_ENTRIES`] the entries recorded longest ago go. No clock, no I/O.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Accepted;

/// (node, type) entries remembered at most: 100,000 nodes of a few SotW types each.
pub const MAX_ENTRIES: usize = 400_000;

/// Type URLs told apart at most; a peer inventing more costs a list of them, and their
/// entries are not kept.
const MAX_TYPES: usize = 1024;

/// The ledger; shared by every stream of a tap.
#[derive(Default)]
pub struct Ledger {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    /// By (digest of the node id, the type's place in `types`).
    by_node: HashMap<(u64, u16), Entry>,
    /// Recorded so far: orders the entries for eviction.
    seq: u64,
    types: Vec<Arc<str>>,
}

struct Entry {
    /// The digest of the version the node said it runs.
    version: u64,
    accepted: Accepted,
    seq: u64,
}

fn digest(s: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(s.as_bytes())
}

impl Ledger {
    /// Notes that `node` ran `accepted` of `type_url`, saying `version`, when its stream ended.
    pub(super) fn record(&self, node: &str, type_url: &str, version: &str, accepted: Accepted) {
        if node.is_empty() || version.is_empty() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = entries.type_place(type_url, true) else {
            return;
        };
        let key = (digest(node), t);
        if !entries.by_node.contains_key(&key) && entries.by_node.len() >= MAX_ENTRIES {
            entries.evict();
        }
        entries.seq += 1;
        let entry = Entry {
            version: digest(version),
            accepted,
            seq: entries.seq,
        };
        entries.by_node.insert(key, entry);
    }

    /// What `node` ran of `type_url` when its last stream ended, if it said `version` then.
    pub(super) fn recall(&self, node: &str, type_url: &str, version: &str) -> Option<Accepted> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let t = entries.type_place(type_url, false)?;
        let entry = entries.by_node.get(&(digest(node), t))?;
        (entry.version == digest(version)).then(|| entry.accepted.clone())
    }

    /// How many (node, type) entries are remembered.
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.by_node.len()
    }
}

impl Entries {
    /// Where `type_url` is in the list of types, added when `add` and there is room.
    fn type_place(&mut self, type_url: &str, add: bool) -> Option<u16> {
        if let Some(i) = self.types.iter().position(|t| &**t == type_url) {
            return Some(i as u16);
        }
        if !add || self.types.len() >= MAX_TYPES {
            return None;
        }
        self.types.push(type_url.into());
        Some((self.types.len() - 1) as u16)
    }

    /// Drops the oldest hundredth of the entries: one pass over them for many records.
    fn evict(&mut self) {
        let mut seqs: Vec<u64> = self.by_node.values().map(|e| e.seq).collect();
        let k = (seqs.len() / 100).max(1);
        let (_, cut, _) = seqs.select_nth_unstable(k - 1);
        let cut = *cut;
        self.by_node.retain(|_, e| e.seq > cut);
    }
}
