//! Per Kubernetes object the resources' metadata names: the resources made from it and, per
//! node, whether it runs what the control plane pushed for them ("I applied this
//! DestinationRule: has every proxy taken it?"). Computed when asked, from what the board keeps
//! anyway (what each node runs, per resource, with the objects its metadata names, which the
//! fleet shares; the last push it has not accepted): the view keeps nothing of its own and
//! costs nothing per push. A node whose type runs a push the fleet shares and has nothing
//! pending costs a lookup in that push's index of objects, made once per query.
//!
//! What "taken" means (docs/operating.md, "Has every proxy taken it"): for each resource made
//! from the object that the node runs or was last pushed, the node runs the content (by
//! digest) last pushed to it, and with `since` that push went out at or after it, or else the
//! object changed since (content no node had been pushed before) and left this resource as it
//! was. A NACK that rejects such a resource is REJECTED; one that rejects only other resources
//! of the push leaves this object's applied (a partial NACK).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::resources::{held_resources, Had, Held};
use super::{StatusBoard, TypeEntry};
use crate::api::v1::object_node::Standing;
use crate::api::v1::{self, ObjectReport, ObjectStatus};
use crate::api::NAMES_CAP;
use crate::clock::rfc3339;
use crate::correlate::{Mentions, Scope, Timestamp};
use crate::xds::origin::{ObjectRef, Origins};
use crate::xds::{short_type, Api, Resources};

/// Pushes listed per object at most.
const PUSHES_CAP: usize = 20;
/// Contents remembered per resource (the newest), and resources at most: a bound on what the
/// view keeps whatever the fleet's churn (past it, new resources are not followed, and a
/// `since` cannot tell their new content from the old).
const CONTENTS: usize = 4;
const MAX_FOLLOWED: usize = 1 << 20;

/// The contents of one resource (digest, when first pushed), oldest first.
type Contents = Vec<(u64, Timestamp)>;

/// When each content (by digest) of each resource that names objects was first pushed to any
/// node: what a `since` judges new by. A push the fleet shares is read once (its set is
/// remembered by pointer, per type).
#[derive(Default)]
pub(super) struct FirstPushed {
    by: HashMap<(Arc<str>, Box<str>), Contents>,
    /// The last set read per type: the fleet's copies of it cost nothing more.
    last: HashMap<Arc<str>, usize>,
}

impl FirstPushed {
    pub(super) fn on_push(&mut self, push: &crate::correlate::Push) {
        if !push.resources.has_origins() || push.heartbeat() {
            return;
        }
        let ptr = Arc::as_ptr(&push.resources) as usize;
        let url: Arc<str> = match self.last.get_key_value(push.type_url.as_str()) {
            Some((_, &p)) if p == ptr => return,
            Some((k, _)) => k.clone(),
            None => push.type_url.as_str().into(),
        };
        self.last.insert(url.clone(), ptr);
        for (i, r) in push.resources.iter().enumerate() {
            if r.bare || push.resources.origins_of(i).is_none() {
                continue;
            }
            let k = (url.clone(), Box::from(&*r.name));
            if !self.by.contains_key(&k) && self.by.len() >= MAX_FOLLOWED {
                continue;
            }
            let seen = self.by.entry(k).or_default();
            if !seen.iter().any(|(d, _)| *d == r.digest) {
                if seen.len() == CONTENTS {
                    seen.remove(0);
                }
                seen.push((r.digest, push.at));
            }
        }
    }

    /// The contents of a resource first pushed at or after `since`.
    fn new_since(
        &self,
        url: &Arc<str>,
        name: &str,
        since: Timestamp,
    ) -> impl Iterator<Item = u64> + '_ {
        let k = (url.clone(), Box::from(name));
        (self.by.get(&k).into_iter().flatten())
            .filter(move |(_, at)| *at >= since)
            .map(|(d, _)| *d)
    }
}

/// An object as a user names it: `KIND/NAMESPACE/NAME`, or `KIND/NAME` for a cluster-scoped
/// kind; the kind in any case, with its API group or without (`destinationrule`,
/// `DestinationRule.networking.istio.io`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectSpec {
    /// The kind, lowercase.
    pub kind: String,
    /// The API group, when given.
    pub group: Option<String>,
    /// The namespace (empty for a cluster-scoped kind).
    pub namespace: String,
    /// The name.
    pub name: String,
}

