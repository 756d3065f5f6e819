//! A streaming protobuf scanner for the four xDS messages. Bytes are fed in the slices they
//! arrive in; only the fields we need are kept (strings capped), every resource is reduced to
//! its name and a digest of its bytes as they stream past. Memory does not grow with message
//! size: a 100 MiB push costs its resource names, not 100 MiB. No I/O, no allocation per byte.
//!
//! Field numbers (envoy data-plane-api, `envoy/service/discovery/v3/discovery.proto`):
//! DiscoveryRequest 1 version_info, 2 node, 3 resource_names, 4 type_url, 5 response_nonce,
//! 6 error_detail; DiscoveryResponse 1 version_info, 2 resources, 4 type_url, 5 nonce,
//! 6 control_plane; DeltaDiscoveryRequest 1 node, 2 type_url, 3 subscribe, 4 unsubscribe,
//! 5 initial_resource_versions, 6 response_nonce, 7 error_detail; DeltaDiscoveryResponse
//! 1 system_version_info, 2 resources, 4 type_url, 5 nonce, 6 removed_resources,
//! 7 control_plane, 8 removed_resource_names, 9 resource_errors (SotW: 7); ResourceError
//! 1 resource_name (ResourceName 1 name), 2 error_detail; Resource 1 version, 2 resource, 3 name;
//! Node 1 id, 2 cluster, 6 user_agent_name, 7 user_agent_version, 8 user_agent_build_version
//! (BuildVersion 1 version: SemanticVersion 1 major, 2 minor, 3 patch); Status 1 code, 2 message.
//! In a Cluster (`envoy/config/cluster/v3/cluster.proto`): 2 type (EDS = 3),
//! 3 eds_cluster_config (EdsClusterConfig 2 service_name): which clusters wait for EDS.

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use std::sync::Arc;

use super::origin::{self, PartKind};
use super::{Api, ErrorDetail, Interner, Message, Needs, Node, Request, ResourceRef, Response};

/// The `type_url` of the `Resource` wrapper, which SotW responses may carry too.
pub const RESOURCE_WRAPPER: &str = "type.googleapis.com/envoy.service.discovery.v3.Resource";

/// `Cluster.type` for a cluster that takes its endpoints from EDS.
const DISCOVERY_TYPE_EDS: u64 = 3;

const MAX_STRING: usize = 4096;
const MAX_ERROR_MESSAGE: usize = 64 * 1024;
/// Nesting descended at most: a route's metadata, a list item's struct within it, inside a
/// wrapped resource, is 17 deep.
const MAX_DEPTH: usize = 24;
/// What one listener needs (RDS and SDS names), kept at most.
const MAX_NEEDS: usize = 64;
/// `resource_errors` kept per response at most.
const MAX_RESOURCE_ERRORS: usize = 1024;

/// A whole varint at the start of `data`: its value and length; `None` when `data` holds only
/// part of it (or it is malformed: the scanner then reads it byte by byte and says so).
fn varint(data: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, b) in data.iter().take(10).enumerate() {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Sets `out` to `bytes` as text. Strings are UTF-8 in practice: validated fast, lossy otherwise.
fn text_into(bytes: &[u8], out: &mut String) {
    out.clear();
    match std::str::from_utf8(bytes) {
        Ok(s) => out.push_str(s),
        Err(_) => out.push_str(&String::from_utf8_lossy(bytes)),
    }
}

/// Why a message could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    /// A varint longer than 10 bytes.
    #[error("malformed varint")]
    Varint,
    /// Wire type 3, 4, 6 or 7.
    #[error("unsupported wire type {0}")]
    WireType(u8),
    /// A length-delimited field runs past its enclosing message.
    #[error("field length past the end of its message")]
    Length,
    /// The message ended in the middle of a field.
    #[error("message truncated")]
    Truncated,
    /// Nesting deeper than we ever descend (cannot happen with our schema).
    #[error("nesting too deep")]
    Depth,
}

