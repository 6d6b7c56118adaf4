//! Turn-taking on real speech: for each hangover, how many single-sentence
//! recordings the endpointer cuts at an inner breath pause, and how many
//! turns the fixtures' multi-question recording keeps apart.
//!
//! `cargo bench --bench hangover` (VOXLINE_SPEECH_DIR: a folder of real
//! recordings, one sentence each; default `audio-fixtures/human`). Prints a
//! Markdown table. No engine runs: this is the endpointer alone.

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

use std::path::{Path, PathBuf};

use voxline_audio::{Endpointer, VadConfig, VadStage};
use voxline_core::{AudioFrame, Clock, SpecBoard, SpecState};

/// The labelled true end of the last turn in `wav`'s sidecar, in samples.
fn true_end(wav: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(wav.with_extension("json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["turns"].as_array()?.last()?["end_sample"].as_u64()
}

/// Segments the endpointer cuts from `audio` (with a second of silence after it).
fn segments(audio: &[f32], hangover_ms: u32) -> usize {
    let mut ep = Endpointer::new(VadConfig {
        hangover_ms,
        ..VadConfig::default()
    })
    .unwrap();
    let mut n = 0;
    for chunk in audio.chunks(320) {
        n += ep.push(chunk).len();
    }
    n += ep.push(&vec![0.0; 16_000]).len();
    n + usize::from(ep.finish().is_some())
}

/// Speculative attempts on `audio` with `silence_ms` after the last frame
/// scoring at least `spec_threshold`: (started, cancelled),
/// and the committed attempt's delay after the labelled true end of speech
/// (`true_end`, in samples), in ms.
fn attempts(
    audio: &[f32],
    silence_ms: u32,
    spec_threshold: f32,
    true_end: Option<u64>,
) -> (usize, usize, Vec<f64>) {
    let board = SpecBoard::new();
    let mut stage = VadStage::new(VadConfig {
        spec_threshold,
        ..VadConfig::default()
    })
    .unwrap()
    .with_speculation(board.clone(), silence_ms);
    let clock = Clock::start();
    let mut padded = audio.to_vec();
    padded.extend(std::iter::repeat_n(0.0, 16_000));
    let frames = padded.chunks(320).enumerate().map(|(i, c)| AudioFrame {
        start_sample: (i * 320) as u64,
        samples: c.to_vec(),
        captured: clock.sample_due((i * 320) as u64),
        new_recording: i == 0,
        end_of_stream: false,
    });
    let out = voxline_core::drive(&mut stage, frames).unwrap();
    let spec: Vec<_> = out
        .iter()
        .filter(|u| board.state(u.id) != SpecState::Final)
        .collect();
    let cancelled = spec
        .iter()
        .filter(|u| board.state(u.id) == SpecState::Cancelled)
        .count();
    let delays = spec
        .iter()
        .filter(|u| board.state(u.id) == SpecState::Committed)
        .filter_map(|u| {
            Some(Clock::samples_to_ms(
                u.closed_sample.checked_sub(true_end?)?,
            ))
        })
        .collect();
    (spec.len(), cancelled, delays)
}

fn main() {
    let dir = std::env::var_os("VOXLINE_SPEECH_DIR")
        .map_or_else(|| util::fixture("human"), PathBuf::from);
    let mut clips: Vec<(String, Vec<f32>, Option<u64>)> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "wav"))
                .map(|p| {
                    (
                        p.file_name().unwrap().to_string_lossy().into_owned(),
                        util::read_16k(&p),
                        true_end(&p),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    clips.sort_by(|a, b| a.0.cmp(&b.0));
    if clips.is_empty() {
        eprintln!("no recordings in {}; set VOXLINE_SPEECH_DIR", dir.display());
        return;
    }
    let multi = util::read_16k(&util::fixture("multi_turn.wav"));
    println!(
        "| hangover ms | clips split (of {}) | extra cuts | split clips | multi_turn turns (3 spoken) |",
        clips.len()
    );
    println!("|---|---|---|---|---|");
    for hangover in [300, 400, 500, 600, 700, 800, 1000, 1200] {
        let mut split = Vec::new();
        let mut extra = 0;
        for (name, audio, _) in &clips {
            let n = segments(audio, hangover);
            if n > 1 {
                split.push(format!("{name} ({n})"));
                extra += n - 1;
            }
        }
        println!(
            "| {hangover} | {} | {extra} | {} | {} |",
            split.len(),
            if split.is_empty() {
                "–".into()
            } else {
                split.join(", ")
            },
            segments(&multi, hangover)
        );
    }
    println!();
    println!("| spec threshold | spec silence ms | attempts | cancelled (speech resumed) | committed attempt sent after the true end of speech, ms: mean / max |");
    println!("|---|---|---|---|---|");
    for end in SPEC_THRESHOLDS {
        for silence in [32, 48, 64, 80, 100, 150, 200, 250, 300] {
            if end != 0.5 && ![32, 48, 64].contains(&silence) {
                continue;
            }
            let (mut started, mut cancelled, mut delays) = (0, 0, Vec::new());
            for (_, audio, true_end) in &clips {
                let (s, c, d) = attempts(audio, silence, end, *true_end);
                started += s;
                cancelled += c;
                delays.extend(d);
            }
            let mean = delays.iter().sum::<f64>() / delays.len().max(1) as f64;
            let max = delays.iter().copied().fold(0.0, f64::max);
            println!("| {end} | {silence} | {started} | {cancelled} | {mean:.0} / {max:.0} |");
        }
    }
}

/// The confident-speech thresholds compared (the first is the detector's
/// own speech threshold: speculation after the last speech frame).
const SPEC_THRESHOLDS: [f32; 4] = [0.5, 0.6, 0.7, 0.8];
