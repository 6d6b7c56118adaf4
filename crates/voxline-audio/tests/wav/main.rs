//! WAV replay: every supported format decodes to 16 kHz mono with the right
//! length, level and timing; every unusable file is a typed error.

use std::fs;
use std::path::{Path, PathBuf};

use voxline_audio::{AudioError, SampleEncoding, WavSource};

mod compressed_cuts;
mod real_world;

const BURST_START: f64 = 0.5;
const BURST_END: f64 = 0.8;
const TOTAL: f64 = 1.0;
const FREQ: f64 = 440.0;
const AMP: f32 = 0.5;

/// Silence, then a 440 Hz cosine burst from 0.5 s to 0.8 s (starting and ending
/// on a peak, so the edges are sharp), then silence to 1.0 s.
fn burst(rate: u32, i: u64) -> f32 {
    let t = i as f64 / f64::from(rate);
    if (BURST_START..BURST_END).contains(&t) {
        AMP * (2.0 * std::f64::consts::PI * FREQ * (t - BURST_START)).cos() as f32
    } else {
        0.0
    }
}

#[derive(Clone, Copy, Debug)]
enum Fmt {
    I8,
    I16,
    I24,
    I32,
    F32,
}

/// Writes the burst (left channel at full level, right at half) in the given format.
fn write_burst(dir: &Path, fmt: Fmt, rate: u32, channels: u16) -> PathBuf {
    let (bits, sample_format) = match fmt {
        Fmt::I8 => (8, hound::SampleFormat::Int),
        Fmt::I16 => (16, hound::SampleFormat::Int),
        Fmt::I24 => (24, hound::SampleFormat::Int),
        Fmt::I32 => (32, hound::SampleFormat::Int),
        Fmt::F32 => (32, hound::SampleFormat::Float),
    };
    let spec = hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: bits,
        sample_format,
    };
    let path = dir.join(format!("{fmt:?}_{rate}_{channels}.wav"));
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    let frames = (f64::from(rate) * TOTAL) as u64;
    for i in 0..frames {
        let x = burst(rate, i);
        for ch in 0..channels {
            let v = if ch == 0 { x } else { 0.5 * x };
            match fmt {
                Fmt::I8 => w.write_sample((v * 128.0).round() as i8).unwrap(),
                Fmt::I16 => w.write_sample((v * 32768.0).round() as i16).unwrap(),
                Fmt::I24 => w.write_sample((v * 8_388_608.0).round() as i32).unwrap(),
                Fmt::I32 => w
                    .write_sample((f64::from(v) * 2_147_483_648.0).round() as i32)
                    .unwrap(),
                Fmt::F32 => w.write_sample(v).unwrap(),
            }
        }
    }
    w.finalize().unwrap();
    path
}

fn decode(path: &Path) -> Vec<f32> {
    let mut src = WavSource::open(path).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    while let Some(chunk) = src.next_chunk().unwrap_or_else(|e| panic!("{e}")) {
        assert!(!chunk.is_empty());
        out.extend(chunk);
    }
    out
}

#[test]
fn every_format_decodes_with_right_length_level_and_timing() {
    let dir = tempfile::tempdir().unwrap();
    for fmt in [Fmt::I8, Fmt::I16, Fmt::I24, Fmt::I32, Fmt::F32] {
        for rate in [8_000u32, 16_000, 44_100, 48_000] {
            for channels in [1u16, 2] {
                let label = format!("{fmt:?} {rate} Hz {channels} ch");
                let path = write_burst(dir.path(), fmt, rate, channels);
                let src = WavSource::open(&path).unwrap();
                let spec = *src.spec();
                assert_eq!(spec.sample_rate, rate, "{label}");
                assert_eq!(spec.channels, channels, "{label}");
                assert_eq!(spec.duration_frames, Some(u64::from(rate)), "{label}");
                assert_eq!(
                    spec.format,
                    if matches!(fmt, Fmt::F32) {
                        SampleEncoding::Float
                    } else {
                        SampleEncoding::Int
                    },
                    "{label}"
                );
                drop(src);

                let out = decode(&path);
                assert_eq!(out.len(), 16_000, "{label}: length");

                // Mono: the burst itself; stereo: the average of full and half level.
                let level = if channels == 1 { AMP } else { 0.75 * AMP };
                let peak = out[8_800..12_000]
                    .iter()
                    .fold(0.0f32, |m, x| m.max(x.abs()));
                assert!(
                    (peak - level).abs() < 0.03 * level,
                    "{label}: peak {peak}, want {level}"
                );

                let quiet = out[..7_600]
                    .iter()
                    .chain(&out[13_200..])
                    .fold(0.0f32, |m, x| m.max(x.abs()));
                assert!(quiet < 0.02, "{label}: {quiet} outside the burst");

                // The burst starts at 0.5 s = sample 8000 and ends at 0.8 s = 12800. Alignment must be
                // within ±1 ms (16 samples); with the delay trimmed it is within 4 samples (0.25 ms).
                let half = level / 2.0;
                let onset = out.iter().position(|x| x.abs() > half).unwrap();
                let offset = out.iter().rposition(|x| x.abs() > half).unwrap();
                assert!(onset.abs_diff(8_000) <= 4, "{label}: onset at {onset}");
                assert!(offset.abs_diff(12_800) <= 4, "{label}: offset at {offset}");
            }
        }
    }
}

