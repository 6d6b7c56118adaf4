//! Shared helpers: where the models and fixtures are, sidecars, threads.

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
    assert!(p.is_file(), "{} is missing: run `cargo run --release -- models fetch` first", p.display());
    p
}

/// The default whisper model.
pub fn whisper_model() -> PathBuf {
    model(voxline_models::registry::WHISPER_TINY_EN.file)
}

/// The default language model.
pub fn llm_model() -> PathBuf {
    model(voxline_models::registry::SMOLLM2_135M.file)
}

/// A fixture file.
pub fn fixture(name: &str) -> PathBuf {
    root().join("audio-fixtures").join(name)
}

/// A fixture's sidecar JSON.
pub fn sidecar(name: &str) -> serde_json::Value {
    let p = fixture(name).with_extension("json");
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

/// The expected transcripts of a fixture, in order.
pub fn expected_texts(name: &str) -> Vec<String> {
    sidecar(name)["turns"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap().to_string()).collect()
}

/// Reads a whole fixture as 16 kHz mono through the replay reader.
pub fn read_16k(path: &Path) -> Vec<f32> {
    let mut src = voxline_audio::wav::WavSource::open(path).unwrap();
    let mut out = Vec::new();
    while let Some(chunk) = src.next_chunk().unwrap() {
        out.extend_from_slice(&chunk);
    }
    out
}

/// Threads per engine in tests: the machine's cores split in two, at least 1.
pub fn threads_each() -> usize {
    (std::thread::available_parallelism().map_or(2, usize::from) / 2).max(1)
}
