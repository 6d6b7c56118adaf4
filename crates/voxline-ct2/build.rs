//! Builds the shim over CTranslate2 as a shared object that the crate embeds.
//!
//! The headers come from the ct2rs crate's sources (fetched by cargo through
//! `headers/Cargo.toml`, never built); `VOXLINE_CT2_INCLUDE` names another
//! `include/` directory instead. The shim is linked against nothing of
//! CTranslate2: its symbols resolve at run time against the library
//! `voxline models fetch` installs, loaded first. Without the headers or a
//! C++ compiler the crate still builds, and the engine says at load time
//! that this build has none.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The CTranslate2 version of the headers ct2rs 0.10.3 carries, which the
/// pinned library must match.
const HEADERS_VERSION: &str = "4.8.4";

fn main() {
    println!("cargo:rerun-if-changed=src/shim.cpp");
    println!("cargo:rerun-if-changed=headers/Cargo.toml");
    println!("cargo:rerun-if-changed=headers/Cargo.lock");
    println!("cargo:rerun-if-env-changed=VOXLINE_CT2_INCLUDE");
    println!("cargo::rustc-check-cfg=cfg(ct2_shim)");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("libvoxline_ct2_shim.so");
    let built = include_dir().and_then(|inc| build_shim(&inc, &so));
    match built {
        Ok(()) => {
            println!("cargo:rustc-cfg=ct2_shim");
            println!("cargo:rustc-env=VOXLINE_CT2_SHIM={}", so.display());
        }
        Err(why) => {
            println!("cargo:warning=voxline-ct2: built without the CTranslate2 engine: {why}");
            println!("cargo:rustc-env=VOXLINE_CT2_SHIM_MISSING={why}");
        }
    }
    println!("cargo:rustc-env=VOXLINE_CT2_HEADERS_VERSION={HEADERS_VERSION}");
}

/// CTranslate2's `include/` directory.
fn include_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("VOXLINE_CT2_INCLUDE") {
        return Ok(PathBuf::from(dir));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(&std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("headers/Cargo.toml");
    let mut cmd = Command::new(cargo);
    cmd.args([
        "metadata",
        "--format-version",
        "1",
        "--locked",
        "--manifest-path",
    ])
    .arg(&manifest);
    if std::env::var("CARGO_NET_OFFLINE").is_ok_and(|v| v == "true") {
        cmd.arg("--offline");
    }
    let output = cmd
        .output()
        .map_err(|e| format!("cargo metadata could not run ({e})"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata could not bring the headers' crate: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let meta: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata's output is not JSON ({e})"))?;
    let manifest_path = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "ct2rs"))
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("cargo metadata names no ct2rs package")?;
    let inc = Path::new(manifest_path)
        .parent()
        .ok_or("ct2rs's manifest has no directory")?
        .join("CTranslate2/include");
    if inc.join("ctranslate2/models/whisper.h").is_file() {
        Ok(inc)
    } else {
        Err(format!(
            "{} holds no ctranslate2/models/whisper.h",
            inc.display()
        ))
    }
}

/// Compiles `src/shim.cpp` into the shared object `so`.
fn build_shim(include: &Path, so: &Path) -> Result<(), String> {
    let compiler = cc::Build::new()
        .cpp(true)
        .opt_level(2)
        .try_get_compiler()
        .map_err(|e| format!("no C++ compiler ({e})"))?;
    let mut cmd = compiler.to_command();
    cmd.args([
        "-std=c++17",
        "-fPIC",
        "-shared",
        "-fvisibility-inlines-hidden",
    ])
    .arg(format!("-DCT2_HEADERS_VERSION=\"{HEADERS_VERSION}\""))
    .arg("-I")
    .arg(include)
    .arg("src/shim.cpp")
    .arg("-o")
    .arg(so);
    let output = cmd
        .output()
        .map_err(|e| format!("the C++ compiler could not run ({e})"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "the shim did not compile: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        ))
    }
}
