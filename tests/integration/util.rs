//! Shared helpers: where the models and fixtures are, sidecars, threads.
//! The benches include this file too (`#[path]`), for the same paths.

use std::path::{Path, PathBuf};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The models directory (`VOXLINE_MODELS_DIR` or `models/`).
pub fn models_dir() -> PathBuf {
    std::env::var_os("VOXLINE_MODELS_DIR").map_or_else(|| root().join("models"), PathBuf::from)
}

fn model(file: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(
        p.is_file(),
        "{} is missing: run `cargo run --release -- models fetch` first",
        p.display()
    );
    p
}

/// The default whisper model.
pub fn whisper_model() -> PathBuf {
    model(voxline_models::registry::for_role(voxline_models::registry::Role::Stt).file)
}

/// The default language model.
pub fn llm_model() -> PathBuf {
    model(voxline_models::registry::SMOLLM2_135M.file)
}

/// The audio fixtures' directory.
pub fn fixtures_dir() -> PathBuf {
    root().join("audio-fixtures")
}

/// A fixture file.
pub fn fixture(name: &str) -> PathBuf {
    fixtures_dir().join(name)
}

/// A fixture's sidecar JSON.
pub fn sidecar(name: &str) -> serde_json::Value {
    read_json(&fixture(name).with_extension("json"))
}

/// The expected transcripts of a fixture, in order.
pub fn expected_texts(name: &str) -> Vec<String> {
    sidecar(name)["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["text"].as_str().unwrap().to_string())
        .collect()
}

/// Reads a whole fixture as 16 kHz mono through the replay reader.
/// The WAV files in `dir`, sorted; panics with the folder's name when it
/// cannot be read.
#[allow(dead_code)] // the benches use it
pub fn wavs_in(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "wav"))
        .collect();
    paths.sort();
    paths
}

/// A deterministic noise source (xorshift), uniform in [-1, 1].
#[allow(dead_code)] // the benches use it
pub fn noise(seed: u64) -> impl FnMut() -> f64 {
    let mut s = seed;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

pub fn read_16k(path: &Path) -> Vec<f32> {
    let mut src = voxline_audio::wav::WavSource::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    while let Some(chunk) = src.next_chunk().unwrap() {
        out.extend_from_slice(&chunk);
    }
    out
}

/// Writes `samples` (mono at `rate`, -1..1) to `path` as 16-bit PCM WAV.
pub fn write_wav(path: &Path, rate: u32, samples: &[f32]) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for v in samples {
        w.write_sample((v.clamp(-1.0, 1.0) * 32_767.0) as i16)
            .unwrap();
    }
    w.finalize().unwrap();
}

/// Threads per engine in tests: the machine's cores split in two, at least 1.
pub fn threads_each() -> usize {
    (std::thread::available_parallelism().map_or(2, usize::from) / 2).max(1)
}

/// Inference and other CPU-heavy tests take this lock so that no two run at
/// once: ggml's spinning threads would oversubscribe the cores and collapse,
/// and the live tests' capture must not be starved of CPU.
pub fn engine_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Engine settings for tests: the default models, the command line's CPU
/// share (the engines take turns on every core), short answers.
pub fn settings(max_tokens: u32) -> voxline_pipeline::settings::EngineSettings {
    voxline_pipeline::settings::EngineSettings {
        max_tokens,
        ..voxline_pipeline::settings::EngineSettings::local(
            whisper_model(),
            llm_model(),
            voxline_pipeline::settings::ThreadBudget::priority(None).unwrap(),
        )
    }
}

/// Loads both engines as pipeline stages.
pub fn stages(
    s: &voxline_pipeline::settings::EngineSettings,
) -> (voxline_stt::SttStage, voxline_llm::LlmStage) {
    let stt = voxline_stt::SttEngine::load(s.stt_config().expect("whisper settings")).unwrap();
    let llm = voxline_llm::LlmModel::load(s.llm_config().expect("llama.cpp settings")).unwrap();
    (
        voxline_stt::SttStage::new(stt),
        voxline_llm::LlmStage::new(llm),
    )
}

