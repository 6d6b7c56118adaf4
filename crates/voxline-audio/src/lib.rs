//! Audio input for voxline: WAV replay, down-mixing and resampling to 16 kHz
//! mono, and voice-activity end-pointing.
//!
//! - [`WavSource`] streams an audio file (WAV, MP3, FLAC, Ogg/Vorbis, M4A), a FIFO or
//!   standard input as 16 kHz mono `f32` chunks with bounded memory.
//! - [`StreamResampler`] converts any interleaved `f32` stream (file or live) to 16 kHz mono.
//! - [`Capture`] records a live input device (cpal) into 16 kHz mono [`AudioFrame`](voxline_core::AudioFrame)s;
//!   [`list_input_devices`] lists the devices.
//! - [`Endpointer`] cuts a 16 kHz stream into [`Segment`]s with earshot's detector;
//!   [`SegmentTracker`] is its detector-independent decision logic.
#![warn(missing_docs)]

pub mod aec;
mod barge;
pub mod capture;
mod error;
pub mod mel;
pub mod playback;
mod quiet;
pub mod resample;
pub mod stage;
pub mod turn;
pub mod vad;
pub mod wav;

pub use aec::{
    AecMeter, AecOptions, AecStage, AecSummary, CaptureDeviceChanged, DeviceChange, EchoReference,
    AEC_STAGE,
};
pub use barge::BargeInOptions;
pub use capture::{
    check_input_device, list_input_devices, list_output_devices, Capture, CaptureEnd, CaptureError,
    CaptureFormat, CaptureOptions, CaptureStats, CaptureTiming, ClockGap, InputConfigRange,
    InputDeviceInfo, LatencySummary,
};
pub use error::AudioError;
pub use playback::{
    check_output_device, Cut, Fed, Mark, PlaybackError, Played, PlayedLevel, Speaker,
    SpeakerControl, SpeakerFormat,
};
pub use resample::StreamResampler;
pub use stage::{VadStage, VAD_STAGE, VAD_STAGE_NAME};
pub use vad::{Endpointer, Segment, SegmentTracker, VadConfig, VadStats, FRAME_SAMPLES};
pub use wav::{HeaderWarning, Level, SampleEncoding, WavSource, WavSpec};

/// The sample rate every stage after audio input works at, in Hz.
pub const TARGET_RATE: u32 = voxline_core::SAMPLE_RATE;

/// Lowest accepted file sample rate, in Hz: below it a recording cannot hold
/// speech (telephone audio is 8 kHz).
pub const MIN_SAMPLE_RATE: u32 = 4_000;

/// Highest accepted input sample rate, in Hz.
pub const MAX_SAMPLE_RATE: u32 = 384_000;

/// Most interleaved input channels accepted.
pub const MAX_CHANNELS: u16 = 8;

// Each pipeline stage runs on its own thread, so these must be movable between
// threads; this fails to compile if one stops being `Send`.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<WavSource>();
    assert_send::<StreamResampler>();
    assert_send::<Endpointer>();
    assert_send::<AudioError>();
    assert_send::<Capture>();
};
