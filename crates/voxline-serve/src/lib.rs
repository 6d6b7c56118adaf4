//! `voxline serve`: the assistant over WebSocket.
//!
//! One connection is one conversation on the shared engines of a
//! [`Hub`]: the client sends a JSON hello (rate, channels, sample format)
//! and then binary audio frames; the server sends JSON events in the
//! `--events` schema. tokio runs only the sockets; whisper, the LLM and each
//! session's VAD stay on their own threads, and a per-connection bridge
//! thread carries a session's events to its socket through a bounded
//! outgoing queue.
//!
//! Safe by default: it listens on localhost unless told otherwise, and a
//! non-local address needs a token (`?token=` or `Authorization: Bearer`,
//! compared in constant time); the N+1th session, a malformed hello or frame
//! and an idle client each close only their own connection, with a reason.
//! A client that stops reading loses events from its own queue (counted,
//! and announced with a `dropped` event when it reads again); it cannot
//! hold up the engines or the other sessions.
//!
//! Routes: `/` (the page), `/worklet.js`, `/ws`, `/healthz`, `/metrics`.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State, WebSocketUpgrade};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::{watch, Notify};

use voxline_pipeline::sessions::Hub;

mod bridge;
pub mod client;
mod conn;
mod listen;
pub mod metrics;
pub mod protocol;
pub mod turns;

pub use listen::Limits;
use metrics::{Load, Metrics, Outcome};

/// The page at `/`: plain HTML and JavaScript, compiled in.
const PAGE: &str = include_str!("page.html");
/// The AudioWorklet the page loads: the microphone's samples to the page.
const WORKLET: &str = include_str!("worklet.js");

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The token clients must present (required for a non-local address).
    pub token: Option<String>,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// Time a client has to send its hello.
    pub hello_timeout: Duration,
    /// Events queued for one client before they are dropped (counted).
    pub client_queue: usize,
    /// Web origins besides the server's own whose pages may connect
    /// (`scheme://host[:port]`, as a browser sends `Origin`).
    pub allow_origins: Vec<String>,
    /// The listener's bounds: connections, header and shutdown times.
    pub limits: Limits,
}

impl ServeOptions {
    /// Checks the options: a non-local address needs a token of 16 or more
    /// characters.
    ///
    /// # Errors
    /// One line saying what is wrong and what to do.
    pub fn check(&self) -> Result<(), String> {
        match &self.token {
            None if !self.listen.ip().is_loopback() => Err(format!(
                "--listen {}: a non-local address needs --token (or VOXLINE_TOKEN) so that only \
                 clients that know it can connect; or listen on 127.0.0.1",
                self.listen
            )),
            Some(t) if t.chars().count() < 16 => {
                Err("--token: use at least 16 characters (e.g. `openssl rand -hex 16`)".to_string())
            }
            _ if !(1..=MAX_CLIENT_QUEUE).contains(&self.client_queue) => Err(format!(
                "--client-queue {}: give 1 to {MAX_CLIENT_QUEUE} events",
                self.client_queue
            )),
            _ if self.limits.max_connections < SPARE_CONNECTIONS => Err(format!(
                "--max-connections {}: give at least {SPARE_CONNECTIONS} more than --max-sessions",
                self.limits.max_connections,
            )),
            _ => Ok(()),
        }
    }
}

/// The most events a client's queue may hold (far more than any client
/// needs; the queue's own limit is higher still).
pub const MAX_CLIENT_QUEUE: usize = 1 << 20;

/// Connections the cap leaves beyond the sessions, at least: `/healthz`,
/// `/metrics` and the page while every session is taken.
pub const SPARE_CONNECTIONS: usize = 8;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}; choose another --listen address or port")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The I/O runtime failed.
    #[error("the network runtime failed: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Where the server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Taking connections.
    Running,
    /// Ctrl-C: no new connections; turns in flight finish, then each closes.
    Draining,
    /// A second Ctrl-C: close every connection now (answers cancelled).
    Cancel,
}

/// What every connection shares.
struct Shared {
    hub: Hub,
    metrics: Metrics,
    load: Load,
    token: Option<[u8; 32]>,
    opts: ServeOptions,
    phase: watch::Receiver<Phase>,
    /// The listener's HTTP connections.
    conns: listen::Connections,
    /// WebSocket conversations open now.
    live: AtomicUsize,
    /// Samples of queued audio dropped at shutdown, all sessions.
    dropped_samples: AtomicU64,
    gone: Notify,
}

