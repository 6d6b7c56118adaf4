//! What can go wrong speaking an answer.

use std::path::PathBuf;

/// A voice could not be loaded, or could not speak a chunk.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TtsError {
    /// The espeak-ng program is missing or does not run.
    #[error("espeak-ng could not be run ({0}); install it (Debian: apt-get install espeak-ng) or run with --voice off")]
    EspeakMissing(String),
    /// espeak-ng ran and failed, or wrote something that is not audio.
    #[error("espeak-ng failed: {0}")]
    Espeak(String),
    /// A file the voice needs is not there.
    #[error("{what} {} is missing; install it with `voxline models fetch --voice piper`, or choose --voice espeak", path.display())]
    Missing {
        /// What the file is.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The ONNX Runtime library could not be loaded.
    #[error("the ONNX Runtime library {} could not be loaded ({detail}); reinstall it with `voxline models fetch --voice piper`", path.display())]
    Runtime {
        /// The library.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The voice's model or its configuration is not what Piper needs.
    #[error("{}: not a usable Piper voice ({detail}); reinstall it with `voxline models fetch --voice piper`", path.display())]
    BadVoice {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Inference failed on one chunk.
    #[error("the neural voice failed: {0}")]
    Inference(String),
    /// The chunk's answer was cancelled while it was being synthesised:
    /// nothing of it is spoken.
    #[error("the answer was cancelled while it was being spoken")]
    Cancelled,
    /// The voice took longer than its limit on one chunk and was stopped.
    #[error("the voice took over {limit_ms} ms on one chunk and was stopped; the machine may be overloaded (try --voice espeak, or fewer sessions)")]
    TooSlow {
        /// The limit, ms.
        limit_ms: u64,
    },
}
