//! The events sinks and the event log see: the pipeline's own (utterances,
//! transcripts, failures, drops, speculation) and those an engine's stage
//! publishes, which core carries as [`EngineEvent`]s without knowing them.
//!
//! Every event is written as one JSON object: an envelope (`"type"`, `"id"`,
//! `"sample"`, `"t_ms"`) and then the event's own fields.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::clock::Clock;
use crate::message::{Transcript, TurnError, UtteranceId, UtteranceInfo};

/// An event that belongs to one engine (for example the language model's
/// tokens): published by its stage through [`Message::event`](crate::Message::event)
/// as [`PipelineEvent::Engine`], carried and written by core, and read back
/// by type with [`PipelineEvent::engine`].
pub trait EngineEvent: Any + fmt::Debug + Send + Sync {
    /// The `"type"` tag written to JSON, e.g. `"token"`.
    fn kind(&self) -> &'static str;

    /// The utterance the event belongs to, if any.
    fn utterance_id(&self) -> Option<UtteranceId>;

    /// The stream position the event refers to, where one is meaningful.
    fn sample(&self) -> Option<u64> {
        None
    }

    /// The event's own fields as one JSON object, in the order they are
    /// written after the envelope; instants are written as milliseconds
    /// since `clock`'s origin.
    ///
    /// # Errors
    ///
    /// The serializer's error.
    fn fields_json(&self, clock: &Clock) -> Result<String, serde_json::Error>;
}

/// An [`EngineEvent`] as the pipeline carries it: shared (cheap to clone),
/// compared by value, and read back by type.
#[derive(Clone)]
pub struct AnyEngineEvent {
    event: Arc<dyn EngineEvent>,
    eq: fn(&dyn Any, &dyn Any) -> bool,
}

impl AnyEngineEvent {
    /// Wraps `event`.
    #[must_use]
    pub fn new<E: EngineEvent + PartialEq>(event: E) -> Self {
        fn same<E: PartialEq + 'static>(a: &dyn Any, b: &dyn Any) -> bool {
            matches!((a.downcast_ref::<E>(), b.downcast_ref::<E>()), (Some(a), Some(b)) if a == b)
        }
        Self {
            event: Arc::new(event),
            eq: same::<E>,
        }
    }

    /// The event, if it is an `E`.
    #[must_use]
    pub fn downcast_ref<E: EngineEvent>(&self) -> Option<&E> {
        let any: &dyn Any = &*self.event;
        any.downcast_ref::<E>()
    }

    /// The event, whatever its type.
    #[must_use]
    pub fn get(&self) -> &dyn EngineEvent {
        &*self.event
    }
}

impl fmt::Debug for AnyEngineEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.event.fmt(f)
    }
}