impl Shared {
    /// Whether a browser page may connect: a request without `Origin` (no
    /// browser sent it: a script, `bench --via`) may; one from the server's
    /// own page (the origin's host is the request's `Host`) or an origin
    /// `--allow-origin` names may. Any other page the user happens to visit
    /// may not take the assistant (and its microphone sessions).
    fn origin_allowed(&self, headers: &HeaderMap) -> bool {
        let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
            return headers.get(header::ORIGIN).is_none();
        };
        let origin = origin.trim_end_matches('/');
        if self
            .opts
            .allow_origins
            .iter()
            .any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin))
        {
            return true;
        }
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        let own = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        matches!((own, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
    }

    /// Counts queued audio a stopping server dropped.
    fn dropped_at_shutdown(&self, samples: u64) {
        self.dropped_samples.fetch_add(samples, Ordering::SeqCst);
        self.metrics.dropped_at_shutdown(samples);
    }

    /// Whether the request carries the token (always, when none is set):
    /// `?token=` (percent-decoded only, so that a `+` stays a `+`) or
    /// `Authorization: Bearer` (the scheme in any case). When both are
    /// given both must be right: a wrong one is never outvoted.
    fn authorised(&self, query: Option<&str>, headers: &HeaderMap) -> bool {
        let Some(want) = &self.token else {
            return true;
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .map(|v| v.to_str().ok().and_then(bearer_token).unwrap_or_default());
        let given = query.and_then(query_token);
        let right = |g: &str| bool::from(digest(g).ct_eq(want));
        match (given, bearer) {
            (None, None) => false,
            (Some(q), Some(b)) => right(&q) & right(b),
            (Some(q), None) => right(&q),
            (None, Some(b)) => right(b),
        }
    }
}

/// The token of an `Authorization` header's value, for the Bearer scheme
/// in any case.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The `token` parameter of a raw query string, percent-decoded (a `+` is
/// a `+`: tokens are not form data).
fn query_token(query: &str) -> Option<String> {
    let raw = query.split('&').find_map(|kv| kv.strip_prefix("token="))?;
    Some(
        percent_encoding::percent_decode_str(raw)
            .decode_utf8_lossy()
            .into_owned(),
    )
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// What a finished server did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServeSummary {
    /// Whether a second Ctrl-C cancelled turns in flight.
    pub cancelled: bool,
    /// Seconds of audio the clients had sent that had not reached the VAD
    /// when the server stopped: dropped, not transcribed.
    pub dropped_audio_s: f64,
}

/// Serves `hub` until Ctrl-C/SIGTERM: the first stops taking connections
/// and lets turns in flight finish, a second cancels them. `bound` hears the
/// address actually bound (port 0 picks a free one).
///
/// # Errors
/// [`ServeError::Bind`] when the address cannot be bound;
/// [`ServeError::Runtime`] when the network runtime cannot start.
pub fn serve(
    hub: Hub,
    opts: ServeOptions,
    bound: impl FnOnce(SocketAddr),
) -> Result<ServeSummary, ServeError> {
    serve_until(hub, opts, bound, None)
}

/// [`serve`], stopping also when `stop` is requested (once: as a first
/// Ctrl-C; twice is not needed, a request stays raised), e.g. for a server
/// inside a program that has its own signal handling, or a test.
///
/// # Errors
/// As [`serve`].
pub fn serve_until(
    hub: Hub,
    opts: ServeOptions,
    bound: impl FnOnce(SocketAddr),
    stop: Option<voxline_core::ShutdownHandle>,
) -> Result<ServeSummary, ServeError> {
    let listener = std::net::TcpListener::bind(opts.listen).map_err(|source| ServeError::Bind {
        addr: opts.listen,
        source,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(ServeError::Runtime)?;
    let addr = listener.local_addr().map_err(ServeError::Runtime)?;
    // two threads for the sockets: the engines have their own
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("serve-io")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).map_err(ServeError::Runtime)?;
        let (phase_tx, phase) = watch::channel(Phase::Running);
        let metrics = Metrics::new(hub.max_sessions(), hub.threads());
        for (stage, local) in [
            (voxline_pipeline::topology::STT.as_str(), "whisper"),
            (voxline_pipeline::topology::LLM.as_str(), "llama"),
        ] {
            match hub.remote_servers().into_iter().find(|(s, _)| *s == stage) {
                Some((_, server)) => metrics.engine(stage, "remote", &server),
                None => metrics.engine(stage, local, "local"),
            }
        }
        let shared = Arc::new(Shared {
            metrics,
            load: Load::default(),
            token: opts.token.as_deref().map(digest),
            hub,
            opts,
            phase,
            conns: listen::Connections::default(),
            live: AtomicUsize::new(0),
            dropped_samples: AtomicU64::new(0),
            gone: Notify::new(),
        });
        bound(addr);
        let app = router(Arc::clone(&shared));
        let accept = listen::accept(listener, app, Arc::clone(&shared), phase_tx.subscribe());
        let signals = tokio::spawn(async move {
            tokio::select! {
                () = stop_signal() => {}
                () = requested(stop) => {}
            }
            tracing::info!(
                "stopping: no new connections; turns in flight finish (Ctrl-C again cancels them)"
            );
            let _ = phase_tx.send(Phase::Draining);
            stop_signal().await;
            let _ = phase_tx.send(Phase::Cancel);
        });
        accept.await;
        // the listener is closed; wait for the conversations still open
        loop {
            let gone = shared.gone.notified();
            if shared.live.load(Ordering::SeqCst) == 0 {
                break;
            }
            gone.await;
        }
        let cancelled = *shared.phase.borrow() == Phase::Cancel;
        signals.abort();
        let dropped = shared.dropped_samples.load(Ordering::SeqCst);
        Ok(ServeSummary {
            cancelled,
            dropped_audio_s: dropped as f64 / f64::from(voxline_core::SAMPLE_RATE),
        })
    })
}