/// Which message a scanner decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    /// Client to control plane.
    Request(Api),
    /// Control plane to client.
    Response(Api),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Msg {
    Request,
    Response,
    DeltaRequest,
    DeltaResponse,
    Node,
    Status,
    ControlPlane,
    /// `google.protobuf.Any` in a response's `resources`.
    Any,
    /// `Resource` wrapper (Delta resources, or a SotW Any holding one).
    Wrapper,
    /// The `Any` inside a wrapper.
    InnerAny,
    /// The resource itself: only field 1 (its name) is read, and for a Cluster what says it
    /// takes its endpoints from EDS; all bytes are digested.
    Body,
    /// A Cluster's `eds_cluster_config`.
    EdsConfig,
    /// A map entry of `initial_resource_versions`.
    MapEntry,
    /// `ResourceName` of `removed_resource_names`.
    ResourceName,
    /// A response's `ResourceError`: its name, and its `error_detail` as a `Status`.
    ResourceError,
    /// The `ResourceName` of a `ResourceError`.
    ErrorName,
    /// `node.user_agent_build_version` (Envoy sends its version here).
    BuildVersion,
    /// Its `SemanticVersion`: major, minor, patch varints.
    SemVer,
    /// A Listener's filter chain (`filter_chains` 3, `default_filter_chain` 25).
    FilterChain,
    /// A network filter of a chain (3).
    NetFilter,
    /// A network filter's `typed_config` (4).
    FilterAny,
    /// An `HttpConnectionManager` in it.
    Hcm,
    /// Its `rds` (3): `route_config_name` 2.
    Rds,
    /// A chain's `transport_socket` (6).
    TransportSocket,
    /// Its `typed_config` (3).
    TlsAny,
    /// A `DownstreamTlsContext` in it.
    TlsContext,
    /// Its `common_tls_context` (1).
    CommonTls,
    /// `combined_validation_context` (8).
    Combined,
    /// An `SdsSecretConfig`: `name` 1.
    SdsConfig,
    /// A wrapper's `ttl` (`google.protobuf.Duration`: seconds 1, nanos 2).
    Ttl,
    /// A route configuration's virtual host (2): `name` 1, `domains` 2, `routes` 3,
    /// `metadata` 24.
    VirtualHost,
    /// Its route: `route` 2, `metadata` 4, `name` 14.
    Route,
    /// A route's `RouteAction`: `cluster` 1, `weighted_clusters` 3.
    RouteAction,
    /// `WeightedCluster`: `clusters` 1.
    Weighted,
    /// `ClusterWeight`: `name` 1.
    ClusterWeight,
    /// A load assignment's `LocalityLbEndpoints` (2): `metadata` 9.
    Locality,
    /// A `RequestMirrorPolicy` (a route action's 30, a virtual host's 22): `cluster` 1.
    Mirror,
    /// An `envoy.config.core.v3.Metadata`: `filter_metadata` 1, a map of filter name to
    /// `google.protobuf.Struct`. Read as it streams past, only where a form names an object.
    Metadata,
    /// A `filter_metadata` entry: key 1 (the filter), value 2 (its struct).
    MetaFilter,
    /// The filter's `Struct`: `fields` 1, a map.
    MetaTop,
    /// A field of it: key 1, value 2 (`google.protobuf.Value`).
    MetaTopEntry,
    /// Its `Value`: `string_value` 3, `list_value` 6.
    MetaTopValue,
    /// A `ListValue`: `values` 1.
    MetaList,
    /// An item of it (a `Value`): `struct_value` 5.
    MetaItem,
    /// The item's `Struct`: `fields` 1.
    MetaItemStruct,
    /// A field of it: key 1, value 2.
    MetaItemEntry,
    /// Its `Value`: `string_value` 3.
    MetaItemValue,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Version,
    ResourceName,
    TypeUrl,
    Nonce,
    Unsubscribe,
    Removed,
    NodeId,
    NodeCluster,
    UserAgentName,
    UserAgentVersion,
    StatusMessage,
    ControlPlaneId,
    AnyTypeUrl,
    WrapperVersion,
    WrapperName,
    BodyName,
    MapKey,
    MapValue,
    RemovedName,
    EdsService,
    ErrorName,
    /// The type URL of an `Any` inside a listener.
    DepAnyType,
    RdsName,
    SdsName,
    /// A part's name: a virtual host's, a route's, a filter chain's.
    PartName,
    /// What else a part is known by: a route's cluster, a virtual host's domain.
    PartRef,
    /// A `filter_metadata` key: a filter's name.
    MetaFilterKey,
    /// A key of a filter's struct, or of a struct that is an item of a list there.
    MetaKey,
    MetaItemKey,
    /// A string value where a form names an object.
    MetaString,
}

enum Action {
    Capture(Slot),
    Descend(Msg),
    Skip,
}

#[derive(Debug)]
enum State {
    Tag { value: u64, shift: u32 },
    Varint { field: u32, value: u64, shift: u32 },
    Len { field: u32, value: u64, shift: u32 },
    Capture { slot: Slot, left: u64, cap: usize },
    Skip { left: u64 },
}

const FRESH: State = State::Tag { value: 0, shift: 0 };

/// The digest of a resource's bytes: taken in one go when they all arrive in one slice (the
/// usual case: a DATA frame holds many resources), streamed when they span slices.
#[derive(Clone, Copy, Debug)]
enum BodyHash {
    /// Nothing of the body seen yet.
    Off,
    Whole(u64),
    Streaming,
}

struct Frame {
    msg: Msg,
    end: u64,
}

/// Decodes one message, fed in pieces.
pub struct Scanner {
    kind: MessageKind,
    stack: Vec<Frame>,
    state: State,
    pos: u64,
    buf: Vec<u8>,
    error: Option<ScanError>,
    // What we build.
    req: Request,
    resp: Response,
    node: Option<Node>,
    status: Option<ErrorDetail>,
    current: Option<ResourceRef>,
    /// The last resource's name buffer, for the next one.
    spare_name: String,
    any_type: String,
    /// How the current resource's bytes are being digested.
    body: BodyHash,
    /// Kept across resources and reset, not rebuilt: it is 600 bytes to move.
    hasher: Xxh3,
    /// Bytes before this position are digested already.
    hashed_to: u64,
    map_key: String,
    map_value: String,
    semver: [u64; 3],
    /// The current wrapper's TTL: seconds, nanos.
    ttl: [u64; 2],
    /// The current resource is a Cluster; it takes its endpoints from EDS, under this service
    /// name when it gives one.
    cluster: bool,
    cluster_eds: bool,
    eds_service: String,
    /// The current resource is a Listener; what it needs (RDS and SDS names), and the type of
    /// the `Any` being read inside it.
    listener: bool,
    needs: Vec<(Needs, String)>,
    /// The current resource is a RouteConfiguration, a ClusterLoadAssignment.
    routes: bool,
    endpoints: bool,
    /// The objects the current resource's metadata names.
    origins: origin::Reader,
    /// A string of a part or of its metadata, read into this buffer and passed on.
    scratch: String,
    dep_any: String,
    /// The end of the resource body being read, while inside one: its bytes are digested.
    body_end: Option<u64>,
    /// Where full chunks of the resources are swapped for the fleet's shared copy, and where
    /// resources decoded before are found by their bytes.
    interner: Option<Arc<Interner>>,
    /// The resource being decoded was looked for by its bytes and not found: its key, under
    /// which it is remembered once decoded.
    unseen: Option<u128>,
    /// The push decoded before that this message repeats so far.
    run: Option<Run>,
    /// The digests of the resources this message reads, when it records them (none: another
    /// stream does, or one could not be taken whole), to offer them as a run once complete.
    keys: Option<Vec<u128>>,
    /// Held while this message records its push: no other stream does meanwhile.
    claim: Option<Arc<()>>,
    /// Its first resource was seen.
    started: bool,
    /// A resource whose bytes arrive in pieces.
    gathering: Option<Gathering>,
}

