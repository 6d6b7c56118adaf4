//! Writing files so that nothing is lost: a partial file beside the target,
//! synced, then renamed over it; and a process-wide list of partial files in
//! progress, so that an abort (a second Ctrl-C) can remove them before the
//! process exits.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Partial files being written right now.
static IN_PROGRESS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn in_progress() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    crate::sync::lock(&IN_PROGRESS)
}

/// The temporary name `p` is written under before it is renamed into place:
/// hidden, beside it, unique to this process.
#[must_use]
pub fn partial_path(p: &Path) -> PathBuf {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    p.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// Removes every partial file this process is writing. Call it just before
/// the process exits abruptly (e.g. on a second Ctrl-C).
pub fn remove_partials() {
    for p in in_progress().drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

/// A file being written under its partial name; [`PartialFile::commit`]
/// moves it into place, dropping it without committing removes it.
#[derive(Debug)]
pub struct PartialFile {
    target: PathBuf,
    tmp: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl PartialFile {
    /// Creates the partial file for `target` (which is not touched yet).
    ///
    /// # Errors
    /// The operating system's error when the partial file cannot be created.
    pub fn create(target: &Path) -> io::Result<Self> {
        let tmp = partial_path(target);
        // Registered before creation: an abort in between removes nothing worse than a missing file.
        in_progress().push(tmp.clone());
        match File::create(&tmp) {
            Ok(f) => Ok(Self {
                target: target.to_path_buf(),
                tmp,
                writer: Some(BufWriter::new(f)),
            }),
            Err(e) => {
                unregister(&tmp);
                Err(e)
            }
        }
    }

    /// Where the file will land.
    #[must_use]
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Flushes, syncs, and renames the file over its target, then syncs the
    /// directory so the rename itself is durable.
    ///
    /// # Errors
    /// The operating system's error; the partial file is removed then.
    pub fn commit(mut self) -> io::Result<()> {
        let result = (|| {
            let w = self
                .writer
                .take()
                .ok_or_else(|| io::Error::other("already committed"))?;
            let f = w.into_inner().map_err(io::IntoInnerError::into_error)?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&self.tmp, &self.target)?;
            let dir = self
                .target
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            // Not every filesystem lets a directory be synced; the rename is done either way.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&self.tmp);
        }
        unregister(&self.tmp);
        result
    }
}

impl Write for PartialFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.writer {
            Some(w) => w.write(buf),
            None => Err(io::Error::other("already committed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.writer {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
            unregister(&self.tmp);
        }
    }
}

fn unregister(tmp: &Path) {
    in_progress().retain(|p| p != tmp);
}

/// Writes `path` atomically: `write` fills a partial file beside it, which is
/// synced and renamed over `path`. On any failure nothing is left behind and
/// `path` is untouched.
///
/// # Errors
/// The first error of `write`, the file system or the rename.
pub fn atomic_write<T>(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<T>,
) -> io::Result<T> {
    let mut f = PartialFile::create(path)?;
    let value = write(&mut f)?;
    f.commit()?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        std::fs::write(&p, "old").unwrap();
        atomic_write(&p, |w| w.write_all(b"new")).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        let err = atomic_write(&p, |w| {
            w.write_all(b"half")?;
            Err::<(), _>(io::Error::other("boom"))
        });
        assert!(err.is_err());
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "new",
            "a failed write keeps the old file"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.json")]);
    }

    #[test]
    fn dropped_and_aborted_partials_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("events.jsonl");
        let mut f = PartialFile::create(&p).unwrap();
        f.write_all(b"x").unwrap();
        assert!(partial_path(&p).exists());
        drop(f);
        assert!(!partial_path(&p).exists());
        assert!(!p.exists());
        let mut f = PartialFile::create(&p).unwrap();
        f.write_all(b"y").unwrap();
        f.flush().unwrap();
        remove_partials();
        assert!(
            !partial_path(&p).exists(),
            "an abort removes partial files in progress"
        );
        std::mem::forget(f);
    }
}
