//! The voice, end to end on the real models: the answer spoken by both
//! voices transcribes back to what was streamed, only committed text is
//! spoken, and a broken voice is refused before any audio.

use std::path::Path;

use crate::speculation::{join, replay_realtime, silence, speak};
use crate::util;
use voxline_stt::{word_error_rate, SttConfig, SttEngine};

/// Replays fixtures at fast pace with `voice`, writing the conversation;
/// returns the report and the WAV's (left, right) channels.
fn replay_spoken(
    dir: &Path,
    voice: &str,
    files: &[&str],
) -> (serde_json::Value, Vec<f32>, Vec<f32>) {
    let (wav, report) = (dir.join(format!("{voice}.wav")), dir.join("r.json"));
    let out = util::voxline_bin()
        .arg("replay")
        .args(files.iter().map(|f| util::fixture(f)))
        .args([
            "--pace",
            "fast",
            "--quiet",
            "--max-tokens",
            "40",
            "--voice",
            voice,
        ])
        .arg("--voice-out")
        .arg(&wav)
        .arg("--report-json")
        .arg(&report)
        .arg("--models-dir")
        .arg(util::models_dir())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut r = hound::WavReader::open(&wav).unwrap();
    assert_eq!((r.spec().channels, r.spec().sample_rate), (2, 16_000));
    let s: Vec<f32> = r
        .samples::<i16>()
        .map(|x| f32::from(x.unwrap()) / 32768.0)
        .collect();
    let left = s.iter().step_by(2).copied().collect();
    let right = s.iter().skip(1).step_by(2).copied().collect();
    (util::read_json(&report), left, right)
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|s| s * s).sum::<f32>() / x.len().max(1) as f32).sqrt()
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn the_spoken_answer_transcribes_back_to_the_streamed_answer_with_both_voices() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let mut stt =
        SttEngine::load(SttConfig::new(util::whisper_model(), util::threads_each())).unwrap();
    for voice in ["espeak", "piper"] {
        let (report, user, assistant) = replay_spoken(
            dir.path(),
            voice,
            &["q_capital.wav", "q_tea.wav", "q_story.wav"],
        );
        let turns = report["turns"].as_array().unwrap();
        assert_eq!(turns.len(), 3, "{voice}");
        let (mut said, mut heard) = (Vec::new(), Vec::new());
        let nominal = |t: &serde_json::Value| {
            let ms = t["timeline"]["end_of_speech_ms"].as_f64().unwrap()
                + t["voice_latency_ms"].as_f64().unwrap();
            (ms * 16.0) as usize
        };
        let first_start = nominal(&turns[0]);
        // an answer starts at its voice latency, or when the one before it has played
        let mut played_to = 0usize;
        for t in turns {
            let response = t["response"].as_str().unwrap();
            let secs = t["voice_audio_s"].as_f64().unwrap();
            assert!(secs > 0.5, "{voice}: {t}");
            let start = nominal(t).max(played_to);
            played_to = start + (secs * 16_000.0) as usize;
            let segment = &assistant[start..(played_to + 1600).min(assistant.len())];
            assert!(
                rms(segment) > 0.01,
                "{voice}: the answer is heard where it was spoken"
            );
            said.push(response.to_owned());
            heard.push(stt.transcribe(segment).unwrap().text);
        }
        let (said, heard) = (said.join(" "), heard.join(" "));
        let wer = word_error_rate(&said, &heard);
        eprintln!("{voice}: round-trip WER {wer:.3}");
        // espeak is deterministic (0.053 in every run); Piper's VITS draws
        // fresh noise for every synthesis, so its round trip through tiny.en
        // varies: 0.079-0.145 over eight runs of the same answers. A voice
        // whose phonemes are wrong is far past either limit (WER > 0.5).
        let limit = if voice == "piper" { 0.2 } else { 0.1 };
        assert!(
            wer <= limit,
            "{voice}: said {said:?}, heard {heard:?}: WER {wer:.3} (limit {limit})"
        );
        // aligned: nothing of the assistant before its first answer, the user on the left
        assert!(
            rms(&assistant[..first_start.saturating_sub(1600)]) < 1e-3,
            "{voice}"
        );
        assert!(rms(&user) > 0.01, "{voice}: the recordings are on the left");
        let s = &report["summary"];
        assert!(
            s["voice_latency_ms"]["n"].as_u64() >= Some(2),
            "{voice}: {s}"
        );
        assert!(s["tts_first_audio_ms"]["p50"].as_f64().is_some(), "{voice}");
        assert_eq!(report["config"]["voice"], voice);
    }
}

