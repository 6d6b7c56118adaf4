//! One WebSocket connection: hello, join, audio in, events out, leave.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::sync::mpsc;
use voxline_core::SAMPLE_RATE;

use super::bridge::{Arrivals, Bridge, Progress, TICK};
use super::metrics::Outcome;
use super::protocol::{close_reason, Control, Decoder, Hello, ServerEvent, MAX_FRAME_BYTES};
use super::{Phase, Shared};
use voxline_pipeline::sessions::{HubError, Session};

/// Close codes (RFC 6455 §7.4.1).
mod code {
    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    pub const UNSUPPORTED: u16 = 1003;
    pub const INVALID: u16 = 1007;
    pub const POLICY: u16 = 1008;
    pub const TOO_BIG: u16 = 1009;
    pub const INTERNAL: u16 = 1011;
    pub const TRY_LATER: u16 = 1013;
}

/// How long a closing connection waits for its last frames to go out.
const FLUSH: Duration = Duration::from_secs(2);

/// Counts the connection while it lives; tells the server when it ends.
struct LiveGuard(Arc<Shared>);

impl LiveGuard {
    fn new(s: &Arc<Shared>) -> Self {
        s.live.fetch_add(1, Ordering::SeqCst);
        LiveGuard(Arc::clone(s))
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
        self.0.gone.notify_waiters();
    }
}

fn close(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: close_reason(reason).into(),
    }))
}

/// Runs one connection to its end.
pub(super) async fn run(socket: WebSocket, shared: Arc<Shared>) {
    let _live = LiveGuard::new(&shared);
    let (mut sink, mut stream) = socket.split();
    let hello = match read_hello(&mut stream, shared.opts.hello_timeout).await {
        Some(Ok(h)) => h,
        Some(Err(why)) => {
            shared.metrics.connection(Outcome::BadHello);
            let _ = tokio::time::timeout(FLUSH, sink.send(close(code::POLICY, &why))).await;
            return;
        }
        None => return,
    };
    let mut decoder = match Decoder::new(hello) {
        Ok(d) => d,
        Err(why) => {
            shared.metrics.connection(Outcome::BadHello);
            let _ = tokio::time::timeout(FLUSH, sink.send(close(code::INVALID, &why))).await;
            return;
        }
    };
    let hub_side = Arc::clone(&shared);
    let joined = tokio::task::spawn_blocking(move || hub_side.hub.join()).await;
    let session = match joined {
        Ok(Ok(s)) => Arc::new(s),
        Ok(Err(e @ HubError::Full { .. })) => {
            shared.metrics.connection(Outcome::Full);
            let why = format!("voxline: {e}");
            let _ = tokio::time::timeout(FLUSH, sink.send(close(code::TRY_LATER, &why))).await;
            return;
        }
        Ok(Err(e)) => {
            let _ = tokio::time::timeout(
                FLUSH,
                sink.send(close(code::INTERNAL, &format!("voxline: {e}"))),
            )
            .await;
            return;
        }
        Err(_) => return,
    };
    shared.metrics.connection(Outcome::Accepted);
    let origin = Instant::now();
    let ready = ServerEvent::Ready {
        session: session.slot(),
        sample_rate: SAMPLE_RATE,
        max_sessions: shared.hub.max_sessions(),
    };
    if sink
        .send(Message::Text(ready.to_json().into()))
        .await
        .is_err()
    {
        leave(session).await;
        return;
    }

    // events out: bridge thread → bounded queue → writer task → socket
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(shared.opts.client_queue);
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            let closing = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || closing {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let arrivals = Arc::new(Mutex::new(Arrivals::default()));
    let progress = Arc::new(Progress::default());
    let bridge = {
        let (session, shared, arrivals, progress, out) = (
            Arc::clone(&session),
            Arc::clone(&shared),
            Arc::clone(&arrivals),
            Arc::clone(&progress),
            out_tx.clone(),
        );
        std::thread::Builder::new()
            .name(format!("ws-bridge-{}", session.slot()))
            .spawn(move || Bridge::new(origin).run(&session, &shared, &arrivals, &progress, &out))
    };
    let Ok(bridge) = bridge else {
        let _ = out_tx.try_send(close(
            code::INTERNAL,
            "voxline: cannot start the session's bridge",
        ));
        drop(out_tx);
        let _ = tokio::time::timeout(FLUSH, writer).await;
        leave(session).await;
        return;
    };

    let ending = receive(
        &shared,
        &session,
        &mut decoder,
        &mut stream,
        &arrivals,
        &progress,
        origin,
    )
    .await;
    if let Some((code, why, outcome)) = ending {
        if let Some(o) = outcome {
            shared.metrics.connection(o);
        }
        // the close goes after the events already queued
        let _ = tokio::time::timeout(FLUSH, out_tx.send(close(code, &why))).await;
    }
    progress.stop.store(true, Ordering::SeqCst);
    drop(out_tx);
    let _ = tokio::task::spawn_blocking(move || bridge.join()).await;
    let mut writer = writer;
    if tokio::time::timeout(FLUSH, &mut writer).await.is_err() {
        // a client that does not read: drop its socket
        writer.abort();
    }
    leave(session).await;
}

/// Leaves the hub (waits for the worker to free the slot) off the I/O threads.
async fn leave(session: Arc<Session>) {
    let _ = tokio::task::spawn_blocking(move || drop(session)).await;
}

type Stream = futures_util::stream::SplitStream<WebSocket>;

/// The hello, `Some(Err)` with a reason when it is bad or late, `None` when
/// the client left.
async fn read_hello(stream: &mut Stream, within: Duration) -> Option<Result<Hello, String>> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next()).await;
        return match next {
            Err(_) => Some(Err(format!(
                "no hello within {} s; send {{\"type\":\"hello\",...}} first",
                within.as_secs()
            ))),
            Ok(None | Some(Err(_) | Ok(Message::Close(_)))) => None,
            Ok(Some(Ok(Message::Text(t)))) => Some(Hello::parse(t.as_str())),
            Ok(Some(Ok(Message::Binary(_)))) => Some(Err(
                "bad hello: audio before the hello; send {\"type\":\"hello\",...} first".into(),
            )),
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
        };
    }
}

