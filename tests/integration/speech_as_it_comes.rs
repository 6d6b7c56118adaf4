//! Speech as people really give it, through the real binary and models,
//! with the default turn-taking: a question over a room of other voices,
//! digits read one by one with long pauses, a speaker thinking aloud before
//! asking, and the shortest hangover the options allow. Nothing said is
//! lost, and nothing is a turn error. The audio is made here by espeak-ng
//! and sox.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::speculation::{join, silence, speak};
use crate::util;

/// `path` scaled so its peak is `db` dBFS.
fn at_level(dir: &Path, path: &Path, key: &str, db: i32) -> PathBuf {
    let out = dir.join(format!("{key}.wav"));
    assert!(Command::new("sox")
        .arg(path)
        .arg(&out)
        .args(["norm", &db.to_string()])
        .status()
        .unwrap()
        .success());
    out
}

/// Replays `wav` at fast pace with the default settings; the report.
fn replay(dir: &Path, wav: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--pace", "fast", "--quiet", "--max-tokens", "12"];
    args.extend_from_slice(extra);
    util::replay_report(&args, &[wav], &dir.join("report.json"))
}

/// The turns that were answered (words, not a sound, an echo or a
/// hesitation): their transcripts.
fn answered(report: &serde_json::Value) -> Vec<String> {
    report["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["non_speech"] != true && t["error"].is_null())
        .map(|t| t["transcript"].as_str().unwrap().to_owned())
        .collect()
}

/// No turn failed: the summary's count and every turn's error.
fn assert_no_turn_errors(report: &serde_json::Value) {
    assert_eq!(report["summary"]["errors"], 0, "{:#}", report["turns"]);
    for t in report["turns"].as_array().unwrap() {
        assert!(t["error"].is_null(), "{t:#}");
    }
}

#[test]
fn a_question_over_the_babble_of_five_other_voices_is_answered() {
    // five espeak-ng voices reading at once, 12 dB under the question, as
    // a television or a busy room would be: the VAD hears one 13.6 s
    // utterance and whisper hears the question in it, 6 words (0.44 words
    // a second of audio: a words-per-second floor made it a turn error,
    // and the question was lost with exit 0)
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = "The weather report says that tomorrow will be mostly cloudy with a chance \
                of rain in the afternoon and the evening, and the winds will come from the \
                west at about ten miles per hour while the temperature stays mild.";
    let mut voices = Vec::new();
    for (i, v) in ["en-us", "en-gb", "en-us+f3", "en-gb+m3", "en-us+f2"]
        .iter()
        .enumerate()
    {
        let raw = d.join(format!("b{i}.raw.wav"));
        let out = d.join(format!("b{i}.wav"));
        assert!(Command::new("espeak-ng")
            .args(["-v", v, "-s", &(148 + i * 8).to_string(), "-w"])
            .arg(&raw)
            .arg(format!("{text} {text}"))
            .status()
            .unwrap()
            .success());
        assert!(Command::new("sox")
            .arg(&raw)
            .args(["-r", "16000"])
            .arg(&out)
            .args(["trim", "0", "18"])
            .status()
            .unwrap()
            .success());
        voices.push(out);
    }
    let babble = d.join("babble.wav");
    let mut mix = Command::new("sox");
    mix.arg("-m")
        .args(&voices)
        .arg(&babble)
        .args(["norm", "-36"]);
    assert!(mix.status().unwrap().success());
    let q = speak(d, "q", "What is the capital of France?");
    let q = at_level(d, &q, "q24", -24);
    let lead = silence(d, "lead", 11.0);
    let tail = silence(d, "tail", 5.0);
    let padded = join(d, "qpad.wav", &[lead, q, tail]);
    let wav = d.join("q_babble.wav");
    let mut mix = Command::new("sox");
    mix.arg("-m").arg(&babble).arg(&padded).arg(&wav);
    assert!(mix.status().unwrap().success());

    let r = replay(d, &wav, &[]);
    assert_no_turn_errors(&r);
    let said = answered(&r);
    assert!(
        said.iter()
            .any(|t| t.contains("capital") && t.contains("France")),
        "the question was lost: {said:?}"
    );
}

/// The digits a transcript holds, in order, as numerals or words.
fn digits(text: &str) -> Vec<u8> {
    const NAMES: [&str; 10] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    ];
    let mut out = Vec::new();
    for word in text
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if word.chars().all(|c| c.is_ascii_digit()) {
            out.extend(word.bytes().map(|b| b - b'0'));
        } else if let Some(n) = NAMES.iter().position(|n| *n == word) {
            out.push(u8::try_from(n).unwrap());
        }
    }
    out
}