/// Once `stop` is requested (never, for none).
async fn requested(stop: Option<voxline_core::ShutdownHandle>) {
    let Some(stop) = stop else {
        return std::future::pending().await;
    };
    while !stop.is_requested() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Ctrl-C or SIGTERM.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route(
            "/worklet.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], WORKLET) }),
        )
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_page))
        .route("/ws", get(upgrade))
        .with_state(shared)
}

async fn healthz(State(s): State<Arc<Shared>>) -> Response {
    let running = *s.phase.borrow() == Phase::Running;
    let body = serde_json::json!({
        "status": if running { "ok" } else { "draining" },
        "sessions": s.hub.sessions(),
        "max_sessions": s.hub.max_sessions(),
    });
    let code = if running {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn metrics_page(
    State(s): State<Arc<Shared>>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    if !s.authorised(q.as_deref(), &headers) {
        return refused_token();
    }
    let text = s.metrics.render(&s.hub.totals(), s.hub.sessions());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

fn refused_token() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        "voxline: missing or wrong token; pass it as ?token=T or `Authorization: Bearer T` (when both are given, both must be right)\n",
    )
        .into_response()
}

async fn upgrade(
    State(s): State<Arc<Shared>>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if !s.authorised(q.as_deref(), &headers) {
        s.metrics.connection(Outcome::BadToken);
        return refused_token();
    }
    if !s.origin_allowed(&headers) {
        s.metrics.connection(Outcome::BadOrigin);
        return (
            StatusCode::FORBIDDEN,
            "voxline: a page of another origin may not connect; serve it from this server, or start the server with --allow-origin ORIGIN\n",
        )
            .into_response();
    }
    if *s.phase.borrow() != Phase::Running {
        s.metrics.connection(Outcome::Shutdown);
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "voxline: the server is shutting down\n",
        )
            .into_response();
    }
    ws.max_message_size(protocol::MAX_FRAME_BYTES)
        .max_frame_size(protocol::MAX_FRAME_BYTES)
        .on_upgrade(move |socket| conn::run(socket, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_token_is_read_in_any_case_and_nothing_else_is() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("BEARER abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }

    #[test]
    fn a_query_token_is_percent_decoded_and_a_plus_stays_a_plus() {
        assert_eq!(query_token("token=a+b").as_deref(), Some("a+b"));
        assert_eq!(query_token("x=1&token=a%2Bb%20c").as_deref(), Some("a+b c"));
        assert_eq!(query_token("mytoken=a"), None);
        assert_eq!(query_token("x=1"), None);
    }

    #[test]
    fn out_of_range_options_are_refused_with_the_range() {
        let ok = ServeOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            token: None,
            idle_timeout: Duration::from_secs(60),
            hello_timeout: Duration::from_secs(10),
            client_queue: 1024,
            allow_origins: Vec::new(),
            limits: Limits::default(),
        };
        assert!(ok.check().is_ok());
        let huge = ServeOptions {
            client_queue: usize::MAX,
            ..ok.clone()
        };
        assert!(huge.check().unwrap_err().contains("1 to 1048576"));
        let few = ServeOptions {
            limits: Limits {
                max_connections: 2,
                ..Limits::default()
            },
            ..ok
        };
        assert!(few.check().unwrap_err().contains("--max-connections 2"));
    }
}
