//! Content sniffing and the RIFF/WAVE header walk.
//!
//! [`probe`] reads the chunks up to `data` from a plain [`Read`]er (a pipe
//! works as well as a file), validates the `fmt ` chunk against what the PCM
//! decoder supports, and tolerates the lies real writers tell: unknown-length
//! sizes from streaming writers, odd-sized chunks with or without their pad
//! byte, a wrong byte rate. Each lie it forgives becomes a [`HeaderWarning`].

use std::fmt;
use std::io::{self, BufRead, Read};
use std::path::Path;

use crate::{AudioError, MAX_CHANNELS, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};

/// Something a WAV header gets wrong that the reader worked around.
///
/// The audio is still read; the caller may show these to the user
/// (see [`WavSource::warnings`](super::WavSource::warnings)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderWarning {
    /// The `fmt ` chunk's byte rate is not `rate × block align`; it is ignored.
    ByteRate {
        /// What the header says.
        declared: u32,
        /// `sample_rate × block_align`.
        expected: u64,
    },
    /// The `data` chunk declares a few bytes more than the file holds, less
    /// than one frame: every declared frame is present.
    DataPastEnd {
        /// Bytes the header declares.
        declared: u64,
        /// Bytes the file holds.
        present: u64,
    },
    /// The data length is not a whole number of frames; the trailing bytes are ignored.
    PartialFrame {
        /// Bytes that do not make up a whole frame.
        stray_bytes: u64,
    },
    /// An odd-sized chunk is not followed by the pad byte RIFF requires.
    MissingPadByte {
        /// The chunk's id.
        chunk: String,
    },
}

impl fmt::Display for HeaderWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderWarning::ByteRate { declared, expected } => write!(
                f,
                "the header's byte rate ({declared}) is wrong (expected {expected}); ignored it"
            ),
            HeaderWarning::DataPastEnd { declared, present } => write!(
                f,
                "the header declares {declared} data bytes but the file holds {present}; \
                 every whole frame is present"
            ),
            HeaderWarning::PartialFrame { stray_bytes } => write!(
                f,
                "the audio data ends with {stray_bytes} byte(s) that do not make a whole frame; ignored them"
            ),
            HeaderWarning::MissingPadByte { chunk } => write!(
                f,
                "the odd-sized `{chunk}` chunk has no pad byte; read it without one"
            ),
        }
    }
}

/// What the first bytes of a file say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sniffed {
    /// `RIFF`, `RIFX` or `RF64`: handled by [`probe`].
    Riff,
    /// A compressed format symphonia decodes; the name is for messages.
    Compressed(&'static str),
    /// A known audio format voxline does not read.
    Unsupported(&'static str),
    /// Nothing recognised.
    Unknown,
}

/// Classifies a file by its first (up to 12) bytes.
pub(crate) fn sniff(head: &[u8]) -> Sniffed {
    let starts = |magic: &[u8]| head.starts_with(magic);
    if starts(b"RIFF") || starts(b"RIFX") || starts(b"RF64") {
        return Sniffed::Riff;
    }
    if starts(b"fLaC") {
        return Sniffed::Compressed("FLAC");
    }
    if starts(b"OggS") {
        return Sniffed::Compressed("Ogg");
    }
    if starts(b"ID3") {
        return Sniffed::Compressed("MP3");
    }
    if head.len() >= 8 && &head[4..8] == b"ftyp" {
        return Sniffed::Compressed("MP4/M4A");
    }
    if head.len() >= 3 && head[0] == 0xFF {
        let (b1, b2) = (head[1], head[2]);
        // ADTS (raw AAC): 12-bit sync, layer 00.
        if b1 & 0xF6 == 0xF0 {
            return Sniffed::Compressed("AAC (ADTS)");
        }
        // MPEG audio frame: 11-bit sync, a layer, a valid bitrate and sample-rate index.
        if b1 & 0xE0 == 0xE0 && b1 & 0x06 != 0 && b2 >> 4 != 0xF && (b2 >> 2) & 3 != 3 {
            return Sniffed::Compressed("MP3");
        }
    }
    if starts(b"FORM") && head.len() >= 12 && (&head[8..12] == b"AIFF" || &head[8..12] == b"AIFC") {
        return Sniffed::Unsupported("AIFF");
    }
    if starts(&[0x1A, 0x45, 0xDF, 0xA3]) {
        return Sniffed::Unsupported("Matroska/WebM");
    }
    if starts(b".snd") {
        return Sniffed::Unsupported("Sun/NeXT AU");
    }
    if starts(b"caff") {
        return Sniffed::Unsupported("Core Audio (CAF)");
    }
    if starts(b"#!AMR") {
        return Sniffed::Unsupported("AMR");
    }
    if starts(b"wvpk") {
        return Sniffed::Unsupported("WavPack");
    }
    Sniffed::Unknown
}

/// How the samples of a WAV `data` chunk are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PcmLayout {
    /// Unsigned 8-bit, centred on 128.
    U8,
    /// Signed little-endian integers in a container of this many bytes (2, 3 or 4),
    /// scaled by the container (so 24 valid bits left-justified in 32 decode right).
    Int(u8),
    /// IEEE float, 32-bit.
    F32,
}

