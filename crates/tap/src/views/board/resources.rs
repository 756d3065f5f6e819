//! Per resource, what each node runs: the view CSDS serves. For a type, the resources the node
//! runs (SotW: the push it accepted, or the one it NACKed in part with the rejected resources'
//! old entries beside it, shared with the correlator and with every node pushed the same set;
//! Delta: names, versions and digests folded over what it applied), and the last push it has
//! not accepted, pending or NACKed. Names, versions and digests only: never contents.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{StatusBoard, TypeEntry};
use crate::api::v1;
use crate::correlate::{Event, Mentions, Push, Rejected, Scope, Timestamp, Verdict};
use crate::xds::origin::Origins;
use crate::xds::{Api, Needs};

/// How long Envoy lets a listener warm for the routes and secrets it names before it serves
/// without them (`initial_fetch_timeout`, 15 s unless its config source says otherwise).
const WARMING_TIMEOUT_NS: u64 = 15_000_000_000;

/// Subscriptions of more names than this are not kept: CSDS then lists what was sent only.
const MAX_REQUESTED: usize = 64;
/// Control-plane resource errors kept per node and type at most.
const MAX_CP_ERRORS: usize = 1024;

/// The errors the control plane reported for resources (`resource_errors`), each kept until a
/// push carries the resource: (name, code, message, when).
#[derive(Default)]
pub(super) struct CpErrors(pub(super) Vec<(String, i32, String, Timestamp)>);

impl CpErrors {
    pub(super) fn on_push(&mut self, push: &Push) {
        if self.0.is_empty() && push.resource_errors.is_empty() {
            return;
        }
        let came: std::collections::HashSet<_> = push.resources.iter().map(|r| r.name).collect();
        self.0.retain(|(n, ..)| !came.contains(n.as_str()));
        for (name, e) in &push.resource_errors {
            self.0.retain(|(n, ..)| n != name);
            if self.0.len() < MAX_CP_ERRORS {
                (self.0).push((name.clone(), e.code, e.message.clone(), push.at));
            }
        }
    }
}

/// The names a client asks for of one type (none: a wildcard, or too many to keep).
#[derive(Default)]
pub(super) struct Requested {
    names: Vec<String>,
    /// Past [`MAX_REQUESTED`]: forgotten until a SotW request names few again.
    overflow: bool,
}

impl Requested {
    /// A wildcard subscription: every resource of the type, none named.
    fn wildcard(&self) -> bool {
        self.names.is_empty() && !self.overflow
    }

    pub(super) fn apply(&mut self, event: &Event) {
        let (names, dropped, whole) = match event {
            // A stream's first request names the whole set.
            Event::Subscribe { names, .. } | Event::Resubscribe { names, .. } => {
                (names, &[][..], true)
            }
            Event::SubscriptionChange {
                context,
                names,
                unsubscribed,
            } => (
                names,
                &unsubscribed[..],
                context.stream.api != Some(Api::Delta),
            ),
            _ => return,
        };
        if whole {
            // As does every SotW request.
            self.names.clear();
            self.overflow = false;
        }
        self.names.retain(|n| !dropped.contains(n));
        for n in names.iter().filter(|n| *n != "*") {
            if self.names.contains(n) {
                continue;
            }
            if self.overflow || self.names.len() == MAX_REQUESTED {
                self.overflow = true;
                self.names = Vec::new();
                return;
            }
            self.names.push(n.clone());
        }
    }
}

/// The TTL clocks of the resources a node runs that came with a TTL: name -> (when it lapses,
/// the TTL in milliseconds). A push that carries the resource with a TTL, or a heartbeat (a
/// bare wrapper, Delta), starts its clock again; one without a TTL stops it.
#[derive(Default)]
pub(super) struct Ttls(BTreeMap<String, (Timestamp, u32)>);

