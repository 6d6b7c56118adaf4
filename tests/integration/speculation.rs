//! Speculative turn-taking and the CPU budget, on real speech and real engines:
//! a turn sent early and cancelled leaves nothing behind, the continued
//! utterance is answered once, and no more engine threads ever run at once
//! than the budget.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util;

/// Speaks `text` (espeak-ng, the fixtures' voice) trimmed of silence, to `out`.
pub(crate) fn speak(dir: &Path, key: &str, text: &str) -> PathBuf {
    let raw = dir.join(format!("{key}.raw.wav"));
    let out = dir.join(format!("{key}.wav"));
    assert!(Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "150", "-w"])
        .arg(&raw)
        .arg(text)
        .status()
        .expect("espeak-ng runs (installed by .ci/setup.sh)")
        .success());
    assert!(Command::new("sox")
        .arg(&raw)
        .args(["-r", "16000"])
        .arg(&out)
        .args([
            "norm", "-3", "silence", "1", "0.01", "0.1%", "reverse", "silence", "1", "0.01",
            "0.1%", "reverse"
        ])
        .status()
        .unwrap()
        .success());
    out
}

/// `secs` of silence at 16 kHz.
pub(crate) fn silence(dir: &Path, key: &str, secs: f64) -> PathBuf {
    let out = dir.join(format!("{key}.wav"));
    assert!(Command::new("sox")
        .args(["-n", "-r", "16000", "-c", "1", "-b", "16"])
        .arg(&out)
        .args(["trim", "0", &secs.to_string()])
        .status()
        .unwrap()
        .success());
    out
}

/// The parts joined into one recording.
pub(crate) fn join(dir: &Path, name: &str, parts: &[PathBuf]) -> PathBuf {
    let out = dir.join(name);
    assert!(Command::new("sox")
        .args(parts)
        .arg(&out)
        .status()
        .unwrap()
        .success());
    out
}

/// Replays `wav` in real time with the events and the report; returns both.
pub(crate) fn replay_realtime(
    dir: &Path,
    wav: &Path,
    extra: &[&str],
) -> (Vec<serde_json::Value>, serde_json::Value) {
    let (events, report) = (dir.join("e.jsonl"), dir.join("r.json"));
    let out = util::voxline_bin()
        .arg("replay")
        .arg(wav)
        .args(["--pace", "realtime", "--quiet", "--max-tokens", "24"])
        .args(extra)
        .arg("--events")
        .arg(&events)
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
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (events, util::read_json(&report))
}

pub(crate) fn ids_of(events: &[serde_json::Value], kind: &str) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| e["id"].as_u64().unwrap())
        .collect()
}

/// Nothing but `spec_start`/`spec_cancel` names a cancelled attempt.
fn assert_cancelled_leave_no_trace(events: &[serde_json::Value]) {
    let cancelled = ids_of(events, "spec_cancel");
    assert!(!cancelled.is_empty(), "an attempt was cancelled");
    for e in events {
        let kind = e["type"].as_str().unwrap();
        if let Some(id) = e["id"].as_u64() {
            if cancelled.contains(&id) {
                assert!(
                    kind == "spec_start" || kind == "spec_cancel",
                    "an event of cancelled attempt {id} reached the log: {e}"
                );
            }
        }
    }
}

#[test]
fn speech_resuming_after_a_300_ms_pause_cancels_the_attempt_and_the_utterance_is_answered_once() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = speak(d, "a", "Tell me a short fact");
    let b = speak(d, "b", "about the moon.");
    let parts = [
        silence(d, "lead", 0.5),
        a,
        silence(d, "pause", 0.3),
        b,
        silence(d, "tail", 1.5),
    ];
    let wav = join(d, "paused.wav", &parts);
    // the hangover's speculation (the semantic end of turn would end the
    // first part and take it back: tested in semantic_turn.rs)
    let (events, report) = replay_realtime(d, &wav, &["--warmup", "1", "--no-semantic-turn"]);
    assert_cancelled_leave_no_trace(&events);
    assert_eq!(ids_of(&events, "commit").len(), 1, "one turn committed");
    let transcripts: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "transcript")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(transcripts.len(), 1, "{transcripts:?}");
    let heard = transcripts[0].to_lowercase();
    assert!(
        heard.contains("fact") && heard.contains("moon"),
        "the continued utterance: {heard}"
    );
    assert_eq!(ids_of(&events, "turn_complete").len(), 1, "answered once");
    let turns = report["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1);
    assert!(turns[0]["response"].as_str().is_some_and(|r| !r.is_empty()));
    // the warm-up is the first turn, not the first attempt
    assert_eq!(turns[0]["warmup"], true, "{}", turns[0]);
    let spec = &report["summary"]["speculation"];
    assert!(
        spec["cancelled"].as_u64().unwrap() >= 1 && spec["committed"] == 1,
        "{spec}"
    );
    // the cancelled attempt's transcription is counted as thrown away, in
    // calls and in cores (whisper's threads over its busy time)
    let stt = &spec["thrown"]["stt"];
    let (busy, cores) = (
        stt["busy_ms"].as_f64().unwrap(),
        stt["core_ms"].as_f64().unwrap(),
    );
    assert!(stt["calls"].as_u64().unwrap() >= 1, "{spec}");
    assert_eq!(
        busy,
        spec["cancelled_busy_ms"]["stt"].as_f64().unwrap(),
        "{spec}"
    );
    assert!(busy > 0.0 && cores >= busy, "{spec}");
    // never more engine threads at once than the budget
    let budget = report["config"]["threads"][0].as_u64().unwrap();
    assert!(report["summary"]["engine_threads_peak"].as_u64().unwrap() <= budget);
}