/// An object spelled in a way no object is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("object {0:?}: expected KIND/NAMESPACE/NAME (or KIND/NAME for a cluster-scoped kind), as destinationrule/default/reviews")]
pub struct ObjectSpecError(pub String);

impl std::str::FromStr for ObjectSpec {
    type Err = ObjectSpecError;

    fn from_str(s: &str) -> Result<Self, ObjectSpecError> {
        let bad = || ObjectSpecError(s.to_string());
        let parts: Vec<&str> = s.split('/').collect();
        let (kind, namespace, name) = match parts[..] {
            [kind, namespace, name] => (kind, namespace, name),
            [kind, name] => (kind, "", name),
            _ => return Err(bad()),
        };
        if kind.is_empty() || name.is_empty() || s.chars().any(char::is_whitespace) {
            return Err(bad());
        }
        let (kind, group) = match kind.split_once('.') {
            Some((k, g)) => (k, Some(g.to_ascii_lowercase())),
            None => (kind, None),
        };
        Ok(ObjectSpec {
            kind: kind.to_ascii_lowercase(),
            group,
            namespace: namespace.into(),
            name: name.into(),
        })
    }
}

impl std::fmt::Display for ObjectSpec {
    /// As it is asked for: `destinationrule/default/reviews`, the group after the kind when given.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.kind)?;
        if let Some(g) = &self.group {
            write!(f, ".{g}")?;
        }
        if !self.namespace.is_empty() {
            write!(f, "/{}", self.namespace)?;
        }
        write!(f, "/{}", self.name)
    }
}

impl ObjectSpec {
    /// Whether `o` is this object (any section of it).
    pub fn is(&self, o: &ObjectRef) -> bool {
        o.kind.eq_ignore_ascii_case(&self.kind)
            && *o.namespace == *self.namespace
            && *o.name == *self.name
            && self
                .group
                .as_deref()
                .is_none_or(|g| o.group.eq_ignore_ascii_case(g))
    }
}

/// An object as the view groups resources by it: any section, any way it was named.
type Key = (Box<str>, Box<str>, Box<str>);

fn key(o: &ObjectRef) -> Key {
    (o.kind.clone(), o.namespace.clone(), o.name.clone())
}

/// The objects of one resource's origins, each once.
fn objects_of(origins: Option<&Arc<Origins>>) -> impl Iterator<Item = &ObjectRef> {
    let mut seen: Vec<&ObjectRef> = Vec::new();
    origins
        .into_iter()
        .flat_map(|o| o.parts.iter())
        .flat_map(|p| p.objects.iter())
        .filter(move |o| {
            let new = !seen
                .iter()
                .any(|s| s.kind == o.kind && s.namespace == o.namespace && s.name == o.name);
            if new {
                seen.push(o);
            }
            new
        })
}

/// A shared push's resources by object: which of its resources each object made (made once
/// per query for each push the fleet shares).
#[derive(Default)]
struct SetIndex {
    by: HashMap<Key, Vec<u32>>,
}

impl SetIndex {
    fn of(set: &Resources, wanted: &Wanted<'_>) -> SetIndex {
        let mut by: HashMap<Key, Vec<u32>> = HashMap::new();
        if !set.has_origins() {
            return SetIndex { by };
        }
        for i in 0..set.len() {
            for o in objects_of(set.origins_of(i)) {
                if wanted.wants(o) {
                    by.entry(key(o)).or_default().push(i as u32);
                }
            }
        }
        SetIndex { by }
    }
}

/// Which objects a query is about: some, by name, or every one.
enum Wanted<'a> {
    Some(&'a [ObjectSpec]),
    All,
}

impl Wanted<'_> {
    fn wants(&self, o: &ObjectRef) -> bool {
        match self {
            Wanted::All => true,
            Wanted::Some(specs) => specs.iter().any(|s| s.is(o)),
        }
    }
}

/// One resource made from an object, on one node.
struct Seen {
    type_url: Arc<str>,
    name: String,
    /// What it runs: version, digest, when that content was pushed.
    runs: Option<(String, u64, Timestamp)>,
    /// What was last pushed to it: version, digest, when.
    pushed: Option<(String, u64, Timestamp)>,
    state: Standing,
    error: Option<String>,
}

