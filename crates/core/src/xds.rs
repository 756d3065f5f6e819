//! What xDS messages mean to us: method classification by path, and the few fields we decode
//! (by the streaming [`scan`]ner, never materialising resources).

pub mod decode;
pub mod origin;
pub mod scan;
pub mod wire;

use std::borrow::Cow;
use std::sync::{Arc, Mutex, Weak};

/// State of the World or incremental.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `DiscoveryRequest` / `DiscoveryResponse`: every response carries the whole state.
    Sotw,
    /// `DeltaDiscoveryRequest` / `DeltaDiscoveryResponse`: responses carry changes.
    Delta,
}

impl Api {
    /// `sotw` or `delta`.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Sotw => "sotw",
            Api::Delta => "delta",
        }
    }
}

/// An xDS method, recognised from its `:path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Method {
    /// SotW or Delta.
    pub api: Api,
    /// `Fetch*`: unary SotW.
    pub unary: bool,
    /// The gRPC service, e.g. `envoy.service.discovery.v3.AggregatedDiscoveryService`.
    pub service: String,
    /// The gRPC method, e.g. `StreamAggregatedResources`.
    pub method: String,
}

impl Method {
    /// Classifies a request path; `None` for anything that is not xDS (it passes untouched).
    ///
    /// ADS: `/envoy.service.discovery.v3.AggregatedDiscoveryService/{Stream,Delta}AggregatedResources`;
    /// per type: `/envoy.service.<x>.v3.<Y>DiscoveryService/{Stream,Delta,Fetch}<Z>`.
    pub fn classify(path: &str) -> Option<Method> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        if !service.starts_with("envoy.service.") || !service.ends_with("DiscoveryService") {
            return None;
        }
        let (api, unary) = if method.starts_with("Stream") {
            (Api::Sotw, false)
        } else if method.starts_with("Delta") {
            (Api::Delta, false)
        } else if method.starts_with("Fetch") {
            (Api::Sotw, true)
        } else {
            return None;
        };
        Some(Method {
            api,
            unary,
            service: service.into(),
            method: method.into(),
        })
    }
}

/// The client's node, from the first request of a stream.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Node {
    /// `node.id`, e.g. `sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local`.
    pub id: String,
    /// `node.cluster`.
    pub cluster: String,
    /// `user_agent_name` and `user_agent_version`, e.g. `envoy 1.40.0`.
    pub user_agent: String,
}

/// `google.rpc.Status` from `error_detail`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ErrorDetail {
    /// gRPC code (Envoy uses 13, INTERNAL, for rejected config).
    pub code: i32,
    /// Envoy's message, as sent.
    pub message: String,
}

/// One resource of a response: its name, its version (Delta, or a `Resource` wrapper) and a
/// digest of its bytes. The bytes themselves are never kept: Secrets carry private keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ResourceRef {
    /// The resource name (field 1 of the resource, or the wrapper's name).
    pub name: String,
    /// Per-resource version, when the response carries one.
    pub version: Option<String>,
    /// xxh3-64 of the resource's serialized bytes.
    pub digest: u64,
    /// The wrapper's `ttl`, in milliseconds.
    pub ttl_ms: Option<u32>,
    /// A wrapper with no resource inside: a heartbeat (it refreshes the TTL) or, over SotW,
    /// what Envoy leaves out of the push.
    pub bare: bool,
}

/// What a listener needs before it can serve (it warms until they come).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Needs {
    /// A route configuration (RDS) its HTTP connection manager names.
    Routes,
    /// A secret (SDS) its TLS context names.
    Secret,
}

impl Needs {
    /// The type URL of what is needed.
    pub fn type_url(self) -> &'static str {
        match self {
            Needs::Routes => ROUTES,
            Needs::Secret => SECRET,
        }
    }
}

/// A resource's TTL and whether it came bare, kept beside its entry only when it has either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Timed {
    index: u32,
    ttl_ms: Option<u32>,
    bare: bool,
}

/// A response's resources packed for keeping: a 16-byte entry each, and the names and versions
/// back to back in bytes, in chunks of `CHUNK` resources.
///
/// Chunks are what a fleet shares: each full one is swapped, as soon as it is full, for the
/// equal chunk already alive (an [`Interner`]'s), so a thousand streams decoding the same push
/// at once each hold the chunk they are filling and pointers to shared ones, not a copy of the
/// push; and the whole set is then shared too ([`Interner::intern`]).
///
/// Names are front- and back-coded against the name before them: a control plane's names share
/// long heads and tails (`outbound|8080||`, `.svc.cluster.local`), so most names keep only the
/// bytes that differ and two length bytes. Every `RESTART`th name of a chunk (its first
/// among them) is kept whole, so a chunk depends on its own names only, [`Resources::get`]
/// decodes at most that many names, and [`Resources::iter`] decodes each once. Names alike but
/// for a number, as a control plane's are, keep a few bytes each (unit test
/// `alike_names_take_little_text`). An empty per-resource version reads back as none.
#[derive(Clone, Debug, Default)]
pub struct Resources {
    chunks: Vec<Arc<Chunk>>,
    /// The leading chunks swapped for their shared copy already.
    sealed: usize,
    len: usize,
    /// The last name pushed, whole: what the next name is coded against.
    last: String,
    /// EDS clusters whose service name is not their name: (index, service name), in order.
    services: Vec<(u32, Box<str>)>,
    /// How many are clusters fed by EDS.
    eds: u32,
    /// Resources with a TTL or without a body (wrappers), in order.
    timed: Vec<Timed>,
    /// Listeners' needs: (index, kind, name), in order.
    needs: Vec<(u32, Needs, Box<str>)>,
    /// The objects resources were made from, for those whose metadata names any: (index,
    /// origins), in order; shared with every set holding the same resource.
    origins: Vec<(u32, Arc<origin::Origins>)>,
}

/// Resources per chunk: what a stream decoding a push holds of its own at most (about 2 KiB of
/// entries and the names' bytes that differ), the rest shared.
const CHUNK: usize = 128;

