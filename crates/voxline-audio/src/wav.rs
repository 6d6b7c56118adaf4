//! WAV file replay: decode, down-mix and resample to 16 kHz mono, chunk by chunk.
//!
//! [`WavSource`] checks the RIFF header itself first, so that every unusable
//! file is rejected with a precise [`AudioError`], then decodes samples with
//! `hound` while holding only one chunk in memory.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::{AudioError, StreamResampler, MAX_CHANNELS, MAX_SAMPLE_RATE};

/// How the samples of a WAV file are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleEncoding {
    /// Signed PCM integers (8-bit files are unsigned on disk and re-centred).
    Int,
    /// IEEE 754 floating point.
    Float,
}

/// The format of an opened WAV file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WavSpec {
    /// Sample rate in Hz.
    pub sample_rate: u32,
    /// Interleaved channels per frame.
    pub channels: u16,
    /// Significant bits per sample (8, 16, 24 or 32).
    pub bits_per_sample: u16,
    /// Integer or float samples.
    pub format: SampleEncoding,
    /// Frames (samples per channel) in the file, when known. When the header
    /// claims more data than the file holds this is what the file holds.
    pub duration_frames: Option<u64>,
}

/// The fields of the header that [`probe`] extracts.
struct Probe {
    channels: u16,
    sample_rate: u32,
    block_align: u16,
    /// Byte offset of the first sample.
    data_offset: u64,
    /// Data length in bytes the header declares.
    data_len: u64,
}

const WAVE_FORMAT_PCM: u16 = 0x0001;
const WAVE_FORMAT_IEEE_FLOAT: u16 = 0x0003;
const WAVE_FORMAT_EXTENSIBLE: u16 = 0xFFFE;

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

/// Reads up to `buf.len()` bytes, returning how many were read (short only at end of file).
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
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

/// Walks the RIFF chunks up to `data`, validating the `fmt ` chunk against what
/// this reader supports. Never reads sample data.
fn probe<R: Read + Seek>(path: &Path, r: &mut R) -> Result<Probe, AudioError> {
    let open_err = |source| AudioError::Open {
        path: path.to_owned(),
        source,
    };
    let malformed = |reason: String| AudioError::MalformedHeader {
        path: path.to_owned(),
        reason,
    };

    let mut riff = [0u8; 12];
    let got = read_full(r, &mut riff).map_err(open_err)?;
    if got == 0 {
        return Err(AudioError::NotWav {
            path: path.to_owned(),
            reason: "the file is empty".to_owned(),
        });
    }
    if got < 12 {
        return Err(AudioError::NotWav {
            path: path.to_owned(),
            reason: format!("the file is only {got} bytes, shorter than a RIFF header"),
        });
    }
    match &riff[0..4] {
        b"RIFF" => {}
        b"RIFX" => {
            return Err(AudioError::UnsupportedEncoding {
                path: path.to_owned(),
                encoding: "big-endian RIFX container".to_owned(),
            })
        }
        b"RF64" => {
            return Err(AudioError::UnsupportedEncoding {
                path: path.to_owned(),
                encoding: "RF64 (64-bit RIFF) container".to_owned(),
            })
        }
        other => {
            return Err(AudioError::NotWav {
                path: path.to_owned(),
                reason: format!("it starts with {:02X?} instead of the `RIFF` magic", other),
            })
        }
    }
    if &riff[8..12] != b"WAVE" {
        return Err(AudioError::NotWav {
            path: path.to_owned(),
            reason: format!(
                "the RIFF form type is {:?}, not `WAVE`",
                String::from_utf8_lossy(&riff[8..12])
            ),
        });
    }

    let mut offset: u64 = 12;
    let mut fmt: Option<(u16, u32, u16)> = None;
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
        offset += 8;
        let id = [header[0], header[1], header[2], header[3]];
        let size = u64::from(u32_at(&header, 4));
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
                let mut tag = u16_at(&body, 0);
                let channels = u16_at(&body, 2);
                let sample_rate = u32_at(&body, 4);
                let block_align = u16_at(&body, 12);
                let container_bits = u16_at(&body, 14);
                let mut valid_bits = container_bits;
                if tag == WAVE_FORMAT_EXTENSIBLE {
                    if want < 40 {
                        return Err(malformed(format!(
                            "WAVE_FORMAT_EXTENSIBLE needs a 40-byte `fmt ` chunk, found {size} bytes"
                        )));
                    }
                    let declared_valid = u16_at(&body, 18);
                    if declared_valid != 0 {
                        valid_bits = declared_valid;
                    }
                    // The sub-format GUID starts with the plain format tag.
                    tag = u16_at(&body, 24);
                }
                if channels == 0 || channels > MAX_CHANNELS {
                    return Err(AudioError::UnsupportedChannels {
                        path: path.to_owned(),
                        channels,
                    });
                }
                if sample_rate == 0 || sample_rate > MAX_SAMPLE_RATE {
                    return Err(AudioError::UnsupportedSampleRate {
                        path: path.to_owned(),
                        rate: sample_rate,
                    });
                }
                check_encoding(path, tag, container_bits, valid_bits)?;
                if u32::from(block_align) != u32::from(channels) * u32::from(container_bits / 8) {
                    return Err(malformed(format!(
                        "block align {block_align} does not match {channels} channels of {container_bits} bits"
                    )));
                }
                fmt = Some((channels, sample_rate, block_align));
                skip(r, size + (size & 1) - want as u64).map_err(open_err)?;
            }
            b"data" => {
                let Some((channels, sample_rate, block_align)) = fmt else {
                    return Err(malformed(
                        "the `data` chunk comes before the `fmt ` chunk".to_owned(),
                    ));
                };
                return Ok(Probe {
                    channels,
                    sample_rate,
                    block_align,
                    data_offset: offset,
                    data_len: size,
                });
            }
            _ => skip(r, size + (size & 1)).map_err(open_err)?,
        }
        offset += size + (size & 1);
    }
}

