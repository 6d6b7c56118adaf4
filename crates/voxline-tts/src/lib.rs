//! voxline's voice: the answer spoken as it streams.
//!
//! The [`TtsStage`] sits after the language model. It cuts the streamed
//! answer into speakable chunks ([`chunk`]), speaks each as soon as it is
//! complete with a [`TextToSpeech`] voice, and sends the audio on in small
//! blocks ([`VoiceOut`]). It takes committed text only, so a speculative
//! attempt's words never reach the loudspeaker.
//!
//! Two voices: [`Espeak`] (the espeak-ng program: instant, always there) and
//! [`Piper`] (a neural VITS voice on ONNX Runtime).
#![warn(missing_docs)]

pub mod chunk;
mod error;
mod message;
mod piper;
mod stage;
mod voice;

pub use chunk::Chunker;
pub use error::TtsError;
pub use message::{
    VoiceAudio, VoiceDone, VoiceEnded, VoiceInterrupted, VoiceOut, VoicePlayed, VoiceResumed,
};
pub use piper::{Piper, PiperConfig, MAX_IDS_PER_RUN};
pub use stage::{TtsStage, BLOCK_MS, STAGE, STAGE_NAME};
pub use voice::{Espeak, TextToSpeech, Until, CHUNK_LIMIT, ESPEAK_PROGRAM};