/// Length of the longest common subsequence of `a` and `b`.
fn in_order(a: &[u8], b: &[u8]) -> usize {
    let mut prev = vec![0usize; b.len() + 1];
    for x in a {
        let mut cur = vec![0usize; b.len() + 1];
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = if x == y {
                prev[j] + 1
            } else {
                prev[j + 1].max(cur[j])
            };
        }
        prev = cur;
    }
    prev[b.len()]
}

#[test]
fn thirty_digits_read_1_8_s_apart_are_all_heard_with_the_default_turn_taking() {
    // each pause after a digit is judged unfinished, so the digits run
    // into 10-20 s turns of mostly silence: whisper once dropped and
    // invented digits in them, and the words-per-second floor turned 3 of
    // 6 turns into errors (12-24 digits never answered)
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let names = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    ];
    let said: [u8; 30] = [
        3, 7, 1, 4, 9, 2, 8, 5, 0, 6, 3, 1, 7, 2, 9, 4, 8, 6, 0, 5, 2, 7, 3, 9, 1, 8, 4, 6, 0, 5,
    ];
    let gap = silence(d, "gap", 1.8);
    let mut parts = vec![speak(d, "intro", "My account number is")];
    for &n in &said {
        parts.push(gap.clone());
        parts.push(speak(d, &format!("d{n}"), names[usize::from(n)]));
    }
    parts.push(silence(d, "tail", 3.0));
    let wav = join(d, "slow_digits.wav", &parts);

    let r = replay(d, &wav, &[]);
    assert_no_turn_errors(&r);
    let turns = answered(&r);
    let heard: Vec<u8> = turns.iter().flat_map(|t| digits(t)).collect();
    let kept = in_order(&said, &heard);
    eprintln!("{kept} of 30 digits heard in order: {turns:?}");
    // tiny.en may mishear a digit said alone ("nine" as "Dine", "three
    // nine" as "Free."); none is lost to the pipeline (the previous build
    // heard 22 of 30, with 2 turn errors; this one 28-30 by run)
    assert!(kept >= 28, "{kept} of 30 digits: {turns:?}");
}

#[test]
fn a_minute_of_fillers_then_a_question_makes_no_errors_and_the_question_is_answered() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gap = silence(d, "gap", 1.5);
    let fillers = ["um", "uh", "so", "well"];
    let mut parts = Vec::new();
    for i in 0..40 {
        let f = fillers[i % fillers.len()];
        parts.push(speak(d, &format!("f_{f}"), f));
        parts.push(gap.clone());
    }
    parts.push(speak(d, "q", "What time does the library open?"));
    parts.push(silence(d, "tail", 3.0));
    let wav = join(d, "fillers.wav", &parts);

    let r = replay(d, &wav, &[]);
    assert_no_turn_errors(&r);
    let turns = answered(&r);
    assert!(
        turns.iter().any(|t| t.contains("library")),
        "the question was lost: {turns:?}"
    );
    // hesitations alone are not answered; under load tiny.en may hear a
    // lone filler as a word ("Oh."), which is answered like any word
    assert!(turns.len() <= 2, "thinking aloud was answered: {turns:?}");
    // what was said before it is in the report, marked as hesitation
    let hesitations = r["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            t["transcript"]
                .as_str()
                .unwrap()
                .starts_with("[hesitation:")
        })
        .count();
    assert!(hesitations > 0, "{:#}", r["turns"]);
}

#[test]
fn a_hangover_of_0_ms_is_refused_with_the_semantic_turn_and_hears_every_question_without_it() {
    // --hangover-ms 0 is in range; with the default semantic end of turn it
    // once dropped every utterance at its first frame (0 turns, exit 0),
    // and up to 48 ms it ends each pause before the model or the words can
    // judge it (a conversation's three questions heard as one turn)
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let multi = util::fixture("multi_turn.wav");
    for h in ["0", "48"] {
        let out = util::voxline_bin()
            .args(["replay", "--pace", "fast", "--hangover-ms", h])
            .arg(&multi)
            .arg("--models-dir")
            .arg(util::models_dir())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("--hangover-ms {h}")) && err.contains("--no-semantic-turn"),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    }
    for (h, extra) in [("0", "--no-semantic-turn"), ("64", "--semantic-turn")] {
        let r = replay(dir.path(), &multi, &["--hangover-ms", h, extra]);
        assert_no_turn_errors(&r);
        let turns = answered(&r);
        assert_eq!(turns.len(), 3, "--hangover-ms {h} {extra}: {turns:?}");
        for (t, words) in turns.iter().zip(["time", "spider", "sky"]) {
            assert!(t.contains(words), "--hangover-ms {h} {extra}: {turns:?}");
        }
    }
}