/// Every this many names within a chunk, one is kept whole.
const RESTART: usize = 16;

/// The top bit of an entry's `version_end` (a chunk's text is far below 2 GiB): a cluster that
/// takes its endpoints from EDS.
const EDS_CLUSTER: u32 = 1 << 31;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Chunk {
    /// Per entry: for a coded name, two bytes (head and tail lengths shared with the name
    /// before), then the name's own bytes; for a whole name, the name. Then the version.
    text: Vec<u8>,
    entries: Vec<Entry>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    /// The entry's name bytes end at `text[name_end]`; they start where the entry before ends.
    name_end: u32,
    /// The version is `text[name_end..version_end]`, `version_end` masked by [`EDS_CLUSTER`].
    version_end: u32,
    digest: u64,
}

/// One resource as [`Resources`] hands it out.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Resource<'a> {
    /// The resource name.
    pub name: Cow<'a, str>,
    /// Per-resource version, when the response carries one.
    pub version: Option<&'a str>,
    /// xxh3-64 of the resource's serialized bytes.
    pub digest: u64,
    /// A cluster (CDS) that takes its endpoints from EDS.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub eds: bool,
    /// The wrapper's `ttl`, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u32>,
    /// A wrapper with no resource inside.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub bare: bool,
}

/// Head and tail lengths `name` shares with `prev`, at most 255 each and never overlapping.
fn shared(prev: &[u8], name: &[u8]) -> (usize, usize) {
    let most = prev.len().min(name.len());
    let head = prev
        .iter()
        .zip(name)
        .take(most.min(255))
        .take_while(|(a, b)| a == b)
        .count();
    let tail = prev[head..]
        .iter()
        .rev()
        .zip(name[head..].iter().rev())
        .take((most - head).min(255))
        .take_while(|(a, b)| a == b)
        .count();
    (head, tail)
}

impl Resources {
    /// Appends one resource.
    pub fn push(&mut self, r: ResourceRef) {
        self.push_parts(&r.name, r.version.as_deref(), r.digest);
        self.mark_timed(r.ttl_ms, r.bare);
    }

    /// Gives the last resource pushed its TTL, and marks it bare (a wrapper with no body).
    pub fn mark_timed(&mut self, ttl_ms: Option<u32>, bare: bool) {
        if (ttl_ms.is_some() || bare) && self.len > 0 {
            let index = (self.len - 1) as u32;
            self.timed.push(Timed {
                index,
                ttl_ms,
                bare,
            });
        }
    }

