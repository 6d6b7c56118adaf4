//! What a remote language model's server reported, in the report: one
//! answer's account ([`ServerTurnReport`], `turns[].llm_server`) and the
//! run's ([`ServerSummary`], `summary.llm_server`).

use serde::Serialize;

use crate::schema::TurnReport;
use crate::stats::Percentiles;

/// A remote language model's account of one answer, beside voxline's own
/// timing of it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServerTurnReport {
    /// The server, `host:port`.
    pub server: String,
    /// Where the token counts come from: the server's `usage`, or the
    /// streamed chunks counted (one per token assumed).
    pub tokens_from: voxline_llm::TokenSource,
    /// Prompt tokens, by the server's count.
    pub prompt_tokens: Option<u32>,
    /// Of those, tokens its prefix cache held.
    pub cached_tokens: Option<u32>,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// The server's own time on the prompt, ms (llama-server's `timings`).
    pub server_prompt_ms: Option<f64>,
    /// The server's own time generating, ms.
    pub server_decode_ms: Option<f64>,
    /// The first token's wait beyond the server's prompt time: the network
    /// both ways, the server's queue and its first decoding step, ms.
    pub network_queue_ms: Option<f64>,
}

/// A remote language model's figures over a run.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct ServerSummary {
    /// The server, `host:port`.
    pub server: String,
    /// Where the token counts come from (`usage`, `chunks`, or `usage and
    /// chunks` when the server sent `usage` for some answers only).
    pub tokens_from: String,
    /// The server's own time on the prompt, ms.
    pub server_prompt_ms: Option<Percentiles>,
    /// The first token's wait beyond it: network, queue, first step, ms.
    pub network_queue_ms: Option<Percentiles>,
    /// Decoding speed by the server's own clock, tokens/s.
    pub server_decode_tps: Option<Percentiles>,
    /// Share of the prompt tokens the server's prefix cache held.
    pub cached_share: Option<f64>,
}

impl ServerSummary {
    /// The summary of `turns`; `None` when none came from a server.
    #[must_use]
    pub fn of<'a>(turns: impl IntoIterator<Item = &'a TurnReport>) -> Option<Self> {
        let all: Vec<&ServerTurnReport> = turns
            .into_iter()
            .filter_map(|t| t.llm_server.as_ref())
            .collect();
        let first = all.first()?;
        let usage = all
            .iter()
            .filter(|s| s.tokens_from == voxline_llm::TokenSource::Usage)
            .count();
        let tokens_from = match usage {
            0 => "chunks",
            n if n == all.len() => "usage",
            _ => "usage and chunks",
        };
        let (cached, prompt) = all.iter().fold((0u64, 0u64), |(c, p), s| {
            (
                c + u64::from(s.cached_tokens.unwrap_or(0)),
                p + u64::from(s.prompt_tokens.unwrap_or(0)),
            )
        });
        let of = |f: &dyn Fn(&ServerTurnReport) -> Option<f64>| {
            Percentiles::of(&all.iter().filter_map(|s| f(s)).collect::<Vec<_>>())
        };
        Some(Self {
            server: first.server.clone(),
            tokens_from: tokens_from.to_owned(),
            server_prompt_ms: of(&|s| s.server_prompt_ms),
            network_queue_ms: of(&|s| s.network_queue_ms),
            server_decode_tps: of(&|s| {
                s.server_decode_ms
                    .filter(|&ms| ms > 0.0 && s.completion_tokens > 1)
                    .map(|ms| f64::from(s.completion_tokens - 1) / (ms / 1000.0))
            }),
            cached_share: (prompt > 0).then(|| cached as f64 / prompt as f64),
        })
    }
}
