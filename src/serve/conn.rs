//! One WebSocket connection: hello, join, audio in, events out, leave.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::sync::mpsc;
use voxline_core::SAMPLE_RATE;

use super::metrics::{bottleneck, Edge, Metrics, Outcome};
use super::protocol::{close_reason, Control, Decoder, Hello, Latency, ServerEvent};
use super::{Phase, Shared};
use crate::sessions::{HubError, Session, SessionEvent};

/// Close codes (RFC 6455 §7.4.1).
mod code {
    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    pub const UNSUPPORTED: u16 = 1003;
    pub const INVALID: u16 = 1007;
    pub const POLICY: u16 = 1008;
    pub const INTERNAL: u16 = 1011;
    pub const TRY_LATER: u16 = 1013;
}

/// How often the bridge thread looks up from the session's events.
const TICK: Duration = Duration::from_millis(100);
/// How often a client hears the server's load.
const STATS_EVERY: Duration = Duration::from_secs(1);
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

/// When each stretch of the stream arrived: `(samples received so far, when)`.
#[derive(Default)]
struct Arrivals(VecDeque<(u64, Instant)>);

impl Arrivals {
    /// About ten minutes of 20 ms frames.
    const KEEP: usize = 30_000;

    fn record(&mut self, total: u64, at: Instant) {
        if self.0.len() == Self::KEEP {
            self.0.pop_front();
        }
        self.0.push_back((total, at));
    }

    /// When sample `n` had arrived.
    fn when(&self, n: u64) -> Option<Instant> {
        let i = self.0.partition_point(|(total, _)| *total < n);
        self.0.get(i).map(|a| a.1)
    }
}