#[test]
fn passthrough_is_exact_and_chunks_are_20_ms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ramp.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    let values: Vec<i16> = (0..1_000i32)
        .map(|i| (i * 61 % 65_536 - 32_768) as i16)
        .collect();
    for &v in &values {
        w.write_sample(v).unwrap();
    }
    w.finalize().unwrap();

    let mut src = WavSource::open(&path).unwrap();
    let mut sizes = Vec::new();
    let mut out = Vec::new();
    while let Some(chunk) = src.next_chunk().unwrap() {
        sizes.push(chunk.len());
        out.extend(chunk);
    }
    assert_eq!(sizes, vec![320, 320, 320, 40]);
    let expected: Vec<f32> = values.iter().map(|&v| f32::from(v) / 32_768.0).collect();
    assert_eq!(out, expected);
    assert_eq!(src.frames_read(), 1_000);
    // After the end it stays at the end.
    assert!(src.next_chunk().unwrap().is_none());
}

#[test]
fn full_scale_integers_normalise_into_unit_range() {
    let dir = tempfile::tempdir().unwrap();
    for bits in [8u16, 16, 24, 32] {
        let path = dir.path().join(format!("fs{bits}.wav"));
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 16_000,
            bits_per_sample: bits,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(&path, spec).unwrap();
        let max = (1i64 << (bits - 1)) - 1;
        let min = -(1i64 << (bits - 1));
        for v in [min, max, 0] {
            match bits {
                8 => w.write_sample(v as i8).unwrap(),
                16 => w.write_sample(v as i16).unwrap(),
                _ => w.write_sample(v as i32).unwrap(),
            }
        }
        w.finalize().unwrap();
        let out = decode(&path);
        assert_eq!(out[0], -1.0, "{bits}-bit minimum");
        assert!(
            out[1] <= 1.0 && out[1] > 0.99,
            "{bits}-bit maximum gave {}",
            out[1]
        );
        assert_eq!(out[2], 0.0);
    }
}

#[test]
fn odd_sample_rates_stream_with_the_right_length() {
    let dir = tempfile::tempdir().unwrap();
    for rate in [4_000u32, 11_025, 22_050, 96_000, 192_000, 384_000] {
        let path = dir.path().join(format!("r{rate}.wav"));
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: rate,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(&path, spec).unwrap();
        let frames = u64::from(rate) / 4 + 3;
        for i in 0..frames {
            w.write_sample(((i % 100) as i16) * 10).unwrap();
        }
        w.finalize().unwrap();
        let out = decode(&path);
        let expected = (frames as f64 * 16_000.0 / f64::from(rate)).round() as usize;
        assert!(
            out.len().abs_diff(expected) <= 2,
            "{rate} Hz: {} samples, want {expected}",
            out.len()
        );
    }
}

// ---------------------------------------------------------------- fixtures

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../audio-fixtures")
        .join(name)
}

/// Normalised cross-correlation of `a` against `b` shifted by `lag`.
fn correlation(a: &[f32], b: &[f32], lag: isize) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (i, &x) in a.iter().enumerate() {
        let j = i as isize + lag;
        if j < 0 || j as usize >= b.len() {
            continue;
        }
        let y = b[j as usize];
        ab += f64::from(x) * f64::from(y);
        aa += f64::from(x) * f64::from(x);
        bb += f64::from(y) * f64::from(y);
    }
    ab / (aa * bb).sqrt()
}