    /// Gives the last resource pushed, a listener, what it needs.
    pub fn mark_needs<'a>(&mut self, needs: impl IntoIterator<Item = (Needs, &'a str)>) {
        if self.len > 0 {
            let index = (self.len - 1) as u32;
            (self.needs).extend(needs.into_iter().map(|(k, n)| (index, k, n.into())));
        }
    }

    /// Gives the last resource pushed the objects it was made from.
    pub fn mark_origins(&mut self, origins: Arc<origin::Origins>) {
        if self.len > 0 {
            self.origins.push(((self.len - 1) as u32, origins));
        }
    }

    /// The objects resource `i` was made from, when its metadata names any.
    pub fn origins_of(&self, i: usize) -> Option<&Arc<origin::Origins>> {
        (self.origins.binary_search_by_key(&(i as u32), |(j, _)| *j))
            .ok()
            .map(|k| &self.origins[k].1)
    }

    /// Whether any resource's metadata names an object.
    pub fn has_origins(&self) -> bool {
        !self.origins.is_empty()
    }

    /// What resource `i`, a listener, needs: RDS and SDS names.
    pub fn needs_of(&self, i: usize) -> impl Iterator<Item = (Needs, &str)> + '_ {
        let start = self.needs.partition_point(|(j, ..)| (*j as usize) < i);
        (self.needs[start..].iter())
            .take_while(move |(j, ..)| *j as usize == i)
            .map(|(_, k, n)| (*k, &**n))
    }

    /// Whether any listener needs anything.
    pub fn has_needs(&self) -> bool {
        !self.needs.is_empty()
    }

    /// Whether any came bare: a heartbeat, or a SotW push Envoy reads without them.
    pub fn has_bare(&self) -> bool {
        self.timed.iter().any(|t| t.bare)
    }

    /// Whether every one came bare (and there is one): a heartbeat, no new content.
    pub fn all_bare(&self) -> bool {
        self.len > 0 && self.timed.iter().filter(|t| t.bare).count() == self.len
    }

    /// Whether any has a TTL.
    pub fn has_ttl(&self) -> bool {
        self.timed.iter().any(|t| t.ttl_ms.is_some())
    }

    /// Appends one resource given by its parts.
    pub fn push_parts(&mut self, name: &str, version: Option<&str>, digest: u64) {
        let j = self.len % CHUNK;
        if j == 0 {
            self.chunks.push(Arc::default());
        }
        let chunk = Arc::make_mut(self.chunks.last_mut().expect("pushed above"));
        let bytes = name.as_bytes();
        if j.is_multiple_of(RESTART) {
            chunk.text.extend_from_slice(bytes);
        } else {
            let (head, tail) = shared(self.last.as_bytes(), bytes);
            chunk.text.extend_from_slice(&[head as u8, tail as u8]);
            chunk
                .text
                .extend_from_slice(&bytes[head..bytes.len() - tail]);
        }
        // A chunk's text is at most CHUNK names and versions of one message (under 4 GiB).
        let name_end = chunk.text.len() as u32;
        chunk
            .text
            .extend_from_slice(version.unwrap_or("").as_bytes());
        chunk.entries.push(Entry {
            name_end,
            version_end: chunk.text.len() as u32,
            digest,
        });
        self.last.clear();
        self.last.push_str(name);
        self.len += 1;
    }

    /// Marks the last resource pushed as a cluster fed by EDS, under `service` when its
    /// `eds_cluster_config.service_name` is not its own name.
    pub fn mark_eds(&mut self, service: Option<&str>) {
        let Some(last) = (self.chunks.last_mut()).and_then(|c| Arc::make_mut(c).entries.last_mut())
        else {
            return;
        };
        if last.version_end & EDS_CLUSTER == 0 {
            self.eds += 1;
        }
        last.version_end |= EDS_CLUSTER;
        if let Some(s) = service.filter(|s| !s.is_empty() && *s != self.last) {
            self.services.push(((self.len - 1) as u32, s.into()));
        }
    }

    /// The EDS resource name of resource `i`, a cluster fed by EDS: its service name, else its
    /// own name.
    pub fn eds_name<'a>(&'a self, i: usize, r: &'a Resource<'a>) -> Option<&'a str> {
        if !r.eds {
            return None;
        }
        let service = self
            .services
            .binary_search_by_key(&(i as u32), |(j, _)| *j)
            .ok()
            .map(|k| &*self.services[k].1);
        Some(service.unwrap_or(&r.name))
    }

    /// The first `k` resources, as if only they had been pushed: the full chunks among them
    /// shared, the rest pushed again.
    pub fn prefix(&self, k: usize) -> Resources {
        let k = k.min(self.len);
        let whole = k / CHUNK * CHUNK;
        // The side tables are in index order: what comes before `whole` is a head of each, cut
        // without walking the rest (a prefix of a large push costs its own size only).
        fn head<T: Clone>(v: &[T], whole: usize, index: impl Fn(&T) -> u32) -> Vec<T> {
            v[..v.partition_point(|x| (index(x) as usize) < whole)].to_vec()
        }
        let mut r = Resources {
            chunks: self.chunks[..whole / CHUNK].to_vec(),
            sealed: whole / CHUNK,
            len: whole,
            last: String::new(),
            services: head(&self.services, whole, |(i, _)| *i),
            eds: (0..whole)
                .filter(|i| self.digest_at(*i).is_some_and(|(_, eds)| eds))
                .count() as u32,
            timed: head(&self.timed, whole, |t| t.index),
            needs: head(&self.needs, whole, |(i, ..)| *i),
            origins: head(&self.origins, whole, |(i, _)| *i),
        };
        for i in whole..k {
            let Some(x) = self.get(i) else { break };
            r.push_parts(&x.name, x.version, x.digest);
            if let Some(service) = self.eds_name(i, &x) {
                r.mark_eds(Some(service));
            }
            r.mark_timed(x.ttl_ms, x.bare);
            r.mark_needs(self.needs_of(i));
            if let Some(o) = self.origins_of(i) {
                r.mark_origins(o.clone());
            }
        }
        r
    }

    /// Whether any is a cluster fed by EDS.
    pub fn has_eds(&self) -> bool {
        self.eds > 0
    }

    /// Resource `i`'s digest and whether it is a cluster fed by EDS, without its name.
    pub fn digest_at(&self, i: usize) -> Option<(u64, bool)> {
        let e = self.chunks.get(i / CHUNK)?.entries.get(i % CHUNK)?;
        Some((e.digest, e.version_end & EDS_CLUSTER != 0))
    }

    /// How many resources.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No resources.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `i`th resource.
    pub fn get(&self, i: usize) -> Option<Resource<'_>> {
        let chunk = self.chunks.get(i / CHUNK)?;
        let j = i % CHUNK;
        chunk.entries.get(j)?;
        let restart = j - j % RESTART;
        let mut whole: Option<Vec<u8>> = None;
        for k in restart + 1..=j {
            let prev = whole
                .as_deref()
                .unwrap_or_else(|| chunk.name_bytes(restart));
            whole = Some(chunk.decode(k, prev));
        }
        let mut r = chunk.resource(j, whole);
        if let Ok(k) = self.timed.binary_search_by_key(&(i as u32), |t| t.index) {
            (r.ttl_ms, r.bare) = (self.timed[k].ttl_ms, self.timed[k].bare);
        }
        Some(r)
    }

    /// The resources in order.
    pub fn iter(&self) -> impl Iterator<Item = Resource<'_>> + '_ {
        let mut prev: Vec<u8> = Vec::new();
        let mut timed = self.timed.iter().peekable();
        (0..self.len).map(move |i| {
            let (chunk, j) = (&self.chunks[i / CHUNK], i % CHUNK);
            let mut r = if j.is_multiple_of(RESTART) {
                prev.clear();
                prev.extend_from_slice(chunk.name_bytes(j));
                chunk.resource(j, None)
            } else {
                let name = chunk.decode(j, &prev);
                prev.clear();
                prev.extend_from_slice(&name);
                chunk.resource(j, Some(name))
            };
            if let Some(t) = timed.next_if(|t| t.index == i as u32) {
                (r.ttl_ms, r.bare) = (t.ttl_ms, t.bare);
            }
            r
        })
    }

    /// Whether `other` holds the same resources in the same order (names, versions, digests
    /// and which clusters take their endpoints from EDS).
    pub fn same_as(&self, other: &Resources) -> bool {
        self.len == other.len
            && self.eds == other.eds
            && self.chunks == other.chunks
            && self.services == other.services
            && self.timed == other.timed
            && self.needs == other.needs
            && self.origins.len() == other.origins.len()
            && (self.origins.iter().zip(&other.origins))
                .all(|((i, a), (j, b))| i == j && (Arc::ptr_eq(a, b) || a == b))
    }

    /// A digest of what [`Resources::same_as`] compares, to find equal sets fast.
    pub fn content_digest(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&(self.len as u64).to_le_bytes());
        for c in &self.chunks {
            h.update(&c.digest().to_le_bytes());
        }
        for (i, s) in &self.services {
            h.update(&i.to_le_bytes());
            h.update(s.as_bytes());
        }
        for (i, k, n) in &self.needs {
            h.update(&i.to_le_bytes());
            h.update(&[*k as u8]);
            h.update(n.as_bytes());
        }
        for (i, _) in &self.origins {
            h.update(&i.to_le_bytes());
        }
        for t in &self.timed {
            h.update(&t.index.to_le_bytes());
            h.update(&t.ttl_ms.map_or(u64::MAX, u64::from).to_le_bytes());
            h.update(&[t.bare as u8]);
        }
        h.digest()
    }

    /// Gives back the growth slack of the last chunk once the message is complete.
    pub fn shrink_to_fit(&mut self) {
        if let Some(c) = self.chunks.last_mut().and_then(Arc::get_mut) {
            c.text.shrink_to_fit();
            c.entries.shrink_to_fit();
        }
        self.chunks.shrink_to_fit();
        self.timed.shrink_to_fit();
        self.needs.shrink_to_fit();
        self.origins.shrink_to_fit();
        self.last = String::new();
    }
}

