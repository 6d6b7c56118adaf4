//! An accelerated live soak: `voxline live` captures from ALSA's `file`
//! plugin (defined in a temporary `$HOME/.asoundrc`), whose `null` slave
//! delivers audio as fast as it is read (hundreds of times real time). The
//! plugin's input file is a FIFO that a thread here fills with a real speech
//! recording, over and over, so turns keep happening (most of the audio is
//! dropped, and counted, because whisper is far slower than that). The
//! process's RSS is read from `/proc/PID/status` (`VmRSS`) while it runs.
//!
//! Shared by `benches/live_soak.rs` (100 hours) and the integration test
//! `live_soak` (a few hours).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of one second of device audio: 48 kHz, 2 channels, f32 (what cpal
/// opens the plugin with).
pub const DEVICE_BYTES_PER_S: f64 = 48_000.0 * 2.0 * 4.0;

/// What to run.
pub struct Soak {
    /// The `voxline` binary.
    pub bin: PathBuf,
    /// The models directory.
    pub models: PathBuf,
    /// The recording fed in a loop.
    pub speech: PathBuf,
    /// Hours of device audio to feed.
    pub hours: f64,
    /// Wall-time limit: stop there even if fewer hours were fed.
    pub max_wall: Duration,
}

/// One RSS reading.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Seconds since the start.
    pub wall_s: f64,
    /// Hours of audio fed to the device so far.
    pub audio_h: f64,
    /// The process's resident set, kB.
    pub rss_kb: u64,
}

/// What a soak measured.
#[derive(Debug)]
pub struct Outcome {
    /// RSS readings, four a second.
    pub samples: Vec<Sample>,
    /// Hours of audio fed.
    pub fed_h: f64,
    /// The session's exit code.
    pub code: Option<i32>,
    /// Its stderr.
    pub stderr: String,
    /// Its report.
    pub report: serde_json::Value,
    /// Bytes of its event log.
    pub events_bytes: u64,
}

impl Outcome {
    /// The first reading at or after `hours` of audio.
    #[must_use]
    pub fn at_hours(&self, hours: f64) -> Option<Sample> {
        self.samples.iter().find(|s| s.audio_h >= hours).copied()
    }

    /// The last reading.
    #[must_use]
    pub fn last(&self) -> Option<Sample> {
        self.samples.last().copied()
    }
}

fn rss_kb(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Opens the FIFO for writing once a reader has it open (never blocks: a
/// session that failed to start must not hang the soak).
fn open_writer(fifo: &Path, stop: &AtomicBool) -> Option<std::fs::File> {
    while !stop.load(Ordering::Relaxed) {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo)
        {
            Ok(f) => {
                // blocking writes from here on: the reader paces the feed
                use std::os::fd::AsRawFd;
                // SAFETY: fcntl on a descriptor this function owns.
                unsafe {
                    let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
                    libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
                }
                return Some(f);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    None
}

/// Runs the soak.
///
/// # Panics
/// When sox, the FIFO or the session cannot be set up.
#[must_use]
pub fn run(soak: &Soak) -> Outcome {
    let home = tempfile::tempdir().expect("a temporary HOME");
    let raw = home.path().join("speech.raw");
    let status = Command::new("sox")
        .arg(&soak.speech)
        .args(["-t", "f32", "-r", "48000", "-c", "2"])
        .arg(&raw)
        .status()
        .expect("sox runs");
    assert!(status.success(), "sox converts {}", soak.speech.display());
    let speech = std::fs::read(&raw).expect("the converted recording");
    let fifo = home.path().join("input.fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("a path");
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    std::fs::write(
        home.path().join(".asoundrc"),
        format!(
            "pcm.voxsoak {{\n  type file\n  slave.pcm null\n  file \"/dev/null\"\n  infile \"{}\"\n  format \"raw\"\n}}\n",
            fifo.display()
        ),
    )
    .expect("the asoundrc");
    let report = home.path().join("report.json");
    let events = home.path().join("events.jsonl");
    let mut child = Command::new(&soak.bin)
        .env("HOME", home.path())
        // Each turn on its own (`--no-memory`): with the conversation kept,
        // every turn past ~25 re-evaluates the whole history (the context
        // cliff, see Performance), and the turns queued at the end would take
        // minutes to drain. The history is bounded by `--ctx` either way.
        .args([
            "live",
            "--device",
            "voxsoak",
            "--max-tokens",
            "8",
            "--no-memory",
            "--quiet",
        ])
        .arg("--models-dir")
        .arg(&soak.models)
        .arg("--report-json")
        .arg(&report)
        .arg("--events")
        .arg(&events)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("voxline starts");
    let pid = child.id();
    let stderr = child.stderr.take().expect("stderr");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut { stderr }, &mut s);
        s
    });

    let fed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let target = (soak.hours * 3600.0 * DEVICE_BYTES_PER_S) as u64;
    let feeder = {
        let (fed, stop, fifo) = (fed.clone(), stop.clone(), fifo.clone());
        std::thread::spawn(move || {
            // a reader that goes away (the device probed before the capture
            // opens it) is followed by the next one
            while let Some(mut w) = open_writer(&fifo, &stop) {
                loop {
                    if stop.load(Ordering::Relaxed) || fed.load(Ordering::Relaxed) >= target {
                        return;
                    }
                    if w.write_all(&speech).is_err() {
                        break;
                    }
                    fed.fetch_add(speech.len() as u64, Ordering::Relaxed);
                }
            }
        })
    };

    let start = Instant::now();
    let mut samples = Vec::new();
    loop {
        std::thread::sleep(Duration::from_millis(250));
        if child.try_wait().ok().flatten().is_some() {
            break;
        }
        let audio_h = fed.load(Ordering::Relaxed) as f64 / DEVICE_BYTES_PER_S / 3600.0;
        if let Some(rss_kb) = rss_kb(pid) {
            samples.push(Sample {
                wall_s: start.elapsed().as_secs_f64(),
                audio_h,
                rss_kb,
            });
        }
        if fed.load(Ordering::Relaxed) >= target || start.elapsed() >= soak.max_wall {
            // Ctrl-C: the session ends, writing its report
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid as i32, libc::SIGINT) };
            break;
        }
    }
    let status = child.wait().expect("voxline ends");
    stop.store(true, Ordering::Relaxed);
    let _ = feeder.join();
    let stderr = err_thread.join().unwrap_or_default();
    let report = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    Outcome {
        samples,
        fed_h: fed.load(Ordering::Relaxed) as f64 / DEVICE_BYTES_PER_S / 3600.0,
        code: status.code(),
        stderr,
        report,
        events_bytes: std::fs::metadata(&events).map_or(0, |m| m.len()),
    }
}
