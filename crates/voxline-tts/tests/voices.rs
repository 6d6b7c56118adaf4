//! Both voices, on the real models: the neural voice's model and runtime as
//! `voxline models fetch --voice piper` installs them in `models/`.

use std::path::PathBuf;
use std::time::Instant;

use voxline_tts::{Espeak, Piper, TextToSpeech, TtsError};

fn models() -> PathBuf {
    std::env::var_os("VOXLINE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"))
}

fn piper() -> Piper {
    let m = models();
    Piper::load(
        &m.join("en_US-joe-medium.onnx"),
        &m.join("libonnxruntime.so.1.31.1"),
        2,
    )
    .expect("the neural voice is installed (voxline models fetch --voice piper)")
}

fn seconds(v: &impl TextToSpeech, a: &[f32]) -> f64 {
    a.len() as f64 / f64::from(v.sample_rate())
}

#[test]
fn the_neural_voice_speaks_phonemes_from_espeak_through_its_map() {
    let mut v = piper();
    assert_eq!(v.sample_rate(), 22_050);
    let ph = v.phonemes("Hello there, how are you?").unwrap();
    assert!(ph.contains(',') && ph.ends_with('?'), "{ph}");
    assert!(ph.contains("həlˈoʊ"), "{ph}");
    let ids = v.ids(&ph);
    assert_eq!(ids.first(), Some(&1), "starts with ^");
    assert_eq!(ids.last(), Some(&2), "ends with $");
    let t = Instant::now();
    let a = v.synthesize("The capital of France is Paris.").unwrap();
    let took = t.elapsed().as_secs_f64();
    let secs = seconds(&v, &a);
    assert!((1.0..4.0).contains(&secs), "{secs} s of audio");
    let peak = a.iter().fold(0f32, |m, s| m.max(s.abs()));
    assert!(peak > 0.1, "audible: peak {peak}");
    eprintln!("piper: {secs:.2} s of audio in {took:.3} s");
    assert!(v.synthesize("...").unwrap().is_empty(), "nothing to say");
}

#[test]
fn a_broken_model_or_runtime_is_an_error_before_any_audio() {
    let dir = tempfile::tempdir().unwrap();
    let m = models();
    let model = dir.path().join("v.onnx");
    std::fs::write(&model, b"this is not an onnx file").unwrap();
    std::fs::copy(
        m.join("en_US-joe-medium.onnx.json"),
        dir.path().join("v.onnx.json"),
    )
    .unwrap();
    let e = Piper::load(&model, &m.join("libonnxruntime.so.1.31.1"), 1).unwrap_err();
    assert!(matches!(e, TtsError::BadVoice { .. }), "{e}");
    assert!(e.to_string().contains("models fetch --voice piper"), "{e}");
    // espeak is there whatever happens to the neural voice
    let mut es = Espeak::new().unwrap();
    let a = es.synthesize("Sure.").unwrap();
    assert!(seconds(&es, &a) > 0.2);
}
