//! Why an answer stops, on the real model: the token limit, or a context
//! that is full.

use std::path::PathBuf;

use voxline_core::{drive, StartStage, Transcript};
use voxline_llm::{LlmConfig, LlmEngine, LlmError, LlmModel, LlmStage, Stop};

/// The default language model in the repository's models directory
/// (`VOXLINE_MODELS_DIR` to look elsewhere).
fn model_path() -> PathBuf {
    std::env::var_os("VOXLINE_MODELS_DIR")
        .map_or_else(
            || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"),
            PathBuf::from,
        )
        .join(voxline_models::registry::SMOLLM2_135M.file)
}

/// A prompt the model goes on answering for a long while (greedy).
const COUNT: &str = "Count from one to one hundred in words, separated by commas, \
    and say nothing else: one, two, three, four, five, six, seven, eight, nine, ten, \
    eleven, twelve,";

fn config(n_ctx: u32, max_tokens: u32) -> LlmConfig {
    let mut c = LlmConfig::new(model_path(), 2);
    c.n_ctx = n_ctx;
    c.max_tokens = max_tokens;
    c.memory = false;
    c
}

/// Tokens of `COUNT`'s rendered prompt.
fn prompt_tokens() -> u32 {
    let mut engine = LlmEngine::load(config(512, 1)).unwrap();
    let r = engine.respond(COUNT, &mut |_| true).unwrap();
    assert_eq!(r.stop, Stop::MaxTokens, "{r:?}");
    // more than the smallest context, so the tests below can make one it fills
    assert!(r.n_prompt_tokens > 64, "{r:?}");
    r.n_prompt_tokens
}

/// The next turn's opening is evaluated while nobody waits (at load, and
/// after each answer): every turn evaluates only its words and the answer's
/// opening before its first token, and everything before them comes from
/// the cache — the second turn no more than the first, conversation or not.
#[test]
fn a_turn_evaluates_only_its_words_and_the_answers_opening() {
    const ASK: &str = "What is the capital of France?";
    for memory in [true, false] {
        let mut c = config(2048, 16);
        c.memory = memory;
        let mut engine = LlmEngine::load(c).unwrap();
        let mut prefilled = Vec::new();
        for _ in 0..2 {
            let cached = engine.cached_tokens();
            let r = engine.respond(ASK, &mut |_| true).unwrap();
            assert!(!r.text.is_empty(), "{r:?}");
            // all that is cached is used (the same question again without
            // memory: the whole prompt is, but the token that gives logits)
            let reused = (r.n_prompt_tokens - r.n_prefill_tokens) as usize;
            assert_eq!(
                reused,
                cached.min(r.n_prompt_tokens as usize - 1),
                "memory {memory}: {r:?}"
            );
            prefilled.push(r.n_prefill_tokens);
        }
        // the question's words (8 of SmolLM2's tokens) and ChatML's opening
        // of the answer (<|im_end|>, a line break, <|im_start|>,
        // "assistant", a line break); the user's opening before the words
        // (<|im_start|>, "user", a line break) was evaluated ahead
        assert!(prefilled[0] <= 13, "memory {memory}: {prefilled:?}");
        assert!(
            prefilled[1] <= prefilled[0],
            "memory {memory}: {prefilled:?}"
        );
    }
}

#[test]
fn an_answer_stops_at_its_token_limit_while_the_context_has_room() {
    let mut engine = LlmEngine::load(config(512, 6)).unwrap();
    let r = engine.respond(COUNT, &mut |_| true).unwrap();
    assert_eq!(r.stop, Stop::MaxTokens, "{r:?}");
    assert_eq!(r.n_sampled, 6);
    assert!(engine.cached_tokens() + 1 < 512);
}

#[test]
fn an_answer_that_fills_the_context_stops_with_context_full() {
    let p = prompt_tokens();
    // The prompt takes more than the context less the answer's reserve
    // (with no history to drop), and leaves room for 8 tokens.
    let n_ctx = p + 8;
    let max_tokens = n_ctx - p + 16;
    let mut engine = LlmEngine::load(config(n_ctx, max_tokens)).unwrap();
    let r = engine.respond(COUNT, &mut |_| true).unwrap();
    assert_eq!(r.stop, Stop::ContextFull, "{r:?}");
    assert!(r.n_sampled < max_tokens, "{r:?}");
    assert_eq!(r.n_prompt_tokens, p);
    // every position but the last holds a token
    assert_eq!(engine.cached_tokens() + 1, n_ctx as usize);
    assert!(!r.text.is_empty());
}

#[test]
fn a_prompt_that_leaves_no_room_for_an_answer_is_refused() {
    let p = prompt_tokens();
    let n_ctx = p;
    let err = LlmEngine::load(config(n_ctx, 4))
        .unwrap()
        .respond(COUNT, &mut |_| true)
        .unwrap_err();
    assert!(
        matches!(err, LlmError::ContextFull { needed, n_ctx: c } if needed == p as usize && c == n_ctx),
        "{err}"
    );
}

#[test]
fn a_refused_turn_is_a_turn_error_that_keeps_the_engine_error_as_its_source() {
    let p = prompt_tokens();
    let model = LlmModel::load(config(p, 4)).unwrap();
    let mut stage = LlmStage::new(model).start().unwrap();
    let said = Transcript {
        id: 7,
        text: COUNT.into(),
        heard: voxline_core::Heard::Words,
        n_tokens: 0,
        audio_ms: 0.0,
        start_sample: 0,
        end_sample: 0,
        end_wall: std::time::Instant::now(),
    };
    let err = drive(&mut stage, [said]).unwrap_err();
    assert_eq!(err.utterance, Some(7));
    assert!(!err.fatal);
    let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<LlmError>());
    assert!(
        matches!(source, Some(LlmError::ContextFull { .. })),
        "{err:?}"
    );
    // what the user reads is the engine's own message
    assert_eq!(
        err.message,
        source.map(ToString::to_string).unwrap_or_default()
    );
}
