//! The CTranslate2 engine on the real model and real recordings: what it
//! hears, that it says when it heard no words, that it stops when asked,
//! that replicas share the weights across threads, and that a missing or
//! broken model is an error that says what to do.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use voxline_audio::WavSource;
use voxline_ct2::{Ct2Config, Ct2Engine};
use voxline_models::registry;
use voxline_stt::{not_words, word_error_rate, SpeechToText, SttError};

fn models() -> PathBuf {
    std::env::var_os("VOXLINE_MODELS_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"),
        PathBuf::from,
    )
}

fn config(threads: usize) -> Ct2Config {
    let m = models();
    Ct2Config {
        model_dir: m.join(registry::CT2_WHISPER_DIR),
        library: m.join(registry::CT2_LIBRARY.file),
        threads,
        beam: 1,
        compute: voxline_ct2::Compute::default(),
    }
}

fn load() -> Ct2Engine {
    Ct2Engine::load(config(2)).expect("the CTranslate2 engine (run `voxline models fetch`)")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../audio-fixtures")
}

/// A recording, 16 kHz mono.
fn audio(path: &Path) -> Vec<f32> {
    let mut src = WavSource::open(path).unwrap();
    let mut out = Vec::new();
    while let Some(c) = src.next_chunk().unwrap() {
        out.extend_from_slice(&c);
    }
    out
}

/// The recordings of real people and what they said.
fn human() -> Vec<(PathBuf, String)> {
    let dir = fixtures().join("human");
    let mut v: Vec<(PathBuf, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "wav").then_some(p)
        })
        .map(|wav| {
            let meta: serde_json::Value =
                serde_json::from_slice(&std::fs::read(wav.with_extension("json")).unwrap())
                    .unwrap();
            let text = meta["turns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["text"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
                .join(" ");
            (wav, text)
        })
        .collect();
    v.sort();
    v
}

const NEVER: &(dyn Fn() -> bool + Sync) = &|| false;

#[test]
fn real_people_are_heard_as_well_as_whisper_cpp_hears_them() {
    let mut e = load();
    let clips = human();
    assert!(clips.len() >= 9, "{}", clips.len());
    let (mut errors, mut words) = (0.0, 0.0);
    for (wav, reference) in &clips {
        let t = e.transcribe(&audio(wav), false, NEVER).unwrap();
        let n = reference.split_whitespace().count() as f64;
        errors += word_error_rate(reference, &t.text) * n;
        words += n;
        let c = t.confidence.expect("CTranslate2 says how sure it is");
        assert!(not_words(&t.text, c).is_none(), "{}: {t:?}", wav.display());
        assert!(t.n_tokens > 0 && t.audio_ms > 1000.0, "{t:?}");
        assert!(c.avg_logprob < 0.0 && c.avg_logprob > -1.5, "{t:?}");
    }
    // whisper.cpp's tiny.en on the same recordings: 2 word errors in 64
    // ("old-fashioned" heard as "old-sposed"); CTranslate2's: the same
    let pooled = errors / words;
    assert!(pooled <= 0.05, "pooled WER {pooled:.3}");
}

#[test]
fn silence_is_judged_no_words_and_a_chunk_is_decoded_with_timestamps() {
    let mut e = load();
    let t = e.transcribe(&vec![0.0; 48_000], false, NEVER).unwrap();
    let c = t.confidence.unwrap();
    assert!(not_words(&t.text, c).is_some(), "{t:?}");
    // a long piece, decoded as a chunk: all its words, no timestamp text
    let long = audio(&fixtures().join("long_10s.wav"));
    let t = e.transcribe(&long, true, NEVER).unwrap();
    assert!(!t.text.contains("<|"), "{t:?}");
    assert!(t.text.split_whitespace().count() >= 25, "{t:?}");
}

#[test]
fn an_abort_stops_it_and_threads_follow_the_pipeline() {
    let mut e = load();
    let q = audio(&fixtures().join("q_capital.wav"));
    let r = e.transcribe(&q, false, &|| true);
    assert!(matches!(r, Err(SttError::Aborted)), "{r:?}");
    // polled between the encoder's steps (its two convolutions, each of
    // tiny's four layers) and before the decoder: an abort that comes as
    // the encoder starts stops it at its next step, not after all of it
    let mut polls = |stop_at: usize| {
        let n = AtomicUsize::new(0);
        let r = e.transcribe(&q, false, &|| {
            n.fetch_add(1, Ordering::SeqCst) + 1 == stop_at
        });
        (r, n.into_inner())
    };
    let (whole, all) = polls(usize::MAX);
    assert!(whole.is_ok(), "{whole:?}");
    assert!(all >= 7, "polled {all} times over a whole transcription");
    let (r, stopped) = polls(2);
    assert!(matches!(r, Err(SttError::Aborted)), "{r:?}");
    assert_eq!(stopped, 2, "stopped after the second convolution");
    // the engine computes with the threads it is given, call by call
    let two = e.transcribe(&q, false, NEVER).unwrap();
    e.set_threads(1);
    assert_eq!(e.threads(), 1);
    let one = e.transcribe(&q, false, NEVER).unwrap();
    assert_eq!(one.text, two.text);
    assert_eq!(
        word_error_rate("What is the capital of France?", &one.text),
        0.0,
        "{one:?}"
    );
}

#[test]
fn replicas_share_the_weights_and_transcribe_at_once() {
    let e = load();
    let clips = human();
    let expected: Vec<String> = {
        let mut e = e.share().unwrap();
        clips
            .iter()
            .map(|(w, _)| e.transcribe(&audio(w), false, NEVER).unwrap().text)
            .collect()
    };
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let mut r = e.share().unwrap();
            r.set_threads(1);
            let clips = clips.clone();
            std::thread::spawn(move || {
                clips
                    .iter()
                    .map(|(w, _)| r.transcribe(&audio(w), false, NEVER).unwrap().text)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), expected);
    }
}

#[test]
fn a_missing_or_broken_model_says_what_to_do() {
    let dir = std::env::temp_dir().join(format!("voxline-ct2-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let with_dir = |d: &Path| Ct2Config {
        model_dir: d.to_owned(),
        ..config(2)
    };
    let e = Ct2Engine::load(with_dir(&dir)).unwrap_err().to_string();
    assert!(
        e.contains("no model.bin") && e.contains("models fetch"),
        "{e}"
    );
    // a model.bin that is not one
    for f in ["config.json", "vocabulary.txt"] {
        std::fs::copy(config(2).model_dir.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("model.bin"), b"not a model").unwrap();
    let e = Ct2Engine::load(with_dir(&dir)).unwrap_err();
    assert!(matches!(e, SttError::EngineLoad { .. }), "{e:?}");
    assert!(e.to_string().contains("could not load it"), "{e}");
    let e = Ct2Engine::load(config(0)).unwrap_err().to_string();
    assert!(e.contains("at least one thread"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
