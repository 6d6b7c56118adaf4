//! Turn-taking on real speech: for each hangover, how many single-sentence
//! recordings the endpointer cuts at an inner breath pause, and how many
//! turns the fixtures' multi-question recording keeps apart; then each
//! end-of-turn policy (silence alone, or the semantic end of turn) on the
//! corpus of pauses put into sentences (`support/pauses.rs`): false cuts,
//! missed ends, and the commit's delay after the true end of speech.
//!
//! `cargo bench --bench hangover` (VOXLINE_SPEECH_DIR: a folder of real
//! recordings, one sentence each; default `audio-fixtures/human`;
//! VOXLINE_PAUSE_CORPUS: a folder to write the corpus to, for the human WER
//! bench). Prints Markdown tables. No STT or LLM runs: this is the
//! endpointer alone, with the end-of-turn model where the policy has it.

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

#[path = "support/pauses.rs"]
#[allow(dead_code)] // shared with the human WER bench
mod pauses;

use std::path::{Path, PathBuf};

use voxline_audio::turn::{SharedTurnModel, TurnModel, TurnPolicy};
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
    policies(&dir);
}

/// An end-of-turn policy.
#[derive(Clone, Copy)]
enum Policy {
    /// This much silence after the last speech frame ends a turn.
    Silence(u32),
    /// The semantic end of turn.
    Semantic(TurnPolicy),
}

impl Policy {
    fn name(&self) -> String {
        match self {
            Self::Silence(ms) => format!("silence {ms} ms"),
            Self::Semantic(p) => format!(
                "semantic: judged at {} ms, complete above {} after {} ms, incomplete below {} after {} ms, merge {} ms",
                p.probe_ms, p.threshold, p.complete_ms, p.incomplete_below, p.incomplete_ms, p.merge_ms
            ),
        }
    }
}

