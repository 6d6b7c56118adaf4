//! What the language-model stage sends on (the edge to the voice and the
//! sink), and the events they publish: streamed [`Token`]s, then one
//! [`TurnComplete`] per turn ([`LlmOut`]). A contract between stages, so
//! the voice needs no language-model engine to read it.

use serde::{Deserialize, Serialize};

use crate::{Clock, EngineEvent, Message, PipelineEvent, UtteranceId};

/// One generated piece of the response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Token {
    /// The utterance being answered.
    pub id: UtteranceId,
    /// Position in the response, from 0.
    pub index: u32,
    /// The token's text.
    pub text: String,
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The consumer asked to stop (the session was stopped while the answer
    /// streamed).
    Cancelled,
    /// The context window filled up before the answer ended.
    ContextFull,
}

/// The engine's own token counts for one turn (llama.cpp's perf context).
/// llama-cpp-2 creates contexts with llama.cpp's perf timers off, so only
/// the counts are meaningful; times come from voxline's runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LlmCounters {
    /// Prompt tokens evaluated in batches (llama.cpp `n_p_eval`).
    pub n_prefill_tokens: u32,
    /// Tokens evaluated one at a time (llama.cpp `n_eval`).
    pub n_decode_tokens: u32,
}

/// The end of one turn: the full response and its statistics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnComplete {
    /// The utterance answered.
    pub id: UtteranceId,
    /// The transcript that was the prompt.
    pub transcript: String,
    /// The whole response.
    pub response: String,
    /// Tokens in the prompt.
    pub n_prompt_tokens: u32,
    /// Tokens generated.
    pub n_generated: u32,
    /// The engine's own counts.
    pub engine: LlmCounters,
    /// Why generation stopped.
    pub stop: Stop,
    /// Earlier turns of the conversation dropped from the prompt to fit the context.
    pub history_dropped: u32,
}

/// What the LLM stage emits: streamed tokens, then the turn's summary.
#[derive(Debug, Clone, PartialEq)]
pub enum LlmOut {
    /// One generated token.
    Token(Token),
    /// The turn is complete.
    Done(TurnComplete),
}

impl Message for Token {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn event(&self) -> Option<PipelineEvent> {
        Some(PipelineEvent::engine_event(self.clone()))
    }
}

impl Message for TurnComplete {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn event(&self) -> Option<PipelineEvent> {
        Some(PipelineEvent::engine_event(self.clone()))
    }
}

impl Message for LlmOut {
    fn utterance_id(&self) -> Option<UtteranceId> {
        match self {
            Self::Token(t) => Some(t.id),
            Self::Done(d) => Some(d.id),
        }
    }
    fn event(&self) -> Option<PipelineEvent> {
        match self {
            Self::Token(t) => t.event(),
            Self::Done(d) => d.event(),
        }
    }
}

/// A token event: `"type": "token"`, then `index` and `text`.
impl EngineEvent for Token {
    fn kind(&self) -> &'static str {
        "token"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
        #[derive(Serialize)]
        struct Fields<'a> {
            index: u32,
            text: &'a str,
        }
        serde_json::to_string(&Fields {
            index: self.index,
            text: &self.text,
        })
    }
}

/// A completed turn's event: `"type": "turn_complete"`, then the prompt, the
/// response, the counts and the stop reason.
impl EngineEvent for TurnComplete {
    fn kind(&self) -> &'static str {
        "turn_complete"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
        #[derive(Serialize)]
        struct Fields<'a> {
            transcript: &'a str,
            response: &'a str,
            n_prompt_tokens: u32,
            n_generated: u32,
            engine: &'a LlmCounters,
            stop: Stop,
        }
        serde_json::to_string(&Fields {
            transcript: &self.transcript,
            response: &self.response,
            n_prompt_tokens: self.n_prompt_tokens,
            n_generated: self.n_generated,
            engine: &self.engine,
            stop: self.stop,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn llm_events_json_have_type_and_id_and_null_sample() {
        let c = Clock::start();
        let at = c.origin() + Duration::from_millis(10);
        let tok = LlmOut::Token(Token {
            id: 4,
            index: 1,
            text: " hello".into(),
        });
        assert_eq!(tok.utterance_id(), Some(4));
        let event = tok.event().unwrap();
        assert_eq!(event.engine::<Token>().map(|t| t.index), Some(1));
        assert_eq!(
            event.to_json_line(&c, at).unwrap(),
            r#"{"type":"token","id":4,"sample":null,"t_ms":10.0,"index":1,"text":" hello"}"#
        );

        let done = LlmOut::Done(TurnComplete {
            id: 4,
            transcript: "hi".into(),
            response: " hello".into(),
            n_prompt_tokens: 20,
            n_generated: 2,
            engine: LlmCounters {
                n_prefill_tokens: 20,
                n_decode_tokens: 2,
            },
            stop: Stop::MaxTokens,
            history_dropped: 0,
        });
        let event = done.event().unwrap();
        assert!(event.engine::<Token>().is_none());
        assert_eq!(
            event.engine::<TurnComplete>().map(|d| d.stop),
            Some(Stop::MaxTokens)
        );
        assert_eq!(
            event.to_json_line(&c, at).unwrap(),
            concat!(
                r#"{"type":"turn_complete","id":4,"sample":null,"t_ms":10.0,"#,
                r#""transcript":"hi","response":" hello","n_prompt_tokens":20,"n_generated":2,"#,
                r#""engine":{"n_prefill_tokens":20,"n_decode_tokens":2},"stop":"max_tokens"}"#
            )
        );
        let v = event.to_json_value(&c, at).unwrap();
        assert_eq!(v["type"], "turn_complete");
        assert_eq!(v["engine"]["n_prefill_tokens"], 20);
    }

    #[test]
    fn stop_reasons_are_written_in_snake_case() {
        let all = [
            (Stop::EndOfGeneration, "\"end_of_generation\""),
            (Stop::MaxTokens, "\"max_tokens\""),
            (Stop::Cancelled, "\"cancelled\""),
            (Stop::ContextFull, "\"context_full\""),
        ];
        for (stop, json) in all {
            assert_eq!(serde_json::to_string(&stop).unwrap(), json);
        }
    }
}
