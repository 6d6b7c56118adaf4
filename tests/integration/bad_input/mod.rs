//! The bad-input corpus: every malformed file, model or flag must end the
//! binary with exit code 2, one `voxline:` line on stderr that names the
//! file or flag and the problem, no panic, and nothing half-written.
//!
//! The corpus is a table ([`cases`]): one [`Case`] per bad input, with what
//! it makes in its own scratch directory (hand-written RIFF headers, raw
//! bytes, cut-down copies of the installed models), its arguments, the exit
//! code and the fragments its error must contain. One runner checks them all
//! the same way, including that nothing was written or changed: a new bad
//! input is one row.
//!
//! Also ([`streaming`]): a file cut short is played to the cut, pipes are
//! read, odd but valid audio (silence, noise, clipping) runs cleanly, and a
//! long file streams in bounded memory.

mod bytes;
mod cases;
mod streaming;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use crate::util;

// ---------------------------------------------------------------- running

fn os(s: impl AsRef<OsStr>) -> OsString {
    s.as_ref().to_os_string()
}

/// Runs the binary from the repository root with the given arguments.
fn voxline(args: &[OsString]) -> Output {
    util::voxline_bin()
        .current_dir(util::root())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the voxline binary runs")
}

/// Every entry below `dir` (files and directories), relative paths.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            out.extend(entries(&p));
        }
        out.push(p);
    }
    out
}

fn partial_files(dir: &Path) -> Vec<PathBuf> {
    entries(dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".partial"))
        .collect()
}

/// Writes a file into `dir` and returns its path.
fn put(dir: &Path, name: impl AsRef<OsStr>, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name.as_ref());
    std::fs::write(&p, bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    p
}

/// The standard outputs a replay gets, so the test can see whether anything was left behind.
fn outputs(out: &Path) -> Vec<OsString> {
    vec![
        os("--quiet"),
        os("--pace"),
        os("fast"),
        os("--report-json"),
        os(out.join("report.json")),
        os("--events"),
        os(out.join("events.jsonl")),
    ]
}

/// Sets `flag`'s value in `args`, replacing the one already there.
fn set_flag(mut args: Vec<OsString>, flag: &str, value: impl AsRef<OsStr>) -> Vec<OsString> {
    let i = args
        .iter()
        .position(|x| x == flag)
        .unwrap_or_else(|| panic!("{flag} is not in {args:?}"));
    args[i + 1] = os(value);
    args
}

// ---------------------------------------------------------------- the table's row

/// How a case's stderr must look.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Style {
    /// voxline's own validation: exactly one line, starting with `voxline:`,
    /// no Rust wording (`Some(`, `None`, `os error`), nothing on stdout.
    OneLine,
}

/// One bad input: a row of [`cases::cases`].
struct Case {
    /// What is wrong with the input, as failures name it.
    name: &'static str,
    /// Makes what the case needs in its scratch directory and returns the
    /// arguments to run the binary with.
    setup: fn(&Scratch) -> Vec<OsString>,
    /// The exit code the binary must end with.
    exit: i32,
    /// How stderr must look.
    style: Style,
    /// Words stderr must contain (compared in lower case).
    expect: Vec<&'static str>,
}

impl Case {
    /// The usual row: refused by voxline's own checks, exit code 2, one line.
    /// Rows give `name`, `setup` and `expect` and take the rest from here.
    const ONE_LINE: Case = Case {
        name: "",
        setup: |_| Vec::new(),
        exit: 2,
        style: Style::OneLine,
        expect: Vec::new(),
    };
}

/// A case's scratch directory: its inputs at the top, its outputs in `out/`.
/// Every file in it must be the same after the run as before, and `out/`
/// must stay empty.
struct Scratch {
    dir: PathBuf,
    out: PathBuf,
}

impl Scratch {
    fn new(dir: PathBuf) -> Scratch {
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        Scratch { dir, out }
    }

    /// Writes an input file and returns its path.
    fn put(&self, name: impl AsRef<OsStr>, bytes: &[u8]) -> PathBuf {
        put(&self.dir, name, bytes)
    }

