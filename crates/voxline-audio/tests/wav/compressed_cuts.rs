//! Compressed recordings joined or cut: played whole, or played to the
//! cut and then reported, never silently short. The files are made by
//! ffmpeg, which is also the reference for how much audio they hold.

use std::path::{Path, PathBuf};
use std::process::Command;

use voxline_audio::{AudioError, WavSource};

/// `ffmpeg ARGS` (quiet), which must succeed.
fn ffmpeg(args: &[&str]) {
    let ok = Command::new("ffmpeg")
        .args(["-v", "error", "-y"])
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("ffmpeg is needed for this test ({e}): bash .ci/setup.sh"));
    assert!(ok.success(), "ffmpeg {args:?}");
}

/// `secs` of a tone at `hz`, `rate`, encoded as `name` (its extension picks the codec).
fn tone(dir: &Path, name: &str, hz: u32, secs: f64, rate: u32, extra: &[&str]) -> PathBuf {
    let p = dir.join(name);
    let src = format!("sine=frequency={hz}:duration={secs}:sample_rate={rate}");
    let mut args = vec!["-f", "lavfi", "-i", &src];
    args.extend_from_slice(extra);
    let out = p.to_str().unwrap().to_owned();
    args.push(&out);
    ffmpeg(&args);
    p
}

/// Seconds of audio ffmpeg decodes from `p`.
fn ffmpeg_seconds(p: &Path) -> f64 {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(p)
        .args(["-f", "s16le", "-ac", "1", "-ar", "16000", "-"])
        .output()
        .unwrap();
    out.stdout.len() as f64 / 2.0 / 16_000.0
}

fn join(dir: &Path, name: &str, parts: &[&Path]) -> PathBuf {
    let mut bytes = Vec::new();
    for p in parts {
        bytes.extend(std::fs::read(p).unwrap());
    }
    let out = dir.join(name);
    std::fs::write(&out, bytes).unwrap();
    out
}

fn cut(dir: &Path, name: &str, whole: &Path, fraction: f64) -> PathBuf {
    let bytes = std::fs::read(whole).unwrap();
    let n = (bytes.len() as f64 * fraction) as usize;
    let out = dir.join(name);
    std::fs::write(&out, &bytes[..n]).unwrap();
    out
}

/// Seconds played, and the error that ended the stream.
fn play(p: &Path) -> (f64, Option<AudioError>) {
    let mut src = match WavSource::open(p) {
        Ok(s) => s,
        Err(e) => return (0.0, Some(e)),
    };
    let mut n = 0usize;
    loop {
        match src.next_chunk() {
            Ok(Some(c)) => n += c.len(),
            Ok(None) => return (n as f64 / 16_000.0, None),
            Err(e) => return (n as f64 / 16_000.0, Some(e)),
        }
    }
}

#[test]
fn concatenated_mp3s_and_chained_oggs_play_whole() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases = [
        (
            "mp3",
            join(
                d,
                "two.mp3",
                &[
                    &tone(d, "a.mp3", 440, 4.0, 16_000, &[]),
                    &tone(d, "b.mp3", 660, 4.0, 16_000, &[]),
                ],
            ),
        ),
        (
            "ogg",
            join(
                d,
                "two.ogg",
                &[
                    &tone(d, "a.ogg", 440, 4.0, 16_000, &[]),
                    &tone(d, "b.ogg", 660, 4.0, 16_000, &[]),
                ],
            ),
        ),
    ];
    for (kind, joined) in cases {
        let (secs, err) = play(&joined);
        assert!(err.is_none(), "{kind}: {err:?}");
        // both recordings (ffmpeg itself may stop after the first of a chain)
        assert!(
            secs > 7.8 && secs < 8.2,
            "{kind}: played {secs:.2} s of 8 (ffmpeg: {:.2})",
            ffmpeg_seconds(&joined)
        );
    }
}

#[test]
fn cut_mp3_ogg_and_m4a_play_to_the_cut_then_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mp3 = tone(d, "a.mp3", 440, 6.0, 16_000, &[]);
    let ogg = tone(d, "a.ogg", 440, 6.0, 16_000, &[]);
    let m4a = tone(
        d,
        "a.m4a",
        440,
        6.0,
        16_000,
        &["-c:a", "aac", "-movflags", "+faststart"],
    );
    for (kind, whole) in [("mp3", mp3), ("ogg", ogg), ("m4a", m4a)] {
        let (secs, err) = play(&whole);
        assert!(err.is_none() && secs > 5.9, "{kind} whole: {secs} {err:?}");
        let short = cut(d, &format!("cut.{kind}"), &whole, 0.6);
        let reference = ffmpeg_seconds(&short);
        let (secs, err) = play(&short);
        let err =
            err.unwrap_or_else(|| panic!("{kind}: a cut file played {secs:.2} s and said nothing"));
        assert!(
            matches!(
                err,
                AudioError::Truncated { .. } | AudioError::CutShort { .. }
            ),
            "{kind}: {err}"
        );
        // what is there is played (ffmpeg gets about as far)
        assert!(
            secs > 0.5 && secs + 0.5 > reference,
            "{kind}: played {secs:.2} s, ffmpeg {reference:.2}"
        );
        let line = err.to_string();
        assert!(line.contains(&format!("cut.{kind}")), "{line}");
        assert!(!line.contains("isomp4") && !line.contains("atom"), "{line}");
    }
}

#[test]
fn mp3s_of_two_rates_joined_are_refused_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let joined = join(
        d,
        "rates.mp3",
        &[
            &tone(d, "a.mp3", 440, 3.0, 16_000, &[]),
            &tone(d, "b.mp3", 440, 3.0, 44_100, &[]),
        ],
    );
    let (secs, err) = play(&joined);
    let line = err.map(|e| e.to_string()).unwrap_or_default();
    // the first recording is played; the change is named, not the decoder's internals
    assert!(secs > 2.8, "{secs}");
    assert!(
        line.contains("changes mid-stream") && line.contains("rates.mp3"),
        "{line}"
    );
    assert!(!line.contains("signal spec"), "{line}");
}

#[test]
fn a_flac_whose_header_lies_about_its_rate_or_depth_is_refused_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let flac = tone(dir.path(), "a.flac", 440, 2.0, 16_000, &[]);
    let bytes = std::fs::read(&flac).unwrap();
    assert_eq!(&bytes[..4], b"fLaC");
    // STREAMINFO from byte 18: 20 bits of rate, 3 of channels - 1, 5 of bits - 1, 36 of length
    let field = u64::from_be_bytes(bytes[18..26].try_into().unwrap());
    for (name, patched) in [
        ("rate1.flac", (field & !(0xF_FFFF << 44)) | (1 << 44)),
        ("bits31.flac", (field & !(0x1F << 36)) | (30 << 36)),
    ] {
        let mut b = bytes.clone();
        b[18..26].copy_from_slice(&patched.to_be_bytes());
        let p = dir.path().join(name);
        std::fs::write(&p, b).unwrap();
        let (_, err) = play(&p);
        let line = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            line.contains(name) && line.contains("header is damaged"),
            "{line}"
        );
        assert!(!line.contains("unexpected end of file"), "{line}");
    }
}
