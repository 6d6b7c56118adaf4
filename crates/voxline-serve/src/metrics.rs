//! `GET /metrics`: the server's figures in the Prometheus text format —
//! the ones the report computes (stage utilisation, tokens per second,
//! response latency, drops, errors), live.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use std::collections::BTreeMap;

#[cfg(test)]
use voxline_llm::serving::ServingTotals;
use voxline_pipeline::sessions::HubTotals;
#[cfg(test)]
use voxline_pipeline::sessions::StageBusy;

type Labels = Vec<(&'static str, String)>;

/// Response-latency buckets, s: fine around the one-second target.
const LATENCY_BUCKETS: [f64; 16] = [
    0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 20.0, 60.0,
];

/// Why a connection ended or was refused, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A session joined.
    Accepted,
    /// Every session slot was taken.
    Full,
    /// A missing or wrong token.
    BadToken,
    /// A web page of another origin tried to connect.
    BadOrigin,
    /// The hello was missing or malformed.
    BadHello,
    /// A frame after the hello was malformed.
    BadFrame,
    /// Nothing arrived for the idle timeout.
    Idle,
    /// The server was shutting down.
    Shutdown,
}

impl Outcome {
    /// The label value.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Full => "full",
            Self::BadToken => "bad_token",
            Self::BadOrigin => "bad_origin",
            Self::BadHello => "bad_hello",
            Self::BadFrame => "bad_frame",
            Self::Idle => "idle",
            Self::Shutdown => "shutdown",
        }
    }
}

/// Why the listener closed a connection before it was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// At the connection cap with none to give way: refused.
    Refused,
    /// It had sent no whole request and gave its place to a newer one.
    Evicted,
    /// It did not send a request's headers in time.
    HeaderTimeout,
    /// Its request had not finished when the shutdown's grace ran out.
    Shutdown,
}

impl Closed {
    /// The label value.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Evicted => "evicted",
            Self::HeaderTimeout => "header_timeout",
            Self::Shutdown => "shutdown",
        }
    }
}

/// Where events or audio were lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// A client's outgoing queue (a client that does not read).
    Client,
    /// A session's event queue (its bridge to the socket fell behind).
    Events,
    /// Audio a session refused (its queue was full).
    Audio,
}

