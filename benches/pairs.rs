//! Neither cut nor merge: the semantic end of turn with and without its
//! second opinion from the words, on two corpora made at run time
//! (`support/pauses.rs`):
//!
//! - **pauses**: sentences (real people from `audio-fixtures/human` or
//!   `VOXLINE_SPEECH_DIR`, and the Piper voice) with a silence of 0.6–1.5 s
//!   put in between two words; a clip is *cut* when a committed turn ends
//!   more than 200 ms before the sentence does;
//! - **pairs**: two complete sentences of the same kind said 1.0, 1.2 or
//!   1.5 s apart; a sentence is *its own turn* when a committed turn holds
//!   it and nothing of the other.
//!
//! And `multi_turn.wav`, the fixtures' three espeak-ng questions 1.5 s apart.
//! A last table (`VOXLINE_BENCH_ROWS=whole` for it alone) asks whisper to
//! hear each clip whole, with its pause as recorded and cut to 300 ms, and
//! counts where it keeps a sentence end at the pause or drops what
//! followed ([`voxline_audio::turn::heard_as_one`] is the rule the stage
//! applies to a held turn, heard with the pause cut).
//!
//! The VAD stage runs with the end-of-turn model as the command line has
//! it; whisper (the pipeline's model and settings) transcribes every
//! attempt the stage sends, and its words reach the board a fixed stream
//! time after the attempt was sent: 1 000 ms (what this 2-core CPU gives)
//! and 400 ms (a faster machine). One row adds a voice (`voxline live
//! --voice`, barge-in on): each answer begins to play 400 ms after its
//! words (the first token and the voice's first block on this CPU), and a
//! turn stays revocable until it has. No LLM runs; stream time, so the
//! host's speed moves no figure but whisper's words.
//!
//! `cargo bench --bench pairs` (optimised build; needs `voxline models
//! fetch`; `VOXLINE_BENCH_ROWS=words` runs only the rows whose name holds
//! it, or the one row of that exact name, `VOXLINE_BENCH_KINDS=piper` only one corpus, `VOXLINE_BENCH_CLIPS`
//! only the clips whose name holds it, with `VOXLINE_LOG=voxline_audio=debug`
//! for the stage's account of each decision; `VOXLINE_BENCH_SWEEP`, e.g.
//! `merge_ms=1000,2000;threshold=0.6,0.8`, a grid of policies in place of
//! the rows, see [`sweep`]; `VOXLINE_BENCH_SPEC_THRESHOLD` another
//! `--spec-threshold`). Prints a Markdown
//! table. Piper's sentences are made once and kept under the build
//! folder (Piper's noise moves its pauses from one synthesis to the next),
//! so runs before and after a change compare on the same audio.

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

#[path = "support/pauses.rs"]
#[allow(dead_code)] // shared with the other turn-taking benches
mod pauses;

use std::collections::HashMap;
use std::path::PathBuf;

use voxline_audio::turn::{SharedTurnModel, TurnModel, TurnPolicy};
use voxline_stt::{SttConfig, SttEngine};

/// A policy as the table names it, and the words' delay (`None`: no words).
struct Row {
    name: String,
    hangover_ms: u32,
    policy: Option<TurnPolicy>,
    words_after_ms: Option<u32>,
    /// With a voice: its answer begins this long after the words.
    voice_after_ms: Option<u32>,
}

fn rows() -> Vec<Row> {
    let semantic = TurnPolicy::default();
    let no_words = TurnPolicy {
        words: false,
        ..semantic
    };
    vec![
        Row {
            name: "silence 700 ms".into(),
            hangover_ms: 700,
            policy: None,
            words_after_ms: None,
            voice_after_ms: None,
        },
        Row {
            name: "semantic, no words".into(),
            hangover_ms: 700,
            policy: Some(no_words),
            words_after_ms: None,
            voice_after_ms: None,
        },
        Row {
            name: "semantic + words after 1 000 ms".into(),
            hangover_ms: 700,
            policy: Some(semantic),
            words_after_ms: Some(1_000),
            voice_after_ms: None,
        },
        Row {
            name: "semantic + words after 1 000 ms, voice 400 ms after them".into(),
            hangover_ms: 700,
            policy: Some(semantic),
            words_after_ms: Some(1_000),
            voice_after_ms: Some(400),
        },
        Row {
            name: "semantic + words after 400 ms".into(),
            hangover_ms: 700,
            policy: Some(semantic),
            words_after_ms: Some(400),
            voice_after_ms: None,
        },
    ]
}

