//! Audio file replay: decode, down-mix and resample to 16 kHz mono, chunk by chunk.
//!
//! [`WavSource`] reads from a file, a FIFO, standard input or any [`Read`]er,
//! never seeking, and holds only one chunk in memory. What the file is comes
//! from its first bytes, not its name:
//!
//! - **WAV** (RIFF/WAVE) is read here: the header walk ([`header`]) rejects every
//!   unusable file with a precise [`AudioError`] and forgives the lies real
//!   writers tell ([`HeaderWarning`]); the PCM decoding is a byte conversion.
//! - **MP3, FLAC, Ogg/Vorbis, MP4/M4A (AAC)** are decoded by symphonia.
//! - Other audio formats are refused with one line naming the format and the
//!   command that converts it.

mod compressed;
mod header;
mod pcm;
mod pipe;

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use symphonia::core::io::{MediaSource, ReadOnlySource};

use crate::{AudioError, StreamResampler};
use compressed::{CompressedStream, PacketEnd};
use header::{probe, read_full, sniff, Sniffed};
use pcm::{LevelMeter, PcmEnd, PcmStream};

pub use header::HeaderWarning;
pub use pcm::{Level, LEVEL_FLOOR_DBFS, NEAR_SILENT_PEAK_DBFS};

/// The name [`WavSource::stdin`] gives standard input in messages.
pub const STDIN_LABEL: &str = "standard input";

/// How the samples of a file are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleEncoding {
    /// Signed PCM integers (8-bit files are unsigned on disk and re-centred).
    Int,
    /// IEEE 754 floating point (also what compressed formats decode to).
    Float,
}

/// The format of an opened file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WavSpec {
    /// Sample rate in Hz.
    pub sample_rate: u32,
    /// Interleaved channels per frame.
    pub channels: u16,
    /// Significant bits per sample (8, 16, 24 or 32; 32 for compressed formats,
    /// which decode to 32-bit float).
    pub bits_per_sample: u16,
    /// Integer or float samples.
    pub format: SampleEncoding,
    /// Frames (samples per channel), when known. When the header claims more
    /// data than the file holds this is what the file holds; `None` for a
    /// stream (pipe, FIFO, standard input) whose writer did not know its length.
    pub duration_frames: Option<u64>,
    /// The container found by content: `"WAV"`, `"MP3"`, `"FLAC"`, `"Ogg"`,
    /// `"MP4/M4A"` or `"AAC (ADTS)"`.
    pub container: &'static str,
}

/// Where the bytes come from.
enum Origin {
    /// A regular file: seekable, its length known.
    File(File),
    /// A pipe, FIFO, character device or caller's reader: read once, front to back.
    Stream(Box<dyn Read + Send + Sync>),
}

enum Decoder {
    Pcm(PcmStream),
    Compressed {
        stream: Box<CompressedStream>,
        /// Decoded samples of the current packet and how many were handed out.
        pending: Vec<f32>,
        pos: usize,
        scratch: Vec<f32>,
    },
}

/// Streams an audio file (WAV, or a compressed format) as 16 kHz mono `f32` chunks.
///
/// WAV: PCM integer 8/16/24/32-bit (including 24 valid bits in 32-bit
/// containers) and IEEE float 32-bit; compressed: see the module docs. 4 kHz to
/// 384 kHz, 1..=8 channels. Each call to [`next_chunk`](Self::next_chunk)
/// decodes about 20 ms, so memory stays bounded whatever the length.
pub struct WavSource {
    path: PathBuf,
    spec: WavSpec,
    decoder: Decoder,
    resampler: StreamResampler,
    /// Whole frames the header declares (0 when unknown).
    declared_frames: u64,
    /// Input frames decoded per call.
    frames_per_read: usize,
    /// Reused interleaved buffer.
    interleaved: Vec<f32>,
    frames_read: u64,
    finished: bool,
    /// An error to report once the audio before it has been delivered.
    deferred: Option<AudioError>,
    warnings: Vec<HeaderWarning>,
    /// Bytes per WAV frame (0 for compressed formats).
    block_align: u64,
    /// Data bytes the WAV header declares.
    declared_bytes: u64,
    meter: LevelMeter,
}

impl std::fmt::Debug for WavSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WavSource")
            .field("path", &self.path)
            .field("spec", &self.spec)
            .field("frames_read", &self.frames_read)
            .field("finished", &self.finished)
            .field("warnings", &self.warnings)
            .finish_non_exhaustive()
    }
}

