//! The messages that travel between stages, and the events sinks see.
//!
//! Every message names the utterance it belongs to (where it belongs to one)
//! and carries its timestamps on the session [`Clock`]: sample
//! positions in the input stream and monotonic instants.

use std::time::Instant;

use serde::Serialize;

use crate::clock::Clock;

/// Identifies one utterance, and so one turn, across all stages.
pub type UtteranceId = u64;

/// Something a stage can receive or emit.
pub trait Message: Send + 'static {
    /// The utterance this message belongs to, if any.
    fn utterance_id(&self) -> Option<UtteranceId>;

    /// The event the runtime publishes on the [`EventBus`](crate::EventBus)
    /// when a stage emits this message; `None` (the default) publishes
    /// nothing.
    fn event(&self) -> Option<PipelineEvent> {
        None
    }
}

/// A block of input audio: 16 kHz mono `f32` samples.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioFrame {
    /// Stream position of the first sample.
    pub start_sample: u64,
    /// The samples, mono at [`SAMPLE_RATE`](crate::SAMPLE_RATE).
    pub samples: Vec<f32>,
    /// When the first sample was captured (live) or due (replay).
    pub captured: Instant,
    /// The first frame of a new recording (replay of several files): nothing
    /// before it belongs with it, so the endpointer's pre-roll does not
    /// reach back past it.
    pub new_recording: bool,
}

impl AudioFrame {
    /// Stream position one past the last sample.
    #[must_use]
    pub fn end_sample(&self) -> u64 {
        self.start_sample + self.samples.len() as u64
    }
}

/// One stretch of speech cut out by the endpointer.
#[derive(Debug, Clone, PartialEq)]
pub struct Utterance {
    /// The utterance's id.
    pub id: UtteranceId,
    /// Stream position of the first sample.
    pub start_sample: u64,
    /// Stream position one past the last sample (the end of speech).
    pub end_sample: u64,
    /// The audio, 16 kHz mono.
    pub samples: Vec<f32>,
    /// When the end sample was captured (live) or due (replay).
    pub end_wall: Instant,
    /// True when the endpointer cut the utterance at its maximum length
    /// rather than at a pause: the next utterance [`continues`](Self::continues) it.
    pub forced_split: bool,
    /// Stream position at which the endpointer closed the utterance (end
    /// of speech plus the hangover it waited for): `closed_sample -
    /// end_sample` is the endpoint delay in audio time.
    pub closed_sample: u64,
    /// The forced-split utterance this one is the rest of, if any. A
    /// speculative attempt on the rest carries it too; an attempt itself is
    /// never a forced split.
    pub continues: Option<UtteranceId>,
    /// How many leading samples repeat the end of the utterance this one
    /// [`continues`](Self::continues) (lead-in, so the recogniser hears the
    /// words around the cut in context); 0 when it continues nothing.
    pub overlap_samples: u64,
}

impl Utterance {
    /// Length of the utterance in milliseconds, from its sample positions.
    #[must_use]
    pub fn duration_ms(&self) -> f64 {
        Clock::samples_to_ms(self.end_sample.saturating_sub(self.start_sample))
    }
}

/// An utterance's metadata without its samples, as published in events.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UtteranceInfo {
    /// The utterance's id.
    pub id: UtteranceId,
    /// Stream position of the first sample.
    pub start_sample: u64,
    /// Stream position one past the last sample.
    pub end_sample: u64,
    /// When the end sample was captured or due.
    pub end_wall: Instant,
    /// True when cut at the maximum length.
    pub forced_split: bool,
    /// Stream position at which the endpointer closed it.
    pub closed_sample: u64,
    /// The forced-split utterance this one continues, if any.
    pub continues: Option<UtteranceId>,
    /// Leading samples that repeat the end of the one it continues.
    pub overlap_samples: u64,
}

impl UtteranceInfo {
    /// Length in milliseconds, from the sample positions.
    #[must_use]
    pub fn duration_ms(&self) -> f64 {
        Clock::samples_to_ms(self.end_sample.saturating_sub(self.start_sample))
    }
}

impl From<&Utterance> for UtteranceInfo {
    fn from(u: &Utterance) -> Self {
        Self {
            id: u.id,
            start_sample: u.start_sample,
            end_sample: u.end_sample,
            end_wall: u.end_wall,
            forced_split: u.forced_split,
            closed_sample: u.closed_sample,
            continues: u.continues,
            overlap_samples: u.overlap_samples,
        }
    }
}

