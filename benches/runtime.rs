//! The runtime's own cost: what one message and one token cost to carry
//! through a stage (channel hop + span recording + event publishing), how
//! fast the VAD front end replays audio, and what the end-of-turn model's
//! features of one candidate end cost.
//!
//! `cargo bench --bench runtime`

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use voxline_core::{edge, Clock, Emitter, FullPolicy, Pipeline, Stage, StageError};
use voxline_llm::{LlmOut, Token};

/// Forwards every message unchanged.
struct Pass;

impl Stage for Pass {
    type In = LlmOut;
    type Out = LlmOut;
    fn name(&self) -> &str {
        "pass"
    }
    fn process(&mut self, m: LlmOut, out: &mut Emitter<'_, LlmOut>) -> Result<(), StageError> {
        out.emit(m);
        Ok(())
    }
}

/// Emits `n` tokens per input, like an LLM stage streaming an answer.
struct Fan(u32);

impl Stage for Fan {
    type In = LlmOut;
    type Out = LlmOut;
    fn name(&self) -> &str {
        "fan"
    }
    fn process(&mut self, m: LlmOut, out: &mut Emitter<'_, LlmOut>) -> Result<(), StageError> {
        let LlmOut::Token(t) = m else { return Ok(()) };
        for index in 0..self.0 {
            out.emit(LlmOut::Token(Token {
                id: t.id,
                index,
                text: "tok".into(),
            }));
        }
        Ok(())
    }
}

/// Time to push `msgs` messages through a pipeline of `stage` into a sink, per message.
fn through<S: Stage<In = LlmOut, Out = LlmOut> + Send>(
    stage: S,
    msgs: u64,
    publish: bool,
) -> Duration {
    let mut p = Pipeline::builder(Clock::start())
        .publish_messages(publish)
        .build();
    let (tx, rx) = edge::<LlmOut>("in", 1024, FullPolicy::Block);
    let (otx, orx) = edge::<LlmOut>("out", 1024, FullPolicy::Block);
    p.spawn_stage(stage, rx, otx).unwrap();
    p.spawn_sink("sink", orx, |_| Ok(())).unwrap();
    let events = p.events();
    let drain = std::thread::spawn(move || events.iter().count());
    let t0 = Instant::now();
    for i in 0..msgs {
        tx.send(LlmOut::Token(Token {
            id: i,
            index: 0,
            text: "tok".into(),
        }))
        .unwrap();
    }
    drop(tx);
    let _ = p.join();
    let dt = t0.elapsed();
    let _ = drain.join();
    dt
}

fn runtime(c: &mut Criterion) {
    let mut g = c.benchmark_group("runtime");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    let n = 20_000u64;
    g.throughput(Throughput::Elements(n));
    g.bench_function("message_hop_with_spans", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| through(Pass, n, false)).sum())
    });
    g.bench_function("message_hop_with_spans_and_events", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| through(Pass, n, true)).sum())
    });
    // 100 inputs × 200 tokens: the per-token cost of a streaming stage
    g.throughput(Throughput::Elements(100 * 200));
    g.bench_function("token_stream_with_events", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| through(Fan(200), 100, true)).sum())
    });
    g.finish();
}

fn vad_replay(c: &mut Criterion) {
    let audio = util::read_16k(&util::fixture("multi_turn.wav"));
    let mut g = c.benchmark_group("vad");
    g.sample_size(20);
    // Throughput in audio samples: criterion's elements/s ÷ 16000 = audio seconds per second.
    g.throughput(Throughput::Elements(audio.len() as u64));
    g.bench_function("endpointer_multi_turn", |b| {
        b.iter(|| {
            let mut ep =
                voxline_audio::Endpointer::new(voxline_audio::VadConfig::default()).unwrap();
            let mut n = 0;
            for chunk in audio.chunks(320) {
                n += ep.push(chunk).len();
            }
            n + usize::from(ep.finish().is_some())
        });
    });
    g.bench_function("wav_read_resample_44k_stereo", |b| {
        let f = util::fixture("q_capital_44k_stereo.wav");
        b.iter(|| {
            let mut src = voxline_audio::WavSource::open(&f).unwrap();
            let mut n = 0;
            while let Some(c) = src.next_chunk().unwrap() {
                n += c.len();
            }
            n
        });
    });
    g.finish();
}

/// The end-of-turn model: its input (the log-mel features of a turn's last
/// 8 s), and the whole judgement of a pause.
fn turn_features(c: &mut Criterion) {
    let audio = util::read_16k(&util::fixture("long_10s.wav"));
    let mut f = voxline_audio::turn::TurnFeatures::new();
    let mut g = c.benchmark_group("turn");
    g.sample_size(20);
    g.bench_function("features_8s", |b| b.iter(|| f.compute(&audio).len()));
    // the whole judgement of one pause (features and the model), on one
    // thread (beside an engine) and on two (the cores free)
    let m = util::models_dir();
    if let Ok(mut model) = voxline_audio::turn::TurnModel::load(
        &m.join(voxline_models::registry::SMART_TURN.file),
        &m.join(voxline_models::registry::ONNX_RUNTIME.file),
        2,
    ) {
        for (threads, all) in [(1, false), (2, true)] {
            g.bench_function(format!("judge_pause_{threads}_thread"), |b| {
                b.iter(|| model.probability_on(&audio, all).unwrap_or(0.0));
            });
        }
    }
    g.finish();
}

criterion_group!(benches, runtime, vad_replay, turn_features);
criterion_main!(benches);
