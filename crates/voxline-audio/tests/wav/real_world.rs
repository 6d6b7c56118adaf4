//! The audio files people actually have: WAVs written to pipes, FIFOs and
//! non-seekable readers, headers that lie, WAVE_FORMAT_EXTENSIBLE 24-in-32,
//! compressed recordings, too-low sample rates, near-silent recordings.

use std::io::{Cursor, Read};
use std::process::{Command, Stdio};

use voxline_audio::wav::{HeaderWarning, NEAR_SILENT_PEAK_DBFS};
use voxline_audio::{AudioError, WavSource};

use super::{decode, open_bytes, raw_wav, write_burst, Fmt, AMP};

/// A reader that cannot seek (what a pipe gives).
struct Pipe<R>(R);

impl<R: Read> Read for Pipe<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // Hand out small pieces, as a pipe does.
        let n = buf.len().min(1000);
        self.0.read(&mut buf[..n])
    }
}

fn piped(bytes: Vec<u8>) -> Result<WavSource, AudioError> {
    WavSource::from_reader("piped.wav", Pipe(Cursor::new(bytes)))
}

/// Every chunk, then the error that ended the stream, if any.
fn drain(src: &mut WavSource) -> (Vec<f32>, Option<AudioError>) {
    let mut out = Vec::new();
    loop {
        match src.next_chunk() {
            Ok(Some(chunk)) => out.extend(chunk),
            Ok(None) => return (out, None),
            Err(e) => {
                assert!(src.next_chunk().unwrap().is_none(), "stream restarted");
                return (out, Some(e));
            }
        }
    }
}

/// `frames` of 16-bit mono: a 440 Hz sine at `amp` (16 kHz).
fn sine16(frames: u32, amp: f32) -> Vec<u8> {
    (0..frames)
        .flat_map(|i| {
            let x = amp * (2.0 * std::f32::consts::PI * 440.0 * i as f32 / 16_000.0).sin();
            ((x * 32_767.0).round() as i16).to_le_bytes()
        })
        .collect()
}

/// A RIFF/WAVE file from its parts: `chunks` go between `fmt ` and `data`,
/// each padded to even length unless `pad` is false.
fn riff(
    fmt: &[u8],
    chunks: &[(&[u8; 4], &[u8])],
    pad: bool,
    data: &[u8],
    data_size: u32,
) -> Vec<u8> {
    let mut body = b"WAVEfmt ".to_vec();
    body.extend_from_slice(&(fmt.len() as u32).to_le_bytes());
    body.extend_from_slice(fmt);
    for (id, bytes) in chunks {
        body.extend_from_slice(*id);
        body.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        body.extend_from_slice(bytes);
        if pad && bytes.len() % 2 == 1 {
            body.push(0);
        }
    }
    body.extend_from_slice(b"data");
    body.extend_from_slice(&data_size.to_le_bytes());
    body.extend_from_slice(data);
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// A 16-byte PCM `fmt ` body.
fn pcm_fmt(channels: u16, rate: u32, bits: u16, byte_rate: Option<u32>) -> Vec<u8> {
    let align = channels * bits / 8;
    let mut f = Vec::new();
    f.extend_from_slice(&1u16.to_le_bytes());
    f.extend_from_slice(&channels.to_le_bytes());
    f.extend_from_slice(&rate.to_le_bytes());
    f.extend_from_slice(&byte_rate.unwrap_or(rate * u32::from(align)).to_le_bytes());
    f.extend_from_slice(&align.to_le_bytes());
    f.extend_from_slice(&bits.to_le_bytes());
    f
}

fn require(tool: &str) {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        ok,
        "`{tool}` is needed for this test: install it (bash .ci/setup.sh)"
    );
}

// ---------------------------------------------------------------- unknown length, pipes, FIFOs

#[test]
fn wavs_written_to_a_pipe_are_read_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let data = sine16(8_000, 0.5);
    let fmt = pcm_fmt(1, 16_000, 16, None);
    // ffmpeg, an unfinished writer, sox (0x7FFFF000 in whole frames), arecord.
    for size in [0xFFFF_FFFFu32, 0, 0x7FFF_F000, 0x8000_0000] {
        let list: &[(&[u8; 4], &[u8])] =
            &[(b"LIST", b"INFOISFT\x0e\x00\x00\x00Lavf61.7.100\x00\x00")];
        let bytes = riff(&fmt, list, true, &data, size);
        let label = format!("data size 0x{size:08X}");
        let mut file =
            open_bytes(dir.path(), "pipe.wav", &bytes).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(file.spec().duration_frames, Some(8_000), "{label}");
        let (out, err) = drain(&mut file);
        assert!(err.is_none(), "{label}: {err:?}");
        assert_eq!(out.len(), 8_000, "{label}");
        assert!(file.warnings().is_empty(), "{label}: {:?}", file.warnings());

        let mut stream = piped(bytes).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(stream.spec().duration_frames, None, "{label}");
        let (streamed, err) = drain(&mut stream);
        assert!(err.is_none(), "{label}: {err:?}");
        assert_eq!(streamed, out, "{label}: a pipe decodes like the file");
    }
}

