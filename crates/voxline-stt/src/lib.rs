//! voxline's speech-to-text engine: whisper.cpp through whisper-rs.
//!
//! The model is loaded once and one decoding state is reused for every
//! utterance. Parameters are chosen for short, single-speaker utterances:
//! greedy decoding, one segment, no timestamps, no carried context. The
//! thread count always comes from the pipeline's CPU budget.
//!
//! Whisper's encoder normally runs a full 30 s window (1500 positions) even
//! for a 2 s question; [`AudioCtx`] can shrink that window to the utterance,
//! a large speed lever with an accuracy risk that `voxline bench` measures.
//!
//! The crate's parts: the settings ([`SttConfig`], [`AudioCtx`]) and errors
//! ([`SttError`]); the engine trait ([`SpeechToText`]) and whisper.cpp's
//! engine ([`SttEngine`]); the pipeline stage ([`SttStage`]); what is done with the text ([`normalise`],
//! [`word_error_rate`], [`join_continuation`], [`implausibly_short`]), and the
//! pieces a sparse transcript's audio is transcribed again in ([`pieces`]).
#![warn(missing_docs)]

mod backend;
mod config;
mod engine;
mod error;
mod normalise;
mod pieces;
mod stage;
mod text;

pub use backend::SpeechToText;
pub use config::{AudioCtx, SttConfig};
pub use engine::{gpu_device, Confidence, SttEngine, Transcription};
pub use error::SttError;
pub use normalise::normalise;
pub use pieces::{
    compact_pauses, pieces, quiet_cuts, sounding_s, COMPACT_AFTER_S, KEPT_PAUSE_MS, LONG_PAUSE_MS,
    MAX_PIECE_S,
};
pub use stage::{SttStage, STAGE, STAGE_NAME};
pub use text::{
    hesitation_only, implausibly_short, join_continuation, not_words, word_error_rate,
    CHECKED_AFTER_S, MAX_OVERLAP_WORDS, MIN_WORDS_PER_S, NOISE_MIN_NO_SPEECH, OVERLAP_SLACK_WORDS,
    UNSURE_MAX_AVG_LOGPROB, UNSURE_MIN_NO_SPEECH,
};

/// Encoder positions per second of audio (1500 for 30 s).
pub const POSITIONS_PER_SECOND: f64 = 50.0;
/// Encoder positions in whisper's whole 30 s window.
pub const MAX_POSITIONS: u32 = 1500;
/// Sample rate whisper expects.
pub const SAMPLE_RATE: u32 = voxline_core::SAMPLE_RATE;
