//! What each node ran, per SotW type, when its last stream ended: the version it said it runs
//! and the resources behind it (shared with every other holder of the same set, so an entry
//! costs its names and a pointer). When the node reconnects stating that version, its new
//! stream starts from what it runs instead of from nothing: a cluster it already has is not
//! "new", does not wait for endpoints, and a NACK is blamed against what it really ran.
//! Bounded: past [`MAX_NODES`] nodes the ones recorded longest ago go. No clock, no I/O.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Accepted;

/// Nodes remembered at most (each with one entry per SotW type it had).
pub const MAX_NODES: usize = 100_000;

/// The ledger; shared by every stream of a tap.
#[derive(Default)]
pub struct Ledger {
    nodes: Mutex<Nodes>,
}

#[derive(Default)]
struct Nodes {
    by_id: HashMap<Box<str>, Entry>,
    /// Recorded so far: orders the entries for eviction.
    seq: u64,
    /// Type URLs, each held once for every node.
    types: Vec<Arc<str>>,
}

struct Entry {
    /// Per type: the version the node said it runs, and what that is.
    types: Vec<(Arc<str>, Box<str>, Accepted)>,
    seq: u64,
}

impl Ledger {
    /// Notes that `node` ran `accepted` of `type_url`, saying `version`, when its stream ended.
    pub(super) fn record(&self, node: &str, type_url: &str, version: &str, accepted: Accepted) {
        if node.is_empty() || version.is_empty() {
            return;
        }
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes.seq += 1;
        let seq = nodes.seq;
        let type_url = nodes.type_url(type_url);
        if !nodes.by_id.contains_key(node) && nodes.by_id.len() >= MAX_NODES {
            nodes.evict();
        }
        let entry = nodes.by_id.entry(node.into()).or_insert_with(|| Entry {
            types: Vec::new(),
            seq,
        });
        entry.seq = seq;
        let value = (type_url.clone(), version.into(), accepted);
        match entry.types.iter_mut().find(|(t, ..)| *t == type_url) {
            Some(slot) => *slot = value,
            None => entry.types.push(value),
        }
    }

    /// What `node` ran of `type_url` when its last stream ended, if it said `version` then.
    pub(super) fn recall(&self, node: &str, type_url: &str, version: &str) -> Option<Accepted> {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let entry = nodes.by_id.get(node)?;
        (entry.types.iter())
            .find(|(t, v, _)| &**t == type_url && &**v == version)
            .map(|(.., accepted)| accepted.clone())
    }

    /// How many nodes are remembered.
    #[cfg(test)]
    pub fn nodes(&self) -> usize {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).by_id.len()
    }
}

impl Nodes {
    fn type_url(&mut self, type_url: &str) -> Arc<str> {
        if let Some(t) = self.types.iter().find(|t| &***t == type_url) {
            return t.clone();
        }
        let t: Arc<str> = type_url.into();
        // A stream has at most a few hundred types; a peer inventing more costs a list of them.
        if self.types.len() < 1024 {
            self.types.push(t.clone());
        }
        t
    }

    /// Drops the oldest hundredth of the entries: one pass over them for many records.
    fn evict(&mut self) {
        let mut seqs: Vec<u64> = self.by_id.values().map(|e| e.seq).collect();
        let k = (seqs.len() / 100).max(1);
        let (_, cut, _) = seqs.select_nth_unstable(k - 1);
        let cut = *cut;
        self.by_id.retain(|_, e| e.seq > cut);
    }
}