impl Edge {
    /// The label value (also the `dropped` event's `edge`).
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Events => "events",
            Self::Audio => "audio",
        }
    }
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    sessions: Gauge,
    max_sessions: Gauge,
    threads: Gauge,
    peak_threads: Gauge,
    connections: Family<Labels, Counter>,
    closed: Family<Labels, Counter>,
    shutdown_dropped: Counter<f64, AtomicU64>,
    turns: Counter,
    turn_errors: Counter,
    response: Histogram,
    first_token: Histogram,
    voice: Histogram,
    busy: Family<Labels, Counter<f64, AtomicU64>>,
    utilisation: Family<Labels, Gauge<f64, AtomicU64>>,
    runs: Family<Labels, Counter>,
    tokens: Counter,
    prefill_tokens: Counter,
    prefill_busy: Counter<f64, AtomicU64>,
    decode_tps: Gauge<f64, AtomicU64>,
    prefill_tps: Gauge<f64, AtomicU64>,
    dropped: Family<Labels, Counter>,
    bottleneck: Family<Labels, Gauge>,
    engines: Family<Labels, Gauge>,
    /// The hub's totals at the last scrape (counters advance by the difference).
    last: Mutex<HubTotals>,
    started: Instant,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Registers every metric.
    #[must_use]
    pub fn new(max_sessions: usize, threads: usize) -> Self {
        let mut registry = Registry::with_prefix("voxline");
        let m = Metrics {
            sessions: Gauge::default(),
            max_sessions: Gauge::default(),
            threads: Gauge::default(),
            peak_threads: Gauge::default(),
            connections: Family::default(),
            closed: Family::default(),
            shutdown_dropped: Counter::default(),
            turns: Counter::default(),
            turn_errors: Counter::default(),
            response: Histogram::new(LATENCY_BUCKETS),
            first_token: Histogram::new(LATENCY_BUCKETS),
            voice: Histogram::new(LATENCY_BUCKETS),
            busy: Family::default(),
            utilisation: Family::default(),
            runs: Family::default(),
            tokens: Counter::default(),
            prefill_tokens: Counter::default(),
            prefill_busy: Counter::default(),
            decode_tps: Gauge::default(),
            prefill_tps: Gauge::default(),
            dropped: Family::default(),
            bottleneck: Family::default(),
            engines: Family::default(),
            last: Mutex::new(HubTotals::default()),
            started: Instant::now(),
            registry: Registry::default(),
        };
        m.max_sessions
            .set(i64::try_from(max_sessions).unwrap_or(i64::MAX));
        m.threads.set(i64::try_from(threads).unwrap_or(i64::MAX));
        let r = &mut registry;
        r.register(
            "sessions",
            "Conversations connected now",
            m.sessions.clone(),
        );
        r.register(
            "max_sessions",
            "Conversations the server holds at most",
            m.max_sessions.clone(),
        );
        r.register(
            "threads",
            "CPU threads every engine call runs with",
            m.threads.clone(),
        );
        r.register(
            "peak_threads",
            "Most engine threads that ever ran at once",
            m.peak_threads.clone(),
        );
        r.register(
            "connections",
            "WebSocket connections by outcome",
            m.connections.clone(),
        );
        r.register(
            "closed_connections",
            "TCP connections the listener closed before serving them, by reason (refused at the cap, evicted to make room, header timeout, shutdown)",
            m.closed.clone(),
        );
        r.register(
            "shutdown_dropped_audio_seconds",
            "Audio the clients had sent that had not reached the VAD when the server stopped: dropped, not transcribed",
            m.shutdown_dropped.clone(),
        );
        r.register("turns", "Turns answered", m.turns.clone());
        r.register("turn_errors", "Turns that failed", m.turn_errors.clone());
        r.register(
            "response_latency_seconds",
            "End of speech arriving -> first token leaving, per turn",
            m.response.clone(),
        );
        r.register(
            "voice_latency_seconds",
            "End of speech arriving -> the first block of the spoken answer leaving, per turn (a server with --voice)",
            m.voice.clone(),
        );
        r.register(
            "llm_first_token_seconds",
            "Transcript handed to the LLM -> its first token, per turn",
            m.first_token.clone(),
        );
        r.register(
            "stage_busy_seconds",
            "Time each stage of the pipeline worked (all sessions; the LLM's: the batching worker's compute)",
            m.busy.clone(),
        );
        r.register(
            "stage_utilisation",
            "Share of the server's uptime each stage worked",
            m.utilisation.clone(),
        );
        r.register(
            "stage_runs",
            "Calls of each stage (all sessions)",
            m.runs.clone(),
        );
        r.register(
            "tokens",
            "Answer tokens sampled, all sessions",
            m.tokens.clone(),
        );
        r.register(
            "prefill_tokens",
            "Prompt tokens evaluated, all sessions",
            m.prefill_tokens.clone(),
        );
        r.register(
            "prefill_busy_seconds",
            "Time of the LLM steps that evaluated prompt tokens",
            m.prefill_busy.clone(),
        );
        r.register(
            "decode_tokens_per_second",
            "Answer tokens of every session per second of LLM compute",
            m.decode_tps.clone(),
        );
        r.register(
            "prefill_tokens_per_second",
            "Prompt tokens per second of the steps that evaluated them",
            m.prefill_tps.clone(),
        );
        r.register(
            "dropped",
            "Events or audio lost, by edge",
            m.dropped.clone(),
        );
        r.register(
            "bottleneck",
            "1 for the stage with the largest share of the time since the start",
            m.bottleneck.clone(),
        );
        registry.register(
            "engine",
            "Each engine stage's backend (whisper, llama, remote) and where it runs (local, or the remote server's host:port): 1",
            m.engines.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Says which backend stage `stage`'s engine is and where it runs
    /// (`local`, or a remote server's `host:port`).
    pub fn engine(&self, stage: &str, backend: &str, server: &str) {
        self.engines
            .get_or_create(&vec![
                ("stage", stage.to_owned()),
                ("backend", backend.to_owned()),
                ("server", server.to_owned()),
            ])
            .set(1);
    }

    /// Counts a connection's outcome.
    pub fn connection(&self, outcome: Outcome) {
        self.connections
            .get_or_create(&vec![("outcome", outcome.label().to_owned())])
            .inc();
    }

    /// Counts a connection the listener closed.
    pub fn closed(&self, why: Closed) {
        self.closed_by(why, 1);
    }

    /// Counts `n` connections the listener closed.
    pub fn closed_by(&self, why: Closed, n: u64) {
        self.closed
            .get_or_create(&vec![("reason", why.label().to_owned())])
            .inc_by(n);
    }

    /// Counts `samples` (16 kHz) of queued audio dropped at shutdown.
    pub fn dropped_at_shutdown(&self, samples: u64) {
        self.shutdown_dropped
            .inc_by(samples as f64 / f64::from(voxline_core::SAMPLE_RATE));
    }

    /// Counts an answered turn and its latency figures.
    pub fn turn(&self, response: Option<Duration>, first_token: Option<Duration>) {
        self.turns.inc();
        if let Some(r) = response {
            self.response.observe(r.as_secs_f64());
        }
        if let Some(f) = first_token {
            self.first_token.observe(f.as_secs_f64());
        }
    }

    /// A spoken answer's first block left: its voice latency.
    pub fn voice(&self, latency: Duration) {
        self.voice.observe(latency.as_secs_f64());
    }

    /// Counts a failed turn.
    pub fn turn_error(&self) {
        self.turn_errors.inc();
    }

    /// Counts `n` things lost on `edge`.
    pub fn dropped(&self, edge: Edge, n: u64) {
        if n > 0 {
            self.dropped
                .get_or_create(&vec![("edge", edge.label().to_owned())])
                .inc_by(n);
        }
    }

    /// The text exposition, with the engines' figures brought up to `totals`
    /// and `sessions` connected.
    #[must_use]
    pub fn render(&self, totals: &HubTotals, sessions: usize) -> String {
        self.refresh(totals, sessions);
        let mut out = String::new();
        // writing into a String cannot fail
        let _ = encode(&mut out, &self.registry);
        out
    }

    fn refresh(&self, now: &HubTotals, sessions: usize) {
        let mut last = voxline_core::sync::lock(&self.last);
        let stage = |s: &str| vec![("stage", s.to_owned())];
        let up = self.started.elapsed().as_secs_f64().max(1e-9);
        let mut shares = BTreeMap::new();
        for st in &now.stages {
            let before = last.stage(&st.stage);
            self.busy
                .get_or_create(&stage(&st.stage))
                .inc_by(st.busy.saturating_sub(before.busy).as_secs_f64());
            self.runs
                .get_or_create(&stage(&st.stage))
                .inc_by(st.calls.saturating_sub(before.calls));
            let share = st.busy.as_secs_f64() / up;
            self.utilisation.get_or_create(&stage(&st.stage)).set(share);
            shares.insert(st.stage.clone(), share);
        }
        let limiting = bottleneck(&shares);
        for s in shares.keys() {
            self.bottleneck
                .get_or_create(&stage(s))
                .set(i64::from(Some(s.as_str()) == limiting));
        }
        let (llm, was) = (&now.llm, &last.llm);
        self.tokens.inc_by(llm.tokens.saturating_sub(was.tokens));
        self.prefill_tokens
            .inc_by(llm.prefill_tokens.saturating_sub(was.prefill_tokens));
        self.prefill_busy.inc_by(
            llm.prefill_busy
                .saturating_sub(was.prefill_busy)
                .as_secs_f64(),
        );
        if !llm.busy.is_zero() {
            self.decode_tps
                .set(llm.tokens as f64 / llm.busy.as_secs_f64());
        }
        if !llm.prefill_busy.is_zero() {
            self.prefill_tps
                .set(llm.prefill_tokens as f64 / llm.prefill_busy.as_secs_f64());
        }
        self.sessions
            .set(i64::try_from(sessions).unwrap_or(i64::MAX));
        self.peak_threads
            .set(i64::try_from(now.peak_threads).unwrap_or(i64::MAX));
        *last = now.clone();
    }
}

/// The stage with the largest share (`None` when none worked at all).
#[must_use]
pub fn bottleneck(shares: &BTreeMap<String, f64>) -> Option<&str> {
    shares
        .iter()
        .filter(|(_, u)| **u >= 0.01)
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(s, _)| s.as_str())
}

