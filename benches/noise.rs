//! Whether a transcript is words or noise: whisper's own signals on
//! non-speech sounds against real questions, loud and quiet.
//!
//! `cargo bench --bench noise` (optimised build; needs `voxline models
//! fetch`). Transcribes, with the pipeline's STT settings:
//!
//! - non-speech sounds made here (hums at 50 and 60 Hz with their
//!   harmonics, 1.5, 4 and 8 s long, alone and in room noise, mains
//!   without harmonics, tones, a chord, noise, clicks, a fan), each at
//!   three levels;
//! - every recording in `audio-fixtures/human` and `VOXLINE_HUMAN_DIR`
//!   (real people) and the espeak-ng questions in `audio-fixtures`, each as
//!   recorded, 20 and 30 dB quieter, and over a 50 Hz hum.
//!
//! Prints each transcript with its no-speech probability and mean token
//! log-probability, and whether [`voxline_stt::not_words`] (the rule the
//! STT stage applies) takes it for noise. The rule must take every sound
//! and no question. Both engines by default; `-- whisper` or `-- ct2` for one.

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

use std::f64::consts::TAU;
use std::path::PathBuf;

use voxline_stt::{not_words, SpeechToText, SttConfig, SttEngine};

/// `secs` of `f(t)` at 16 kHz, peak `level` (of full scale).
fn sound(secs: f64, level: f64, mut f: impl FnMut(f64) -> f64) -> Vec<f32> {
    let n = (secs * 16_000.0) as usize;
    let raw: Vec<f64> = (0..n).map(|i| f(i as f64 / 16_000.0)).collect();
    let peak = raw.iter().fold(1e-9f64, |m, x| m.max(x.abs()));
    raw.iter().map(|x| (x / peak * level) as f32).collect()
}

/// A mains hum at `base` Hz with its harmonics.
fn hum(base: f64) -> impl Fn(f64) -> f64 + Copy {
    move |t: f64| {
        (1..8)
            .map(|k| 0.4 / f64::from(k) * (TAU * base * f64::from(k) * t).sin())
            .sum::<f64>()
    }
}

fn sounds() -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    for level in [0.7f64, 0.3, 0.05] {
        let db = (20.0 * level.log10()).round();
        let mut add = |name: &str, x: Vec<f32>| out.push((format!("{name} {db} dBFS"), x));
        add("hum 50 Hz", sound(4.0, level, hum(50.0)));
        add("hum 60 Hz", sound(4.0, level, hum(60.0)));
        // the VAD cuts a steady sound into utterances of any length
        for secs in [1.5, 8.0] {
            add(
                &format!("hum 50 Hz, {secs} s"),
                sound(secs, level, hum(50.0)),
            );
            add(
                &format!("hum 60 Hz, {secs} s"),
                sound(secs, level, hum(60.0)),
            );
        }
        add(
            "mains 50 Hz, no harmonics",
            sound(4.0, level, |t| (TAU * 50.0 * t).sin()),
        );
        let mut n = util::noise(13);
        add(
            "hum 50 Hz in room noise",
            sound(4.0, level, move |t| hum(50.0)(t) + 0.1 * n()),
        );
        add("hum 100 Hz", sound(4.0, level, |t| (TAU * 100.0 * t).sin()));
        add(
            "tone 440 Hz",
            sound(4.0, level, |t| (TAU * 440.0 * t).sin()),
        );
        add(
            "chord",
            sound(4.0, level, |t| {
                [261.6, 329.6, 392.0]
                    .iter()
                    .map(|f| (TAU * f * t).sin())
                    .sum::<f64>()
                    * (0.5 + 0.5 * (TAU * 2.0 * t).sin())
            }),
        );
        add(
            "melody",
            sound(4.0, level, |t| {
                let notes = [261.6, 293.7, 329.6, 349.2, 392.0, 440.0, 493.9, 523.3];
                let f = notes[((t * 4.0) as usize) % notes.len()];
                let env = 1.0 - (t * 4.0).fract();
                env * ((TAU * f * t).sin() + 0.3 * (TAU * 2.0 * f * t).sin())
            }),
        );
        let mut n = util::noise(7);
        add("white noise", sound(4.0, level, |_| n()));
        let mut n = util::noise(11);
        let mut brown = 0.0;
        add(
            "fan (brown noise)",
            sound(4.0, level, move |_| {
                brown = (brown + 0.05 * n()) * 0.995;
                brown
            }),
        );
        add(
            "clicks",
            sound(4.0, level, |t| {
                let phase = (t * 3.0).fract();
                if phase < 0.002 {
                    1.0
                } else {
                    0.0
                }
            }),
        );
    }
    out
}

