//! Continuous batching: aggregate decode tokens/s with 1, 2, 4 and 8
//! sessions generating at once on one context, against one session.
//!
//! `cargo bench --bench batching` (VOXLINE_MODELS_DIR: the models, default
//! `models/`; VOXLINE_THREADS: threads, default the available cores).
//! Each session is asked its own question and answers up to 64 tokens; the
//! decode rate counts the tokens sampled after the step that evaluated the
//! prompts, over the time those steps took. Prints a Markdown table.

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

use std::time::Instant;

use voxline_llm::batch::{BatchEngine, StepEvent};
use voxline_llm::{LlmConfig, LlmModel};

const QUESTIONS: [&str; 8] = [
    "Tell me about the history of Paris.",
    "Describe a large animal in detail.",
    "Why is the sky blue? Explain it.",
    "Explain how spiders build their webs.",
    "How do bees make honey?",
    "Describe the planet Jupiter.",
    "How does ice form on a lake?",
    "Describe the coldest season of the year.",
];

fn main() {
    let threads = std::env::var("VOXLINE_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
    let mut config = LlmConfig::new(util::llm_model(), threads);
    config.max_tokens = 64;
    config.n_ctx = 512;
    config.sampling.temperature = 0.0;
    let model = LlmModel::load(config).unwrap();
    println!("SmolLM2-135M, {threads} threads, up to 64 tokens per answer\n");
    println!("| sessions | decode steps | tokens | aggregate decode tok/s | per session tok/s | × one session |");
    println!("|---|---|---|---|---|---|");
    let mut one = None;
    for n in [1usize, 2, 4, 8] {
        // best of three, as the machine is shared
        let mut best: Option<(usize, u32, f64)> = None;
        for _ in 0..3 {
            let mut engine = BatchEngine::new(&model, n).unwrap();
            for (i, q) in QUESTIONS.iter().take(n).enumerate() {
                engine.start(i, q).unwrap();
            }
            engine.step().unwrap(); // the prompts, and each first token
            let (mut steps, mut tokens) = (0usize, 0u32);
            let started = Instant::now();
            while engine.busy() > 0 {
                for ev in engine.step().unwrap() {
                    if let StepEvent::Token { .. } = ev {
                        tokens += 1;
                    }
                }
                steps += 1;
            }
            let secs = started.elapsed().as_secs_f64();
            let run = (steps, tokens, f64::from(tokens) / secs);
            if best.is_none_or(|b| run.2 > b.2) {
                best = Some(run);
            }
        }
        let (steps, tokens, tps) = best.unwrap();
        let base = *one.get_or_insert(tps);
        println!(
            "| {n} | {steps} | {tokens} | {tps:.0} | {:.0} | {:.2} |",
            tps / n as f64,
            tps / base
        );
    }
}