/// The rows of a sweep: `VOXLINE_BENCH_SWEEP` is `name=v,v;name=v,...`
/// over the [`TurnPolicy`] fields `threshold`, `incomplete_below`,
/// `complete_ms`, `incomplete_ms`, `merge_ms`, and `words_after_ms` (the
/// words' delay, default 1 000); every combination is a row of the
/// semantic policy with the words, the rest at their defaults. The
/// trade-off curve of issue 63 (pauses cut, pairs merged, commit delay) is
/// read from one such run on `speakers/tune`.
fn sweep(spec: &str) -> Result<Vec<Row>, String> {
    let mut grid: Vec<(String, Vec<f64>)> = Vec::new();
    for part in spec.split(';').filter(|p| !p.trim().is_empty()) {
        let (name, values) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not name=v,v"))?;
        let values = values
            .split(',')
            .map(|v| v.trim().parse::<f64>().map_err(|e| format!("{v:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        grid.push((name.trim().to_owned(), values));
    }
    let mut rows = vec![(TurnPolicy::default(), 1_000_u32, String::new())];
    for (name, values) in &grid {
        let mut next = Vec::new();
        for (policy, words_after, label) in &rows {
            for &v in values {
                let mut p = *policy;
                let mut w = *words_after;
                match name.as_str() {
                    "threshold" => p.threshold = v as f32,
                    "incomplete_below" => p.incomplete_below = v as f32,
                    "complete_ms" => p.complete_ms = v as u32,
                    "incomplete_ms" => p.incomplete_ms = v as u32,
                    "merge_ms" => p.merge_ms = v as u32,
                    "words_after_ms" => w = v as u32,
                    other => return Err(format!("no policy field {other:?}")),
                }
                p.validate().map_err(|e| format!("{name}={v}: {e}"))?;
                let sep = if label.is_empty() { "" } else { ", " };
                next.push((p, w, format!("{label}{sep}{name} {v}")));
            }
        }
        rows = next;
    }
    Ok(rows
        .into_iter()
        .map(|(policy, words_after, name)| Row {
            name,
            hangover_ms: 700,
            policy: Some(policy),
            words_after_ms: Some(words_after),
            voice_after_ms: None,
        })
        .collect())
}

/// whisper's transcript of each attempt's audio, kept: the same attempt
/// comes back under every policy.
struct Ear {
    stt: SttEngine,
    seen: HashMap<(usize, u64), String>,
}

impl Ear {
    fn hear(&mut self, audio: &[f32]) -> String {
        // an attempt's audio is known by its length and a checksum
        let sum = audio
            .iter()
            .step_by(97)
            .fold(0u64, |h, v| h.rotate_left(5) ^ u64::from(v.to_bits()));
        let key = (audio.len(), sum);
        if let Some(t) = self.seen.get(&key) {
            return t.clone();
        }
        let t = self
            .stt
            .transcribe(audio)
            .map(|t| t.text)
            .unwrap_or_default();
        self.seen.insert(key, t.clone());
        t
    }
}

fn turns(
    audio: &[f32],
    row: &Row,
    model: &SharedTurnModel,
    ear: &mut Ear,
) -> (Vec<pauses::Turn>, usize) {
    let mut hear = |a: &[f32]| ear.hear(a);
    let hearing = row.words_after_ms.map(|ms| pauses::Hearing {
        hear: &mut hear,
        delay: u64::from(ms) * 16,
        voice: row.voice_after_ms.map(|v| u64::from(v) * 16),
        played: None,
    });
    let (t, merged) = pauses::turns_heard(
        audio,
        row.hangover_ms,
        row.policy.map(|p| (model, p)),
        hearing,
    );
    (t, merged.len())
}

/// With `VOXLINE_BENCH_VERBOSE`, what whisper hears in each of `turns`
/// (for the lists of clips cut and pairs not apart), else nothing.
fn said(turns: &[pauses::Turn], audio: &[f32], ear: &mut Ear) -> String {
    if std::env::var_os("VOXLINE_BENCH_VERBOSE").is_none() {
        return String::new();
    }
    let heard: Vec<String> = turns
        .iter()
        .map(|t| {
            let (a, b) = (t.start as usize, (t.end as usize).min(audio.len()));
            format!("{:?}", ear.hear(&audio[a.min(b)..b]))
        })
        .collect();
    format!(" [{}]", heard.join(" | "))
}

/// Whether `turns` cut clip `c`: a committed turn ends more than [`SLACK`]
/// before the sentence does, and either a later turn holds more of it or
/// the turn ended at or before an inserted pause (what followed is in no
/// turn). One turn whose end the detector places early (a soft final
/// consonant: "meters" in `ps-goforward`), with nothing after it, holds the
/// whole sentence: not a cut (until 2026-12-06 it counted as one).
fn cut_at_a_pause(turns: &[pauses::Turn], c: &pauses::PauseClip) -> bool {
    let end = c.speech.1 as u64;
    let last_pause_end = c
        .pauses
        .iter()
        .map(|&(at, len)| (at + len) as u64)
        .max()
        .unwrap_or(0);
    turns.iter().any(|x| {
        x.end + SLACK < end && (x.end <= last_pause_end || turns.iter().any(|y| y.start >= x.end))
    })
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// 200 ms: a turn ending this much before a sentence's end cut it.
const SLACK: u64 = 3_200;

fn main() {
    // VOXLINE_LOG: the stage's own account of each decision (e.g.
    // `voxline_audio=debug`), with VOXLINE_BENCH_CLIPS to follow a few clips
    if let Ok(filter) = std::env::var("VOXLINE_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let dir = std::env::var_os("VOXLINE_SPEECH_DIR")
        .map_or_else(|| util::fixture("human"), PathBuf::from);
    let models = util::models_dir();
    let model = SharedTurnModel::new(
        TurnModel::load(
            &models.join(voxline_models::registry::SMART_TURN.file),
            &models.join(voxline_models::registry::ONNX_RUNTIME.file),
            1,
        )
        .expect("the end-of-turn model (voxline models fetch)"),
    );
    let mut ear = Ear {
        stt: SttEngine::load(SttConfig::new(util::whisper_model(), util::threads_each()))
            .expect("the whisper model (voxline models fetch)"),
        seen: HashMap::new(),
    };
    let mut sentences = pauses::human_sentences(&dir);
    sentences.extend(pauses::piper_sentences(&models));
    // VOXLINE_BENCH_CLIPS: only the clips whose name holds it
    let clips = std::env::var("VOXLINE_BENCH_CLIPS").unwrap_or_default();
    let mut corpus = pauses::corpus(&sentences);
    corpus.retain(|c| c.name.contains(clips.as_str()));
    let mut pairs = pauses::pairs(&sentences);
    pairs.retain(|p| p.name.contains(clips.as_str()));
    let multi = util::read_16k(&util::fixture("multi_turn.wav"));
    println!(
        "{} sentences ({} human, {} Piper): {} pause clips, {} pair clips (gaps {:?} ms).\n",
        sentences.len(),
        sentences.iter().filter(|s| s.kind == "human").count(),
        sentences.iter().filter(|s| s.kind == "piper").count(),
        corpus.len(),
        pairs.len(),
        pauses::PAIR_GAPS_MS
    );
    println!("| policy | kind | pause clips cut (of) | one turn, its end placed early | pause clips taken back | commit after a complete sentence p50 / p95 ms | pair sentences on their own (of) | pairs merged into one turn | multi_turn.wav turns (3 asked) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    // VOXLINE_BENCH_ROWS: only the row of that name, or else the rows
    // whose name holds it
    let only = std::env::var("VOXLINE_BENCH_ROWS").unwrap_or_default();
    // VOXLINE_BENCH_SWEEP: a grid of policies in place of the rows
    let rows = match std::env::var("VOXLINE_BENCH_SWEEP") {
        Ok(spec) => sweep(&spec).unwrap_or_else(|e| {
            eprintln!("VOXLINE_BENCH_SWEEP={spec:?}: {e}");
            std::process::exit(2)
        }),
        Err(_) => rows(),
    };
    let exact = rows.iter().any(|r| r.name == only);
    for row in rows.into_iter().filter(|r| {
        if exact {
            r.name == only
        } else {
            r.name.contains(only.as_str())
        }
    }) {
        let (multi_turns, _) = turns(&multi, &row, &model, &mut ear);
        // VOXLINE_BENCH_KINDS: only "human" or "piper"
        let kinds = std::env::var("VOXLINE_BENCH_KINDS").unwrap_or_default();
        for kind in ["human", "piper"]
            .into_iter()
            .filter(|k| kinds.is_empty() || kinds.contains(k))
        {
            let (mut cut, mut early, mut taken, mut n) = (0, 0, 0, 0);
            let mut delays = Vec::new();
            let mut cut_names = Vec::new();
            for c in corpus.iter().filter(|c| c.kind == kind) {
                n += 1;
                let (t, merged) = turns(&c.audio, &row, &model, &mut ear);
                taken += usize::from(merged > 0);
                let end = c.speech.1 as u64;
                if cut_at_a_pause(&t, c) {
                    cut += 1;
                    cut_names.push(format!("{}{}", c.name, said(&t, &c.audio, &mut ear)));
                } else if t.iter().any(|x| x.end + SLACK < end) {
                    early += 1;
                }
                if c.pauses.is_empty() {
                    if let Some(x) = t.iter().rfind(|x| x.end + SLACK >= end) {
                        delays.push(voxline_core::Clock::samples_to_ms(
                            x.closed.saturating_sub(end),
                        ));
                    }
                }
            }
            let (mut own, mut of, mut merged_pairs) = (0, 0, 0);
            let mut lost = Vec::new();
            for p in pairs.iter().filter(|p| p.kind == kind) {
                let (t, _) = turns(&p.audio, &row, &model, &mut ear);
                let [(s1, e1), (s2, e2)] = p.speech.map(|(a, b)| (a as u64, b as u64));
                // the first: a turn ending at its end, before the second starts
                let first = t
                    .iter()
                    .any(|x| x.end + SLACK >= e1 && x.end < s2 && x.start <= s1 + SLACK);
                // the second: a turn starting after the first ended, to its end
                let second = t.iter().any(|x| x.start >= e1 && x.end + SLACK >= e2);
                own += usize::from(first) + usize::from(second);
                of += 2;
                if t.iter()
                    .any(|x| x.start <= s1 + SLACK && x.end + SLACK >= e2)
                {
                    merged_pairs += 1;
                }
                if !(first && second) {
                    lost.push(format!("{}{}", p.name, said(&t, &p.audio, &mut ear)));
                }
            }
            println!(
                "| {} | {kind} | {cut} ({n}) | {early} | {taken} | {:.0} / {:.0} | {own} ({of}) | {merged_pairs} | {} |",
                row.name,
                percentile(&mut delays, 0.5),
                percentile(&mut delays, 0.95),
                multi_turns.len(),
            );
            if std::env::var_os("VOXLINE_BENCH_VERBOSE").is_some() {
                eprintln!(
                    "{} / {kind}: cut\n  {}\npairs not apart\n  {}",
                    row.name,
                    cut_names.join("\n  "),
                    lost.join("\n  ")
                );
            }
        }
    }
    if "whisper on the whole clip".contains(only.as_str()) {
        junctions(&corpus, &pairs, &mut ear);
    }
    if std::env::var_os("VOXLINE_BENCH_VERBOSE").is_some() {
        for t in ear.seen.values() {
            eprintln!("heard: {t}");
        }
    }
}

/// Whether whisper, hearing the speech before a pause and the speech after
/// it as one clip, ends a sentence at the pause: the word at the end of
/// what it heard before the pause alone (by count) carries a final `.`,
/// `?` or `!`. Whether that separates a pause inside a sentence (whose
/// first part whisper, hearing it alone, often writes as a sentence) from
/// two sentences, on both corpora: a measure for a second look at a turn
/// taken back, not a policy the stage runs.
fn junctions(corpus: &[pauses::PauseClip], pairs: &[pauses::PairClip], ear: &mut Ear) {
    let words = |t: &str| -> Vec<String> { t.split_whitespace().map(str::to_owned).collect() };
    let verbose = std::env::var_os("VOXLINE_BENCH_VERBOSE").is_some();
    // what whisper writes at the pause heard whole: Some(true) a sentence
    // end, Some(false) none, None whisper dropped what followed
    let mut ends_at = |audio: &[f32], at: usize| -> Option<Option<bool>> {
        let before = words(&ear.hear(&audio[..at]));
        let whole = words(&ear.hear(audio));
        // only where what came before reads as a sentence on its own
        let alone = before.last()?;
        if !alone.ends_with(['.', '?', '!']) {
            return None;
        }
        // whisper may stop at a long pause and drop what follows
        if whole.len() <= before.len() {
            if verbose {
                eprintln!("  dropped: {:?} / {:?}", before.join(" "), whole.join(" "));
            }
            return Some(None);
        }
        let end = whole[before.len() - 1].ends_with(['.', '?', '!']);
        if verbose {
            eprintln!("  {end}: {:?} / {:?}", before.join(" "), whole.join(" "));
        }
        Some(Some(end))
    };
    // the clip with its silence from `at` (`len` samples) cut to `keep`
    let shortened = |audio: &[f32], at: usize, len: usize, keep: usize| -> Vec<f32> {
        let mut v = audio[..at + keep.min(len)].to_vec();
        v.extend_from_slice(&audio[at + len..]);
        v
    };
    println!("\n| whisper on the whole clip | silence at the pause | kind | clips whose part before the pause reads as a sentence alone | of those, a sentence end at the pause in the whole | whisper dropped what followed |");
    println!("|---|---|---|---|---|---|");
    for keep_ms in [None, Some(300usize)] {
        let gap = keep_ms.map_or("as recorded".to_owned(), |ms| format!("cut to {ms} ms"));
        let keep = |len: usize| keep_ms.map_or(len, |ms| ms * 16);
        for kind in ["human", "piper"] {
            let (mut n, mut ends, mut dropped) = (0, 0, 0);
            for c in corpus.iter().filter(|c| c.kind == kind) {
                let Some(&(at, len)) = c.pauses.first() else {
                    continue;
                };
                let audio = shortened(&c.audio, at, len, keep(len));
                if let Some(end) = ends_at(&audio, at) {
                    n += 1;
                    ends += usize::from(end == Some(true));
                    dropped += usize::from(end.is_none());
                }
            }
            println!("| a pause inside a sentence | {gap} | {kind} | {n} | {ends} (should be 0) | {dropped} (should be 0) |");
            let (mut n, mut ends, mut dropped) = (0, 0, 0);
            for p in pairs.iter().filter(|p| p.kind == kind) {
                let (at, len) = (p.speech[0].1, p.speech[1].0 - p.speech[0].1);
                let audio = shortened(&p.audio, at, len, keep(len));
                if let Some(end) = ends_at(&audio, at) {
                    n += 1;
                    ends += usize::from(end == Some(true));
                    dropped += usize::from(end.is_none());
                }
            }
            println!(
                "| two sentences | {gap} | {kind} | {n} | {ends} (should be all) | {dropped} |"
            );
        }
    }
}
