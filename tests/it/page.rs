//! The live page at the admin address, in a real headless Chromium against a tap with real
//! Envoys: the Envoy's row shows; a NACK appears in Envoy's own words within 2 s of Envoy's
//! answer, with no reload; the rollout bar's counts equal `/rollouts`; a version links to its
//! trace, the one the exported spans carry; a node id carrying markup shows as text and makes
//! no element; a node opens to its NACK and its resources; the page asks nothing of any address
//! but the tap's. A NACK of a DestinationRule's cluster names the object in its row, in the
//! verdict feed, in the node's detail (with its `kubectl get`) and in the list of rejected
//! objects, which the object filter narrows to and which empties once the cluster is fixed. A
//! tier's page: tap A with `--admin-peers` naming itself and tap B shows every Envoy behind
//! either once, with its tap, and names B once B stops; a tap without peers says it shows
//! itself only.
//! Then the demo's story with `--admin`, and a screenshot of the page after it
//! (written to `XDSTAP_PAGE_SHOT`, e.g. docs/page.png, when set).

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::browser::Browser;
use support::control_plane::ControlPlane;
use support::envoy::{Envoy, Xds};
use support::otlp::Receiver;
use support::resources::{Snapshot, CDS};
use support::tap::{TapOptions, XdsTap};
use xdstap::api::v1::RolloutReport;

/// A headless Chromium showing `page`: the browser and the page's session.
pub(crate) async fn open(page: String) -> (Browser, String) {
    tokio::task::spawn_blocking(move || {
        let mut b = Browser::start(1400, 1000);
        let s = b.open(&page);
        (b, s)
    })
    .await
    .unwrap()
}

/// The header lines of the answer to `GET path` (the stream of `/events` left once they came).
async fn http_head(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let ask = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(ask.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "{path}: the answer ended before its header");
        raw.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&raw).to_lowercase()
}

/// `s` as a JavaScript string literal.
pub(crate) fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

