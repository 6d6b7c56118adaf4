//! The messages that travel between stages and that more than one stage
//! knows: audio, utterances, transcripts (with what was heard, [`Heard`]),
//! and a failed turn. The language model's tokens and turn summaries are in
//! [`crate::answer`].
//!
//! Every message names the utterance it belongs to (where it belongs to one)
//! and carries its timestamps on the session [`Clock`]: sample
//! positions in the input stream and monotonic instants.

use std::time::Instant;

use serde::Serialize;

use crate::clock::Clock;
use crate::event::PipelineEvent;

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

    /// The message as a transcript, for one that is: the runtime notes its
    /// words on the speculation board for a speculative attempt (see
    /// [`SpecBoard::words`](crate::SpecBoard::words)), and what was heard
    /// decides an answer held for speech over it
    /// ([`BargeIn::heard`](crate::BargeIn::heard)). `None` by default.
    fn transcript(&self) -> Option<&Transcript> {
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
    /// The last frame of a stream the speaker ended (a client's `end`; more
    /// audio may follow as a new stream): the VAD closes an open utterance
    /// at the frame's end instead of waiting for the hangover, and says so
    /// ([`PipelineEvent::StreamEnd`](crate::PipelineEvent::StreamEnd)).
    pub end_of_stream: bool,
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

/// What an utterance was judged to be, once, by the speech-to-text stage,
/// with its evidence. Only [`Heard::Words`] is a turn: nothing answers the
/// others, and over a held answer they let it play on. In the event and the
/// report: `{"kind": "echo", "likeness": 0.93, "by_words": false}`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Heard {
    /// The user's words: a turn.
    #[default]
    Words,
    /// No words: the recogniser wrote a sound as an annotation
    /// (`[BLANK_AUDIO]`, `(buzzing)`; no figures), or its words were judged
    /// a guess at a sound by its own figures.
    Noise {
        /// The recogniser's probability that there was no speech.
        no_speech: Option<f32>,
        /// Its mean log-probability per token of the words it guessed.
        avg_logprob: Option<f32>,
    },
    /// Only hesitations ("um… so… well…"): someone thinking aloud.
    Hesitation,
    /// The assistant's own voice come back through the microphone.
    Echo {
        /// How closely the microphone's level followed the voice's as it
        /// played (1: exactly), where it was measured.
        likeness: Option<f32>,
        /// Whether its words are word pairs the voice had just said.
        by_words: bool,
    },
    /// A listener's "uh-huh" over the assistant's answer, which plays on.
    Backchannel,
}

impl Heard {
    /// Whether this is a turn (the user's words).
    #[must_use]
    pub fn is_words(&self) -> bool {
        *self == Self::Words
    }

    /// The name the report and the transcript's annotation use (`echo`).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Words => "words",
            Self::Noise { .. } => "noise",
            Self::Hesitation => "hesitation",
            Self::Echo { .. } => "echo",
            Self::Backchannel => "backchannel",
        }
    }
}

/// The text of one utterance.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcript {
    /// The utterance's id.
    pub id: UtteranceId,
    /// The recognised text; what is no turn is shown as an annotation of
    /// its kind (`[echo: what was heard]`), which [`non_speech`] reads as
    /// no words.
    pub text: String,
    /// What it was judged to be (only [`Heard::Words`] is a turn).
    pub heard: Heard,
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

impl Transcript {
    /// Whether this is no turn: judged other than words ([`Heard`]), or the
    /// text is empty, or only the recogniser's annotations of sounds that
    /// are not speech (`[BLANK_AUDIO]`, `[Music]`, `(phone ringing)`,
    /// `*whistling*`, `♪`) and punctuation. Nothing is answered.
    #[must_use]
    pub fn is_non_speech(&self) -> bool {
        !self.heard.is_words() || non_speech(&self.text)
    }
}

/// Whether `text` holds no words outside annotations (see
/// [`Transcript::is_non_speech`]).
#[must_use]
pub fn non_speech(text: &str) -> bool {
    let mut depth = 0usize;
    let mut starred = false;
    for c in text.chars() {
        match c {
            '[' | '(' | '{' => depth += 1,
            ']' | ')' | '}' => depth = depth.saturating_sub(1),
            '*' => starred = !starred,
            _ if depth > 0 || starred => {}
            c if c.is_alphanumeric() => return false,
            _ => {}
        }
    }
    true
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
    fn transcript(&self) -> Option<&Transcript> {
        Some(self)
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
            end_of_stream: false,
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
            heard: Heard::Words,
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
        assert_eq!(v["heard"]["kind"], "words");
        assert!(!t.is_non_speech());
        // judged the voice's echo: no turn, whatever its words
        let echo = Transcript {
            text: "[echo: the capital of France]".into(),
            heard: Heard::Echo {
                likeness: Some(0.9),
                by_words: false,
            },
            ..t
        };
        assert!(echo.is_non_speech());
        let v = echo.event().unwrap().to_json_value(&c, c.origin()).unwrap();
        assert_eq!(v["heard"]["kind"], "echo");
        assert!((v["heard"]["likeness"].as_f64().unwrap() - 0.9).abs() < 1e-6);
        assert_eq!(v["heard"]["by_words"], false);
        assert_eq!(echo.heard.kind(), "echo");
    }
}

#[cfg(test)]
mod non_speech_tests {
    use super::non_speech;

    #[test]
    fn annotations_and_punctuation_are_not_speech_and_any_word_is() {
        for t in [
            "",
            " [BLANK_AUDIO]",
            "[Music]",
            "(phone ringing)",
            " (whistling) [MUSIC PLAYING]",
            "♪ ♪",
            "*sigh*",
            "...",
            "[ Silence ]",
        ] {
            assert!(non_speech(t), "{t:?}");
        }
        for t in [
            "What is the capital of France?",
            "(coughs) Hello.",
            "[Music] play it again",
            "5",
            "Oui.",
        ] {
            assert!(!non_speech(t), "{t:?}");
        }
    }
}