fn skip<R: Seek>(r: &mut R, n: u64) -> io::Result<()> {
    let n = i64::try_from(n)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "chunk too large"))?;
    r.seek(SeekFrom::Current(n)).map(|_| ())
}

fn check_encoding(
    path: &Path,
    tag: u16,
    container_bits: u16,
    valid_bits: u16,
) -> Result<(), AudioError> {
    let unsupported = |encoding: String| AudioError::UnsupportedEncoding {
        path: path.to_owned(),
        encoding,
    };
    match tag {
        WAVE_FORMAT_PCM => match (container_bits, valid_bits) {
            (8, 8) | (16, 16) | (24, 24) | (32, 32) | (32, 24) => Ok(()),
            (c, v) if c == v => Err(unsupported(format!("{c}-bit integer PCM"))),
            (c, v) => Err(unsupported(format!(
                "{v}-bit integer PCM in {c}-bit containers"
            ))),
        },
        WAVE_FORMAT_IEEE_FLOAT => match (container_bits, valid_bits) {
            (32, 32) => Ok(()),
            (64, _) => Err(unsupported("64-bit IEEE float".to_owned())),
            (c, _) => Err(unsupported(format!("{c}-bit IEEE float"))),
        },
        other => Err(unsupported(encoding_name(other))),
    }
}

/// Decoded samples, as hound yields them.
enum Samples {
    Int {
        iter: hound::WavIntoSamples<BufReader<File>, i32>,
        scale: f32,
    },
    Float(hound::WavIntoSamples<BufReader<File>, f32>),
}

impl Samples {
    /// The next sample normalised to `[-1, 1]` (floats are passed through), or `None` at the declared end.
    fn next(&mut self) -> Option<Result<f32, hound::Error>> {
        match self {
            Samples::Int { iter, scale } => iter.next().map(|r| r.map(|s| s as f32 * *scale)),
            Samples::Float(iter) => iter.next(),
        }
    }
}

