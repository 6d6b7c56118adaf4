//! Ten minutes of continuous speech: the fixtures' sentences joined with no
//! pause, cut at the forced split (`max_utterance_ms`), transcribed through
//! the VAD and STT stages; against the same sentences transcribed one by one.
//!
//! `cargo bench --bench long_speech` (VOXLINE_LONG_SPEECH_S: the monologue's
//! length in seconds, default 600; VOXLINE_MODELS_DIR: the models, default
//! `models/`). Prints a Markdown table, one row per `max_utterance_ms`.

#[path = "../tests/integration/monologue.rs"]
mod monologue;

use std::path::PathBuf;
use std::time::Instant;

use voxline_audio::VadConfig;
use voxline_stt::{SttConfig, SttEngine, SttStage};

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let models =
        std::env::var_os("VOXLINE_MODELS_DIR").map_or_else(|| root.join("models"), PathBuf::from);
    let secs: f64 = std::env::var("VOXLINE_LONG_SPEECH_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600.0);
    let sentences = monologue::sentences(&root.join("audio-fixtures"));
    let order = monologue::order(&sentences, secs);
    let audio = monologue::join(&sentences, &order);
    let threads = std::thread::available_parallelism().map_or(2, usize::from);
    let model = models.join(voxline_models::registry::WHISPER_TINY_EN.file);
    let mut engine = SttEngine::load(SttConfig::new(model, threads)).unwrap();
    let each = monologue::transcribe_each(&mut engine, &sentences);
    let mut stt = SttStage::new(engine);
    println!(
        "{:.0} s of speech, {} sentences, whisper on {threads} threads\n",
        audio.len() as f64 / 16_000.0,
        order.len()
    );
    println!("| max_utterance_ms | utterances | forced splits | turn errors | chunks under 0.5 words/s passed on | WER | WER, sentences alone | STT s |");
    println!("|---|---|---|---|---|---|---|---|");
    for max_utterance_ms in [20_000, 10_000] {
        let vad = VadConfig {
            hangover_ms: voxline::settings::DEFAULT_HANGOVER_MS,
            max_utterance_ms,
            ..VadConfig::default()
        };
        let started = Instant::now();
        let run = monologue::transcribe_stream(&mut stt, vad, &audio);
        let took = started.elapsed().as_secs_f64();
        let (long, natural) = monologue::wers(&sentences, &order, &each, &run);
        println!(
            "| {max_utterance_ms} | {} | {} | {} | {} | {long:.4} | {natural:.4} | {took:.0} |",
            run.utterances,
            run.forced_splits,
            run.errors.len(),
            run.short
        );
        for e in &run.errors {
            eprintln!("  turn error: {e}");
        }
    }
}