fn speech() -> Vec<(String, Vec<f32>)> {
    let mut dirs = vec![util::fixture("human"), util::fixtures_dir()];
    if let Some(d) = std::env::var_os("VOXLINE_HUMAN_DIR") {
        dirs.push(PathBuf::from(d));
    }
    let mut out = Vec::new();
    for dir in dirs {
        let paths = util::wavs_in(&dir)
            .into_iter()
            .filter(|p| p.file_stem().is_none_or(|s| s != "silence"));
        for p in paths {
            let x = util::read_16k(&p);
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            for db in [0.0f32, -20.0, -30.0] {
                let g = 10f32.powf(db / 20.0);
                out.push((
                    format!("{name} {db:+} dB"),
                    x.iter().map(|s| s * g).collect(),
                ));
            }
            // the same question asked over a mains hum (-26 dBFS)
            let mut mixed = sound(x.len() as f64 / 16_000.0, 0.05, hum(50.0));
            mixed.resize(x.len(), 0.0);
            for (h, s) in mixed.iter_mut().zip(&x) {
                *h += s;
            }
            out.push((format!("{name} over a 50 Hz hum"), mixed));
        }
    }
    out
}

/// The engine named `name`, with the pipeline's STT settings.
fn engine(name: &str) -> Box<dyn SpeechToText> {
    let threads = util::threads_each();
    match name {
        "whisper" => Box::new(
            SttEngine::load(SttConfig::new(util::whisper_model(), threads))
                .expect("the whisper model (voxline models fetch)"),
        ),
        "ct2" => {
            let m = util::models_dir();
            Box::new(
                voxline_ct2::Ct2Engine::load(voxline_ct2::Ct2Config {
                    model_dir: m.join(voxline_models::registry::CT2_WHISPER_DIR),
                    library: m.join(voxline_models::registry::CT2_LIBRARY.file),
                    threads,
                    beam: 1,
                    compute: voxline_ct2::Compute::default(),
                })
                .expect("the CTranslate2 engine (voxline models fetch)"),
            )
        }
        other => panic!("{other}: the engines are whisper and ct2"),
    }
}

fn main() {
    let asked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a == "whisper" || a == "ct2")
        .collect();
    let names = if asked.is_empty() {
        vec!["whisper".to_owned(), "ct2".to_owned()]
    } else {
        asked
    };
    for name in names {
        println!(
            "
## {name}"
        );
        decide(engine(&name).as_mut());
    }
}

/// Transcribes every clip with `stt` and prints the decisions.
fn decide(stt: &mut dyn SpeechToText) {
    let mut wrong = 0;
    for (kind, clips) in [("sound", sounds()), ("speech", speech())] {
        println!("\n| {kind} | transcript | no-speech p | mean logprob | taken for noise |");
        println!("|---|---|---|---|---|");
        for (name, x) in clips {
            let t = stt.transcribe(&x, false, &|| false).expect("transcribes");
            let c = t.confidence.expect("whisper says");
            let noise = not_words(&t.text, c).is_some() || voxline_core::non_speech(&t.text);
            if noise != (kind == "sound") {
                wrong += 1;
            }
            println!(
                "| {name} | {:?} | {:.3} | {:.2} | {} |",
                t.text,
                c.no_speech,
                c.avg_logprob,
                if noise { "yes" } else { "no" }
            );
        }
    }
    println!("\nwrong decisions: {wrong}");
}
