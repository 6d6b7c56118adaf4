//! Both voices, on the real models: the neural voice's model and runtime as
//! `voxline models fetch --voice piper` installs them in `models/`.

use std::path::PathBuf;
use std::time::Instant;

use voxline_tts::{Espeak, Piper, TextToSpeech, TtsError, Until};

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

fn seconds(v: &(impl TextToSpeech + ?Sized), a: &[f32]) -> f64 {
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

/// Text that takes either voice seconds to speak (~100 sentences).
fn long_text() -> String {
    "The quick brown fox jumps over the lazy dog, and then it runs away. ".repeat(100)
}

#[test]
fn a_cancelled_or_overlong_chunk_stops_mid_synthesis_and_the_voice_speaks_on() {
    // (voice, the look that cancels, the limit): Piper's phonemes take
    // espeak-ng ~0.1 s of this text, its network seconds, so it is stopped
    // ~1 s in, in the network (the look every 5 ms); espeak at its third look
    let voices: [(Box<dyn TextToSpeech>, u32, u64); 2] = [
        (Box::new(Espeak::new().unwrap()), 2, 20),
        (Box::new(piper()), 200, 1000),
    ];
    for (mut v, at, limit_ms) in voices {
        let looks = std::sync::atomic::AtomicU32::new(0);
        let cancelled = || looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= at;
        let until = Until {
            cancelled: &cancelled,
            limit: voxline_tts::CHUNK_LIMIT,
        };
        let t = Instant::now();
        let e = v.synthesize_until(&long_text(), &until).unwrap_err();
        eprintln!("{}: cancelled after {:?}", v.name(), t.elapsed());
        assert!(matches!(e, TtsError::Cancelled), "{}: {e}", v.name());
        // over its limit: stopped, and a turn error that says so
        let until = Until {
            cancelled: &|| false,
            limit: std::time::Duration::from_millis(limit_ms),
        };
        let e = v.synthesize_until(&long_text(), &until).unwrap_err();
        assert!(
            matches!(e, TtsError::TooSlow { limit_ms: l } if l == limit_ms),
            "{}: {e}",
            v.name()
        );
        assert!(e.to_string().contains(&format!("{limit_ms} ms")), "{e}");
        // the next chunk is spoken as ever
        let a = v.synthesize("Sure, here it is.").unwrap();
        assert!(seconds(v.as_ref(), &a) > 0.3, "{}", v.name());
    }
}