#[test]
fn sox_writing_to_standard_output_is_read_through_the_pipe() {
    require("sox");
    // 16-bit PCM, 24-bit and sox's default 32-bit (both WAVE_FORMAT_EXTENSIBLE), and float.
    for args in [
        &["-b", "16"][..],
        &["-b", "24"],
        &[],
        &["-e", "floating-point", "-b", "32"],
    ] {
        let mut child = Command::new("sox")
            .args(["-V1", "-n", "-r", "16000", "-c", "1"])
            .args(args)
            .args([
                "-t", "wav", "-", "synth", "0.5", "sine", "440", "vol", "0.5",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut src =
            WavSource::from_reader("sox-pipe", stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let (out, err) = drain(&mut src);
        assert!(child.wait().unwrap().success());
        assert!(err.is_none(), "{args:?}: {err:?}");
        assert_eq!(out.len(), 8_000, "{args:?}");
        let peak = src.level().peak_dbfs;
        assert!(
            (peak - 20.0 * 0.5f64.log10()).abs() < 0.1,
            "{args:?}: peak {peak} dBFS"
        );
    }
}

#[test]
fn a_fifo_is_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("mic.wav");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let bytes = riff(
        &pcm_fmt(1, 16_000, 16, None),
        &[],
        true,
        &sine16(4_000, 0.5),
        0xFFFF_FFFF,
    );
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(fifo, bytes).unwrap())
    };
    let mut src = WavSource::open(&fifo).unwrap();
    assert_eq!(src.spec().duration_frames, None);
    let (out, err) = drain(&mut src);
    writer.join().unwrap();
    assert!(err.is_none(), "{err:?}");
    assert_eq!(out.len(), 4_000);
}

#[test]
fn a_truncated_stream_delivers_what_came_then_reports_it() {
    // One second declared, a quarter of it sent.
    let bytes = raw_wav(1, 1, 16_000, 16, &sine16(4_000, 0.5), 32_000);
    let mut src = piped(bytes).unwrap();
    assert_eq!(src.spec().duration_frames, Some(16_000));
    let (out, err) = drain(&mut src);
    assert_eq!(out.len(), 4_000);
    match err {
        Some(AudioError::Truncated {
            expected_frames: 16_000,
            frames_read: 4_000,
            ..
        }) => {}
        other => panic!("expected Truncated, got {other:?}"),
    }
}

// ---------------------------------------------------------------- bad rates

#[test]
fn sample_rates_too_low_for_speech_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for rate in [1u32, 50, 3_999] {
        let bytes = raw_wav(1, 1, rate, 16, &[0; 64], 64);
        match open_bytes(dir.path(), "low.wav", &bytes) {
            Err(e @ AudioError::UnsupportedSampleRate { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!("{rate} Hz")) && msg.contains("4000"),
                    "{msg}"
                );
                assert_eq!(msg.lines().count(), 1);
            }
            other => panic!("{rate} Hz: {other:?}"),
        }
    }
    assert!(open_bytes(
        dir.path(),
        "ok.wav",
        &raw_wav(1, 1, 4_000, 16, &[0; 64], 64)
    )
    .is_ok());
}

// ---------------------------------------------------------------- headers that lie