/// Takes the client's audio until it leaves, misbehaves, idles or the
/// server stops. `Some((code, reason, outcome))` when the server closes.
async fn receive(
    shared: &Shared,
    session: &Session,
    decoder: &mut Decoder,
    stream: &mut Stream,
    arrivals: &Mutex<Arrivals>,
    progress: &Progress,
    origin: Instant,
) -> Option<(u16, String, Option<Outcome>)> {
    let mut phase = shared.phase.clone();
    let mut received: u64 = 0;
    let mut push = |samples: Vec<f32>| {
        if samples.is_empty() {
            return;
        }
        received += samples.len() as u64;
        voxline_core::sync::lock(arrivals).record(received, Instant::now());
        session.push(samples);
    };
    let idle = shared.opts.idle_timeout;
    let mut last_heard = Instant::now();
    // the client said `end`: its last turn is the server's work until told
    let mut ended = false;
    loop {
        let message = tokio::select! {
            next = tokio::time::timeout(idle, stream.next()) => next,
            () = until(&mut phase, |p| p != Phase::Running) => {
                return drain(shared, session, progress).await;
            }
        };
        let message = match message {
            Err(_) => {
                // idle: nothing from the client and nothing to it (an
                // answer still streaming is not idle), and nothing of the
                // client's still in the works: audio before its `end` not
                // yet transcribed, or a turn transcribed and not yet
                // answered (a transcription that takes longer than the
                // timeout tells the client nothing meanwhile)
                let said =
                    origin + Duration::from_millis(progress.last_event_ms.load(Ordering::SeqCst));
                let working = (ended && !progress.stream_ended.load(Ordering::SeqCst))
                    || progress.open.load(Ordering::SeqCst) > 0;
                if !working && last_heard.max(said).elapsed() >= idle {
                    let why = format!("idle: nothing received for {} s", idle.as_secs());
                    return Some((code::NORMAL, why, Some(Outcome::Idle)));
                }
                continue;
            }
            Ok(None | Some(Ok(Message::Close(_)))) => return None,
            Ok(Some(Err(e))) => return refused_message(&e),
            Ok(Some(Ok(m))) => m,
        };
        last_heard = Instant::now();
        match message {
            Message::Binary(b) => match decoder.frame(&b) {
                Ok(samples) => push(samples),
                Err(why) => return Some((code::INVALID, why, Some(Outcome::BadFrame))),
            },
            Message::Text(t) => match serde_json::from_str::<Control>(t.as_str()) {
                Ok(Control::End) => {
                    push(decoder.flush());
                    session.end_of_stream();
                    ended = true;
                }
                Err(_) => {
                    let why = "bad frame: after the hello send audio as binary frames, or {\"type\":\"end\"}".to_string();
                    return Some((code::UNSUPPORTED, why, Some(Outcome::BadFrame)));
                }
            },
            Message::Ping(_) | Message::Pong(_) | Message::Close(_) => {}
        }
    }
}

/// Why a message the socket could not take closes the connection: one too
/// large (1009) or a text message that is not UTF-8 (1007); `None` for a
/// connection that failed or went away.
fn refused_message(e: &axum::Error) -> Option<(u16, String, Option<Outcome>)> {
    use std::error::Error as _;
    let inner = e.source()?.downcast_ref::<tungstenite::Error>()?;
    match inner {
        tungstenite::Error::Capacity(c) => Some((
            code::TOO_BIG,
            format!(
                "message too big ({c}); send audio in frames of at most {MAX_FRAME_BYTES} bytes"
            ),
            Some(Outcome::BadFrame),
        )),
        tungstenite::Error::Utf8(_) => Some((
            code::INVALID,
            "bad frame: a text message that is not UTF-8; send JSON text".into(),
            Some(Outcome::BadFrame),
        )),
        _ => None,
    }
}

/// Ctrl-C: the stream ends here; answers in flight finish (unless a second
/// Ctrl-C comes), then the connection closes.
async fn drain(
    shared: &Shared,
    session: &Session,
    progress: &Progress,
) -> Option<(u16, String, Option<Outcome>)> {
    // what the VAD has not reached is dropped (counted); the turns the
    // pipeline holds finish
    let dropped = session.discard_queued();
    shared.dropped_at_shutdown(dropped);
    let mut phase = shared.phase.clone();
    loop {
        let done = progress.stream_ended.load(Ordering::SeqCst)
            && progress.open.load(Ordering::SeqCst) == 0;
        if done {
            return Some((
                code::GOING_AWAY,
                "voxline: the server is shutting down".into(),
                Some(Outcome::Shutdown),
            ));
        }
        tokio::select! {
            () = tokio::time::sleep(TICK) => {}
            () = until(&mut phase, |p| p == Phase::Cancel) => {
                return Some((
                    code::GOING_AWAY,
                    "voxline: the server is shutting down; the answer in flight was cancelled".into(),
                    Some(Outcome::Shutdown),
                ));
            }
        }
    }
}

/// Returns once the server's phase satisfies `f` (or the server is gone).
async fn until(phase: &mut tokio::sync::watch::Receiver<Phase>, f: impl Fn(Phase) -> bool) {
    let _ = phase.wait_for(|p| f(*p)).await;
}
