//! A real headless Chromium (Debian's `chromium`, which `scripts/test` installs when missing),
//! driven over its DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages ended
//! by NUL on fds 3 and 4, given here as the child's stdin and stdout by its shell). It keeps
//! every event it reports, so a test can read which requests a page made.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub struct Browser {
    _child: super::Child,
    to: ChildStdin,
    from: mpsc::Receiver<Value>,
    next: u64,
    /// Every event so far, oldest first.
    pub events: VecDeque<Value>,
    _profile: super::TempDir,
}

/// Where Chromium is: `CHROMIUM`, else Debian's.
fn binary() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

impl Browser {
    /// A headless Chromium with an empty profile that reaches for nothing on its own.
    pub fn start(width: u32, height: u32) -> Browser {
        let profile = super::TempDir::new("chromium");
        let bin = binary();
        assert!(
            std::path::Path::new(&bin).exists(),
            "no Chromium at {bin}: scripts/test installs Debian's chromium"
        );
        let flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-default-apps",
            "--remote-debugging-pipe",
        ];
        let script = format!(
            "exec '{bin}' {} --window-size={width},{height} --user-data-dir='{}' about:blank \
             3<&0 4>&1 0</dev/null 1>&2",
            flags.join(" "),
            profile.path().display()
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let to = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (tx, from) = mpsc::channel();
        std::thread::spawn(move || loop {
            let mut message = Vec::new();
            match out.read_until(0, &mut message) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    message.pop();
                    if let Ok(v) = serde_json::from_slice::<Value>(&message) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Browser {
            _child: super::Child(child),
            to,
            from,
            next: 0,
            events: VecDeque::new(),
            _profile: profile,
        }
    }

    /// Calls `method` (on the page of `session`, or the browser) and returns its result.
    pub fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            message["sessionId"] = s.into();
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        self.to.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = (self.from.recv_timeout(left))
                .unwrap_or_else(|e| panic!("Chromium did not answer {method}: {e}"));
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
            self.events.push_back(v);
        }
    }

    /// Takes in what Chromium reported since the last call.
    pub fn drain(&mut self) {
        while let Ok(v) = self.from.try_recv() {
            self.events.push_back(v);
        }
    }

    /// A new page at `url`, with its requests recorded: its session.
    pub fn open(&mut self, url: &str) -> String {
        let target = self.call(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
        );
        let session = attached["sessionId"].as_str().unwrap().to_string();
        for domain in ["Network.enable", "Page.enable", "Runtime.enable"] {
            self.call(Some(&session), domain, json!({}));
        }
        self.call(Some(&session), "Page.navigate", json!({ "url": url }));
        session
    }

    /// The value of `expression` in the page (promises awaited).
    pub fn eval(&mut self, session: &str, expression: &str) -> Value {
        let r = self.call(
            Some(session),
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expression}: {r}");
        r["result"]["value"].clone()
    }

    /// Polls `expression` until it is true, for at most `secs`; how long it took.
    pub fn until(&mut self, session: &str, secs: u64, expression: &str) -> Duration {
        let start = Instant::now();
        loop {
            if self.eval(session, expression) == Value::Bool(true) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "not within {secs}s: {expression}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Every URL the pages requested so far.
    pub fn requests(&mut self) -> Vec<String> {
        self.drain();
        (self.events.iter())
            .filter(|e| e["method"] == "Network.requestWillBeSent")
            .filter_map(|e| e["params"]["request"]["url"].as_str().map(String::from))
            .collect()
    }

    /// What the window shows of the page, as a PNG.
    pub fn screenshot(&mut self, session: &str) -> Vec<u8> {
        let shot = self.call(
            Some(session),
            "Page.captureScreenshot",
            json!({ "format": "png" }),
        );
        base64(shot["data"].as_str().unwrap())
    }
}

/// Standard base64, as DevTools sends screenshots.
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = text.bytes().filter(|c| *c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().fold(0u32, |n, d| n << 6 | u32::from(*d)) << (6 * (4 - chunk.len()));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

#[test]
fn base64_decodes() {
    assert_eq!(base64("aGVsbG8="), b"hello");
    assert_eq!(base64("aGk="), b"hi");
    assert_eq!(base64("YWJj"), b"abc");
}