impl Ttls {
    /// Folds an accepted push (but for the `rejected`) into the clocks.
    fn on_accepted(&mut self, api: Option<Api>, push: &Push, rejected: &[Rejected]) {
        if self.0.is_empty() && !push.resources.has_ttl() {
            return;
        }
        let rejected = crate::correlate::scope::names(rejected);
        let delta = api == Some(Api::Delta);
        if delta {
            for name in &push.removed {
                self.0.remove(name);
            }
        } else {
            // SotW: what the push leaves out is gone.
            let now: std::collections::HashSet<_> = push.resources.iter().map(|r| r.name).collect();
            self.0.retain(|n, _| now.contains(n.as_str()));
        }
        for r in push.resources.iter() {
            // Envoy's SotW mux leaves bare wrappers out of the push: their clocks run on.
            if rejected.contains(&*r.name) || (r.bare && !delta) {
                continue;
            }
            match r.ttl_ms {
                Some(ms) => {
                    let lapses = push.at.saturating_add(u64::from(ms) * 1_000_000);
                    self.0.insert(r.name.into_owned(), (lapses, ms));
                }
                None => {
                    self.0.remove(&*r.name);
                }
            }
        }
    }
}

/// What each listener the node runs needs before it serves: RDS and SDS names.
#[derive(Default)]
pub(super) struct ListenerNeeds(BTreeMap<String, Vec<(Needs, Box<str>)>>);

impl ListenerNeeds {
    /// Folds an accepted push (but for the `rejected`).
    fn on_accepted(&mut self, api: Option<Api>, push: &Push, rejected: &[Rejected]) {
        if self.0.is_empty() && !push.resources.has_needs() {
            return;
        }
        let rejected = crate::correlate::scope::names(rejected);
        if api == Some(Api::Delta) {
            for name in &push.removed {
                self.0.remove(name);
            }
        } else {
            let now: std::collections::HashSet<_> = push.resources.iter().map(|r| r.name).collect();
            self.0.retain(|n, _| now.contains(n.as_str()));
        }
        for (i, r) in push.resources.iter().enumerate() {
            if r.bare || rejected.contains(&*r.name) {
                continue;
            }
            let needs: Vec<_> = (push.resources.needs_of(i))
                .map(|(k, n)| (k, n.into()))
                .collect();
            match needs.is_empty() {
                true => self.0.remove(&*r.name),
                false => self.0.insert(r.name.into_owned(), needs),
            };
        }
    }
}

/// What a node runs of one type.
pub(super) enum Held {
    /// SotW, after an ACK: the accepted push is the whole state.
    Push(Taken, Timestamp),
    /// SotW, after a partial NACK: that push (shared by the fleet), but for the resources it
    /// rejected, which keep what they were (none: they were new). A node keeps only where it
    /// differs from the push.
    Except(Taken, Timestamp, Vec<(String, Option<Kept>)>),
    /// Delta, per resource: name -> what it runs.
    Each(BTreeMap<String, One>),
}

/// One resource a node runs (Delta, or a rejected resource that keeps what it had): its own
/// version, its content's digest, when it was accepted and when pushed, and the objects its
/// metadata names (the fleet's one copy).
#[derive(Clone)]
pub(super) struct One {
    version: Option<String>,
    digest: u64,
    at: Timestamp,
    pushed_at: Timestamp,
    origins: Option<Arc<Origins>>,
}

/// A push as a node keeps it once it runs it: its resources (the fleet's one copy) and its
/// version; not the push's own record (nonce, type, sizes), which would cost every node.
pub(crate) struct Taken {
    pub(super) resources: Arc<crate::xds::Resources>,
    pub(super) version: Box<str>,
    /// When the push went out.
    pub(super) pushed_at: Timestamp,
}

impl Taken {
    fn of(push: &Push) -> Self {
        Taken {
            resources: push.resources.clone(),
            version: push.version.as_str().into(),
            pushed_at: push.at,
        }
    }
}

/// What a rejected resource still runs.
pub(super) type Kept = One;

