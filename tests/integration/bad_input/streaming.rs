//! Input that is not refused up front: a file cut short (played to the cut,
//! then reported), a WAV written to a pipe, odd but valid audio (silence,
//! noise, clipping), and a long file streamed in bounded memory.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::bytes::{pcm16_wav, pseudo_random, wav_bytes, Fmt};
use super::{os, outputs, partial_files, put, voxline};
use crate::util;

// ---------------------------------------------------------------- truncated audio

/// A WAV whose header claims more data than the file holds is streamed up to
/// the cut and then reported: exit 2, one `voxline:` line naming the file and
/// the truncation, and the report (which records the input error) is written —
/// the audio before the cut was processed, so the run's results are kept.
#[test]
fn truncated_audio_is_played_to_the_cut_then_reported() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let q = std::fs::read(util::fixture("q_capital.wav")).unwrap();
    let cut = put(tmp.path(), "cut.wav", &q[..30_000]);
    let four_gib = put(
        tmp.path(),
        "claims_4gib.wav",
        &wav_bytes(
            Fmt::PCM16_MONO_16K,
            &vec![0u8; 3200],
            Some(0xFFFF_FFF0),
            Some(0xFFFF_FFFF),
        ),
    );
    let mut failures = Vec::new();
    for (name, file) in [
        ("data cut short", &cut),
        ("header claiming 4 GiB", &four_gib),
    ] {
        let out = tmp.path().join("out").join(name.replace(' ', "_"));
        std::fs::create_dir_all(&out).unwrap();
        let mut args = vec![os("replay"), os(file)];
        args.extend(outputs(&out));
        args.extend([
            os("--models-dir"),
            os(util::models_dir()),
            os("--max-tokens"),
            os("4"),
        ]);
        let output = voxline(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let mut problems = Vec::new();
        if output.status.code() != Some(2) {
            problems.push(format!("exit code {:?}, expected 2", output.status.code()));
        }
        if stderr.contains("panicked") {
            problems.push("panic".to_string());
        }
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("voxline: "))
            .collect();
        let file_name = file.file_name().unwrap().to_string_lossy().into_owned();
        if !ours
            .iter()
            .any(|l| l.contains(&file_name) && l.contains("truncated"))
        {
            problems.push("no `voxline:` line naming the file and the truncation".into());
        }
        let lines = stderr.lines().filter(|l| !l.trim().is_empty()).count();
        if lines > 3 {
            problems.push(format!("{lines} stderr lines, expected at most 3"));
        }
        if stderr.contains('\u{1b}') {
            problems
                .push("stderr holds terminal escape codes although it is not a terminal".into());
        }
        // the documented behaviour: the report is written and records the input error
        match std::fs::read(out.join("report.json")) {
            Ok(bytes) => match serde_json::from_slice::<serde_json::Value>(&bytes) {
                Ok(rep) => {
                    let errs = rep["input_errors"].as_array().cloned().unwrap_or_default();
                    if !errs
                        .iter()
                        .any(|e| e.as_str().is_some_and(|s| s.contains(&file_name)))
                    {
                        problems.push(format!(
                            "report.input_errors does not name the file: {errs:?}"
                        ));
                    }
                }
                Err(e) => problems.push(format!("report.json is not JSON: {e}")),
            },
            Err(e) => problems.push(format!("no report.json: {e}")),
        }
        let partial = partial_files(&out);
        if !partial.is_empty() {
            problems.push(format!(".partial files left: {partial:?}"));
        }
        if !problems.is_empty() {
            failures.push(format!(
                "[{name}] {}\n    stderr: {}",
                problems.join("; "),
                stderr.trim_end().replace('\n', "\n            ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------- pipes

/// A WAV written to a pipe (ffmpeg's unknown-length sizes in its header) is
/// replayed from standard input (`voxline replay -`) and from a FIFO: exit 0,
/// and the question in it is heard.
#[test]
fn pipe_written_wav_replays_from_stdin_and_from_a_fifo() {
    use std::io::Write as _;
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let mut wav = std::fs::read(util::fixture("q_capital.wav")).unwrap();
    wav[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let data = wav.windows(4).position(|w| w == b"data").unwrap();
    wav[data + 4..data + 8].copy_from_slice(&u32::MAX.to_le_bytes());

    let fifo = tmp.path().join("mic.fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for (name, input) in [("stdin", PathBuf::from("-")), ("fifo", fifo.clone())] {
        let report = tmp.path().join(format!("{name}.json"));
        let mut child = util::voxline_bin()
            .current_dir(util::root())
            .arg("replay")
            .arg(&input)
            .args(["--quiet", "--pace", "fast", "--max-tokens", "8"])
            .arg("--report-json")
            .arg(&report)
            .arg("--models-dir")
            .arg(util::models_dir())
            .stdin(if name == "stdin" {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Written from a thread: opening a FIFO for writing waits for its reader.
        let writer = {
            let (bytes, stdin, fifo) = (wav.clone(), child.stdin.take(), fifo.clone());
            std::thread::spawn(move || match stdin {
                Some(mut stdin) => stdin.write_all(&bytes),
                None => std::fs::OpenOptions::new()
                    .write(true)
                    .open(&fifo)?
                    .write_all(&bytes),
            })
        };
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{name}: {stderr}");
        writer.join().unwrap().unwrap();
        let rep: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        assert!(
            rep["summary"]["turns"].as_u64().unwrap_or(0) >= 1,
            "{name}: no turn heard: {rep:#}"
        );
    }
}

// ---------------------------------------------------------------- odd but valid audio

/// Replays one file at fast pace with a report; returns the exit code, stderr and the report.
fn replay_ok(file: &Path, out: &Path, extra: &[&str]) -> (Option<i32>, String, serde_json::Value) {
    let report = out.join("report.json");
    let mut args = vec![
        os("replay"),
        os(file),
        os("--quiet"),
        os("--pace"),
        os("fast"),
        os("--report-json"),
        os(&report),
        os("--models-dir"),
        os(util::models_dir()),
        os("--max-tokens"),
        os("8"),
    ];
    args.extend(extra.iter().map(os));
    let output = voxline(&args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let rep = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    (output.status.code(), stderr, rep)
}

#[test]
fn silence_gives_zero_turns() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (code, stderr, rep) = replay_ok(&util::fixture("silence.wav"), tmp.path(), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(rep["summary"]["turns"], 0, "{rep:#}");
    assert_eq!(rep["turns"].as_array().map(Vec::len), Some(0));
}

#[test]
fn white_noise_runs_cleanly() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let noise: Vec<f32> = pseudo_random(16_000 * 3 * 2, 0xa11ce)
        .chunks_exact(2)
        .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0 * 0.5)
        .collect();
    let file = put(tmp.path(), "noise.wav", &pcm16_wav(&noise));
    let (code, stderr, rep) = replay_ok(&file, tmp.path(), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let turns = rep["summary"]["turns"]
        .as_u64()
        .expect("a report with summary.turns");
    // 3 s of noise cannot hold more than a few utterances
    assert!(turns <= 3, "{turns} turns from 3 s of noise");
    assert_eq!(rep["summary"]["errors"], 0, "{rep:#}");
}

#[test]
fn full_scale_square_wave_runs_cleanly() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    // 200 Hz square wave at full scale: every sample clips
    let square: Vec<f32> = (0..16_000 * 3)
        .map(|i| if (i / 40) % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let file = put(tmp.path(), "square.wav", &pcm16_wav(&square));
    let (code, stderr, rep) = replay_ok(&file, tmp.path(), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(rep["summary"]["turns"].is_u64(), "{rep:#}");
    assert_eq!(rep["summary"]["errors"], 0, "{rep:#}");
}

// ---------------------------------------------------------------- long input, bounded memory

#[test]
fn long_input_streams_in_bounded_memory() {
    const MAX_RSS_MB: u64 = 600;
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    // ≥ 90 s of speech and pauses: the fixtures, 16 kHz mono, 1 s of silence between
    let mut samples: Vec<f32> = Vec::new();
    let mut utterances = 0usize;
    let mut said = Vec::new();
    while samples.len() < 16_000 * 90 {
        for name in ["multi_turn.wav", "long_10s.wav", "q_moon.wav", "q_tea.wav"] {
            samples.extend(util::read_16k(&util::fixture(name)));
            samples.extend(std::iter::repeat_n(0.0, 16_000));
            let texts = util::expected_texts(name);
            utterances += texts.len();
            said.extend(texts);
        }
    }
    let audio_s = samples.len() as f64 / 16_000.0;
    let file = put(tmp.path(), "long.wav", &pcm16_wav(&samples));
    drop(samples);
    let report = tmp.path().join("report.json");
    let mut child = util::voxline_bin()
        .current_dir(util::root())
        .args([
            os("replay"),
            os(&file),
            os("--quiet"),
            os("--pace"),
            os("fast"),
            os("--max-tokens"),
            os("4"),
            os("--report-json"),
            os(&report),
            os("--models-dir"),
            os(util::models_dir()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak_kb = 0;
    let status = loop {
        if let Some(kb) = util::vm_hwm_kb(pid) {
            peak_kb = peak_kb.max(kb);
        }
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read as _;
        let _ = e.read_to_string(&mut stderr);
    }
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(peak_kb > 0, "could not read VmHWM of the voxline process");
    assert!(
        peak_kb / 1024 < MAX_RSS_MB,
        "peak RSS {} MB for {audio_s:.0} s of audio (limit {MAX_RSS_MB} MB)",
        peak_kb / 1024
    );
    let rep = util::read_json(&report);
    let turns = rep["summary"]["turns"].as_u64().unwrap() as usize;
    // every utterance of the concatenated fixtures is heard: all their
    // words, in turns of their own or (where the recogniser was late with
    // a sentence's words, as on a busy machine) two joined in one
    let heard: Vec<&str> = rep["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["transcript"].as_str())
        .collect();
    let wer = voxline_stt::word_error_rate(&said.join(" "), &heard.join(" "));
    assert!(wer <= 0.1, "WER {wer:.3} over the whole input: {heard:?}");
    assert!(
        turns * 4 >= utterances * 3 && turns <= utterances + 2,
        "{turns} turns for {utterances} spoken utterances"
    );
    eprintln!(
        "long input: {audio_s:.0} s of audio, {turns} turns, peak RSS {} MB",
        peak_kb / 1024
    );
}
