//! voxline's language model: llama.cpp through llama-cpp-2.
//!
//! The model ([`LlmModel`]) loads once, on any thread, and can be shared;
//! its context ([`LlmEngine`]) is bound to the thread that made it, so the
//! pipeline's stage ([`LlmStage`]) creates it on its own thread when it
//! starts. The conversation lives in the
//! KV cache as one token sequence: the system prompt, then each turn. A new
//! turn is rendered with the model's own chat template, tokenised, and only
//! the tokens after the longest prefix already in the cache are evaluated —
//! so the system prompt's KV is computed once (at load) and reused every
//! turn, and so is the unchanged part of the history. When the context
//! budget is exceeded the oldest turns are dropped first. Tokens are
//! streamed to a callback as they are decoded.
//!
//! The crate's parts: the settings ([`LlmConfig`]) and errors
//! ([`LlmError`]); the loaded model, its chat template and tokeniser
//! ([`LlmModel`]); the engine and its conversation ([`LlmEngine`]); the
//! pipeline stage ([`LlmStage`]) and what it emits ([`message`]: [`Token`],
//! [`TurnComplete`], [`Stop`]); the backend trait the stage is generic
//! over ([`ChatBackend`]); many sessions on one context ([`batch`]) and
//! the worker that serves them to their stages ([`serving`]).
#![warn(missing_docs)]
// The only unsafe code moves a context's state through llama.cpp's C API
// (`LlmEngine::set_threads`), allowed there alone.
#![deny(unsafe_code)]

mod backend;
pub mod batch;
mod config;
mod engine;
mod error;
pub mod message;
mod model;
pub mod serving;
mod stage;
mod utf8;

pub use backend::ChatBackend;
pub use config::{LlmConfig, Sampling, DEFAULT_SYSTEM_PROMPT};
pub use engine::{Checkpoint, LlmEngine, Response};
pub use error::{EngineSource, LlmError};
pub use message::{
    LlmCounters, LlmOut, ServerCounts, ServerTurn, Stop, Token, TokenSource, TurnComplete,
};
pub use model::{gpu_devices, LlmModel};
pub use stage::{interrupted_answer, LlmStage, RunningLlmStage, STAGE, STAGE_NAME};
pub use utf8::Utf8Stream;