#[test]
fn speech_resuming_after_a_300_ms_pause_is_never_spoken_before_its_commit() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let parts = [
        silence(d, "lead", 0.5),
        speak(d, "a", "Tell me a short fact"),
        silence(d, "pause", 0.3),
        speak(d, "b", "about the moon."),
        silence(d, "tail", 3.0),
    ];
    let wav = join(d, "paused.wav", &parts);
    // the hangover's speculation (the semantic end of turn's merge is
    // tested in semantic_turn.rs)
    let (events, report) = replay_realtime(d, &wav, &["--voice", "espeak", "--no-semantic-turn"]);
    let spec = &report["summary"]["speculation"];
    assert!(spec["cancelled"].as_u64().unwrap() >= 1, "{spec}");
    // the voice did no work on a cancelled attempt: it never had its text
    let cancelled_busy = spec["cancelled_busy_ms"].as_object().unwrap();
    assert!(!cancelled_busy.contains_key("tts"), "{spec}");
    let committed = crate::speculation::ids_of(&events, "commit");
    for e in events.iter().filter(|e| e["type"] == "voice_audio") {
        assert!(committed.contains(&e["id"].as_u64().unwrap()), "{e}");
    }
    // what was spoken is the answer, chunk by chunk
    let spoken: Vec<&str> = events
        .iter()
        .filter_map(|e| e["text"].as_str().filter(|_| e["type"] == "voice_audio"))
        .collect();
    let turn = &report["turns"][0];
    let response = turn["response"].as_str().unwrap();
    assert_eq!(spoken.join(" "), voxline_tts::chunk::speakable(response));
    // at real-time pace: the voice follows the response on the wall clock
    let (r, v) = (
        turn["response_latency_ms"].as_f64().unwrap(),
        turn["voice_latency_ms"].as_f64().unwrap(),
    );
    assert!(v >= r, "{turn}");
}

#[test]
fn a_broken_voice_is_one_line_and_exit_2_before_any_audio() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    for f in [
        "ggml-tiny.en-q8_0.bin",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "en_US-joe-medium.onnx.json",
        "libonnxruntime.so.1.31.1",
    ] {
        std::os::unix::fs::symlink(util::models_dir().join(f), models.join(f)).unwrap();
    }
    let run = |extra: &[&str]| {
        let out_wav = dir.path().join("conv.wav");
        let out = util::voxline_bin()
            .arg("replay")
            .arg(util::fixture("q_capital.wav"))
            .args(["--pace", "fast", "--quiet"])
            .args(extra)
            .arg("--voice-out")
            .arg(&out_wav)
            .arg("--models-dir")
            .arg(&models)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{extra:?}: one line: {stderr}"
        );
        assert!(!out_wav.exists(), "nothing written");
        stderr
    };
    // not installed
    let e = run(&["--voice", "piper"]);
    assert!(
        e.contains("en_US-joe-medium.onnx") && e.contains("models fetch"),
        "{e}"
    );
    // a broken model
    std::fs::write(models.join("en_US-joe-medium.onnx"), b"not an onnx model").unwrap();
    let e = run(&["--voice", "piper"]);
    assert!(e.contains("not a usable Piper voice"), "{e}");
    // a library that is no ONNX Runtime
    std::fs::remove_file(models.join("libonnxruntime.so.1.31.1")).unwrap();
    std::fs::write(models.join("libonnxruntime.so.1.31.1"), b"\x7fELF broken").unwrap();
    std::fs::copy(
        util::models_dir().join("en_US-joe-medium.onnx"),
        models.join("en_US-joe-medium.onnx"),
    )
    .unwrap();
    let e = run(&["--voice", "piper"]);
    assert!(e.contains("ONNX Runtime library"), "{e}");
    // no voice to write
    let e = run(&["--voice", "off"]);
    assert!(e.contains("--voice-out"), "{e}");
}