#[test]
fn valid_files_with_odd_chunks_and_lying_headers_are_read_with_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let data = sine16(1_600, 0.5);
    let fmt = pcm_fmt(1, 16_000, 16, None);
    // LIST/INFO with an odd-length artist name: IART, 5 bytes, then the pad byte.
    let info: &[u8] = b"INFOIART\x05\x00\x00\x00Bj\xc3\xb6r";
    let list: &[(&[u8; 4], &[u8])] = &[(b"LIST", info)];
    assert_eq!(info.len() % 2, 1);

    type Check = fn(&[HeaderWarning]) -> bool;
    let cases: Vec<(&str, Vec<u8>, usize, Check)> = vec![
        (
            "odd LIST chunk with its pad byte",
            riff(&fmt, list, true, &data, 3_200),
            1_600,
            |w| w.is_empty(),
        ),
        (
            "odd LIST chunk without its pad byte",
            riff(&fmt, list, false, &data, 3_200),
            1_600,
            |w| matches!(w, [HeaderWarning::MissingPadByte { chunk }] if chunk == "LIST"),
        ),
        (
            "data size one byte beyond the file",
            riff(&fmt, &[], true, &data, 3_201),
            1_600,
            |w| {
                w.contains(&HeaderWarning::DataPastEnd {
                    declared: 3_201,
                    present: 3_200,
                })
            },
        ),
        (
            "odd data length",
            {
                let mut d = data.clone();
                d.extend_from_slice(&[0x11, 0]); // one stray byte, then the pad byte
                riff(&fmt, &[], true, &d, 3_201)
            },
            1_600,
            |w| w == [HeaderWarning::PartialFrame { stray_bytes: 1 }],
        ),
        (
            "wrong byte rate",
            riff(
                &pcm_fmt(1, 16_000, 16, Some(12_345)),
                &[],
                true,
                &data,
                3_200,
            ),
            1_600,
            |w| {
                w == [HeaderWarning::ByteRate {
                    declared: 12_345,
                    expected: 32_000,
                }]
            },
        ),
    ];
    for (name, bytes, frames, check) in cases {
        let mut src =
            open_bytes(dir.path(), "lie.wav", &bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (out, err) = drain(&mut src);
        assert!(err.is_none(), "{name}: {err:?}");
        assert_eq!(out.len(), frames, "{name}");
        assert!(
            check(src.warnings()),
            "{name}: warnings {:?}",
            src.warnings()
        );
        for w in src.warnings() {
            assert_eq!(w.to_string().lines().count(), 1);
        }
        // The same bytes through a pipe give the same audio.
        let mut stream = piped(bytes).unwrap_or_else(|e| panic!("{name} (pipe): {e}"));
        let (streamed, err) = drain(&mut stream);
        assert!(err.is_none(), "{name} (pipe): {err:?}");
        assert_eq!(streamed, out, "{name} (pipe)");
    }

    // A pipe cannot know the data is a byte short until it ends: at first the
    // header only says the length is odd; the shortfall is added at the end.
    let mut stream = piped(riff(&fmt, &[], true, &data, 3_201)).unwrap();
    assert_eq!(
        stream.warnings(),
        [HeaderWarning::PartialFrame { stray_bytes: 1 }]
    );
    let (_, err) = drain(&mut stream);
    assert!(err.is_none());
    assert_eq!(
        stream.warnings()[1..],
        [HeaderWarning::DataPastEnd {
            declared: 3_201,
            present: 3_200
        }]
    );
}

// ---------------------------------------------------------------- WAVE_FORMAT_EXTENSIBLE