/// What one query gathers of one object.
#[derive(Default)]
struct Gathered {
    object: Option<ObjectRef>,
    sections: BTreeSet<String>,
    resources: BTreeSet<(Arc<str>, String)>,
    /// Per node: its resources of the object.
    nodes: BTreeMap<Arc<str>, (bool, Vec<Seen>)>,
    /// Nodes that run a shared push in full, counted by their standing, without a list (the
    /// listing of every object).
    counted: BTreeMap<Standing, u64>,
    pushes: BTreeMap<(Arc<str>, String), (Timestamp, u64)>,
    last_pushed: Timestamp,
}

impl Gathered {
    fn saw(&mut self, o: &ObjectRef, type_url: &Arc<str>, name: &str) {
        if self.object.is_none() {
            self.object = Some(ObjectRef {
                section: "".into(),
                ..o.clone()
            });
        }
        if !o.section.is_empty() && self.sections.len() < NAMES_CAP {
            self.sections.insert(o.section.to_string());
        }
        // Every one, for the exact count and for `since` (what the view holds while it answers
        // is bounded by the resources the board holds).
        self.resources.insert((type_url.clone(), name.to_string()));
    }

    fn pushed(&mut self, type_url: &Arc<str>, version: &str, at: Timestamp, nodes: u64) {
        let e = (self.pushes)
            .entry((type_url.clone(), version.to_string()))
            .or_insert((at, 0));
        e.0 = e.0.min(at);
        e.1 += nodes;
        self.last_pushed = self.last_pushed.max(at);
    }
}

/// A push the fleet shares, as the nodes that run it in full use it in one query: its index of
/// objects, the nodes, and the first time one of them was pushed it.
struct Shared<'a> {
    url: Arc<str>,
    taken: &'a super::resources::Taken,
    index: SetIndex,
    nodes: u64,
    first: Timestamp,
}

/// One question to the object view, as it goes over the nodes.
struct Query<'a, 'b> {
    wanted: Wanted<'b>,
    listing: bool,
    shared: HashMap<usize, Shared<'a>>,
    by: HashMap<Key, Gathered>,
    connected: u64,
    reached: HashMap<Key, u64>,
    /// Listing: nodes that run the same shared pushes in full, counted once per group.
    groups: HashMap<Vec<usize>, (u64, u64)>,
}

impl<'a, 'b> Query<'a, 'b> {
    /// A node's type that runs a shared push in full: its index (made, and its objects'
    /// resources noted, the first time), and the pointer that stands for it.
    fn shared(&mut self, url: &Arc<str>, taken: &'a super::resources::Taken) -> usize {
        let ptr = Arc::as_ptr(&taken.resources) as usize;
        let (by, wanted) = (&mut self.by, &self.wanted);
        let s = self.shared.entry(ptr).or_insert_with(|| {
            let index = SetIndex::of(&taken.resources, wanted);
            for (k, idx) in &index.by {
                let g = by.entry(k.clone()).or_default();
                for &i in idx {
                    let i = i as usize;
                    let found = objects_of(taken.resources.origins_of(i)).find(|o| key(o) == *k);
                    if let (Some(r), Some(o)) = (taken.resources.get(i), found) {
                        g.saw(o, url, &r.name);
                    }
                }
            }
            Shared {
                url: url.clone(),
                taken,
                index,
                nodes: 0,
                first: taken.pushed_at,
            }
        });
        s.nodes += 1;
        s.first = s.first.min(taken.pushed_at);
        ptr
    }

    /// A named object's resources in a shared push a node runs in full: taken, each listed.
    fn seen_shared(&mut self, id: &Arc<str>, is_connected: bool, ptr: usize) {
        let s = &self.shared[&ptr];
        let taken = s.taken;
        for (k, idx) in &s.index.by {
            let g = self.by.entry(k.clone()).or_default();
            for &i in idx {
                let Some(r) = taken.resources.get(i as usize) else {
                    continue;
                };
                let version = r.version.unwrap_or(&taken.version).to_string();
                let content = (version, r.digest, taken.pushed_at);
                let entry = g.nodes.entry(id.clone());
                (entry.or_insert((is_connected, Vec::new())).1).push(Seen {
                    type_url: s.url.clone(),
                    name: r.name.into_owned(),
                    runs: Some(content.clone()),
                    pushed: Some(content),
                    state: Standing::Taken,
                    error: None,
                });
            }
        }
    }

