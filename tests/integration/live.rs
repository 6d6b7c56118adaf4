//! `voxline devices` and `voxline live` through the real cpal → ALSA path,
//! without sound hardware: ALSA's `file` plugin is a capture device that
//! reads a raw file (defined in a temporary `$HOME/.asoundrc`).
//!
//! Pacing: the plugin's `null` slave delivers the file far faster than real
//! time, then endless zeros. Speech is not lost to that: the capture ring
//! holds 10 s of device audio (the file is 9.3 s), the VAD runs ~2000× real
//! time, and what the audio queue does drop (drop-oldest, in the silence
//! that follows) is counted and reported — the test checks the accounting.
//! Because the audio arrives faster than real time, latencies of these runs
//! are not what a user would feel; the tests do not judge them.

use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;

use crate::util;

/// A temporary `HOME` whose `.asoundrc` defines `voxtest`, reading `fixture`
/// as 48 kHz stereo f32 (the configuration cpal opens such a device in).
fn alsa_home(fixture: &str) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let raw = home.path().join("input.raw");
    let status = std::process::Command::new("sox")
        .arg(util::fixture(fixture))
        .args(["-t", "f32", "-r", "48000", "-c", "2"])
        .arg(&raw)
        .status()
        .expect("sox runs");
    assert!(status.success());
    let rc = format!(
        "pcm.voxtest {{\n  type file\n  slave.pcm null\n  file \"/dev/null\"\n  infile \"{}\"\n  format \"raw\"\n  hint {{\n    show on\n    description \"voxline test input\"\n  }}\n}}\n",
        raw.display()
    );
    std::fs::write(home.path().join(".asoundrc"), rc).unwrap();
    home
}

fn voxline(home: &Path) -> std::process::Command {
    let mut c = util::voxline_bin();
    c.env("HOME", home);
    c
}

#[test]
fn devices_lists_the_alsa_test_device() {
    let home = alsa_home("q_capital.wav");
    let out = util::voxline_bin()
        .env("HOME", home.path())
        .arg("devices")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("voxtest — voxline test input"), "{text}");
    assert!(text.contains("48000 Hz, 2 ch, f32"), "{text}");
}

#[test]
fn live_session_through_alsa_transcribes_every_turn() {
    let _g = util::engine_lock();
    let home = alsa_home("multi_turn.wav");
    let report = home.path().join("report.json");
    let events = home.path().join("events.jsonl");
    let out = voxline(home.path())
        .args([
            "live",
            "--device",
            "voxtest",
            "--max-turns",
            "3",
            "--max-duration",
            "120s",
            "--max-tokens",
            "8",
            "--quiet",
        ])
        .arg("--models-dir")
        .arg(util::models_dir())
        .arg("--report-json")
        .arg(&report)
        .arg("--events")
        .arg(&events)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let r = util::read_json(&report);
    let expected = util::expected_texts("multi_turn.wav");
    let turns = r["turns"].as_array().unwrap();
    assert_eq!(turns.len(), expected.len(), "{turns:#?}");
    for (t, e) in turns.iter().zip(&expected) {
        let heard = t["transcript"].as_str().unwrap();
        assert!(
            voxline_stt::word_error_rate(e, heard) <= 0.1,
            "{heard:?} vs {e:?}"
        );
        assert!(t["response"].is_string());
    }
    assert_eq!(r["config"]["pace"], "live");
    let live = &r["live"];
    assert_eq!(live["device"], "voxtest (voxline test input)");
    assert!(live["frames_captured"].as_u64().unwrap() > 48_000 * 9);
    // every dropped frame is counted: the summary is the edge drops plus the ring drops,
    // and the event log carries the edge drops
    let edge_drops: u64 = r["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["dropped"].as_u64().unwrap())
        .sum();
    let ring_drops = live["frames_dropped_in_ring"].as_u64().unwrap();
    assert_eq!(
        r["summary"]["dropped"].as_u64().unwrap(),
        edge_drops + ring_drops
    );
    let logged: u64 = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["type"] == "dropped")
        .map(|e| e["count"].as_u64().unwrap())
        .sum();
    assert_eq!(logged, edge_drops);
}

#[test]
fn ctrl_c_ends_a_live_session_cleanly_with_a_report() {
    let _g = util::engine_lock();
    let home = alsa_home("multi_turn.wav");
    let report = home.path().join("report.json");
    let mut child = voxline(home.path())
        .args([
            "live",
            "--device",
            "voxtest",
            "--max-duration",
            "120s",
            "--max-tokens",
            "8",
        ])
        .arg("--models-dir")
        .arg(util::models_dir())
        .arg("--report-json")
        .arg(&report)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // wait for the first transcript, then interrupt
    let mut lines = std::io::BufReader::new(stdout).lines();
    let first = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("[1] you:"));
    assert!(first.is_some(), "no transcript before the stream ended");
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    for _ in lines {}
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("stopping"), "{err}");
    let r = util::read_json(&report);
    assert!(!r["turns"].as_array().unwrap().is_empty());
    // the turn in flight finished: every turn that started has a response or an error
    for t in r["turns"].as_array().unwrap() {
        assert!(t["response"].is_string() || t["error"].is_string(), "{t}");
    }
    // no partial files left behind
    let partials: Vec<_> = std::fs::read_dir(home.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(".partial"))
        .collect();
    assert!(partials.is_empty());
}