impl Chunk {
    /// A digest of the chunk's entries and text.
    fn digest(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&self.text);
        for e in &self.entries {
            h.update(&e.name_end.to_le_bytes());
            h.update(&e.version_end.to_le_bytes());
            h.update(&e.digest.to_le_bytes());
        }
        h.digest()
    }

    /// Entry `j`'s bytes up to its version, as stored.
    fn name_bytes(&self, j: usize) -> &[u8] {
        let start = match j {
            0 => 0,
            _ => (self.entries[j - 1].version_end & !EDS_CLUSTER) as usize,
        };
        &self.text[start..self.entries[j].name_end as usize]
    }

    /// Entry `j`'s whole name, given the whole name before it (`j` is not a restart).
    fn decode(&self, j: usize, prev: &[u8]) -> Vec<u8> {
        let stored = self.name_bytes(j);
        let (head, tail) = (stored[0] as usize, stored[1] as usize);
        let mut name = Vec::with_capacity(head + stored.len() - 2 + tail);
        name.extend_from_slice(&prev[..head]);
        name.extend_from_slice(&stored[2..]);
        name.extend_from_slice(&prev[prev.len() - tail..]);
        name
    }

    /// Entry `j`, with its whole name when decoded (`None`: a restart, kept whole).
    fn resource(&self, j: usize, whole: Option<Vec<u8>>) -> Resource<'_> {
        let e = self.entries[j];
        let (name_end, version_end) =
            (e.name_end as usize, (e.version_end & !EDS_CLUSTER) as usize);
        Resource {
            name: match whole {
                // What was pushed as text comes back whole: the lossy paths never run.
                Some(bytes) => Cow::Owned(
                    String::from_utf8(bytes)
                        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
                ),
                None => String::from_utf8_lossy(self.name_bytes(j)),
            },
            version: (version_end > name_end)
                .then(|| std::str::from_utf8(&self.text[name_end..version_end]).unwrap_or("")),
            eds: e.version_end & EDS_CLUSTER != 0,
            digest: e.digest,
            ttl_ms: None,
            bare: false,
        }
    }
}

/// Equal when the same resources are held, whatever was pushed last.
impl PartialEq for Resources {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len
            && self.chunks == other.chunks
            && self.services == other.services
            && self.eds == other.eds
            && self.timed == other.timed
            && self.needs == other.needs
    }
}

impl Eq for Resources {}

impl FromIterator<ResourceRef> for Resources {
    fn from_iter<I: IntoIterator<Item = ResourceRef>>(iter: I) -> Self {
        let mut r = Resources::default();
        for x in iter {
            r.push(x);
        }
        r
    }
}

impl serde::Serialize for Resources {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// A request from the client, either API.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// `type_url`.
    pub type_url: String,
    /// SotW `version_info`: the version the client has accepted. Empty in Delta.
    pub version_info: String,
    /// `response_nonce`: which push this answers; empty on a new subscription.
    pub response_nonce: String,
    /// `node`, when sent.
    pub node: Option<Node>,
    /// `error_detail`: set on a NACK.
    pub error_detail: Option<ErrorDetail>,
    /// SotW `resource_names`, or Delta `resource_names_subscribe`.
    pub resource_names: Vec<String>,
    /// Delta `resource_names_unsubscribe`.
    pub unsubscribe: Vec<String>,
    /// Delta `initial_resource_versions` (name, version), sent after a reconnect.
    pub initial_resource_versions: Vec<(String, String)>,
}

/// A response from the control plane, either API.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    /// `type_url`.
    pub type_url: String,
    /// SotW `version_info`, or Delta `system_version_info`.
    pub version_info: String,
    /// `nonce`.
    pub nonce: String,
    /// The resources, names and digests only.
    pub resources: Resources,
    /// Delta `removed_resources` and `removed_resource_names`.
    pub removed: Vec<String>,
    /// `control_plane.identifier`.
    pub control_plane: Option<String>,
    /// `resource_errors`: resources the control plane could not produce, each with its
    /// `error_detail` (capped).
    pub resource_errors: Vec<(String, ErrorDetail)>,
    /// Size of the message body, bytes.
    pub bytes: u64,
    /// How often a bound of the object reader left something of a resource's metadata out
    /// (its objects may then be incomplete): counted, never silent.
    pub origins_cut: u32,
}

/// A decoded xDS message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Client to control plane.
    Request(Request),
    /// Control plane to client.
    Response(Response),
}

/// A resource as the scanner decoded it from its bytes, kept to add it again, without decoding,
/// when the very same bytes come (the same push to another stream). Names and digests only.
#[derive(Debug)]
pub struct Decoded {
    /// The resource name.
    pub name: Box<str>,
    /// Per-resource version, when the response carries one.
    pub version: Option<Box<str>>,
    /// xxh3-64 of the resource's bytes.
    pub digest: u64,
    /// A cluster fed by EDS: its service name (empty: its own name).
    pub eds: Option<Box<str>>,
    /// The wrapper's `ttl`, in milliseconds.
    pub ttl_ms: Option<u32>,
    /// A wrapper with no resource inside.
    pub bare: bool,
    /// A listener's needs: RDS and SDS names.
    pub needs: Box<[(Needs, Box<str>)]>,
    /// The objects its metadata names.
    pub origins: Option<Arc<origin::Origins>>,
}

