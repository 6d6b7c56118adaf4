//! Live capture from an audio input device (a microphone) through cpal.
//!
//! [`Capture::start`] opens an input device in its own default configuration
//! (any sample format, rate and channel count cpal offers), and from then on
//! two threads share the work:
//!
//! - **cpal's audio callback** converts each block to `f32` and copies it,
//!   interleaved, into a lock-free single-producer/single-consumer ring
//!   ([`rtrb`]), together with a small record of the block (its frame count
//!   and the instant it arrived). It never blocks, never allocates and never
//!   takes a lock. When the ring is full it **drops the newest block** (the
//!   one arriving) and counts every dropped frame; an SPSC producer cannot
//!   evict the oldest data. The ring holds [`RING_SECONDS`] of audio, so this
//!   only happens when the consumer stalls for that long.
//! - **the consumer thread** (named `capture`) drains the ring, down-mixes and
//!   resamples to 16 kHz mono with [`StreamResampler`](crate::StreamResampler), and sends
//!   [`AudioFrame`](voxline_core::AudioFrame)s to its output edge. Live pipelines make that edge
//!   [`FullPolicy::DropOldest`](voxline_core::FullPolicy::DropOldest), whose
//!   drops the edge counts itself.
//!
//! # Timestamps
//!
//! Each frame's `start_sample` is a running 16 kHz position; `captured` is the
//! instant its first sample was captured, on the session [`Clock`](voxline_core::Clock). The device
//! says when: cpal hands each callback an [`InputCallbackInfo`](cpal::InputCallbackInfo)
//! whose `capture` and `callback` instants are on the stream's own clock; the
//! callback maps them onto the session clock through the one moment both
//! clocks are read together (`callback` ↔ `Instant::now()` in the callback),
//! so a block's first sample was captured `callback − capture` (the *device
//! latency*, reported) before the callback ran. Where the host gives no usable
//! timestamp, the block's **last** sample is taken to have been captured when
//! the block arrived (a lower bound on the latency, never an overestimate),
//! and blocks are chained sample by sample from there.
//!
//! When the device delivers fewer samples than wall time passed (a suspended
//! source, an overrun the host recovered from), the next block starts later
//! than the previous one ended: beyond a tolerance of a few periods that is a
//! *clock gap*. The capture re-anchors on the device's timestamp, the stream
//! position skips ahead by the gap (the resampler is flushed there), and the
//! gap is counted in [`CaptureTiming`]. After audio was dropped in the ring,
//! the position skips ahead by the dropped duration in the same way, so
//! positions keep tracking real time.
//!
//! # Buffer size
//!
//! The device hands over audio one *period* at a time, and a sample waits up
//! to a period (plus the host's own buffering) before the callback sees it.
//! [`Capture::start_with`] asks for a small period: [`DEFAULT_BUFFER_MS`] or
//! [`CaptureOptions::buffer_ms`], moved into the range the device supports.
//! What the device granted is in [`CaptureFormat`].

mod consumer;
mod devices;
mod drain;
mod error;
mod handle;
mod ring;
mod stream;
#[cfg(test)]
mod test_support;
mod timing;

pub(crate) use devices::device_names;
pub use devices::{
    check_input_device, list_input_devices, list_output_devices, InputConfigRange, InputDeviceInfo,
};
pub use error::CaptureError;
pub use handle::{Capture, CaptureEnd, CaptureFormat, CaptureOptions, CaptureStats};
pub use timing::{CaptureTiming, ClockGap, LatencySummary};

/// Seconds of device audio the callback-to-consumer ring holds.
pub const RING_SECONDS: u32 = 10;

/// The period asked for when [`CaptureOptions::buffer_ms`] is not given, in
/// milliseconds: the smallest the device supports from this up.
pub const DEFAULT_BUFFER_MS: u32 = 10;

/// Largest period [`CaptureOptions::buffer_ms`] accepts, in milliseconds.
pub const MAX_BUFFER_MS: u32 = 1_000;