#[test]
fn an_answer_cancelled_mid_stream_leaves_no_history_and_no_cache_behind() {
    use voxline_core::{edge, Clock, FullPolicy, Pipeline, SpecBoard, Transcript};
    use voxline_llm::LlmOut;
    let _g = util::engine_lock();
    let s = util::settings(24);
    let board = SpecBoard::new();
    let llm = voxline_llm::LlmStage::new(
        voxline_llm::LlmModel::load(s.llm_config().expect("llama.cpp settings")).unwrap(),
    );
    // the runtime settles the attempt: it rolls the conversation back
    let mut p = Pipeline::builder(Clock::start())
        .speculation(board.clone())
        .build();
    let (tx, rx) = edge::<Transcript>("transcripts", 4, FullPolicy::Block);
    let (out_tx, out_rx) = edge::<LlmOut>("responses", 1024, FullPolicy::Block);
    p.spawn_stage(llm, rx, out_tx).unwrap();
    // the attempt is cancelled the moment its first token is out: mid-answer
    let (done_tx, done) = std::sync::mpsc::channel();
    let cancel = board.clone();
    p.spawn_sink("sink", out_rx, move |env| {
        match env.item {
            LlmOut::Token(t) if t.id == 1 && t.index == 0 => cancel.cancel(1),
            LlmOut::Done(d) => {
                let _ = done_tx.send(d);
            }
            LlmOut::Token(_) => {}
        }
        Ok(())
    })
    .unwrap();
    let transcript = |id: u64, text: &str| Transcript {
        id,
        text: text.into(),
        heard: voxline_core::Heard::Words,
        n_tokens: 8,
        audio_ms: 2000.0,
        start_sample: 0,
        end_sample: 32_000,
        end_wall: std::time::Instant::now(),
    };
    board.start(1);
    tx.send(transcript(
        1,
        "Tell me a long story about a dragon and a knight.",
    ))
    .unwrap();
    tx.send(transcript(2, "What is the capital of France?"))
        .unwrap();
    drop(tx);
    assert!(p.join().failed.is_none());
    let done: Vec<_> = done.try_iter().collect();
    assert_eq!(done.len(), 1, "only the committed turn completes: {done:?}");
    assert_eq!(done[0].id, 2);
    // Had the cancelled answer's history or KV cache survived, the next
    // turn's prompt or its prefill would differ from a fresh engine's.
    let mut fresh =
        voxline_llm::LlmEngine::load(s.llm_config().expect("llama.cpp settings")).unwrap();
    let want = fresh
        .respond("What is the capital of France?", &mut |_| true)
        .unwrap();
    assert_eq!(done[0].n_prompt_tokens, want.n_prompt_tokens);
    assert_eq!(done[0].engine, want.engine);
    assert_eq!(done[0].response, want.text);
}

#[test]
fn a_rolled_back_engine_answers_exactly_like_a_fresh_one() {
    let _g = util::engine_lock();
    let s = util::settings(16);
    let mut engine =
        voxline_llm::LlmEngine::load(s.llm_config().expect("llama.cpp settings")).unwrap();
    let before = (engine.cached_tokens(), engine.history_len());
    let cp = engine.checkpoint();
    let mut n = 0;
    engine
        .respond("Tell me a story about a dragon.", &mut |_| {
            n += 1;
            n < 5 // cancelled mid-answer
        })
        .unwrap();
    assert_eq!(engine.history_len(), 1);
    engine.rollback(cp).unwrap();
    assert_eq!((engine.cached_tokens(), engine.history_len()), before);
    let after = engine
        .respond("What is the capital of France?", &mut |_| true)
        .unwrap();
    let mut fresh =
        voxline_llm::LlmEngine::load(s.llm_config().expect("llama.cpp settings")).unwrap();
    let want = fresh
        .respond("What is the capital of France?", &mut |_| true)
        .unwrap();
    assert_eq!(after.text, want.text);
    assert_eq!(after.n_prefill_tokens, want.n_prefill_tokens);
}

#[test]
fn no_cpu_share_runs_more_engine_threads_at_once_than_the_budget() {
    let _g = util::engine_lock();
    for share in ["priority", "split", "shared"] {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("r.json");
        let out = util::voxline_bin()
            .arg("replay")
            .arg(util::fixture("multi_turn.wav"))
            .args([
                "--pace",
                "fast",
                "--quiet",
                "--max-tokens",
                "16",
                "--cpu-share",
                share,
            ])
            .arg("--report-json")
            .arg(&report)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{share}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = util::read_json(&report);
        let budget = r["config"]["threads"][0].as_u64().unwrap();
        let peak = r["summary"]["engine_threads_peak"].as_u64().unwrap();
        assert!(
            peak >= 1 && peak <= budget,
            "{share}: {peak} engine threads at once, budget {budget}"
        );
        assert_eq!(r["config"]["cpu_share"], share);
    }
}
