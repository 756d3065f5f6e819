//! What a NACK leaves running, read from the client's own words: the whole push rejected, some
//! resources rejected and the rest applied, or not known. Pure text work on the message and the
//! names of the push; no I/O.
//!
//! The forms (each seen from a real client in `tests/it/partial.rs` or written down in
//! `../shared/DESIGN.md`):
//! - Envoy CDS and LDS add each resource on its own and then NACK with
//!   `Error adding/updating cluster(s) NAME: reason, NAME: reason` (`listener(s)` for LDS): the
//!   named resources are rejected, the rest of the push applied.
//! - gRPC C-core (grpcio): `xDS response validation errors: [resource index N: NAME: reason;
//!   ...]`; grpc-go: `resource "NAME": reason`. Valid resources are used (gRFC A46).
//! - Envoy rejects the whole push before adding anything on a proto validation failure
//!   (`Proto constraint validation failed`), an `Any` it cannot unpack, or a resource of another
//!   type (`T does not match the message-wide type URL U`).
//! - A name twice in one CDS push: Envoy adds the first and rejects the copy
//!   (`Error adding/updating cluster(s) c: duplicate cluster c found`).
//! - Anything else: the scope is unknown, never "nothing landed".

use crate::xds::Resources;

/// How much of a NACKed push the client rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The whole push: nothing of it runs.
    Whole,
    /// The resources it names; the rest of the push runs.
    Partial,
    /// The message does not say what of the push runs.
    Unknown,
}

impl Scope {
    /// `whole`, `partial`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Whole => "whole",
            Scope::Partial => "partial",
            Scope::Unknown => "unknown",
        }
    }
}

/// One resource a client rejected, with its own part of the message.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Rejected {
    /// The resource name.
    pub name: String,
    /// What the client said of it.
    pub reason: String,
}

impl Rejected {
    /// A second copy of a name in the push, rejected while the first runs (Envoy's
    /// `duplicate cluster c found`).
    pub fn duplicate(&self) -> bool {
        self.reason.starts_with("duplicate ")
    }
}

/// Resources listed as rejected at most; a push larger than that still reads, the list is cut.
const MAX_REJECTED: usize = 1024;

/// Envoy's per-resource forms, each followed by `NAME: reason` items joined with `, `.
const ENVOY_EACH: [&str; 2] = [
    "Error adding/updating cluster(s) ",
    "Error adding/updating listener(s) ",
];

/// Envoy's whole-push forms.
const ENVOY_WHOLE: [&str; 3] = [
    "Proto constraint validation failed",
    "Unable to unpack as ",
    " does not match the message-wide type URL ",
];

/// C-core's per-resource item: `resource index N: `.
const CCORE_ITEM: &str = "resource index ";

/// grpc-go's per-resource item: `resource "NAME": `.
const GO_ITEM: &str = "resource \"";

/// The names of `rejected`, to look up in.
pub fn names(rejected: &[Rejected]) -> std::collections::HashSet<&str> {
    rejected.iter().map(|r| r.name.as_str()).collect()
}

/// The scope of a NACK of `push`'s resources with `message`, and what it rejected. Its work is
/// linear in the message and the push: a name is looked up, never searched for.
pub fn read(message: &str, resources: &Resources) -> (Scope, Vec<Rejected>) {
    if let Some(rest) = ENVOY_EACH.iter().find_map(|p| after(message, p)) {
        let rejected = envoy_items(rest, resources);
        if !rejected.is_empty() {
            return (Scope::Partial, rejected);
        }
    }
    if message.contains(CCORE_ITEM) {
        let rejected = ccore_items(message, resources);
        if !rejected.is_empty() {
            return (Scope::Partial, rejected);
        }
    }
    if message.contains(GO_ITEM) {
        let rejected = go_items(message);
        if !rejected.is_empty() {
            return (Scope::Partial, rejected);
        }
    }
    if ENVOY_WHOLE.iter().any(|w| message.contains(w)) {
        return (Scope::Whole, vec![]);
    }
    (Scope::Unknown, vec![])
}

fn after<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    message.find(prefix).map(|i| &message[i + prefix.len()..])
}

/// `NAME: reason, NAME: reason`: a reason may hold `, ` itself, so an item starts only where a
/// name of the push stands (at the start, or after `, `) followed by `: `; where several could,
/// the longest wins. Each candidate (the text up to a `: `, within the item) is looked up.
fn envoy_items(rest: &str, resources: &Resources) -> Vec<Rejected> {
    let names: std::collections::HashSet<String> =
        resources.iter().map(|r| r.name.into_owned()).collect();
    let item_at = |pos: usize| -> Option<&str> {
        let tail = &rest[pos..];
        let end = tail.find(", ").unwrap_or(tail.len());
        let mut found = None;
        let mut from = 0;
        while let Some(i) = tail[from..end].find(": ") {
            let candidate = &tail[..from + i];
            if !candidate.is_empty() && names.contains(candidate) {
                found = Some(candidate);
            }
            from += i + 2;
        }
        found
    };
    let mut starts: Vec<(usize, &str)> = Vec::new();
    if let Some(n) = item_at(0) {
        starts.push((0, n));
    }
    let mut from = 0;
    while let Some(i) = rest[from..].find(", ") {
        let pos = from + i + 2;
        if let Some(n) = item_at(pos) {
            starts.push((pos, n));
            if starts.len() == MAX_REJECTED {
                break;
            }
        }
        from = pos;
    }
    let mut out: Vec<Rejected> = Vec::with_capacity(starts.len());
    for (k, &(pos, name)) in starts.iter().enumerate() {
        let end = starts.get(k + 1).map_or(rest.len(), |(next, _)| next - 2);
        let reason = rest[pos + name.len() + 2..end].trim_end();
        if !out.iter().any(|r| r.name == name) {
            out.push(Rejected {
                name: name.to_string(),
                reason: reason.to_string(),
            });
        }
    }
    out
}

