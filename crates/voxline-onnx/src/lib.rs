//! ONNX Runtime for voxline's small neural models (the Piper voice, the
//! end-of-turn model).
//!
//! The library is loaded at run time from the `libonnxruntime.so` that
//! `voxline models fetch` installs (nothing is downloaded or linked at build
//! time), once per process: every model runs on that one environment.
//! A session computes with the threads the pipeline grants it and does not
//! spin between calls, so it leaves the cores to the other engines.
#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

pub use ort;

/// ONNX Runtime could not be loaded, or a model could not be opened on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnnxError {
    /// The library file is not there.
    #[error("the ONNX Runtime library {} is missing", path.display())]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The library could not be loaded (or is not ONNX Runtime), or this
    /// process already runs another one.
    #[error("the ONNX Runtime library {} could not be loaded ({detail})", path.display())]
    Runtime {
        /// The library.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The model file could not be opened as an ONNX model.
    #[error("{}: not a usable ONNX model ({detail})", path.display())]
    BadModel {
        /// The model.
        path: PathBuf,
        /// Why.
        detail: String,
    },
}

/// The ONNX Runtime environment of the process (one, however many models).
static RUNTIME: OnceLock<Mutex<Option<(PathBuf, ort::environment::Environment)>>> = OnceLock::new();

/// The process's ONNX Runtime, loaded from `lib` the first time.
///
/// # Errors
/// [`OnnxError::Missing`] when `lib` is not a file; [`OnnxError::Runtime`]
/// when it cannot be loaded, is not ONNX Runtime, or another library was
/// loaded before.
pub fn environment(lib: &Path) -> Result<ort::environment::Environment, OnnxError> {
    if !lib.is_file() {
        return Err(OnnxError::Missing {
            path: lib.to_owned(),
        });
    }
    let cell = RUNTIME.get_or_init(|| Mutex::new(None));
    let mut held = cell
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((path, env)) = held.as_ref() {
        if path != lib {
            return Err(OnnxError::Runtime {
                path: lib.to_owned(),
                detail: format!("this process already runs the one at {}", path.display()),
            });
        }
        return Ok(env.clone());
    }
    let fail = |detail: String| OnnxError::Runtime {
        path: lib.to_owned(),
        detail,
    };
    // a library cut short is mapped all the same, and the first page
    // past its end kills the process (SIGBUS): it is checked first
    voxline_models::kind::check_shared_library(lib).map_err(fail)?;
    // loading a library that is no ONNX Runtime may panic inside ort: a broken file is an error too
    let built = std::panic::catch_unwind(|| {
        ort::init_from(lib)
            .map_err(|e| e.to_string())?
            .with_name("voxline")
            .build()
            .map_err(|e| e.to_string())
    })
    .map_err(|_| fail("it is not an ONNX Runtime library".into()))?
    .map_err(fail)?;
    *held = Some((lib.to_owned(), built.clone()));
    Ok(built)
}

/// Opens `model` on the runtime `lib`, computing with `threads` threads
/// (at least 1) inside each operator and one between them, none spinning.
///
/// # Errors
/// As [`environment`]; [`OnnxError::BadModel`] when `model` cannot be
/// opened as a model.
pub fn session(
    lib: &Path,
    model: &Path,
    threads: usize,
) -> Result<ort::session::Session, OnnxError> {
    let env = environment(lib)?;
    let runtime = |e: &dyn std::fmt::Display| OnnxError::Runtime {
        path: lib.to_owned(),
        detail: e.to_string(),
    };
    let mut builder = ort::session::Session::builder(&env)
        .map_err(|e| runtime(&e))?
        .with_intra_threads(threads.max(1))
        .map_err(|e| runtime(&e))?
        .with_inter_threads(1)
        .map_err(|e| runtime(&e))?
        .with_intra_op_spinning(false)
        .map_err(|e| runtime(&e))?
        .with_inter_op_spinning(false)
        .map_err(|e| runtime(&e))?;
    builder
        .commit_from_file(model)
        .map_err(|e| OnnxError::BadModel {
            path: model.to_owned(),
            detail: e.to_string(),
        })
}

/// The names of `session`'s inputs.
#[must_use]
pub fn input_names(session: &ort::session::Session) -> Vec<String> {
    session
        .inputs()
        .iter()
        .map(|i| i.name().to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_foreign_library_is_an_error_not_a_panic() {
        let dir = std::env::temp_dir().join(format!("voxline-onnx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("libonnxruntime.so.none");
        assert!(matches!(
            environment(&missing),
            Err(OnnxError::Missing { .. })
        ));
        let foreign = dir.join("libonnxruntime.so.text");
        std::fs::write(&foreign, b"not a library").unwrap();
        let err = environment(&foreign).unwrap_err();
        assert!(matches!(err, OnnxError::Runtime { .. }), "{err:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A shared library this process has loaded (the C library).
    fn loaded_library() -> PathBuf {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("/libc.so") || p.contains("/libc-"))
            .map(PathBuf::from)
            .expect("the C library is mapped")
    }

    #[test]
    fn a_library_cut_short_or_not_a_library_is_refused_before_it_is_mapped() {
        let lib = loaded_library();
        voxline_models::kind::check_shared_library(&lib).unwrap();
        let dir = std::env::temp_dir().join(format!("voxline-onnx-cut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bytes = std::fs::read(&lib).unwrap();
        let cut = dir.join("libcut.so");
        // the headers and part of the first segments, not the rest
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let e = voxline_models::kind::check_shared_library(&cut).unwrap_err();
        assert!(e.contains("cut short"), "{e}");
        let e = environment(&cut).unwrap_err().to_string();
        assert!(e.contains("cut short") && e.contains("libcut.so"), "{e}");
        let text = dir.join("libtext.so");
        std::fs::write(&text, "not a library").unwrap();
        let e = voxline_models::kind::check_shared_library(&text).unwrap_err();
        assert!(e.contains("not a 64-bit ELF"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