/// A push decoded before that a message repeats, resource by resource: followed, its
/// resources cost a digest of their bytes each, and the message takes the push's set whole.
struct Run {
    record: Arc<super::RunRecord>,
    followed: usize,
}

/// A resource's bytes gathered across slices, and how many are still to come (none: its
/// length is not whole yet).
struct Gathering {
    bytes: Vec<u8>,
    left: Option<usize>,
}

/// What a response's next field is, to the scanner that takes resources whole.
enum Ahead {
    /// A resource of this size, tag and length included.
    Resource(usize),
    /// A resource whose length has not all arrived.
    Partial,
}

/// The tag of a response's resources: field 2, length-delimited.
const RESOURCE_TAG: u8 = 2 << 3 | 2;

/// The most of one resource gathered across slices to take it whole; a larger one is read
/// field by field as it streams (and its push is no run).
const MAX_GATHER: usize = 256 << 10;

impl Scanner {
    /// A scanner for one message of `kind`; `len` is its length when known (uncompressed), else
    /// `None` (the message ends when [`finish`](Self::finish) is called).
    pub fn new(kind: MessageKind, len: Option<u64>) -> Self {
        let msg = match kind {
            MessageKind::Request(Api::Sotw) => Msg::Request,
            MessageKind::Request(Api::Delta) => Msg::DeltaRequest,
            MessageKind::Response(Api::Sotw) => Msg::Response,
            MessageKind::Response(Api::Delta) => Msg::DeltaResponse,
        };
        let mut stack = Vec::with_capacity(MAX_DEPTH);
        stack.push(Frame {
            msg,
            end: len.unwrap_or(u64::MAX),
        });
        Scanner {
            kind,
            stack,
            state: FRESH,
            pos: 0,
            buf: Vec::new(),
            error: None,
            req: Request::default(),
            resp: Response::default(),
            node: None,
            status: None,
            current: None,
            spare_name: String::new(),
            any_type: String::new(),
            body: BodyHash::Off,
            hasher: Xxh3::new(),
            hashed_to: 0,
            map_key: String::new(),
            map_value: String::new(),
            semver: [0; 3],
            ttl: [0; 2],
            cluster: false,
            cluster_eds: false,
            eds_service: String::new(),
            listener: false,
            needs: Vec::new(),
            routes: false,
            endpoints: false,
            origins: origin::Reader::default(),
            scratch: String::new(),
            dep_any: String::new(),
            body_end: None,
            interner: None,
            unseen: None,
            run: None,
            keys: None,
            claim: None,
            started: false,
            gathering: None,
        }
    }

    /// Full chunks of the resources decoded go through `interner` as they fill, shared with
    /// every stream decoding the same.
    pub fn set_interner(&mut self, interner: Arc<Interner>) {
        self.interner = Some(interner);
    }

    /// Bytes seen so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Feeds the next piece. After an error the rest is ignored and `finish` reports it.
    pub fn feed(&mut self, data: &[u8]) {
        if self.error.is_some() {
            self.pos += data.len() as u64;
            return;
        }
        if let Err(e) = self.feed_inner(data) {
            self.error = Some(e);
        }
    }

    /// Feeds `data`: a response's resources taken whole where the scanner can ([`Run`]), every
    /// other byte through the field-by-field reader.
    fn feed_inner(&mut self, data: &[u8]) -> Result<(), ScanError> {
        let mut i = 0;
        loop {
            if let Some(g) = self.gathering.as_mut() {
                if g.left.is_none() {
                    // Its length, a byte at a time until whole.
                    if i == data.len() {
                        return Ok(());
                    }
                    g.bytes.push(data[i]);
                    i += 1;
                    self.pos += 1;
                    if let Some((len, l)) = varint(&g.bytes[1..]) {
                        let size = usize::try_from(len).ok().and_then(|n| n.checked_add(1 + l));
                        match size.filter(|s| *s <= MAX_GATHER) {
                            Some(size) => g.left = Some(size - g.bytes.len()),
                            None => {
                                // Too large to gather: the bytes so far go to the reader.
                                let g = self.gathering.take().expect("present above");
                                self.started = true;
                                self.end_run();
                                self.keys = None;
                                self.pos -= g.bytes.len() as u64;
                                self.scan(&g.bytes, false)?;
                            }
                        }
                    } else if g.bytes.len() > 11 {
                        return Err(ScanError::Varint);
                    }
                    continue;
                }
                let left = g.left.unwrap_or(0);
                let take = left.min(data.len() - i);
                g.bytes.extend_from_slice(&data[i..i + take]);
                g.left = Some(left - take);
                i += take;
                self.pos += take as u64;
                if left > take {
                    return Ok(());
                }
                let g = self.gathering.take().expect("present above");
                self.pos -= g.bytes.len() as u64;
                self.entry(&g.bytes)?;
                continue;
            }
            if i == data.len() {
                return Ok(());
            }
            match self.resource_ahead(&data[i..]) {
                Some(Ahead::Resource(size)) if size <= data.len() - i => {
                    self.entry(&data[i..i + size])?;
                    i += size;
                    continue;
                }
                Some(Ahead::Resource(size)) if size > MAX_GATHER => {
                    // Too large to gather: read field by field, and this push is no run.
                    self.started = true;
                    self.end_run();
                    self.keys = None;
                }
                Some(ahead) => {
                    // Its bytes arrive in pieces (a DATA frame ends inside it): gathered, then
                    // taken whole. Counted as read now; taken back when it is complete.
                    let have = data.len() - i;
                    self.pos += have as u64;
                    self.gathering = Some(Gathering {
                        left: match ahead {
                            Ahead::Resource(size) => Some(size - have),
                            Ahead::Partial => None,
                        },
                        bytes: data[i..].to_vec(),
                    });
                    return Ok(());
                }
                None => {}
            }
            i += self.scan(&data[i..], true)?;
        }
    }

