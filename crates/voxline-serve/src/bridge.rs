//! A session's side of a connection: its events, converted to the
//! protocol's, into the client's bounded queue (drops counted and told),
//! with each turn's latency measured from when its end of speech arrived.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::ws::Message;
use tokio::sync::mpsc;

use super::metrics::{bottleneck, Edge, Metrics};
use super::protocol::ServerEvent;
use super::turns::Turns;
use super::Shared;
use voxline_pipeline::sessions::Session;

/// How often the bridge thread looks up from the session's events.
pub(super) const TICK: Duration = Duration::from_millis(100);
/// How often a client hears the server's load.
const STATS_EVERY: Duration = Duration::from_secs(1);
/// When each stretch of the stream arrived: `(samples received so far, when)`.
#[derive(Default)]
pub(super) struct Arrivals(VecDeque<(u64, Instant)>);

impl Arrivals {
    /// About ten minutes of 20 ms frames.
    const KEEP: usize = 30_000;

    pub(super) fn record(&mut self, total: u64, at: Instant) {
        if self.0.len() == Self::KEEP {
            self.0.pop_front();
        }
        self.0.push_back((total, at));
    }

    /// When sample `n` had arrived.
    pub(super) fn when(&self, n: u64) -> Option<Instant> {
        let i = self.0.partition_point(|(total, _)| *total < n);
        self.0.get(i).map(|a| a.1)
    }
}

/// What the bridge thread tells the connection.
#[derive(Default)]
pub(super) struct Progress {
    /// Transcribed turns not yet answered or failed.
    pub(super) open: AtomicUsize,
    /// The session has transcribed everything up to the client's `end`.
    pub(super) stream_ended: AtomicBool,
    /// The connection is ending: the bridge stops.
    pub(super) stop: AtomicBool,
    /// When the server last sent the client an event (not the load), ms
    /// since the session started.
    pub(super) last_event_ms: AtomicU64,
}

/// Carries one session's events to its client's queue.
pub(super) struct Bridge {
    origin: Instant,
    turns: Turns,
    /// Lost on each edge and not yet told to the client.
    untold: [(Edge, u64); 3],
    seen_events: u64,
    seen_audio: u64,
    last_stats: Instant,
}

impl Bridge {
    pub(super) fn new(origin: Instant) -> Self {
        Bridge {
            origin,
            turns: Turns::new(origin),
            untold: [(Edge::Client, 0), (Edge::Events, 0), (Edge::Audio, 0)],
            seen_events: 0,
            seen_audio: 0,
            last_stats: origin,
        }
    }

    pub(super) fn run(
        mut self,
        session: &Session,
        shared: &Shared,
        arrivals: &Mutex<Arrivals>,
        progress: &Progress,
        out: &mpsc::Sender<Message>,
    ) {
        let arrived = |n: u64| voxline_core::sync::lock(arrivals).when(n);
        while !progress.stop.load(Ordering::SeqCst) {
            let told = match session.events().recv_timeout(TICK) {
                Ok(item) => self.turns.push(item, &arrived),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => self.turns.poll(&arrived),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            };
            progress
                .open
                .store(self.turns.open_turns(), Ordering::SeqCst);
            if !told.is_empty() {
                for e in told {
                    note(&e, &shared.metrics, progress);
                    self.send(&e, &shared.metrics, out);
                }
                progress.last_event_ms.store(
                    u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX),
                    Ordering::SeqCst,
                );
            }
            self.losses(session, shared);
            self.tell_losses(out);
            if self.last_stats.elapsed() >= STATS_EVERY {
                self.last_stats = Instant::now();
                let load = shared.load.utilisation(&shared.hub.totals(), STATS_EVERY);
                let stats = ServerEvent::Stats {
                    sessions: shared.hub.sessions(),
                    bottleneck: bottleneck(&load).unwrap_or("idle").to_owned(),
                    utilisation: load,
                };
                // the load is news only while fresh: never counted as lost
                let _ = out.try_send(Message::Text(stats.to_json().into()));
            }
        }
    }

    /// Queues `e` for the client; a full queue drops it (counted). A block
    /// of the voice goes as its `voice` event and then its binary frame,
    /// both or neither.
    fn send(&mut self, e: &ServerEvent, metrics: &Metrics, out: &mpsc::Sender<Message>) {
        self.tell_losses(out);
        let frame = match e {
            ServerEvent::Voice { pcm, .. } => Some(pcm.clone()),
            _ => None,
        };
        let room = out.capacity() > usize::from(frame.is_some());
        if !room || out.try_send(Message::Text(e.to_json().into())).is_err() {
            self.untold[0].1 += 1;
            metrics.dropped(Edge::Client, 1);
            return;
        }
        if let Some(pcm) = frame {
            if out.try_send(Message::Binary(pcm.into())).is_err() {
                self.untold[0].1 += 1;
                metrics.dropped(Edge::Client, 1);
            }
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

/// What a told event means for the server's figures and the connection.
fn note(e: &ServerEvent, metrics: &Metrics, progress: &Progress) {
    let secs = |ms: Option<f64>| ms.map(|m| Duration::from_secs_f64(m.max(0.0) / 1e3));
    match e {
        ServerEvent::TurnComplete { latency, .. } => {
            metrics.turn(secs(latency.response_ms), secs(latency.first_token_ms));
        }
        ServerEvent::TurnError { .. } => metrics.turn_error(),
        ServerEvent::Voice {
            voice_latency_ms: Some(v),
            ..
        } => metrics.voice(Duration::from_secs_f64(v.max(0.0) / 1e3)),
        ServerEvent::StreamEnd { .. } => progress.stream_ended.store(true, Ordering::SeqCst),
        _ => {}
    }
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
        let text = metrics.render(&voxline_pipeline::sessions::HubTotals::default(), 1);
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