/// The fields of the header the decoder needs.
#[derive(Debug, Clone)]
pub(crate) struct WavHeader {
    pub channels: u16,
    pub sample_rate: u32,
    pub block_align: u16,
    pub layout: PcmLayout,
    /// Significant bits per sample.
    pub valid_bits: u16,
    /// Bytes of audio to read, `None` when the writer did not know (a pipe): read to the end.
    pub data_len: Option<u64>,
    /// What the writer declared, even when it is an unknown-length placeholder.
    pub declared_len: u64,
    /// Whether `declared_len` is a real length (not a streaming writer's placeholder).
    pub sized: bool,
    /// Bytes after the `data` chunk header, when known (a regular file).
    pub present: Option<u64>,
    pub warnings: Vec<HeaderWarning>,
}

const WAVE_FORMAT_PCM: u16 = 0x0001;
const WAVE_FORMAT_IEEE_FLOAT: u16 = 0x0003;
const WAVE_FORMAT_EXTENSIBLE: u16 = 0xFFFE;

/// Whether a declared `data` size is what a streaming writer puts there when it
/// cannot seek back to fill in the real one: 0 and `0xFFFFFFFF` (ffmpeg), `0x80000000`
/// (arecord), `0x7FFFFFFF`, and sox's `0x7FFFF000` rounded down to whole frames.
pub(crate) fn is_unknown_length(len: u32, block_align: u16) -> bool {
    let sox = 0x7FFF_F000 / u32::from(block_align.max(1)) * u32::from(block_align.max(1));
    matches!(len, 0 | 0x7FFF_FFFF | 0x8000_0000 | 0xFFFF_FFFF) || len == sox
}

fn encoding_name(tag: u16) -> String {
    match tag {
        0x0002 => "Microsoft ADPCM".to_owned(),
        0x0006 => "A-law".to_owned(),
        0x0007 => "µ-law".to_owned(),
        0x0011 => "IMA ADPCM".to_owned(),
        0x0031 => "GSM 6.10".to_owned(),
        0x0050 => "MPEG audio".to_owned(),
        0x0055 => "MPEG layer 3 (MP3)".to_owned(),
        other => format!("format tag 0x{other:04X}"),
    }
}

/// Reads up to `buf.len()` bytes, returning how many were read (short only at end of stream).
pub(crate) fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Reads and discards `n` bytes; returns how many were there.
fn skip<R: Read>(r: &mut R, n: u64) -> io::Result<u64> {
    io::copy(&mut r.take(n), &mut io::sink())
}

fn is_fourcc_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b' ' || b == b'_'
}

