//! Live capture through the real cpal → ALSA path, without sound hardware.
//!
//! ALSA's `file` plugin over its `null` plugin is a capture device that reads
//! its samples from a raw file. The test writes a `.asoundrc` defining such a
//! device, `voxtest`, into a temporary `HOME`, asks cpal which configuration
//! it will open it in, writes a speech fixture in exactly that format (ALSA's
//! own format and rate conversion over the `file` plugin loses samples, so
//! none is used), and captures it.
//!
//! Pacing: the `null` plugin delivers as fast as it is read, far faster than
//! real time, and after the file's end it delivers silence forever. The
//! capture ring holds `RING_SECONDS` (10 s) of audio, so the first 10 s
//! (the 3 s fixture and the silence after it) always fit; only silence after
//! that may be dropped. The test checks that no drop falls inside the part
//! it compares and that every dropped frame appears as a skip in the stream
//! positions.
//!
//! alsa-lib reads `$HOME/.asoundrc` once per process, so this file holds a
//! single test that sets `HOME` before any ALSA call (cargo runs each
//! integration-test file as its own process).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use voxline_audio::capture::RING_SECONDS;
use voxline_audio::{
    list_input_devices, AudioError, Capture, CaptureEnd, CaptureError, Endpointer,
    InputConfigRange, VadConfig, WavSource,
};
use voxline_core::{edge, AudioFrame, Clock, FullPolicy};

/// ±150 ms at 16 kHz.
const TOLERANCE: u64 = 2_400;
/// The endpointer's default pre-roll, 200 ms.
const PRE_ROLL: u64 = 3_200;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../audio-fixtures")
        .join(name)
}

fn asoundrc(raw: &Path) -> String {
    format!(
        r#"pcm.voxtest {{
    type file
    slave.pcm null
    file "/dev/null"
    infile "{}"
    format "raw"
    hint {{
        show on
        description "voxline test input"
    }}
}}
"#,
        raw.display()
    )
}

/// The recording of "What is the capital of France?" at `rate` Hz.
fn fixture_at(rate: u32) -> &'static str {
    match rate {
        16_000 => "q_capital.wav",
        44_100 => "q_capital_44k_stereo.wav",
        48_000 => "q_capital_48k_f32.wav",
        other => panic!("cpal chose {other} Hz for the test device; add a fixture at that rate"),
    }
}

/// The fixture's audio as raw little-endian interleaved samples in `config`:
/// each frame is the mean of the fixture's channels, repeated on every
/// device channel.
fn raw_pcm(config: &InputConfigRange) -> Vec<u8> {
    let mut reader = hound::WavReader::open(fixture(fixture_at(config.min_sample_rate))).unwrap();
    let spec = reader.spec();
    let samples: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => reader.samples::<f32>().map(Result::unwrap).collect(),
        hound::SampleFormat::Int => {
            let scale = 2f32.powi(i32::from(spec.bits_per_sample) - 1);
            reader
                .samples::<i32>()
                .map(|s| s.unwrap() as f32 / scale)
                .collect()
        }
    };
    let mono = samples
        .chunks_exact(usize::from(spec.channels))
        .map(|f| f.iter().sum::<f32>() / f.len() as f32);
    let mut raw = Vec::new();
    for s in mono {
        for _ in 0..config.channels {
            match config.sample_format.as_str() {
                "f32" => raw.extend_from_slice(&s.to_le_bytes()),
                "i16" => raw.extend_from_slice(&((s * 32_768.0).round() as i16).to_le_bytes()),
                "i32" => {
                    raw.extend_from_slice(&((f64::from(s) * 2_147_483_648.0) as i32).to_le_bytes())
                }
                other => {
                    panic!("cpal chose sample format {other} for the test device; encode it here")
                }
            }
        }
    }
    raw
}

/// The fixture decoded by the crate's own file path: what capture must yield.
fn expected(rate: u32) -> Vec<f32> {
    let mut src = WavSource::open(&fixture(fixture_at(rate))).unwrap();
    let mut out = Vec::new();
    while let Some(chunk) = src.next_chunk().unwrap() {
        out.extend(chunk);
    }
    out
}

/// True `(start, end)` of the fixture's one turn at 16 kHz.
fn truth(rate: u32) -> (u64, u64) {
    let sidecar = fixture(fixture_at(rate)).with_extension("json");
    let json: Value = serde_json::from_str(&fs::read_to_string(sidecar).unwrap()).unwrap();
    let to16k =
        |v: &Value| (v.as_u64().unwrap() as f64 * 16_000.0 / f64::from(rate)).round() as u64;
    let turn = &json["turns"][0];
    (to16k(&turn["start_sample"]), to16k(&turn["end_sample"]))
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|s| f64::from(*s).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
}