#[test]
fn extensible_24_valid_bits_in_32_bit_containers_decode_at_full_amplitude() {
    let dir = tempfile::tempdir().unwrap();
    const PCM_GUID_TAIL: [u8; 14] = [
        0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71,
    ];
    let mut fmt = Vec::new();
    fmt.extend_from_slice(&0xFFFEu16.to_le_bytes());
    fmt.extend_from_slice(&1u16.to_le_bytes()); // channels
    fmt.extend_from_slice(&16_000u32.to_le_bytes());
    fmt.extend_from_slice(&64_000u32.to_le_bytes());
    fmt.extend_from_slice(&4u16.to_le_bytes()); // block align
    fmt.extend_from_slice(&32u16.to_le_bytes()); // container bits
    fmt.extend_from_slice(&22u16.to_le_bytes()); // extension size
    fmt.extend_from_slice(&24u16.to_le_bytes()); // valid bits
    fmt.extend_from_slice(&4u32.to_le_bytes()); // channel mask: front centre
    fmt.extend_from_slice(&1u16.to_le_bytes()); // sub-format: PCM
    fmt.extend_from_slice(&PCM_GUID_TAIL);
    assert_eq!(fmt.len(), 40);

    let amp = 0.5f64;
    let values: Vec<i32> = (0..1_600)
        .map(|i| {
            (amp * (2.0 * std::f64::consts::PI * 440.0 * f64::from(i) / 16_000.0).sin()
                * 8_388_607.0)
                .round() as i32
        })
        .collect();
    // Left-justified: the 24 bits are the top three bytes of each 32-bit container.
    let data: Vec<u8> = values.iter().flat_map(|v| (v << 8).to_le_bytes()).collect();
    let path = dir.path().join("ext24in32.wav");
    std::fs::write(&path, riff(&fmt, &[], true, &data, data.len() as u32)).unwrap();
    let out = decode(&path);
    let peak = out.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(
        (f64::from(peak) - amp).abs() < 1e-3,
        "peak {peak}, want {amp}"
    );

    // The same sine as plain 24-bit PCM decodes to the same samples.
    let plain = dir.path().join("plain24.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 24,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&plain, spec).unwrap();
    for &v in &values {
        w.write_sample(v).unwrap();
    }
    w.finalize().unwrap();
    assert_eq!(decode(&plain), out);
}

// ---------------------------------------------------------------- compressed and other formats

#[test]
fn flac_and_ogg_vorbis_decode_by_content() {
    require("sox");
    let dir = tempfile::tempdir().unwrap();
    let wav = write_burst(dir.path(), Fmt::I16, 44_100, 2);
    let reference = decode(&wav);
    for (ext, tolerance) in [("flac", 0.01f32), ("ogg", 0.1)] {
        let encoded = dir.path().join(format!("burst.{ext}"));
        let ok = Command::new("sox")
            .arg("-V1")
            .arg(&wav)
            .arg(&encoded)
            .status()
            .unwrap();
        assert!(ok.success(), "sox could not write {ext}");
        // Named without a telling extension: detected by content.
        let disguised = dir.path().join(format!("recording-{ext}.dat"));
        std::fs::rename(&encoded, &disguised).unwrap();

        let mut src = WavSource::open(&disguised).unwrap_or_else(|e| panic!("{ext}: {e}"));
        assert_eq!(
            (src.spec().sample_rate, src.spec().channels),
            (44_100, 2),
            "{ext}"
        );
        let (out, err) = drain(&mut src);
        assert!(err.is_none(), "{ext}: {err:?}");
        assert!(
            out.len().abs_diff(reference.len()) <= 2,
            "{ext}: {} samples",
            out.len()
        );
        let level = 0.75 * AMP;
        let peak = out[8_800..12_000]
            .iter()
            .fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(
            (peak - level).abs() < tolerance * level + 0.01,
            "{ext}: peak {peak}"
        );
        let onset = out.iter().position(|x| x.abs() > level / 2.0).unwrap();
        assert!(onset.abs_diff(8_000) <= 16, "{ext}: onset at {onset}");
        assert!(src.level().peak_dbfs > -7.0, "{ext}: {:?}", src.level());

        // The same bytes through a pipe.
        let bytes = std::fs::read(&disguised).unwrap();
        let mut stream = piped(bytes).unwrap_or_else(|e| panic!("{ext} (pipe): {e}"));
        let (streamed, err) = drain(&mut stream);
        assert!(err.is_none(), "{ext} (pipe): {err:?}");
        assert_eq!(streamed.len(), out.len(), "{ext} (pipe)");
    }
}

#[test]
fn other_audio_formats_name_the_format_and_the_conversion() {
    require("sox");
    let dir = tempfile::tempdir().unwrap();
    let wav = write_burst(dir.path(), Fmt::I16, 16_000, 1);
    let aiff = dir.path().join("memo.aiff");
    assert!(Command::new("sox")
        .arg(&wav)
        .arg(&aiff)
        .status()
        .unwrap()
        .success());
    let err = WavSource::open(&aiff).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, AudioError::UnsupportedFormat { .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("AIFF") && msg.contains("ffmpeg -i") && msg.contains("memo.aiff"),
        "{msg}"
    );

    // A damaged FLAC (the magic, then garbage) is one clear error, not a panic.
    let mut bad = b"fLaC".to_vec();
    bad.extend((0..2_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8));
    let err = open_bytes(dir.path(), "bad.flac", &bad).unwrap_err();
    assert!(
        matches!(err, AudioError::UnsupportedFormat { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("FLAC"), "{err}");

    let text = open_bytes(dir.path(), "notes.wav", b"meeting notes, not audio\n").unwrap_err();
    assert!(matches!(text, AudioError::NotWav { .. }));
    assert!(text.to_string().contains("ffmpeg -i"), "{text}");
}

// ---------------------------------------------------------------- level

#[test]
fn level_reports_a_near_silent_recording() {
    let dir = tempfile::tempdir().unwrap();
    // Speech-band tone at -60 dBFS peak: decodes fine, but gives the VAD nothing.
    let quiet = raw_wav(1, 1, 16_000, 16, &sine16(16_000, 0.001), 32_000);
    let mut src = open_bytes(dir.path(), "quiet.wav", &quiet).unwrap();
    assert_eq!(src.level().samples, 0);
    let (_, err) = drain(&mut src);
    assert!(err.is_none());
    let level = src.level();
    assert!((level.peak_dbfs + 60.0).abs() < 0.5, "{level:?}");
    assert!((level.rms_dbfs + 63.0).abs() < 0.5, "{level:?}");
    assert_eq!(level.samples, 16_000);
    assert!(level.is_near_silent());
    assert!(level.peak_dbfs < NEAR_SILENT_PEAK_DBFS);

    let loud = write_burst(dir.path(), Fmt::I16, 48_000, 2);
    let mut src = WavSource::open(&loud).unwrap();
    drain(&mut src);
    let level = src.level();
    assert!(
        (level.peak_dbfs - 20.0 * f64::from(AMP).log10()).abs() < 0.1,
        "{level:?}"
    );
    assert!(!level.is_near_silent());
}