/// The stages' load over the last seconds (for the page's live figures).
#[derive(Debug)]
pub struct Load {
    window: Mutex<(Instant, HubTotals, BTreeMap<String, f64>)>,
}

impl Default for Load {
    fn default() -> Self {
        Load {
            window: Mutex::new((Instant::now(), HubTotals::default(), BTreeMap::new())),
        }
    }
}

impl Load {
    /// Each stage's share of the time since the window last moved (it moves
    /// when at least `every` has passed).
    pub fn utilisation(&self, now: &HubTotals, every: Duration) -> BTreeMap<String, f64> {
        let mut w = voxline_core::sync::lock(&self.window);
        let elapsed = w.0.elapsed();
        if elapsed >= every {
            let secs = elapsed.as_secs_f64().max(1e-9);
            w.2 = now
                .stages
                .iter()
                .map(|st| {
                    let busy = st.busy.saturating_sub(w.1.stage(&st.stage).busy);
                    (st.stage.clone(), busy.as_secs_f64() / secs)
                })
                .collect();
            w.0 = Instant::now();
            w.1 = now.clone();
        }
        w.2.clone()
    }
}

/// Reads the samples of a text exposition: `(name with labels, value)`.
/// For clients of `/metrics` (`bench --via`, the tests).
#[must_use]
pub fn parse_exposition(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The value of `name` (with its labels, e.g. `voxline_tokens_total` or
/// `voxline_stage_busy_seconds_total{stage="stt"}`) in parsed samples; 0 when absent.
#[must_use]
pub fn sample(samples: &[(String, f64)], name: &str) -> f64 {
    samples.iter().find(|(n, _)| n == name).map_or(0.0, |s| s.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_follows_the_hub_and_the_turns() {
        let m = Metrics::new(8, 2);
        m.connection(Outcome::Accepted);
        m.connection(Outcome::Full);
        m.turn(
            Some(Duration::from_millis(900)),
            Some(Duration::from_millis(120)),
        );
        m.turn(Some(Duration::from_millis(1_900)), None);
        m.dropped(Edge::Client, 3);
        m.engine("stt", "whisper", "local");
        m.engine("llm", "remote", "gpu1:8000");
        let totals = HubTotals {
            stages: vec![busy("stt", 3, 4), busy("upper", 0, 4), busy("llm", 1, 9)],
            llm: ServingTotals {
                busy: Duration::from_secs(1),
                tokens: 50,
                ..ServingTotals::default()
            },
            peak_threads: 2,
        };
        let text = m.render(&totals, 2);
        let s = parse_exposition(&text);
        assert_eq!(sample(&s, "voxline_sessions"), 2.0);
        assert_eq!(sample(&s, "voxline_max_sessions"), 8.0);
        assert_eq!(sample(&s, "voxline_tokens_total"), 50.0);
        assert_eq!(sample(&s, "voxline_decode_tokens_per_second"), 50.0);
        assert_eq!(
            sample(&s, r#"voxline_stage_busy_seconds_total{stage="stt"}"#),
            3.0
        );
        assert_eq!(
            sample(&s, r#"voxline_connections_total{outcome="full"}"#),
            1.0
        );
        assert_eq!(sample(&s, r#"voxline_dropped_total{edge="client"}"#), 3.0);
        assert_eq!(sample(&s, r#"voxline_bottleneck{stage="stt"}"#), 1.0);
        assert_eq!(sample(&s, r#"voxline_bottleneck{stage="llm"}"#), 0.0);
        assert_eq!(
            sample(
                &s,
                r#"voxline_engine{stage="llm",backend="remote",server="gpu1:8000"}"#
            ),
            1.0
        );
        assert_eq!(
            sample(
                &s,
                r#"voxline_engine{stage="stt",backend="whisper",server="local"}"#
            ),
            1.0
        );
        assert_eq!(
            sample(&s, r#"voxline_stage_runs_total{stage="upper"}"#),
            4.0,
            "every stage of the topology is counted"
        );
        assert_eq!(sample(&s, "voxline_response_latency_seconds_count"), 2.0);
        assert_eq!(
            sample(&s, r#"voxline_response_latency_seconds_bucket{le="1.0"}"#),
            1.0
        );
        // a second scrape adds only what changed: counters stay the hub's totals
        let mut later = totals.clone();
        later.llm.tokens = 70;
        let s2 = parse_exposition(&m.render(&later, 1));
        assert_eq!(sample(&s2, "voxline_tokens_total"), 70.0);
        assert_eq!(
            sample(&s2, r#"voxline_stage_busy_seconds_total{stage="stt"}"#),
            3.0
        );
        assert!(text.contains("# TYPE voxline_response_latency_seconds histogram"));
    }

    fn busy(stage: &str, secs: u64, calls: u64) -> StageBusy {
        StageBusy {
            stage: stage.into(),
            busy: Duration::from_secs(secs),
            calls,
        }
    }

    #[test]
    fn load_moves_with_its_window() {
        let l = Load::default();
        assert!(l
            .utilisation(&HubTotals::default(), Duration::from_secs(3600))
            .is_empty());
        let totals = HubTotals {
            stages: vec![busy("stt", 1, 1), busy("llm", 0, 0)],
            ..HubTotals::default()
        };
        let u = l.utilisation(&totals, Duration::ZERO);
        assert!(u["stt"] > 0.0 && u["llm"] == 0.0);
        assert_eq!(bottleneck(&u), Some("stt"));
        let quiet: BTreeMap<String, f64> = [("stt".into(), 0.0)].into();
        assert_eq!(bottleneck(&quiet), None);
        let busy_llm: BTreeMap<String, f64> = [("stt".into(), 0.1), ("llm".into(), 0.2)].into();
        assert_eq!(bottleneck(&busy_llm), Some("llm"));
    }
}