/// The committed turns of `audio` under `policy`, and those taken back
/// (see [`pauses::turns_and_merged`]).
fn turns(audio: &[f32], policy: Policy, model: &SharedTurnModel) -> (pauses::Turns, pauses::Turns) {
    match policy {
        Policy::Silence(ms) => pauses::turns_and_merged(audio, ms, None),
        Policy::Semantic(p) => pauses::turns_and_merged(
            audio,
            voxline_pipeline::settings::DEFAULT_HANGOVER_MS,
            Some((model, p)),
        ),
    }
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Each policy on the corpus of pauses.
fn policies(dir: &Path) {
    let models = util::models_dir();
    let model = match TurnModel::load(
        &models.join(voxline_models::registry::SMART_TURN.file),
        &models.join(voxline_models::registry::ONNX_RUNTIME.file),
        1,
    ) {
        Ok(m) => SharedTurnModel::new(m),
        Err(e) => {
            eprintln!("no end-of-turn model ({e}): the policies are not compared");
            return;
        }
    };
    let mut sentences = pauses::human_sentences(dir);
    sentences.extend(pauses::piper_sentences(&models));
    let corpus = pauses::corpus(&sentences);
    if let Some(out) = std::env::var_os("VOXLINE_PAUSE_CORPUS") {
        pauses::write(Path::new(&out), &corpus);
        eprintln!(
            "wrote {} clips to {}",
            corpus.len(),
            Path::new(&out).display()
        );
    }
    let paused = corpus.iter().filter(|c| !c.pauses.is_empty()).count();
    println!();
    println!(
        "Policies on the pause corpus: {} sentences ({} human, {} Piper), {} clips with pauses of {:?} ms put in at word gaps.",
        sentences.len(),
        sentences.iter().filter(|s| s.kind == "human").count(),
        sentences.iter().filter(|s| s.kind == "piper").count(),
        paused,
        pauses::PAUSE_MS
    );
    println!("A false cut is a turn committed more than 200 ms before the sentence's end and kept; a turn shown and then taken back (the speaker went on within the merge window) is counted apart. A missed end is a sentence not committed within 2.9 s of its end. Delays are from the true end of speech to the commit, in stream time.");
    for kind in ["human", "piper"] {
        let part: Vec<pauses::PauseClip> =
            corpus.iter().filter(|c| c.kind == kind).cloned().collect();
        println!("\n{kind} sentences:\n");
        table(&part, &model);
    }
}

/// The policies' table on `corpus`.
fn table(corpus: &[pauses::PauseClip], model: &SharedTurnModel) {
    let with = |ms: u32| {
        corpus
            .iter()
            .filter(|c| c.pauses.len() == 1 && c.pauses[0].1 == ms as usize * 16)
            .count()
    };
    println!(
        "| policy | sentences cut as spoken (of {}) | cut at a pause of 0.6 s (of {}) / 1 s (of {}) / 1.5 s (of {}) / two of 1 s (of {}) | shown, then taken back (clips) | missed ends | delay after a complete sentence p50 / p95 ms | delay, all clips p50 / p95 ms | pauses judged per clip |",
        corpus.iter().filter(|c| c.pauses.is_empty()).count(),
        with(600),
        with(1000),
        with(1500),
        corpus.iter().filter(|c| c.pauses.len() == 2).count()
    );
    println!("|---|---|---|---|---|---|---|---|");
    let semantic = TurnPolicy::default();
    for policy in [
        Policy::Silence(500),
        Policy::Silence(700),
        Policy::Silence(1000),
        Policy::Semantic(semantic),
        Policy::Semantic(TurnPolicy {
            merge_ms: 0,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            merge_ms: 1_000,
            ..semantic
        }),
        // when the pause is judged, after the last confident speech frame
        // (the default: with the speculative attempt, at 48 ms)
        Policy::Semantic(TurnPolicy {
            probe_ms: 16,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            probe_ms: 64,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            probe_ms: 96,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            complete_ms: 150,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            complete_ms: 200,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            incomplete_ms: 1_500,
            ..semantic
        }),
        // the threshold of a complete pause (the default 0.8; 0.9 before
        // the merge window made the unsure band's guard against cuts moot)
        Policy::Semantic(TurnPolicy {
            threshold: 0.95,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            threshold: 0.9,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            threshold: 0.7,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            threshold: 0.6,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            threshold: 0.5,
            ..semantic
        }),
        Policy::Semantic(TurnPolicy {
            threshold: 0.7,
            incomplete_below: 0.7,
            complete_ms: 250,
            ..semantic
        }),
    ] {
        let mut cut = [0usize; 5];
        let mut missed = 0;
        let (mut whole, mut all) = (Vec::new(), Vec::new());
        let mut cut_names = Vec::new();
        let mut taken_back = 0;
        let judged_before = model.judged();
        for c in corpus {
            let (t, merged) = turns(&c.audio, policy, model);
            taken_back += usize::from(!merged.is_empty());
            let end = c.speech.1 as u64;
            if t.iter().any(|(e, _)| *e + 3_200 < end) {
                cut_names.push(c.name.clone());
                let k = match (c.pauses.len(), c.pauses.first().map(|p| p.1)) {
                    (0, _) => 0,
                    (1, Some(9_600)) => 1,
                    (1, Some(16_000)) => 2,
                    (1, _) => 3,
                    _ => 4,
                };
                cut[k] += 1;
            }
            match t.iter().rfind(|(e, _)| *e + 3_200 >= end) {
                Some(&(_, closed)) if closed < end + 46_400 => {
                    let d = Clock::samples_to_ms(closed.saturating_sub(end));
                    all.push(d);
                    if c.pauses.is_empty() {
                        whole.push(d);
                    }
                }
                _ => missed += 1,
            }
        }
        let judged = (model.judged() - judged_before) as f64 / corpus.len() as f64;
        println!(
            "| {} | {} | {} / {} / {} / {} | {taken_back} | {missed} | {:.0} / {:.0} | {:.0} / {:.0} | {judged:.1} |",
            policy.name(),
            cut[0],
            cut[1],
            cut[2],
            cut[3],
            cut[4],
            percentile(&mut whole, 0.5),
            percentile(&mut whole, 0.95),
            percentile(&mut all, 0.5),
            percentile(&mut all, 0.95),
        );
        if std::env::var_os("VOXLINE_BENCH_VERBOSE").is_some() {
            eprintln!(
                "{}: cut {}",
                policy.name(),
                cut_names
                    .iter()
                    .filter(|n| !n.contains("-p"))
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
}

/// The confident-speech thresholds compared (the first is the detector's
/// own speech threshold: speculation after the last speech frame).
const SPEC_THRESHOLDS: [f32; 4] = [0.5, 0.6, 0.7, 0.8];
