//! What the language-model stage emits ([`LlmOut`]: streamed [`Token`]s,
//! then one [`TurnComplete`] per turn; the types are the core's, the
//! contract with the stages after it), and a remote server's own figures
//! ([`ServerTurn`]).

use serde::{Deserialize, Serialize};
use voxline_core::{Clock, EngineEvent, UtteranceId};

pub use voxline_core::answer::{LlmCounters, LlmOut, Stop, Token, TurnComplete};

/// Where a remote answer's token counts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The server's own `usage` (its tokeniser's counts).
    Usage,
    /// The content chunks, counted (one per token assumed): the server sent
    /// no `usage`.
    Chunks,
}

/// What a remote server reported about one answer, beside its text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerCounts {
    /// The server, as `host:port`.
    pub server: String,
    /// Where the token counts come from.
    pub tokens_from: TokenSource,
    /// Tokens of the prompt, by the server's `usage`.
    pub prompt_tokens: Option<u32>,
    /// Of those, tokens the server's prefix cache held.
    pub cached_tokens: Option<u32>,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// The server's own time evaluating the prompt, ms (llama-server's
    /// `timings.prompt_ms`), where it reports one.
    pub prompt_ms: Option<f64>,
    /// The server's own time generating, ms (`timings.predicted_ms`).
    pub decode_ms: Option<f64>,
}

/// A remote answer's server figures, published by the language-model stage
/// after the turn's [`TurnComplete`]: `"type": "llm_server"`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerTurn {
    /// The utterance answered.
    pub id: UtteranceId,
    /// What the server reported.
    pub counts: ServerCounts,
}

impl EngineEvent for ServerTurn {
    fn kind(&self) -> &'static str {
        "llm_server"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
        serde_json::to_string(&self.counts)
    }
}
