//! The shape of the code, checked where Cargo cannot: the one-way rules between the tap's
//! modules that `crates/tap/src/lib.rs` states (which module may use which; between crates
//! Cargo holds them: the core depends on no runtime and cannot reach the tap, and the command
//! line sees only the tap's public API), that the core
//! reads no clock and its correlator imports only from its decoder, no function longer than
//! about a hundred lines, and the house rules (every file says what it is in a `//!`, the
//! public modules are the public API's and no others, parse errors are types rather than
//! strings, the integration tests are one binary, the reports are the proto's messages and no
//! copy of them). Reads every crate's sources as text, with comments and string literals
//! blanked out first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Functions allowed past [`LONGEST`] lines, each with its reason.
const LONG_FUNCTIONS: &[(&str, &str)] = &[];

/// The modules the tap's `lib.rs` may make public; every other is internal (public only with the
/// `internals` feature).
const PUBLIC: &[&str] = &["api", "config", "fanin", "proxy", "server"];

/// The test targets under `tests/`: one binary of modules, and the allocator's own.
const TEST_TARGETS: &[&str] = &["it", "rollout_memory.rs"];

/// The most lines a function may span, signature to closing brace.
const LONGEST: usize = 100;

/// A source file: the source root it is under, its path there, and its text with comments and
/// literals blanked.
struct Source {
    root: &'static str,
    path: String,
    code: String,
}

/// The tap's sources, where the rooms' rules apply.
const TAP: &str = "crates/tap/src";

/// The source roots: the tap's, the core's and the command line's.
const ROOTS: &[&str] = &[TAP, "crates/core/src", "src"];

/// The files of every source root.
fn sources() -> Vec<Source> {
    ROOTS.iter().flat_map(|r| sources_in(r)).collect()
}

/// The files under the source root `dir`.
fn sources_in(dir: &'static str) -> Vec<Source> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| Source {
            root: dir,
            path: p.strip_prefix(&root).unwrap().display().to_string(),
            code: blank(&std::fs::read_to_string(&p).unwrap()),
        })
        .collect()
}