/// `resource index N: NAME: reason; resource index M: ...]`: N is the place in the push.
fn ccore_items(message: &str, resources: &Resources) -> Vec<Rejected> {
    let mut out = Vec::new();
    let mut pieces = message.split(CCORE_ITEM).skip(1).peekable();
    while let Some(piece) = pieces.next() {
        let digits = piece.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(index) = piece[..digits].parse::<usize>() else {
            continue;
        };
        let Some(r) = resources.get(index) else {
            continue;
        };
        let text = piece[digits..]
            .strip_prefix(": ")
            .unwrap_or(&piece[digits..]);
        let text = text.strip_prefix(&*r.name).unwrap_or(text);
        let text = text.strip_prefix(": ").unwrap_or(text);
        // The item ends where the next begins (`; `), or with the list (`]`).
        let text = match pieces.peek() {
            Some(_) => text.trim_end().trim_end_matches(';'),
            None => text.strip_suffix(']').unwrap_or(text),
        };
        if out.iter().any(|o: &Rejected| o.name == r.name) || out.len() == MAX_REJECTED {
            continue;
        }
        out.push(Rejected {
            name: r.name.into_owned(),
            reason: text.trim().to_string(),
        });
    }
    out
}

/// `resource "NAME": reason; resource "NAME": reason`.
fn go_items(message: &str) -> Vec<Rejected> {
    let mut out = Vec::new();
    for piece in message.split(GO_ITEM).skip(1) {
        let Some((name, reason)) = piece.split_once("\": ") else {
            continue;
        };
        if out.iter().any(|o: &Rejected| o.name == name) || out.len() == MAX_REJECTED {
            continue;
        }
        let reason = reason.trim_end().trim_end_matches(';').trim_end();
        out.push(Rejected {
            name: name.to_string(),
            reason: reason.to_string(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(names: &[&str]) -> Resources {
        let mut r = Resources::default();
        for (i, n) in names.iter().enumerate() {
            r.push_parts(n, None, i as u64);
        }
        r
    }

    fn names(r: &[Rejected]) -> Vec<(&str, &str)> {
        r.iter()
            .map(|r| (r.name.as_str(), r.reason.as_str()))
            .collect()
    }

    #[test]
    fn envoy_names_each_rejected_cluster_and_listener() {
        let m = "Error adding/updating cluster(s) b: malformed IP address: not-an-ip. Consult the \
                 documentation, a, b: c: d";
        let (scope, r) = read(m, &push(&["a", "b", "c"]));
        assert_eq!(scope, Scope::Partial);
        // `a` is not followed by `: `, so `, a` is part of b's reason; b named twice is one.
        assert_eq!(
            names(&r),
            [(
                "b",
                "malformed IP address: not-an-ip. Consult the documentation, a"
            )]
        );
        let m = "Error adding/updating listener(s) l2: error adding listener '127.0.0.1:0': \
                 multiple filter chains with the same matching rules are defined, l3: bad";
        let (scope, r) = read(m, &push(&["l1", "l2", "l3"]));
        assert_eq!(scope, Scope::Partial);
        assert_eq!(
            names(&r),
            [
                (
                    "l2",
                    "error adding listener '127.0.0.1:0': multiple filter chains with the same \
                     matching rules are defined"
                ),
                ("l3", "bad")
            ]
        );
        // The longest name standing there wins.
        let (_, r) = read(
            "Error adding/updating cluster(s) outbound|80||a.b: x",
            &push(&["outbound|80||a", "outbound|80||a.b"]),
        );
        assert_eq!(names(&r), [("outbound|80||a.b", "x")]);
    }

    #[test]
    fn grpc_names_each_rejected_resource() {
        let m = "xDS response validation errors: [resource index 1: c2: INVALID_ARGUMENT: errors \
                 validating Cluster resource: [field:type error:unknown discovery type]]";
        let (scope, r) = read(m, &push(&["c1", "c2"]));
        assert_eq!(scope, Scope::Partial);
        assert_eq!(
            names(&r),
            [(
                "c2",
                "INVALID_ARGUMENT: errors validating Cluster resource: [field:type error:unknown \
                 discovery type]"
            )]
        );
        let m = "xDS response validation errors: [resource index 0: x: bad; resource index 2: \
                 z: worse]";
        let (_, r) = read(m, &push(&["x", "y", "z"]));
        assert_eq!(names(&r), [("x", "bad"), ("z", "worse")]);
        let (scope, r) = read(
            "resource \"l\": no filter chain; resource \"m\": nope",
            &push(&[]),
        );
        assert_eq!(scope, Scope::Partial);
        assert_eq!(names(&r), [("l", "no filter chain"), ("m", "nope")]);
    }

    #[test]
    fn whole_and_unknown() {
        let m = "cluster: name: \"b\" ... Proto constraint validation failed \
                 (ClusterValidationError.ConnectTimeout: value must be greater than 0s)";
        assert_eq!(read(m, &push(&["a", "b"])), (Scope::Whole, vec![]));
        assert_eq!(
            read("something else about b", &push(&["b"])),
            (Scope::Unknown, vec![])
        );
        // The per-resource form naming nothing the push carries says nothing either.
        assert_eq!(
            read("Error adding/updating cluster(s) zz: bad", &push(&["a"])),
            (Scope::Unknown, vec![])
        );
    }
}