#[test]
fn captures_a_file_backed_alsa_device() {
    let home = tempfile::tempdir().unwrap();
    let raw = home.path().join("voxtest.raw");
    // ALSA opens the file whenever it opens the device: it must exist first.
    fs::write(&raw, b"").unwrap();
    fs::write(home.path().join(".asoundrc"), asoundrc(&raw)).unwrap();
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
    let config = voxtest.default_config.clone().expect("a default config");

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

    // (b) Capture the fixture, written in the device's own format.
    fs::write(&raw, raw_pcm(&config)).unwrap();
    let want = expected(config.min_sample_rate);
    // The fixture plus one second of the silence after it.
    let span = want.len() + 16_000;
    assert!(span < RING_SECONDS as usize * 16_000);

    let (tx, rx) = edge::<AudioFrame>("audio", 1 << 16, FullPolicy::DropOldest);
    let capture =
        Capture::start(Some("voxtest"), tx, Clock::start()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(capture.format().device_id, "voxtest");
    assert_eq!(capture.format().sample_rate, config.min_sample_rate);
    assert_eq!(capture.format().channels, config.channels);
    // a 10 ms period was asked for, and the device says what it granted
    let format = capture.format().clone();
    assert_eq!(
        format.buffer_requested_frames,
        Some(config.min_sample_rate / 100),
        "{format:?}"
    );
    assert!(format.buffer_frames.is_some_and(|f| f > 0), "{format:?}");

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut frames: Vec<AudioFrame> = Vec::new();
    while frames.last().map_or(0, AudioFrame::end_sample) < span as u64 {
        assert!(Instant::now() < deadline, "the capture stalled");
        if let Ok(env) = rx.recv_timeout(Duration::from_millis(100)) {
            assert!(
                env.item.captured <= Instant::now(),
                "captured in the future"
            );
            frames.push(env.item);
        }
    }
    let stats = capture.stop();
    frames.extend(rx.try_iter().map(|e| e.item));

    assert_eq!(stats.end, CaptureEnd::Stopped, "{stats:?}");
    // an unpaced device delivers more than wall time, never less: no clock gap
    assert_eq!(stats.timing.clock_gaps, 0, "{:?}", stats.timing);
    assert_eq!(
        stats.timing.blocks_device_timed + stats.timing.blocks_arrival_timed,
        stats
            .frames_captured
            .div_ceil(u64::from(format.buffer_frames.unwrap())),
        "{:?}",
        stats.timing
    );
    assert_eq!(rx.stats().dropped(), 0);
    assert!(stats.frames_captured > 0);
    let sent: u64 = frames.iter().map(|f| f.samples.len() as u64).sum();
    assert_eq!(stats.samples_sent, sent);
    assert_eq!(stats.frames_sent, frames.len() as u64);

    // Positions: contiguous except where the ring dropped audio, where they
    // skip ahead by the dropped duration; never inside the compared span.
    let mut next = 0;
    let mut skipped = 0;
    let mut gaps = 0;
    for f in &frames {
        assert!(f.start_sample >= next, "positions went backwards");
        if f.start_sample > next {
            assert!(
                next >= span as u64,
                "audio dropped at {next}, inside the fixture"
            );
            skipped += f.start_sample - next;
            gaps += 1;
        }
        next = f.end_sample();
    }
    // Every dropped frame shows: as a skip, or after the last frame.
    assert!(stats.end_sample >= next);
    skipped += stats.end_sample - next;
    let dropped_16k =
        stats.frames_dropped_in_ring as f64 * 16_000.0 / f64::from(config.min_sample_rate);
    assert!(
        (skipped as f64 - dropped_16k).abs() <= f64::from(gaps) + 1.0,
        "skipped {skipped} samples for {} dropped frames",
        stats.frames_dropped_in_ring
    );

    // The same samples as decoding the file, then silence.
    let audio: Vec<f32> = frames
        .iter()
        .flat_map(|f| f.samples.iter().copied())
        .take(span)
        .collect();
    assert_eq!(audio.len(), span);
    let n = want.len();
    let worst = want
        .iter()
        .zip(&audio)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "largest difference {worst}");
    assert!((rms(&audio[..n]) / rms(&want) - 1.0).abs() < 0.01);
    assert!(rms(&audio[n..]) < 1e-4, "not silent after the fixture");

    // (c) One utterance, where the sidecar says.
    let (true_start, true_end) = truth(config.min_sample_rate);
    let mut ep = Endpointer::new(VadConfig::default()).unwrap();
    let mut segments = ep.push(&audio);
    segments.extend(ep.finish());
    let bounds: Vec<(u64, u64)> = segments
        .iter()
        .map(|s| (s.start_sample, s.end_sample))
        .collect();
    assert_eq!(segments.len(), 1, "{bounds:?}");
    let onset = segments[0].start_sample + PRE_ROLL;
    assert!(
        onset.abs_diff(true_start) <= TOLERANCE,
        "onset {onset} vs {true_start}"
    );
    let end = segments[0].end_sample;
    assert!(
        end.abs_diff(true_end) <= TOLERANCE,
        "end {end} vs {true_end}"
    );
}