/// The NACK of an unsettled push.
pub(super) struct Nacked {
    pub(super) message: String,
    pub(super) suspects: Vec<String>,
    pub(super) scope: Scope,
    pub(super) rejected: Vec<Rejected>,
    at: Timestamp,
}

/// The last push of a type the node has not accepted.
pub(super) struct Unsettled {
    pub(super) push: Arc<Push>,
    nack: Option<Nacked>,
}

impl Unsettled {
    pub(super) fn new(push: Arc<Push>) -> Self {
        Unsettled { push, nack: None }
    }

    /// Its NACK, once the client rejected it.
    pub(super) fn nack(&self) -> Option<&Nacked> {
        self.nack.as_ref()
    }
}

/// Folds a verdict into what the node holds.
pub(super) fn on_verdict(
    t: &mut TypeEntry,
    api: Option<Api>,
    push: &Arc<Push>,
    verdict: &Verdict,
    decided_at: Timestamp,
) {
    let ours = t
        .unsettled
        .as_ref()
        .is_some_and(|u| u.push.nonce == push.nonce);
    match verdict {
        Verdict::Ack => {
            on_accepted(t, api, push, &[]);
            match (api, &mut t.held) {
                (Some(Api::Delta), Some(Held::Each(ref mut held))) => {
                    fold(held, push, &[], decided_at)
                }
                (Some(Api::Delta), _) => {
                    let mut held = BTreeMap::new();
                    fold(&mut held, push, &[], decided_at);
                    t.held = Some(Held::Each(held));
                }
                _ if push.resources.has_bare() => {
                    let kept = bare_kept(t, push);
                    t.held = Some(Held::Except(Taken::of(push), decided_at, kept));
                }
                _ => t.held = Some(Held::Push(Taken::of(push), decided_at)),
            }
            if api == Some(Api::Delta) {
                note_absent(t, push);
            }
            if ours {
                t.unsettled = None;
            }
        }
        Verdict::Nack {
            error,
            suspects,
            scope,
            rejected,
            ..
        } => {
            if *scope == Scope::Partial {
                on_accepted(t, api, push, rejected);
                apply_part(t, api, push, rejected, decided_at);
            }
            if let Some(u) = t.unsettled.as_mut().filter(|_| ours) {
                u.nack = Some(Nacked {
                    message: error.message.clone(),
                    suspects: suspects.clone(),
                    scope: *scope,
                    rejected: rejected.clone(),
                    at: decided_at,
                });
            }
        }
        _ => {}
    }
}

/// SotW: Envoy's mux leaves a bare wrapper (a heartbeat) out of the push it applies, so under
/// a wildcard subscription (CDS, LDS) the resource is gone, and a named one keeps what it had.
fn bare_kept(t: &TypeEntry, push: &Push) -> Vec<(String, Option<Kept>)> {
    let wildcard = t.requested.wildcard();
    let before = (!wildcard).then(|| held_resources(t.held.as_ref()));
    (push.resources.iter())
        .filter(|r| r.bare)
        .map(|r| {
            let had = (before.as_ref())
                .and_then(|b| b.get(&*r.name))
                .map(Had::one);
            (r.name.into_owned(), had)
        })
        .collect()
}

/// An accepted push (but for the `rejected`) into the TTL clocks and the listeners' needs.
fn on_accepted(t: &mut TypeEntry, api: Option<Api>, push: &Push, rejected: &[Rejected]) {
    let needed = push.resources.has_ttl() || push.resources.has_needs();
    if let Some(rare) = t.rare_if(needed) {
        rare.ttls.on_accepted(api, push, rejected);
        rare.needs.on_accepted(api, push, rejected);
    }
}

/// Delta: a removal of a name the client asks for says the resource does not exist; a push
/// that carries it says it does.
fn note_absent(t: &mut TypeEntry, push: &Push) {
    let requested = &t.requested.names;
    let named = |n: &String| requested.contains(n);
    let needed = push.removed.iter().any(named);
    let removed: Vec<String> = push.removed.iter().filter(|n| named(n)).cloned().collect();
    let Some(rare) = t.rare_if(needed) else {
        return;
    };
    let came: std::collections::HashSet<_> = push.resources.iter().map(|r| r.name).collect();
    rare.absent.retain(|n| !came.contains(n.as_str()));
    for name in removed {
        if !rare.absent.contains(&name) {
            rare.absent.push(name);
        }
    }
}