#[test]
fn fixture_variants_decode_aligned_with_the_16k_reference() {
    let reference = decode(&fixture("q_capital.wav"));
    assert_eq!(reference.len(), 48_377);
    for (name, min_corr) in [
        ("q_capital_24bit.wav", 0.999),
        ("q_capital_44k_stereo.wav", 0.98),
        ("q_capital_48k_f32.wav", 0.98),
        ("q_capital_8k.wav", 0.9),
    ] {
        let out = decode(&fixture(name));
        assert!(
            out.len().abs_diff(reference.len()) <= 1,
            "{name}: {} samples",
            out.len()
        );
        let best = (-16isize..=16)
            .max_by(|&x, &y| {
                correlation(&reference, &out, x).total_cmp(&correlation(&reference, &out, y))
            })
            .unwrap();
        let corr = correlation(&reference, &out, 0);
        assert!(
            best.abs() <= 1,
            "{name}: best alignment at lag {best} samples"
        );
        assert!(corr > min_corr, "{name}: correlation {corr}");
    }
}

// ---------------------------------------------------------------- errors

/// A canonical 44-byte header followed by `data`, with every field settable.
fn raw_wav(
    tag: u16,
    channels: u16,
    rate: u32,
    bits: u16,
    data: &[u8],
    declared_len: u32,
) -> Vec<u8> {
    let block_align = channels.wrapping_mul(bits / 8);
    let mut v = Vec::new();
    v.extend_from_slice(b"RIFF");
    v.extend_from_slice(&(36 + declared_len).to_le_bytes());
    v.extend_from_slice(b"WAVEfmt ");
    v.extend_from_slice(&16u32.to_le_bytes());
    v.extend_from_slice(&tag.to_le_bytes());
    v.extend_from_slice(&channels.to_le_bytes());
    v.extend_from_slice(&rate.to_le_bytes());
    v.extend_from_slice(&rate.wrapping_mul(u32::from(block_align)).to_le_bytes());
    v.extend_from_slice(&block_align.to_le_bytes());
    v.extend_from_slice(&bits.to_le_bytes());
    v.extend_from_slice(b"data");
    v.extend_from_slice(&declared_len.to_le_bytes());
    v.extend_from_slice(data);
    v
}

fn open_bytes(dir: &Path, name: &str, bytes: &[u8]) -> Result<WavSource, AudioError> {
    let path = dir.join(name);
    fs::write(&path, bytes).unwrap();
    WavSource::open(&path)
}

#[test]
fn unusable_files_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pcm = raw_wav(1, 1, 16_000, 16, &[0; 64], 64);

    assert!(matches!(
        open_bytes(d, "empty.wav", &[]),
        Err(AudioError::NotWav { .. })
    ));
    assert!(matches!(
        open_bytes(d, "short.wav", b"RIFF"),
        Err(AudioError::NotWav { .. })
    ));

    let random: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    assert!(matches!(
        open_bytes(d, "random.wav", &random),
        Err(AudioError::NotWav { .. })
    ));

    let mut wrong_magic = pcm.clone();
    wrong_magic[0..4].copy_from_slice(b"RIFZ");
    let err = open_bytes(d, "magic.wav", &wrong_magic).unwrap_err();
    assert!(matches!(err, AudioError::NotWav { .. }));
    assert!(
        err.to_string().contains("magic.wav"),
        "error names the file: {err}"
    );

    let mut not_wave = pcm.clone();
    not_wave[8..12].copy_from_slice(b"AVI ");
    assert!(matches!(
        open_bytes(d, "avi.wav", &not_wave),
        Err(AudioError::NotWav { .. })
    ));

    // RIFF/WAVE and a fmt chunk, but no data chunk.
    let header_only = &pcm[..36];
    assert!(matches!(
        open_bytes(d, "header.wav", header_only),
        Err(AudioError::MalformedHeader { .. })
    ));
    // RIFF/WAVE only.
    assert!(matches!(
        open_bytes(d, "riff.wav", &pcm[..12]),
        Err(AudioError::MalformedHeader { .. })
    ));

    // A-law (tag 6), 64-bit float, 12-bit PCM, ADPCM.
    let alaw = raw_wav(6, 1, 8_000, 8, &[0; 16], 16);
    match open_bytes(d, "alaw.wav", &alaw) {
        Err(AudioError::UnsupportedEncoding { encoding, .. }) => {
            assert!(encoding.contains("A-law"), "{encoding}")
        }
        other => panic!("A-law: {other:?}"),
    }
    let f64_wav = raw_wav(3, 1, 16_000, 64, &[0; 64], 64);
    match open_bytes(d, "f64.wav", &f64_wav) {
        Err(AudioError::UnsupportedEncoding { encoding, .. }) => {
            assert!(encoding.contains("64-bit"), "{encoding}")
        }
        other => panic!("f64: {other:?}"),
    }
    let odd_bits = raw_wav(1, 1, 16_000, 12, &[0; 64], 64);
    assert!(matches!(
        open_bytes(d, "12bit.wav", &odd_bits),
        Err(AudioError::UnsupportedEncoding { .. })
    ));
    let adpcm = raw_wav(2, 1, 16_000, 4, &[0; 64], 64);
    assert!(matches!(
        open_bytes(d, "adpcm.wav", &adpcm),
        Err(AudioError::UnsupportedEncoding { .. })
    ));

    // Channel counts and sample rates out of range.
    let zero_ch = raw_wav(1, 0, 16_000, 16, &[0; 64], 64);
    assert!(matches!(
        open_bytes(d, "0ch.wav", &zero_ch),
        Err(AudioError::UnsupportedChannels { channels: 0, .. })
    ));
    let nine_ch = raw_wav(1, 9, 16_000, 16, &[0; 72], 72);
    assert!(matches!(
        open_bytes(d, "9ch.wav", &nine_ch),
        Err(AudioError::UnsupportedChannels { channels: 9, .. })
    ));
    let zero_hz = raw_wav(1, 1, 0, 16, &[0; 64], 64);
    assert!(matches!(
        open_bytes(d, "0hz.wav", &zero_hz),
        Err(AudioError::UnsupportedSampleRate { rate: 0, .. })
    ));
    let huge_hz = raw_wav(1, 1, 1_000_000, 16, &[0; 64], 64);
    assert!(matches!(
        open_bytes(d, "1mhz.wav", &huge_hz),
        Err(AudioError::UnsupportedSampleRate {
            rate: 1_000_000,
            ..
        })
    ));

    // Inconsistent block alignment.
    let mut bad_align = pcm.clone();
    bad_align[32..34].copy_from_slice(&7u16.to_le_bytes());
    assert!(matches!(
        open_bytes(d, "align.wav", &bad_align),
        Err(AudioError::MalformedHeader { .. })
    ));

    let missing = WavSource::open(&d.join("does-not-exist.wav")).unwrap_err();
    assert!(matches!(missing, AudioError::Open { .. }));
}

