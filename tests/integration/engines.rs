//! Both engines in one process, on the real models: the one-ggml build works.

use crate::util;
use voxline_llm::{LlmConfig, LlmEngine};
use voxline_stt::{word_error_rate, SttConfig, SttEngine};

#[test]
fn whisper_then_llama_in_one_process() {
    let _g = util::engine_lock();
    let threads = util::threads_each();
    let mut stt = SttEngine::load(SttConfig::new(util::whisper_model(), threads)).unwrap();
    let audio = util::read_16k(&util::fixture("q_capital.wav"));
    let t = stt.transcribe(&audio).unwrap();
    let expected = &util::expected_texts("q_capital.wav")[0];
    let wer = word_error_rate(expected, &t.text);
    assert!(
        wer <= 0.1,
        "transcript {:?} vs {expected:?}: WER {wer}",
        t.text
    );
    assert!(t.n_tokens >= 5, "{t:?}");

    let mut config = LlmConfig::new(util::llm_model(), threads);
    config.max_tokens = 32;
    config.system_prompt = "You are a helpful assistant. Answer at length.".into();
    let mut llm = LlmEngine::load(config).unwrap();
    let mut pieces = Vec::new();
    let r = llm
        .respond(&t.text, &mut |p| {
            pieces.push(p.to_string());
            true
        })
        .unwrap();
    assert!(
        r.n_sampled >= 16,
        "only {} tokens: {:?}",
        r.n_sampled,
        r.text
    );
    assert_eq!(pieces.concat().trim(), r.text);
    // The engine's own counters agree with ours: every sampled token but the
    // last was evaluated one at a time; the prompt tail was evaluated in a batch.
    assert_eq!(r.engine.n_eval, r.n_sampled - 1, "{r:?}");
    assert_eq!(r.engine.n_p_eval, r.n_prefill_tokens, "{r:?}");
}