#[test]
fn an_interrupted_answer_stays_in_the_conversation_as_what_was_heard() {
    use voxline_core::{drive, Stage, Transcript};
    let _g = util::engine_lock();
    let s = util::settings(24);
    let engine = voxline_llm::LlmEngine::load(s.llm_config().expect("llama.cpp settings")).unwrap();
    let mut stage = voxline_llm::RunningLlmStage::new(engine);
    let ask = |id: u64, text: &str| Transcript {
        id,
        text: text.into(),
        heard: voxline_core::Heard::Words,
        n_tokens: 6,
        audio_ms: 1500.0,
        start_sample: 0,
        end_sample: 24_000,
        end_wall: std::time::Instant::now(),
    };
    drive(&mut stage, [ask(1, "What is the capital of France?")]).unwrap();
    let full = stage.engine().history()[0].1.clone();
    assert!(full.split_whitespace().count() > 3, "{full}");
    // the user heard the first words only
    let heard: String = full
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    stage.interrupted(1, &heard);
    assert_eq!(
        stage.engine().history()[0].1,
        voxline_llm::interrupted_answer(&heard)
    );
    // a turn it did not answer last is not touched
    stage.interrupted(7, "nothing");
    assert_eq!(stage.engine().history().len(), 1);
    // the next turn follows from what was heard, on the cache it shares with it
    let out = drive(&mut stage, [ask(2, "How far away is the moon?")]).unwrap();
    assert!(!out.is_empty());
    let history = stage.engine().history();
    assert_eq!(history.len(), 2);
    assert!(history[0].1.ends_with("[interrupted]"), "{history:?}");
    // a turn taken back after its voice began (the speaker went on with the
    // same sentence): rolled back whole, and the interruption of its voice,
    // heard of after the rollback, amends nothing that is left
    let before = stage.engine().history().to_vec();
    stage.speculate(3);
    drive(&mut stage, [ask(3, "Go forward.")]).unwrap();
    assert_eq!(stage.engine().history().len(), 3);
    stage.rollback(3).unwrap();
    stage.interrupted(3, "Sure");
    assert_eq!(stage.engine().history(), before.as_slice());
    // The words that stop a voice go on to the language model at once, so
    // the interruption may be heard of after the next turn was answered.
    // That answer stays; the one before it keeps what was heard.
    drive(&mut stage, [ask(4, "Tell me about the sun.")]).unwrap();
    drive(&mut stage, [ask(5, "And the moon?")]).unwrap();
    let answered = stage.engine().history().to_vec();
    let n = answered.len();
    stage.interrupted(4, "The sun");
    let history = stage.engine().history();
    assert_eq!(history[n - 2].1, voxline_llm::interrupted_answer("The sun"));
    assert_eq!(history[n - 1], answered[n - 1], "the last answer stays");
    // heard of while the next turn is an attempt, answered and then taken
    // back: the conversation is rolled back to before the attempt, and
    // keeps what was heard
    stage.speculate(6);
    drive(&mut stage, [ask(6, "Why?")]).unwrap();
    stage.interrupted(5, "The moon");
    assert_eq!(
        stage.engine().history()[n - 1].1,
        voxline_llm::interrupted_answer("The moon")
    );
    stage.rollback(6).unwrap();
    let history = stage.engine().history();
    assert_eq!(history.len(), n, "{history:?}");
    assert_eq!(
        history[n - 1].1,
        voxline_llm::interrupted_answer("The moon")
    );
    assert_eq!(history[n - 2].1, voxline_llm::interrupted_answer("The sun"));
}

/// `--voice-out` beside the other outputs: `-` is a valid WAV on standard
/// output with nothing of the console before it; a voice output that
/// cannot be written (a full device) is exit 2 with the report written.
#[test]
fn the_voice_output_on_stdout_or_a_full_device_loses_nothing_else() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.json");
    let run = |voice_out: &str| {
        util::voxline_bin()
            .arg("replay")
            .arg(util::fixture("q_capital.wav"))
            .args(["--pace", "fast", "--max-tokens", "8", "--voice", "espeak"])
            .args(["--voice-out", voice_out])
            .arg("--report-json")
            .arg(&report)
            .arg("--models-dir")
            .arg(util::models_dir())
            .output()
            .unwrap()
    };
    let o = run("-");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let wav = hound::WavReader::new(std::io::Cursor::new(&o.stdout))
        .expect("standard output is a WAV from its first byte");
    assert_eq!(wav.spec().channels, 2);
    assert!(wav.len() > 16_000, "{} samples", wav.len());
    assert_eq!(util::read_json(&report)["summary"]["completed"], 1);
    std::fs::remove_file(&report).unwrap();
    if std::path::Path::new("/dev/full").exists() {
        let o = run("/dev/full");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("--voice-out /dev/full"), "{err}");
        assert_eq!(util::read_json(&report)["summary"]["completed"], 1, "{err}");
    }
}