/// `text` with comments, string literals and char literals replaced by spaces (newlines kept,
/// so line numbers hold).
fn blank(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let keep = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        let rest = |k: usize| at(i + k);
        // Line and block comments.
        if c[i] == '/' && rest(1) == '/' {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
            continue;
        }
        if c[i] == '/' && rest(1) == '*' {
            while i < c.len() && !(c[i] == '*' && at(i + 1) == '/') {
                out.push(keep(c[i]));
                i += 1;
            }
            out.push_str("  ");
            i += 2;
            continue;
        }
        // Raw strings r"..." and r#"..."#.
        if c[i] == 'r' && (rest(1) == '"' || (rest(1) == '#' && (rest(2) == '"' || rest(2) == '#')))
        {
            let mut hashes = 0;
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.extend(c[i..j.min(c.len())].iter().map(|&ch| keep(ch)));
            i = j;
            continue;
        }
        // Strings, with escapes.
        if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            out.extend(c[i..(j + 1).min(c.len())].iter().map(|&ch| keep(ch)));
            i = j + 1;
            continue;
        }
        // Char literals ('x', '\n', '\''), not lifetimes ('a).
        if c[i] == '\'' && (rest(2) == '\'' || rest(1) == '\\') {
            let mut j = i + 1;
            if c[j] == '\\' {
                j += 1;
            }
            j += 1;
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            out.extend(c[i..(j + 1).min(c.len())].iter().map(|&ch| keep(ch)));
            i = j + 1;
            continue;
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

/// The top-level module a file belongs to: `proxy` for `proxy.rs` and `proxy/stream.rs`.
fn module(path: &str) -> String {
    let first = path.split('/').next().unwrap();
    first.trim_end_matches(".rs").to_string()
}

/// The crate modules a file names (`crate::x`, or `xdstap::x` in the binary).
fn uses(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for prefix in ["crate::", "xdstap::"] {
        for (i, _) in code.match_indices(prefix) {
            if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = code[i + prefix.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name.chars().next().is_some_and(|c| c.is_lowercase()) {
                found.insert(name);
            }
        }
    }
    found
}

/// Whether `code` uses tokio or reads a clock.
fn async_or_clock(code: &str) -> Vec<&'static str> {
    ["tokio::", "use tokio", "SystemTime", "Instant"]
        .into_iter()
        .filter(|w| code.contains(w))
        .collect()
}

/// Every breach of the one-way rules in `files`.
fn breaches(files: &[Source]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        let m = module(&f.path);
        let used = uses(&f.code);
        let mut no =
            |what: &str, why: &str| out.push(format!("{}/{}: {what}: {why}", f.root, f.path));
        match m.as_str() {
            "proxy" if f.root == TAP => {
                for dep in [
                    "grpc",
                    "xds",
                    "correlate",
                    "observer",
                    "queue",
                    "outputs",
                    "views",
                ] {
                    if used.contains(dep) {
                        no(
                            &format!("uses {dep}"),
                            "proxy knows HTTP/2 and nothing of gRPC or xDS",
                        );
                    }
                }
            }
            // Downstream of the proxy, each room uses only those before it on the data flow:
            // observer -> queue (with the record it builds) -> views -> outputs (which may read
            // a view, as metrics the board), all served by admin.
            "observer" | "record" | "queue" | "views" | "outputs" if f.root == TAP => {
                let later: &[&str] = match m.as_str() {
                    "observer" => &["record", "queue", "views", "outputs", "admin"],
                    "record" => &["observer", "queue", "views", "outputs", "admin"],
                    "queue" => &["observer", "views", "outputs", "admin"],
                    "views" => &["outputs", "admin"],
                    _ => &["admin"],
                };
                for dep in later.iter().filter(|d| used.contains(**d)) {
                    if !(m == "observer" && *dep == "queue") {
                        no(&format!("uses {dep}"), "rooms use only those before them");
                    }
                }
            }
            "grpc" | "xds" | "correlate" if f.root == "crates/core/src" => {
                for w in async_or_clock(&f.code) {
                    no(
                        &format!("uses {w}"),
                        "the core runs no tasks and reads no clock",
                    );
                }
                if used.contains("sinks") {
                    no("uses sinks", "the core knows nothing of its sinks");
                }
                if m == "correlate" {
                    for dep in used
                        .iter()
                        .filter(|d| !["xds", "correlate"].contains(&d.as_str()))
                    {
                        no(&format!("uses {dep}"), "correlate imports only from xds");
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Every breach of the house rules in `files` (path from the repository root, its text as
/// written).
fn house_breaches(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (path, text) in files {
        if !text.starts_with("//!") {
            out.push(format!("{path}: no //! saying what it is"));
        }
        let code = blank(text);
        if code.contains("type Err = String") {
            out.push(format!("{path}: a FromStr whose error is a String"));
        }
        if path == &format!("{TAP}/lib.rs") {
            let mut internal = false;
            for line in code.lines().map(str::trim) {
                let Some(name) = line.strip_prefix("pub mod ") else {
                    // The crate's one feature (the literal is blanked): `internals`.
                    internal = line.starts_with("#[cfg(feature =");
                    continue;
                };
                let name = name.trim_end_matches(';');
                // An internal module is public under the internals feature only.
                if !PUBLIC.contains(&name) && !internal {
                    out.push(format!("{path}: pub mod {name} is not the public API's"));
                }
                internal = false;
            }
        }
    }
    out
}

/// The messages and enums `proto` declares (nested ones included).
fn proto_types(proto: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in proto.lines().map(str::trim) {
        for kind in ["message ", "enum "] {
            if let Some(rest) = line.strip_prefix(kind) {
                out.insert(rest.trim_end_matches(['{', ' ']).to_string());
            }
        }
    }
    out
}

/// Types in the tap's `files` named as a message or enum of its proto: a hand-kept copy of the
/// schema (the reports are the generated messages, `build.rs` derives their JSON).
fn schema_copies(files: &[Source], proto: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    // The core cannot see the API: its types are what the API reports on, not copies.
    for f in files.iter().filter(|f| f.root != "crates/core/src") {
        for line in f.code.lines().map(str::trim) {
            let line = line.strip_prefix("pub ").unwrap_or(line);
            let line = line.strip_prefix("pub(crate) ").unwrap_or(line);
            let Some(name) = ["struct ", "enum "]
                .iter()
                .find_map(|k| line.strip_prefix(k))
            else {
                continue;
            };
            let name: String = name.chars().take_while(|c| c.is_alphanumeric()).collect();
            if proto.contains(&name) {
                out.push(format!(
                    "{}/{}: {name} copies tap.proto's {name}",
                    f.root, f.path
                ));
            }
        }
    }
    out
}

#[test]
fn the_reports_have_one_schema() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto = std::fs::read_to_string(root.join("proto/xdstap/v1/tap.proto")).unwrap();
    let types = proto_types(&proto);
    assert!(
        types.contains("StatusReport") && types.contains("ClientStatus"),
        "{types:?}"
    );
    let found = schema_copies(&sources(), &types);
    assert!(found.is_empty(), "{}", found.join("\n"));
    let planted = Source {
        root: TAP,
        path: "views/board.rs".into(),
        code: blank("#[derive(Serialize)]\npub struct TypeStatus {\n    state: u8,\n}\n"),
    };
    let found = schema_copies(&[planted], &types);
    assert_eq!(
        found,
        [format!(
            "{TAP}/views/board.rs: TypeStatus copies tap.proto's TypeStatus"
        )]
    );
}

/// Every function in `files` longer than [`LONGEST`] lines: (path:line name, lines).
fn long_functions(files: &[Source]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for f in files {
        let lines: Vec<&str> = f.code.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let Some(after) = [
                "fn ",
                "pub fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
                "async fn ",
                "pub async fn ",
                "pub(crate) async fn ",
                "pub(super) async fn ",
            ]
            .iter()
            .find_map(|p| t.strip_prefix(p)) else {
                continue;
            };
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            // From the signature to the brace that closes the body.
            let (mut depth, mut opened, mut end) = (0i32, false, None);
            'scan: for (k, l) in lines.iter().enumerate().skip(n) {
                for ch in l.chars() {
                    match ch {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        ';' if !opened => break 'scan,
                        _ => {}
                    }
                    if opened && depth == 0 {
                        end = Some(k);
                        break 'scan;
                    }
                }
            }
            if let Some(end) = end {
                let span = end - n + 1;
                if span > LONGEST {
                    out.insert(format!("{}/{}:{} {name}", f.root, f.path, n + 1), span);
                }
            }
        }
    }
    out
}

#[test]
fn the_one_way_rules_hold() {
    let found = breaches(&sources());
    assert!(
        found.is_empty(),
        "one-way rules broken:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_function_is_over_a_hundred_lines() {
    let long = long_functions(&sources());
    let unexplained: Vec<String> = long
        .iter()
        .filter(|(at, _)| {
            !LONG_FUNCTIONS
                .iter()
                .any(|(name, _)| at.ends_with(&format!(" {name}")))
        })
        .map(|(at, n)| format!("{at}: {n} lines"))
        .collect();
    assert!(
        unexplained.is_empty(),
        "functions over {LONGEST} lines:\n{}",
        unexplained.join("\n")
    );
}

/// The checks find what they are for: a planted violation of each rule is reported.
#[test]
fn the_house_rules_hold() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files: Vec<(String, String)> = sources()
        .into_iter()
        .map(|f| {
            let path = format!("{}/{}", f.root, f.path);
            (
                path.clone(),
                std::fs::read_to_string(root.join(path)).unwrap(),
            )
        })
        .collect();
    let found = house_breaches(&files);
    assert!(found.is_empty(), "{}", found.join("\n"));
    let mut targets: Vec<String> = std::fs::read_dir(root.join("tests"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs") || root.join("tests").join(n).join("main.rs").exists())
        .collect();
    targets.sort();
    assert_eq!(
        targets, TEST_TARGETS,
        "tests/ holds one binary of modules, and the allocator's"
    );
    let planted = [
        ("src/a.rs".to_string(), "fn f() {}\n".to_string()),
        (
            "src/b.rs".to_string(),
            "//! B.\nimpl FromStr for X {\n    type Err = String;\n}\n".to_string(),
        ),
        (
            format!("{TAP}/lib.rs"),
            "//! L.\npub mod tap;\npub mod proxy;\n".to_string(),
        ),
    ];
    let found = house_breaches(&planted);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(
        found[0].contains("no //!") && found[1].contains("FromStr") && found[2].contains("tap")
    );
}

#[test]
fn planted_violations_are_found() {
    let file = |path: &str, code: &str| {
        let core = ["xds", "correlate", "grpc"]
            .iter()
            .any(|m| path.starts_with(m));
        Source {
            root: if core { "crates/core/src" } else { TAP },
            path: path.into(),
            code: blank(code),
        }
    };
    let planted = [
        file("proxy/relay.rs", "use crate::xds::Api;\n"),
        file(
            "xds/scan.rs",
            "fn t() { let _ = std::time::Instant::now(); }\n",
        ),
        file("correlate.rs", "use crate::grpc::Deframer;\n"),
        file(
            "grpc.rs",
            "async fn f() { tokio::task::yield_now().await }\n",
        ),
        file(
            "views/board.rs",
            "fn f() { crate::outputs::spans::start(); }\n",
        ),
        file("outputs/metrics.rs", "use crate::admin::Admin;\n"),
        file("observer.rs", "use crate::views::board::StatusBoard;\n"),
    ];
    let found = breaches(&planted);
    for (f, want) in planted.iter().zip([
        "uses xds",
        "uses Instant",
        "uses grpc",
        "uses tokio::",
        "uses outputs",
        "uses admin",
        "uses views",
    ]) {
        assert!(
            found
                .iter()
                .any(|b| b.starts_with(&format!("{}/{}: {want}", f.root, f.path))),
            "{want} in {} not found: {found:?}",
            f.path
        );
    }
    // Comments and strings do not count; the assembly may use anything.
    let fine = [
        file(
            "proxy/listen.rs",
            "// crate::xds is not used here\nlet s = \"crate::tap\";\n",
        ),
        file("server.rs", "use crate::observer::Observer;\n"),
    ];
    assert!(breaches(&fine).is_empty(), "{:?}", breaches(&fine));
    let long = file(
        "x.rs",
        &format!(
            "fn long() {{\n{}}}\nfn short() {{ }}\n",
            "    let _ = 1;\n".repeat(LONGEST)
        ),
    );
    assert_eq!(long_functions(&[long]).len(), 1);
}
