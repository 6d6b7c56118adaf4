//! The one-ggml guard.
//!
//! whisper-rs-sys and llama-cpp-sys-2 each vendor ggml and both produce
//! static libraries named `ggml*`; the linker keeps one copy for both
//! engines. That is only sound while both vendored trees expose the same
//! public headers. [`compare_header_dirs`] checks exactly that; the test
//! suite runs it on the two vendored trees of the pinned crates.

use std::collections::BTreeSet;
use std::path::Path;

use crate::ModelError;

/// How two header directories differ.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderDiff {
    /// Headers present only in the first directory.
    pub only_in_a: Vec<String>,
    /// Headers present only in the second directory.
    pub only_in_b: Vec<String>,
    /// Headers present in both whose bytes differ.
    pub differing: Vec<String>,
    /// Headers compared and equal.
    pub identical: Vec<String>,
}

impl HeaderDiff {
    /// Whether the two trees expose identical public headers.
    #[must_use]
    pub fn is_identical(&self) -> bool {
        self.only_in_a.is_empty()
            && self.only_in_b.is_empty()
            && self.differing.is_empty()
            && !self.identical.is_empty()
    }
}

impl std::fmt::Display for HeaderDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} identical; differing: {:?}; only in first: {:?}; only in second: {:?}",
            self.identical.len(),
            self.differing,
            self.only_in_a,
            self.only_in_b
        )
    }
}

fn headers(dir: &Path) -> Result<BTreeSet<String>, ModelError> {
    let rd = std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
    let mut out = BTreeSet::new();
    for entry in rd {
        let entry = entry.map_err(|e| ModelError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".h") {
            out.insert(name);
        }
    }
    Ok(out)
}

/// Compares the `*.h` files of two directories byte for byte.
///
/// # Errors
/// [`ModelError::Io`] when a directory or header cannot be read.
pub fn compare_header_dirs(a: &Path, b: &Path) -> Result<HeaderDiff, ModelError> {
    let (ha, hb) = (headers(a)?, headers(b)?);
    let mut diff = HeaderDiff {
        only_in_a: ha.difference(&hb).cloned().collect(),
        only_in_b: hb.difference(&ha).cloned().collect(),
        ..HeaderDiff::default()
    };
    for name in ha.intersection(&hb) {
        let (pa, pb) = (a.join(name), b.join(name));
        let ba = std::fs::read(&pa).map_err(|e| ModelError::io(&pa, e))?;
        let bb = std::fs::read(&pb).map_err(|e| ModelError::io(&pb, e))?;
        if ba == bb {
            diff.identical.push(name.clone());
        } else {
            diff.differing.push(name.clone());
        }
    }
    Ok(diff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (n, c) in files {
            std::fs::write(d.path().join(n), c).unwrap();
        }
        d
    }

    #[test]
    fn identical_trees_pass() {
        let a = tree(&[
            ("ggml.h", "int x;"),
            ("gguf.h", "int y;"),
            ("notes.txt", "a"),
        ]);
        let b = tree(&[
            ("ggml.h", "int x;"),
            ("gguf.h", "int y;"),
            ("notes.txt", "b"),
        ]);
        let d = compare_header_dirs(a.path(), b.path()).unwrap();
        assert!(d.is_identical(), "{d}");
        assert_eq!(d.identical, vec!["ggml.h", "gguf.h"]);
    }

    #[test]
    fn a_changed_byte_fails() {
        let a = tree(&[("ggml.h", "struct ggml_tensor { int ne[4]; };")]);
        let b = tree(&[("ggml.h", "struct ggml_tensor { long ne[4]; };")]);
        let d = compare_header_dirs(a.path(), b.path()).unwrap();
        assert!(!d.is_identical());
        assert_eq!(d.differing, vec!["ggml.h"]);
    }

    #[test]
    fn a_missing_header_fails_either_way() {
        let a = tree(&[("ggml.h", "x"), ("ggml-cpu.h", "y")]);
        let b = tree(&[("ggml.h", "x")]);
        let d = compare_header_dirs(a.path(), b.path()).unwrap();
        assert!(!d.is_identical());
        assert_eq!(d.only_in_a, vec!["ggml-cpu.h"]);
        let d = compare_header_dirs(b.path(), a.path()).unwrap();
        assert_eq!(d.only_in_b, vec!["ggml-cpu.h"]);
    }

    #[test]
    fn empty_trees_do_not_pass() {
        let a = tree(&[]);
        let b = tree(&[]);
        assert!(!compare_header_dirs(a.path(), b.path())
            .unwrap()
            .is_identical());
        assert!(compare_header_dirs(a.path(), Path::new("/nonexistent-voxline-dir")).is_err());
    }
}
