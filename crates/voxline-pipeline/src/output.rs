//! Output files (`--report-json`, `--events`, `--trace`): checked before any
//! model loads, and written so that nothing the user has is ever destroyed.
//!
//! - A path that names an input (a recording, its sidecar, a model, a budget,
//!   a baseline), another output, or a directory is refused up front.
//! - `-` is standard output; a device or a FIFO is written directly (opened,
//!   never replaced by a regular file).
//! - A regular file is written under a partial name beside it, synced, and
//!   renamed over it; a symlink is followed and its target replaced.

use std::io::Write;
use std::path::{Path, PathBuf};

use voxline_core::files::{self, PartialFile};

use crate::BadInput;

/// Where an output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Standard output (`-`).
    Stdout,
    /// A device or FIFO: opened for writing, written in place.
    Direct(PathBuf),
    /// A regular file (symlinks resolved): replaced atomically.
    File(PathBuf),
}

/// One checked output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The flag that named it, for messages.
    pub flag: &'static str,
    /// The path as the user gave it.
    pub given: PathBuf,
    /// Where it is written.
    pub target: Target,
}

/// How many symlinks are followed before giving up (as the kernel does).
const MAX_LINKS: usize = 40;

/// Follows `p` through symlinks (dangling ones too) to the path that would be
/// written. `None` for a loop.
fn resolve_links(p: &Path) -> Option<PathBuf> {
    let mut cur = p.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                let link = std::fs::read_link(&cur).ok()?;
                cur = if link.is_absolute() {
                    link
                } else {
                    cur.parent().unwrap_or(Path::new(".")).join(link)
                };
            }
            _ => return Some(cur),
        }
    }
    None
}

/// A path's identity: its canonical form (parent canonicalised for a file
/// that does not exist yet) and, when it exists, its device and inode.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    path: PathBuf,
    inode: Option<(u64, u64)>,
}

impl Identity {
    fn of(p: &Path) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        let inode = std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
        let path = std::fs::canonicalize(p).unwrap_or_else(|_| {
            let resolved = resolve_links(p).unwrap_or_else(|| p.to_path_buf());
            let parent = resolved
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let parent = std::fs::canonicalize(parent).unwrap_or_else(|_| parent.to_path_buf());
            resolved
                .file_name()
                .map_or(parent.clone(), |n| parent.join(n))
        });
        Self { path, inode }
    }

    fn same(&self, other: &Self) -> bool {
        self.path == other.path || (self.inode.is_some() && self.inode == other.inode)
    }
}

