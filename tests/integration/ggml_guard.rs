//! The one-ggml guard on the real vendored trees of the pinned crates.

use std::path::PathBuf;
use std::process::Command;

fn package_dir(name: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(crate::util::root().join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pkg = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in the dependency graph"));
    PathBuf::from(pkg["manifest_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn whisper_and_llama_vendor_identical_ggml_headers() {
    let whisper = package_dir("whisper-rs-sys").join("whisper.cpp/ggml/include");
    let llama = package_dir("llama-cpp-sys-2").join("llama.cpp/ggml/include");
    let diff = voxline_models::ggml_guard::compare_header_dirs(&whisper, &llama).unwrap();
    assert!(
        diff.is_identical(),
        "the two engines vendor different ggml headers ({diff}); the linker keeps one ggml for both, \
         so pin whisper-rs-sys and llama-cpp-sys-2 to versions whose ggml matches"
    );
    assert!(diff.identical.iter().any(|h| h == "ggml.h"));
}
