//! A private PulseAudio for the live tests and the echo bench: null sinks
//! for the microphone and the voice, an optional echo path between them,
//! outside recorders on their monitors, and `voxline live` run on it.

use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;

use crate::util;

/// A private PulseAudio daemon: a null sink (16 kHz mono) whose monitor is
/// the default source, on a socket in a temporary runtime directory.
pub(crate) struct Pulse {
    pub(crate) dir: tempfile::TempDir,
    daemon: std::process::Child,
}

impl Pulse {
    /// Starts the daemon; panics with one line saying why when it cannot.
    pub(crate) fn start() -> Pulse {
        Self::start_with("")
    }

    /// Starts the daemon with a second null sink, `voxout`, for the voice
    /// (its monitor is where an outside recorder hears it).
    pub(crate) fn start_with_output() -> Pulse {
        Self::start_with(
            "load-module module-null-sink sink_name=voxout rate=22050 channels=1 format=s16le\n",
        )
    }

    pub(crate) fn start_with(extra: &str) -> Pulse {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let home = dir.path().join("home");
        for d in [&run, &home] {
            std::fs::create_dir(d).unwrap();
            std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .unwrap();
        }
        let socket = run.join("native");
        std::fs::write(
            dir.path().join("test.pa"),
            format!(
                "load-module module-native-protocol-unix auth-anonymous=1 socket={}\n\
                 load-module module-null-sink sink_name=voxsink rate=16000 channels=1 format=s16le\n\
                 {extra}set-default-sink voxsink\n\
                 set-default-source voxsink.monitor\n",
                socket.display()
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("client.conf"), "autospawn = no\n").unwrap();
        // ALSA's `default` PCM is PulseAudio (ALSA's pulse plugin).
        std::fs::write(
            home.join(".asoundrc"),
            "pcm.!default { type pulse }\nctl.!default { type pulse }\n",
        )
        .unwrap();
        let spawned = std::process::Command::new("pulseaudio")
            .args([
                "--daemonize=no",
                "--exit-idle-time=-1",
                "-n",
                "--use-pid-file=no",
                "--disable-shm=yes",
                "--realtime=no",
                "--high-priority=no",
                "--log-target=stderr",
                "--log-level=error",
            ])
            .arg(format!("--file={}", dir.path().join("test.pa").display()))
            .env("HOME", &home)
            .env("XDG_RUNTIME_DIR", &run)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("PULSE_RUNTIME_PATH", run.join("pulse"))
            .env("PULSE_STATE_PATH", home.join("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let daemon = match spawned {
            Ok(d) => d,
            Err(e) => panic!(
                "PulseAudio cannot be started ({e}): install pulseaudio, pulseaudio-utils and \
                 libasound2-plugins (.ci/setup.sh does, as root)"
            ),
        };
        let mut pulse = Pulse { dir, daemon };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let ok = pulse
                .client(std::process::Command::new("pactl").arg("info"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return pulse;
            }
            if let Ok(Some(status)) = pulse.daemon.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = pulse.daemon.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                panic!(
                    "PulseAudio could not be started here ({status}): {}",
                    err.lines().last().unwrap_or("no message")
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "PulseAudio did not answer `pactl info` within 15 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Plays `file` into the microphone's sink, waiting for it to end.
    pub(crate) fn play(&self, file: &Path) {
        let status = self
            .client(&mut std::process::Command::new("paplay"))
            .arg(file)
            .status()
            .expect("paplay (pulseaudio-utils) runs");
        assert!(status.success(), "paplay failed");
    }

    /// `cmd` as a client of this daemon (ALSA's `default` included).
    pub(crate) fn client<'a>(
        &self,
        cmd: &'a mut std::process::Command,
    ) -> &'a mut std::process::Command {
        let run = self.dir.path().join("run");
        cmd.env("HOME", self.dir.path().join("home"))
            .env("XDG_RUNTIME_DIR", &run)
            .env(
                "PULSE_SERVER",
                format!("unix:{}", run.join("native").display()),
            )
            .env("PULSE_CLIENTCONFIG", self.dir.path().join("client.conf"))
            .env("PULSE_SINK", "voxsink")
            .env("PULSE_SOURCE", "voxsink.monitor")
    }
}

impl Drop for Pulse {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

/// An arecord on `source` of this daemon, raw 16 kHz S16LE in 10 ms periods.
pub(crate) fn recorder(pulse: &Pulse, source: &str) -> std::process::Child {
    let mut rec = std::process::Command::new("arecord");
    pulse
        .client(&mut rec)
        .env("PULSE_SOURCE", source)
        .args([
            "-D", "default", "-q", "-t", "raw", "-f", "S16_LE", "-r", "16000", "-c", "1",
        ])
        .args(["--period-time=10000", "--buffer-time=40000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    rec.spawn().expect("arecord (alsa-utils) runs")
}

/// A line a live session printed: when, on standard output (`true`) or
/// standard error, and the line.
pub(crate) type Line = (std::time::Instant, bool, String);

/// The log filter the live tests run `voxline` with: warnings, and what the
/// conversation keeps after a barge-in.
pub(crate) const LIVE_LOG: &str =
    "warn,voxline_core=error,voxline_audio=error,voxline_llm=info,voxline_stt::stage=debug,llama-cpp-2=off,whisper_rs=off,symphonia=off";

/// The log filter for a live test that reads only what `voxline` says
/// (warnings, the console), not its debug lines.
pub(crate) const QUIET_LOG: &str =
    "warn,voxline_core=error,voxline_audio=error,llama-cpp-2=off,whisper_rs=off";

/// A `voxline live` session started by [`live_session`].
pub(crate) struct LiveSession {
    /// The process.
    pub(crate) child: std::process::Child,
    /// Its lines from the one that said it listens on, as they come.
    pub(crate) lines: std::sync::mpsc::Receiver<Line>,
    /// When it said it listens.
    pub(crate) listening: std::time::Instant,
    /// What it printed until then, that line included.
    pub(crate) before: Vec<String>,
}

/// `voxline live ARGS` on this daemon, the voice to `voxout` and the
/// microphone on `source` (default: the daemon's default source,
/// `voxsink`'s monitor), logging as `log` says (plus `$VOXLINE_LOG`),
/// waited for until it listens (120 s at most).
pub(crate) fn live_session(
    pulse: &Pulse,
    source: Option<&str>,
    args: &[&std::ffi::OsStr],
    log: &str,
) -> LiveSession {
    use std::time::{Duration, Instant};
    let mut vox = util::voxline_bin();
    pulse
        .client(&mut vox)
        .env("PULSE_SINK", "voxout")
        .env(
            "VOXLINE_LOG",
            [log, &std::env::var("VOXLINE_LOG").unwrap_or_default()]
                .join(",")
                .trim_end_matches(','),
        )
        .arg("live")
        .args(args)
        .arg("--models-dir")
        .arg(util::models_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(s) = source {
        vox.env("PULSE_SOURCE", s);
    }
    let mut vox = vox.spawn().unwrap();
    let (tx, lines) = std::sync::mpsc::channel::<Line>();
    for (out, r) in [
        (
            true,
            Box::new(vox.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        ),
        (false, Box::new(vox.stderr.take().unwrap())),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(r).lines().map_while(Result::ok) {
                let _ = tx.send((Instant::now(), out, l));
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((at, false, l)) if l.contains("listening") => {
                seen.push(l);
                return LiveSession {
                    child: vox,
                    lines,
                    listening: at,
                    before: seen,
                };
            }
            Ok((_, _, l)) => seen.push(l),
            Err(_) => {
                let _ = vox.kill();
                let _ = vox.wait();
                seen.extend(lines.try_iter().map(|(_, _, l)| l));
                panic!("voxline never started listening:\n{}", seen.join("\n"));
            }
        }
    }
}

/// `voxline live --voice espeak` on this daemon (the microphone on
/// `voxsink`'s monitor, the voice to `voxout`) with `extra` flags, waited for
/// until it listens; its stderr, whole, from the thread that reads it.
pub(crate) fn speaking_live(
    pulse: &Pulse,
    extra: &[&str],
    report: &Path,
    events: Option<&Path>,
) -> (std::process::Child, std::thread::JoinHandle<String>) {
    let mut args: Vec<&std::ffi::OsStr> = Vec::new();
    // espeak-ng for 90 s at most, unless the test says otherwise
    if !extra.contains(&"--voice") {
        args.extend([
            std::ffi::OsStr::new("--voice"),
            std::ffi::OsStr::new("espeak"),
        ]);
    }
    if !extra.contains(&"--max-duration") {
        args.extend([
            std::ffi::OsStr::new("--max-duration"),
            std::ffi::OsStr::new("90s"),
        ]);
    }
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    args.extend([std::ffi::OsStr::new("--report-json"), report.as_os_str()]);
    if let Some(e) = events {
        args.extend([std::ffi::OsStr::new("--events"), e.as_os_str()]);
    }
    let s = live_session(pulse, None, &args, LIVE_LOG);
    let (lines, mut err) = (s.lines, s.before);
    // standard error, whole, once the session has ended
    let err_thread = std::thread::spawn(move || {
        err.extend(lines.iter().filter(|(_, out, _)| !out).map(|(_, _, l)| l));
        err.join("\n")
    });
    (s.child, err_thread)
}

/// A reader whose chunks arrive, stamped, on a channel as they are read.
pub(crate) fn live_reader<R: std::io::Read + Send + 'static>(
    mut r: R,
) -> std::sync::mpsc::Receiver<(std::time::Instant, Vec<u8>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0
                || tx
                    .send((std::time::Instant::now(), buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    });
    rx
}

/// Whether a chunk of raw S16LE holds a sample above the level a voice
/// reaches (1,000).
pub(crate) fn is_loud(bytes: &[u8]) -> bool {
    bytes
        .chunks_exact(2)
        .any(|b| i16::from_le_bytes([b[0], b[1]]).unsigned_abs() > 1_000)
}

/// A private PulseAudio with an echo path: what plays on the voice's sink
/// (`voxout`) reaches the microphone's (`voxsink`) through a loopback,
/// 40 ms late and `db` down: a loudspeaker and an open microphone.
pub(crate) fn with_an_echo_path(db: f64) -> Pulse {
    let pulse = Pulse::start_with(
        "load-module module-null-sink sink_name=voxout rate=22050 channels=1 format=s16le\n\
         load-module module-loopback source=voxout.monitor sink=voxsink latency_msec=40\n",
    );
    // the loopback's level: the echo path's attenuation
    let inputs = pulse
        .client(std::process::Command::new("pactl").args(["list", "short", "sink-inputs"]))
        .output()
        .unwrap();
    let inputs = String::from_utf8_lossy(&inputs.stdout).to_string();
    let loopback = inputs
        .lines()
        .find(|l| l.contains("loopback"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no loopback among {inputs}"))
        .to_owned();
    let factor = format!("{:.4}", 10f64.powf(db / 20.0));
    let status = pulse
        .client(std::process::Command::new("pactl").args([
            "set-sink-input-volume",
            &loopback,
            &factor,
        ]))
        .status()
        .unwrap();
    assert!(status.success(), "pactl set-sink-input-volume failed");
    pulse
}

/// The events a session logged (`--events`), one JSON object a line.
pub(crate) fn read_events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Every answer the user heard has its `voice_played` event (when its
/// first sound reached the device): an answer that played to its end
/// (`voice_ended`), and one stopped after some of it was heard
/// (`voice_heard` in the report). The issue counted 99 of 1,373 spoken
/// turns without one.
pub(crate) fn every_answer_heard_was_played(
    events: &[serde_json::Value],
    report: &serde_json::Value,
) {
    let played = |id: &serde_json::Value| {
        events
            .iter()
            .any(|e| e["type"] == "voice_played" && e["id"] == *id)
    };
    let ended = events.iter().filter(|e| e["type"] == "voice_ended");
    for e in ended {
        assert!(
            played(&e["id"]),
            "an answer played to its end without voice_played: {e}"
        );
    }
    let turns = report["turns"].as_array().expect("the report lists turns");
    for t in turns
        .iter()
        .filter(|t| t["voice_heard"].as_str().is_some_and(|h| !h.is_empty()))
    {
        assert!(
            played(&t["id"]),
            "an answer heard in part without voice_played: {t}"
        );
    }
    assert!(
        events.iter().any(|e| e["type"] == "voice_played"),
        "no answer was played"
    );
}
