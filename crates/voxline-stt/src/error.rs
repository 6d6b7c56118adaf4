//! The engine's errors.

use std::path::PathBuf;

/// Errors of the speech-to-text engine.
#[derive(Debug, thiserror::Error)]
pub enum SttError {
    /// The model file is missing, of the wrong kind or incomplete.
    #[error(transparent)]
    Model(#[from] voxline_models::ModelError),
    /// whisper.cpp refused to load the model.
    #[error("{path}: whisper.cpp could not load this model ({detail}); run with VOXLINE_LOG=whisper_rs=info for whisper.cpp's reasons")]
    Load {
        /// The model file.
        path: PathBuf,
        /// The engine's error.
        detail: String,
    },
    /// Transcription failed inside the engine.
    #[error("whisper failed to transcribe a {audio_ms:.0} ms utterance: {detail}")]
    Transcribe {
        /// Utterance length.
        audio_ms: f64,
        /// The engine's error.
        detail: String,
    },
    /// The configuration is invalid.
    #[error("{0}")]
    Config(String),
    /// The caller's abort check stopped the transcription.
    #[error("transcription aborted")]
    Aborted,
}