    /// A node's type that does not run a shared push in full, into `mine` (the node's worst
    /// standing per object).
    fn general(
        &mut self,
        id: &Arc<str>,
        is_connected: bool,
        url: &Arc<str>,
        t: &TypeEntry,
        mine: &mut BTreeMap<Key, Standing>,
    ) {
        for (k, seen) in node_type(url, t, &self.wanted) {
            let g = self.by.entry(k.clone()).or_default();
            let mut pushes: Vec<(String, Timestamp)> = Vec::new();
            for (o, s) in seen {
                g.saw(&o, url, &s.name);
                if let Some((v, _, at)) = &s.pushed {
                    if !pushes.iter().any(|(pv, pa)| pv == v && pa == at) {
                        pushes.push((v.clone(), *at));
                    }
                }
                let worst = mine.entry(k.clone()).or_insert(s.state);
                *worst = (*worst).min(s.state);
                if !self.listing {
                    let entry = g.nodes.entry(id.clone());
                    entry.or_insert((is_connected, Vec::new())).1.push(s);
                }
            }
            for (v, at) in pushes {
                g.pushed(url, &v, at, 1);
            }
        }
    }

    /// One node, every type.
    fn node(&mut self, id: &Arc<str>, n: &'a super::NodeEntry) {
        let is_connected = !n.streams.is_empty();
        self.connected += u64::from(is_connected);
        let mut uses: Vec<usize> = Vec::new();
        let mut general: Vec<(Arc<str>, &TypeEntry)> = Vec::new();
        for (url, t) in n.types.iter() {
            let url: Arc<str> = url.into();
            let (Some(Held::Push(taken, _)), None) = (&t.held, &t.unsettled) else {
                general.push((url, t));
                continue;
            };
            let ptr = self.shared(&url, taken);
            if self.shared[&ptr].index.by.is_empty() {
                continue;
            }
            uses.push(ptr);
            if !self.listing {
                self.seen_shared(id, is_connected, ptr);
            }
        }
        if self.listing && general.is_empty() {
            uses.sort_unstable();
            let e = self.groups.entry(uses).or_default();
            match is_connected {
                true => e.0 += 1,
                false => e.1 += 1,
            }
            return;
        }
        let mut mine: BTreeMap<Key, Standing> = BTreeMap::new();
        for ptr in &uses {
            for k in self.shared[ptr].index.by.keys() {
                mine.entry(k.clone()).or_insert(Standing::Taken);
            }
        }
        for (url, t) in general {
            self.general(id, is_connected, &url, t, &mut mine);
        }
        for (k, state) in mine {
            *self.reached.entry(k.clone()).or_default() += 1;
            if self.listing {
                let state = match is_connected {
                    true => state,
                    false => Standing::Disconnected,
                };
                *self
                    .by
                    .entry(k)
                    .or_default()
                    .counted
                    .entry(state)
                    .or_default() += 1;
            }
        }
    }

    /// The groups of nodes that run the same shared pushes (taken, each object once), and the
    /// shared pushes' counts.
    fn settle(&mut self) {
        for (uses, (live, gone)) in std::mem::take(&mut self.groups) {
            let mut objects: BTreeSet<&Key> = BTreeSet::new();
            for ptr in &uses {
                objects.extend(self.shared[ptr].index.by.keys());
            }
            for k in objects {
                *self.reached.entry(k.clone()).or_default() += live + gone;
                let counted = &mut self.by.entry(k.clone()).or_default().counted;
                *counted.entry(Standing::Taken).or_default() += live;
                if gone > 0 {
                    *counted.entry(Standing::Disconnected).or_default() += gone;
                }
            }
        }
        for s in self.shared.values() {
            for k in s.index.by.keys() {
                let g = self.by.entry(k.clone()).or_default();
                g.pushed(&s.url, &s.taken.version, s.first, s.nodes);
            }
        }
    }
}