/// Replays files at fast pace through the real engines and builds the report.
pub fn replay(
    files: &[&str],
    max_tokens: u32,
) -> (
    voxline_pipeline::pipeline::RunResult,
    voxline_report::Report,
) {
    let s = settings(max_tokens);
    let (stt, llm) = stages(&s);
    let paths: Vec<PathBuf> = files.iter().map(|f| fixture(f)).collect();
    let inputs = voxline_pipeline::pipeline::open_inputs(&paths).unwrap();
    let run = voxline_pipeline::pipeline::run(
        inputs,
        stt,
        llm,
        &voxline_pipeline::pipeline::RunOptions::default(),
        None,
    )
    .unwrap();
    let report = voxline_report::build(&run, voxline_report::RunConfig::default(), 0.0, None);
    (run, report)
}

/// Whether `line` is a turn's transcript on the console (`[id] you: …`).
/// Ids are not 1, 2, 3…: a cancelled attempt's id is skipped.
pub fn is_transcript_line(line: &str) -> bool {
    line.strip_prefix('[')
        .and_then(|rest| rest.split_once("] you:"))
        .is_some_and(|(id, _)| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

/// Reads a JSON file (a report, a manifest) the test expects to exist.
pub fn read_json(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The voxline binary built for this test run.
pub fn voxline_bin() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_voxline"))
}

/// Runs `voxline replay` with `args` on `inputs`, the project's models and
/// its report written to `report`; the report, once the run succeeded.
pub fn replay_report(args: &[&str], inputs: &[&Path], report: &Path) -> serde_json::Value {
    let out = voxline_bin()
        .arg("replay")
        .args(args)
        .args(inputs)
        .arg("--report-json")
        .arg(report)
        .arg("--models-dir")
        .arg(models_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    read_json(report)
}

/// Short questions the LLM answers in a few words (the first is about a capital).
pub const QUESTIONS: &[&str] = &[
    "What is the capital of France?",
    "Name a large animal.",
    "What colour is the sky?",
    "How many legs does a spider have?",
    "What do bees make?",
    "Name a planet.",
    "What is ice made of?",
    "Which season is the coldest?",
    "What do cows drink?",
    "Name a fruit that is yellow.",
];

/// The peak resident set (VmHWM) of a running process, in kB.
pub fn vm_hwm_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Waits for `child` to end, reading its peak resident set meanwhile:
/// its exit code and the peak, in MB.
pub fn wait_with_peak_mb(child: &mut std::process::Child) -> (Option<i32>, u64) {
    let mut peak_kb = 0;
    loop {
        if let Some(kb) = vm_hwm_kb(child.id()) {
            peak_kb = peak_kb.max(kb);
        }
        if let Some(s) = child.try_wait().unwrap() {
            return (s.code(), peak_kb / 1024);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs `cmd` to its end, its stdout dropped and its stderr read: its
/// exit code, its peak resident set in MB (see [`wait_with_peak_mb`]) and
/// what it wrote to stderr.
pub fn run_with_peak_mb(cmd: &mut std::process::Command) -> (Option<i32>, u64, String) {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        err
    });
    let (code, peak_mb) = wait_with_peak_mb(&mut child);
    (code, peak_mb, reader.join().unwrap())
}

/// Sends `signal` (`"-INT"`, `"-TERM"`) to `child` and waits for it to end
/// (20 s at most, then it is killed and this panics): its exit code and how
/// long it took.
pub fn signal_and_wait(
    child: &mut std::process::Child,
    signal: &str,
) -> (Option<i32>, std::time::Duration) {
    let t = std::time::Instant::now();
    assert!(std::process::Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return (s.code(), t.elapsed());
        }
        if t.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            panic!("still running 20 s after kill {signal}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
