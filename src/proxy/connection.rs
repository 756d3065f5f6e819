//! One downstream connection: TLS and HTTP/2 handshakes, then a task per accepted stream, all
//! sharing one lazily dialed upstream connection.

use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::batch::Gate;
use super::listen::Io;
use super::upstream::UpstreamConn;
use super::{stream, Decrement, ProxyStats, Shared};

pub(super) async fn serve(
    io: Io,
    gate: Gate,
    tls: Option<TlsAcceptor>,
    peer: String,
    conn_id: u64,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let stats = &shared.stats;
    ProxyStats::add(&stats.connections_total, 1);
    ProxyStats::add(&stats.connections_active, 1);
    let _active = Decrement(&stats.connections_active);

    let io: Io = match tls {
        Some(acceptor) => match acceptor.accept(io).await {
            Ok(tls) => Box::new(tls),
            Err(e) => {
                ProxyStats::add(&stats.handshake_errors, 1);
                tracing::warn!(%peer, error = %e, "Client TLS handshake failed");
                return;
            }
        },
        None => io,
    };
    let settings = &shared.settings;
    let handshake = h2::server::Builder::new()
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_header_list_size(settings.max_header_list_size)
        .handshake::<_, Bytes>(io);
    // A client that connects and never speaks HTTP/2 is dropped after the connect timeout.
    let mut conn = match tokio::time::timeout(settings.connect_timeout, handshake).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            ProxyStats::add(&stats.handshake_errors, 1);
            tracing::warn!(%peer, error = %e, "Client HTTP/2 handshake failed (not HTTP/2 with prior knowledge?)");
            return;
        }
        Err(_) => {
            ProxyStats::add(&stats.handshake_errors, 1);
            tracing::warn!(%peer, timeout = ?settings.connect_timeout, "Client sent no HTTP/2 preface in time");
            return;
        }
    };
    tracing::info!(conn = conn_id, %peer, upstream = %shared.connector.endpoint(), "Connection opened");
    let upstream = Arc::new(UpstreamConn::new(shared.connector.clone()));
    let mut draining = *stop.borrow();
    if draining {
        conn.graceful_shutdown();
    }
    let mut streams = 0u64;
    // The stream tasks belong to this connection: when the grace period ends and this task is
    // cut, they are cut with it, so their observers end before the tap stops observing.
    let mut tasks = tokio::task::JoinSet::new();
    let result = loop {
        tokio::select! {
            changed = stop.changed(), if !draining => {
                if changed.is_err() || *stop.borrow() {
                    draining = true;
                    conn.graceful_shutdown();
                }
            }
            next = poll_fn(|cx| gate.poll(cx, |cx| conn.poll_accept(cx))) => match next {
                Some(Ok((request, respond))) => {
                    streams += 1;
                    let id = shared.next_stream.fetch_add(1, Ordering::Relaxed);
                    let shared = shared.clone();
                    let upstream = upstream.clone();
                    let peer = peer.clone();
                    tasks.spawn(async move {
                        stream::forward(id, request, respond, &upstream, &shared, &peer).await;
                    });
                }
                Some(Err(e)) => break Err(e),
                None => break Ok(()),
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    };
    tasks.detach_all();
    match result {
        Ok(()) => tracing::info!(conn = conn_id, %peer, streams, "Connection closed"),
        Err(e) => {
            ProxyStats::add(&stats.connection_errors, 1);
            if e.is_go_away() && !e.is_remote() {
                // We ended it: a protocol violation or a flood (ENHANCE_YOUR_CALM).
                tracing::warn!(conn = conn_id, %peer, streams, error = %e, "Closed a client connection that broke HTTP/2 rules");
            } else {
                tracing::info!(conn = conn_id, %peer, streams, error = %e, "Connection closed");
            }
        }
    }
}