    /// Makes a directory and returns its path.
    fn mkdir(&self, name: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// A path in the scratch directory that is not made.
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `replay FILE` with the standard outputs, the models and `extra`.
    fn replay(&self, file: impl AsRef<OsStr>, extra: &[&dyn AsRef<OsStr>]) -> Vec<OsString> {
        let mut a = vec![os("replay"), os(file)];
        a.extend(outputs(&self.out));
        a.extend(models_args());
        a.extend(extra.iter().map(os));
        a
    }

    /// `replay` of a good fixture with `extra`: for bad models, budgets, flags.
    fn replay_good(&self, extra: &[&dyn AsRef<OsStr>]) -> Vec<OsString> {
        self.replay(good_wav(), extra)
    }

    /// `bench` with its outputs, the models and `extra`.
    fn bench(&self, extra: &[&dyn AsRef<OsStr>]) -> Vec<OsString> {
        let mut a = vec![
            os("bench"),
            os("--out"),
            os(self.out.join("bench")),
            os("--events"),
            os(self.out.join("events.jsonl")),
        ];
        a.extend(models_args());
        a.extend(extra.iter().map(os));
        a
    }

    /// `serve` on a free loopback port with `extra` and the models.
    fn serve(&self, extra: &[&dyn AsRef<OsStr>]) -> Vec<OsString> {
        let mut a = vec![os("serve")];
        a.extend(models_args());
        a.extend(extra.iter().map(os));
        a
    }

    /// `live` with `extra`, a report and the models.
    fn live(&self, extra: &[&dyn AsRef<OsStr>]) -> Vec<OsString> {
        let mut a = vec![os("live")];
        a.extend(extra.iter().map(os));
        a.extend([os("--report-json"), os(self.out.join("report.json"))]);
        a.extend(models_args());
        a
    }

    /// Every file below the scratch directory and its contents (`None`: unreadable).
    fn snapshot(&self) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
        entries(&self.dir)
            .into_iter()
            .filter(|p| p.is_file())
            .map(|p| {
                let bytes = std::fs::read(&p).ok();
                (p, bytes)
            })
            .collect()
    }
}

fn models_args() -> [OsString; 2] {
    [os("--models-dir"), os(util::models_dir())]
}

/// A good recording, for cases whose bad part is elsewhere.
fn good_wav() -> PathBuf {
    util::fixture("q_capital.wav")
}

// ---------------------------------------------------------------- the runner

/// Checks one case's run; returns what was wrong with it (empty when it passed).
fn check(
    case: &Case,
    scratch: &Scratch,
    before: &BTreeMap<PathBuf, Option<Vec<u8>>>,
    output: &Output,
) -> Vec<String> {
    let mut problems = Vec::new();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let code = output.status.code();
    if code != Some(case.exit) {
        problems.push(format!("exit code {code:?}, expected {}", case.exit));
    }
    if stderr.contains("panicked") {
        problems.push("stderr reports a panic".into());
    }
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    match case.style {
        Style::OneLine => {
            if lines.len() != 1 {
                problems.push(format!(
                    "{} stderr lines, expected exactly one",
                    lines.len()
                ));
            }
            if !lines.first().is_some_and(|l| l.starts_with("voxline: ")) {
                problems.push("stderr does not start with `voxline: `".into());
            }
            // Rust's own wording must not reach the user
            for leak in ["Some(", "None", "os error"] {
                if stderr.contains(leak) {
                    problems.push(format!("stderr shows internal wording {leak:?}"));
                }
            }
            if !output.stdout.is_empty() {
                problems.push(format!(
                    "unexpected stdout: {:?}",
                    String::from_utf8_lossy(&output.stdout)
                ));
            }
        }
    }
    if stderr.contains('\u{1b}') {
        problems.push("stderr holds terminal escape codes although it is not a terminal".into());
    }
    let lower = stderr.to_lowercase();
    for want in &case.expect {
        if !lower.contains(&want.to_lowercase()) {
            problems.push(format!("stderr does not mention {want:?}"));
        }
    }
    // nothing written, nothing changed
    let after = scratch.snapshot();
    let written: Vec<&PathBuf> = after.keys().filter(|p| !before.contains_key(*p)).collect();
    if !written.is_empty() {
        problems.push(format!("files left behind: {written:?}"));
    }
    let partial = partial_files(&scratch.dir);
    if !partial.is_empty() {
        problems.push(format!(".partial files left behind: {partial:?}"));
    }
    let changed: Vec<&PathBuf> = before
        .iter()
        .filter(|(p, bytes)| after.get(*p) != Some(*bytes))
        .map(|(p, _)| p)
        .collect();
    if !changed.is_empty() {
        problems.push(format!("inputs changed or removed: {changed:?}"));
    }
    problems
}

#[test]
fn bad_inputs_exit_2_with_one_line_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = cases::cases();
    assert!(
        cases.len() >= 25,
        "the corpus has only {} cases",
        cases.len()
    );
    let names: BTreeSet<&str> = cases.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), cases.len(), "two cases share a name");
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let scratch = Scratch::new(tmp.path().join(format!("case-{i:02}")));
        let args = (case.setup)(&scratch);
        let before = scratch.snapshot();
        let output = voxline(&args);
        let problems = check(case, &scratch, &before, &output);
        // the whole corpus's answers, visible with --nocapture or on failure
        eprintln!(
            "[{}] exit {:?}: {}",
            case.name,
            output.status.code(),
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        if !problems.is_empty() {
            failures.push(format!(
                "[{}] {}\n    args: {:?}\n    exit: {:?}\n    stderr: {}",
                case.name,
                problems.join("; "),
                args,
                output.status.code(),
                String::from_utf8_lossy(&output.stderr)
                    .trim_end()
                    .replace('\n', "\n            "),
            ));
        }
    }
    // nothing anywhere in the temp dir is a leftover `.partial`
    let partial = partial_files(tmp.path());
    assert!(partial.is_empty(), "partial files left: {partial:?}");
    assert!(
        failures.is_empty(),
        "{} of {} bad-input cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
