//! The engine's errors.

use std::path::PathBuf;

/// An error of llama.cpp's, kept as the source of ours.
pub type EngineSource = Box<dyn std::error::Error + Send + Sync + 'static>;

impl LlmError {
    /// llama.cpp's error `source` while doing `what`.
    pub fn engine(
        what: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        LlmError::Engine {
            what,
            source: Box::new(source),
        }
    }
}

/// Errors of the language model engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The model file is missing, of the wrong kind or incomplete.
    #[error(transparent)]
    Model(#[from] voxline_models::ModelError),
    /// llama.cpp could not load the model or create its context.
    #[error("{path}: llama.cpp could not load this model ({source}); is it a complete GGUF? Fetch it again, or run with VOXLINE_LOG=llama-cpp-2=info for llama.cpp's reasons")]
    Load {
        /// The model file.
        path: PathBuf,
        /// llama.cpp's error (loading the model, or making a context).
        #[source]
        source: EngineSource,
    },
    /// The model has no usable chat template.
    #[error("{path}: the model has no chat template llama.cpp can apply ({source}); use an instruction-tuned GGUF with a template")]
    Template {
        /// The model file.
        path: PathBuf,
        /// llama.cpp's error (reading the template, or applying it).
        #[source]
        source: EngineSource,
    },
    /// A turn's prompt leaves no room in the context for an answer, even
    /// with no history.
    #[error("the prompt needs {needed} tokens but the context holds {n_ctx} with room for the answer; shorten what is said or the system prompt, or raise --ctx")]
    ContextFull {
        /// Tokens of the prompt.
        needed: usize,
        /// Context size.
        n_ctx: u32,
    },
    /// The system prompt leaves no room in the context for a turn and its answer.
    #[error("the system prompt needs {prompt_tokens} tokens but only {fit} fit (--ctx {n_ctx} less {max_tokens} reserved for the answer by --max-tokens, less one for what is said); shorten the system prompt, lower --max-tokens or raise --ctx")]
    SystemPromptTooLong {
        /// Tokens of the rendered system prompt.
        prompt_tokens: usize,
        /// Prompt tokens that fit.
        fit: usize,
        /// Context size.
        n_ctx: u32,
        /// Tokens reserved for generation.
        max_tokens: u32,
    },
    /// llama.cpp failed while evaluating, sampling or managing the KV cache.
    #[error("the language model failed: {what}: {source}")]
    Engine {
        /// What it was doing.
        what: &'static str,
        /// llama.cpp's error.
        #[source]
        source: EngineSource,
    },
    /// llama.cpp failed and left only a message (its backend could not
    /// start, or its state did not round-trip).
    #[error("the language model failed: {0}")]
    Failed(String),
    /// The configuration is invalid.
    #[error("{0}")]
    Config(String),
    /// Every session of a shared engine is taken.
    #[error("all {max} sessions are in use; wait for one to leave, or allow more sessions")]
    Full {
        /// The engine's session limit.
        max: usize,
    },
    /// A remote server failed the turn (unreachable, an HTTP error, a
    /// stream cut short, a malformed reply): the message names the server.
    #[error("{0}")]
    Remote(EngineSource),
    /// The shared engine's worker has stopped (it failed, or is shutting down).
    #[error("the language-model worker has stopped")]
    Stopped,
}

impl LlmError {
    /// Whose fault it is: a model or setting the user gave, or the engine.
    #[must_use]
    pub fn fault(&self) -> voxline_core::Fault {
        match self {
            Self::Model(_)
            | Self::Load { .. }
            | Self::Template { .. }
            | Self::Config(_)
            | Self::SystemPromptTooLong { .. } => voxline_core::Fault::Input,
            Self::ContextFull { .. }
            | Self::Engine { .. }
            | Self::Failed(_)
            | Self::Full { .. }
            | Self::Remote(_)
            | Self::Stopped => voxline_core::Fault::System,
        }
    }
}