/// Walks the RIFF chunks after the 12-byte `riff` header up to `data`, leaving
/// `r` at the first sample. `remaining` is how many bytes follow `riff` when
/// that is known (a regular file), `None` for a stream.
pub(crate) fn probe<R: BufRead>(
    path: &Path,
    riff: &[u8],
    r: &mut R,
    remaining: Option<u64>,
) -> Result<WavHeader, AudioError> {
    let open_err = |source| AudioError::Open {
        path: path.to_owned(),
        source,
    };
    let malformed = |reason: String| AudioError::MalformedHeader {
        path: path.to_owned(),
        reason,
    };
    let not_wav = |reason: String| AudioError::NotWav {
        path: path.to_owned(),
        reason,
    };
    let unsupported = |encoding: &str| AudioError::UnsupportedEncoding {
        path: path.to_owned(),
        encoding: encoding.to_owned(),
    };

    if riff.len() < 12 {
        return Err(not_wav(format!(
            "the file is only {} bytes, shorter than a RIFF header",
            riff.len()
        )));
    }
    match &riff[0..4] {
        b"RIFF" => {}
        b"RIFX" => return Err(unsupported("big-endian RIFX container")),
        b"RF64" => return Err(unsupported("RF64 (64-bit RIFF) container")),
        other => {
            return Err(not_wav(format!(
                "it starts with {other:02X?} instead of the `RIFF` magic"
            )))
        }
    }
    if &riff[8..12] != b"WAVE" {
        return Err(not_wav(format!(
            "the RIFF form type is {:?}, not `WAVE`",
            String::from_utf8_lossy(&riff[8..12])
        )));
    }

    let mut consumed: u64 = 0;
    let mut warnings = Vec::new();
    let mut fmt: Option<(u16, u32, u16, PcmLayout, u16)> = None;
    loop {
        let mut header = [0u8; 8];
        let got = read_full(r, &mut header).map_err(open_err)?;
        if got < 8 {
            return Err(match fmt {
                None => malformed("the file ends before a `fmt ` chunk".to_owned()),
                Some(_) => malformed(
                    "the file ends before a `data` chunk (header only, no audio)".to_owned(),
                ),
            });
        }
        consumed += 8;
        let id = [header[0], header[1], header[2], header[3]];
        let id_text = String::from_utf8_lossy(&id).into_owned();
        let size32 = u32_at(&header, 4);
        let size = u64::from(size32);
        match &id {
            b"fmt " => {
                if size < 16 {
                    return Err(malformed(format!(
                        "the `fmt ` chunk is {size} bytes, need at least 16"
                    )));
                }
                let mut body = [0u8; 40];
                let want = size.min(40) as usize;
                let got = read_full(r, &mut body[..want]).map_err(open_err)?;
                if got < want {
                    return Err(malformed(
                        "the file ends inside the `fmt ` chunk".to_owned(),
                    ));
                }
                let parsed = parse_fmt(path, &body[..want], &mut warnings)?;
                fmt = Some(parsed);
                consumed += skip(r, size - want as u64).map_err(open_err)? + want as u64;
            }
            b"data" => {
                let Some((channels, sample_rate, block_align, layout, valid_bits)) = fmt else {
                    return Err(malformed(
                        "the `data` chunk comes before the `fmt ` chunk".to_owned(),
                    ));
                };
                let present = remaining.map(|n| n.saturating_sub(consumed));
                let sized = !(is_unknown_length(size32, block_align)
                    && present.is_none_or(|p| p < size || size == 0));
                let data_len = if !sized {
                    // A streaming writer's placeholder: read what is there.
                    present
                } else {
                    Some(size)
                };
                let ba = u64::from(block_align);
                if let (true, Some(p)) = (sized, present) {
                    if p < size && p / ba == size / ba {
                        warnings.push(HeaderWarning::DataPastEnd {
                            declared: size,
                            present: p,
                        });
                    }
                }
                let stray = data_len.unwrap_or(size).min(present.unwrap_or(u64::MAX)) % ba;
                if stray != 0 && data_len.is_some() {
                    warnings.push(HeaderWarning::PartialFrame { stray_bytes: stray });
                }
                return Ok(WavHeader {
                    channels,
                    sample_rate,
                    block_align,
                    layout,
                    valid_bits,
                    data_len,
                    declared_len: size,
                    sized,
                    present,
                    warnings,
                });
            }
            _ => {
                consumed += skip(r, size).map_err(open_err)?;
            }
        }
        if size & 1 == 1 {
            // RIFF pads odd-sized chunks to an even length; some writers forget to.
            let next = r.fill_buf().map_err(open_err)?;
            if next.len() >= 4 && next[0] != 0 && next[..4].iter().all(|&b| is_fourcc_byte(b)) {
                warnings.push(HeaderWarning::MissingPadByte { chunk: id_text });
            } else {
                consumed += skip(r, 1).map_err(open_err)?;
            }
        }
    }
}

