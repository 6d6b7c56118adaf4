//! Where the models directory is, so that voxline finds its models from any
//! working directory and `models fetch` installs them where the other
//! commands will look.
//!
//! In order: the directory given on the command line (`--models-dir`,
//! `models fetch|list|verify --dir`); else the `VOXLINE_MODELS` environment
//! variable; else `./models` when it holds a `manifest.json` (a source
//! checkout); else the user's data directory, `$XDG_DATA_HOME/voxline/models`
//! or `$HOME/.local/share/voxline/models`.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable naming the models directory.
pub const ENV_VAR: &str = "VOXLINE_MODELS";

/// Why a models directory was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelsDirSource {
    /// Given on the command line.
    Flag,
    /// From [`ENV_VAR`].
    Env,
    /// `./models` of the working directory, which holds a manifest.
    WorkingDir,
    /// The user's data directory (XDG).
    UserData,
}

impl fmt::Display for ModelsDirSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Flag => "given on the command line",
            Self::Env => "from VOXLINE_MODELS",
            Self::WorkingDir => "./models of the working directory",
            Self::UserData => "the user data directory",
        })
    }
}

/// The models directory and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelsDir {
    /// The directory.
    pub path: PathBuf,
    /// Why this one.
    pub source: ModelsDirSource,
}

/// The environment values the resolution reads, passed in so that it is a
/// pure function of its inputs (and testable without touching the process
/// environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelsEnv {
    /// `VOXLINE_MODELS`.
    pub voxline_models: Option<OsString>,
    /// `XDG_DATA_HOME`.
    pub xdg_data_home: Option<OsString>,
    /// `HOME`.
    pub home: Option<OsString>,
}

impl ModelsEnv {
    /// The values of this process's environment.
    #[must_use]
    pub fn from_process() -> Self {
        Self {
            voxline_models: std::env::var_os(ENV_VAR),
            xdg_data_home: std::env::var_os("XDG_DATA_HOME"),
            home: std::env::var_os("HOME"),
        }
    }
}

/// Resolves the models directory (see the module documentation for the
/// order). `cwd` is the working directory, checked for `models/manifest.json`;
/// the `./models` answer is returned relative (`models`), as the user would
/// write it. Empty variables count as unset, and a relative `XDG_DATA_HOME`
/// is ignored, as the XDG specification asks. Without `HOME` or
/// `XDG_DATA_HOME` the answer falls back to `models`.
#[must_use]
pub fn resolve(explicit: Option<&Path>, env: &ModelsEnv, cwd: &Path) -> ModelsDir {
    let set = |v: &Option<OsString>| v.as_ref().filter(|s| !s.is_empty()).map(PathBuf::from);
    if let Some(p) = explicit {
        return ModelsDir {
            path: p.to_path_buf(),
            source: ModelsDirSource::Flag,
        };
    }
    if let Some(p) = set(&env.voxline_models) {
        return ModelsDir {
            path: p,
            source: ModelsDirSource::Env,
        };
    }
    if cwd.join("models").join(crate::fetch::MANIFEST).is_file() {
        return ModelsDir {
            path: PathBuf::from("models"),
            source: ModelsDirSource::WorkingDir,
        };
    }
    let data = set(&env.xdg_data_home)
        .filter(|p| p.is_absolute())
        .or_else(|| set(&env.home).map(|h| h.join(".local").join("share")));
    match data {
        Some(d) => ModelsDir {
            path: d.join("voxline").join("models"),
            source: ModelsDirSource::UserData,
        },
        None => ModelsDir {
            path: PathBuf::from("models"),
            source: ModelsDirSource::WorkingDir,
        },
    }
}

/// [`resolve`] with this process's environment and working directory.
#[must_use]
pub fn resolve_from_process(explicit: Option<&Path>) -> ModelsDir {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    resolve(explicit, &ModelsEnv::from_process(), &cwd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: Option<&str>, xdg: Option<&str>, home: Option<&str>) -> ModelsEnv {
        ModelsEnv {
            voxline_models: v.map(Into::into),
            xdg_data_home: xdg.map(Into::into),
            home: home.map(Into::into),
        }
    }

    #[test]
    fn flag_then_env_then_checkout_then_user_data() {
        let empty = tempfile::tempdir().unwrap();
        let checkout = tempfile::tempdir().unwrap();
        std::fs::create_dir(checkout.path().join("models")).unwrap();
        std::fs::write(checkout.path().join("models/manifest.json"), "{}").unwrap();
        let all = env(Some("/opt/vox"), Some("/xdg"), Some("/home/u"));

        let r = resolve(Some(Path::new("/flag")), &all, checkout.path());
        assert_eq!((r.path, r.source), ("/flag".into(), ModelsDirSource::Flag));
        let r = resolve(None, &all, checkout.path());
        assert_eq!(
            (r.path, r.source),
            ("/opt/vox".into(), ModelsDirSource::Env)
        );
        let no_var = env(None, Some("/xdg"), Some("/home/u"));
        let r = resolve(None, &no_var, checkout.path());
        assert_eq!(
            (r.path, r.source),
            ("models".into(), ModelsDirSource::WorkingDir)
        );
        let r = resolve(None, &no_var, empty.path());
        assert_eq!(
            (r.path, r.source),
            ("/xdg/voxline/models".into(), ModelsDirSource::UserData)
        );
        let r = resolve(None, &env(None, None, Some("/home/u")), empty.path());
        assert_eq!(r.path, PathBuf::from("/home/u/.local/share/voxline/models"));
    }

    #[test]
    fn empty_and_relative_values_are_ignored() {
        let empty = tempfile::tempdir().unwrap();
        // an empty VOXLINE_MODELS or XDG_DATA_HOME counts as unset
        let r = resolve(
            None,
            &env(Some(""), Some(""), Some("/home/u")),
            empty.path(),
        );
        assert_eq!(r.path, PathBuf::from("/home/u/.local/share/voxline/models"));
        // a relative XDG_DATA_HOME is ignored (XDG spec)
        let r = resolve(None, &env(None, Some("rel"), Some("/home/u")), empty.path());
        assert_eq!(r.path, PathBuf::from("/home/u/.local/share/voxline/models"));
        // nothing at all: ./models
        let r = resolve(None, &env(None, None, None), empty.path());
        assert_eq!(r.path, PathBuf::from("models"));
        // ./models without a manifest does not count
        std::fs::create_dir(empty.path().join("models")).unwrap();
        let r = resolve(None, &env(None, None, Some("/h")), empty.path());
        assert_eq!(r.source, ModelsDirSource::UserData);
    }
}