/// Checks every output before any work starts.
///
/// `outputs` are `(flag, path)` pairs; `inputs` every file the run reads
/// (recordings, models, budget, baseline); `recordings` the audio files,
/// whose sidecar paths (`NAME.json`) are protected too, existing or not (a
/// report written there would be read as the sidecar next time).
///
/// # Errors
/// [`BadInput`] naming the flag and path: a directory, an input or sidecar,
/// the same path as another output, a symlink loop, or a directory that
/// cannot be written.
pub fn plan(
    outputs: &[(&'static str, &Path)],
    inputs: &[PathBuf],
    recordings: &[PathBuf],
) -> Result<Vec<Output>, BadInput> {
    let mut protected: Vec<(Identity, String)> = inputs
        .iter()
        .filter(|p| p.as_os_str() != "-")
        .map(|p| (Identity::of(p), format!("the input {}", p.display())))
        .collect();
    for r in recordings.iter().filter(|p| p.as_os_str() != "-") {
        let s = crate::sidecar::Sidecar::path_for(r);
        protected.push((Identity::of(&s), format!("the sidecar of {}", r.display())));
    }
    let mut planned: Vec<(Output, Option<Identity>)> = Vec::new();
    for &(flag, given) in outputs {
        let shown = given.display();
        if given.as_os_str() == "-" {
            if let Some((other, _)) = planned.iter().find(|(o, _)| o.target == Target::Stdout) {
                return Err(BadInput(format!(
                    "{flag} -: {} already writes to standard output; send one of them to a file",
                    other.flag
                )));
            }
            planned.push((
                Output {
                    flag,
                    given: given.to_path_buf(),
                    target: Target::Stdout,
                },
                None,
            ));
            continue;
        }
        let Some(resolved) = resolve_links(given) else {
            return Err(BadInput(format!(
                "{shown}: too many levels of symbolic links; give {flag} a plain file path"
            )));
        };
        let id = Identity::of(given);
        if let Some((_, what)) = protected.iter().find(|(p, _)| p.same(&id)) {
            return Err(BadInput(format!(
                "{shown}: this is {what}; writing {flag} there would destroy it — choose another path"
            )));
        }
        if let Some((other, _)) = planned
            .iter()
            .find(|(_, i)| i.as_ref().is_some_and(|i| i.same(&id)))
        {
            return Err(BadInput(format!(
                "{shown}: {flag} and {} name the same file; give each its own path",
                other.flag
            )));
        }
        let target = match std::fs::metadata(&resolved) {
            Ok(m) if m.is_dir() => {
                return Err(BadInput(format!(
                    "{shown}: is a directory; give {flag} a file path (e.g. {})",
                    given
                        .join(if flag == "--events" {
                            "events.jsonl"
                        } else {
                            "report.json"
                        })
                        .display()
                )))
            }
            Ok(m) if m.is_file() => Target::File(resolved),
            Ok(_) => Target::Direct(resolved),
            Err(_) => Target::File(resolved),
        };
        if let Target::File(p) = &target {
            probe_writable(p, flag, given)?;
        }
        planned.push((
            Output {
                flag,
                given: given.to_path_buf(),
                target,
            },
            Some(id),
        ));
    }
    Ok(planned.into_iter().map(|(o, _)| o).collect())
}

/// How long a named pipe output waits for a reader before it is an error.
pub const FIFO_READER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens a device or a named pipe for writing. A named pipe with no reader
/// would block the open for ever (and a stop signal with it): it is opened
/// without blocking, tried again until a reader comes or
/// [`FIFO_READER_WAIT`] passes, then written as usual.
fn open_direct(p: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let fifo = std::fs::metadata(p).is_ok_and(|m| m.file_type().is_fifo());
    if !fifo {
        return std::fs::OpenOptions::new().write(true).open(p);
    }
    let since = std::time::Instant::now();
    let f = loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(p)
        {
            Ok(f) => break f,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                if since.elapsed() >= FIFO_READER_WAIT {
                    return Err(std::io::Error::other(format!(
                        "a named pipe nobody read for {} s",
                        FIFO_READER_WAIT.as_secs()
                    )));
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    };
    // a reader is there: opened again as usual (at once), writes block as
    // on any pipe; the probe closes after it, so the reader sees no end
    let blocking = std::fs::OpenOptions::new().write(true).open(p)?;
    drop(f);
    Ok(blocking)
}

/// Fails early when a file could not be written beside `p` (missing or read-only directory).
fn probe_writable(p: &Path, flag: &str, given: &Path) -> Result<(), BadInput> {
    let dir = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match PartialFile::create(p) {
        Ok(f) => {
            drop(f); // removes the probe
            Ok(())
        }
        Err(e) => Err(BadInput(match kernel_filesystem(dir) {
            // the system's own reason misleads here (/proc says "No such
            // file or directory" of a file that is there)
            Some((fs, at)) if std::fs::symlink_metadata(p).is_ok() => format!(
                "{}: a file of the kernel's {fs} filesystem ({}), where no file can be \
                 created: it cannot be replaced, and is not written in place; give {flag} a \
                 path in a writable directory",
                given.display(),
                at.display()
            ),
            Some((fs, at)) => format!(
                "{}: {} is the kernel's {fs} filesystem, where no file can be created; give \
                 {flag} a path in a writable directory",
                given.display(),
                at.display()
            ),
            None => format!(
                "{}: cannot write here ({}); give {flag} a path in a writable directory (now {})",
                given.display(),
                crate::io_reason(&e),
                dir.display()
            ),
        })),
    }
}

/// Filesystems whose files are the kernel's own: nothing can be created in
/// them, and what is there is not a file to replace.
const KERNEL_FILESYSTEMS: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "debugfs",
    "tracefs",
    "securityfs",
    "configfs",
    "bpf",
    "pstore",
    "efivarfs",
    "selinuxfs",
    "fusectl",
    "binfmt_misc",
    "devpts",
];

/// The filesystem type and mount point of `dir` when it is one of
/// [`KERNEL_FILESYSTEMS`] (read from `/proc/self/mountinfo`).
fn kernel_filesystem(dir: &Path) -> Option<(String, PathBuf)> {
    use std::os::unix::fs::MetadataExt as _;
    let dev = std::fs::metadata(dir).ok()?.dev();
    // glibc's encoding of a device number
    let (major, minor) = (
        ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        (dev & 0xff) | ((dev >> 12) & !0xff),
    );
    let id = format!("{major}:{minor}");
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // a later mount of the same device is the one seen
    info.lines().rev().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mount: Vec<&str> = mount.split(' ').collect();
        let fs = fs.split(' ').next()?;
        if mount.get(2) != Some(&id.as_str()) || !KERNEL_FILESYSTEMS.contains(&fs) {
            return None;
        }
        Some((fs.to_owned(), PathBuf::from(unescape(mount.get(4)?))))
    })
}

