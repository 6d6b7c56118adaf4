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
    assert_eq!(errs[0]["id"], 2);
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

/// Sends SIGINT to a child.
fn interrupt(child: &std::process::Child) {
    assert!(std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
}

#[test]
fn sigint_during_model_load_exits_cleanly() {
    let _g = util::engine_lock();
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
    interrupt(&child);
    for _ in err {}
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(partials(dir.path()).is_empty());
}

#[test]
fn sigint_during_a_turn_finishes_it_and_writes_the_report() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.json");
    let mut child = util::voxline_bin()
        .args([
            "replay",
            &fixture("multi_turn.wav"),
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
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.starts_with("[1] you:")));
    interrupt(&child);
    for _ in lines {}
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = util::read_json(&report);
    assert_eq!(r["interrupted"], true);
    let turns = r["turns"].as_array().unwrap();
    assert!(
        !turns.is_empty() && turns.len() < 3,
        "stopped early: {} turns",
        turns.len()
    );
    assert!(
        turns[0]["response"].is_string(),
        "the turn in flight finished"
    );
    assert!(partials(dir.path()).is_empty());
}
