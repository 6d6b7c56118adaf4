//! Bytes of bad (and odd) inputs: WAV headers written by hand so that any
//! field can be wrong, deterministic noise, the head of a file.

use std::path::Path;

/// A WAV `fmt ` description written by hand, so that any field can be wrong.
#[derive(Clone, Copy)]
pub(super) struct Fmt {
    pub(super) format_tag: u16,
    pub(super) channels: u16,
    pub(super) rate: u32,
    pub(super) bits: u16,
}

impl Fmt {
    pub(super) const PCM16_MONO_16K: Fmt = Fmt {
        format_tag: 1,
        channels: 1,
        rate: 16_000,
        bits: 16,
    };
}

/// A RIFF/WAVE file: `fmt ` then `data`. `data_len` overrides the declared
/// data size (to claim more than is present); `riff_len` the RIFF size.
pub(super) fn wav_bytes(
    fmt: Fmt,
    data: &[u8],
    data_len: Option<u32>,
    riff_len: Option<u32>,
) -> Vec<u8> {
    let bytes_per_sample = u32::from(fmt.bits).div_ceil(8);
    let block_align = u32::from(fmt.channels) * bytes_per_sample;
    let mut body = Vec::with_capacity(36 + data.len());
    body.extend_from_slice(b"WAVE");
    body.extend_from_slice(b"fmt ");
    body.extend_from_slice(&16u32.to_le_bytes());
    body.extend_from_slice(&fmt.format_tag.to_le_bytes());
    body.extend_from_slice(&fmt.channels.to_le_bytes());
    body.extend_from_slice(&fmt.rate.to_le_bytes());
    body.extend_from_slice(&fmt.rate.wrapping_mul(block_align).to_le_bytes());
    body.extend_from_slice(&(block_align as u16).to_le_bytes());
    body.extend_from_slice(&fmt.bits.to_le_bytes());
    body.extend_from_slice(b"data");
    let declared = data_len.unwrap_or(data.len() as u32);
    body.extend_from_slice(&declared.to_le_bytes());
    body.extend_from_slice(data);
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&riff_len.unwrap_or(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// 16 kHz mono 16-bit PCM from samples in [-1, 1].
pub(super) fn pcm16_wav(samples: &[f32]) -> Vec<u8> {
    let data: Vec<u8> = samples
        .iter()
        .flat_map(|s| ((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes())
        .collect();
    wav_bytes(Fmt::PCM16_MONO_16K, &data, None, None)
}

/// Deterministic pseudo-random bytes (xorshift64*), so a failing case can be replayed.
pub(super) fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// The first `n` bytes of a file.
pub(super) fn head(path: &Path, n: usize) -> Vec<u8> {
    use std::io::Read as _;
    let mut buf = Vec::with_capacity(n);
    std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .take(n as u64)
        .read_to_end(&mut buf)
        .unwrap();
    buf
}

/// Two seconds of a 16 kHz 16-bit tone, as raw little-endian PCM bytes.
pub(super) fn tone() -> Vec<u8> {
    (0..16_000u32 * 2)
        .flat_map(|i| (((i as f32 * 0.05).sin() * 8000.0) as i16).to_le_bytes())
        .collect()
}
