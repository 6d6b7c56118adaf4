//! Spans: the runtime's record of one stage handling one input.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::clock::Clock;
use crate::message::UtteranceId;

/// What a span covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// One call of [`Stage::process`](crate::Stage::process) (or of a sink).
    Process,
    /// The call of [`Stage::finish`](crate::Stage::finish) at end of stream.
    Finish,
}

/// One stage handling one input, timed by the runtime from outside.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// The stage's name.
    pub stage: String,
    /// The input's utterance, if any (for `Finish`: the first utterance
    /// among the outputs, if any).
    pub utterance: Option<UtteranceId>,
    /// What the span covers.
    pub kind: SpanKind,
    /// When the input was enqueued on the stage's input edge (for `Finish`:
    /// equal to `started`).
    pub enqueued: Instant,
    /// When the stage began on it.
    pub started: Instant,
    /// When the stage returned (or panicked).
    pub finished: Instant,
    /// Outputs emitted.
    pub emitted: u32,
    /// When the first output was emitted.
    pub first_emit: Option<Instant>,
    /// When the last output was emitted.
    pub last_emit: Option<Instant>,
    /// Time spent waiting for room on a full blocking output edge, or on
    /// other stages' work ([`crate::Emitter::waiting`]).
    pub emit_blocked: Duration,
    /// Items still queued on the input edge when the stage began.
    pub queue_depth_at_start: usize,
    /// Engine threads the call computed with ([`Stage::threads`](crate::Stage::threads);
    /// 0: no engine, the stage's own thread).
    pub threads: u32,
}

impl Span {
    /// How long the input waited in the queue: `started - enqueued`.
    #[must_use]
    pub fn queue_wait(&self) -> Duration {
        self.started.saturating_duration_since(self.enqueued)
    }

    /// Wall time inside the stage: `finished - started`.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.finished.saturating_duration_since(self.started)
    }

    /// Time the stage was working: [`Span::elapsed`] less the time it waited
    /// on a full output edge or on other stages' work (back-pressure and
    /// waiting are not work). Sum it over a
    /// session for the stage's utilisation.
    #[must_use]
    pub fn busy(&self) -> Duration {
        self.elapsed().saturating_sub(self.emit_blocked)
    }

    /// The cores the call kept busy, over its work: [`Span::busy`] times
    /// its engine threads (one for a stage without an engine). The CPU a
    /// call costs, as the pipeline grants it: an engine's threads work (or
    /// spin) while it computes.
    #[must_use]
    pub fn core_time(&self) -> Duration {
        self.busy() * self.threads.max(1)
    }

    /// From the start of work to the first output, if there was one.
    #[must_use]
    pub fn time_to_first_emit(&self) -> Option<Duration> {
        self.first_emit
            .map(|t| t.saturating_duration_since(self.started))
    }

    /// The span with its instants as milliseconds since `clock`'s origin,
    /// for reports and JSON.
    #[must_use]
    pub fn record(&self, clock: &Clock) -> SpanRecord {
        SpanRecord {
            stage: self.stage.clone(),
            utterance: self.utterance,
            kind: self.kind,
            enqueued_ms: clock.ms_since_origin(self.enqueued),
            started_ms: clock.ms_since_origin(self.started),
            finished_ms: clock.ms_since_origin(self.finished),
            queue_wait_ms: self.queue_wait().as_secs_f64() * 1e3,
            busy_ms: self.busy().as_secs_f64() * 1e3,
            threads: self.threads,
            emitted: self.emitted,
            first_emit_ms: self.first_emit.map(|t| clock.ms_since_origin(t)),
            last_emit_ms: self.last_emit.map(|t| clock.ms_since_origin(t)),
            emit_blocked_ms: self.emit_blocked.as_secs_f64() * 1e3,
            queue_depth_at_start: self.queue_depth_at_start,
        }
    }
}

/// A [`Span`] on the session clock in milliseconds; serializable.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpanRecord {
    /// The stage's name.
    pub stage: String,
    /// The input's utterance, if any.
    pub utterance: Option<UtteranceId>,
    /// What the span covers.
    pub kind: SpanKind,
    /// Enqueue instant, ms since the origin.
    pub enqueued_ms: f64,
    /// Start instant, ms since the origin.
    pub started_ms: f64,
    /// Finish instant, ms since the origin.
    pub finished_ms: f64,
    /// [`Span::queue_wait`] in ms.
    pub queue_wait_ms: f64,
    /// [`Span::busy`] in ms.
    pub busy_ms: f64,
    /// [`Span::threads`].
    pub threads: u32,
    /// Outputs emitted.
    pub emitted: u32,
    /// First emit, ms since the origin.
    pub first_emit_ms: Option<f64>,
    /// Last emit, ms since the origin.
    pub last_emit_ms: Option<f64>,
    /// Time blocked on a full output edge or waiting on other stages'
    /// work, in ms.
    pub emit_blocked_ms: f64,
    /// Items still queued on the input edge at the start.
    pub queue_depth_at_start: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_derive_from_instants() {
        let clock = Clock::start();
        let t0 = clock.origin();
        let span = Span {
            stage: "stt".into(),
            utterance: Some(1),
            kind: SpanKind::Process,
            enqueued: t0,
            started: t0 + Duration::from_millis(30),
            finished: t0 + Duration::from_millis(130),
            emitted: 1,
            first_emit: Some(t0 + Duration::from_millis(100)),
            last_emit: Some(t0 + Duration::from_millis(100)),
            emit_blocked: Duration::from_millis(20),
            queue_depth_at_start: 2,
            threads: 2,
        };
        assert_eq!(span.queue_wait(), Duration::from_millis(30));
        assert_eq!(span.elapsed(), Duration::from_millis(100));
        assert_eq!(span.busy(), Duration::from_millis(80));
        assert_eq!(span.core_time(), Duration::from_millis(160));
        assert_eq!(span.time_to_first_emit(), Some(Duration::from_millis(70)));
        let r = span.record(&clock);
        assert!((r.started_ms - 30.0).abs() < 1e-9);
        assert!((r.busy_ms - 80.0).abs() < 1e-9);
        assert_eq!(
            r.first_emit_ms.map(|v| (v - 100.0).abs() < 1e-9),
            Some(true)
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["kind"], "process");
        assert_eq!(v["utterance"], 1);
    }
}
