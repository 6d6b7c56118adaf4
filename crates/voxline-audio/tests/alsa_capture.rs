//! Live capture through the real cpal → ALSA path, without sound hardware.
//!
//! ALSA's `file` plugin can act as a capture device that reads its samples
//! from a file. The test writes a `.asoundrc` into a temporary `HOME` that
//! defines `voxtest`: a `plug` device (so cpal may open it in whatever
//! format it prefers) over a `file` device reading raw 16 kHz mono `S16_LE`
//! from a named pipe. A writer thread feeds `q_capital.wav`'s samples into
//! the pipe, then silence, paced at about four times real time: ALSA's
//! `null` slave would otherwise deliver as fast as the pipe can be read,
//! which no live device does.
//!
//! alsa-lib reads `$HOME/.asoundrc` once per process, so this file holds a
//! single test that sets `HOME` before any ALSA call (cargo runs each
//! integration-test file as its own process).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use voxline_audio::{
    list_input_devices, AudioError, Capture, CaptureEnd, CaptureError, Endpointer, VadConfig,
};
use voxline_core::{edge, AudioFrame, Clock, FullPolicy};

/// ±150 ms at 16 kHz.
const TOLERANCE: u64 = 2_400;
/// The endpointer's default pre-roll, 200 ms.
const PRE_ROLL: u64 = 3_200;
/// Bytes of 16 kHz mono S16 per 20 ms.
const CHUNK_BYTES: usize = 640;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../audio-fixtures")
        .join(name)
}

fn asoundrc(fifo: &Path) -> String {
    format!(
        r#"pcm.voxfile {{
    type file
    slave.pcm null
    file "/dev/null"
    infile "{}"
    format "raw"
    hint.show off
}}
pcm.voxtest {{
    type plug
    slave {{
        pcm voxfile
        format S16_LE
        rate 16000
        channels 1
    }}
    hint {{
        show on
        description "voxline test input"
    }}
}}
"#,
        fifo.display()
    )
}

/// Opens the pipe for reading and writing: this never blocks, and while the
/// handle lives, ALSA's opening and closing of the reading end neither blocks
/// nor breaks the writer.
fn open_pipe(fifo: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(fifo)
        .expect("open the pipe")
}

/// Writes `pcm` into the pipe in 20 ms pieces every 5 ms, then silence until
/// `stop`.
fn feed(mut pipe: File, pcm: Vec<u8>, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let silence = [0u8; CHUNK_BYTES];
        let pieces = pcm.chunks(CHUNK_BYTES).chain(std::iter::repeat(&silence[..]));
        for piece in pieces {
            if stop.load(Ordering::Acquire) || pipe.write_all(piece).is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
    })
}

fn correlation(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|s| f64::from(*s).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
}