/// The text of one utterance.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcript {
    /// The utterance's id.
    pub id: UtteranceId,
    /// The recognised text.
    pub text: String,
    /// Number of text tokens the recogniser produced.
    pub n_tokens: u32,
    /// Length of the transcribed audio in milliseconds.
    pub audio_ms: f64,
    /// Stream position of the utterance's first sample.
    pub start_sample: u64,
    /// Stream position one past the utterance's last sample.
    pub end_sample: u64,
    /// When the end sample was captured or due (carried over from the
    /// utterance, for end-to-end latency).
    pub end_wall: Instant,
}

/// One generated piece of the response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Token {
    /// The utterance being answered.
    pub id: UtteranceId,
    /// Position in the response, from 0.
    pub index: u32,
    /// The token's text.
    pub text: String,
}

/// Why the LLM stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced its end-of-generation token.
    EndOfGeneration,
    /// The response reached its token limit.
    MaxTokens,
    /// The context window is full.
    ContextFull,
    /// The session was stopped while the answer streamed.
    Cancelled,
}

/// What the LLM engine reported about its own work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LlmEngineTimings {
    /// Prompt tokens evaluated.
    pub n_prefill_tokens: u32,
    /// Tokens generated.
    pub n_decode_tokens: u32,
}

/// The end of one turn: the full response and its statistics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnComplete {
    /// The utterance answered.
    pub id: UtteranceId,
    /// The transcript that was the prompt.
    pub transcript: String,
    /// The whole response.
    pub response: String,
    /// Tokens in the prompt.
    pub n_prompt_tokens: u32,
    /// Tokens generated.
    pub n_generated: u32,
    /// The engine's own timings.
    pub engine: LlmEngineTimings,
    /// Why generation stopped.
    pub stop: StopReason,
    /// Earlier turns of the conversation dropped from the prompt to fit the context.
    pub history_dropped: u32,
}

/// A turn that failed in one stage; the pipeline goes on with the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TurnError {
    /// The utterance whose turn failed.
    pub id: UtteranceId,
    /// The stage in which it failed.
    pub stage: String,
    /// What went wrong.
    pub message: String,
}

/// What the LLM stage emits: streamed tokens, then the turn's summary.
#[derive(Debug, Clone, PartialEq)]
pub enum LlmOut {
    /// One generated token.
    Token(Token),
    /// The turn is complete.
    Done(TurnComplete),
}

/// An event for sinks and the event log.
///
/// [`TimedEvent::to_json_line`] writes it as one JSON object with a `"type"`
/// tag, the utterance `"id"` (or `null`), `"sample"` (the stream position
/// where one is meaningful, else `null`) and `"t_ms"` (milliseconds since the
/// clock origin), plus the variant's fields; instants inside the event are
/// written as milliseconds since the origin too (`"end_t_ms"`).
#[derive(Debug, Clone, PartialEq)]
pub enum PipelineEvent {
    /// The endpointer closed an utterance.
    Utterance(UtteranceInfo),
    /// A transcript is ready.
    Transcript(Transcript),
    /// The LLM generated a token.
    Token(Token),
    /// The LLM finished a turn.
    TurnComplete(TurnComplete),
    /// A turn failed in one stage.
    TurnError(TurnError),
    /// A stage reported a non-fatal error that belongs to no utterance.
    StageError {
        /// The stage.
        stage: String,
        /// What went wrong.
        message: String,
    },
    /// A drop-oldest edge discarded items.
    Dropped {
        /// The edge's name.
        edge: String,
        /// How many items were discarded since the last report.
        count: u64,
    },
    /// The endpointer sent utterance `id` early, after a short silence
    /// (a speculative attempt; see [`crate::spec`]).
    SpecStart {
        /// The attempt's utterance id.
        id: UtteranceId,
        /// Stream position at which it was sent.
        sample: u64,
    },
    /// Speech resumed before the turn's end was confirmed: attempt `id` is
    /// thrown away, and nothing it produced is shown.
    SpecCancel {
        /// The attempt's utterance id.
        id: UtteranceId,
        /// Stream position at which speech resumed.
        sample: u64,
    },
    /// The hangover confirmed the end of the turn: attempt `id` is the turn,
    /// and what it produced is released.
    Commit {
        /// The attempt's utterance id.
        id: UtteranceId,
        /// Stream position at which the attempt was sent.
        spec_sample: u64,
        /// Stream position at which the end was confirmed.
        sample: u64,
    },
    /// A stage failed fatally (error or panic); the pipeline shuts down.
    StageFailed {
        /// The stage.
        stage: String,
        /// What went wrong.
        message: String,
    },
}

