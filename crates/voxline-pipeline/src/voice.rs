//! The voice the pipeline speaks with, chosen from the command line and
//! loaded before any audio ([`VoiceChoice::load`]).

use std::path::PathBuf;

use voxline_core::Stage;
use voxline_llm::LlmOut;
use voxline_tts::{Espeak, Piper, TtsStage, VoiceOut};

use crate::BadInput;

/// A speech-synthesis stage, whichever voice it speaks with.
pub type VoiceStage = Box<dyn Stage<In = LlmOut, Out = VoiceOut> + Send>;

/// Which voice speaks the answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VoiceChoice {
    /// espeak-ng (a separate program): instant, always there.
    Espeak,
    /// A Piper voice on ONNX Runtime.
    Piper {
        /// The voice's `.onnx` (its `.onnx.json` beside it).
        model: PathBuf,
        /// `libonnxruntime.so`.
        runtime: PathBuf,
    },
}

impl VoiceChoice {
    /// The voice's name in reports (`espeak`, `piper`).
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Espeak => "espeak",
            Self::Piper { .. } => "piper",
        }
    }

    /// Loads the voice into a stage computing with `threads` threads (the
    /// neural voice; espeak-ng speaks on one).
    ///
    /// # Errors
    /// [`BadInput`] saying what is missing or broken and how to install it.
    pub fn load(&self, threads: usize) -> Result<VoiceStage, BadInput> {
        Ok(match self {
            Self::Espeak => Box::new(TtsStage::new(
                Espeak::new().map_err(BadInput::from_display)?,
            )),
            Self::Piper { model, runtime } => Box::new(TtsStage::new(
                Piper::load(model, runtime, threads).map_err(BadInput::from_display)?,
            )),
        })
    }
}