impl Decoded {
    /// Appends this resource to `r`, as [`Resources::push`] and the marks would.
    pub fn add_to(&self, r: &mut Resources) {
        r.push_parts(&self.name, self.version.as_deref(), self.digest);
        if let Some(service) = &self.eds {
            r.mark_eds(Some(service));
        }
        r.mark_timed(self.ttl_ms, self.bare);
        r.mark_needs(self.needs.iter().map(|(k, n)| (*k, &**n)));
        if let Some(o) = &self.origins {
            r.mark_origins(o.clone());
        }
    }
}

/// Resources remembered by their bytes at most; past it the memory starts again empty. A
/// mesh's config of a few thousand resources fits many times over.
const MAX_DECODED: usize = 32_768;

/// Pushes remembered as runs at most; past it the memory starts again empty.
const MAX_RUNS: usize = 64;

/// A push's resources as one stream read them, for the next stream the same push goes to:
/// the digests of each resource's bytes, in order, and the set they made.
#[derive(Debug)]
pub struct RunRecord {
    /// 128-bit digests of the resources' bytes, in order.
    pub keys: Box<[u128]>,
    /// The resources they decode to.
    pub resources: Resources,
}

/// Resource sets held once however many streams were pushed them: a fleet's clients get the same
/// push, so each stream's copy is replaced by the one copy still alive, found by content; and,
/// while streams decode, each full chunk of a set likewise ([`Interner::seal`]), so decoding the
/// same push on many streams at once holds it about once. Only live sets and chunks are found;
/// the dead are swept as the maps grow.
#[derive(Default)]
pub struct Interner {
    sets: Mutex<Interned<Resources>>,
    chunks: Mutex<Interned<Chunk>>,
    /// Resources decoded, by a 128-bit digest of their bytes (and of the message kind).
    decoded: Mutex<std::collections::HashMap<u128, Arc<Decoded>, Prehashed>>,
    /// Pushes read whole, by their first resource's digest.
    runs: Mutex<std::collections::HashMap<u128, Arc<RunRecord>, Prehashed>>,
    /// Pushes being recorded, by their first resource's digest: claimed while the stream
    /// recording holds the token.
    recording: Mutex<std::collections::HashMap<u128, Weak<()>, Prehashed>>,
    /// The objects one set changed against another, for the last few pairs: a fleet moving
    /// from one push to the next diffs them once.
    changes: Mutex<std::collections::VecDeque<ChangedPair>>,
}

/// Two sets, and the objects the second changed against the first.
type ChangedPair = (Weak<Resources>, Weak<Resources>, Arc<origin::Changed>);

/// Pairs of sets whose changed objects are kept.
const CHANGES_KEPT: usize = 32;

/// The keys of [`Interner::decoded`] are digests already: their low bits are the hash.
#[derive(Clone, Copy, Default)]
struct Prehashed;

impl std::hash::BuildHasher for Prehashed {
    type Hasher = Digest;
    fn build_hasher(&self) -> Digest {
        Digest(0)
    }
}

/// A hasher that keeps the last `u128` written, truncated.
#[derive(Default)]
struct Digest(u64);

impl std::hash::Hasher for Digest {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u128 keys are hashed here; other input is folded in all the same.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

struct Interned<T> {
    by_digest: std::collections::HashMap<u64, Weak<T>>,
    /// Sweep the dead when the map reaches this size.
    sweep_at: usize,
}

impl<T> Default for Interned<T> {
    fn default() -> Self {
        Interned {
            by_digest: std::collections::HashMap::new(),
            sweep_at: 0,
        }
    }
}

impl<T: PartialEq> Interned<T> {
    /// The live copy of `item` in `map`, or `item` now in it. Compared outside the lock: one
    /// stream's large set never holds up another's.
    fn get_or_insert(map: &Mutex<Self>, digest: u64, item: Arc<T>) -> Arc<T> {
        let lock = || map.lock().unwrap_or_else(|p| p.into_inner());
        let live = lock().by_digest.get(&digest).and_then(Weak::upgrade);
        if let Some(live) = live.filter(|l| **l == *item) {
            return live;
        }
        let mut m = lock();
        if m.by_digest.len() >= m.sweep_at {
            m.by_digest.retain(|_, w| w.strong_count() > 0);
            m.sweep_at = (m.by_digest.len() * 2).max(64);
        }
        m.by_digest.insert(digest, Arc::downgrade(&item));
        item
    }
}

impl Interner {
    /// The objects `new` changed against `old` ([`origin::Changed::between`]), diffed once for
    /// every stream that moves from the one to the other.
    pub fn changed(&self, old: &Arc<Resources>, new: &Arc<Resources>) -> Arc<origin::Changed> {
        let lock = || self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let same =
            |w: &Weak<Resources>, a: &Arc<Resources>| std::ptr::eq(w.as_ptr(), Arc::as_ptr(a));
        let found = (lock().iter())
            .find(|(o, n, _)| {
                same(o, old) && same(n, new) && o.strong_count() > 0 && n.strong_count() > 0
            })
            .map(|(_, _, c)| c.clone());
        if let Some(c) = found {
            return c;
        }
        let c = Arc::new(origin::Changed::between(old, new));
        let mut kept = lock();
        if kept.len() == CHANGES_KEPT {
            kept.pop_front();
        }
        kept.push_back((Arc::downgrade(old), Arc::downgrade(new), c.clone()));
        c
    }

    /// The one live copy of `resources`, or `resources` itself, now shared (its chunks too).
    /// Empty sets are not kept: there is nothing to share.
    pub fn intern(&self, mut resources: Resources) -> Arc<Resources> {
        if resources.is_empty() {
            return Arc::new(resources);
        }
        self.seal_from(&mut resources, true);
        let digest = resources.content_digest();
        Interned::get_or_insert(&self.sets, digest, Arc::new(resources))
    }

    /// Swaps each full chunk of a set being decoded for the live copy of an equal chunk; call
    /// it as resources are pushed. Costs a digest of each chunk once.
    pub fn seal(&self, resources: &mut Resources) {
        self.seal_from(resources, false);
    }