impl PartialEq for AnyEngineEvent {
    fn eq(&self, other: &Self) -> bool {
        let (a, b): (&dyn Any, &dyn Any) = (&*self.event, &*other.event);
        (self.eq)(a, b)
    }
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
    /// An event of one engine's own (the language model's tokens and
    /// completed turns); see [`PipelineEvent::engine`].
    Engine(AnyEngineEvent),
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
    /// The speaker went on within moments of turn `id`'s commit (see
    /// [`crate::spec::SpecBoard::release`]): the turn is taken back, the
    /// rest of what it produces is dropped, and its audio becomes the start
    /// of the next turn, which answers the whole.
    Merged {
        /// The turn taken back.
        id: UtteranceId,
        /// Stream position at which the speech that went on started.
        sample: u64,
    },
    /// The VAD reached the end of a stream the speaker ended (see
    /// [`AudioFrame::end_of_stream`](crate::AudioFrame::end_of_stream)):
    /// every utterance of the stream was sent before this event.
    StreamEnd {
        /// Stream position of the end.
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
    /// An engine's event.
    #[must_use]
    pub fn engine_event<E: EngineEvent + PartialEq>(event: E) -> Self {
        Self::Engine(AnyEngineEvent::new(event))
    }

    /// The engine event of type `E` this is, if it is one.
    #[must_use]
    pub fn engine<E: EngineEvent>(&self) -> Option<&E> {
        match self {
            Self::Engine(e) => e.downcast_ref(),
            _ => None,
        }
    }

    /// The `"type"` tag written to JSON.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Utterance(_) => "utterance",
            Self::Transcript(_) => "transcript",
            Self::Engine(e) => e.get().kind(),
            Self::TurnError(_) => "turn_error",
            Self::StageError { .. } => "stage_error",
            Self::Dropped { .. } => "dropped",
            Self::StageFailed { .. } => "stage_failed",
            Self::SpecStart { .. } => "spec_start",
            Self::SpecCancel { .. } => "spec_cancel",
            Self::Commit { .. } => "commit",
            Self::Merged { .. } => "turn_merged",
            Self::StreamEnd { .. } => "stream_end",
        }
    }

    /// The utterance the event belongs to, if any.
    #[must_use]
    pub fn utterance_id(&self) -> Option<UtteranceId> {
        match self {
            Self::Utterance(u) => Some(u.id),
            Self::Transcript(t) => Some(t.id),
            Self::Engine(e) => e.get().utterance_id(),
            Self::TurnError(e) => Some(e.id),
            Self::SpecStart { id, .. }
            | Self::SpecCancel { id, .. }
            | Self::Commit { id, .. }
            | Self::Merged { id, .. } => Some(*id),
            Self::StageError { .. }
            | Self::Dropped { .. }
            | Self::StageFailed { .. }
            | Self::StreamEnd { .. } => None,
        }
    }

    /// The stream position the event refers to, where one is meaningful: the
    /// end of speech for utterances and transcripts.
    #[must_use]
    pub fn sample(&self) -> Option<u64> {
        match self {
            Self::Utterance(u) => Some(u.end_sample),
            Self::Transcript(t) => Some(t.end_sample),
            Self::Engine(e) => e.get().sample(),
            Self::SpecStart { sample, .. }
            | Self::SpecCancel { sample, .. }
            | Self::Commit { sample, .. }
            | Self::Merged { sample, .. }
            | Self::StreamEnd { sample } => Some(*sample),
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
        let envelope = serde_json::to_string(&self.line(clock, at))?;
        let Self::Engine(e) = self else {
            return Ok(envelope);
        };
        // The envelope, then the engine's own fields in the same object.
        let fields = e.get().fields_json(clock)?;
        let inner = fields
            .strip_prefix('{')
            .and_then(|f| f.strip_suffix('}'))
            .unwrap_or_default();
        if inner.is_empty() {
            return Ok(envelope);
        }
        let mut line = envelope;
        line.pop(); // its closing brace
        line.push(',');
        line.push_str(inner);
        line.push('}');
        Ok(line)
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
        match self {
            Self::Engine(_) => serde_json::from_str(&self.to_json_line(clock, at)?),
            _ => serde_json::to_value(self.line(clock, at)),
        }
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
                heard: &t.heard,
                n_tokens: t.n_tokens,
                audio_ms: t.audio_ms,
                start_sample: t.start_sample,
                end_sample: t.end_sample,
                end_t_ms: clock.ms_since_origin(t.end_wall),
            },
            Self::TurnError(TurnError { stage, message, .. })
            | Self::StageError { stage, message }
            | Self::StageFailed { stage, message } => Body::Stage { stage, message },
            Self::Dropped { edge, count } => Body::Dropped {
                edge,
                count: *count,
            },
            // an engine's fields are written by `to_json_line`
            Self::Engine(_)
            | Self::SpecStart { .. }
            | Self::SpecCancel { .. }
            | Self::Merged { .. }
            | Self::StreamEnd { .. } => Body::Empty {},
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
        heard: &'a crate::message::Heard,
        n_tokens: u32,
        audio_ms: f64,
        start_sample: u64,
        end_sample: u64,
        end_t_ms: f64,
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

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// An engine's event, as a crate outside core would define it.
    #[derive(Debug, Clone, PartialEq, Serialize)]
    struct Chime {
        #[serde(skip)]
        id: UtteranceId,
        pitch: u32,
        name: String,
    }

    impl EngineEvent for Chime {
        fn kind(&self) -> &'static str {
            "chime"
        }
        fn utterance_id(&self) -> Option<UtteranceId> {
            Some(self.id)
        }
        fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
            serde_json::to_string(self)
        }
    }

    /// An engine event with no fields of its own.
    #[derive(Debug, Clone, PartialEq)]
    struct Tick;

    impl EngineEvent for Tick {
        fn kind(&self) -> &'static str {
            "tick"
        }
        fn utterance_id(&self) -> Option<UtteranceId> {
            None
        }
        fn sample(&self) -> Option<u64> {
            Some(5)
        }
        fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
            Ok("{}".into())
        }
    }

    fn chime(pitch: u32) -> PipelineEvent {
        PipelineEvent::engine_event(Chime {
            id: 4,
            pitch,
            name: "a \"bell\"".into(),
        })
    }

    #[test]
    fn engine_events_are_written_after_the_envelope_in_their_order() {
        let c = Clock::start();
        let at = c.origin() + std::time::Duration::from_millis(10);
        let e = chime(440);
        assert_eq!(e.kind(), "chime");
        assert_eq!(e.utterance_id(), Some(4));
        assert_eq!(
            e.to_json_line(&c, at).unwrap(),
            r#"{"type":"chime","id":4,"sample":null,"t_ms":10.0,"pitch":440,"name":"a \"bell\""}"#
        );
        let v = e.to_json_value(&c, at).unwrap();
        assert_eq!(v["pitch"], 440);
        let tick = PipelineEvent::engine_event(Tick);
        assert_eq!(
            tick.to_json_line(&c, at).unwrap(),
            r#"{"type":"tick","id":null,"sample":5,"t_ms":10.0}"#
        );
    }

    #[test]
    fn engine_events_compare_by_value_and_read_back_by_type() {
        let e = chime(440);
        assert_eq!(e, chime(440));
        assert_ne!(e, chime(220));
        assert_ne!(e, PipelineEvent::engine_event(Tick));
        assert_eq!(e.engine::<Chime>().map(|c| c.pitch), Some(440));
        assert!(e.engine::<Tick>().is_none());
        assert!(PipelineEvent::SpecStart { id: 1, sample: 2 }
            .engine::<Chime>()
            .is_none());
        assert!(format!("{e:?}").contains("Chime"));
    }

    #[test]
    fn runtime_events_json() {
        let c = Clock::start();
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
