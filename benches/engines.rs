//! The raw engines, with the same models and thread counts the pipeline
//! gives them, so "pipeline vs raw engine" is a ratio; and the thread-budget
//! split against oversubscription while both engines run at once.
//!
//! `cargo bench --bench engines` (needs `voxline models fetch`).
//! `VOXLINE_BENCH_THREADS` = the pipeline's total budget (default: all cores).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use voxline_llm::{LlmConfig, LlmEngine};
use voxline_stt::{SttConfig, SttEngine};

struct Setup {
    whisper: std::path::PathBuf,
    llm: std::path::PathBuf,
    audio: Vec<f32>,
    budget: voxline::settings::ThreadBudget,
}

fn setup() -> Setup {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let models = std::env::var_os("VOXLINE_MODELS_DIR").map_or_else(|| root.join("models"), Into::into);
    let total = std::env::var("VOXLINE_BENCH_THREADS").ok().and_then(|t| t.parse().ok());
    let mut src = voxline_audio::WavSource::open(&root.join("audio-fixtures/q_capital.wav")).unwrap();
    let mut audio = Vec::new();
    while let Some(c) = src.next_chunk().unwrap() {
        audio.extend_from_slice(&c);
    }
    Setup {
        whisper: models.join(voxline_models::registry::WHISPER_TINY_EN.file),
        llm: models.join(voxline_models::registry::SMOLLM2_135M.file),
        audio,
        budget: voxline::settings::ThreadBudget::split(total, None).unwrap(),
    }
}

fn llm(s: &Setup, threads: usize, max_tokens: u32, cache: bool) -> LlmEngine {
    let mut c = LlmConfig::new(&s.llm, threads);
    c.max_tokens = max_tokens;
    c.memory = false;
    c.cache_prompt = cache;
    c.system_prompt = "You are a helpful assistant. Answer in detail.".into();
    LlmEngine::load(c).unwrap()
}

/// Time for tokens 2..=n of one answer (the decode phase), and n − 1.
fn decode_time(e: &mut LlmEngine) -> (Duration, u64) {
    let mut stamps = Vec::new();
    e.respond("Tell me about the history of Paris.", &mut |_| {
        stamps.push(Instant::now());
        true
    })
    .unwrap();
    (stamps.last().unwrap().duration_since(stamps[0]), stamps.len() as u64 - 1)
}

fn raw_engines(c: &mut Criterion) {
    let s = setup();
    let mut g = c.benchmark_group("raw");
    g.sample_size(10).measurement_time(Duration::from_secs(15)).warm_up_time(Duration::from_secs(2));

    let mut stt = SttEngine::load(SttConfig::new(&s.whisper, s.budget.stt)).unwrap();
    g.throughput(Throughput::Elements(s.audio.len() as u64));
    g.bench_function(format!("whisper_q_capital_{}t", s.budget.stt), |b| b.iter(|| stt.transcribe(&s.audio).unwrap()));

    // prefill: the whole prompt evaluated (no cache), one token sampled
    let mut e = llm(&s, s.budget.llm, 1, false);
    let n_prompt = u64::from(e.respond("Tell me about the history of Paris.", &mut |_| true).unwrap().n_prefill_tokens);
    g.throughput(Throughput::Elements(n_prompt));
    g.bench_function(format!("llama_prefill_{n_prompt}tok_{}t", s.budget.llm), |b| b.iter(|| e.respond("Tell me about the history of Paris.", &mut |_| true).unwrap()));

    let mut e = llm(&s, s.budget.llm, 33, true);
    g.throughput(Throughput::Elements(32));
    g.bench_function(format!("llama_decode_32tok_{}t", s.budget.llm), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (d, n) = decode_time(&mut e);
                // normalise to exactly 32 tokens if the model stopped early
                total += d.mul_f64(32.0 / n.max(1) as f64);
            }
            total
        });
    });
    g.finish();
}

/// llama decode while whisper transcribes in a loop on another thread.
fn contention(c: &mut Criterion) {
    let s = setup();
    let cores = s.budget.total;
    let mut g = c.benchmark_group("contention");
    g.sample_size(10).measurement_time(Duration::from_secs(20)).warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(32));
    for (name, stt_threads, llm_threads) in [("split", s.budget.stt, s.budget.llm), ("oversubscribed", cores, cores)] {
        let stop = Arc::new(AtomicBool::new(false));
        let bg = {
            let (stop, path, audio) = (stop.clone(), s.whisper.clone(), s.audio.clone());
            std::thread::spawn(move || {
                let mut stt = SttEngine::load(SttConfig::new(&path, stt_threads)).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    stt.transcribe(&audio).unwrap();
                }
            })
        };
        let mut e = llm(&s, llm_threads, 33, true);
        g.bench_function(format!("llama_decode_with_whisper_running_{name}_{stt_threads}+{llm_threads}t_on_{cores}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (d, n) = decode_time(&mut e);
                    total += d.mul_f64(32.0 / n.max(1) as f64);
                }
                total
            });
        });
        stop.store(true, Ordering::Relaxed);
        bg.join().unwrap();
    }
    g.finish();
}

criterion_group!(benches, raw_engines, contention);
criterion_main!(benches);