    fn seal_from(&self, r: &mut Resources, last_too: bool) {
        while r.sealed < r.chunks.len() {
            let i = r.sealed;
            if r.chunks[i].entries.len() < CHUNK && !last_too {
                return;
            }
            let digest = r.chunks[i].digest();
            r.chunks[i] = Interned::get_or_insert(&self.chunks, digest, r.chunks[i].clone());
            r.sealed += 1;
        }
    }

    /// The resource whose bytes have digest `key`, when decoded before.
    pub fn decoded(&self, key: u128) -> Option<Arc<Decoded>> {
        let decoded = self.decoded.lock().unwrap_or_else(|p| p.into_inner());
        decoded.get(&key).cloned()
    }

    /// The right to record the push whose first resource has digest `first`, unless another
    /// stream holds it: one stream records a push while the fleet gets it at once.
    pub fn claim(&self, first: u128) -> Option<Arc<()>> {
        let mut recording = self.recording.lock().unwrap_or_else(|p| p.into_inner());
        if recording.get(&first).is_some_and(|w| w.strong_count() > 0) {
            return None;
        }
        if recording.len() >= MAX_RUNS {
            recording.retain(|_, w| w.strong_count() > 0);
        }
        let token = Arc::new(());
        recording.insert(first, Arc::downgrade(&token));
        Some(token)
    }

    /// The push recorded whose first resource has digest `first`.
    pub fn run_from(&self, first: u128) -> Option<Arc<RunRecord>> {
        let runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.get(&first).cloned()
    }

    /// Records the push a stream read whole, `resources` (its chunks sealed now, so that the
    /// record and the stream share them) of resources with digests `keys`, unless the same is
    /// recorded already.
    pub fn offer_run(&self, keys: Vec<u128>, resources: &mut Resources) {
        let Some(&first) = keys.first() else {
            return;
        };
        if self.run_from(first).is_some_and(|r| *r.keys == *keys) {
            return;
        }
        self.seal_from(resources, true);
        let record = Arc::new(RunRecord {
            keys: keys.into_boxed_slice(),
            resources: resources.clone(),
        });
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if runs.len() >= MAX_RUNS {
            *runs = std::collections::HashMap::default();
        }
        runs.insert(first, record);
    }

    /// Remembers the resource whose bytes have digest `key`.
    pub fn remember(&self, key: u128, resource: Decoded) {
        let mut decoded = self.decoded.lock().unwrap_or_else(|p| p.into_inner());
        if decoded.len() >= MAX_DECODED {
            *decoded = std::collections::HashMap::default();
        }
        decoded.insert(key, Arc::new(resource));
    }

    /// Sets in the map, live or not yet swept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        sets.by_digest.len()
    }

    /// Whether the map is empty.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The type URL of clusters (CDS).
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// The type URL of listeners (LDS).
pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// The type URL of route configurations (RDS).
pub const ROUTES: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// The type URL of secrets (SDS).
pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
/// An HTTP connection manager, as a listener's network filter.
pub const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
/// A listener's TLS transport socket.
pub const DOWNSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
/// The type URL of endpoints (EDS).
pub const ENDPOINTS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Short name of a well-known type, for span names and tables (`CDS`, `EDS`, ...).
pub fn short_type(type_url: &str) -> &str {
    let message = type_url.rsplit('/').next().unwrap_or(type_url);
    (SHORT_TYPES.iter())
        .find(|(_, m)| *m == message)
        .map_or(message, |(short, _)| short)
}

/// Whether `type_url` is one of `types`, as people name types: short names such as `CDS` (any
/// case) or type URLs; no types at all names every type.
pub fn is_type_named(types: &[String], type_url: &str) -> bool {
    types.is_empty()
        || (types.iter()).any(|t| t == type_url || t.eq_ignore_ascii_case(short_type(type_url)))
}

/// The types with a short name: (short name, message).
const SHORT_TYPES: [(&str, &str); 10] = [
    ("CDS", "envoy.config.cluster.v3.Cluster"),
    ("EDS", "envoy.config.endpoint.v3.ClusterLoadAssignment"),
    ("LEDS", "envoy.config.endpoint.v3.LbEndpoint"),
    ("LDS", "envoy.config.listener.v3.Listener"),
    ("RDS", "envoy.config.route.v3.RouteConfiguration"),
    ("SRDS", "envoy.config.route.v3.ScopedRouteConfiguration"),
    ("VHDS", "envoy.config.route.v3.VirtualHost"),
    ("SDS", "envoy.extensions.transport_sockets.tls.v3.Secret"),
    ("RTDS", "envoy.service.runtime.v3.Runtime"),
    ("ECDS", "envoy.config.core.v3.TypedExtensionConfig"),
];

/// A type as users name one (`--type`): a short name (`CDS`, any case), a type URL, or a
/// message's full name (`istio.networking.nds.v1.NameTable`). Otherwise why not.
pub fn type_name(t: &str) -> Result<String, String> {
    let short = SHORT_TYPES.iter().any(|(s, _)| s.eq_ignore_ascii_case(t));
    if short || t.contains('/') || t.contains('.') {
        return Ok(t.to_string());
    }
    let shorts: Vec<&str> = SHORT_TYPES.iter().map(|(s, _)| *s).collect();
    Err(format!(
        "not a type: one of {}, a type URL or a message name",
        shorts.join(", ")
    ))
}

/// `s` fit for a terminal or a text log: control characters (C0, DEL, C1, and so ESC and
/// newlines) and the Unicode controls that reorder or hide what is shown (bidi embeddings,
/// overrides and isolates, marks, zero-width characters) are written as `\u{1b}`; everything
/// else as it is. Node ids, messages and names come from the network: none may move the cursor,
/// forge a line or recolour a terminal.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    fn hidden(c: char) -> bool {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    }
    if !s.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match hidden(c) {
            true => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            false => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Envoy's NACK of a resource of the wrong type quotes the whole response after
/// ` in DiscoveryResponse `: resource contents, which are never kept. The quote is cut.
pub fn without_response_dump(message: &str) -> &str {
    const QUOTE: &str = " in DiscoveryResponse ";
    match message.find(QUOTE) {
        Some(i) => &message[..i],
        None => message,
    }
}

/// A client's error message with every private key block in it replaced by
/// `[redacted private key]`: a NACK of a Secret (or of any resource) may quote a key, and nothing
/// the tap logs, exports or shows may carry one. A block is an armored one whose `-----BEGIN`
/// label holds `PRIVATE KEY`: PEM (`PRIVATE KEY`, `RSA PRIVATE KEY`, `EC PRIVATE KEY`,
/// `ENCRYPTED PRIVATE KEY`), OpenSSH (`OPENSSH PRIVATE KEY`) and PGP (`PGP PRIVATE KEY BLOCK`);
/// it ends at the `-----END` line of that label, or at the message's end when cut off.
pub fn redact_private_keys(message: &str) -> std::borrow::Cow<'_, str> {
    const BEGIN: &str = "-----BEGIN ";
    if !message.contains("PRIVATE KEY") {
        return std::borrow::Cow::Borrowed(message);
    }
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(begin) = rest.find(BEGIN) {
        let after = &rest[begin + BEGIN.len()..];
        let label = after.find("-----").map(|e| &after[..e]);
        let Some(label) = label.filter(|l| l.contains("PRIVATE KEY")) else {
            out.push_str(&rest[..begin + BEGIN.len()]);
            rest = after;
            continue;
        };
        out.push_str(&rest[..begin]);
        out.push_str("[redacted private key]");
        let end = format!("-----END {label}-----");
        rest = match after.find(&end) {
            Some(i) => &after[i + end.len()..],
            None => "",
        };
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str], digest: u64) -> Resources {
        let mut r = Resources::default();
        for n in names {
            r.push_parts(n, None, digest);
        }
        r.shrink_to_fit();
        r
    }