/// The valid part of a partly NACKed push now runs: every resource but the `rejected`, at the
/// push's version; SotW drops what the push leaves out, Delta what it removes.
fn apply_part(
    t: &mut TypeEntry,
    api: Option<Api>,
    push: &Arc<Push>,
    rejected: &[Rejected],
    at: Timestamp,
) {
    if api != Some(Api::Delta) {
        let before = held_resources(t.held.as_ref());
        let kept = (rejected.iter())
            .filter(|r| !r.duplicate())
            .map(|r| {
                let had = before.get(&r.name).map(Had::one);
                (r.name.clone(), had)
            })
            .collect();
        t.held = Some(Held::Except(Taken::of(push), at, kept));
        return;
    }
    let mut held = match t.held.take() {
        Some(Held::Each(m)) => m,
        other => (held_resources(other.as_ref()).into_iter())
            .map(|(name, h)| {
                let one = h.one();
                (name, one)
            })
            .collect(),
    };
    fold(&mut held, push, rejected, at);
    t.held = Some(Held::Each(held));
}

type Each = BTreeMap<String, One>;

/// Folds a Delta `push` into `held` but for the `rejected`.
fn fold(held: &mut Each, push: &Push, rejected: &[Rejected], at: Timestamp) {
    let rejected_names = crate::correlate::scope::names(rejected);
    for name in &push.removed {
        held.remove(name);
    }
    for (i, r) in push.resources.iter().enumerate() {
        // A heartbeat changes no content.
        if r.bare || rejected_names.contains(&*r.name) {
            continue;
        }
        let one = One {
            version: r.version.map(String::from),
            digest: r.digest,
            at,
            pushed_at: push.at,
            origins: push.resources.origins_of(i).cloned(),
        };
        held.insert(r.name.into_owned(), one);
    }
}

/// How a resource stands, from the control plane's side and from the client's (the API's
/// enums: CSDS's states, with the tap's finer client states).
pub use crate::api::v1::resource_status::{ClientStatus, ConfigStatus};

/// One resource of one node, as the board reads it (CSDS serves these; `/status?node=` their
/// [`v1::ResourceStatus`] form).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceRow {
    /// Full type URL.
    pub type_url: String,
    /// The resource name.
    pub name: String,
    /// The version the client runs (the resource's own, else its push's); empty: none.
    pub version: String,
    /// The control plane's side.
    pub config: ConfigStatus,
    /// The client's side.
    pub client: ClientStatus,
    /// When this changed last: accepted, pushed or rejected.
    pub last_updated: Timestamp,
    /// When in a NACKed push: (the client's message, the version rejected, when).
    pub error: Option<(String, String, Timestamp)>,
}

/// One node's resources.
#[derive(Clone, Debug)]
pub struct NodeResources {
    /// `node.id`.
    pub id: String,
    /// `node.cluster`.
    pub cluster: String,
    /// `user_agent_name user_agent_version`.
    pub user_agent: String,
    /// By type URL, then name.
    pub resources: Vec<ResourceRow>,
}

/// One held resource: its version and digest, when accepted and pushed, its objects.
pub(super) struct Had {
    pub(super) version: String,
    pub(super) digest: u64,
    pub(super) at: Timestamp,
    pub(super) pushed_at: Timestamp,
    pub(super) origins: Option<Arc<Origins>>,
}

impl Had {
    /// As a node keeps one resource.
    fn one(&self) -> One {
        One {
            version: Some(self.version.clone()),
            digest: self.digest,
            at: self.at,
            pushed_at: self.pushed_at,
            origins: self.origins.clone(),
        }
    }

