//! The engine's settings.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Sampling settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Temperature; 0 means greedy (deterministic).
    pub temperature: f32,
    /// Top-k (0 = off).
    pub top_k: i32,
    /// Top-p (1.0 = off).
    pub top_p: f32,
    /// Seed for the random sampler.
    pub seed: u32,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            seed: 42,
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmConfig {
    /// The GGUF model.
    pub model: PathBuf,
    /// CPU threads for prompt evaluation (from the pipeline's budget; never the engine's default).
    pub threads: usize,
    /// CPU threads for decoding one token at a time.
    pub decode_threads: usize,
    /// Layers to offload to a GPU (0 = CPU only; needs the `cuda` feature).
    pub n_gpu_layers: u32,
    /// Context size in tokens.
    pub n_ctx: u32,
    /// Most tokens generated per turn.
    pub max_tokens: u32,
    /// Sampling.
    pub sampling: Sampling,
    /// The system prompt.
    pub system_prompt: String,
    /// Keep the system prompt and history in the KV cache across turns
    /// (off = evaluate the whole prompt every turn; for A/B comparisons).
    pub cache_prompt: bool,
    /// Remember earlier turns (off = each turn sees only the system prompt).
    pub memory: bool,
}

/// The default system prompt: short answers suit a voice assistant.
pub const DEFAULT_SYSTEM_PROMPT: &str =
    "You are a helpful voice assistant. Answer in one or two short sentences.";

impl LlmConfig {
    /// Settings for `model` with `threads` threads and defaults otherwise.
    #[must_use]
    pub fn new(model: impl Into<PathBuf>, threads: usize) -> Self {
        Self {
            model: model.into(),
            threads,
            decode_threads: threads,
            n_gpu_layers: 0,
            n_ctx: 2048,
            max_tokens: 64,
            sampling: Sampling::default(),
            system_prompt: DEFAULT_SYSTEM_PROMPT.into(),
            cache_prompt: true,
            memory: true,
        }
    }
}