impl StatusBoard {
    /// The objects `ask` names, each with every node it reaches, or every object, counted,
    /// without nodes; `since` judges what counts as taken. As of `now`.
    ///
    /// A node whose every type runs a push the fleet shares, in full and with nothing pending,
    /// costs a pointer per type: the pushes are indexed once per query, and nodes that run the
    /// same pushes are counted as one group.
    pub fn objects(
        &self,
        now: Timestamp,
        ask: &[ObjectSpec],
        since: Option<Timestamp>,
    ) -> ObjectReport {
        let board = self.lock();
        let listing = ask.is_empty();
        let mut q = Query {
            wanted: match listing {
                true => Wanted::All,
                false => Wanted::Some(ask),
            },
            listing,
            shared: HashMap::new(),
            by: HashMap::new(),
            connected: 0,
            reached: HashMap::new(),
            groups: HashMap::new(),
        };
        for (id, n) in board.nodes.iter() {
            q.node(id, n);
        }
        q.settle();
        let (connected, reached, mut by) = (q.connected, q.reached, q.by);
        let reach = |k: &Key| reached.get(k).copied().unwrap_or(0);
        let first = &board.first_pushed;
        let mut objects: Vec<ObjectStatus> = Vec::new();
        if listing {
            for (k, g) in by.drain() {
                objects.push(status(g, None, first, connected, reach(&k), String::new()));
            }
            objects.sort_by_cached_key(|o| (std::cmp::Reverse(o.nodes), label(o)));
        }
        for spec in ask {
            let found = by.keys().find(|(kind, ns, name)| {
                kind.eq_ignore_ascii_case(&spec.kind)
                    && **ns == *spec.namespace
                    && **name == *spec.name
            });
            let asked = spec.to_string();
            objects.push(match found.cloned() {
                Some(k) => {
                    let g = by.remove(&k).unwrap_or_default();
                    status(g, since, first, connected, reach(&k), asked)
                }
                None => ObjectStatus {
                    asked,
                    out_of_scope: connected,
                    ..Default::default()
                },
            });
        }
        ObjectReport {
            generated_at: rfc3339(now),
            objects,
            taps: Vec::new(),
            instance: String::new(),
            started_at: String::new(),
            connected,
        }
    }
}

fn label(o: &ObjectStatus) -> String {
    o.object.as_ref().map(v1::Origin::label).unwrap_or_default()
}