    #[test]
    fn equal_sets_are_held_once_while_alive() {
        let interner = Interner::default();
        let a = interner.intern(set(&["a", "b"], 1));
        let b = interner.intern(set(&["a", "b"], 1));
        assert!(
            std::sync::Arc::ptr_eq(&a, &b),
            "the same content is one copy"
        );
        let other = interner.intern(set(&["a", "b"], 2));
        assert!(
            !std::sync::Arc::ptr_eq(&a, &other),
            "another digest is another set"
        );
        let mut eds = set(&["a", "b"], 1);
        eds.mark_eds(None);
        assert!(!std::sync::Arc::ptr_eq(&a, &interner.intern(eds)));
        drop((a, b, other));
        // Nothing alive: a new copy is made, and the dead are swept as the map grows.
        let again = interner.intern(set(&["a", "b"], 1));
        assert_eq!(std::sync::Arc::strong_count(&again), 1);
        for i in 0..1000u64 {
            interner.intern(set(&["x"], i));
        }
        assert!(
            interner.len() < 200,
            "dead sets are swept: {}",
            interner.len()
        );
    }

    #[test]
    fn network_strings_print_escaped() {
        assert_eq!(
            printable("plain 'STRICT_DNS' ünï"),
            "plain 'STRICT_DNS' ünï"
        );
        assert_eq!(
            printable("a\u{1b}[2J\nb\u{1b}]0;x\u{7}\u{202e}c"),
            "a\\u{1b}[2J\\u{a}b\\u{1b}]0;x\\u{7}\\u{202e}c"
        );
    }

    #[test]
    fn private_keys_are_redacted_from_messages() {
        let m = "bad secret: inline_string: \"-----BEGIN PRIVATE KEY-----\\nMIIEv...\\n-----END PRIVATE KEY-----\\n\" cert ok";
        let r = redact_private_keys(m);
        assert!(!r.contains("MIIEv"), "{r}");
        assert!(
            r.starts_with("bad secret: inline_string: \"[redacted private key]"),
            "{r}"
        );
        assert!(r.ends_with("\" cert ok"), "{r}");
        let cut = "x -----BEGIN EC PRIVATE KEY-----\nABCD";
        assert_eq!(redact_private_keys(cut), "x [redacted private key]");
        let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";
        assert_eq!(redact_private_keys(cert), cert);
        let pgp = "k: -----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n=abcd\n-----END PGP PRIVATE KEY BLOCK----- ok";
        assert_eq!(redact_private_keys(pgp), "k: [redacted private key] ok");
        let ssh = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----";
        assert_eq!(redact_private_keys(ssh), "[redacted private key]");
        let two = "a -----BEGIN RSA PRIVATE KEY-----\nX\n-----END RSA PRIVATE KEY----- b -----BEGIN ENCRYPTED PRIVATE KEY-----\nY\n-----END ENCRYPTED PRIVATE KEY----- c";
        assert_eq!(
            redact_private_keys(two),
            "a [redacted private key] b [redacted private key] c"
        );
        assert_eq!(redact_private_keys("plain"), "plain");
    }

