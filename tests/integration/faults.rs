//! Faults: engine errors mid-turn, a panicking stage, signals during load and during a turn.

use std::io::BufRead;
use std::process::Stdio;

use crate::util;

fn fixture(name: &str) -> String {
    util::fixture(name).to_str().unwrap().to_string()
}

fn partials(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial"))
        .collect()
}

#[test]
fn an_engine_error_fails_its_turn_and_the_next_turns_run() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let (report, events) = (dir.path().join("r.json"), dir.path().join("e.jsonl"));
    // a 64-token context: the short questions fit, the 10 s utterance cannot (a real llama-side refusal)
    let out = util::voxline_bin()
        .args([
            "replay",
            &fixture("q_capital.wav"),
            &fixture("long_10s.wav"),
            &fixture("q_tea.wav"),
        ])
        .args([
            "--pace",
            "fast",
            "--quiet",
            "--ctx",
            "64",
            "--max-tokens",
            "8",
            "--no-memory",
        ])
        .arg("--report-json")
        .arg(&report)
        .arg("--events")
        .arg(&events)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = util::read_json(&report);
    let turns = r["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3);
    assert!(turns[0]["response"].is_string() && turns[2]["response"].is_string());
    let e = turns[1]["error"].as_str().unwrap();
    assert!(e.starts_with("llm: ") && e.contains("context"), "{e}");
    assert_eq!(r["summary"]["errors"], 1);
    let errs: Vec<serde_json::Value> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| e["type"] == "turn_error")
        .collect();
    assert_eq!(errs.len(), 1);
    // the second turn's (ids number speculative attempts, so not necessarily 2)
    assert_eq!(errs[0]["id"], turns[1]["id"]);
}

#[test]
fn a_panicking_stage_shuts_down_in_order_and_the_report_says_so() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let (report, events) = (dir.path().join("r.json"), dir.path().join("e.jsonl"));
    let out = util::voxline_bin()
        .env("VOXLINE_FAULT", "panic:stt:2")
        .env("RUST_BACKTRACE", "0")
        .args([
            "replay",
            &fixture("multi_turn.wav"),
            "--pace",
            "fast",
            "--quiet",
            "--max-tokens",
            "4",
        ])
        .arg("--report-json")
        .arg(&report)
        .arg("--events")
        .arg(&events)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("the pipeline failed: stage `stt` panicked"),
        "{err}"
    );
    let r = util::read_json(&report);
    assert!(r["failed"].as_str().unwrap().contains("injected panic"));
    let turns = r["turns"].as_array().unwrap();
    assert!(
        turns[0]["response"].is_string(),
        "the turn before the panic completed"
    );
    // every later utterance is accounted for, none vanishes
    for t in &turns[1..] {
        assert!(t["error"].as_str().unwrap().contains("not finished"), "{t}");
    }
    let failed = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"stage_failed\""))
        .count();
    assert_eq!(failed, 1);
    assert!(partials(dir.path()).is_empty());
}

#[test]
fn an_injected_turn_error_is_reported_and_the_session_goes_on() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.json");
    let out = util::voxline_bin()
        .env("VOXLINE_FAULT", "error:llm:1")
        .args([
            "replay",
            &fixture("multi_turn.wav"),
            "--pace",
            "fast",
            "--quiet",
            "--max-tokens",
            "4",
        ])
        .arg("--report-json")
        .arg(&report)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let r = util::read_json(&report);
    let turns = r["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3);
    assert!(turns[0]["error"]
        .as_str()
        .unwrap()
        .contains("injected error in llm"));
    assert!(turns[1]["response"].is_string() && turns[2]["response"].is_string());
}

/// Sends a signal (`INT`, `TERM`) to a child.
fn signal(child: &std::process::Child, sig: &str) {
    assert!(std::process::Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success());
}

/// Sends SIGINT to a child.
fn interrupt(child: &std::process::Child) {
    signal(child, "INT");
}

