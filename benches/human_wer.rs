//! Word error rate on real human speech: whisper on each whole clip against
//! the pipeline, in one run.
//!
//! `cargo bench --bench human_wer` (optimised build; needs `voxline models
//! fetch`). For every recording in `audio-fixtures/human` (or
//! `VOXLINE_HUMAN_DIR`) with a sidecar:
//!
//! - **raw**: `SttEngine::transcribe` on the whole clip, as read;
//! - **pipeline**: the clips replayed one after another (1 s of silence
//!   between them) through `voxline_pipeline::pipeline::run` with the real stages and
//!   the command line's defaults (VAD hangover, speculative turn-taking);
//!   a clip's transcript is every committed utterance cut from it, in order.
//!
//! Both use the same model, threads and decoding settings. Prints a Markdown
//! table and both mean word error rates (mean over clips, and pooled: all
//! edits over all reference words). `VOXLINE_BENCH_MAX_TOKENS` bounds the
//! answers (default 8: the answers are not what is measured).

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

use std::collections::BTreeSet;
use std::path::PathBuf;

use voxline_audio::VadConfig;
use voxline_core::PipelineEvent;
use voxline_pipeline::pipeline::{Pace, RunOptions};
use voxline_pipeline::settings::{EngineSettings, ThreadBudget};
use voxline_stt::{normalise, word_error_rate, SttEngine};

/// One recording and what each side made of it.
struct Clip {
    path: PathBuf,
    reference: String,
    /// The true speech, in 16 kHz samples of the clip.
    speech: (u64, u64),
    raw: String,
    /// The pipeline's utterances: (start, end) in the clip's samples (before
    /// 0: the silence between clips), text.
    cut: Vec<(i64, i64, String)>,
}

fn edits(reference: &str, hypothesis: &str) -> f64 {
    word_error_rate(reference, hypothesis) * normalise(reference).len() as f64
}

