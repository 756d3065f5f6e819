//! The rollout view: per type and version, every node that version was pushed to and how each
//! answered (acked, nacked with the message grouped, superseded, unanswered, still pending), as
//! "I pushed V: who has it?" wants it. Fed by events on the sinks' thread, read by `/rollouts`,
//! the gRPC API, `xdstap rollout` and `xdstap wait`.
//!
//! Memory is bounded: the last [`RolloutSettings::versions`] versions per type, each with one
//! 16-byte entry per node it was pushed to beside the node's id, which every version shares;
//! the lists a report gives are capped, its counts exact.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use crate::api::v1::{self, RolloutReport};
use crate::clock::rfc3339;
use crate::correlate::{Event, Push, Scope, Timestamp, Verdict};
use crate::queue::Sink;
use crate::xds::is_type_named;
use crate::xds::short_type;

/// NACK messages told apart per rollout; past it the rest share one group.
const MAX_GROUPS: usize = 32;
/// Example nodes per NACK group.
const EXAMPLES: usize = 5;
/// Points of a rollout's acceptance curve at most.
const CURVE_POINTS: usize = 64;

/// How much the view keeps and lists.
#[derive(Clone, Debug)]
pub struct RolloutSettings {
    /// Versions kept per type (the oldest goes when a new one is pushed).
    pub versions: usize,
    /// Nodes listed per list in a report (the counts stay exact).
    pub listed: usize,
    /// Nodes whose running version and warming are remembered, at most.
    pub max_nodes: usize,
}

impl Default for RolloutSettings {
    fn default() -> Self {
        RolloutSettings {
            versions: 10,
            listed: 20,
            max_nodes: 100_000,
        }
    }
}

/// Where one node stands with one version, worst first: the API's own.
pub use crate::api::v1::rollout_node::Standing;

/// One node's entry in one rollout.
#[derive(Clone, Copy, Debug)]
struct Entry {
    standing: Standing,
    /// Push to answer, microseconds (at most 71 minutes), when answered.
    latency_us: u32,
    /// When the node was (last) pushed this version.
    pushed_at: Timestamp,
    /// Nacked: its NACK group, counted from 1 (0: none).
    group: u8,
}

/// The NACKs of one rollout with one message.
#[derive(Clone, Debug)]
struct NackTally {
    /// The group as the first node's NACK made it (its message, what it rejected, the objects
    /// behind it), counted on.
    group: v1::NackGroup,
    /// The message with what varies between runs taken out, to group by.
    key: String,
    examples: Vec<Arc<str>>,
}

/// One version of one type.
#[derive(Debug)]
struct Progress {
    /// The order versions were first pushed in (pushes read together share a time).
    seq: u64,
    type_url: Arc<str>,
    version: Arc<str>,
    first_push: Timestamp,
    last_push: Timestamp,
    last_answer: Option<Timestamp>,
    nodes: HashMap<Arc<str>, Entry>,
    nacks: Vec<NackTally>,
}

/// A CDS push that waits for EDS: its version and the EDS names.
struct Waiting {
    nonce: String,
    version: String,
    clusters: Vec<String>,
}

/// (type URL, version) per type a node answered.
type Running = Vec<(Arc<str>, Arc<str>)>;

#[derive(Default)]
struct Book {
    /// type URL -> its rollouts, oldest first.
    types: HashMap<Arc<str>, VecDeque<Progress>>,
    /// node -> what it says it runs, per type it answered.
    running: HashMap<Arc<str>, Running>,
    /// node -> its CDS push waiting for EDS.
    waiting: HashMap<Arc<str>, Waiting>,
    /// Node ids, type URLs and versions, shared by everything that names them.
    strings: HashSet<Arc<str>>,
    /// Rollouts made so far.
    made: u64,
}

/// The shared rollout view.
#[derive(Clone)]
pub struct Rollouts {
    inner: Arc<Mutex<Book>>,
    settings: RolloutSettings,
}

