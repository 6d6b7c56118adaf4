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
    assert_eq!(r.engine.n_decode_tokens, r.n_sampled - 1, "{r:?}");
    assert_eq!(r.engine.n_prefill_tokens, r.n_prefill_tokens, "{r:?}");
}

#[test]
fn an_engine_moved_to_other_threads_keeps_its_conversation_and_cache() {
    let _g = util::engine_lock();
    let s = util::settings(24);
    let mut moved =
        voxline_llm::LlmEngine::load(s.llm_config().expect("llama.cpp settings")).unwrap();
    let mut still =
        voxline_llm::LlmEngine::load(s.llm_config().expect("llama.cpp settings")).unwrap();
    let q1 = "What is the capital of France?";
    let a = moved.respond(q1, &mut |_| true).unwrap();
    let b = still.respond(q1, &mut |_| true).unwrap();
    assert_eq!(a.text, b.text);
    let (batch, decode) = moved.threads();
    let other = (batch % 2 + 1, decode % 2 + 1);
    assert!(moved.set_threads(other.0, other.1).unwrap());
    assert!(
        !moved.set_threads(other.0, other.1).unwrap(),
        "no change, no move"
    );
    assert_eq!(moved.threads(), other);
    assert_eq!(moved.cached_tokens(), still.cached_tokens());
    assert!(moved.set_threads(0, 1).is_err());
    // the cache moved whole: the next turn evaluates only its new tokens,
    // exactly as the engine that never moved, and answers the same
    let q2 = "And what is the capital of Italy?";
    let a = moved.respond(q2, &mut |_| true).unwrap();
    let b = still.respond(q2, &mut |_| true).unwrap();
    assert_eq!(a.n_prefill_tokens, b.n_prefill_tokens);
    assert!(a.n_prefill_tokens < a.n_prompt_tokens / 2, "{a:?}");
    assert_eq!(a.text, b.text);
    // and back, into the context kept from before (its cache is stale)
    assert!(moved.set_threads(batch, decode).unwrap());
    let q3 = "Which of the two is larger?";
    let a = moved.respond(q3, &mut |_| true).unwrap();
    let b = still.respond(q3, &mut |_| true).unwrap();
    assert_eq!(a.n_prefill_tokens, b.n_prefill_tokens);
    assert_eq!(a.text, b.text);
}

#[test]
fn a_full_context_drops_the_oldest_turn_without_evaluating_the_rest_again() {
    let _g = util::engine_lock();
    let mut config = util::settings(24).llm_config().expect("llama.cpp settings");
    config.n_ctx = 320;
    let mut engine = voxline_llm::LlmEngine::load(config).unwrap();
    let questions = util::QUESTIONS;
    let mut shifted = 0;
    for q in questions.iter().cycle().take(24) {
        let r = engine.respond(q, &mut |_| true).unwrap();
        assert!(!r.text.is_empty(), "{q}: empty answer");
        if r.dropped_turns > 0 {
            shifted += 1;
            // the turns that stay come from the cache: only the new turn
            // (and the tail of the previous answer) is evaluated
            assert!(
                r.n_prefill_tokens * 2 < r.n_prompt_tokens,
                "{q}: {} of {} prompt tokens evaluated again",
                r.n_prefill_tokens,
                r.n_prompt_tokens
            );
        }
        assert!(engine.cached_tokens() <= 320);
    }
    assert!(shifted >= 5, "the context filled only {shifted} times");
}

/// Asked for a GPU that is not there (every build CI makes; a CUDA build on
/// a machine without a device), both engines compute on the CPU as if not
/// asked: on the pipeline's threads, under its CPU lease. whisper's view of
/// ggml's devices and llama.cpp's are the same list (one ggml in the binary).
#[test]
fn engines_asked_for_a_missing_gpu_stay_on_the_pipelines_threads_and_lease() {
    use voxline_llm::ChatBackend;
    use voxline_stt::SpeechToText;
    let _g = util::engine_lock();
    let threads = util::threads_each();
    let whisper_sees = voxline_stt::gpu_device();
    assert_eq!(
        whisper_sees,
        voxline_llm::gpu_devices().first().cloned(),
        "whisper and llama.cpp read one ggml's devices"
    );
    if !cfg!(feature = "cuda") {
        assert_eq!(
            whisper_sees, None,
            "a build without `cuda` has no GPU device"
        );
    }
    if whisper_sees.is_some() {
        // a GPU is here: `benches/gpu/device.sh` is where that path is measured
        return;
    }

    let mut config = SttConfig::new(util::whisper_model(), threads);
    config.use_gpu = true;
    let mut stt = SttEngine::load(config).unwrap();
    assert_eq!(stt.gpu(), None);
    assert!(stt.computes_here(), "on the CPU, whisper takes the lease");
    assert_eq!(SpeechToText::threads(&stt), threads);
    let t = stt
        .transcribe(&util::read_16k(&util::fixture("q_capital.wav")))
        .unwrap();
    let expected = &util::expected_texts("q_capital.wav")[0];
    assert!(word_error_rate(expected, &t.text) <= 0.1, "{t:?}");

    let mut config = LlmConfig::new(util::llm_model(), threads);
    config.n_gpu_layers = 999;
    config.max_tokens = 8;
    let mut llm = LlmEngine::load(config).unwrap();
    assert_eq!(llm.model().gpu(), None);
    assert!(llm.computes_here(), "on the CPU, llama.cpp takes the lease");
    assert_eq!(llm.threads(), (threads, threads));
    assert_eq!(ChatBackend::adapt_threads(&mut llm).unwrap(), threads);
    let r = llm
        .respond("What is the capital of France?", &mut |_| true)
        .unwrap();
    assert!(r.n_sampled >= 1, "{r:?}");
    drop(llm);

    // the batching worker many conversations share: its steps count its
    // threads and take the lease
    let mut config = LlmConfig::new(util::llm_model(), threads);
    config.n_gpu_layers = 999;
    let opts = voxline_llm::serving::ServingOptions {
        sessions: 1,
        lease: voxline_core::CpuLease::default(),
        meter: voxline_core::ThreadMeter::default(),
    };
    let server = voxline_llm::serving::BatchServer::start(config, opts.clone()).unwrap();
    assert_eq!(server.gpu(), None);
    assert_eq!(server.threads(), threads);
    let mut client = server.client().unwrap();
    client.respond("Hello.", &mut |_| true).unwrap();
    assert_eq!(opts.meter.peak(), threads, "its steps were counted");
}