    /// The field-by-field reader: reads `data` (all of it, or with `stop_at_top` up to where it
    /// is back between two fields of the message itself) and says how much it read.
    fn scan(&mut self, data: &[u8], stop_at_top: bool) -> Result<usize, ScanError> {
        let mut i = 0;
        while i < data.len() {
            if matches!(self.state, State::Tag { shift: 0, .. }) {
                self.pop_finished();
                if stop_at_top && i > 0 && self.stack.len() == 1 {
                    return Ok(i);
                }
            }
            let top = self.stack.last().ok_or(ScanError::Length)?;
            if top.end == self.pos {
                return Err(ScanError::Length);
            }
            let frame_left = top.end - self.pos;
            // The resource body's end, when inside one (at any depth).
            if let Some(body_end) = self.body_end.filter(|_| self.pos >= self.hashed_to) {
                // Digest all of the body this slice holds now; parsing it goes on below.
                let body_left = body_end - self.pos;
                let n = body_left.min((data.len() - i) as u64) as usize;
                let bytes = &data[i..i + n];
                match self.body {
                    BodyHash::Off if n as u64 == body_left => {
                        self.body = BodyHash::Whole(xxh3_64(bytes))
                    }
                    BodyHash::Off => {
                        self.hasher.reset();
                        self.hasher.update(bytes);
                        self.body = BodyHash::Streaming;
                    }
                    BodyHash::Streaming => self.hasher.update(bytes),
                    BodyHash::Whole(_) => {}
                }
                self.hashed_to = self.pos + n as u64;
            }
            match &mut self.state {
                State::Tag { value, shift }
                | State::Varint { value, shift, .. }
                | State::Len { value, shift, .. } => {
                    let b = data[i];
                    i += 1;
                    self.pos += 1;
                    if *shift >= 64 {
                        return Err(ScanError::Varint);
                    }
                    *value |= ((b & 0x7f) as u64) << *shift;
                    *shift += 7;
                    if b & 0x80 == 0 {
                        let v = *value;
                        self.varint_done(v)?;
                    }
                }
                State::Capture { slot, left, cap } => {
                    let n = (*left).min((data.len() - i) as u64).min(frame_left) as usize;
                    let take = n.min(cap.saturating_sub(self.buf.len()));
                    self.buf.extend_from_slice(&data[i..i + take]);
                    *left -= n as u64;
                    i += n;
                    self.pos += n as u64;
                    if *left == 0 {
                        let slot = *slot;
                        self.state = FRESH;
                        self.capture_done(slot);
                    }
                }
                State::Skip { left } => {
                    let n = (*left).min((data.len() - i) as u64).min(frame_left) as usize;
                    *left -= n as u64;
                    i += n;
                    self.pos += n as u64;
                    if *left == 0 {
                        self.state = FRESH;
                    }
                }
            }
        }
        Ok(i)
    }

    /// When the reader is between two fields of a response, what `data` starts with: one of
    /// its resources (its size, tag and length included), or the start of one whose length
    /// `data` does not hold yet. Only with an interner to share what is taken whole. Any
    /// other next field ends the run of resources the message may have been following.
    fn resource_ahead(&mut self, data: &[u8]) -> Option<Ahead> {
        if !matches!(self.state, State::Tag { shift: 0, .. }) {
            return None;
        }
        self.pop_finished();
        if self.stack.len() != 1 || self.interner.is_none() {
            return None;
        }
        if !matches!(self.top(), Msg::Response | Msg::DeltaResponse) {
            return None;
        }
        if data.first() != Some(&RESOURCE_TAG) {
            self.end_run();
            return None;
        }
        let Some((len, l)) = varint(&data[1..]) else {
            // The length is cut here unless it is malformed, which the reader then says.
            return (data.len() < 11).then_some(Ahead::Partial);
        };
        let size = (1 + l).checked_add(usize::try_from(len).ok()?)?;
        let frame_end = self.stack.last()?.end;
        (self.pos.checked_add(size as u64)? <= frame_end).then_some(Ahead::Resource(size))
    }

    /// One resource of a response, whole (`bytes`: its tag, length and value). Followed in the
    /// run of a push decoded before, it costs a digest of its bytes; found among the resources
    /// decoded before, it is added as then; otherwise it is read field by field, and
    /// remembered.
    fn entry(&mut self, bytes: &[u8]) -> Result<(), ScanError> {
        let t = 1;
        let (_, l) = varint(&bytes[t..]).ok_or(ScanError::Varint)?;
        let seed = match self.top() {
            Msg::DeltaResponse => 2,
            _ => 1,
        };
        let key = xxhash_rust::xxh3::xxh3_128_with_seed(&bytes[t + l..], seed);
        let interner = self.interner.clone().ok_or(ScanError::Length)?;
        if !self.started {
            // The first resource: a push recorded before, or one to record (by one stream at a
            // time: the others read it as it comes, resource by resource).
            self.started = true;
            match interner.run_from(key) {
                Some(record) => {
                    self.run = Some(Run {
                        record,
                        followed: 0,
                    })
                }
                None => self.record_from(key, &[], &interner),
            }
        }
        if self.follows_run(key) {
            self.pos += bytes.len() as u64;
            return Ok(());
        }
        if let Some(keys) = self.keys.as_mut() {
            keys.push(key);
        }
        if let Some(known) = interner.decoded(key) {
            known.add_to(&mut self.resp.resources);
            interner.seal(&mut self.resp.resources);
            self.pos += bytes.len() as u64;
            return Ok(());
        }
        self.unseen = Some(key);
        let read = self.scan(bytes, false)?;
        debug_assert_eq!(read, bytes.len());
        Ok(())
    }