impl Book {
    /// The shared copy of `s`. Past `max` strings the table is not grown: a fresh copy is
    /// handed out (correct, only not shared).
    fn intern(&mut self, s: &str, max: usize) -> Arc<str> {
        if let Some(a) = self.strings.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        if self.strings.len() < max {
            self.strings.insert(a.clone());
        }
        a
    }

    /// Drops shared strings nothing else holds any more.
    fn sweep(&mut self) {
        self.strings.retain(|s| Arc::strong_count(s) > 1);
    }

    fn rollout(&mut self, type_url: &str, version: &str) -> Option<&mut Progress> {
        (self.types.get_mut(type_url)?)
            .iter_mut()
            .find(|r| &*r.version == version)
    }

    fn set_running(&mut self, node: &Arc<str>, type_url: &str, version: &str, max: usize) {
        if !self.running.contains_key(node) && self.running.len() >= max {
            return;
        }
        let type_url = self.intern(type_url, usize::MAX);
        let version = self.intern(version, max.saturating_mul(4));
        let types = self.running.entry(node.clone()).or_default();
        match types.iter_mut().find(|(t, _)| *t == type_url) {
            Some((_, v)) => *v = version,
            None => {
                // Most nodes answer one type or two: no room to spare, per node.
                types.reserve_exact(1);
                types.push((type_url, version));
            }
        }
    }

    fn running(&self, node: &str, type_url: &str) -> Option<&str> {
        self.running
            .get(node)?
            .iter()
            .find(|(t, _)| &**t == type_url)
            .map(|(_, v)| &**v)
    }

    fn on_push(&mut self, event: &Event, settings: &RolloutSettings) {
        let Event::Push { context, push } = event else {
            return;
        };
        // A heartbeat carries no new content: it counts as no push of its version.
        if push.version.is_empty() || push.heartbeat() {
            return;
        }
        let node = self.intern(&event.node_id(), settings.max_nodes.saturating_mul(2));
        if self.rollout(&context.type_url, &push.version).is_none() {
            let type_url = self.intern(&context.type_url, usize::MAX);
            let version = self.intern(&push.version, settings.max_nodes.saturating_mul(4));
            let rollouts = self.types.entry(type_url.clone()).or_default();
            if rollouts.len() >= settings.versions.max(1) {
                rollouts.pop_front();
                self.sweep();
            }
            self.made += 1;
            let rollouts = self.types.get_mut(&type_url).expect("made above");
            rollouts.push_back(Progress {
                seq: self.made,
                type_url,
                version,
                first_push: push.at,
                last_push: push.at,
                last_answer: None,
                nodes: HashMap::new(),
                nacks: Vec::new(),
            });
        }
        let r = (self.rollout(&context.type_url, &push.version)).expect("made above");
        r.last_push = r.last_push.max(push.at);
        let e = r.nodes.entry(node).or_insert(Entry {
            standing: Standing::Pending,
            latency_us: 0,
            pushed_at: push.at,
            group: 0,
        });
        // A node that runs the version stays on it; any other, pushed it again, waits again.
        if e.standing != Standing::Acked {
            e.standing = Standing::Pending;
            e.pushed_at = push.at;
        }
    }

    fn on_verdict(&mut self, event: &Event, settings: &RolloutSettings) {
        let Event::Verdict {
            context,
            push,
            verdict,
            decided_at,
            client_version,
            ..
        } = event
        else {
            return;
        };
        if push.heartbeat() {
            return;
        }
        let node = self.intern(&event.node_id(), settings.max_nodes.saturating_mul(2));
        let running = match verdict {
            Verdict::Ack => Some(push.version.as_str()),
            Verdict::Nack { .. } => client_version.as_deref().filter(|v| !v.is_empty()),
            _ => None,
        };
        if let Some(v) = running.filter(|v| !v.is_empty()) {
            self.set_running(&node, &context.type_url, v, settings.max_nodes);
        }
        if self
            .waiting
            .get(&node)
            .is_some_and(|w| w.nonce == push.nonce)
        {
            self.waiting.remove(&node);
        }
        if let Some(r) = self.rollout(&context.type_url, &push.version) {
            r.on_verdict(node, push, verdict, *decided_at);
        }
    }