const TRACES: &str = "http://jaeger.example:16686/trace/{trace_id}";
const MARKUP: &str = "<img src=x onerror=window.__pwned=1>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_fleet_live_and_safely() {
    let (cp, cp_addr, _server) =
        ControlPlane::listening(Snapshot::standard("v1", 1000, 1000, 9)).await;
    let receiver = Receiver::grpc().await;
    let tap = XdsTap::with_flags(&[
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &cp_addr,
        "--admin",
        "127.0.0.1:0",
        "--otlp-endpoint",
        &receiver.endpoint,
        "--otlp-protocol",
        "grpc",
        "--trace-url",
        TRACES,
    ])
    .await;
    let admin = tap.admin.clone();
    let _envoy = Envoy::start("envoy-1", Xds::Tcp(tap.tap.addr.clone()), false).await;

    let page = format!("http://{admin}/");
    let (mut browser, session) = open(page).await;
    let row = |node: &str, ty: &str, state: &str| {
        format!(
            "[...document.querySelectorAll('tr.node')].some(r => r.dataset.node === {} && \
             r.querySelector('td[data-type={ty}]').dataset.state === '{state}')",
            js(node)
        )
    };
    browser.until(&session, 30, &row("envoy-1", "CDS", "SYNCED"));
    browser.eval(&session, "window.__mark = 42; true");

    // v2 holds a cluster Envoy rejects: the NACK, in Envoy's words, without a reload.
    cp.set(Snapshot::standard("v2", 2000, 0, 9));
    let deadline = Instant::now() + Duration::from_secs(30);
    let (message, answered) = loop {
        let nack = (cp.sent().into_iter())
            .filter(|s| s.type_url == CDS && s.version == "v2")
            .find_map(|s| cp.answer_to(&s.nonce).and_then(|a| a.error));
        if let Some((_, message)) = nack {
            break (message, Instant::now());
        }
        assert!(Instant::now() < deadline, "Envoy never answered v2");
        std::thread::sleep(Duration::from_millis(10));
    };
    let shown = format!(
        "[...document.querySelectorAll('#feed li.nack .msg')].some(e => e.textContent === {})",
        js(&message)
    );
    browser.until(&session, 2, &shown);
    let after = answered.elapsed();
    println!("the NACK on the page {after:?} after the control plane had Envoy's answer");
    assert!(after < Duration::from_secs(2), "{after:?}");
    assert_eq!(browser.eval(&session, "window.__mark"), 42, "no reload");
    browser.until(&session, 5, &row("envoy-1", "CDS", "NACKED"));

    // The rollout bar counts what /rollouts counts; the version links to its trace.
    let (_, body) = support::http_get(&admin, "/rollouts?version=v2&type=CDS").await;
    let v2 = serde_json::from_str::<RolloutReport>(&body)
        .unwrap()
        .rollouts
        .remove(0);
    assert_eq!((v2.pushed, v2.nacked), (1, 1));
    let bar = "document.querySelector('.rollout[data-type=CDS][data-version=v2] .bar')";
    let counts = format!(
        "(b => b && b.dataset.pushed === '{}' && b.dataset.acked === '{}' && \
         b.dataset.nacked === '{}' && b.dataset.pending === '{}' && \
         b.dataset.superseded === '{}' && b.dataset.unanswered === '{}')({bar})",
        v2.pushed, v2.acked, v2.nacked, v2.pending, v2.superseded, v2.unanswered
    );
    browser.until(&session, 10, &counts);
    assert_eq!(v2.trace_id.len(), 32, "{v2:?}");
    let link = browser.eval(
        &session,
        "document.querySelector('.rollout[data-version=v2] a').href",
    );
    assert_eq!(link, TRACES.replace("{trace_id}", &v2.trace_id));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(receiver.spans().iter()).any(|s| s.trace_id() == v2.trace_id) {
        assert!(
            Instant::now() < deadline,
            "no span in trace {}",
            v2.trace_id
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A node id that is markup is text: no element, no script.
    let _markup = Envoy::start(MARKUP, Xds::Tcp(tap.tap.addr.clone()), false).await;
    let as_text = format!(
        "[...document.querySelectorAll('tr.node')].some(r => r.dataset.node === {0} && \
         r.cells[0].textContent === {0})",
        js(MARKUP)
    );
    browser.until(&session, 30, &as_text);
    assert_eq!(
        browser.eval(&session, "document.querySelectorAll('img').length"),
        0
    );
    assert_eq!(browser.eval(&session, "typeof window.__pwned"), "undefined");

    // A node opens to its NACK and its resources.
    browser.eval(
        &session,
        "[...document.querySelectorAll('tr.node')].find(r => r.dataset.node === 'envoy-1').click(); true",
    );
    let opened = format!(
        "(d => !!d && d.textContent.includes('CDS rejected v2') && \
         [...d.querySelectorAll('.msg')].some(e => e.textContent === {}) && \
         [...d.querySelectorAll('td')].some(t => t.textContent === 'NACKED'))\
         (document.querySelector('td.detail'))",
        js(&message)
    );
    browser.until(&session, 10, &opened);

    // Everything the page asked for, it asked of the tap.
    let requests = browser.requests();
    assert!(
        requests.iter().any(|u| u.ends_with("/events")),
        "{requests:?}"
    );
    let foreign: Vec<&String> = (requests.iter())
        .filter(|u| !u.starts_with(&format!("http://{admin}/")))
        .collect();
    assert!(foreign.is_empty(), "requests elsewhere: {foreign:?}");
    // The policy the page and its script run under allows nothing else either.
    for path in ["/", "/ui/page.js", "/events"] {
        let head = http_head(&admin, path).await;
        let policy = (head.lines())
            .find_map(|l| l.strip_prefix("content-security-policy: "))
            .unwrap_or_else(|| panic!("{path}: no policy in {head}"));
        assert!(
            policy.starts_with("default-src 'none';") && !policy.contains("http"),
            "{path}: {policy}"
        );
    }
    drop(browser);
    tap.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_names_the_object_behind_a_nack() {
    use support::metadata::istio_cluster;
    let dr = ("reviews", "default", "reviews", "v2");
    let name = "outbound|9080|v2|reviews.default.svc.cluster.local";
    let snap = |v: &str, bad: bool| Snapshot::new(v).with(CDS, istio_cluster(name, dr, 9, bad));
    let (cp, cp_addr, _server) = ControlPlane::listening(snap("v1", false)).await;
    let tap = XdsTap::start(TapOptions::new(&cp_addr)).await;
    let _envoy = Envoy::start("envoy-1", Xds::Tcp(tap.tap.addr.clone()), false).await;
    let page = format!("http://{}/", tap.admin);
    let (mut browser, session) = open(page).await;
    let row = "[...document.querySelectorAll('tr.node')].find(r => r.dataset.node === 'envoy-1')";
    browser.until(
        &session,
        30,
        &format!("(r => !!r && r.querySelector('td.objects').textContent === '-')({row})"),
    );

    // A tap without peers says its page shows it only.
    let scope = "document.getElementById('scope').textContent.startsWith('This tap only')";
    browser.until(&session, 5, scope);

    cp.set(snap("v2", true));
    let dr = "DestinationRule default/reviews";
    let in_row = format!(
        "(r => !!r && r.querySelector('td.objects').textContent.includes({}))({row})",
        js(dr)
    );
    browser.until(&session, 10, &in_row);
    let listed = format!(
        "[...document.querySelectorAll('#objects li')].some(l => l.textContent.startsWith({}) && \
         l.textContent.includes('rejected by 1 node since') && \
         l.textContent.includes('kubectl get destinationrule.networking.istio.io reviews -n default -o yaml'))",
        js(dr)
    );
    browser.until(&session, 10, &listed);
    let fed = format!(
        "[...document.querySelectorAll('#feed li.nack .made-from')].some(e => e.textContent.includes({}))",
        js(dr)
    );
    browser.until(&session, 10, &fed);
    // The object filter narrows the fleet to the nodes rejecting it.
    let count = "document.getElementById('fleet-count').textContent";
    let filter = |text: &str| {
        format!(
            "(f => {{ f.value = {}; f.dispatchEvent(new Event('input')); return true; }})(document.getElementById('object-filter'))",
            js(text)
        )
    };
    browser.eval(&session, &filter("reviews"));
    browser.until(&session, 5, &format!("{count}.startsWith('1 of 1 nodes')"));
    browser.eval(&session, &filter("no-such-object"));
    browser.until(&session, 5, &format!("{count}.startsWith('0 of 1 nodes')"));
    browser.eval(&session, &filter(""));
    // The node's detail names it with the command that shows it.
    browser.eval(&session, &format!("{row}.click(); true"));
    let detail = format!(
        "(d => !!d && d.querySelector('.made-from').textContent.includes({}))(document.querySelector('td.detail'))",
        js("made from: DestinationRule default/reviews (kubectl get destinationrule.networking.istio.io reviews -n default -o yaml)")
    );
    browser.until(&session, 10, &detail);

    // Fixed: nothing is rejected any more.
    cp.set(snap("v3", false));
    browser.until(&session, 10, "document.querySelectorAll('#objects li').length === 0 && document.getElementById('objects-count').textContent === 'none now'");
    browser.until(
        &session,
        10,
        &format!("(r => !!r && r.querySelector('td.objects').textContent === '-')({row})"),
    );
    drop(browser);
    tap.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiers_page_shows_every_node_once_with_its_tap() {
    let (cp, cp_addr, _server) =
        ControlPlane::listening(Snapshot::standard("v1", 1000, 1000, 9)).await;
    let (admin_a, admin_b) = (support::free_addr(), support::free_addr());
    // B is listed twice, by two names: it is one tap all the same.
    let b_by_name = admin_b.replace("127.0.0.1", "localhost");
    let peers = format!("{admin_a},{admin_b},{b_by_name}");
    let tap = |admin: String, peers: Option<String>| {
        let cp_addr = cp_addr.clone();
        async move {
            let mut flags = vec![
                "--listen".to_string(),
                "127.0.0.1:0".into(),
                "--upstream".into(),
                cp_addr,
                "--admin".into(),
                admin,
            ];
            if let Some(p) = peers {
                flags.extend(["--admin-peers".into(), p]);
            }
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            XdsTap::with_flags(&flags).await
        }
    };
    let a = tap(admin_a.clone(), Some(peers)).await;
    let b = tap(admin_b.clone(), None).await;
    let mut envoys = Vec::new();
    for (node, via) in [("envoy-a1", &a), ("envoy-a2", &a), ("envoy-b1", &b)] {
        envoys.push(Envoy::start(node, Xds::Tcp(via.tap.addr.clone()), false).await);
    }
    // /status of A: the three nodes, each once, with its tap; A itself is not asked twice.
    let report = support::eventually_async(30, "A's /status over the tier", || async {
        let (_, body) = support::http_get(&admin_a, "/status").await;
        let r: xdstap::api::v1::StatusReport = serde_json::from_str(&body).ok()?;
        (r.nodes.len() == 3).then_some(r)
    })
    .await;
    let taps: Vec<(&str, &str, Vec<String>)> = (report.taps.iter())
        .map(|t| (t.admin.as_str(), t.error.as_str(), t.also.clone()))
        .collect();
    assert_eq!(
        taps,
        [
            (admin_a.as_str(), "", vec![]),
            (admin_b.as_str(), "", vec![b_by_name.clone()])
        ],
        "each tap once, with the other addresses it answered on"
    );
    // The CLI over the same list, A named by two addresses too: each tap once.
    let a_by_name = admin_a.replace("127.0.0.1", "localhost");
    let list = format!("{admin_a},{a_by_name},{admin_b},{b_by_name}");
    let (code, out, err) = support::xdstap(&["status", "--admin", &list, "-o", "json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let cli: xdstap::api::v1::StatusReport = serde_json::from_str(&out).unwrap();
    assert_eq!(cli.taps.len(), 2, "{:?}", cli.taps);
    assert_eq!(cli.nodes.len(), 3);
    assert!(
        cli.nodes.iter().all(|n| n.taps.len() == 1),
        "{:?}",
        cli.nodes
    );
    let list = format!("{admin_b},{b_by_name}");
    let (_, text, _) = support::xdstap(&["status", "--admin", &list]).await;
    let said = format!("tap {admin_b} also answered as {b_by_name} (counted once)");
    assert!(text.contains(&said), "{text}");
    for n in &report.nodes {
        let want = if n.id == "envoy-b1" {
            &admin_b
        } else {
            &admin_a
        };
        assert_eq!(n.taps, std::slice::from_ref(want), "{}", n.id);
    }

    let page = format!("http://{admin_a}/");
    let (mut browser, session) = open(page).await;
    let rows = format!(
        "(rows => rows.length === 3 && \
         rows.filter(r => r.dataset.node === 'envoy-b1' && r.querySelector('td.tap').textContent === {b}).length === 1 && \
         rows.filter(r => r.dataset.node.startsWith('envoy-a') && r.querySelector('td.tap').textContent === {a}).length === 2)\
         ([...document.querySelectorAll('tr.node')])",
        a = js(&admin_a),
        b = js(&admin_b)
    );
    browser.until(&session, 30, &rows);
    let scope = format!(
        "document.getElementById('scope').textContent.startsWith(\
         'The tier: 2 of 2 taps answered ({admin_a}; {admin_b} (also {b_by_name}))')"
    );
    browser.until(&session, 5, &scope);

    // A node on B rejects v2 (a cluster with no timeout): A's page answers for the tier. Its
    // rollout counts the NACK, and the node's opened row has its verdicts from B.
    cp.set_for_node("envoy-b1", Snapshot::standard("v2", 0, 1000, 9));
    let nacked = "(c => !!c && c.querySelector('.bar').dataset.nacked === '1' && \
                  c.querySelector('.bar').dataset.pushed === '1')\
                  (document.querySelector('.rollout[data-type=\"CDS\"][data-version=\"v2\"]'))";
    browser.until(&session, 30, nacked);
    browser.until(
        &session,
        5,
        "document.getElementById('rollouts-heading').textContent === 'Rollouts, the tier\\'s' && \
         document.getElementById('feed-heading').textContent.endsWith('this tap\\'s clients only')",
    );
    browser.eval(
        &session,
        "document.querySelector('tr.node[data-node=\"envoy-b1\"]').click(); true",
    );
    let from_b = format!(
        "(d => !!d && d.querySelector('h3').textContent === 'recent verdicts, from its tap ' + {b} && \
          [...d.querySelectorAll('li')].some(l => l.textContent.includes('NACK  v2')))\
          (document.querySelector('td.detail'))",
        b = js(&admin_b)
    );
    browser.until(&session, 30, &from_b);
    browser.eval(
        &session,
        "document.querySelector('tr.node[data-node=\"envoy-b1\"]').click(); true",
    );

    // B stops: A's page names it as not answering, and keeps A's own nodes.
    drop(envoys.pop());
    b.close().await;
    let named = format!(
        "[...document.querySelectorAll('#missing-taps li.missing')].some(l => l.dataset.tap === {}) && \
         [...document.querySelectorAll('#missing-taps li.missing')].every(l => \
            l.textContent === 'not answering: ' + l.dataset.tap + ': refused (nothing listens there)') && \
         document.getElementById('scope').textContent.startsWith('The tier: 1 of 2 taps answered') && \
         [...document.querySelectorAll('tr.node')].filter(r => r.dataset.node.startsWith('envoy-a')).length === 2",
        js(&admin_b)
    );
    browser.until(&session, 30, &named);
    drop(browser);

    a.close().await;
}

/// The demo's story told with `--admin`, then the page as it shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_after_the_demo() {
    let admin = support::free_addr();
    let mut demo = Command::new(env!("CARGO_BIN_EXE_xdstap"))
        .args([
            "demo", "--client", "envoy", "--color", "never", "--admin", &admin,
        ])
        .arg("--envoy")
        .arg(support::envoy::binary())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = support::Lines::new(demo.stdout.take().unwrap());
    let mut demo = support::Child(demo);
    let mut told = String::new();
    loop {
        let line = out.next(120, "the demo to give its page's address");
        told.push_str(&line);
        if line.starts_with("The page: http://") {
            break;
        }
    }
    let url = format!("http://{admin}/");
    let shot = tokio::task::spawn_blocking(move || {
        let mut b = Browser::start(1280, 1000);
        let s = b.open(&url);
        // The story's rollouts, a NACK among them, and the curve of acceptance.
        b.until(&s, 30, "document.querySelectorAll('.rollout').length >= 5");
        b.until(
            &s,
            10,
            "document.querySelectorAll('#feed li.nack').length > 0",
        );
        b.until(
            &s,
            10,
            "document.querySelectorAll('#curve path').length > 0",
        );
        // Its node opens to its verdicts and resources, and closes again for the picture.
        b.eval(&s, "document.querySelector('tr.node').click(); true");
        b.until(&s, 10, "!!document.querySelector('td.detail h3')");
        b.eval(&s, "document.querySelector('tr.node').click(); true");
        b.until(&s, 10, "!document.querySelector('td.detail')");
        std::thread::sleep(Duration::from_millis(300));
        b.screenshot(&s)
    })
    .await
    .unwrap();
    assert_eq!(&shot[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    assert!(shot.len() > 20_000, "{} bytes", shot.len());
    if let Some(path) = std::env::var_os("XDSTAP_PAGE_SHOT") {
        std::fs::write(&path, &shot).unwrap();
    }
    demo.terminate();
    told.push_str(&out.rest(30));
    assert!(told.contains("Story played as expected: yes"), "{told}");
}
