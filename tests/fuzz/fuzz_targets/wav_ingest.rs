//! Streams arbitrary bytes as a WAV file through `WavSource`.
//!
//! `WavSource::open` takes a path, so each input is written to a scratch file
//! named after the fuzzing process (in `/dev/shm` when it exists, so no disk
//! I/O) and unlinked as soon as it is open.
//! Beyond "never panics", the target checks the contract `next_chunk`
//! documents: chunks are never empty, an error is reported once and followed
//! by `Ok(None)`, and the whole stream holds `round(frames * 16000 / rate)`
//! samples. Integer PCM is scaled to [-1, 1], so its output must be finite.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use voxline_audio::wav::SampleEncoding;
use voxline_audio::WavSource;

/// Upper bound on `next_chunk` calls for one input: a fuzz input is at most a
/// few hundred KiB, and each call consumes at least one input frame.
const MAX_CALLS: usize = 1 << 20;

fn scratch_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let shm = PathBuf::from("/dev/shm");
        let dir = if shm.is_dir() { shm } else { std::env::temp_dir() };
        dir.join(format!("voxline-fuzz-wav-{}.wav", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let path = scratch_path();
    if std::fs::write(path, data).is_err() {
        return;
    }
    let opened = WavSource::open(path);
    // The open handle keeps the data readable; unlinking now leaves nothing
    // behind when the process exits (each `-fork` job is a new process).
    let _ = std::fs::remove_file(path);
    let Ok(mut src) = opened else {
        return;
    };
    let spec = src.spec().clone();
    let is_int = spec.format == SampleEncoding::Int;
    let mut total: u64 = 0;
    let mut errored = false;
    for _ in 0..MAX_CALLS {
        match src.next_chunk() {
            Ok(Some(chunk)) => {
                assert!(!chunk.is_empty(), "next_chunk returned an empty chunk");
                if is_int {
                    assert!(
                        chunk.iter().all(|s| s.is_finite()),
                        "integer PCM produced a non-finite sample"
                    );
                }
                total += chunk.len() as u64;
            }
            Ok(None) => break,
            Err(_) => {
                errored = true;
                break;
            }
        }
    }
    if errored {
        assert!(
            matches!(src.next_chunk(), Ok(None)),
            "a call after the reported error did not return Ok(None)"
        );
    } else {
        assert!(matches!(src.next_chunk(), Ok(None)), "the stream restarted after its end");
    }
    let frames = u128::from(src.frames_read());
    let rate = u128::from(spec.sample_rate);
    let expected = ((frames * 16_000 + rate / 2) / rate) as u64;
    assert_eq!(
        total, expected,
        "output length disagrees with round(frames * 16000 / rate) for {frames} frames at {rate} Hz"
    );
});