    fn apply(&mut self, event: &Event, settings: &RolloutSettings) {
        match event {
            Event::Push { .. } => self.on_push(event, settings),
            Event::Verdict { .. } => self.on_verdict(event, settings),
            // A client reconnecting states what it runs: it accepted that version.
            Event::Resubscribe {
                context, version, ..
            } if !version.is_empty() => {
                let node = self.intern(&event.node_id(), settings.max_nodes.saturating_mul(2));
                self.set_running(&node, &context.type_url, version, settings.max_nodes);
                if let Some(e) =
                    (self.rollout(&context.type_url, version)).and_then(|r| r.nodes.get_mut(&node))
                {
                    e.standing = Standing::Acked;
                }
            }
            Event::Warming {
                nonce,
                version,
                clusters,
                ..
            } => {
                let node = self.intern(&event.node_id(), settings.max_nodes.saturating_mul(2));
                if clusters.is_empty() {
                    self.waiting.remove(&node);
                } else if self.waiting.contains_key(&node)
                    || self.waiting.len() < settings.max_nodes
                {
                    let waiting = Waiting {
                        nonce: nonce.clone(),
                        version: version.clone(),
                        clusters: clusters.clone(),
                    };
                    self.waiting.insert(node, waiting);
                }
            }
            _ => {}
        }
    }
}