impl PipelineEvent {
    /// The `"type"` tag written to JSON.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Utterance(_) => "utterance",
            Self::Transcript(_) => "transcript",
            Self::Token(_) => "token",
            Self::TurnComplete(_) => "turn_complete",
            Self::TurnError(_) => "turn_error",
            Self::StageError { .. } => "stage_error",
            Self::Dropped { .. } => "dropped",
            Self::StageFailed { .. } => "stage_failed",
            Self::SpecStart { .. } => "spec_start",
            Self::SpecCancel { .. } => "spec_cancel",
            Self::Commit { .. } => "commit",
        }
    }

    /// The utterance the event belongs to, if any.
    #[must_use]
    pub fn utterance_id(&self) -> Option<UtteranceId> {
        match self {
            Self::Utterance(u) => Some(u.id),
            Self::Transcript(t) => Some(t.id),
            Self::Token(t) => Some(t.id),
            Self::TurnComplete(t) => Some(t.id),
            Self::TurnError(e) => Some(e.id),
            Self::SpecStart { id, .. } | Self::SpecCancel { id, .. } | Self::Commit { id, .. } => {
                Some(*id)
            }
            Self::StageError { .. } | Self::Dropped { .. } | Self::StageFailed { .. } => None,
        }
    }

    /// The stream position the event refers to, where one is meaningful: the
    /// end of speech for utterances and transcripts.
    #[must_use]
    pub fn sample(&self) -> Option<u64> {
        match self {
            Self::Utterance(u) => Some(u.end_sample),
            Self::Transcript(t) => Some(t.end_sample),
            Self::SpecStart { sample, .. }
            | Self::SpecCancel { sample, .. }
            | Self::Commit { sample, .. } => Some(*sample),
            _ => None,
        }
    }

    /// The event as one line of JSON (no trailing newline), stamped `at` on
    /// `clock`.
    ///
    /// # Errors
    ///
    /// Returns the serializer's error; the event types contain nothing
    /// `serde_json` rejects, so this does not happen in practice.
    pub fn to_json_line(&self, clock: &Clock, at: Instant) -> Result<String, serde_json::Error> {
        serde_json::to_string(&self.line(clock, at))
    }

    /// The event as a JSON value, stamped `at` on `clock`.
    ///
    /// # Errors
    ///
    /// As [`PipelineEvent::to_json_line`].
    pub fn to_json_value(
        &self,
        clock: &Clock,
        at: Instant,
    ) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(self.line(clock, at))
    }

    fn line<'a>(&'a self, clock: &Clock, at: Instant) -> EventLine<'a> {
        let body = match self {
            Self::Utterance(u) => Body::Utterance {
                start_sample: u.start_sample,
                end_sample: u.end_sample,
                duration_ms: u.duration_ms(),
                forced_split: u.forced_split,
                closed_sample: u.closed_sample,
                continues: u.continues,
                overlap_samples: u.overlap_samples,
                end_t_ms: clock.ms_since_origin(u.end_wall),
            },
            Self::Transcript(t) => Body::Transcript {
                text: &t.text,
                n_tokens: t.n_tokens,
                audio_ms: t.audio_ms,
                start_sample: t.start_sample,
                end_sample: t.end_sample,
                end_t_ms: clock.ms_since_origin(t.end_wall),
            },
            Self::Token(t) => Body::Token {
                index: t.index,
                text: &t.text,
            },
            Self::TurnComplete(t) => Body::TurnComplete {
                transcript: &t.transcript,
                response: &t.response,
                n_prompt_tokens: t.n_prompt_tokens,
                n_generated: t.n_generated,
                engine: &t.engine,
                stop: t.stop,
            },
            Self::TurnError(TurnError { stage, message, .. })
            | Self::StageError { stage, message }
            | Self::StageFailed { stage, message } => Body::Stage { stage, message },
            Self::Dropped { edge, count } => Body::Dropped {
                edge,
                count: *count,
            },
            Self::SpecStart { .. } | Self::SpecCancel { .. } => Body::Empty {},
            Self::Commit { spec_sample, .. } => Body::Commit {
                spec_sample: *spec_sample,
            },
        };
        EventLine {
            kind: self.kind(),
            id: self.utterance_id(),
            sample: self.sample(),
            t_ms: clock.ms_since_origin(at),
            body,
        }
    }
}