/// What the bridge thread tells the connection.
#[derive(Default)]
struct Progress {
    /// Transcribed turns not yet answered or failed.
    open: AtomicUsize,
    /// The session has transcribed everything up to the client's `end`.
    stream_ended: AtomicBool,
    /// The connection is ending: the bridge stops.
    stop: AtomicBool,
    /// When the server last sent the client an event (not the load), ms
    /// since the session started.
    last_event_ms: std::sync::atomic::AtomicU64,
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
        arrivals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(received, Instant::now());
        session.push(samples);
    };
    let idle = shared.opts.idle_timeout;
    let mut last_heard = Instant::now();
    loop {
        let message = tokio::select! {
            next = tokio::time::timeout(idle, stream.next()) => next,
            () = until(&mut phase, |p| p != Phase::Running) => {
                return drain(shared, session, decoder, progress, &mut push).await;
            }
        };
        let message = match message {
            Err(_) => {
                // idle: nothing from the client and nothing to it (an
                // answer still streaming is not idle)
                let said =
                    origin + Duration::from_millis(progress.last_event_ms.load(Ordering::SeqCst));
                if last_heard.max(said).elapsed() >= idle {
                    let why = format!("idle: nothing received for {} s", idle.as_secs());
                    return Some((code::NORMAL, why, Some(Outcome::Idle)));
                }
                continue;
            }
            Ok(None | Some(Err(_) | Ok(Message::Close(_)))) => return None,
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

/// Ctrl-C: the stream ends here; answers in flight finish (unless a second
/// Ctrl-C comes), then the connection closes.
async fn drain(
    shared: &Shared,
    session: &Session,
    decoder: &mut Decoder,
    progress: &Progress,
    push: &mut impl FnMut(Vec<f32>),
) -> Option<(u16, String, Option<Outcome>)> {
    push(decoder.flush());
    session.end_of_stream();
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

/// A turn between its transcript and its end.
struct TurnState {
    turn: u32,
    transcript: String,
    end_sample: u64,
    stt: Duration,
    stt_wait: Duration,
    tokens: u32,
    first: Option<Instant>,
}

/// Returns once the server's phase satisfies `f` (or the server is gone).
async fn until(phase: &mut tokio::sync::watch::Receiver<Phase>, f: impl Fn(Phase) -> bool) {
    let _ = phase.wait_for(|p| f(*p)).await;
}

/// Carries one session's events to its client's queue.
struct Bridge {
    origin: Instant,
    /// The turns transcribed and not yet ended.
    turns: Vec<TurnState>,
    /// Lost on each edge and not yet told to the client.
    untold: [(Edge, u64); 3],
    seen_events: u64,
    seen_audio: u64,
    last_stats: Instant,
}

impl Bridge {
    fn new(origin: Instant) -> Self {
        Bridge {
            origin,
            turns: Vec::new(),
            untold: [(Edge::Client, 0), (Edge::Events, 0), (Edge::Audio, 0)],
            seen_events: 0,
            seen_audio: 0,
            last_stats: origin,
        }
    }

    fn run(
        mut self,
        session: &Session,
        shared: &Shared,
        arrivals: &Mutex<Arrivals>,
        progress: &Progress,
        out: &mpsc::Sender<Message>,
    ) {
        while !progress.stop.load(Ordering::SeqCst) {
            match session.events().recv_timeout(TICK) {
                Ok(ev) => {
                    for e in self.convert(ev, shared, arrivals, progress) {
                        self.send(&e, &shared.metrics, out);
                    }
                    progress.last_event_ms.store(
                        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX),
                        Ordering::SeqCst,
                    );
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            }
            self.losses(session, shared);
            self.tell_losses(out);
            if self.last_stats.elapsed() >= STATS_EVERY {
                self.last_stats = Instant::now();
                let (stt, llm) = shared.load.utilisation(shared.hub.totals(), STATS_EVERY);
                let stats = ServerEvent::Stats {
                    sessions: shared.hub.sessions(),
                    stt_utilisation: stt,
                    llm_utilisation: llm,
                    bottleneck: if stt + llm < 0.01 {
                        "idle"
                    } else {
                        bottleneck(stt, llm)
                    }
                    .into(),
                };
                // the load is news only while fresh: never counted as lost
                let _ = out.try_send(Message::Text(stats.to_json().into()));
            }
        }
    }

    fn ms_since_origin(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.origin).as_secs_f64() * 1e3
    }

    fn convert(
        &mut self,
        ev: SessionEvent,
        shared: &Shared,
        arrivals: &Mutex<Arrivals>,
        progress: &Progress,
    ) -> Vec<ServerEvent> {
        let now = Instant::now();
        match ev {
            SessionEvent::Transcript {
                turn,
                text,
                end_sample,
                stt_wait,
                stt,
            } => {
                progress.open.fetch_add(1, Ordering::SeqCst);
                self.turns.push(TurnState {
                    turn,
                    transcript: text.clone(),
                    end_sample,
                    stt,
                    stt_wait,
                    tokens: 0,
                    first: None,
                });
                vec![ServerEvent::Transcript {
                    id: turn,
                    sample: end_sample,
                    t_ms: self.ms_since_origin(now),
                    text,
                    stt_ms: ms(stt),
                    stt_wait_ms: ms(stt_wait),
                }]
            }
            SessionEvent::Token { turn, piece, at } => {
                let index = match self.turns.iter_mut().find(|t| t.turn == turn) {
                    Some(t) => {
                        t.first.get_or_insert(at);
                        t.tokens += 1;
                        t.tokens - 1
                    }
                    None => 0,
                };
                vec![ServerEvent::Token {
                    id: turn,
                    t_ms: self.ms_since_origin(at),
                    index,
                    text: piece,
                }]
            }
            SessionEvent::TurnDone {
                turn,
                text,
                tokens,
                stop,
                first_token,
                decode,
            } => {
                progress.open.fetch_sub(1, Ordering::SeqCst);
                let state = self
                    .turns
                    .iter()
                    .position(|t| t.turn == turn)
                    .map(|i| self.turns.remove(i));
                let response = state.as_ref().and_then(|t| {
                    let arrived = arrivals
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .when(t.end_sample)?;
                    Some(t.first?.saturating_duration_since(arrived))
                });
                shared.metrics.turn(response, first_token);
                let (transcript, stt, stt_wait) = state
                    .map(|t| (t.transcript, t.stt, t.stt_wait))
                    .unwrap_or_default();
                vec![ServerEvent::TurnComplete {
                    id: turn,
                    t_ms: self.ms_since_origin(now),
                    transcript,
                    response: text,
                    n_generated: tokens,
                    stop,
                    latency: Latency {
                        response_ms: response.map(ms),
                        stt_ms: ms(stt),
                        stt_wait_ms: ms(stt_wait),
                        first_token_ms: first_token.map(ms),
                        decode_ms: decode.map(ms),
                    },
                }]
            }
            SessionEvent::TurnError { turn, message } => {
                progress.open.fetch_sub(1, Ordering::SeqCst);
                self.turns.retain(|t| t.turn != turn);
                shared.metrics.turn_error();
                vec![ServerEvent::TurnError {
                    id: turn,
                    t_ms: self.ms_since_origin(now),
                    message,
                }]
            }
            SessionEvent::StreamEnd => {
                progress.stream_ended.store(true, Ordering::SeqCst);
                vec![ServerEvent::StreamEnd {
                    t_ms: self.ms_since_origin(now),
                }]
            }
        }
    }

    /// Queues `e` for the client; a full queue drops it (counted).
    fn send(&mut self, e: &ServerEvent, metrics: &Metrics, out: &mpsc::Sender<Message>) {
        self.tell_losses(out);
        if out.try_send(Message::Text(e.to_json().into())).is_err() {
            self.untold[0].1 += 1;
            metrics.dropped(Edge::Client, 1);
        }
    }

    /// The session's own losses since the last look.
    fn losses(&mut self, session: &Session, shared: &Shared) {
        let events = session.dropped_events();
        let audio = session.refused_blocks();
        let (de, da) = (events - self.seen_events, audio - self.seen_audio);
        (self.seen_events, self.seen_audio) = (events, audio);
        shared.metrics.dropped(Edge::Events, de);
        shared.metrics.dropped(Edge::Audio, da);
        self.untold[1].1 += de;
        self.untold[2].1 += da;
    }

    /// Tells the client what it lost, once its queue has room.
    fn tell_losses(&mut self, out: &mpsc::Sender<Message>) {
        for (edge, n) in &mut self.untold {
            if *n > 0 {
                let e = ServerEvent::Dropped {
                    edge: edge.label().into(),
                    count: *n,
                };
                if out.try_send(Message::Text(e.to_json().into())).is_ok() {
                    *n = 0;
                }
            }
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_client_queue_drops_counts_and_then_tells() {
        let metrics = Metrics::new(1, 2);
        let (tx, mut rx) = mpsc::channel(2);
        let mut b = Bridge::new(Instant::now());
        let ev = |i| ServerEvent::Token {
            id: 1,
            t_ms: 0.0,
            index: i,
            text: "x".into(),
        };
        for i in 0..5 {
            b.send(&ev(i), &metrics, &tx);
        }
        // the first two went, three were dropped and counted
        assert_eq!(b.untold[0].1, 3);
        let text = metrics.render(crate::sessions::HubTotals::default(), 1);
        let m = super::super::metrics::parse_exposition(&text);
        assert_eq!(
            super::super::metrics::sample(&m, r#"voxline_dropped_total{edge="client"}"#),
            3.0
        );
        let got = |m: Message| match m {
            Message::Text(t) => serde_json::from_str::<ServerEvent>(t.as_str()).unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(got(rx.try_recv().unwrap()), ev(0));
        assert_eq!(got(rx.try_recv().unwrap()), ev(1));
        // the client reads again: it hears what it lost, then what comes next
        b.send(&ev(5), &metrics, &tx);
        assert_eq!(
            got(rx.try_recv().unwrap()),
            ServerEvent::Dropped {
                edge: "client".into(),
                count: 3
            }
        );
        assert_eq!(got(rx.try_recv().unwrap()), ev(5));
        assert_eq!(b.untold[0].1, 0);
    }

    #[test]
    fn arrivals_find_when_a_sample_came_in() {
        let t0 = Instant::now();
        let mut a = Arrivals::default();
        for k in 1..=5u64 {
            a.record(k * 320, t0 + Duration::from_millis(20 * k));
        }
        assert_eq!(a.when(1), Some(t0 + Duration::from_millis(20)));
        assert_eq!(a.when(640), Some(t0 + Duration::from_millis(40)));
        assert_eq!(a.when(641), Some(t0 + Duration::from_millis(60)));
        assert_eq!(a.when(5 * 320 + 1), None);
    }
}