/// The resources made from wanted objects of one type of one node that runs no shared push in
/// full (it has a push pending or NACKed, runs part of one, or speaks Delta): each with what it
/// runs, what was last pushed to it and how it stands.
fn node_type(
    url: &Arc<str>,
    t: &TypeEntry,
    wanted: &Wanted<'_>,
) -> Vec<(Key, Vec<(ObjectRef, Seen)>)> {
    let held = held_resources(t.held.as_ref());
    let mut out: BTreeMap<Key, Vec<(ObjectRef, Seen)>> = BTreeMap::new();
    let mut add = |o: &ObjectRef, s: Seen| out.entry(key(o)).or_default().push((o.clone(), s));
    let unsettled = t.unsettled.as_deref();
    let push = unsettled.map(|u| &u.push);
    // The resources the last push carries, by name: their place in it.
    let carried: HashMap<std::borrow::Cow<'_, str>, usize> = match push {
        Some(p) => (p.resources.iter().enumerate())
            .map(|(i, r)| (r.name, i))
            .collect(),
        None => HashMap::new(),
    };
    let runs = |h: &Had| (h.version.clone(), h.digest, h.pushed_at);
    // What the node runs, and what the last push changes of it.
    for (name, h) in &held {
        let objects: Vec<&ObjectRef> = objects_of(h.origins.as_ref())
            .filter(|o| wanted.wants(o))
            .collect();
        let in_push = push.and_then(|p| carried.get(name.as_str()).map(|&i| (p, i)));
        let pushed_objects: Vec<&ObjectRef> = match in_push {
            Some((p, i)) => objects_of(p.resources.origins_of(i))
                .filter(|o| wanted.wants(o))
                .collect(),
            None => Vec::new(),
        };
        if objects.is_empty() && pushed_objects.is_empty() {
            continue;
        }
        let (pushed, state, error) = match (unsettled, in_push) {
            (Some(u), Some((p, i))) => {
                let r = p.resources.get(i).expect("carried");
                let version = r.version.unwrap_or(&p.version).to_string();
                let pushed = Some((version, r.digest, p.at));
                match r.digest == h.digest {
                    true => (pushed, Standing::Taken, None),
                    false => {
                        let (state, error) = unsettled_state(u, name);
                        (pushed, state, error)
                    }
                }
            }
            // The last push removes it (SotW leaves it out, Delta names it): until answered.
            (Some(u), None) if removes(t.api, u, name) => {
                let (state, error) = unsettled_state(u, name);
                (None, state, error)
            }
            _ => (Some(runs(h)), Standing::Taken, None),
        };
        let seen = |_: &ObjectRef| Seen {
            type_url: url.clone(),
            name: name.clone(),
            runs: Some(runs(h)),
            pushed: pushed.clone(),
            state,
            error: error.clone(),
        };
        for o in o_dedupe(&objects, &pushed_objects) {
            add(o, seen(o));
        }
    }
    // What the last push adds.
    if let (Some(u), Some(p)) = (unsettled, push) {
        for (i, r) in p.resources.iter().enumerate() {
            if held.contains_key(&*r.name) {
                continue;
            }
            let objects: Vec<&ObjectRef> = objects_of(p.resources.origins_of(i))
                .filter(|o| wanted.wants(o))
                .collect();
            if objects.is_empty() {
                continue;
            }
            let (state, error) = unsettled_state(u, &r.name);
            let version = r.version.unwrap_or(&p.version).to_string();
            for o in objects {
                add(
                    o,
                    Seen {
                        type_url: url.clone(),
                        name: r.name.to_string(),
                        runs: None,
                        pushed: Some((version.clone(), r.digest, p.at)),
                        state,
                        error: error.clone(),
                    },
                );
            }
        }
    }
    out.into_iter().collect()
}