#[test]
fn empty_data_chunk_is_an_empty_stream() {
    let dir = tempfile::tempdir().unwrap();
    let mut src = open_bytes(dir.path(), "nodata.wav", &raw_wav(1, 1, 44_100, 16, &[], 0)).unwrap();
    assert_eq!(src.spec().duration_frames, Some(0));
    assert!(src.next_chunk().unwrap().is_none());
}

#[test]
fn truncated_data_delivers_what_is_there_then_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    // One second declared; 0.25 s plus 3 stray bytes (half a stereo frame and a half sample) present.
    for (rate, channels) in [(16_000u32, 2u16), (48_000, 2)] {
        let declared = rate * u32::from(channels) * 2;
        let present_frames = rate / 4;
        let mut data = Vec::new();
        for i in 0..present_frames * u32::from(channels) {
            data.extend_from_slice(&((i % 200) as i16 * 50).to_le_bytes());
        }
        data.extend_from_slice(&[1, 2, 3]);
        let bytes = raw_wav(1, channels, rate, 16, &data, declared);
        let mut src = open_bytes(dir.path(), &format!("trunc{rate}.wav"), &bytes).unwrap();
        assert_eq!(src.spec().duration_frames, Some(u64::from(present_frames)));

        let mut out = Vec::new();
        let err = loop {
            match src.next_chunk() {
                Ok(Some(chunk)) => out.extend(chunk),
                Ok(None) => panic!("truncation was not reported"),
                Err(e) => break e,
            }
        };
        match err {
            AudioError::Truncated {
                expected_frames,
                frames_read,
                ..
            } => {
                assert_eq!(expected_frames, u64::from(rate));
                assert_eq!(frames_read, u64::from(present_frames));
            }
            other => panic!("expected Truncated, got {other:?}"),
        }
        assert_eq!(
            out.len(),
            4_000,
            "all complete frames are delivered at {rate} Hz"
        );
        assert!(src.next_chunk().unwrap().is_none());
    }
}

/// Regressions found by fuzzing `wav_ingest`: float WAVs with samples near
/// `f32::MAX` overflowed the FFT resampler and panicked inside rubato.
#[test]
fn huge_float_samples_do_not_panic_the_resampler() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fuzz/regressions/wav_ingest");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Ok(mut src) = voxline_audio::WavSource::open(&path) else {
            continue;
        };
        // finite, and near full scale (a resampler rings a little past a full-scale step)
        while let Ok(Some(chunk)) = src.next_chunk() {
            assert!(
                chunk.iter().all(|s| s.is_finite() && s.abs() <= 2.0),
                "{}",
                path.display()
            );
        }
        n += 1;
    }
    assert!(n >= 2, "regression inputs missing from {}", dir.display());
}