/// The JSON shape of an event: common fields, then the variant's own.
#[derive(Serialize)]
struct EventLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: Option<UtteranceId>,
    sample: Option<u64>,
    t_ms: f64,
    #[serde(flatten)]
    body: Body<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Body<'a> {
    Utterance {
        start_sample: u64,
        end_sample: u64,
        duration_ms: f64,
        forced_split: bool,
        closed_sample: u64,
        continues: Option<UtteranceId>,
        overlap_samples: u64,
        end_t_ms: f64,
    },
    Transcript {
        text: &'a str,
        n_tokens: u32,
        audio_ms: f64,
        start_sample: u64,
        end_sample: u64,
        end_t_ms: f64,
    },
    Token {
        index: u32,
        text: &'a str,
    },
    TurnComplete {
        transcript: &'a str,
        response: &'a str,
        n_prompt_tokens: u32,
        n_generated: u32,
        engine: &'a LlmEngineTimings,
        stop: StopReason,
    },
    Stage {
        stage: &'a str,
        message: &'a str,
    },
    Dropped {
        edge: &'a str,
        count: u64,
    },
    Commit {
        spec_sample: u64,
    },
    Empty {},
}

/// An event with the instant it happened, as carried by the event bus.
#[derive(Debug, Clone, PartialEq)]
pub struct TimedEvent {
    /// When the event happened (for emitted messages: the emit instant).
    pub at: Instant,
    /// The event.
    pub event: PipelineEvent,
}

impl TimedEvent {
    /// The event as one line of JSON, stamped with its own instant.
    ///
    /// # Errors
    ///
    /// As [`PipelineEvent::to_json_line`].
    pub fn to_json_line(&self, clock: &Clock) -> Result<String, serde_json::Error> {
        self.event.to_json_line(clock, self.at)
    }
}

impl Message for AudioFrame {
    fn utterance_id(&self) -> Option<UtteranceId> {
        None
    }
}

impl Message for Utterance {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn event(&self) -> Option<PipelineEvent> {
        Some(PipelineEvent::Utterance(UtteranceInfo::from(self)))
    }
}

impl Message for Transcript {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn event(&self) -> Option<PipelineEvent> {
        Some(PipelineEvent::Transcript(self.clone()))
    }
}

impl Message for Token {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn event(&self) -> Option<PipelineEvent> {
        Some(PipelineEvent::Token(self.clone()))
    }
}

impl Message for TurnComplete {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn event(&self) -> Option<PipelineEvent> {
        Some(PipelineEvent::TurnComplete(self.clone()))
    }
}

impl Message for TurnError {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn event(&self) -> Option<PipelineEvent> {
        Some(PipelineEvent::TurnError(self.clone()))
    }
}

impl Message for LlmOut {
    fn utterance_id(&self) -> Option<UtteranceId> {
        match self {
            Self::Token(t) => Some(t.id),
            Self::Done(d) => Some(d.id),
        }
    }
    fn event(&self) -> Option<PipelineEvent> {
        match self {
            Self::Token(t) => t.event(),
            Self::Done(d) => d.event(),
        }
    }
}

