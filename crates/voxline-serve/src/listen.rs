//! The listener: every TCP connection is bounded before any token is
//! checked.
//!
//! - A connection has [`Limits::header_timeout`] to send a whole request's
//!   headers (and again before each further request on a kept-alive one);
//!   then it is closed.
//! - At most [`Limits::max_connections`] are open at once, WebSockets
//!   included. A connection arriving at the cap takes the place of the
//!   oldest one that has not yet sent a whole request (a socket that only
//!   holds a descriptor); when every open one is in a request or a
//!   conversation, it is refused. Either way it is counted, and `/healthz`
//!   gets in while idle sockets hold the rest.
//! - At shutdown the listener closes at once; requests in progress have
//!   [`Limits::shutdown_grace`] to finish, then their sockets are dropped,
//!   so that a client that never finishes its request cannot hold the
//!   process up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

use super::metrics::Closed;
use super::{Phase, Shared};

/// The listener's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, WebSockets included.
    pub max_connections: usize,
    /// Time a connection has to send a request's headers.
    pub header_timeout: Duration,
    /// Time requests in progress have to finish once the server stops.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    /// 512 connections (well under a common 1,024-descriptor limit, with
    /// room for the models and the engines' files), 10 s for headers, 3 s
    /// of grace at shutdown.
    fn default() -> Self {
        Limits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(3),
        }
    }
}

/// The connections the listener holds (before any upgrade).
#[derive(Default)]
pub(super) struct Connections {
    /// HTTP connections open now.
    open: AtomicUsize,
    next: AtomicU64,
    /// Open connections that have not yet sent a whole request, oldest first.
    waiting: Mutex<BTreeMap<u64, Arc<Notify>>>,
}

impl Connections {
    fn waiting(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Notify>>> {
        voxline_core::sync::lock(&self.waiting)
    }

    /// Closes the oldest connection still waiting for its first request;
    /// whether there was one.
    fn evict_oldest(&self) -> bool {
        match self.waiting().pop_first() {
            Some((_, close)) => {
                close.notify_one();
                true
            }
            None => false,
        }
    }

    /// Connection `id` has sent a whole request: it is no longer evictable.
    fn requested(&self, id: u64) {
        self.waiting().remove(&id);
    }

    /// HTTP connections open now.
    pub(super) fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// Counts one HTTP connection while it is open.
struct Open {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Open {
    fn drop(&mut self) {
        let c = &self.shared.conns;
        c.requested(self.id);
        c.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts connections until the server stops, then gives the requests in
/// progress their grace and drops what is left.
pub(super) async fn accept(
    listener: tokio::net::TcpListener,
    app: Router,
    shared: Arc<Shared>,
    mut phase: watch::Receiver<Phase>,
) {
    let limits = shared.opts.limits;
    let mut tasks = JoinSet::new();
    let mut warned = false;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            () = stopping(&mut phase) => break,
        };
        while tasks.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // out of descriptors (or a connection reset before it was
                // taken): wait for some to close rather than spin
                if !warned {
                    tracing::warn!(error = %e, "cannot accept a connection; lower --max-connections or raise the descriptor limit (ulimit -n)");
                    warned = true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let held = shared.conns.open() + shared.live.load(Ordering::SeqCst);
        if held >= limits.max_connections {
            if shared.conns.evict_oldest() {
                shared.metrics.closed(Closed::Evicted);
            } else {
                shared.metrics.closed(Closed::Refused);
                drop(stream);
                continue;
            }
        }
        let _ = stream.set_nodelay(true);
        let id = shared.conns.next.fetch_add(1, Ordering::SeqCst);
        let close = Arc::new(Notify::new());
        shared.conns.waiting().insert(id, Arc::clone(&close));
        shared.conns.open.fetch_add(1, Ordering::SeqCst);
        let open = Open {
            shared: Arc::clone(&shared),
            id,
        };
        tasks.spawn(connection(stream, open, close, app.clone(), phase.clone()));
    }
    drop(listener);
    let all_done = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.shutdown_grace, all_done)
        .await
        .is_err()
    {
        let left = tasks.len();
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        shared.metrics.closed_by(Closed::Shutdown, left as u64);
        tracing::info!(
            connections = left,
            "stopping: dropped connections whose request did not finish within {} s",
            limits.shutdown_grace.as_secs_f64()
        );
    }
}

/// Serves one HTTP connection (and hands a WebSocket upgrade on).
async fn connection(
    stream: tokio::net::TcpStream,
    open: Open,
    close: Arc<Notify>,
    app: Router,
    mut phase: watch::Receiver<Phase>,
) {
    let limits = open.shared.opts.limits;
    let (shared, id) = (Arc::clone(&open.shared), open.id);
    let inner = TowerToHyperService::new(app);
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        shared.conns.requested(id);
        hyper::service::Service::call(&inner, req)
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if r.is_err_and(|e| e.is_timeout()) {
                open.shared.metrics.closed(Closed::HeaderTimeout);
            }
        }
        // its place was given to a newer connection
        () = close.notified() => {}
        () = stopping(&mut phase) => {
            // finish the request in progress (the listener's grace bounds it)
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
    drop(open);
}

/// Returns once the server stops taking connections.
async fn stopping(phase: &mut watch::Receiver<Phase>) {
    let _ = phase.wait_for(|p| *p != Phase::Running).await;
}