#[test]
fn captures_a_file_backed_alsa_device() {
    // The fixture's samples as raw S16_LE and as f32.
    let mut reader = hound::WavReader::open(fixture("q_capital.wav")).unwrap();
    assert_eq!(reader.spec().sample_rate, 16_000);
    assert_eq!(reader.spec().channels, 1);
    let ints: Vec<i16> = reader.samples::<i16>().map(Result::unwrap).collect();
    let truth: Vec<f32> = ints.iter().map(|&s| f32::from(s) / 32_768.0).collect();
    let pcm: Vec<u8> = ints.iter().flat_map(|s| s.to_le_bytes()).collect();
    let sidecar: Value =
        serde_json::from_str(&fs::read_to_string(fixture("q_capital.json")).unwrap()).unwrap();
    let turn = &sidecar["turns"][0];
    let (true_start, true_end) = (
        turn["start_sample"].as_u64().unwrap(),
        turn["end_sample"].as_u64().unwrap(),
    );

    let home = tempfile::tempdir().unwrap();
    let fifo = home.path().join("voxtest.pipe");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo failed");
    // ALSA opens the pipe whenever it opens the device; with no writer that open would block.
    let pipe = open_pipe(&fifo);
    fs::write(home.path().join(".asoundrc"), asoundrc(&fifo)).unwrap();
    std::env::set_var("HOME", home.path());

    // (a) The device is listed, under its ALSA name and its description.
    let devices = list_input_devices().unwrap();
    let voxtest = devices
        .iter()
        .find(|d| d.id == "voxtest")
        .unwrap_or_else(|| panic!("voxtest not listed: {devices:?}"));
    assert_eq!(voxtest.name, "voxline test input");
    assert!(voxtest.config_error.is_none(), "{voxtest:?}");
    assert!(
        voxtest
            .configs
            .iter()
            .any(|c| c.min_sample_rate <= 16_000 && 16_000 <= c.max_sample_rate),
        "{voxtest:?}"
    );
    assert!(voxtest.default_config.is_some());

    // A wrong name fails with the list of devices that do exist.
    let (tx, _rx) = edge::<AudioFrame>("audio", 8, FullPolicy::DropOldest);
    match Capture::start(Some("no such microphone"), tx, Clock::start()) {
        Err(AudioError::Capture(e @ CaptureError::DeviceNotFound { .. })) => {
            let msg = e.to_string();
            assert!(msg.contains("`no such microphone`"), "{msg}");
            assert!(msg.contains("voxtest (voxline test input)"), "{msg}");
        }
        other => panic!("expected DeviceNotFound, got {other:?}"),
    }

    // (b) Capture the fixture and compare.
    let (tx, rx) = edge::<AudioFrame>("audio", 4_096, FullPolicy::DropOldest);
    let clock = Clock::start();
    let capture = Capture::start(Some("voxtest"), tx, clock).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(capture.format().device_id, "voxtest");
    let capture_format = capture.format().clone();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = feed(pipe, pcm, Arc::clone(&stop));

    // Everything of the file plus one second of the silence after it.
    let want = truth.len() + 16_000;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut frames = Vec::new();
    let mut got = 0;
    while got < want {
        assert!(
            Instant::now() < deadline,
            "only {got} of {want} samples arrived"
        );
        if let Ok(env) = rx.recv_timeout(Duration::from_millis(100)) {
            let received = Instant::now();
            assert!(env.item.captured <= received, "captured in the future");
            got += env.item.samples.len();
            frames.push(env.item);
        }
    }
    let stats = capture.stop();
    stop.store(true, Ordering::Release);
    writer.join().unwrap();
    frames.extend(rx.try_iter().map(|e| e.item));

    assert_eq!(stats.end, CaptureEnd::Stopped, "{stats:?}");
    assert_eq!(stats.frames_dropped_in_ring, 0, "{stats:?}");
    assert_eq!(rx.stats().dropped(), 0);
    assert!(stats.frames_captured > 0);
    let sent: usize = frames.iter().map(|f| f.samples.len()).sum();
    assert_eq!(stats.samples_sent, sent as u64);
    assert_eq!(stats.frames_sent, frames.len() as u64);
    // Positions are contiguous from 0.
    let mut next = 0;
    for f in &frames {
        assert_eq!(f.start_sample, next);
        next = f.end_sample();
    }
    let audio: Vec<f32> = frames.iter().flat_map(|f| f.samples.iter().copied()).collect();
    assert!(audio.len() >= want);

    // The same samples, within a millisecond of the same place (ALSA's plug
    // layer may have converted rate and format on the way).
    let n = truth.len();
    eprintln!("DEBUG format {:?} stats {:?} len {}", capture_format, stats, audio.len());
    let fnz = |x: &[f32]| x.iter().position(|s| s.abs() > 0.01);
    eprintln!("DEBUG first loud truth {:?} audio {:?}", fnz(&truth), fnz(&audio));
    eprintln!("DEBUG audio[0..20] {:?}", &audio[..20]);
    let t0 = fnz(&truth).unwrap(); eprintln!("DEBUG truth[t0..] {:?}", &truth[t0..t0+10]);
    let lnz = |x: &[f32]| x.iter().rposition(|s| s.abs() > 0.01);
    eprintln!("DEBUG last loud truth {:?} audio {:?}", lnz(&truth), lnz(&audio));
    let a0 = fnz(&audio).unwrap(); eprintln!("DEBUG audio[a0..] {:?}", &audio[a0..a0+10]);
    let (lag, corr) = (0..=16usize)
        .map(|lag| (lag, correlation(&truth[..n - 16], &audio[lag..lag + n - 16])))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    assert!(corr > 0.95, "best correlation {corr} at lag {lag}");
    let (r_truth, r_audio) = (rms(&truth), rms(&audio[lag..lag + n]));
    assert!(
        (r_audio / r_truth - 1.0).abs() < 0.1,
        "rms {r_audio} vs {r_truth}"
    );
    // After the file comes silence: the speech is as long as the file's.
    assert!(rms(&audio[n + 400..want]) < 1e-3, "not silent after the file");

    // (c) One utterance, where the sidecar says.
    let mut ep = Endpointer::new(VadConfig::default()).unwrap();
    let mut segments = ep.push(&audio);
    segments.extend(ep.finish());
    assert_eq!(segments.len(), 1, "{:?}", segments.iter().map(|s| (s.start_sample, s.end_sample)).collect::<Vec<_>>());
    let seg = &segments[0];
    let onset = seg.start_sample + PRE_ROLL;
    assert!(
        onset.abs_diff(true_start) <= TOLERANCE,
        "onset {onset} vs {true_start}"
    );
    assert!(
        seg.end_sample.abs_diff(true_end) <= TOLERANCE,
        "end {} vs {true_end}",
        seg.end_sample
    );
}