/// Streams a WAV file as 16 kHz mono `f32` chunks.
///
/// Accepts PCM integer 8/16/24/32-bit and IEEE float 32-bit, 1..=384000 Hz,
/// 1..=8 channels. Each call to [`next_chunk`](Self::next_chunk) decodes about
/// 20 ms of the file, so memory stays bounded whatever the file's length.
pub struct WavSource {
    path: PathBuf,
    spec: WavSpec,
    samples: Samples,
    resampler: StreamResampler,
    /// Frames the header declares.
    declared_frames: u64,
    /// Input frames decoded per call.
    frames_per_read: usize,
    /// Reused interleaved buffer.
    interleaved: Vec<f32>,
    frames_read: u64,
    finished: bool,
    /// An error to report once the audio before it has been delivered.
    deferred: Option<AudioError>,
}

impl std::fmt::Debug for WavSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WavSource")
            .field("path", &self.path)
            .field("spec", &self.spec)
            .field("frames_read", &self.frames_read)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl WavSource {
    /// Opens `path` and validates its header; no sample data is read yet.
    ///
    /// A header that declares more data than the file holds is accepted: the
    /// frames that are present are streamed, then
    /// [`next_chunk`](Self::next_chunk) reports [`AudioError::Truncated`].
    ///
    /// # Errors
    /// - [`AudioError::Open`]: the file cannot be opened or read;
    /// - [`AudioError::NotWav`]: empty, too short, or without the RIFF/WAVE magic;
    /// - [`AudioError::UnsupportedEncoding`]: A-law, µ-law, ADPCM, 64-bit float,
    ///   an odd bit depth, RF64/RIFX containers, …;
    /// - [`AudioError::UnsupportedChannels`] / [`AudioError::UnsupportedSampleRate`]:
    ///   0 or more than 8 channels, 0 Hz or more than 384 kHz;
    /// - [`AudioError::MalformedHeader`]: missing or inconsistent chunks.
    pub fn open(path: &Path) -> Result<WavSource, AudioError> {
        let open_err = |source| AudioError::Open {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(open_err)?;
        let file_len = file.metadata().map_err(open_err)?.len();
        let mut reader = BufReader::new(file);
        let probe = probe(path, &mut reader)?;
        reader.seek(SeekFrom::Start(0)).map_err(open_err)?;

        let wav = hound::WavReader::new(reader).map_err(|e| map_open_error(path, e))?;
        let hs = wav.spec();
        let declared_frames = u64::from(wav.duration());
        let available_bytes = file_len
            .saturating_sub(probe.data_offset)
            .min(probe.data_len);
        let available_frames = available_bytes / u64::from(probe.block_align);
        if available_frames < declared_frames {
            tracing::warn!(
                path = %path.display(),
                declared_frames,
                available_frames,
                "WAV header declares more audio than the file holds; streaming what is there"
            );
        }
        let format = match hs.sample_format {
            hound::SampleFormat::Int => SampleEncoding::Int,
            hound::SampleFormat::Float => SampleEncoding::Float,
        };
        let samples = match format {
            SampleEncoding::Int => {
                let bits = i32::from(hs.bits_per_sample.clamp(8, 32));
                let scale = (2.0f64).powi(1 - bits) as f32;
                Samples::Int {
                    iter: wav.into_samples::<i32>(),
                    scale,
                }
            }
            SampleEncoding::Float => Samples::Float(wav.into_samples::<f32>()),
        };
        let spec = WavSpec {
            sample_rate: probe.sample_rate,
            channels: probe.channels,
            bits_per_sample: hs.bits_per_sample,
            format,
            duration_frames: Some(declared_frames.min(available_frames)),
        };
        let resampler = StreamResampler::new(probe.sample_rate, probe.channels)?;
        let frames_per_read = (probe.sample_rate as usize / 50).max(1);
        Ok(WavSource {
            path: path.to_owned(),
            spec,
            samples,
            resampler,
            declared_frames,
            frames_per_read,
            interleaved: Vec::with_capacity(frames_per_read * usize::from(probe.channels)),
            frames_read: 0,
            finished: false,
            deferred: None,
        })
    }

    /// The file's format.
    pub fn spec(&self) -> &WavSpec {
        &self.spec
    }

    /// The file this source reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Input frames decoded so far.
    pub fn frames_read(&self) -> u64 {
        self.frames_read
    }

    /// Returns the next chunk of 16 kHz mono samples, or `None` after the end.
    ///
    /// Each call decodes about 20 ms of the file (`rate / 50` frames). A chunk is
    /// usually 320 samples; when resampling, chunk sizes follow the resampler's
    /// block size (they vary a little, and can be larger for sample rates that
    /// share no large common factor with 16 kHz). Chunks are never empty. The
    /// final chunk includes the flushed resampler tail, so the concatenated
    /// output has `round(frames * 16000 / rate)` samples and is time-aligned
    /// with the input (the resampler's delay is removed).
    ///
    /// Integer samples are scaled to `[-1, 1]`, float samples are clamped to it
    /// (NaN/∞ become 0), and channels are averaged.
    ///
    /// # Errors
    /// - [`AudioError::Truncated`]: the data ended before the declared length. It
    ///   is returned once, after the complete frames that were present have been
    ///   delivered; later calls return `Ok(None)`.
    /// - [`AudioError::Decode`]: any other read failure (reported the same way).
    /// - [`AudioError::Resample`]: an internal resampler failure.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<f32>>, AudioError> {
        let mut out = Vec::new();
        while !self.finished {
            let ended = self.read_block();
            self.resampler.process(&self.interleaved, &mut out)?;
            if ended {
                self.resampler.flush(&mut out)?;
                self.finished = true;
            }
            if !out.is_empty() {
                return Ok(Some(out));
            }
        }
        match self.deferred.take() {
            Some(err) => Err(err),
            None => Ok(None),
        }
    }

    /// Decodes up to `frames_per_read` whole frames into `self.interleaved`.
    /// Returns `true` when the stream has ended (normally or with a deferred error).
    fn read_block(&mut self) -> bool {
        let channels = usize::from(self.spec.channels);
        self.interleaved.clear();
        for _ in 0..self.frames_per_read {
            for ch in 0..channels {
                match self.samples.next() {
                    Some(Ok(s)) => self.interleaved.push(s),
                    Some(Err(e)) => {
                        // Drop the incomplete frame.
                        self.interleaved.truncate(self.interleaved.len() - ch);
                        self.deferred = Some(self.read_error(e));
                        return true;
                    }
                    None => {
                        if ch != 0 {
                            self.interleaved.truncate(self.interleaved.len() - ch);
                        }
                        return true;
                    }
                }
            }
            self.frames_read += 1;
        }
        false
    }

    fn read_error(&self, e: hound::Error) -> AudioError {
        let truncated = match &e {
            hound::Error::IoError(io) => {
                // hound reports a short read either as UnexpectedEof or as "Failed to read enough bytes".
                io.kind() == io::ErrorKind::UnexpectedEof || io.kind() == io::ErrorKind::Other
            }
            _ => false,
        };
        if truncated {
            tracing::warn!(
                path = %self.path.display(),
                frames_read = self.frames_read,
                declared_frames = self.declared_frames,
                "WAV data is truncated"
            );
            AudioError::Truncated {
                path: self.path.clone(),
                expected_frames: self.declared_frames,
                frames_read: self.frames_read,
            }
        } else {
            AudioError::Decode {
                path: self.path.clone(),
                frames_read: self.frames_read,
                reason: e.to_string(),
            }
        }
    }
}

/// Maps a hound error while parsing a header that [`probe`] already accepted.
fn map_open_error(path: &Path, e: hound::Error) -> AudioError {
    match e {
        hound::Error::IoError(source) => AudioError::Open {
            path: path.to_owned(),
            source,
        },
        hound::Error::Unsupported => AudioError::UnsupportedEncoding {
            path: path.to_owned(),
            encoding: "a WAV variant the decoder does not support".to_owned(),
        },
        other => AudioError::MalformedHeader {
            path: path.to_owned(),
            reason: other.to_string(),
        },
    }
}