/// The objects of a resource before and after the last push, each once.
fn o_dedupe<'a>(a: &[&'a ObjectRef], b: &[&'a ObjectRef]) -> Vec<&'a ObjectRef> {
    let mut out: Vec<&ObjectRef> = Vec::new();
    for o in a.iter().chain(b.iter()) {
        if !out.iter().any(|x| key(x) == key(o)) {
            out.push(o);
        }
    }
    out
}

/// Whether the pending or NACKed push `u` removes `name` from what the node runs.
fn removes(api: Option<Api>, u: &super::resources::Unsettled, name: &str) -> bool {
    match api {
        Some(Api::Delta) => u.push.removed.iter().any(|n| n == name),
        _ => !u.push.resources.iter().any(|r| r.name == name),
    }
}

/// How a resource the last push changes stands: pending until answered; after a NACK,
/// rejected when the NACK rejects it (the whole push, its own part of a partial NACK, or a
/// message of no known form that names it).
fn unsettled_state(u: &super::resources::Unsettled, name: &str) -> (Standing, Option<String>) {
    let Some(n) = u.nack() else {
        return (Standing::Pending, None);
    };
    let rejected = match n.scope {
        Scope::Whole => true,
        Scope::Partial => n.rejected.iter().any(|r| r.name == name),
        Scope::Unknown => {
            n.suspects.iter().any(|s| s == name) || Mentions::of(&n.message).names(name)
        }
    };
    match rejected {
        true => {
            let own = n.rejected.iter().find(|r| r.name == name);
            let message = own.map_or(&n.message, |r| &r.reason).clone();
            (Standing::Rejected, Some(message))
        }
        // A partial NACK of other resources applied this one: the board ran it already.
        false => (Standing::Taken, None),
    }
}

/// One object's status from what was gathered: each node's standing (its worst resource's),
/// with `since` and what the fleet was pushed since (`fresh`) judging what it runs.
fn status(
    mut g: Gathered,
    since: Option<Timestamp>,
    first: &FirstPushed,
    connected: u64,
    reached: u64,
    asked: String,
) -> ObjectStatus {
    let mut nodes: Vec<v1::ObjectNode> = Vec::new();
    let mut count: BTreeMap<Standing, u64> = std::mem::take(&mut g.counted);
    // With `since`: a resource a node runs counts as taken when the node was pushed it since
    // (what it runs is what the control plane gave it since); else when the object changed
    // since (some resource made from it got content no node was pushed before) and this
    // resource did not (the change left it as it was). Old content pushed again to other nodes
    // (a reconnect) changes nothing for this one.
    let changed = since.is_some_and(|t| {
        (g.resources.iter()).any(|(url, name)| first.new_since(url, name, t).next().is_some())
    });
    for (id, (is_connected, seen)) in std::mem::take(&mut g.nodes) {
        let resources: Vec<v1::ObjectNodeResource> = (seen.into_iter())
            .map(|mut s| {
                if let (Standing::Taken, Some(t)) = (s.state, since) {
                    let pushed_since = s.pushed.as_ref().is_some_and(|p| p.2 >= t);
                    let new = first.new_since(&s.type_url, &s.name, t).next().is_some();
                    // Taken where pushed since, or where the object changed and left this
                    // resource as it was.
                    let taken = pushed_since || (changed && !new);
                    if !taken {
                        s.state = Standing::NotPushed;
                    }
                }
                node_resource(s)
            })
            .collect();
        let worst = (resources.iter())
            .map(|r| r.state())
            .min()
            .unwrap_or(Standing::Taken);
        let state = match is_connected {
            true => worst,
            false => Standing::Disconnected,
        };
        *count.entry(state).or_default() += 1;
        nodes.push(v1::ObjectNode {
            node: id.to_string(),
            state: state as i32,
            connected: is_connected,
            resources,
            tap: String::new(),
        });
    }
    nodes.sort_by(|a, b| a.state.cmp(&b.state).then(a.node.cmp(&b.node)));
    let c = |s: Standing| count.get(&s).copied().unwrap_or(0);
    let mut pushes: Vec<v1::ObjectPush> = (g.pushes.into_iter())
        .map(|((url, version), (at, nodes))| v1::ObjectPush {
            r#type: short_type(&url).to_string(),
            version,
            at: rfc3339(at),
            nodes,
        })
        .collect();
    pushes.sort_by(|a, b| b.at.cmp(&a.at));
    pushes.truncate(PUSHES_CAP);
    let object = g.object.as_ref().map(|o| v1::Origin {
        kubectl: o.kubectl().unwrap_or_default(),
        ..v1::Origin::from(&crate::xds::origin::Origin {
            object: o.clone(),
            resource: String::new(),
            part: String::new(),
            named: false,
        })
    });
    let nodes_total = reached;
    ObjectStatus {
        object,
        sections: g.sections.into_iter().collect(),
        resource_count: g.resources.len() as u64,
        resources: (g.resources.into_iter().take(NAMES_CAP))
            .map(|(url, name)| v1::ObjectResource {
                r#type: short_type(&url).to_string(),
                type_url: url.to_string(),
                name,
            })
            .collect(),
        nodes: nodes_total,
        taken: c(Standing::Taken),
        pending: c(Standing::Pending),
        rejected: c(Standing::Rejected),
        not_pushed: c(Standing::NotPushed),
        disconnected: c(Standing::Disconnected),
        out_of_scope: connected.saturating_sub(nodes_total - c(Standing::Disconnected)),
        last_pushed: match g.last_pushed {
            0 => String::new(),
            t => rfc3339(t),
        },
        pushes,
        node_states: nodes,
        asked,
    }
}

fn node_resource(s: Seen) -> v1::ObjectNodeResource {
    let hex = |d: u64| format!("{d:016x}");
    let (version, digest) = match &s.runs {
        Some((v, d, _)) => (v.clone(), hex(*d)),
        None => (String::new(), String::new()),
    };
    let (pushed_version, pushed_digest, pushed_at) = match &s.pushed {
        Some((v, d, at)) => (v.clone(), hex(*d), rfc3339(*at)),
        None => (String::new(), String::new(), String::new()),
    };
    v1::ObjectNodeResource {
        r#type: short_type(&s.type_url).to_string(),
        name: s.name,
        version,
        digest,
        pushed_version,
        pushed_digest,
        pushed_at,
        state: s.state as i32,
        error: s.error,
    }
}
