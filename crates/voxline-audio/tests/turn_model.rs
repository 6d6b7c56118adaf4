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
    load_for(1)
}

fn load_for(threads: usize) -> TurnModel {
    let m = models();
    TurnModel::load(
        &m.join("smart-turn-v3.2-cpu.onnx"),
        &m.join("libonnxruntime.so.1.31.1"),
        threads,
    )
    .expect("the end-of-turn model (run `voxline models fetch`)")
}

/// A recording of `audio-fixtures/human`, 16 kHz mono.
fn human(name: &str) -> Vec<f32> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../audio-fixtures/human")
        .join(name);
    let mut src = WavSource::open(&path).unwrap();
    let mut out = Vec::new();
    while let Some(c) = src.next_chunk().unwrap() {
        out.extend_from_slice(&c);
    }
    out
}

/// Real sentences, each spoken whole, then stopped part-way (at 30, 50 and
/// 70 % of the recording, then 200 ms of silence).
const SENTENCES: [&str; 4] = [
    "arctic-a0024.wav",
    "ls-1272-128104-0000.wav",
    "lv-ss-0870.wav",
    "pv-cheetah-en.wav",
];

#[test]
fn whole_sentences_score_complete() {
    let mut model = load();
    for name in SENTENCES
        .iter()
        .skip(1)
        .chain(&["ps-goforward.wav", "ls-2830-3980-0043.wav"])
    {
        let p = model.probability(&human(name)).unwrap();
        assert!(p > 0.9, "{name}: a whole sentence scored {p}");
    }
}

#[test]
fn sentences_stopped_part_way_score_lower_than_whole_ones() {
    let mut model = load();
    let (mut whole, mut cut) = (Vec::new(), Vec::new());
    for name in SENTENCES {
        let audio = human(name);
        whole.push(model.probability(&audio).unwrap());
        for f in [0.3, 0.5, 0.7] {
            let mut part = audio[..(audio.len() as f64 * f) as usize].to_vec();
            part.extend(std::iter::repeat_n(0.0, 3_200));
            cut.push(model.probability(&part).unwrap());
        }
    }
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    let (w, c) = (mean(&whole), mean(&cut));
    eprintln!("whole {whole:?} (mean {w:.2}); stopped part-way {cut:?} (mean {c:.2})");
    assert!(c < w - 0.15, "stopped part-way {c:.2} against whole {w:.2}");
    assert!(cut.iter().filter(|&&p| p < 0.5).count() >= 4, "{cut:?}");
}

/// Loaded for two threads, the model judges the same on one thread (beside
/// the engines) and on both (the cores free): only the time differs.
#[test]
fn one_thread_and_all_threads_judge_alike() {
    let mut model = load_for(2);
    assert_eq!(model.threads(), 2);
    for name in SENTENCES {
        let audio = human(name);
        let cut = &audio[..audio.len() / 2];
        for heard in [&audio[..], cut] {
            let (one, all) = (
                model.probability_on(heard, false).unwrap(),
                model.probability_on(heard, true).unwrap(),
            );
            assert!(
                (one - all).abs() < 1e-4,
                "{name}: {one} on one thread, {all} on two"
            );
        }
    }
}

#[test]
fn a_missing_or_foreign_model_is_named() {
    let m = models();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("smart-turn.onnx");
    let e = TurnModel::load(&missing, &m.join("libonnxruntime.so.1.31.1"), 1).unwrap_err();
    assert!(matches!(e, TurnModelError::Missing { .. }), "{e}");
    assert!(e.to_string().contains("--semantic-turn"), "{e}");
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
