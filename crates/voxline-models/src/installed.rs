//! A model is checked against the manifest of the directory it was
//! installed in each time it is loaded, so that a file that was corrupted
//! or replaced after `models fetch` is refused before it answers anyone.
//!
//! The size is compared on every load. The sha256 is computed once per
//! version of the file and remembered in `.verified.json` beside the
//! manifest, keyed by size and modification time, so a normal start reads
//! no model twice. A file the manifest does not list (a model the user
//! brought) is not checked.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use crate::fetch::{Manifest, MANIFEST};
use crate::{sha256_file, ModelError};

/// The cache of digests, inside the models directory.
pub const VERIFIED: &str = ".verified.json";

/// One file's digest as last computed, and the version of the file it
/// was computed for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Verified {
    bytes: u64,
    modified_ns: u128,
    sha256: String,
}

/// Checks `path` against the manifest of its directory: its size, and its
/// sha256 when the file changed since it was last checked. `Ok` for a
/// file the manifest does not list, or a directory without one.
///
/// # Errors
/// [`ModelError::Tampered`] when the file is not what `models fetch`
/// installed; [`ModelError::Io`] when it cannot be read;
/// [`ModelError::Manifest`] for a malformed manifest.
pub fn check_installed(path: &Path) -> Result<(), ModelError> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Ok(());
    };
    check_installed_in(dir, name)
}

/// Checks the file the manifest of `dir` lists as `name` (a name with a
/// directory in it, for a model of several files: `whisper-tiny.en-ct2/model.bin`),
/// as [`check_installed`] does.
///
/// # Errors
/// As [`check_installed`].
pub fn check_installed_in(dir: &Path, name: &str) -> Result<(), ModelError> {
    let path = &dir.join(name);
    let Some(manifest) = Manifest::load(dir)? else {
        return Ok(());
    };
    let Some(entry) = manifest.models.iter().find(|m| m.file == name) else {
        return Ok(());
    };
    let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
    let tampered = |found: String| ModelError::Tampered {
        path: path.to_path_buf(),
        found,
        manifest: dir.join(MANIFEST),
    };
    if meta.len() != entry.bytes {
        return Err(tampered(format!(
            "{} bytes where {} were installed",
            meta.len(),
            entry.bytes
        )));
    }
    let modified_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let cache_path = dir.join(VERIFIED);
    let mut cache: BTreeMap<String, Verified> = std::fs::read(&cache_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let known = cache
        .get(name)
        .filter(|v| v.bytes == meta.len() && v.modified_ns == modified_ns && modified_ns > 0);
    let sha256 = match known {
        Some(v) => v.sha256.clone(),
        None => {
            let sha256 = sha256_file(path)?;
            cache.insert(
                name.to_owned(),
                Verified {
                    bytes: meta.len(),
                    modified_ns,
                    sha256: sha256.clone(),
                },
            );
            // a directory that cannot be written (read-only, shared) is
            // checked in full at each load instead
            if let Ok(json) = serde_json::to_vec_pretty(&cache) {
                let _ = crate::atomic_write(&cache_path, |w| std::io::Write::write_all(w, &json));
            }
            sha256
        }
    };
    if sha256 != entry.sha256 {
        return Err(tampered(format!(
            "sha256 {}… where {}… was installed",
            &sha256[..12.min(sha256.len())],
            &entry.sha256[..12.min(entry.sha256.len())]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::ManifestEntry;
    use crate::registry::Role;

    fn install(dir: &Path, name: &str, bytes: &[u8]) {
        std::fs::write(dir.join(name), bytes).unwrap();
        let entry = ManifestEntry {
            role: Role::Stt,
            file: name.into(),
            sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes)),
            bytes: bytes.len() as u64,
            source_package: "p".into(),
            source_version: "1".into(),
            source_sha256: "s".into(),
            licence: "MIT".into(),
            description: "d".into(),
        };
        let m = Manifest {
            version: crate::fetch::MANIFEST_VERSION,
            models: vec![entry],
        };
        std::fs::write(dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
    }

    #[test]
    fn an_installed_file_passes_and_a_changed_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.bin");
        install(dir.path(), "m.bin", b"the weights, as installed");
        check_installed(&p).unwrap();
        // remembered: the digest is not computed again for the same version
        let cache = std::fs::read_to_string(dir.path().join(VERIFIED)).unwrap();
        assert!(cache.contains("m.bin"), "{cache}");
        check_installed(&p).unwrap();
        // one byte flipped, same size: a new version, hashed and refused
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p, b"the weights, as installeD").unwrap();
        let e = check_installed(&p).unwrap_err().to_string();
        assert!(e.contains("m.bin") && e.contains("sha256"), "{e}");
        assert!(e.contains("models verify"), "{e}");
        // cut short
        std::fs::write(&p, b"the weights").unwrap();
        let e = check_installed(&p).unwrap_err().to_string();
        assert!(e.contains("11 bytes where 25 were installed"), "{e}");
    }

    #[test]
    fn a_file_the_manifest_does_not_list_is_not_checked() {
        let dir = tempfile::tempdir().unwrap();
        install(dir.path(), "m.bin", b"weights");
        let other = dir.path().join("mine.bin");
        std::fs::write(&other, b"a model the user brought").unwrap();
        check_installed(&other).unwrap();
        let bare = tempfile::tempdir().unwrap();
        let p = bare.path().join("m.bin");
        std::fs::write(&p, b"no manifest here").unwrap();
        check_installed(&p).unwrap();
    }
}