/// A mount point as mountinfo writes it (a space as `\040`), as a path.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .filter(|c| c.bytes().all(|b| (b'0'..=b'7').contains(&b)));
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(b) => {
                out.push(char::from(b));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

impl Output {
    /// Writes `bytes` to the output whole: atomically for a file, directly
    /// for standard output, a device or a FIFO.
    ///
    /// # Errors
    /// The I/O error, with the path.
    pub fn write_all(&self, bytes: &[u8]) -> Result<(), String> {
        let mut w = self.open().map_err(|e| self.describe(&e))?;
        w.write_all(bytes).map_err(|e| self.describe(&e))?;
        w.finish().map_err(|e| self.describe(&e))
    }

    /// Opens a streaming writer: a partial file for a regular file (moved into
    /// place by [`Writer::finish`], removed if dropped), else the stream itself.
    ///
    /// # Errors
    /// The I/O error.
    pub fn open(&self) -> std::io::Result<Writer> {
        Ok(match &self.target {
            Target::Stdout => Writer::Stream(Box::new(std::io::stdout())),
            Target::Direct(p) => Writer::Stream(Box::new(open_direct(p)?)),
            Target::File(p) => Writer::File(PartialFile::create(p)?),
        })
    }

    /// One line naming the output and the problem.
    #[must_use]
    pub fn describe(&self, e: &std::io::Error) -> String {
        format!(
            "{} {}: {}",
            self.flag,
            self.given.display(),
            crate::io_reason(e)
        )
    }

    /// Whether this output is standard output.
    #[must_use]
    pub fn is_stdout(&self) -> bool {
        self.target == Target::Stdout
    }
}

/// A writer for an [`Output`].
pub enum Writer {
    /// Standard output, a device or a FIFO.
    Stream(Box<dyn Write + Send>),
    /// A partial file, renamed into place on [`Writer::finish`].
    File(PartialFile),
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stream(_) => f.write_str("Writer::Stream"),
            Self::File(p) => write!(f, "Writer::File({})", p.target().display()),
        }
    }
}

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Stream(w) => w.write(buf),
            Self::File(f) => f.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Stream(w) => w.flush(),
            Self::File(f) => f.flush(),
        }
    }
}

impl Writer {
    /// Flushes a stream, or commits a file into place.
    ///
    /// # Errors
    /// The I/O error.
    pub fn finish(self) -> std::io::Result<()> {
        match self {
            Self::Stream(mut w) => w.flush(),
            Self::File(f) => f.commit(),
        }
    }
}