/// Waits for `child`'s first transcript line on its stdout, calls `stop`
/// on it, reads the rest and checks it exited with Ctrl-C's 130.
fn stop_after_the_first_transcript(
    mut child: std::process::Child,
    stop: impl FnOnce(&std::process::Child),
) {
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| util::is_transcript_line(&l)));
    stop(&child);
    for _ in lines {}
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_signal_during_model_load_exits_with_the_interrupted_status() {
    let _g = util::engine_lock();
    // a cancelled CI job must not look green: 130 for SIGINT, 143 for SIGTERM
    for (sig, code) in [("INT", 130), ("TERM", 143)] {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("r.json");
        let mut child = util::voxline_bin()
            .args(["replay", &fixture("multi_turn.wav")])
            .arg("--report-json")
            .arg(&report)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // the handler is registered before anything is checked or loaded; interrupt as loading starts
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        assert!(err
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.contains("loading models")));
        signal(&child, sig);
        let rest: Vec<String> = err.map_while(Result::ok).collect();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(code), "SIG{sig}: {rest:?}");
        assert!(
            rest.iter().any(|l| l.contains("interrupted")),
            "says so: {rest:?}"
        );
        assert!(partials(dir.path()).is_empty());
    }
}

#[test]
fn ctrl_c_in_a_fast_replay_stops_feeding_cancels_the_queue_and_marks_the_report() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let (report, events) = (dir.path().join("r.json"), dir.path().join("e.jsonl"));
    let files: Vec<String> = [
        "multi_turn.wav",
        "q_capital.wav",
        "q_tea.wav",
        "multi_turn.wav",
    ]
    .iter()
    .map(|f| fixture(f))
    .collect();
    let child = util::voxline_bin()
        .arg("replay")
        .args(&files)
        .args(["--pace", "fast", "--max-tokens", "16"])
        .arg("--report-json")
        .arg(&report)
        .arg("--events")
        .arg(&events)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    stop_after_the_first_transcript(child, interrupt);
    let r = util::read_json(&report);
    assert_eq!(r["interrupted"], true);
    let answered = r["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["response"].is_string())
        .count();
    assert!(
        answered < 8,
        "the queued turns were not all answered ({answered} of 8)"
    );
    assert!(partials(dir.path()).is_empty());
}

#[test]
fn a_second_ctrl_c_aborts_and_leaves_no_partial_file() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let (report, events) = (dir.path().join("r.json"), dir.path().join("e.jsonl"));
    let child = util::voxline_bin()
        .args(["replay", &fixture("multi_turn.wav"), "--pace", "realtime"])
        .arg("--report-json")
        .arg(&report)
        .arg("--events")
        .arg(&events)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    stop_after_the_first_transcript(child, |child| {
        assert!(
            !partials(dir.path()).is_empty(),
            "the event log is being written"
        );
        interrupt(child);
        std::thread::sleep(std::time::Duration::from_millis(50));
        interrupt(child);
    });
    assert!(
        partials(dir.path()).is_empty(),
        "{:?}",
        partials(dir.path())
    );
}

#[test]
fn sigint_during_a_turn_finishes_it_and_writes_the_report() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.json");
    // three plays of the three-question recording: 9 turns in 27 s, so a
    // pipeline running seconds behind the audio on a loaded machine (every
    // turn already heard when the first is printed) still shows it stopped
    let three = fixture("multi_turn.wav");
    let child = util::voxline_bin()
        .args([
            "replay",
            &three,
            &three,
            &three,
            "--pace",
            "realtime",
            "--max-tokens",
            "16",
        ])
        .arg("--report-json")
        .arg(&report)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    stop_after_the_first_transcript(child, interrupt);
    let r = util::read_json(&report);
    assert_eq!(r["interrupted"], true);
    let turns = r["turns"].as_array().unwrap();
    assert!(
        !turns.is_empty() && turns.len() < 9,
        "stopped early: {} turns",
        turns.len()
    );
    assert!(
        turns[0]["response"].is_string(),
        "the turn in flight finished"
    );
    assert!(partials(dir.path()).is_empty());
}