/// Validates a `fmt ` chunk body; returns channels, rate, block align, layout and valid bits.
fn parse_fmt(
    path: &Path,
    body: &[u8],
    warnings: &mut Vec<HeaderWarning>,
) -> Result<(u16, u32, u16, PcmLayout, u16), AudioError> {
    let malformed = |reason: String| AudioError::MalformedHeader {
        path: path.to_owned(),
        reason,
    };
    let unsupported = |encoding: String| AudioError::UnsupportedEncoding {
        path: path.to_owned(),
        encoding,
    };
    let mut tag = u16_at(body, 0);
    let channels = u16_at(body, 2);
    let sample_rate = u32_at(body, 4);
    let byte_rate = u32_at(body, 8);
    let block_align = u16_at(body, 12);
    let container_bits = u16_at(body, 14);
    let mut valid_bits = container_bits;
    if tag == WAVE_FORMAT_EXTENSIBLE {
        if body.len() < 40 {
            return Err(malformed(format!(
                "WAVE_FORMAT_EXTENSIBLE needs a 40-byte `fmt ` chunk, found {} bytes",
                body.len()
            )));
        }
        let declared_valid = u16_at(body, 18);
        if declared_valid != 0 {
            valid_bits = declared_valid;
        }
        // The sub-format GUID starts with the plain format tag.
        tag = u16_at(body, 24);
    }
    if channels == 0 || channels > MAX_CHANNELS {
        return Err(AudioError::UnsupportedChannels {
            path: path.to_owned(),
            channels,
        });
    }
    if !(MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&sample_rate) {
        return Err(AudioError::UnsupportedSampleRate {
            path: path.to_owned(),
            rate: sample_rate,
        });
    }
    let layout = match tag {
        WAVE_FORMAT_PCM => match (container_bits, valid_bits) {
            (8, 8) => PcmLayout::U8,
            (16, 16) => PcmLayout::Int(2),
            (24, 24) => PcmLayout::Int(3),
            // 24 valid bits sit left-justified in the 32-bit container: scale by the container.
            (32, 32) | (32, 24) => PcmLayout::Int(4),
            (c, v) if c == v => return Err(unsupported(format!("{c}-bit integer PCM"))),
            (c, v) => {
                return Err(unsupported(format!(
                    "{v}-bit integer PCM in {c}-bit containers"
                )))
            }
        },
        WAVE_FORMAT_IEEE_FLOAT => match container_bits {
            32 => PcmLayout::F32,
            c => return Err(unsupported(format!("{c}-bit IEEE float"))),
        },
        other => return Err(unsupported(encoding_name(other))),
    };
    if u32::from(block_align) != u32::from(channels) * u32::from(container_bits / 8) {
        return Err(malformed(format!(
            "block align {block_align} does not match {channels} channels of {container_bits} bits"
        )));
    }
    let expected = u64::from(sample_rate) * u64::from(block_align);
    if u64::from(byte_rate) != expected {
        warnings.push(HeaderWarning::ByteRate {
            declared: byte_rate,
            expected,
        });
    }
    Ok((channels, sample_rate, block_align, layout, valid_bits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_formats_by_their_first_bytes() {
        let cases: &[(&[u8], Sniffed)] = &[
            (b"RIFF\0\0\0\0WAVE", Sniffed::Riff),
            (b"RF64", Sniffed::Riff),
            (b"fLaC\0\0\0\x22", Sniffed::Compressed("FLAC")),
            (b"OggS\0\x02", Sniffed::Compressed("Ogg")),
            (b"ID3\x04\0\0", Sniffed::Compressed("MP3")),
            // MPEG-1 layer III, 128 kbit/s, 44.1 kHz
            (&[0xFF, 0xFB, 0x90, 0x64], Sniffed::Compressed("MP3")),
            // ADTS AAC
            (&[0xFF, 0xF1, 0x50, 0x80], Sniffed::Compressed("AAC (ADTS)")),
            (b"\0\0\0\x20ftypM4A ", Sniffed::Compressed("MP4/M4A")),
            (b"FORM\0\0\0\0AIFF", Sniffed::Unsupported("AIFF")),
            (
                &[0x1A, 0x45, 0xDF, 0xA3, 0x01],
                Sniffed::Unsupported("Matroska/WebM"),
            ),
            // a frame sync with the reserved sample-rate index is not MP3
            (&[0xFF, 0xFB, 0x9C, 0x64], Sniffed::Unknown),
            (b"These are notes", Sniffed::Unknown),
            (b"", Sniffed::Unknown),
        ];
        for (head, want) in cases {
            assert_eq!(sniff(head), *want, "{head:02X?}");
        }
    }

    #[test]
    fn streaming_writers_placeholders_are_unknown_lengths() {
        for (len, align) in [
            (0xFFFF_FFFF, 2),
            (0, 4),
            (0x8000_0000, 2),
            (0x7FFF_F000, 4),
            (0x7FFF_EFFF, 3),
        ] {
            assert!(is_unknown_length(len, align), "0x{len:08X} / {align}");
        }
        for (len, align) in [(0xFFFF_FFF0, 2), (32_000, 2), (0x7FFF_EFFF, 4)] {
            assert!(!is_unknown_length(len, align), "0x{len:08X} / {align}");
        }
    }
}