/// Removes partial files in progress (before an abrupt exit).
pub fn remove_partials() {
    files::remove_partials();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan1(out: &Path, inputs: &[PathBuf], recs: &[PathBuf]) -> Result<Vec<Output>, BadInput> {
        plan(&[("--report-json", out)], inputs, recs)
    }

    #[test]
    fn refuses_inputs_sidecars_directories_and_twins() {
        let d = tempfile::tempdir().unwrap();
        let wav = d.path().join("talk.wav");
        std::fs::write(&wav, b"RIFF").unwrap();
        let recs = vec![wav.clone()];
        let e = plan1(&wav, &recs, &recs).unwrap_err().0;
        assert!(
            e.contains("the input") && e.contains("--report-json"),
            "{e}"
        );
        // the sidecar, whether or not it exists
        let e = plan1(&d.path().join("talk.json"), &recs, &recs)
            .unwrap_err()
            .0;
        assert!(e.contains("sidecar"), "{e}");
        // the same file through another spelling
        let other = d.path().join(".").join("talk.wav");
        assert!(plan1(&other, &recs, &recs).is_err());
        // a hard link to the input
        let hard = d.path().join("hard.bin");
        std::fs::hard_link(&wav, &hard).unwrap();
        assert!(plan1(&hard, &recs, &recs).is_err());
        // a symlink to the input
        let link = d.path().join("link.json");
        std::os::unix::fs::symlink(&wav, &link).unwrap();
        assert!(plan1(&link, &recs, &recs).is_err());
        let e = plan1(d.path(), &recs, &recs).unwrap_err().0;
        assert!(e.contains("is a directory"), "{e}");
        let p = d.path().join("out.json");
        let e = plan(&[("--report-json", &p), ("--events", &p)], &recs, &recs)
            .unwrap_err()
            .0;
        assert!(e.contains("same file"), "{e}");
        let e = plan(
            &[
                ("--report-json", Path::new("-")),
                ("--events", Path::new("-")),
            ],
            &[],
            &[],
        )
        .unwrap_err()
        .0;
        assert!(e.contains("standard output"), "{e}");
        // nothing was created by the checks
        let mut names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["hard.bin", "link.json", "talk.wav"]);
    }

    #[test]
    fn symlinks_are_followed_and_their_target_replaced() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real.json");
        std::fs::write(&real, "old").unwrap();
        let link = d.path().join("link.json");
        std::os::unix::fs::symlink("real.json", &link).unwrap();
        let out = plan1(&link, &[], &[]).unwrap().remove(0);
        assert_eq!(out.target, Target::File(d.path().join("real.json")));
        out.write_all(b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
        // a dangling link: its target is created
        let dangling = d.path().join("dangling.json");
        std::os::unix::fs::symlink("later.json", &dangling).unwrap();
        plan1(&dangling, &[], &[]).unwrap()[0]
            .write_all(b"x")
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("later.json")).unwrap(),
            "x"
        );
        // a loop is one clear error
        let a = d.path().join("a");
        let b = d.path().join("b");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert!(plan1(&a, &[], &[])
            .unwrap_err()
            .0
            .contains("symbolic links"));
    }

    #[test]
    fn a_named_pipe_nobody_reads_is_an_error_not_a_hang() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("out.wav");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let out = plan1(&fifo, &[], &[]).unwrap().remove(0);
        let t = std::time::Instant::now();
        let e = out.write_all(b"RIFF").unwrap_err();
        assert!(e.contains("nobody read"), "{e}");
        assert!(t.elapsed() < FIFO_READER_WAIT * 2, "{:?}", t.elapsed());
        // with a reader it is written
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        out.write_all(b"RIFF").unwrap();
        assert_eq!(reader.join().unwrap(), b"RIFF");
    }

    #[test]
    fn a_file_of_the_kernel_s_filesystems_is_named_so_not_missing() {
        if kernel_filesystem(Path::new("/proc")).is_none() {
            return; // no proc filesystem here
        }
        let e = plan1(Path::new("/proc/version"), &[], &[]).unwrap_err().0;
        assert_eq!(
            e,
            "/proc/version: a file of the kernel's proc filesystem (/proc), where no file can be \
             created: it cannot be replaced, and is not written in place; give --report-json a \
             path in a writable directory"
        );
        let e = plan1(Path::new("/proc/report.json"), &[], &[])
            .unwrap_err()
            .0;
        assert!(e.contains("/proc is the kernel's proc filesystem"), "{e}");
        assert!(kernel_filesystem(Path::new("/")).is_none());
        assert_eq!(unescape(r"/mnt/a\040b\134c\9"), "/mnt/a b\\c\\9");
    }

    #[test]
    fn devices_are_written_in_place() {
        let out = plan1(Path::new("/dev/null"), &[], &[]).unwrap().remove(0);
        assert_eq!(out.target, Target::Direct(PathBuf::from("/dev/null")));
        out.write_all(b"{}").unwrap();
        assert!(
            !std::fs::metadata("/dev/null").unwrap().is_file(),
            "still a device"
        );
        if Path::new("/dev/full").exists() {
            let out = plan1(Path::new("/dev/full"), &[], &[]).unwrap().remove(0);
            let e = out.write_all(b"{}").unwrap_err();
            assert!(e.contains("/dev/full"), "{e}");
            assert!(!std::fs::metadata("/dev/full").unwrap().is_file());
        }
    }
}
