//! Output safety: `--report-json`, `--events` and `bench --out` never destroy
//! a file voxline did not create. Each case is a reproduction from the
//! "nothing lost" issue.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::util;

/// A scratch copy of `q_capital` (recording and sidecar) in a temp dir.
fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("talk.wav");
    let json = dir.path().join("talk.json");
    std::fs::copy(util::fixture("q_capital.wav"), &wav).unwrap();
    std::fs::copy(util::fixture("q_capital.json"), &json).unwrap();
    (dir, wav, json)
}

fn run(dir: &Path, args: &[&str]) -> Output {
    util::voxline_bin()
        .current_dir(dir)
        .args(args)
        .arg("--models-dir")
        .arg(util::models_dir())
        .output()
        .unwrap()
}

/// Every file below `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn an_output_that_names_an_input_a_sidecar_the_other_output_or_a_directory_is_refused_up_front() {
    let (dir, _, _) = scratch();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    // (arguments after `replay talk.wav`, what the one line must say)
    let cases: &[(&[&str], &str)] = &[
        (&["--report-json", "talk.wav"], "the input talk.wav"),
        (&["--events", "talk.wav"], "the input talk.wav"),
        (&["--report-json", "talk.json"], "the sidecar of talk.wav"),
        (&["--events", "./talk.json"], "the sidecar of talk.wav"),
        (
            &["--report-json", "p.json", "--events", "p.json"],
            "name the same file",
        ),
        (&["--report-json", "sub"], "is a directory"),
        (&["--events", "sub"], "is a directory"),
        (&["--report-json", "-", "--events", "-"], "standard output"),
    ];
    let before = snapshot(dir.path());
    for (args, says) in cases {
        let mut all = vec!["replay", "talk.wav"];
        all.extend_from_slice(args);
        let out = run(dir.path(), &all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            !err.contains("loading models"),
            "{args:?}: refused before any model loads: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert_eq!(snapshot(dir.path()), before, "{args:?}: nothing changed");
    }
    // a model the run reads given as the output: whisper.cpp's file, and
    // CTranslate2's (the default engine), whose model is a directory of files
    let ct2 = util::models_dir()
        .join(voxline_models::registry::CT2_WHISPER_MODEL.file)
        .canonicalize()
        .unwrap();
    for (model, engine) in [(util::whisper_model(), "whisper"), (ct2, "ct2")] {
        let before = std::fs::metadata(&model).unwrap().len();
        let out = run(
            dir.path(),
            &[
                "replay",
                "talk.wav",
                "--stt-engine",
                engine,
                "--report-json",
                model.to_str().unwrap(),
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{engine}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("the input"),
            "{engine}"
        );
        assert_eq!(
            std::fs::metadata(&model).unwrap().len(),
            before,
            "{engine}: untouched"
        );
    }
    // bench: a baseline inside --out would be overwritten by the new report
    std::fs::write(dir.path().join("sub/report.json"), b"{}").unwrap();
    let out = run(
        dir.path(),
        &[
            "bench",
            "--fixtures",
            "talk.wav",
            "--out",
            "sub",
            "--baseline",
            "sub/report.json",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(dir.path().join("sub/report.json")).unwrap(),
        b"{}"
    );
    // bench --out an existing file
    let out = run(
        dir.path(),
        &["bench", "--fixtures", "talk.wav", "--out", "talk.json"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("is a file, not a directory"), "{err}");
}

#[test]
fn devices_fifos_and_symlinks_are_written_through_not_replaced() {
    let _g = util::engine_lock();
    let (dir, _, _) = scratch();
    let d = dir.path();
    // the report through a symlink: the link stays, its target gets the report
    std::fs::write(d.join("real.json"), b"old").unwrap();
    std::os::unix::fs::symlink("real.json", d.join("link.json")).unwrap();
    // the events into a FIFO with a reader attached
    let fifo = d.join("events.fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let out = run(
        d,
        &[
            "replay",
            "talk.wav",
            "--pace",
            "fast",
            "--quiet",
            "--max-tokens",
            "8",
            "--report-json",
            "link.json",
            "--events",
            "events.fifo",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = reader.join().unwrap();
    assert!(
        events.lines().count() > 3,
        "the FIFO's reader got the events: {events:?}"
    );
    assert!(events.contains("turn_complete"), "{events}");
    assert!(std::fs::symlink_metadata(d.join("link.json"))
        .unwrap()
        .file_type()
        .is_symlink());
    let report = util::read_json(&d.join("real.json"));
    assert_eq!(report["turns"].as_array().unwrap().len(), 1);
    use std::os::unix::fs::FileTypeExt as _;
    assert!(
        std::fs::metadata(&fifo).unwrap().file_type().is_fifo(),
        "the FIFO is still a FIFO"
    );
    // the report to /dev/null: written into the device, which stays a device
    let out = run(
        d,
        &[
            "replay",
            "talk.wav",
            "--pace",
            "fast",
            "--quiet",
            "--max-tokens",
            "4",
            "--report-json",
            "/dev/null",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    // the events on standard output: JSON lines only, no console text mixed in
    let out = run(
        d,
        &[
            "replay",
            "talk.wav",
            "--pace",
            "fast",
            "--max-tokens",
            "4",
            "--events",
            "-",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    }
    let left: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
