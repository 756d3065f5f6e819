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
        let tls = o.upstream_tls.map(|t| t.connector(o.upstream.host()).unwrap());
        let proxy = Proxy::new(listener, Connector::new(o.upstream, tls), o.settings, o.observer);
        let addr = proxy.local_addr();
        let stats = proxy.stats();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(proxy.serve(async {
            let _ = rx.await;
        }));
        Tap { addr, stats, stop: Some(tx), task: Some(task) }
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
