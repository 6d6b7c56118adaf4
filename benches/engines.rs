//! The raw engines, with the same models and thread counts the pipeline
//! gives them, so "pipeline vs raw engine" is a ratio; and the thread-budget
//! split against oversubscription while both engines run at once.
//!
//! `cargo bench --bench engines` (needs `voxline models fetch`).
//! `VOXLINE_BENCH_THREADS` = the pipeline's total budget (default: all cores).

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

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
    budget: voxline_pipeline::settings::ThreadBudget,
}

fn setup() -> Setup {
    let total = std::env::var("VOXLINE_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok());
    Setup {
        whisper: util::whisper_model(),
        llm: util::llm_model(),
        audio: util::read_16k(&util::fixture("q_capital.wav")),
        budget: voxline_pipeline::settings::ThreadBudget::split(total, None).unwrap(),
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

const PROMPT: &str = "Tell me about the history of Paris.";

/// Time for tokens 2..=n of one answer to `prompt` (the decode phase), and n − 1.
fn decode_time(e: &mut LlmEngine, prompt: &str) -> (Duration, u64) {
    let mut stamps = Vec::new();
    e.respond(prompt, &mut |_| {
        stamps.push(Instant::now());
        true
    })
    .unwrap();
    (
        stamps.last().unwrap().duration_since(stamps[0]),
        stamps.len() as u64 - 1,
    )
}

/// One answer's decode time, normalised to exactly 32 tokens (if the model stopped early).
fn decode_32(e: &mut LlmEngine, prompt: &str) -> Duration {
    let (d, n) = decode_time(e, prompt);
    d.mul_f64(32.0 / n.max(1) as f64)
}

fn raw_engines(c: &mut Criterion) {
    let s = setup();
    let mut g = c.benchmark_group("raw");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(15))
        .warm_up_time(Duration::from_secs(2));

    let mut stt = SttEngine::load(SttConfig::new(&s.whisper, s.budget.stt)).unwrap();
    g.throughput(Throughput::Elements(s.audio.len() as u64));
    g.bench_function(format!("whisper_q_capital_{}t", s.budget.stt), |b| {
        b.iter(|| stt.transcribe(&s.audio).unwrap())
    });

    // prefill: the whole prompt evaluated (no cache), one token sampled
    let mut e = llm(&s, s.budget.llm, 1, false);
    let n_prompt = u64::from(e.respond(PROMPT, &mut |_| true).unwrap().n_prefill_tokens);
    g.throughput(Throughput::Elements(n_prompt));
    g.bench_function(
        format!("llama_prefill_{n_prompt}tok_{}t", s.budget.llm),
        |b| b.iter(|| e.respond(PROMPT, &mut |_| true).unwrap()),
    );

    let mut e = llm(&s, s.budget.llm, 33, true);
    g.throughput(Throughput::Elements(32));
    g.bench_function(format!("llama_decode_32tok_{}t", s.budget.llm), |b| {
        b.iter_custom(|iters| (0..iters).map(|_| decode_32(&mut e, PROMPT)).sum());
    });
    g.finish();
}

/// llama decode while whisper transcribes in a loop on another thread.
fn contention(c: &mut Criterion) {
    let s = setup();
    let cores = s.budget.total;
    let mut g = c.benchmark_group("contention");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(32));
    for (name, stt_threads, llm_threads) in [
        ("split", s.budget.stt, s.budget.llm),
        ("oversubscribed", cores, cores),
    ] {
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
        g.bench_function(
            format!(
                "llama_decode_with_whisper_running_{name}_{stt_threads}+{llm_threads}t_on_{cores}"
            ),
            |b| {
                b.iter_custom(|iters| (0..iters).map(|_| decode_32(&mut e, PROMPT)).sum());
            },
        );
        stop.store(true, Ordering::Relaxed);
        bg.join().unwrap();
    }
    g.finish();
}

/// The same utterance and answer through the whole pipeline and through the
/// bare engines, in one run: the pipeline's overhead as a ratio.
fn pipeline_vs_raw(c: &mut Criterion) {
    let s = setup();
    let file = util::fixture("q_capital.wav");
    // the utterance exactly as the VAD cuts it
    let mut ep = voxline_audio::Endpointer::new(voxline_audio::VadConfig::default()).unwrap();
    let mut segs = ep.push(&s.audio);
    segs.extend(ep.finish());
    let utterance = segs.remove(0).samples;
    let settings = voxline_pipeline::settings::EngineSettings {
        max_tokens: 33,
        system_prompt: "You are a helpful assistant. Answer in detail.".into(),
        memory: false,
        ..voxline_pipeline::settings::EngineSettings::local(
            s.whisper.clone(),
            s.llm.clone(),
            s.budget,
        )
    };
    let mut g = c.benchmark_group("pipeline_vs_raw");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .warm_up_time(Duration::from_secs(1));

    let mut stt = SttEngine::load(settings.stt_config().expect("whisper settings")).unwrap();
    g.bench_function("stt_raw", |b| {
        b.iter(|| stt.transcribe(&utterance).unwrap())
    });
    drop(stt);
    let mut e = LlmEngine::load(settings.llm_config().expect("llama.cpp settings")).unwrap();
    g.bench_function("decode_32tok_raw", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| decode_32(&mut e, "What is the capital of France?"))
                .sum()
        });
    });
    drop(e);

    // One pipeline run per sample; each yields its STT time and its decode time.
    let run_once = || {
        let stt = voxline_stt::SttStage::new(
            SttEngine::load(settings.stt_config().expect("whisper settings")).unwrap(),
        );
        let llm = voxline_llm::LlmStage::new(
            voxline_llm::LlmModel::load(settings.llm_config().expect("llama.cpp settings"))
                .unwrap(),
        );
        let inputs = voxline_pipeline::pipeline::open_inputs(std::slice::from_ref(&file)).unwrap();
        let run =
            voxline_pipeline::pipeline::run(inputs, stt, llm, &Default::default(), None).unwrap();
        let r = voxline_report::build(&run, voxline_report::RunConfig::default(), 0.0, None);
        let t = &r.turns[0];
        let stt_ms = t.stt_ms.unwrap();
        let decode = Duration::from_secs_f64(32.0 / t.llm_decode_tps.unwrap());
        (Duration::from_secs_f64(stt_ms / 1000.0), decode)
    };
    g.bench_function("stt_in_pipeline", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| run_once().0).sum())
    });
    g.bench_function("decode_32tok_in_pipeline", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| run_once().1).sum())
    });
    g.finish();
}

criterion_group!(benches, raw_engines, contention, pipeline_vs_raw);
criterion_main!(benches);
