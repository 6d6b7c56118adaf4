//! Ten minutes of continuous speech: the fixtures' sentences joined with no
//! pause, cut at the forced split (`max_utterance_ms`), transcribed through
//! the VAD and STT stages; against the same sentences transcribed one by one.
//!
//! `cargo bench --bench long_speech` (VOXLINE_LONG_SPEECH_S: the monologue's
//! length in seconds, default 600; VOXLINE_MODELS_DIR: the models, default
//! `models/`; VOXLINE_LONG_SPEECH_MODEL: the whisper file in it, default f16;
//! VOXLINE_LONG_SPEECH_THREADS, VOXLINE_LONG_SPEECH_MAX_MS). Prints a Markdown
//! table, one row per `max_utterance_ms`.

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

#[path = "../tests/integration/monologue.rs"]
mod monologue;

use std::time::Instant;

use voxline_audio::VadConfig;
use voxline_stt::{SttConfig, SttEngine, SttStage};

fn main() {
    let secs: f64 = std::env::var("VOXLINE_LONG_SPEECH_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600.0);
    let sentences = monologue::sentences(&util::fixtures_dir());
    let order = monologue::order(&sentences, secs);
    let audio = monologue::join(&sentences, &order);
    // One whisper thread unless told: on a shared machine ggml's spinning
    // threads collapse when another process holds a core (measured: 3 s per
    // 20 s chunk on 1 thread, 18-155 s on 2, while other builds ran).
    let threads: usize = std::env::var("VOXLINE_LONG_SPEECH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let verbose = std::env::var_os("VOXLINE_LONG_SPEECH_VERBOSE").is_some();
    // VOXLINE_LONG_SPEECH_MODEL: a whisper model file in the models directory (default: f16)
    let model = util::models_dir().join(
        std::env::var("VOXLINE_LONG_SPEECH_MODEL")
            .unwrap_or_else(|_| voxline_models::registry::WHISPER_TINY_EN.file.into()),
    );
    let mut engine = SttEngine::load(SttConfig::new(model, threads)).unwrap();
    let each = monologue::transcribe_each(&mut engine, &sentences, 8_000);
    let bare = monologue::transcribe_each(&mut engine, &sentences, 0);
    let mut stt = SttStage::new(engine);
    println!(
        "{:.0} s of speech, {} sentences, whisper on {threads} threads\n",
        audio.len() as f64 / 16_000.0,
        order.len()
    );
    println!("| max_utterance_ms | utterances | forced splits | turn errors | chunks under 0.5 words/s passed on | WER | WER, sentences alone (0.5 s pause around each) | WER, sentences cut from the monologue (no pause) | STT s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let limits: Vec<u32> = std::env::var("VOXLINE_LONG_SPEECH_MAX_MS").map_or_else(
        |_| vec![20_000, 10_000],
        |s| s.split(',').filter_map(|v| v.trim().parse().ok()).collect(),
    );
    for max_utterance_ms in limits {
        let vad = VadConfig {
            hangover_ms: voxline_pipeline::settings::DEFAULT_HANGOVER_MS,
            max_utterance_ms,
            ..VadConfig::default()
        };
        let started = Instant::now();
        let run = monologue::transcribe_stream(&mut stt, vad, &audio);
        let took = started.elapsed().as_secs_f64();
        let (long, natural) = monologue::wers(&sentences, &order, &each, &run);
        let (_, no_pause) = monologue::wers(&sentences, &order, &bare, &run);
        println!(
            "| {max_utterance_ms} | {} | {} | {} | {} | {long:.4} | {natural:.4} | {no_pause:.4} | {took:.0} |",
            run.utterances,
            run.forced_splits,
            run.errors.len(),
            run.short
        );
        for e in &run.errors {
            eprintln!("  turn error: {e}");
        }
        if verbose {
            for t in &run.transcripts {
                eprintln!("  {} ({:.1} s): {}", t.id, t.audio_ms / 1000.0, t.text);
            }
        }
    }
}
