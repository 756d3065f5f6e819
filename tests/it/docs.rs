//! The docs lead somewhere: every relative link in README.md and docs/*.md names a file or
//! directory of the repository, and a `#anchor` a heading of the file it points into (as GitHub
//! makes anchors of headings). Links to the web are not followed (no network in tests).

use std::path::{Path, PathBuf};

/// The links of a Markdown text: each `](target)`, outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans hold text, not links.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            out.push(rest[..end].trim().to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading: lowercase, spaces to `-`, everything but letters, digits,
/// `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// What is wrong with the relative links of `file` (empty: nothing).
fn broken(root: &Path, file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let dir = file.parent().unwrap();
    let mut out = Vec::new();
    for link in links(&text) {
        if link.contains("://") || link.starts_with("mailto:") {
            continue;
        }
        let (path, fragment) = match link.split_once('#') {
            Some((p, f)) => (p, Some(f)),
            None => (link.as_str(), None),
        };
        let target: PathBuf = match path {
            "" => file.to_path_buf(),
            p => dir.join(p),
        };
        let shown = file.strip_prefix(root).unwrap().display();
        if !target.exists() {
            out.push(format!("{shown}: {link} (no such file)"));
            continue;
        }
        if let Some(f) = fragment {
            let heads = std::fs::read_to_string(&target)
                .map(|t| anchors(&t))
                .unwrap_or_default();
            if !heads.iter().any(|h| h == f) {
                out.push(format!("{shown}: {link} (no heading #{f})"));
            }
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut checked = 0;
    let mut wrong = Vec::new();
    for f in &files {
        checked += links(&std::fs::read_to_string(f).unwrap()).len();
        wrong.extend(broken(root, f));
    }
    assert!(
        checked > 20,
        "only {checked} links found: the reader is wrong"
    );
    assert!(wrong.is_empty(), "broken links:\n{}", wrong.join("\n"));
}

/// The checker finds what it is for: a missing file, a missing heading; it passes a link into
/// a heading with code and punctuation in it.
#[test]
fn the_link_checker_tells_broken_from_whole() {
    let dir = crate::support::TempDir::new("links");
    let doc = dir.path().join("a.md");
    std::fs::write(
        &doc,
        "# Who is in sync: `xdstap status`, `/status`\n\
         [ok](#who-is-in-sync-xdstap-status-status) [gone](b.md) [no](#nowhere)\n\
         `[code](c.md)` [web](https://example.com/x)\n\
         ```\n[fenced](d.md)\n```\n",
    )
    .unwrap();
    let wrong = broken(dir.path(), &doc);
    assert_eq!(
        wrong,
        [
            "a.md: b.md (no such file)",
            "a.md: #nowhere (no heading #nowhere)"
        ]
    );
}