    /// Starts recording this message's resources as a push whose first resource is `first`
    /// and whose resources so far are `so_far`, unless another stream records it now.
    fn record_from(&mut self, first: u128, so_far: &[u128], interner: &Interner) {
        if let Some(claim) = interner.claim(first) {
            self.keys = Some(so_far.to_vec());
            self.claim = Some(claim);
        }
    }

    /// Whether resource `key` is the next of the run this message follows. A resource off the
    /// run ends it: the resources followed so far become the message's own, and the message
    /// is recorded as a push of its own.
    fn follows_run(&mut self, key: u128) -> bool {
        let Some(run) = self.run.as_mut() else {
            return false;
        };
        if run.record.keys.get(run.followed) == Some(&key) {
            run.followed += 1;
            return true;
        }
        let record = run.record.clone();
        let followed = run.followed;
        self.end_run();
        if let (Some(&first), Some(interner)) = (record.keys.first(), self.interner.clone()) {
            self.record_from(first, &record.keys[..followed], &interner);
        }
        false
    }

    /// Ends the run this message followed, if any: what it followed becomes its own.
    fn end_run(&mut self) {
        let Some(run) = self.run.take() else {
            return;
        };
        let record = &run.record;
        self.resp.resources = match run.followed == record.keys.len() {
            true => record.resources.clone(),
            false => record.resources.prefix(run.followed),
        };
    }

    /// The message's resources are all read: when they were read here, not followed, they are
    /// offered as a run for the next stream the same push goes to.
    fn offer_run(&mut self) {
        self.end_run();
        let (Some(keys), Some(interner)) = (self.keys.take(), self.interner.as_ref()) else {
            return;
        };
        if keys.is_empty() || keys.len() != self.resp.resources.len() {
            return;
        }
        interner.offer_run(keys, &mut self.resp.resources);
    }

    /// A varint finished: a tag, a varint field value, or a length.
    fn varint_done(&mut self, v: u64) -> Result<(), ScanError> {
        match std::mem::replace(&mut self.state, FRESH) {
            State::Tag { .. } => {
                let field = (v >> 3) as u32;
                self.state = match (v & 7) as u8 {
                    0 => State::Varint {
                        field,
                        value: 0,
                        shift: 0,
                    },
                    1 => State::Skip { left: 8 },
                    2 => State::Len {
                        field,
                        value: 0,
                        shift: 0,
                    },
                    5 => State::Skip { left: 4 },
                    w => return Err(ScanError::WireType(w)),
                };
            }
            State::Varint { field, .. } => {
                if self.top() == Msg::Status && field == 1 {
                    self.status.get_or_insert_with(Default::default).code = v as i32;
                }
                if self.top() == Msg::SemVer && (1..=3).contains(&field) {
                    self.semver[field as usize - 1] = v;
                }
                if self.top() == Msg::Ttl && (1..=2).contains(&field) {
                    self.ttl[field as usize - 1] = v;
                }
                if self.top() == Msg::Body && self.cluster && field == 2 {
                    self.cluster_eds = v == DISCOVERY_TYPE_EDS;
                }
            }
            State::Len { field, .. } => {
                let end = self.pos.checked_add(v).ok_or(ScanError::Length)?;
                if end > self.stack.last().map_or(0, |f| f.end) {
                    return Err(ScanError::Length);
                }
                match self.action(field) {
                    Action::Descend(msg) => {
                        if self.stack.len() >= MAX_DEPTH {
                            return Err(ScanError::Depth);
                        }
                        self.stack.push(Frame { msg, end });
                        self.begin(msg);
                    }
                    // A name longer than any Kubernetes name, cut, would name another object.
                    Action::Capture(Slot::MetaString) if v > MAX_STRING as u64 => {
                        self.origins.cut();
                        self.state = State::Skip { left: v };
                    }
                    Action::Capture(slot) if v > 0 => {
                        let cap = match slot {
                            Slot::StatusMessage => MAX_ERROR_MESSAGE,
                            _ => MAX_STRING,
                        };
                        self.state = State::Capture { slot, left: v, cap };
                    }
                    Action::Capture(slot) => self.captured(slot, String::new()),
                    Action::Skip if v > 0 => self.state = State::Skip { left: v },
                    Action::Skip => {}
                }
            }
            other => self.state = other,
        }
        Ok(())
    }

    fn top(&self) -> Msg {
        self.stack.last().map_or(Msg::Body, |f| f.msg)
    }