fn main() {
    let dir =
        std::env::var_os("VOXLINE_HUMAN_DIR").map_or_else(|| util::fixture("human"), PathBuf::from);
    let max_tokens = std::env::var("VOXLINE_BENCH_MAX_TOKENS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(8);
    let settings = EngineSettings {
        max_tokens,
        ..EngineSettings::local(
            util::whisper_model(),
            util::llm_model(),
            ThreadBudget::split(None, None).unwrap(),
        )
    };

    let paths = util::wavs_in(&dir);
    let mut clips: Vec<Clip> = Vec::new();
    for path in paths {
        let Ok(Some(sc)) = voxline_pipeline::sidecar::Sidecar::load_for(&path) else {
            continue;
        };
        let (Some(first), Some(last)) = (sc.turns.first(), sc.turns.last()) else {
            continue;
        };
        clips.push(Clip {
            reference: sc
                .turns
                .iter()
                .map(|t| t.text.as_str())
                .collect::<Vec<_>>()
                .join(" "),
            speech: (sc.to_16k(first.start_sample), sc.to_16k(last.end_sample)),
            path,
            raw: String::new(),
            cut: Vec::new(),
        });
    }
    assert!(
        !clips.is_empty(),
        "no recordings with sidecars in {}",
        dir.display()
    );

    // raw whisper on each whole clip
    let mut stt = SttEngine::load(settings.stt_config().expect("whisper settings"))
        .expect("whisper model (run `voxline models fetch`)");
    for c in &mut clips {
        c.raw = stt.transcribe(&util::read_16k(&c.path)).unwrap().text;
    }
    drop(stt);

    // the pipeline, as `voxline bench --fixtures DIR` runs it: by silence
    // alone (the default), then with the semantic end of turn
    let files: Vec<PathBuf> = clips.iter().map(|c| c.path.clone()).collect();
    for (i, cut) in pipeline_cuts(&settings, &files, None)
        .into_iter()
        .enumerate()
    {
        clips[i].cut = cut;
    }
    let semantic = semantic_turn().map(|t| pipeline_cuts(&settings, &files, Some(t)));

    println!("| clip | words | speech (s) | utterances cut (s) | raw WER | pipeline WER | semantic WER | raw | pipeline | semantic |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let s = |n: i64| n as f64 / 16_000.0;
    let (
        mut raw_sum,
        mut pipe_sum,
        mut sem_sum,
        mut raw_edits,
        mut pipe_edits,
        mut sem_edits,
        mut words,
    ) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0usize);
    let joined = |cut: &[(i64, i64, String)]| {
        cut.iter()
            .map(|(_, _, t)| t.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    for (i, c) in clips.iter().enumerate() {
        let heard = joined(&c.cut);
        let sem_heard = semantic.as_ref().map(|v| joined(&v[i]));
        let (raw, pipe) = (
            word_error_rate(&c.reference, &c.raw),
            word_error_rate(&c.reference, &heard),
        );
        let sem = sem_heard
            .as_deref()
            .map(|h| word_error_rate(&c.reference, h));
        raw_sum += raw;
        pipe_sum += pipe;
        sem_sum += sem.unwrap_or(0.0);
        raw_edits += edits(&c.reference, &c.raw);
        pipe_edits += edits(&c.reference, &heard);
        sem_edits += sem_heard.as_deref().map_or(0.0, |h| edits(&c.reference, h));
        let n = normalise(&c.reference).len();
        words += n;
        let cuts: Vec<String> = c
            .cut
            .iter()
            .map(|(a, b, _)| format!("{:.2}–{:.2}", s(*a), s(*b)))
            .collect();
        println!(
            "| {} | {n} | {:.2}–{:.2} | {} | {raw:.3} | {pipe:.3} | {} | {} | {} | {} |",
            c.path.file_name().unwrap().to_string_lossy(),
            c.speech.0 as f64 / 16_000.0,
            c.speech.1 as f64 / 16_000.0,
            cuts.join(", "),
            sem.map_or("–".into(), |w| format!("{w:.3}")),
            c.raw,
            heard,
            sem_heard.unwrap_or_default()
        );
    }
    let n = clips.len() as f64;
    println!();
    println!(
        "mean WER over {} clips: raw whisper {:.4}, pipeline {:.4} (difference {:+.2} percentage points){}",
        clips.len(),
        raw_sum / n,
        pipe_sum / n,
        (pipe_sum - raw_sum) / n * 100.0,
        if semantic.is_some() {
            format!(
                ", pipeline with the semantic end of turn {:.4} ({:+.2} points)",
                sem_sum / n,
                (sem_sum - raw_sum) / n * 100.0
            )
        } else {
            String::new()
        }
    );
    println!(
        "pooled WER over {words} words: raw whisper {:.4}, pipeline {:.4}{}",
        raw_edits / words as f64,
        pipe_edits / words as f64,
        if semantic.is_some() {
            format!(", semantic {:.4}", sem_edits / words as f64)
        } else {
            String::new()
        }
    );
    if std::env::var_os("VOXLINE_BENCH_CUTS").is_some() {
        cuts_table(&settings, &clips);
    }
}

/// The end-of-turn model and the default policy; `None` when not installed.
fn semantic_turn() -> Option<voxline_pipeline::pipeline::SemanticTurn> {
    let m = util::models_dir();
    let model = voxline_audio::turn::TurnModel::load(
        &m.join(voxline_models::registry::SMART_TURN.file),
        &m.join(voxline_models::registry::ONNX_RUNTIME.file),
        1,
    )
    .map_err(|e| eprintln!("no semantic end of turn: {e}"))
    .ok()?;
    Some((
        voxline_audio::turn::SharedTurnModel::new(model),
        voxline_audio::turn::TurnPolicy::default(),
    ))
}

/// What the pipeline transcribed of each of `files` played one after
/// another: each committed utterance (start, end in the clip's samples, text).
fn pipeline_cuts(
    settings: &EngineSettings,
    files: &[PathBuf],
    semantic_turn: Option<voxline_pipeline::pipeline::SemanticTurn>,
) -> Vec<Vec<(i64, i64, String)>> {
    let board = voxline_core::SpecBoard::new();
    // the runtime settles the attempts on `board` (RunOptions::speculation)
    let stt = voxline_stt::SttStage::new(
        SttEngine::load(settings.stt_config().expect("whisper settings")).unwrap(),
    );
    let llm = voxline_llm::LlmStage::new(
        voxline_llm::LlmModel::load(settings.llm_config().expect("llama.cpp settings")).unwrap(),
    );
    let opts = RunOptions {
        pace: Pace::Fast,
        vad: VadConfig {
            hangover_ms: voxline_pipeline::settings::DEFAULT_HANGOVER_MS,
            ..VadConfig::default()
        },
        speculation: Some((board, voxline_pipeline::settings::DEFAULT_SPEC_SILENCE_MS)),
        semantic_turn,
        ..RunOptions::default()
    };
    let inputs = voxline_pipeline::pipeline::open_inputs(files).unwrap();
    let run = voxline_pipeline::pipeline::run(inputs, stt, llm, &opts, None).unwrap();
    assert!(run.outcome.failed.is_none(), "{:?}", run.outcome.failed);
    let cancelled: BTreeSet<u64> = run
        .events
        .iter()
        .filter_map(|e| match e.event {
            // thrown away, or taken back and merged into the next turn
            PipelineEvent::SpecCancel { id, .. } | PipelineEvent::Merged { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    let mut cuts = vec![Vec::new(); files.len()];
    for ev in &run.events {
        let PipelineEvent::Transcript(t) = &ev.event else {
            continue;
        };
        if cancelled.contains(&t.id) {
            continue;
        }
        let Some((i, span)) = run
            .inputs
            .iter()
            .enumerate()
            .find(|(_, s)| t.end_sample > s.start && t.start_sample < s.end)
        else {
            continue;
        };
        let rel =
            |x: u64| i64::try_from(x).unwrap_or(i64::MAX) - i64::try_from(span.start).unwrap_or(0);
        cuts[i].push((rel(t.start_sample), rel(t.end_sample), t.text.clone()));
    }
    cuts
}

/// The clip's audio from `a` to `b` (its samples; outside it, the silence
/// the pipeline had there).
fn slice(audio: &[f32], a: i64, b: i64) -> Vec<f32> {
    (a..b)
        .map(|i| {
            usize::try_from(i)
                .ok()
                .and_then(|i| audio.get(i))
                .copied()
                .unwrap_or(0.0)
        })
        .collect()
}

/// Why the pipeline and raw whisper differ: whisper alone on exactly the
/// pipeline's cut (it must reproduce the pipeline's transcript), on the cut
/// with more of the recording after the VAD's end of speech, and on the cut
/// without the silence between clips that the pre-roll reached into.
fn cuts_table(settings: &EngineSettings, clips: &[Clip]) {
    let mut stt = SttEngine::load(settings.stt_config().expect("whisper settings")).unwrap();
    // (name, start moved to the clip's first sample, ms added after the end)
    let variants: [(&str, bool, i64); 4] = [
        ("the cut", false, 0),
        ("cut +150 ms after", false, 150),
        ("cut +300 ms after", false, 300),
        ("cut without the gap before the clip", true, 0),
    ];
    println!();
    print!("| clip |");
    for (name, _, _) in variants {
        print!(" {name} |");
    }
    println!();
    println!("|---|{}", "---|".repeat(variants.len()));
    let mut sums = [0.0; 4];
    for c in clips {
        let audio = util::read_16k(&c.path);
        print!("| {} |", c.path.file_name().unwrap().to_string_lossy());
        for (k, (_, from_clip, ms)) in variants.iter().enumerate() {
            let heard: Vec<String> = c
                .cut
                .iter()
                .map(|(a, b, _)| {
                    let a = if *from_clip { (*a).max(0) } else { *a };
                    stt.transcribe(&slice(&audio, a, b + ms * 16)).unwrap().text
                })
                .collect();
            let heard = heard.join(" ");
            let wer = word_error_rate(&c.reference, &heard);
            sums[k] += wer;
            print!(" {wer:.3} {heard} |");
        }
        println!();
    }
    let n = clips.len() as f64;
    print!("| mean |");
    for s in sums {
        print!(" {:.4} |", s / n);
    }
    println!();
}
