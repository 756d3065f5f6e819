//! What each node ran, per type, when its last stream ended. SotW: the version it said it
//! runs and the resources behind it (shared with every other holder of the same set). Delta:
//! each resource's content and version, by digest. When the node reconnects stating that
//! version (SotW), or versions that are all those (Delta), its new stream starts from what it
//! runs instead of from nothing: a cluster it already has is not "new", does not wait for
//! endpoints, and a NACK is blamed against what it really ran.
//!
//! Node ids, names and versions are kept as 64-bit digests, which is all a lookup needs, in one
//! flat table: an entry costs a few dozen bytes in a single allocation (a Delta one, 24 bytes a
//! resource more), whatever the names, and nothing of it is scattered among what the
//! connections leave behind. Bounded: past [`MAX_ENTRIES`] entries, or [`MAX_DELTA_HELD`] Delta
//! resources in all, the entries recorded longest ago go. No clock, no I/O.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{version_digest, Accepted, Held};

/// (node, type) entries remembered at most: 100,000 nodes of a few SotW types each.
pub const MAX_ENTRIES: usize = 400_000;

/// Delta resources remembered at most, over all entries (24 MiB): 10,000 nodes of 100 each.
pub const MAX_DELTA_HELD: usize = 1_000_000;

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
    /// Delta resources in the entries.
    delta_held: usize,
}

struct Entry {
    ran: Ran,
    seq: u64,
}

enum Ran {
    /// SotW: the digest of the version the node said it runs, and what that was.
    Sotw { version: u64, accepted: Accepted },
    /// Delta: (digest of the name, what it had), sorted by the name's digest.
    Delta(Box<[(u64, Held)]>),
}

impl Ran {
    fn delta_held(&self) -> usize {
        match self {
            Ran::Sotw { .. } => 0,
            Ran::Delta(held) => held.len(),
        }
    }
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
        let version = digest(version);
        self.insert(node, type_url, Ran::Sotw { version, accepted });
    }

    /// Notes that `node` had `held` of Delta `type_url` when its stream ended. A set larger
    /// than the whole budget is not kept (nor what the node had before it).
    pub(super) fn record_delta(&self, node: &str, type_url: &str, held: &HashMap<String, Held>) {
        if node.is_empty() {
            return;
        }
        if held.is_empty() || held.len() > MAX_DELTA_HELD {
            let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(t) = entries.type_place(type_url, false) {
                entries.remove(&(digest(node), t));
            }
            return;
        }
        let mut list: Vec<(u64, Held)> = held.iter().map(|(n, h)| (digest(n), *h)).collect();
        list.sort_unstable_by_key(|(n, _)| *n);
        self.insert(node, type_url, Ran::Delta(list.into_boxed_slice()));
    }

    fn insert(&self, node: &str, type_url: &str, ran: Ran) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = entries.type_place(type_url, true) else {
            return;
        };
        let key = (digest(node), t);
        entries.remove(&key);
        if entries.by_node.len() >= MAX_ENTRIES {
            entries.evict();
        }
        while entries.delta_held + ran.delta_held() > MAX_DELTA_HELD {
            entries.evict();
        }
        entries.seq += 1;
        entries.delta_held += ran.delta_held();
        let seq = entries.seq;
        entries.by_node.insert(key, Entry { ran, seq });
    }

    /// What `node` ran of SotW `type_url` when its last stream ended, if it said `version` then.
    pub(super) fn recall(&self, node: &str, type_url: &str, version: &str) -> Option<Accepted> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let t = entries.type_place(type_url, false)?;
        match &entries.by_node.get(&(digest(node), t))?.ran {
            Ran::Sotw {
                version: v,
                accepted,
            } if *v == digest(version) => Some(accepted.clone()),
            _ => None,
        }
    }

    /// What `node` has of Delta `type_url`, reconnecting with the `stated` (name, version)
    /// pairs: known when every one is a resource its last stream ended with, at that version
    /// (a version left empty says nothing, and makes it unknown). Only the stated resources.
    pub(super) fn recall_delta(
        &self,
        node: &str,
        type_url: &str,
        stated: &[(String, String)],
    ) -> Option<Accepted> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let t = entries.type_place(type_url, false)?;
        let Ran::Delta(list) = &entries.by_node.get(&(digest(node), t))?.ran else {
            return None;
        };
        let mut had = HashMap::with_capacity(stated.len());
        for (name, version) in stated {
            if version.is_empty() {
                return None;
            }
            let n = digest(name);
            let i = list.binary_search_by_key(&n, |(k, _)| *k).ok()?;
            let held = list[i].1;
            if held.version != version_digest(version) {
                return None;
            }
            had.insert(name.clone(), held);
        }
        Some(Accepted::Digests(had))
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

    fn remove(&mut self, key: &(u64, u16)) {
        if let Some(old) = self.by_node.remove(key) {
            self.delta_held -= old.ran.delta_held();
        }
    }

    /// Drops the oldest hundredth of the entries: one pass over them for many records.
    fn evict(&mut self) {
        let mut seqs: Vec<u64> = self.by_node.values().map(|e| e.seq).collect();
        if seqs.is_empty() {
            return;
        }
        let k = (seqs.len() / 100).max(1);
        let (_, cut, _) = seqs.select_nth_unstable(k - 1);
        let cut = *cut;
        self.by_node.retain(|_, e| e.seq > cut);
        self.delta_held = self.by_node.values().map(|e| e.ran.delta_held()).sum();
    }
}