/// The unit message: for stages whose output nobody reads.
impl Message for () {
    fn utterance_id(&self) -> Option<UtteranceId> {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::Value;

    use super::*;

    fn clock() -> Clock {
        Clock::start()
    }

    #[test]
    fn utterance_duration_comes_from_sample_positions() {
        let c = clock();
        let u = Utterance {
            id: 3,
            start_sample: 16_000,
            end_sample: 40_000,
            samples: vec![0.0; 24_000],
            end_wall: c.sample_due(40_000),
            forced_split: false,
            closed_sample: 48_000,
            continues: None,
            overlap_samples: 0,
        };
        assert_eq!(u.duration_ms(), 1_500.0);
        assert_eq!(UtteranceInfo::from(&u).duration_ms(), 1_500.0);
        assert_eq!(u.utterance_id(), Some(3));
    }

    #[test]
    fn audio_frame_has_no_utterance_and_publishes_nothing() {
        let f = AudioFrame {
            start_sample: 256,
            samples: vec![0.0; 256],
            captured: Instant::now(),
            new_recording: false,
        };
        assert_eq!(f.utterance_id(), None);
        assert!(f.event().is_none());
        assert_eq!(f.end_sample(), 512);
    }

    #[test]
    fn utterance_event_json_has_type_id_both_clocks_and_no_samples() {
        let c = clock();
        let u = Utterance {
            id: 7,
            start_sample: 8_000,
            end_sample: 24_000,
            samples: vec![0.25; 16_000],
            end_wall: c.sample_due(24_000),
            forced_split: false,
            closed_sample: 32_000,
            continues: Some(6),
            overlap_samples: 12_800,
        };
        let event = u.event().expect("utterances publish an event");
        let at = c.origin() + Duration::from_millis(1_600);
        let line = event.to_json_line(&c, at).expect("serializes");
        assert!(!line.contains('\n'));
        let v: Value = serde_json::from_str(&line).expect("valid JSON");
        assert_eq!(v["type"], "utterance");
        assert_eq!(v["id"], 7);
        assert_eq!(v["sample"], 24_000);
        assert!((v["t_ms"].as_f64().unwrap() - 1_600.0).abs() < 1e-6);
        assert!((v["end_t_ms"].as_f64().unwrap() - 1_500.0).abs() < 1e-6);
        assert_eq!(v["duration_ms"], 1_000.0);
        assert_eq!(v["forced_split"], false);
        assert_eq!(v["continues"], 6);
        assert_eq!(v["overlap_samples"], 12_800);
        assert!(v.get("samples").is_none());
    }

    #[test]
    fn transcript_event_json_carries_tokens_and_audio_length() {
        let c = clock();
        let t = Transcript {
            id: 2,
            text: "what time is it".into(),
            n_tokens: 5,
            audio_ms: 1_200.0,
            start_sample: 100,
            end_sample: 19_300,
            end_wall: c.sample_due(19_300),
        };
        let v = t
            .event()
            .unwrap()
            .to_json_value(&c, c.origin() + Duration::from_secs(2))
            .unwrap();
        assert_eq!(v["type"], "transcript");
        assert_eq!(v["id"], 2);
        assert_eq!(v["sample"], 19_300);
        assert!((v["t_ms"].as_f64().unwrap() - 2_000.0).abs() < 1e-6);
        assert_eq!(v["text"], "what time is it");
        assert_eq!(v["n_tokens"], 5);
        assert_eq!(v["audio_ms"], 1_200.0);
    }

    #[test]
    fn llm_events_json_have_type_and_id_and_null_sample() {
        let c = clock();
        let at = c.origin() + Duration::from_millis(10);
        let tok = LlmOut::Token(Token {
            id: 4,
            index: 1,
            text: " hello".into(),
        });
        assert_eq!(tok.utterance_id(), Some(4));
        let v = tok.event().unwrap().to_json_value(&c, at).unwrap();
        assert_eq!(v["type"], "token");
        assert_eq!(v["id"], 4);
        assert_eq!(v["index"], 1);
        assert_eq!(v["text"], " hello");
        assert!(v["sample"].is_null());
        assert!((v["t_ms"].as_f64().unwrap() - 10.0).abs() < 1e-6);

        let done = LlmOut::Done(TurnComplete {
            id: 4,
            transcript: "hi".into(),
            response: " hello".into(),
            n_prompt_tokens: 20,
            n_generated: 2,
            engine: LlmEngineTimings {
                n_prefill_tokens: 20,
                n_decode_tokens: 2,
            },
            stop: StopReason::MaxTokens,
            history_dropped: 0,
        });
        let v = done.event().unwrap().to_json_value(&c, at).unwrap();
        assert_eq!(v["type"], "turn_complete");
        assert_eq!(v["id"], 4);
        assert_eq!(v["stop"], "max_tokens");
        assert_eq!(v["engine"]["n_prefill_tokens"], 20);
    }

    #[test]
    fn runtime_events_json() {
        let c = clock();
        let at = c.origin();
        let timed = TimedEvent {
            at,
            event: PipelineEvent::TurnError(TurnError {
                id: 9,
                stage: "stt".into(),
                message: "empty audio".into(),
            }),
        };
        let v: Value = serde_json::from_str(&timed.to_json_line(&c).unwrap()).unwrap();
        assert_eq!(v["type"], "turn_error");
        assert_eq!(v["id"], 9);
        assert_eq!(v["stage"], "stt");
        assert_eq!(v["message"], "empty audio");
        assert_eq!(v["t_ms"], 0.0);

        let dropped = PipelineEvent::Dropped {
            edge: "audio".into(),
            count: 3,
        };
        let v = dropped.to_json_value(&c, at).unwrap();
        assert_eq!(v["type"], "dropped");
        assert!(v["id"].is_null());
        assert_eq!(v["edge"], "audio");
        assert_eq!(v["count"], 3);

        let failed = PipelineEvent::StageFailed {
            stage: "llm".into(),
            message: "panicked".into(),
        };
        let v = failed.to_json_value(&c, at).unwrap();
        assert_eq!(v["type"], "stage_failed");
        assert_eq!(v["stage"], "llm");
    }
}
