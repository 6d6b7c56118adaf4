//! voxline's speech-to-text on CTranslate2, the engine faster-whisper runs
//! on, with whisper's weights in float32 (or int8) on the CPU.
//!
//! Nothing of CTranslate2 is linked at build time. The library the
//! `ctranslate2` wheel ships is installed by `voxline models fetch`, as ONNX
//! Runtime is; at run time it is loaded first, then a small shim compiled
//! into this crate (its C ABI over CTranslate2's C++ `WhisperReplica`),
//! which resolves its symbols against it. The shim runs a transcription on
//! the caller's thread with the threads the pipeline grants for that call
//! (never the library's own choice), lets replicas share one loaded model,
//! and polls the caller's abort between the encoder's steps (it runs
//! whisper's encoder layer by layer on the model's weights, where the
//! library's one call cannot be stopped) and before the decoder.
//!
//! The log-mel features are computed here ([`voxline_audio::mel`]), the
//! tokens decoded with the model's own vocabulary; [`Ct2Engine`] implements
//! the pipeline's [`voxline_stt::SpeechToText`].
#![warn(missing_docs)]

mod engine;
mod library;
mod vocabulary;

pub use engine::{Compute, Ct2Config, Ct2Engine, MODEL_FILES};
pub use library::{built_with_engine, HEADERS_VERSION};
