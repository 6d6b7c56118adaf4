//! What whisper's `audio_ctx` does to accuracy and speed on the fixtures.
//!
//! `cargo bench --bench audio_ctx` (optimised build; needs `voxline models fetch`).
//! For each fixture with a sidecar and each encoder-window policy it
//! transcribes the sidecar's speech turns (cut at the sidecar's boundaries
//! plus the VAD's default pre-roll and 200 ms after) and prints the word
//! error rate and the STT time, as ratios to the full window measured in
//! the same run. `VOXLINE_BENCH_THREADS` sets whisper's threads (default: all cores).

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

use std::time::Instant;

use voxline_stt::{word_error_rate, AudioCtx, SttConfig, SttEngine};

fn main() {
    let threads = std::env::var("VOXLINE_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
    let model = util::whisper_model();
    let mut stt = SttEngine::load(SttConfig::new(&model, threads))
        .expect("whisper model (run `voxline models fetch`)");
    let policies = [
        "full", "auto+32", "auto+64", "auto+128", "auto+256", "256", "384", "512", "768",
    ];
    // (policy, file) -> (errors, words, ms, audio_ms)
    let mut rows: Vec<(String, String, f64, f64, f64)> = Vec::new();
    let mut fixtures: Vec<_> = std::fs::read_dir(util::fixtures_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "wav"))
        .collect();
    fixtures.sort();
    let mut clips = Vec::new();
    for f in &fixtures {
        let Ok(Some(sc)) = voxline_pipeline::sidecar::Sidecar::load_for(f) else {
            continue;
        };
        let mut src = voxline_audio::WavSource::open(f).unwrap();
        let mut audio = Vec::new();
        while let Ok(Some(c)) = src.next_chunk() {
            audio.extend_from_slice(&c);
        }
        for (i, t) in sc.turns.iter().enumerate() {
            let s = sc.to_16k(t.start_sample).saturating_sub(3200) as usize;
            let e = (sc.to_16k(t.end_sample) as usize + 3200).min(audio.len());
            clips.push((
                format!("{}#{i}", f.file_name().unwrap().to_string_lossy()),
                t.text.clone(),
                audio[s..e].to_vec(),
            ));
        }
    }
    // warm-up
    let _ = stt.transcribe(&clips[0].2);
    for p in policies {
        stt.set_audio_ctx(AudioCtx::parse(p).unwrap());
        for (name, text, audio) in &clips {
            let t0 = Instant::now();
            let out = stt.transcribe(audio).unwrap();
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            let wer = word_error_rate(text, &out.text);
            if wer > 0.0 {
                eprintln!("{p:>8} {name}: {:?} (expected {text:?})", out.text);
            }
            rows.push((
                p.to_string(),
                name.clone(),
                wer,
                ms,
                audio.len() as f64 / 16.0,
            ));
        }
    }
    let full_ms: f64 = rows.iter().filter(|r| r.0 == "full").map(|r| r.3).sum();
    println!(
        "whisper tiny.en, {threads} threads, {} clips from the fixtures\n",
        clips.len()
    );
    println!("| audio_ctx | mean WER | clips with errors | STT ms (sum) | speed vs full |\n|---|---|---|---|---|");
    for p in policies {
        let r: Vec<_> = rows.iter().filter(|r| r.0 == p).collect();
        let wer = r.iter().map(|r| r.2).sum::<f64>() / r.len() as f64;
        let bad = r.iter().filter(|r| r.2 > 0.0).count();
        let ms: f64 = r.iter().map(|r| r.3).sum();
        println!(
            "| {p} | {wer:.3} | {bad}/{} | {ms:.0} | {:.2}× |",
            r.len(),
            full_ms / ms
        );
    }
}
