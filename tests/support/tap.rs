//! The tap started in-process on a loopback port or Unix socket, with its counters at hand.

use std::sync::Arc;

use xdstap::proxy::{
    ClientTls, Connector, Endpoint, Listener, NoObserver, Observe, Proxy, ProxyStats, ServerTls,
    Settings,
};

pub struct Tap {
    pub addr: String,
    pub stats: Arc<ProxyStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

pub struct TapOptions {
    pub listen: Endpoint,
    pub upstream: Endpoint,
    pub settings: Settings,
    pub observer: Arc<dyn Observe>,
    pub tls: Option<ServerTls>,
    pub upstream_tls: Option<ClientTls>,
}

impl TapOptions {
    pub fn new(upstream: &str) -> Self {
        TapOptions {
            listen: Endpoint::Tcp("127.0.0.1:0".into()),
            upstream: upstream.parse().unwrap(),
            settings: Settings::default(),
            observer: Arc::new(NoObserver),
            tls: None,
            upstream_tls: None,
        }
    }
}

impl Tap {
    pub async fn start(upstream: &str) -> Tap {
        Tap::with(TapOptions::new(upstream)).await
    }

    pub async fn with(o: TapOptions) -> Tap {
        let acceptor = o.tls.map(|t| t.acceptor().unwrap());
        let listener = Listener::bind(&o.listen, acceptor).await.unwrap();
        let tls = o
            .upstream_tls
            .map(|t| t.connector(o.upstream.host()).unwrap());
        let proxy = Proxy::new(
            listener,
            Connector::new(o.upstream, tls),
            o.settings,
            o.observer,
        );
        let addr = proxy.local_addr();
        let stats = proxy.stats();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(proxy.serve(async {
            let _ = rx.await;
        }));
        Tap {
            addr,
            stats,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting and waits for the grace period to run out or every stream to end.
    pub async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

pub fn get(counter: &std::sync::atomic::AtomicU64) -> u64 {
    ProxyStats::get(counter)
}

/// A tap with the full xDS pipeline; verdicts are read from its recorder.
pub struct XdsTap {
    pub tap: Tap,
    pub pipeline: xdstap::tap::Pipeline,
}

impl XdsTap {
    pub async fn start(options: TapOptions) -> XdsTap {
        XdsTap::with_sinks(options, vec![]).await
    }

    /// A tap whose events also go to `sinks` (spans, status, ...).
    pub async fn with_sinks(
        mut options: TapOptions,
        sinks: Vec<Box<dyn xdstap::observe::Sink>>,
    ) -> XdsTap {
        let pipeline = xdstap::tap::Pipeline::start(
            xdstap::tap::PipelineOptions {
                queue_capacity: 65_536,
                recorded_events: 100_000,
                ..Default::default()
            },
            sinks,
        );
        options.observer = pipeline.tap.clone();
        XdsTap {
            tap: Tap::with(options).await,
            pipeline,
        }
    }

    pub fn events(&self) -> Vec<xdstap::correlate::Event> {
        self.pipeline.recorder.events()
    }

    /// (node, short type, nonce, verdict) of every verdict so far.
    pub fn verdicts(&self) -> Vec<Verdict> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                xdstap::correlate::Event::Verdict {
                    at,
                    push,
                    verdict,
                    client_version,
                    ..
                } => Some(Verdict {
                    node: at.node.as_ref().map(|n| n.id.clone()).unwrap_or_default(),
                    type_url: at.type_url.clone(),
                    nonce: push.nonce.clone(),
                    version: push.version.clone(),
                    verdict,
                    client_version,
                    names: push.resources.iter().map(|r| r.name.clone()).collect(),
                }),
                _ => None,
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub struct Verdict {
    pub node: String,
    pub type_url: String,
    pub nonce: String,
    pub version: String,
    pub verdict: xdstap::correlate::Verdict,
    pub client_version: Option<String>,
    pub names: Vec<String>,
}