    /// What to do with length-delimited field `field` of the current message.
    fn action(&self, field: u32) -> Action {
        use Action::{Capture as C, Descend as D};
        match (self.top(), field) {
            (Msg::Request, 1) => C(Slot::Version),
            (Msg::Request, 2) | (Msg::DeltaRequest, 1) => D(Msg::Node),
            (Msg::Request, 3) | (Msg::DeltaRequest, 3) => C(Slot::ResourceName),
            (Msg::Request, 4) | (Msg::DeltaRequest, 2) => C(Slot::TypeUrl),
            (Msg::Request, 5) | (Msg::DeltaRequest, 6) => C(Slot::Nonce),
            (Msg::Request, 6) | (Msg::DeltaRequest, 7) => D(Msg::Status),
            (Msg::DeltaRequest, 4) => C(Slot::Unsubscribe),
            (Msg::DeltaRequest, 5) => D(Msg::MapEntry),
            (Msg::Response, 1) | (Msg::DeltaResponse, 1) => C(Slot::Version),
            (Msg::Response, 2) => D(Msg::Any),
            (Msg::DeltaResponse, 2) => D(Msg::Wrapper),
            (Msg::Response, 4) | (Msg::DeltaResponse, 4) => C(Slot::TypeUrl),
            (Msg::Response, 5) | (Msg::DeltaResponse, 5) => C(Slot::Nonce),
            (Msg::Response, 6) | (Msg::DeltaResponse, 7) => D(Msg::ControlPlane),
            (Msg::DeltaResponse, 6) => C(Slot::Removed),
            (Msg::DeltaResponse, 8) => D(Msg::ResourceName),
            (Msg::Response, 7) | (Msg::DeltaResponse, 9) => D(Msg::ResourceError),
            (Msg::ResourceError, 1) => D(Msg::ErrorName),
            (Msg::ResourceError, 2) => D(Msg::Status),
            (Msg::ErrorName, 1) => C(Slot::ErrorName),
            (Msg::Node, 1) => C(Slot::NodeId),
            (Msg::Node, 2) => C(Slot::NodeCluster),
            (Msg::Node, 6) => C(Slot::UserAgentName),
            (Msg::Node, 7) => C(Slot::UserAgentVersion),
            (Msg::Node, 8) => D(Msg::BuildVersion),
            (Msg::BuildVersion, 1) => D(Msg::SemVer),
            (Msg::Status, 2) => C(Slot::StatusMessage),
            (Msg::ControlPlane, 1) => C(Slot::ControlPlaneId),
            (Msg::Any, 1) | (Msg::InnerAny, 1) => C(Slot::AnyTypeUrl),
            (Msg::Any, 2) if self.any_type == RESOURCE_WRAPPER => D(Msg::Wrapper),
            (Msg::Any, 2) | (Msg::InnerAny, 2) => D(Msg::Body),
            (Msg::Wrapper, 1) => C(Slot::WrapperVersion),
            (Msg::Wrapper, 2) => D(Msg::InnerAny),
            (Msg::Wrapper, 3) => C(Slot::WrapperName),
            (Msg::Wrapper, 6) => D(Msg::Ttl),
            (Msg::Body, 1) => C(Slot::BodyName),
            (Msg::Body, 3) if self.cluster => D(Msg::EdsConfig),
            (Msg::Body, 3 | 25) if self.listener => D(Msg::FilterChain),
            (Msg::Body, 25) if self.cluster => D(Msg::Metadata),
            (Msg::Body, 2) if self.routes => D(Msg::VirtualHost),
            (Msg::Body, 2) if self.endpoints => D(Msg::Locality),
            (Msg::FilterChain, 5) => D(Msg::Metadata),
            (Msg::FilterChain, 7) | (Msg::VirtualHost, 1) | (Msg::Route, 14) => C(Slot::PartName),
            (Msg::VirtualHost, 2) | (Msg::RouteAction | Msg::ClusterWeight, 1) => C(Slot::PartRef),
            (Msg::VirtualHost, 3) => D(Msg::Route),
            (Msg::VirtualHost, 24) | (Msg::Route, 4) | (Msg::Locality, 9) => D(Msg::Metadata),
            // Every cluster a route can send to names it: mirrors too (a route's, or its
            // virtual host's for all its routes).
            (Msg::RouteAction, 30) | (Msg::VirtualHost, 22) => D(Msg::Mirror),
            (Msg::Mirror, 1) => C(Slot::PartRef),
            (Msg::Metadata, 1) => D(Msg::MetaFilter),
            (Msg::MetaFilter, 1) => C(Slot::MetaFilterKey),
            (Msg::MetaFilter, 2) if self.origins.meta_wants_filter() => D(Msg::MetaTop),
            (Msg::MetaTop, 1) => D(Msg::MetaTopEntry),
            (Msg::MetaTopEntry, 1) => C(Slot::MetaKey),
            (Msg::MetaTopEntry, 2) if self.origins.meta_wants_value() => D(Msg::MetaTopValue),
            (Msg::MetaTopValue, 3) if self.origins.meta_wants_string() => C(Slot::MetaString),
            (Msg::MetaTopValue, 6) if self.origins.meta_wants_list() => D(Msg::MetaList),
            (Msg::MetaList, 1) => D(Msg::MetaItem),
            (Msg::MetaItem, 5) => D(Msg::MetaItemStruct),
            (Msg::MetaItemStruct, 1) => D(Msg::MetaItemEntry),
            (Msg::MetaItemEntry, 1) => C(Slot::MetaItemKey),
            (Msg::MetaItemEntry, 2) if self.origins.meta_wants_item_value() => {
                D(Msg::MetaItemValue)
            }
            (Msg::MetaItemValue, 3) => C(Slot::MetaString),
            (Msg::Route, 2) => D(Msg::RouteAction),
            (Msg::RouteAction, 3) => D(Msg::Weighted),
            (Msg::Weighted, 1) => D(Msg::ClusterWeight),
            (Msg::FilterChain, 3) => D(Msg::NetFilter),
            (Msg::FilterChain, 6) => D(Msg::TransportSocket),
            (Msg::NetFilter, 4) => D(Msg::FilterAny),
            (Msg::FilterAny | Msg::TlsAny, 1) => C(Slot::DepAnyType),
            (Msg::FilterAny, 2) if self.dep_any == super::HCM => D(Msg::Hcm),
            (Msg::Hcm, 3) => D(Msg::Rds),
            (Msg::Rds, 2) => C(Slot::RdsName),
            (Msg::TransportSocket, 3) => D(Msg::TlsAny),
            (Msg::TlsAny, 2) if self.dep_any == super::DOWNSTREAM_TLS => D(Msg::TlsContext),
            (Msg::TlsContext, 1) => D(Msg::CommonTls),
            (Msg::CommonTls, 6 | 7) | (Msg::Combined, 2) => D(Msg::SdsConfig),
            (Msg::CommonTls, 8) => D(Msg::Combined),
            (Msg::SdsConfig, 1) => C(Slot::SdsName),
            (Msg::EdsConfig, 2) => C(Slot::EdsService),
            (Msg::MapEntry, 1) => C(Slot::MapKey),
            (Msg::MapEntry, 2) => C(Slot::MapValue),
            (Msg::ResourceName, 1) => C(Slot::RemovedName),
            _ => Action::Skip,
        }
    }