    fn of_one(one: &One) -> Had {
        Had {
            version: one.version.clone().unwrap_or_default(),
            digest: one.digest,
            at: one.at,
            pushed_at: one.pushed_at,
            origins: one.origins.clone(),
        }
    }
}

pub(super) fn held_resources(held: Option<&Held>) -> BTreeMap<String, Had> {
    // A name twice in a push: Envoy runs the first and rejects the copy.
    let of = |p: &Taken, at: Timestamp| -> BTreeMap<String, Had> {
        let mut m = BTreeMap::new();
        for (i, r) in p.resources.iter().enumerate() {
            let version = r.version.unwrap_or(&p.version).to_string();
            let had = Had {
                version,
                digest: r.digest,
                at,
                pushed_at: p.pushed_at,
                origins: p.resources.origins_of(i).cloned(),
            };
            m.entry(r.name.into_owned()).or_insert(had);
        }
        m
    };
    match held {
        None => BTreeMap::new(),
        Some(Held::Push(p, at)) => of(p, *at),
        Some(Held::Except(p, at, kept)) => {
            let mut m = of(p, *at);
            for (name, had) in kept {
                m.remove(name);
                if let Some(one) = had {
                    m.insert(name.clone(), Had::of_one(one));
                }
            }
            m
        }
        Some(Held::Each(m)) => (m.iter())
            .map(|(name, one)| (name.clone(), Had::of_one(one)))
            .collect(),
    }
}

/// The names asked for that no push held or holds.
fn not_sent(url: &str, t: &TypeEntry, had: &BTreeMap<String, Had>, out: &mut Vec<ResourceRow>) {
    let pushed = |n: &str| {
        let resources = t.unsettled.as_ref().map(|u| &u.push.resources);
        resources.is_some_and(|rs| rs.iter().any(|r| r.name == n))
    };
    for name in t.requested.names.iter() {
        if had.contains_key(name) || pushed(name) {
            continue;
        }
        let absent = t.rare.as_ref().is_some_and(|r| r.absent.contains(name));
        out.push(ResourceRow {
            type_url: url.to_string(),
            name: name.clone(),
            version: String::new(),
            config: match absent {
                true => ConfigStatus::Synced,
                false => ConfigStatus::NotSent,
            },
            client: match absent {
                true => ClientStatus::DoesNotExist,
                false => ClientStatus::Requested,
            },
            last_updated: t.subscribed_at.unwrap_or(0),
            error: None,
        });
    }
}

/// Resources whose TTL lapsed by `now` without a heartbeat: the client dropped them.
fn expired(t: &TypeEntry, start: usize, now: Timestamp, out: &mut [ResourceRow]) {
    let Some(ttls) = t.rare.as_ref().map(|r| &r.ttls).filter(|t| !t.0.is_empty()) else {
        return;
    };
    for r in out[start..].iter_mut() {
        let Some(&(lapsed, ms)) = ttls.0.get(&r.name) else {
            continue;
        };
        if lapsed <= now && r.client == ClientStatus::Acked {
            r.client = ClientStatus::Expired;
            r.last_updated = lapsed;
            let message = format!("its TTL of {} lapsed without a heartbeat", ttl_text(ms));
            r.error = Some((message, r.version.clone(), lapsed));
        }
    }
}

