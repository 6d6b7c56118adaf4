//! The end-of-turn model on real speech: complete sentences score complete,
//! the same sentences cut mid-phrase score incomplete. Needs the model and
//! ONNX Runtime that `voxline models fetch` installs (the tests' models).

use std::path::{Path, PathBuf};

use voxline_audio::turn::{TurnModel, TurnModelError};
use voxline_audio::WavSource;

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn load() -> TurnModel {
    let m = models();
    TurnModel::load(
        &m.join("smart-turn-v3.2-cpu.onnx"),
        &m.join("libonnxruntime.so.1.31.1"),
        1,
    )
    .expect("the end-of-turn model (run `voxline models fetch`)")
}

fn fixture(name: &str) -> (Vec<f32>, serde_json::Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../audio-fixtures")
        .join(name);
    let mut src = WavSource::open(&path).unwrap();
    let mut out = Vec::new();
    while let Some(c) = src.next_chunk().unwrap() {
        out.extend_from_slice(&c);
    }
    let sidecar = serde_json::from_slice(&std::fs::read(path.with_extension("json")).unwrap())
        .unwrap();
    (out, sidecar)
}

/// The audio of turn `i` of `name`, with 200 ms of its silence after it.
fn turn(name: &str, i: usize) -> Vec<f32> {
    let (audio, sidecar) = fixture(name);
    let t = &sidecar["turns"][i];
    let start = t["start_sample"].as_u64().unwrap() as usize;
    let end = t["end_sample"].as_u64().unwrap() as usize;
    audio[start..(end + 3_200).min(audio.len())].to_vec()
}

#[test]
fn complete_questions_score_complete() {
    let mut model = load();
    for name in ["q_capital.wav", "q_moon.wav", "q_tea.wav", "q_weather.wav"] {
        let p = model.probability(&turn(name, 0)).unwrap();
        assert!(p > 0.5, "{name}: a whole question scored {p}");
    }
}

#[test]
fn a_sentence_cut_mid_phrase_scores_incomplete() {
    let mut model = load();
    // "What is the capital of France?" stopped after "What is the": the
    // audio up to 40 % of the turn, then silence
    let mut lower = 0;
    for name in ["q_capital.wav", "q_moon.wav", "q_tea.wav", "q_weather.wav"] {
        let whole = turn(name, 0);
        let cut = whole.len() * 2 / 5;
        let mut part = whole[..cut].to_vec();
        part.extend(std::iter::repeat_n(0.0, 3_200));
        let p_part = model.probability(&part).unwrap();
        let p_whole = model.probability(&whole).unwrap();
        if p_part < p_whole {
            lower += 1;
        }
        eprintln!("{name}: whole {p_whole:.3}, cut {p_part:.3}");
    }
    assert!(lower >= 3, "a cut sentence scored below the whole one in only {lower} of 4");
}

#[test]
fn a_missing_or_foreign_model_is_named() {
    let m = models();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("smart-turn.onnx");
    let e = TurnModel::load(&missing, &m.join("libonnxruntime.so.1.31.1"), 1).unwrap_err();
    assert!(matches!(e, TurnModelError::Missing { .. }), "{e}");
    assert!(e.to_string().contains("--no-semantic-turn"), "{e}");
    // another ONNX model: the voice
    let e = TurnModel::load(
        &m.join("en_US-joe-medium.onnx"),
        &m.join("libonnxruntime.so.1.31.1"),
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("not smart-turn"), "{e}");
    std::fs::write(&missing, b"garbage").unwrap();
    let e = TurnModel::load(&missing, &m.join("libonnxruntime.so.1.31.1"), 1).unwrap_err();
    assert!(matches!(e, TurnModelError::Unusable { .. }), "{e}");
}

#[test]
#[ignore]
fn explore() {
    let mut model = load();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../audio-fixtures/human");
    let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "wav")).collect();
    names.sort();
    for p in names {
        let mut src = WavSource::open(&p).unwrap();
        let mut a = Vec::new();
        while let Some(c) = src.next_chunk().unwrap() { a.extend_from_slice(&c); }
        let whole = model.probability(&a).unwrap();
        let mut scores = Vec::new();
        for f in [0.3, 0.5, 0.7, 0.9] {
            let mut part = a[..(a.len() as f64 * f) as usize].to_vec();
            part.extend(std::iter::repeat_n(0.0, 3_200));
            scores.push(format!("{f}:{:.2}", model.probability(&part).unwrap()));
        }
        eprintln!("{}: whole {whole:.3} {}", p.file_name().unwrap().to_string_lossy(), scores.join(" "));
    }
}

#[test]
#[ignore]
fn explore_tail() {
    let mut model = load();
    for name in ["q_capital.wav", "q_moon.wav", "q_tea.wav", "q_weather.wav", "q_story.wav", "multi_turn.wav"] {
        let (audio, sidecar) = fixture(name);
        for t in sidecar["turns"].as_array().unwrap() {
            let start = t["start_sample"].as_u64().unwrap() as usize;
            let end = t["end_sample"].as_u64().unwrap() as usize;
            let mut s = Vec::new();
            for tail in [0usize, 800, 1600, 3200, 4800, 8000] {
                let a = &audio[start.saturating_sub(3200)..(end + tail).min(audio.len())];
                s.push(format!("{tail}:{:.2}", model.probability(a).unwrap()));
            }
            let mut z = audio[start.saturating_sub(3200)..end].to_vec();
            z.extend(std::iter::repeat_n(0.0, 3200));
            s.push(format!("zeros:{:.2}", model.probability(&z).unwrap()));
            eprintln!("{name} {:?}: {}", t["text"].as_str().unwrap(), s.join(" "));
        }
    }
}

#[test]
#[ignore]
fn explore_cost() {
    for threads in [1, 2] {
        let m = models();
        let mut model = TurnModel::load(&m.join("smart-turn-v3.2-cpu.onnx"), &m.join("libonnxruntime.so.1.31.1"), threads).unwrap();
        let a = turn("q_capital.wav", 0);
        let mut f = voxline_audio::turn::TurnFeatures::new();
        let t = std::time::Instant::now();
        for _ in 0..10 { let _ = f.compute(&a); }
        let feat = t.elapsed() / 10;
        let t = std::time::Instant::now();
        for _ in 0..10 { let _ = model.probability(&a).unwrap(); }
        eprintln!("threads {threads}: features {feat:?}, whole call {:?}", t.elapsed() / 10);
    }
}

#[test]
#[ignore]
fn explore_dither() {
    let mut model = load();
    for amp in [0.0f32, 3e-4, 1e-3, 3e-3] {
        let mut line = Vec::new();
        for name in ["q_capital.wav", "q_moon.wav", "q_tea.wav", "q_weather.wav", "q_story.wav", "multi_turn.wav"] {
            let (audio, sidecar) = fixture(name);
            for t in sidecar["turns"].as_array().unwrap() {
                let start = t["start_sample"].as_u64().unwrap() as usize;
                let end = t["end_sample"].as_u64().unwrap() as usize;
                let mut seed = 12345u32;
                let a: Vec<f32> = audio[start.saturating_sub(3200)..(end + 3200).min(audio.len())].iter().map(|&x| {
                    seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                    x + amp * ((seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0)
                }).collect();
                line.push(format!("{:.2}", model.probability(&a).unwrap()));
            }
        }
        eprintln!("amp {amp}: {}", line.join(" "));
    }
}