    /// An empty resource whose name reuses the last one's buffer.
    fn fresh_resource(&mut self) -> ResourceRef {
        self.cluster_eds = false;
        self.eds_service.clear();
        self.needs.clear();
        let mut name = std::mem::take(&mut self.spare_name);
        name.clear();
        ResourceRef {
            name,
            ..ResourceRef::default()
        }
    }

    fn begin(&mut self, msg: Msg) {
        match msg {
            Msg::Any => {
                self.any_type.clear();
                self.current = Some(self.fresh_resource());
            }
            Msg::Wrapper => {
                let r = match self.current.take() {
                    Some(r) => r,
                    None => self.fresh_resource(),
                };
                // Bare until its resource (field 2) shows.
                self.current = Some(ResourceRef { bare: true, ..r });
            }
            Msg::InnerAny => {
                self.any_type.clear();
                if let Some(r) = self.current.as_mut() {
                    r.bare = false;
                }
            }
            Msg::Ttl => self.ttl = [0; 2],
            Msg::Body => {
                self.body = BodyHash::Off;
                self.cluster = self.any_type == super::CLUSTER;
                self.listener = self.any_type == super::LISTENER;
                self.routes = self.any_type == super::ROUTES;
                self.endpoints = self.any_type == super::ENDPOINTS;
                self.body_end = self.stack.last().map(|f| f.end);
                self.origins.reset();
            }
            Msg::FilterChain => self.origins.open(PartKind::FilterChain),
            Msg::VirtualHost => self.origins.open(PartKind::VirtualHost),
            Msg::Route => self.origins.open(PartKind::Route),
            Msg::Locality => self.origins.open(PartKind::Locality),
            Msg::Metadata => self.origins.meta_start(),
            Msg::MetaFilter => self.origins.meta_filter_start(),
            Msg::MetaTopEntry => self.origins.meta_key_start(),
            Msg::MetaList => self.origins.meta_list_start(),
            Msg::MetaItem => self.origins.meta_item_start(),
            Msg::MetaItemEntry => self.origins.meta_item_key_start(),
            Msg::FilterAny | Msg::TlsAny => self.dep_any.clear(),
            Msg::Node => self.node = Some(Node::default()),
            Msg::SemVer => self.semver = [0; 3],
            Msg::Status => {
                self.status.get_or_insert_with(Default::default);
            }
            Msg::MapEntry | Msg::ResourceError => {
                self.map_key.clear();
                self.map_value.clear();
                if msg == Msg::ResourceError {
                    self.status = None;
                }
            }
            _ => {}
        }
    }

    fn end(&mut self, msg: Msg) {
        match msg {
            Msg::FilterChain | Msg::VirtualHost | Msg::Route | Msg::Locality => {
                self.origins.close()
            }
            Msg::Metadata => self.origins.meta_end(),
            Msg::Ttl => {
                let [seconds, nanos] = self.ttl;
                let ms = seconds
                    .saturating_mul(1000)
                    .saturating_add(nanos / 1_000_000);
                if let Some(r) = self.current.as_mut() {
                    r.ttl_ms = Some(ms.min(u64::from(u32::MAX)) as u32);
                }
            }
            Msg::SemVer => {
                let [major, minor, patch] = self.semver;
                let node = self.node.get_or_insert_with(Default::default);
                node.user_agent
                    .push_str(&format!(" {major}.{minor}.{patch}"));
            }
            Msg::Body => {
                self.body_end = None;
                let digest = match self.body {
                    BodyHash::Whole(d) => d,
                    BodyHash::Streaming => self.hasher.digest(),
                    BodyHash::Off => xxh3_64(&[]),
                };
                if let Some(r) = self.current.as_mut() {
                    r.digest = digest;
                }
            }
            Msg::Any | Msg::Wrapper => {
                // A wrapper inside an Any ends first; the Any (or a Delta wrapper) completes it.
                let outer = matches!(msg, Msg::Any) || self.top() == Msg::DeltaResponse;
                if outer {
                    if let Some(r) = self.current.take() {
                        let origins = self.origins.finish();
                        let resources = &mut self.resp.resources;
                        resources.push_parts(&r.name, r.version.as_deref(), r.digest);
                        if self.cluster_eds {
                            resources.mark_eds(Some(&self.eds_service));
                        }
                        resources.mark_timed(r.ttl_ms, r.bare);
                        resources.mark_needs(self.needs.iter().map(|(k, n)| (*k, n.as_str())));
                        if let Some(o) = &origins {
                            resources.mark_origins(o.clone());
                        }
                        if let Some(interner) = &self.interner {
                            interner.seal(resources);
                            if let Some(key) = self.unseen.take() {
                                let decoded = super::Decoded {
                                    name: r.name.as_str().into(),
                                    version: r.version.as_deref().map(Into::into),
                                    digest: r.digest,
                                    eds: (self.cluster_eds)
                                        .then(|| self.eds_service.as_str().into()),
                                    ttl_ms: r.ttl_ms,
                                    bare: r.bare,
                                    needs: (self.needs.iter())
                                        .map(|(k, n)| (*k, n.as_str().into()))
                                        .collect(),
                                    origins,
                                };
                                interner.remember(key, decoded);
                            }
                        }
                        self.spare_name = r.name;
                    }
                }
            }
            Msg::MapEntry => self.req.initial_resource_versions.push((
                std::mem::take(&mut self.map_key),
                std::mem::take(&mut self.map_value),
            )),
            Msg::ResourceError => {
                let detail = self.status.take().unwrap_or_default();
                if self.resp.resource_errors.len() < MAX_RESOURCE_ERRORS {
                    let name = std::mem::take(&mut self.map_key);
                    self.resp.resource_errors.push((name, detail));
                }
            }
            _ => {}
        }
    }

