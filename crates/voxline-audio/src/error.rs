//! The error type shared by every part of this crate.

use std::io;
use std::path::PathBuf;

/// The operating system's reason for an I/O error, without Rust's
/// "(os error N)" suffix: what a user reads.
fn io_reason(e: &io::Error) -> String {
    let s = e.to_string();
    s.find(" (os error")
        .map_or(s.clone(), |i| s[..i].to_owned())
}

/// Everything that can go wrong while reading, converting or segmenting audio.
///
/// File-related variants name the file, say what is wrong with it and, where
/// there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AudioError {
    /// The file could not be opened or its header could not be read.
    #[error("cannot read {}: {}; check that the path exists and is readable", .path.display(), io_reason(.source))]
    Open {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },

    /// A stop (Ctrl-C, SIGTERM) came while the input was being opened: a
    /// named pipe's writer, or the header, had not come yet.
    #[error("{}: stopped while waiting for the input", .path.display())]
    Interrupted {
        /// The input.
        path: PathBuf,
    },

    /// The file is not audio voxline recognises (empty, random bytes, text).
    #[error(
        "{} is not a WAV file or other audio voxline reads (MP3, FLAC, Ogg Vorbis, M4A): {reason}; \
         convert it to WAV (e.g. `ffmpeg -i INPUT -ar 16000 -ac 1 OUTPUT.wav`)",
        .path.display()
    )]
    NotWav {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },

    /// An audio format voxline does not decode (AIFF, WebM, …), or a compressed
    /// file whose codec or structure the decoder rejects.
    #[error(
        "{}: cannot read this {format} file ({reason}); convert it to WAV: `ffmpeg -i INPUT -ar 16000 -ac 1 OUTPUT.wav`",
        .path.display()
    )]
    UnsupportedFormat {
        /// The file.
        path: PathBuf,
        /// The format, as its first bytes say.
        format: String,
        /// Why it cannot be read.
        reason: String,
    },

    /// The WAV file uses a sample encoding this reader does not decode.
    #[error(
        "{}: unsupported WAV encoding: {encoding}; supported are PCM integer 8/16/24/32-bit and IEEE float 32-bit — \
         re-encode it (e.g. `sox INPUT -e signed-integer -b 16 OUTPUT.wav`)",
        .path.display()
    )]
    UnsupportedEncoding {
        /// The file.
        path: PathBuf,
        /// The encoding that was found, in words.
        encoding: String,
    },

    /// The WAV header declares a channel count outside `1..=8`.
    #[error(
        "{}: the WAV header declares {channels} channels; 1 to {max} channels are supported — the file is damaged \
         or needs down-mixing first (e.g. `sox INPUT OUTPUT.wav remix -`)",
        .path.display(),
        max = crate::MAX_CHANNELS
    )]
    UnsupportedChannels {
        /// The file.
        path: PathBuf,
        /// The declared channel count.
        channels: u16,
    },

    /// The file declares a sample rate outside `4000..=384000` Hz.
    #[error(
        "{}: the file declares a sample rate of {rate} Hz; {min} to {max} Hz is supported (below {min} Hz it cannot \
         hold speech) — the header is damaged or the file needs resampling (e.g. `sox INPUT -r 16000 OUTPUT.wav`)",
        .path.display(),
        min = crate::MIN_SAMPLE_RATE,
        max = crate::MAX_SAMPLE_RATE
    )]
    UnsupportedSampleRate {
        /// The file.
        path: PathBuf,
        /// The declared rate in Hz.
        rate: u32,
    },

    /// The WAV header is structurally broken (missing or inconsistent chunks).
    #[error("{}: malformed WAV header: {reason}; the file is damaged — re-export or re-record it", .path.display())]
    MalformedHeader {
        /// The file.
        path: PathBuf,
        /// What is inconsistent.
        reason: String,
    },

    /// The audio data ended before the length the header declares.
    ///
    /// [`crate::WavSource::next_chunk`] returns this once, after it has delivered
    /// every complete frame that was present.
    #[error(
        "{}: the audio data is truncated: the header declares {expected_frames} frames but only {frames_read} \
         could be read; the audio up to that point was delivered — re-export the file to get all of it",
        .path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Frames the header declares.
        expected_frames: u64,
        /// Complete frames actually decoded.
        frames_read: u64,
    },

    /// The compressed data ended inside a packet (a file cut short whose
    /// container does not declare its length).
    #[error(
        "{}: the {format} data ends in the middle of a packet after {seconds:.2} s: the file was cut short; the audio up to there was played — copy or export it again to get all of it",
        .path.display()
    )]
    CutShort {
        /// The file.
        path: PathBuf,
        /// The container.
        format: String,
        /// Audio decoded before the cut, s.
        seconds: f64,
    },

    /// Reading or decoding a sample failed for a reason other than truncation.
    #[error(
        "{}: the audio cannot be decoded past {seconds:.2} s ({reason}); the audio up to there was played — re-export the file, or convert it: `ffmpeg -i INPUT -ar 16000 -ac 1 OUTPUT.wav`",
        .path.display()
    )]
    Decode {
        /// The file.
        path: PathBuf,
        /// Audio decoded before the failure, s.
        seconds: f64,
        /// Complete frames decoded before the failure.
        frames_read: u64,
        /// The decoder's description of the failure.
        reason: String,
    },

    /// A live stream format that the resampler cannot handle.
    #[error(
        "unsupported input stream: {sample_rate} Hz, {channels} channels; need 1..={max_rate} Hz and 1..={max_ch} \
         channels — pick another device configuration",
        max_rate = crate::MAX_SAMPLE_RATE,
        max_ch = crate::MAX_CHANNELS
    )]
    InvalidStreamFormat {
        /// Requested sample rate in Hz.
        sample_rate: u32,
        /// Requested channel count.
        channels: u16,
    },

    /// The resampler could not be built for this rate pair.
    #[error("cannot build a resampler from {sample_rate} Hz to 16000 Hz: {source}")]
    ResamplerConstruction {
        /// Input sample rate in Hz.
        sample_rate: u32,
        /// rubato's reason.
        #[source]
        source: rubato::ResamplerConstructionError,
    },

    /// The resampler failed while processing (an internal sizing bug; please report it).
    #[error("resampling failed: {reason}; this is a bug in voxline-audio, please report it")]
    Resample {
        /// What failed.
        reason: String,
    },

    /// Opening or running a live input device failed.
    #[error(transparent)]
    Capture(#[from] crate::capture::CaptureError),

    /// Opening or running an output device failed.
    #[error(transparent)]
    Playback(#[from] crate::playback::PlaybackError),

    /// A [`crate::VadConfig`] field has an unusable value.
    #[error("invalid VAD setting `{field}`: {reason}")]
    InvalidVadConfig {
        /// The offending field's name.
        field: &'static str,
        /// Why it is unusable and what range is accepted.
        reason: String,
    },
}

impl AudioError {
    /// Whose fault it is: every audio error is about an input the user gave
    /// (a file, a stream, a device, a VAD setting).
    #[must_use]
    pub fn fault(&self) -> voxline_core::Fault {
        voxline_core::Fault::Input
    }
}
