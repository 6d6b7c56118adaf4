//! The engine's errors.

use std::path::PathBuf;

/// Errors of the speech-to-text engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SttError {
    /// The model file is missing, of the wrong kind or incomplete.
    #[error(transparent)]
    Model(#[from] voxline_models::ModelError),
    /// whisper.cpp refused to load the model.
    #[error("{path}: whisper.cpp could not load this model ({source}); run with VOXLINE_LOG=whisper_rs=info for whisper.cpp's reasons")]
    Load {
        /// The model file.
        path: PathBuf,
        /// whisper.cpp's error, or why the path cannot be handed to it.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// Transcription failed inside the engine.
    #[error("whisper failed to transcribe a {audio_ms:.0} ms utterance: {source}")]
    Transcribe {
        /// Utterance length.
        audio_ms: f64,
        /// whisper.cpp's error.
        #[source]
        source: whisper_rs::WhisperError,
    },
    /// Another in-process engine (CTranslate2) could not be loaded: its
    /// library or its model is missing or broken, or the build lacks it.
    #[error("{}: {detail}", path.display())]
    EngineLoad {
        /// The library or model directory.
        path: PathBuf,
        /// What was wrong and what to do.
        detail: String,
    },
    /// Another in-process engine failed a transcription.
    #[error("{engine} failed to transcribe a {audio_ms:.0} ms utterance: {detail}")]
    Engine {
        /// The engine's name.
        engine: &'static str,
        /// Utterance length.
        audio_ms: f64,
        /// The engine's error.
        detail: String,
    },
    /// The configuration is invalid.
    #[error("{0}")]
    Config(String),
    /// A remote server failed the transcription (unreachable, an HTTP error,
    /// a malformed reply): the message names the server.
    #[error("{0}")]
    Remote(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The caller's abort check stopped the transcription.
    #[error("transcription aborted")]
    Aborted,
}

impl SttError {
    /// Whose fault it is: a model or setting the user gave, or the engine.
    #[must_use]
    pub fn fault(&self) -> voxline_core::Fault {
        match self {
            Self::Model(_) | Self::Load { .. } | Self::EngineLoad { .. } | Self::Config(_) => {
                voxline_core::Fault::Input
            }
            Self::Transcribe { .. } | Self::Engine { .. } | Self::Remote(_) | Self::Aborted => {
                voxline_core::Fault::System
            }
        }
    }
}