    fn pop_finished(&mut self) {
        while self.stack.len() > 1 && self.stack.last().is_some_and(|f| f.end == self.pos) {
            let frame = self.stack.pop().expect("checked non-empty");
            self.end(frame.msg);
        }
    }

    /// A string field is read whole into `buf`. The ones every resource has (its type URL and
    /// name) are copied into strings kept from resource to resource, not allocated each time.
    fn capture_done(&mut self, slot: Slot) {
        match (slot, self.current.as_mut()) {
            (Slot::AnyTypeUrl, _) => text_into(&self.buf, &mut self.any_type),
            (Slot::EdsService, _) => text_into(&self.buf, &mut self.eds_service),
            (Slot::DepAnyType, _) => text_into(&self.buf, &mut self.dep_any),
            (Slot::RdsName | Slot::SdsName, _) if self.needs.len() < MAX_NEEDS => {
                let mut name = String::new();
                text_into(&self.buf, &mut name);
                let kind = match slot {
                    Slot::RdsName => Needs::Routes,
                    _ => Needs::Secret,
                };
                if !self.needs.iter().any(|(k, n)| *k == kind && *n == name) {
                    self.needs.push((kind, name));
                }
            }
            (Slot::RdsName | Slot::SdsName, _) => {}
            (Slot::MetaFilterKey | Slot::MetaKey | Slot::MetaItemKey | Slot::MetaString, _) => {
                let mut text = std::mem::take(&mut self.scratch);
                text_into(&self.buf, &mut text);
                match slot {
                    Slot::MetaFilterKey => self.origins.meta_filter(&text),
                    Slot::MetaKey => self.origins.meta_key(&text),
                    Slot::MetaItemKey => self.origins.meta_item_key(&text),
                    _ => self.origins.meta_string(&text),
                }
                self.scratch = text;
            }
            (Slot::PartName | Slot::PartRef, _) => {
                let mut text = std::mem::take(&mut self.scratch);
                text_into(&self.buf, &mut text);
                self.part_text(slot, &text);
                self.scratch = text;
            }
            (Slot::WrapperName, Some(r)) => text_into(&self.buf, &mut r.name),
            (Slot::BodyName, Some(r)) if r.name.is_empty() => text_into(&self.buf, &mut r.name),
            (Slot::WrapperName | Slot::BodyName, _) => {}
            _ => {
                let mut text = String::new();
                text_into(&self.buf, &mut text);
                self.captured(slot, text);
            }
        }
        self.buf.clear();
    }

    /// A string of a part or of its metadata, to the origins' reader.
    fn part_text(&mut self, slot: Slot, text: &str) {
        match slot {
            Slot::PartName => self.origins.name(text),
            _ => self.origins.reference(text),
        }
    }

    fn captured(&mut self, slot: Slot, text: String) {
        let is_request = matches!(self.kind, MessageKind::Request(_));
        match slot {
            Slot::Version if is_request => self.req.version_info = text,
            Slot::Version => self.resp.version_info = text,
            Slot::TypeUrl if is_request => self.req.type_url = text,
            Slot::TypeUrl => self.resp.type_url = text,
            Slot::Nonce if is_request => self.req.response_nonce = text,
            Slot::Nonce => self.resp.nonce = text,
            Slot::ResourceName => self.req.resource_names.push(text),
            Slot::Unsubscribe => self.req.unsubscribe.push(text),
            Slot::Removed | Slot::RemovedName => self.resp.removed.push(text),
            Slot::NodeId => self.node.get_or_insert_with(Default::default).id = text,
            Slot::NodeCluster => self.node.get_or_insert_with(Default::default).cluster = text,
            Slot::UserAgentName | Slot::UserAgentVersion => {
                let node = self.node.get_or_insert_with(Default::default);
                if !node.user_agent.is_empty() {
                    node.user_agent.push(' ');
                }
                node.user_agent.push_str(&text);
            }
            Slot::StatusMessage => {
                self.status.get_or_insert_with(Default::default).message =
                    super::redact_private_keys(super::without_response_dump(&text)).into_owned()
            }
            Slot::ControlPlaneId => self.resp.control_plane = Some(text),
            Slot::WrapperVersion => {
                if let Some(r) = self.current.as_mut() {
                    r.version = Some(text);
                }
            }
            Slot::AnyTypeUrl
            | Slot::WrapperName
            | Slot::BodyName
            | Slot::EdsService
            | Slot::DepAnyType
            | Slot::RdsName
            | Slot::SdsName => {}
            Slot::PartName | Slot::PartRef => self.part_text(slot, &text),
            Slot::MetaFilterKey | Slot::MetaKey | Slot::MetaItemKey => {}
            Slot::MetaString => self.origins.meta_string(&text),
            Slot::MapKey | Slot::ErrorName => self.map_key = text,
            Slot::MapValue => self.map_value = text,
        }
    }

    /// The message is complete: returns what was decoded.
    pub fn finish(mut self) -> Result<Message, ScanError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if !matches!(self.state, State::Tag { shift: 0, .. }) || self.gathering.is_some() {
            return Err(ScanError::Truncated);
        }
        let end = self.stack[0].end;
        if end != u64::MAX && end != self.pos {
            return Err(ScanError::Truncated);
        }
        self.stack[0].end = self.pos;
        self.pop_finished();
        if self.stack.len() > 1 {
            return Err(ScanError::Truncated);
        }
        self.offer_run();
        Ok(match self.kind {
            MessageKind::Request(_) => {
                let mut req = self.req;
                req.node = self.node;
                req.error_detail = self.status;
                Message::Request(req)
            }
            MessageKind::Response(_) => {
                let mut resp = self.resp;
                resp.bytes = self.pos;
                resp.origins_cut = self.origins.take_cut();
                Message::Response(resp)
            }
        })
    }
}