impl WavSource {
    /// Opens `path` and reads its header; no sample data is read yet.
    ///
    /// A regular file is read knowing its length; a FIFO, character device or
    /// socket is streamed like standard input (blocking until a writer opens it
    /// and the header arrives).
    ///
    /// A header that declares more data than the file holds is accepted: the
    /// frames that are present are streamed, then
    /// [`next_chunk`](Self::next_chunk) reports [`AudioError::Truncated`]. The
    /// unknown-length sizes streaming writers put in the header (ffmpeg, sox,
    /// arecord writing to a pipe) mean "read to the end" instead.
    ///
    /// # Errors
    /// - [`AudioError::Open`]: the file cannot be opened or read;
    /// - [`AudioError::NotWav`]: empty, too short, or not an audio format voxline knows;
    /// - [`AudioError::UnsupportedFormat`]: another audio format (AIFF, WebM, …),
    ///   or a compressed file symphonia cannot decode;
    /// - [`AudioError::UnsupportedEncoding`]: A-law, µ-law, ADPCM, 64-bit float,
    ///   an odd bit depth, RF64/RIFX containers, …;
    /// - [`AudioError::UnsupportedChannels`] / [`AudioError::UnsupportedSampleRate`]:
    ///   0 or more than 8 channels, below 4 kHz or above 384 kHz;
    /// - [`AudioError::MalformedHeader`]: missing or inconsistent chunks.
    pub fn open(path: &Path) -> Result<WavSource, AudioError> {
        let open_err = |source| AudioError::Open {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        if meta.is_file() {
            Self::start(path.to_owned(), Origin::File(file), Some(meta.len()))
        } else {
            Self::start(path.to_owned(), Origin::Stream(Box::new(file)), None)
        }
    }

    /// [`open`](Self::open), for a caller that can be stopped (Ctrl-C): a
    /// named pipe with no writer is waited for on a helper thread, `waiting`
    /// is called once when none has come within 200 ms, and `stop` ends the
    /// wait; a pipe, FIFO or device is then read on a thread of its own, so
    /// that a writer that stalls never holds a stop up (the stream ends
    /// where it is). A regular file is opened as by [`open`](Self::open).
    ///
    /// # Errors
    /// [`AudioError::Interrupted`] when `stop` came before the writer or the
    /// header; otherwise as [`open`](Self::open).
    pub fn open_stoppable(
        path: &Path,
        stop: &voxline_core::ShutdownHandle,
        waiting: &dyn Fn(),
    ) -> Result<WavSource, AudioError> {
        let open_err = |source| AudioError::Open {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(open_err)?;
        if meta.is_file() {
            return Self::open(path);
        }
        let file = match pipe::open_waiting(path, stop, waiting).map_err(open_err)? {
            pipe::Opened::File(f) => f,
            pipe::Opened::Stopped => {
                return Err(AudioError::Interrupted {
                    path: path.to_owned(),
                })
            }
        };
        let reader = pipe::StopRead::wrap(file, stop.clone()).map_err(open_err)?;
        Self::start(path.to_owned(), Origin::Stream(Box::new(reader)), None).map_err(|e| {
            if stop.is_requested() {
                AudioError::Interrupted {
                    path: path.to_owned(),
                }
            } else {
                e
            }
        })
    }

    /// [`stdin`](Self::stdin), read on a thread of its own so that `stop`
    /// ends it even while the writer stalls.
    ///
    /// # Errors
    /// As [`open_stoppable`](Self::open_stoppable).
    pub fn stdin_stoppable(stop: &voxline_core::ShutdownHandle) -> Result<WavSource, AudioError> {
        let label = PathBuf::from(STDIN_LABEL);
        let reader =
            pipe::StopRead::wrap(io::stdin(), stop.clone()).map_err(|source| AudioError::Open {
                path: label.clone(),
                source,
            })?;
        Self::from_reader(label.clone(), reader).map_err(|e| {
            if stop.is_requested() {
                AudioError::Interrupted { path: label }
            } else {
                e
            }
        })
    }

    /// Reads from any reader, front to back, without seeking (a pipe, a socket,
    /// bytes in memory). `name` labels the source in messages.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn from_reader<R>(name: impl Into<PathBuf>, reader: R) -> Result<WavSource, AudioError>
    where
        R: Read + Send + Sync + 'static,
    {
        Self::start(name.into(), Origin::Stream(Box::new(reader)), None)
    }

    /// Reads standard input (e.g. `arecord -f S16_LE -r 16000 -c 1 | voxline replay -`);
    /// messages call it [`STDIN_LABEL`].
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn stdin() -> Result<WavSource, AudioError> {
        Self::from_reader(STDIN_LABEL, io::stdin())
    }

    fn start(path: PathBuf, mut origin: Origin, len: Option<u64>) -> Result<Self, AudioError> {
        let open_err = |source| AudioError::Open {
            path: path.clone(),
            source,
        };
        let mut head = [0u8; 12];
        let got = match &mut origin {
            Origin::File(f) => read_full(f, &mut head),
            Origin::Stream(r) => read_full(r, &mut head),
        }
        .map_err(open_err)?;
        let head = &head[..got];
        let not_wav = |reason: String| AudioError::NotWav {
            path: path.clone(),
            reason,
        };
        match sniff(head) {
            _ if got == 0 => Err(not_wav("it is empty".to_owned())),
            Sniffed::Riff => {
                let reader: Box<dyn Read + Send> = match origin {
                    Origin::File(f) => Box::new(f),
                    Origin::Stream(r) => r,
                };
                let mut reader = BufReader::with_capacity(1 << 16, reader);
                let h = probe(&path, head, &mut reader, len.map(|n| n.saturating_sub(12)))?;
                for w in &h.warnings {
                    tracing::warn!(path = %path.display(), "{w}");
                }
                let ba = u64::from(h.block_align);
                let declared_frames = if h.sized { h.declared_len / ba } else { 0 };
                let duration_frames = match (h.data_len, h.present) {
                    (Some(d), Some(p)) => Some(d.min(p) / ba),
                    (d, None) => d.map(|d| d / ba),
                    (None, Some(p)) => Some(p / ba),
                };
                let spec = WavSpec {
                    sample_rate: h.sample_rate,
                    channels: h.channels,
                    bits_per_sample: h.valid_bits,
                    format: match h.layout {
                        header::PcmLayout::F32 => SampleEncoding::Float,
                        _ => SampleEncoding::Int,
                    },
                    duration_frames,
                    container: "WAV",
                };
                let pcm = PcmStream::new(Box::new(reader), h.layout, h.block_align, h.data_len);
                let mut src = Self::assemble(path, spec, Decoder::Pcm(pcm), declared_frames)?;
                src.warnings = h.warnings;
                src.block_align = ba;
                src.declared_bytes = h.declared_len;
                Ok(src)
            }
            Sniffed::Compressed(kind) => {
                let stream = match origin {
                    Origin::File(mut f) => {
                        f.seek(SeekFrom::Start(0)).map_err(open_err)?;
                        CompressedStream::open_file(&path, kind, f)?
                    }
                    Origin::Stream(r) => {
                        let source: Box<dyn MediaSource> =
                            Box::new(ReadOnlySource::new(io::Cursor::new(head.to_vec()).chain(r)));
                        CompressedStream::open(&path, kind, source)?
                    }
                };
                let spec = WavSpec {
                    sample_rate: stream.sample_rate,
                    channels: stream.channels,
                    bits_per_sample: 32,
                    format: SampleEncoding::Float,
                    duration_frames: stream.declared_frames,
                    container: kind,
                };
                let declared_frames = stream.declared_frames.unwrap_or(0);
                let decoder = Decoder::Compressed {
                    stream: Box::new(stream),
                    pending: Vec::new(),
                    pos: 0,
                    scratch: Vec::new(),
                };
                Self::assemble(path, spec, decoder, declared_frames)
            }
            Sniffed::Unsupported(format) => Err(AudioError::UnsupportedFormat {
                path: path.clone(),
                format: format.to_owned(),
                reason: "voxline does not decode this format".to_owned(),
            }),
            Sniffed::Unknown if got < 12 => Err(not_wav(format!(
                "it is only {got} bytes, shorter than a RIFF header"
            ))),
            Sniffed::Unknown => Err(not_wav(format!(
                "it starts with {:02X?} instead of the `RIFF` magic or another known audio format",
                &head[..4]
            ))),
        }
    }

    fn assemble(
        path: PathBuf,
        spec: WavSpec,
        decoder: Decoder,
        declared_frames: u64,
    ) -> Result<Self, AudioError> {
        let resampler = StreamResampler::new(spec.sample_rate, spec.channels)?;
        let frames_per_read = (spec.sample_rate as usize / 50).max(1);
        Ok(WavSource {
            path,
            resampler,
            decoder,
            declared_frames,
            frames_per_read,
            interleaved: Vec::with_capacity(frames_per_read * usize::from(spec.channels)),
            spec,
            frames_read: 0,
            finished: false,
            deferred: None,
            warnings: Vec::new(),
            block_align: 0,
            declared_bytes: 0,
            meter: LevelMeter::default(),
        })
    }

    /// The file's format.
    pub fn spec(&self) -> &WavSpec {
        &self.spec
    }

    /// The file this source reads (or the name given to a reader; [`STDIN_LABEL`] for stdin).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Input frames decoded so far.
    pub fn frames_read(&self) -> u64 {
        self.frames_read
    }

    /// What the header got wrong and the reader worked around (each also logged
    /// with `tracing::warn!`). Known after [`open`](Self::open); a stream can add
    /// one when it ends. Print them as warnings, e.g. `FILE: {warning}`.
    pub fn warnings(&self) -> &[HeaderWarning] {
        &self.warnings
    }

    /// Peak and RMS level of the samples decoded so far (all channels, before
    /// down-mixing). Call it after the last chunk and warn when
    /// [`Level::is_near_silent`]: "FILE: near-silent (peak -60 dBFS); check the
    /// recording level".
    pub fn level(&self) -> Level {
        self.meter.level()
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
    /// Integer samples are scaled to `[-1, 1]` by their container, float samples
    /// are clamped to it (NaN/∞ become 0), and channels are averaged.
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
            self.meter.add(&self.interleaved);
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
        let want = self.frames_per_read * channels;
        self.interleaved.clear();
        let end = match &mut self.decoder {
            Decoder::Pcm(pcm) => match pcm.read(self.frames_per_read, &mut self.interleaved) {
                PcmEnd::More => None,
                PcmEnd::Done => Some(Ok(())),
                PcmEnd::Short => Some(Err(None)),
                PcmEnd::Failed(e) if e.kind() == io::ErrorKind::UnexpectedEof => Some(Err(None)),
                PcmEnd::Failed(e) => Some(Err(Some(e.to_string()))),
            },
            Decoder::Compressed {
                stream,
                pending,
                pos,
                scratch,
            } => {
                let mut end = None;
                if *pos == pending.len() {
                    pending.clear();
                    *pos = 0;
                    end = match stream.read_packet(pending, scratch) {
                        PacketEnd::More => None,
                        PacketEnd::Done => Some(Ok(())),
                        PacketEnd::Short => Some(Err(None)),
                        PacketEnd::Failed(why) => Some(Err(Some(why))),
                    };
                }
                let n = want.min(pending.len() - *pos);
                self.interleaved.extend_from_slice(&pending[*pos..*pos + n]);
                *pos += n;
                // Only a packet that decoded (`None`) leaves samples pending.
                end
            }
        };
        self.frames_read += (self.interleaved.len() / channels) as u64;
        let compressed = matches!(self.decoder, Decoder::Compressed { .. });
        let seconds = self.frames_read as f64 / f64::from(self.spec.sample_rate.max(1));
        // a compressed file that held less than its header declares (an
        // MP3's Xing/LAME frame count, an MP4's index), whether it ended at a
        // packet's edge or inside one
        let short = compressed && self.frames_read + self.cut_slack() < self.declared_frames;
        match end {
            None => false,
            Some(Ok(()) | Err(None)) if short => {
                self.deferred = Some(AudioError::Truncated {
                    path: self.path.clone(),
                    expected_frames: self.declared_frames,
                    frames_read: self.frames_read,
                });
                true
            }
            Some(Ok(())) => true,
            // compressed data that ends inside a packet was cut short,
            // whatever its container declared
            Some(Err(None)) if compressed => {
                self.deferred = Some(AudioError::CutShort {
                    path: self.path.clone(),
                    format: self.spec.container.to_owned(),
                    seconds,
                });
                true
            }
            Some(Err(None)) if self.frames_read >= self.declared_frames => {
                // Ended early but every whole declared frame is there (a stream's
                // header overstating by less than a frame, or no declared length).
                if self.declared_frames > 0 && self.block_align > 0 {
                    self.note_short_tail();
                }
                true
            }
            Some(Err(None)) => {
                tracing::warn!(
                    path = %self.path.display(),
                    frames_read = self.frames_read,
                    declared_frames = self.declared_frames,
                    "audio data is truncated"
                );
                self.deferred = Some(AudioError::Truncated {
                    path: self.path.clone(),
                    expected_frames: self.declared_frames,
                    frames_read: self.frames_read,
                });
                true
            }
            Some(Err(Some(reason))) => {
                self.deferred = Some(AudioError::Decode {
                    path: self.path.clone(),
                    seconds,
                    frames_read: self.frames_read,
                    reason,
                });
                true
            }
        }
    }

    /// Frames a compressed file may end short of its declared length and
    /// still be whole: two MP3 frames and 1 % (encoder delay and padding
    /// are counted differently by different writers).
    fn cut_slack(&self) -> u64 {
        2 * 1152 + self.declared_frames / 100
    }

    /// Records that a stream's data chunk ended a few bytes short of its header
    /// (a file says so when it is opened).
    fn note_short_tail(&mut self) {
        let seen = self
            .warnings
            .iter()
            .any(|w| matches!(w, HeaderWarning::DataPastEnd { .. }));
        if !seen {
            let w = HeaderWarning::DataPastEnd {
                declared: self.declared_bytes,
                present: self.frames_read * self.block_align,
            };
            tracing::warn!(path = %self.path.display(), "{w}");
            self.warnings.push(w);
        }
    }
}