/// Listeners that name routes or secrets the node does not run: WARMING for Envoy's
/// initial fetch timeout, then serving without them (ACKED, with what is missing).
fn warming(types: &super::Types, now: Timestamp, out: &mut [ResourceRow]) {
    let Some(listeners) = types
        .get(crate::xds::LISTENER)
        .and_then(|t| t.rare.as_ref())
        .filter(|r| !r.needs.0.is_empty())
    else {
        return;
    };
    let names = |url: &str| -> std::collections::HashSet<String> {
        let t = types.get(url);
        held_resources(t.and_then(|t| t.held.as_ref()))
            .into_keys()
            .collect()
    };
    let (routes, secrets) = (names(crate::xds::ROUTES), names(crate::xds::SECRET));
    for r in out.iter_mut() {
        if r.type_url != crate::xds::LISTENER || r.client != ClientStatus::Acked {
            continue;
        }
        let Some(needs) = listeners.needs.0.get(&r.name) else {
            continue;
        };
        let missing: Vec<String> = (needs.iter())
            .filter(|(k, n)| match k {
                Needs::Routes => !routes.contains(&**n),
                Needs::Secret => !secrets.contains(&**n),
            })
            .map(|(k, n)| format!("{} {n}", crate::xds::short_type(k.type_url())))
            .collect();
        if missing.is_empty() {
            continue;
        }
        let missing = missing.join(", ");
        let message = match now.saturating_sub(r.last_updated) < WARMING_TIMEOUT_NS {
            true => {
                r.client = ClientStatus::Warming;
                format!("warming: waits for {missing}")
            }
            false => {
                format!("serves without {missing}, not pushed within the 15s initial fetch timeout")
            }
        };
        r.error = Some((message, String::new(), r.last_updated));
    }
}

/// A TTL as Envoy writes durations: `2s`, `1.5s`.
fn ttl_text(ms: u32) -> String {
    match ms % 1000 {
        0 => format!("{}s", ms / 1000),
        _ => format!("{}s", f64::from(ms) / 1000.0),
    }
}

/// The control plane's errors over the resources listed from `start`: a resource it reported
/// an error for is RECEIVED_ERROR (it still runs what it ran, if anything), with that error.
fn cp_errors(url: &str, t: &TypeEntry, start: usize, out: &mut Vec<ResourceRow>) {
    for (name, _, message, at) in t.rare.iter().flat_map(|r| &r.cp_errors.0) {
        let error = Some((message.clone(), String::new(), *at));
        match out[start..].iter_mut().find(|r| r.name == *name) {
            Some(r) => {
                r.client = ClientStatus::ReceivedError;
                r.error = error;
                r.last_updated = *at;
            }
            None => out.push(ResourceRow {
                type_url: url.to_string(),
                name: name.clone(),
                version: String::new(),
                config: ConfigStatus::NotSent,
                client: ClientStatus::ReceivedError,
                last_updated: *at,
                error,
            }),
        }
    }
    out[start..].sort_by(|a, b| a.name.cmp(&b.name));
}

/// Every resource of one type of one node.
fn type_resources(url: &str, t: &TypeEntry, now: Timestamp, out: &mut Vec<ResourceRow>) {
    let start = out.len();
    type_resources_held(url, t, out);
    expired(t, start, now, out);
    cp_errors(url, t, start, out);
}