    #[test]
    fn classifies_paths() {
        let ads = Method::classify(
            "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        )
        .unwrap();
        assert_eq!((ads.api, ads.unary), (Api::Sotw, false));
        let delta = Method::classify(
            "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
        )
        .unwrap();
        assert_eq!(delta.api, Api::Delta);
        let cds =
            Method::classify("/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters")
                .unwrap();
        assert!(cds.unary);
        let eds =
            Method::classify("/envoy.service.endpoint.v3.EndpointDiscoveryService/DeltaEndpoints")
                .unwrap();
        assert_eq!(eds.api, Api::Delta);
        assert!(
            Method::classify("/istio.v1.auth.IstioCertificateService/CreateCertificate").is_none()
        );
        assert!(Method::classify("/grpc.health.v1.Health/Check").is_none());
        assert!(Method::classify("garbage").is_none());
        assert_eq!(
            short_type("type.googleapis.com/envoy.config.cluster.v3.Cluster"),
            "CDS"
        );
    }

    /// What `r` hands out, as owned resources.
    fn owned(r: &Resources) -> Vec<ResourceRef> {
        r.iter()
            .map(|x| ResourceRef {
                name: x.name.into_owned(),
                version: x.version.map(String::from),
                digest: x.digest,
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn resources_keep_names_versions_and_digests_in_order() {
        let input = vec![
            ResourceRef {
                name: "a".into(),
                version: None,
                digest: 1,
                ..Default::default()
            },
            ResourceRef {
                name: String::new(),
                version: Some("v7".into()),
                digest: 2,
                ..Default::default()
            },
            ResourceRef {
                name: "ü-cluster".into(),
                version: Some("9".into()),
                digest: 3,
                ..Default::default()
            },
            ResourceRef {
                name: "b".into(),
                version: None,
                digest: u64::MAX,
                ..Default::default()
            },
        ];
        let r: Resources = input.iter().cloned().collect();
        assert_eq!(r.len(), 4);
        assert_eq!(owned(&r), input);
        assert!(r.get(4).is_none());
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"[{"name":"a","version":null,"digest":1},{"name":"","version":"v7","digest":2},{"name":"ü-cluster","version":"9","digest":3},{"name":"b","version":null,"digest":18446744073709551615}]"#
        );
        assert!(Resources::default().is_empty());

        // Across chunk boundaries; an empty version reads back as none.
        let many: Resources = (0..5000u64)
            .map(|i| ResourceRef {
                name: format!("c{i}"),
                version: (i % 3 == 0).then(|| i.to_string()).or(Some(String::new())),
                digest: i,
                ..Default::default()
            })
            .collect();
        assert_eq!(many.len(), 5000);
        for (i, r) in many.iter().enumerate() {
            assert_eq!(r.name, format!("c{i}"));
            assert_eq!(r.version, (i % 3 == 0).then(|| i.to_string()).as_deref());
            assert_eq!(r.digest, i as u64);
        }
        assert_eq!(many.iter().count(), 5000);
    }

    proptest::proptest! {
        /// Names that share heads and tails with the name before them in any way (none, all of
        /// it, past the 255 coded, or partway into a multi-byte character), and empty ones, come
        /// back whole in order by `iter` and by `get` at any index, across restarts and chunks.
        #[test]
        fn coded_names_come_back_whole(
            parts in proptest::collection::vec(
                (0usize..4, "[aü€-]{0,6}", 0usize..4, 0u8..3),
                0..4200,
            ),
            probes in proptest::collection::vec(0usize..5000, 0..40),
        ) {
            let heads = ["", "outbound|8080||svc-", &"h".repeat(300), "ü"];
            let tails = ["", ".bench.svc.cluster.local", &"t".repeat(300), "€"];
            let input: Vec<ResourceRef> = parts
                .iter()
                .enumerate()
                .map(|(i, (h, mid, t, v))| ResourceRef {
                    name: format!("{}{mid}{}", heads[*h], tails[*t]),
                    version: match v {
                        0 => None,
                        1 => Some(format!("v{i}")),
                        _ => Some("€".into()),
                    },
                    digest: i as u64 * 31,
                    ..Default::default()
                })
                .collect();
            let r: Resources = input.iter().cloned().collect();
            proptest::prop_assert_eq!(&owned(&r), &input);
            for i in probes {
                let got = r.get(i);
                proptest::prop_assert_eq!(got.is_some(), i < input.len());
                if let Some(got) = got {
                    proptest::prop_assert_eq!(&*got.name, input[i].name.as_str());
                    proptest::prop_assert_eq!(got.version, input[i].version.as_deref());
                    proptest::prop_assert_eq!(got.digest, input[i].digest);
                }
            }
        }
    }

    /// Names alike but for a number keep only the differing bytes (and the two lengths), except
    /// one in every RESTART kept whole.
    #[test]
    fn alike_names_take_little_text() {
        let names = |n: usize| {
            (0..n)
                .map(|i| ResourceRef {
                    name: format!("outbound|8080||svc-{i}.bench.svc.cluster.local"),
                    version: None,
                    digest: 0,
                    ..Default::default()
                })
                .collect::<Resources>()
        };
        let r = names(50_000);
        let text: usize = r.chunks.iter().map(|c| c.text.len()).sum();
        let whole: usize = r.iter().map(|x| x.name.len()).sum();
        assert!(whole > 2_300_000, "{whole}");
        assert!(text * 6 < whole, "coded {text} of {whole} bytes");
    }

    /// Streams decoding the same push at once share each chunk as soon as it is full: what a
    /// stream holds of its own is the chunk it fills, whatever the size of the push; the sets
    /// once whole are one copy, read back as pushed.
    #[test]
    fn streams_decoding_the_same_push_share_its_chunks_as_they_fill() {
        let interner = Interner::default();
        let resource = |i: usize| ResourceRef {
            name: format!("outbound|8080||svc-{i}.ns.svc.cluster.local"),
            digest: i as u64,
            ..Default::default()
        };
        let (mut a, mut b) = (Resources::default(), Resources::default());
        for i in 0..CHUNK * 3 + 5 {
            for r in [&mut a, &mut b] {
                r.push(resource(i));
                interner.seal(r);
            }
            let full = (i + 1) / CHUNK;
            assert_eq!((a.sealed, b.sealed), (full, full));
            for k in 0..full {
                assert!(Arc::ptr_eq(&a.chunks[k], &b.chunks[k]), "chunk {k} shared");
            }
        }
        assert!(
            !Arc::ptr_eq(&a.chunks[3], &b.chunks[3]),
            "the one being filled is its own"
        );
        let (a, b) = (interner.intern(a), interner.intern(b));
        assert!(Arc::ptr_eq(&a, &b));
        let names: Vec<String> = a.iter().map(|r| r.name.into_owned()).collect();
        let pushed: Vec<String> = (0..CHUNK * 3 + 5).map(|i| resource(i).name).collect();
        assert_eq!(names, pushed);
        assert_eq!(a.get(CHUNK + 7).unwrap().name, resource(CHUNK + 7).name);
    }
}