impl Rollouts {
    /// An empty view.
    pub fn new(settings: RolloutSettings) -> Self {
        Rollouts {
            inner: Arc::default(),
            settings,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one event.
    pub fn apply(&self, event: &Event) {
        self.lock().apply(event, &self.settings);
    }

    /// The rollouts `ask` asks for (of one version, of some types, or all; with every node or
    /// not), newest first, as of `now`.
    pub fn report(&self, now: Timestamp, ask: &v1::RolloutsRequest) -> RolloutReport {
        let book = self.lock();
        let version = Some(ask.version.as_str()).filter(|v| !v.is_empty());
        let mut all: Vec<&Progress> = (book.types.iter())
            .filter(|(url, _)| is_type_named(&ask.types, url))
            .flat_map(|(_, rs)| rs.iter())
            .filter(|r| version.is_none_or(|v| v == &*r.version))
            .collect();
        all.sort_by_key(|r| std::cmp::Reverse((r.first_push, r.seq)));
        let listed = self.settings.listed;
        RolloutReport {
            generated_at: rfc3339(now),
            rollouts: (all.into_iter())
                .map(|r| r.status(&book, now, listed, ask.every_node))
                .collect(),
            ..Default::default()
        }
    }
}

impl Progress {
    /// The NACK group of `verdict`, made when new (decided at `at`).
    fn group(&mut self, push: &Push, verdict: &Verdict, at: Timestamp) -> usize {
        let Verdict::Nack { error, .. } = verdict else {
            return 0;
        };
        let key = v1::NackGroup::key(&error.message);
        if let Some(i) = self.nacks.iter().position(|g| g.key == key) {
            return i;
        }
        if self.nacks.len() == MAX_GROUPS {
            return MAX_GROUPS - 1;
        }
        let Some(nack) = crate::api::nack(push, verdict, at) else {
            return 0;
        };
        self.nacks.push(NackTally {
            group: v1::NackGroup::from(&nack),
            key,
            examples: Vec::new(),
        });
        self.nacks.len() - 1
    }

    fn on_verdict(&mut self, node: Arc<str>, push: &Push, verdict: &Verdict, decided: u64) {
        let pushed = push.at;
        let Some(e) = self.nodes.get(&node).copied() else {
            return;
        };
        let latency_us = (decided.saturating_sub(pushed) / 1_000).min(u32::MAX as u64) as u32;
        let answered = Entry {
            latency_us,
            group: 0,
            ..e
        };
        let new = match verdict {
            Verdict::Ack => Entry {
                standing: Standing::Acked,
                ..answered
            },
            Verdict::Nack { scope, .. } => {
                let i = self.group(push, verdict, decided);
                let g = &mut self.nacks[i];
                g.group.nodes += 1;
                if g.examples.len() < EXAMPLES && !g.examples.contains(&node) {
                    g.examples.push(node.clone());
                }
                let standing = match scope {
                    Scope::Partial => Standing::Partial,
                    _ => Standing::Nacked,
                };
                Entry {
                    standing,
                    group: i as u8 + 1,
                    ..answered
                }
            }
            // A node that runs the version already stays on it.
            _ if e.standing == Standing::Acked => e,
            Verdict::Superseded { .. } => Entry {
                standing: Standing::Superseded,
                ..e
            },
            Verdict::Unanswered { .. } => Entry {
                standing: Standing::Unanswered,
                ..e
            },
        };
        if matches!(verdict, Verdict::Ack | Verdict::Nack { .. }) {
            self.last_answer = Some(self.last_answer.unwrap_or(0).max(decided));
        }
        self.nodes.insert(node, new);
    }

    /// Whether `node` accepted a version of this type pushed after this one.
    fn moved_on(&self, book: &Book, node: &str) -> bool {
        let Some(all) = book.types.get(&self.type_url) else {
            return false;
        };
        (all.iter())
            .filter(|r| r.seq > self.seq)
            .any(|r| (r.nodes.get(node)).is_some_and(|e| e.standing == Standing::Acked))
    }

    fn status(&self, book: &Book, now: Timestamp, listed: usize, every_node: bool) -> v1::Rollout {
        let count = |s: Standing| self.nodes.values().filter(|e| e.standing == s).count() as u64;
        let mut latencies: Vec<u32> = (self.nodes.values())
            .filter(|e| {
                matches!(
                    e.standing,
                    Standing::Acked | Standing::Nacked | Standing::Partial
                )
            })
            .map(|e| e.latency_us)
            .collect();
        latencies.sort_unstable();
        let ms = |us: u32| us as f64 / 1000.0;
        let pct = |q: f64| {
            let i = ((latencies.len() as f64 * q).ceil() as usize).saturating_sub(1);
            latencies.get(i).map_or(0.0, |&us| ms(us))
        };
        let mut behind: Vec<(&Arc<str>, &Entry)> = (self.nodes.iter())
            .filter(|(_, e)| e.standing != Standing::Acked)
            .collect();
        behind.sort_by(|(a, x), (b, y)| {
            (x.standing.cmp(&y.standing))
                .then(x.pushed_at.cmp(&y.pushed_at))
                .then(a.cmp(b))
        });
        let mut acked: Vec<&str> = (self.nodes.iter())
            .filter(|(_, e)| e.standing == Standing::Acked)
            .map(|(id, _)| &**id)
            .collect();
        acked.sort_unstable();
        // The groups as reported, most nodes first; `place[i]` is where group i went, from 1.
        let mut order: Vec<usize> = (0..self.nacks.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.nacks[i].group.nodes));
        let mut place = vec![0u32; order.len()];
        for (rank, &i) in order.iter().enumerate() {
            place[i] = rank as u32 + 1;
        }
        let moved_on = (self.nodes.iter())
            .filter(|(id, e)| e.standing.missed() && self.moved_on(book, id))
            .count() as u64;
        let nodes = match every_node {
            false => Vec::new(),
            true => self.every_node(book, now, &place),
        };
        v1::Rollout {
            r#type: short_type(&self.type_url).to_string(),
            type_url: self.type_url.to_string(),
            version: self.version.to_string(),
            first_push: rfc3339(self.first_push),
            last_push: rfc3339(self.last_push),
            since_last_push_seconds: now.saturating_sub(self.last_push) as f64 / 1e9,
            last_answer: self.last_answer.map(rfc3339),
            pushed: self.nodes.len() as u64,
            acked: count(Standing::Acked),
            nacked: count(Standing::Nacked) + count(Standing::Partial),
            partial: count(Standing::Partial),
            superseded: count(Standing::Superseded),
            unanswered: count(Standing::Unanswered),
            pending: count(Standing::Pending),
            latency_p50_ms: pct(0.5),
            latency_p90_ms: pct(0.9),
            latency_max_ms: latencies.last().map_or(0.0, |&us| ms(us)),
            behind: (behind.into_iter().take(listed))
                .map(|(id, e)| self.standing(book, id, e, now))
                .collect(),
            acked_nodes: acked.into_iter().take(listed).map(String::from).collect(),
            moved_on,
            nodes,
            acceptance: self.acceptance(),
            trace_id: String::new(),
            nacks: (order.iter().map(|&i| &self.nacks[i]))
                .map(|g| v1::NackGroup {
                    examples: g.examples.iter().map(|e| e.to_string()).collect(),
                    ..g.group.clone()
                })
                .collect(),
        }
    }

    /// How acceptance rose: for the nodes that took it, seconds from the first push to their
    /// answer, as at most [`CURVE_POINTS`] points (the last one all of them).
    fn acceptance(&self) -> Vec<v1::AcceptancePoint> {
        let mut took: Vec<u64> = (self.nodes.values())
            .filter(|e| e.standing == Standing::Acked)
            .map(|e| {
                let answered = e.pushed_at + u64::from(e.latency_us) * 1_000;
                answered.saturating_sub(self.first_push)
            })
            .collect();
        took.sort_unstable();
        let n = took.len();
        let step = n.div_ceil(CURVE_POINTS).max(1);
        (1..=n)
            .filter(|k| k % step == 0 || *k == n)
            .map(|k| v1::AcceptancePoint {
                seconds: took[k - 1] as f64 / 1e9,
                nodes: k as u64,
            })
            .collect()
    }

    /// Every node pushed this version, by id, with its answer's latency and its NACK group
    /// (`place[i]`: where group i is reported, from 1).
    fn every_node(&self, book: &Book, now: Timestamp, place: &[u32]) -> Vec<v1::RolloutNode> {
        let mut all: Vec<_> = self.nodes.iter().collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        (all.into_iter())
            .map(|(id, e)| {
                let mut n = self.standing(book, id, e, now);
                let answered = matches!(
                    e.standing,
                    Standing::Acked | Standing::Nacked | Standing::Partial
                );
                n.latency_ms = answered.then(|| e.latency_us as f64 / 1000.0);
                n.nack_group = match e.group {
                    0 => 0,
                    g => place[g as usize - 1],
                };
                n
            })
            .collect()
    }

    fn standing(&self, book: &Book, id: &str, e: &Entry, now: Timestamp) -> v1::RolloutNode {
        let waiting = (book.waiting.get(id))
            .filter(|w| e.standing == Standing::Pending && *w.version == *self.version);
        v1::RolloutNode {
            node: id.to_string(),
            state: e.standing as i32,
            running: book.running(id, &self.type_url).map(String::from),
            pushed_at: rfc3339(e.pushed_at),
            waiting_seconds: now.saturating_sub(e.pushed_at) as f64 / 1e9,
            waiting_for: waiting.map(|w| w.clusters.clone()).unwrap_or_default(),
            ..Default::default()
        }
    }
}

impl Sink for Rollouts {
    fn on_event(&mut self, event: &Event) {
        self.apply(event);
    }
}

#[cfg(test)]
mod tests;