/// Every resource of one type of one node, but for the control plane's errors.
fn type_resources_held(url: &str, t: &TypeEntry, out: &mut Vec<ResourceRow>) {
    let had = held_resources(t.held.as_ref());
    let status = |name: String, h: &Had| ResourceRow {
        type_url: url.to_string(),
        name,
        version: h.version.clone(),
        config: ConfigStatus::Synced,
        client: ClientStatus::Acked,
        last_updated: h.at,
        error: None,
    };
    let start = out.len();
    not_sent(url, t, &had, out);
    let Some(u) = &t.unsettled else {
        out.extend(had.iter().map(|(n, h)| status(n.clone(), h)));
        out[start..].sort_by(|a, b| a.name.cmp(&b.name));
        return;
    };
    let (config, at) = match &u.nack {
        Some(n) => (ConfigStatus::Error, n.at),
        None => (ConfigStatus::Stale, u.push.at),
    };
    // A resource's own part of the message when the client named it, else the whole message.
    let error = |name: &str| {
        let n = u.nack.as_ref()?;
        let own = n.rejected.iter().find(|r| r.name == name);
        let message = own.map_or(&n.message, |r| &r.reason).clone();
        Some((message, u.push.version.clone(), n.at))
    };
    let named = |name: &str| match &u.nack {
        Some(n) => n.suspects.is_empty() || n.suspects.iter().any(|s| s == name),
        None => false,
    };
    // Scope unknown: only what the message names is known to be rejected (its words read
    // once for all the names).
    let words = (u.nack.as_ref())
        .filter(|n| n.scope == Scope::Unknown)
        .map(|n| Mentions::of(&n.message));
    let unknown = |name: &str| words.as_ref().is_some_and(|w| !w.names(name));
    let unsettled = |name: String, before: Option<&Had>| ResourceRow {
        type_url: url.to_string(),
        version: before.map(|h| h.version.clone()).unwrap_or_default(),
        config,
        client: match before {
            _ if unknown(&name) => ClientStatus::Unknown,
            _ if named(&name) => ClientStatus::Nacked,
            Some(_) => ClientStatus::Acked,
            None => ClientStatus::Requested,
        },
        last_updated: at,
        error: error(&name),
        name,
    };
    let mut changed: HashMap<String, ResourceRow> = HashMap::new();
    for r in u.push.resources.iter() {
        match had.get(&*r.name) {
            Some(h) if h.digest == r.digest => {}
            before => {
                let s = unsettled(r.name.to_string(), before);
                changed.insert(r.name.into_owned(), s);
            }
        }
    }
    // SotW: what the push leaves out, it removes; Delta says what it removes.
    // After a partial NACK the push's removals already applied.
    let partial = u.nack.as_ref().is_some_and(|n| n.scope == Scope::Partial);
    let removed: Vec<String> = match t.api {
        _ if partial => vec![],
        Some(Api::Delta) => u.push.removed.clone(),
        _ => {
            let now: std::collections::HashSet<_> =
                u.push.resources.iter().map(|r| r.name).collect();
            had.keys()
                .filter(|n| !now.contains(n.as_str()))
                .cloned()
                .collect()
        }
    };
    for name in removed {
        if let Some(h) = had.get(&name) {
            let s = unsettled(name.clone(), Some(h));
            changed.insert(name, s);
        }
    }
    for (name, h) in &had {
        if !changed.contains_key(name) {
            out.push(status(name.clone(), h));
        }
    }
    out.extend(changed.into_values());
    out[start..].sort_by(|a, b| a.name.cmp(&b.name));
}

impl StatusBoard {
    /// The resources of every node whose id `wanted` accepts, by node id.
    pub fn resources(&self, wanted: impl Fn(&str) -> bool) -> Vec<NodeResources> {
        self.resources_at(crate::clock::now(), wanted)
    }

    /// The same, with TTLs judged at `now`.
    pub(crate) fn resources_at(
        &self,
        now: Timestamp,
        wanted: impl Fn(&str) -> bool,
    ) -> Vec<NodeResources> {
        let board = self.lock();
        let mut nodes: Vec<NodeResources> = (board.nodes.iter())
            .filter(|(id, _)| wanted(id))
            .map(|(id, n)| {
                let mut resources = Vec::new();
                for (url, t) in n.types.iter() {
                    type_resources(url, t, now, &mut resources);
                }
                warming(&n.types, now, &mut resources);
                NodeResources {
                    id: id.to_string(),
                    cluster: n.cluster.to_string(),
                    user_agent: n.user_agent.to_string(),
                    resources,
                }
            })
            .collect();
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        nodes
    }
}

impl From<ResourceRow> for v1::ResourceStatus {
    fn from(r: ResourceRow) -> Self {
        let (error, rejected) = match r.error {
            Some((message, version, _)) => (Some(message), Some(version).filter(|v| !v.is_empty())),
            None => (None, None),
        };
        v1::ResourceStatus {
            r#type: crate::xds::short_type(&r.type_url).to_string(),
            type_url: r.type_url,
            name: r.name,
            version: r.version,
            config: r.config as i32,
            client: r.client as i32,
            error,
            rejected_version: rejected,
            last_updated: crate::clock::rfc3339(r.last_updated),
        }
    }
}
