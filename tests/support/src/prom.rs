//! A strict parser of the Prometheus / OpenMetrics text format, enough to prove `/metrics`
//! parses and to read sample values: every sample belongs to a declared family, label sets are
//! well formed, values are numbers, and the exposition ends with `# EOF`.

use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Default)]
pub struct Metrics {
    /// family name -> type
    pub types: HashMap<String, String>,
    /// (sample name, labels) -> value
    pub samples: HashMap<(String, BTreeMap<String, String>), f64>,
}

impl Metrics {
    /// The value of `name` with exactly these labels (0 when absent).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let l: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .get(&(name.to_string(), l))
            .copied()
            .unwrap_or(0.0)
    }
}

fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while !rest.is_empty() {
        let eq = rest.find('=').ok_or(format!("label without '=': {s}"))?;
        let key = rest[..eq].trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad label name {key:?}"));
        }
        let after = &rest[eq + 1..];
        if !after.starts_with('"') {
            return Err(format!("unquoted label value in {s}"));
        }
        let mut value = String::new();
        let mut chars = after[1..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("dangling escape".into()),
                },
                '"' => {
                    end = Some(i + 2);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end.ok_or(format!("unterminated label value in {s}"))?;
        out.insert(key.to_string(), value);
        rest = after[end..].trim_start_matches(',').trim_start();
    }
    Ok(out)
}

pub fn parse(text: &str) -> Result<Metrics, String> {
    let mut m = Metrics::default();
    let mut saw_eof = false;
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if saw_eof {
            return Err(at("content after # EOF".into()));
        }
        if line == "# EOF" {
            saw_eof = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').ok_or_else(|| at("bad TYPE".into()))?;
            if ![
                "counter",
                "gauge",
                "histogram",
                "summary",
                "unknown",
                "info",
                "stateset",
            ]
            .contains(&ty)
            {
                return Err(at(format!("unknown type {ty}")));
            }
            m.types.insert(name.to_string(), ty.to_string());
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            return Err(at("unexpected line".into()));
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let close = line.rfind('}').ok_or_else(|| at("unclosed {".into()))?;
                (
                    &line[..open],
                    parse_labels(&line[open + 1..close]).map_err(at)?,
                    line[close + 1..].trim(),
                )
            }
            None => {
                let (name, rest) = line.split_once(' ').ok_or_else(|| at("no value".into()))?;
                (name, BTreeMap::new(), rest.trim())
            }
        };
        let value: f64 = match rest.split_whitespace().next() {
            Some("+Inf") => f64::INFINITY,
            Some("-Inf") => f64::NEG_INFINITY,
            Some(v) => v.parse().map_err(|_| at(format!("bad value {v}")))?,
            None => return Err(at("no value".into())),
        };
        let family = ["_total", "_bucket", "_sum", "_count", "_created", ""]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|f| m.types.contains_key(*f))
            })
            .ok_or_else(|| at(format!("sample {name} of no declared family")))?;
        let _ = family;
        m.samples.insert((name.to_string(), labels), value);
    }
    if !saw_eof {
        return Err("no # EOF".into());
    }
    Ok(m)
}
