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
//!   resamples to 16 kHz mono with [`StreamResampler`], and sends
//!   [`AudioFrame`]s to its output edge. Live pipelines make that edge
//!   [`FullPolicy::DropOldest`](voxline_core::FullPolicy::DropOldest), whose
//!   drops the edge counts itself.
//!
//! # Timestamps
//!
//! Each frame's `start_sample` is a running 16 kHz position; `captured` is the
//! instant its first sample was captured, on the session [`Clock`]. The device
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

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
use cpal::{FromSample, Sample, SampleFormat, SizedSample};
use voxline_core::{AudioFrame, Clock, EdgeSender};

use crate::{AudioError, StreamResampler, MAX_CHANNELS, MAX_SAMPLE_RATE, TARGET_RATE};

/// Seconds of device audio the callback-to-consumer ring holds.
pub const RING_SECONDS: u32 = 10;

/// Block records the ring holds (an upper bound on blocks in flight).
const BLOCK_RECORDS: usize = 8_192;

/// How long the consumer sleeps when the ring is empty. The callback does not
/// wake it (waking could block), so this bounds the added latency.
const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Non-fatal stream error messages kept for [`CaptureStats::stream_errors`].
const MAX_KEPT_ERRORS: usize = 16;

/// The period asked for when [`CaptureOptions::buffer_ms`] is not given, in
/// milliseconds: the smallest the device supports from this up.
pub const DEFAULT_BUFFER_MS: u32 = 10;

/// Largest period [`CaptureOptions::buffer_ms`] accepts, in milliseconds.
pub const MAX_BUFFER_MS: u32 = 1_000;

/// A device timestamp older than this (capture → callback) is taken to be
/// wrong, and the block is placed by its arrival instead.
const MAX_DEVICE_AGE: Duration = Duration::from_secs(10);

/// A block starting later than the previous one ended by more than this (or
/// three of its own durations, if longer) opens a clock gap, when the device
/// timestamps its blocks.
const DEVICE_GAP_SLACK: Duration = Duration::from_millis(60);

/// The same when blocks are placed by their arrival, whose instants jitter
/// with the scheduling of the audio thread.
const ARRIVAL_GAP_SLACK: Duration = Duration::from_millis(400);

/// Clock gaps kept in [`CaptureTiming::gaps`] (all are counted).
const MAX_KEPT_GAPS: usize = 16;

/// Resolution of the device-latency histogram.
const LATENCY_BUCKET_MS: f64 = 0.25;

/// Buckets of the device-latency histogram (larger values land in the last).
const LATENCY_BUCKETS: usize = 8_001;

/// What can go wrong opening or running a live input stream.
///
/// Every message says what was wrong and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The audio host reports no default input device at all.
    #[error(
        "no audio input device found; connect a microphone and check that the system sees it \
         (`arecord -l` on Linux), or replay a WAV file instead"
    )]
    NoInputDevice,

    /// No input device has the requested name.
    #[error(
        "no input device named `{name}`; available input devices: {}; pass one of these names \
         (or none for the default), see `voxline devices`",
        list_or_none(.available)
    )]
    DeviceNotFound {
        /// The name asked for.
        name: String,
        /// Names of the input devices that exist.
        available: Vec<String>,
    },

    /// The device is in use by another program.
    #[error("input device `{device}` is busy: {reason}; close the program using it or pick another device")]
    DeviceBusy {
        /// The device.
        device: String,
        /// The audio host's description.
        reason: String,
    },

    /// The device exists but could not be opened (gone, no permission, host down…).
    #[error(
        "cannot open input device `{device}`: {reason}; check that it is plugged in and that this user \
         may use it (on Linux: member of the `audio` group), or pick another device"
    )]
    CannotOpen {
        /// The device.
        device: String,
        /// The audio host's description.
        reason: String,
    },

    /// The device's configuration cannot be captured from.
    #[error(
        "input device `{device}` has no usable input configuration: {reason}; pick another device"
    )]
    UnsupportedConfig {
        /// The device.
        device: String,
        /// What is unsupported.
        reason: String,
    },

    /// The stream was opened but failed to start or run.
    #[error(
        "the input stream of `{device}` failed: {reason}; check the device and restart the capture"
    )]
    Stream {
        /// The device.
        device: String,
        /// The audio host's description.
        reason: String,
    },

    /// The audio host could not list its devices.
    #[error("cannot list audio input devices: {reason}; check the audio system (ALSA/PulseAudio) is working")]
    Enumerate {
        /// The audio host's description.
        reason: String,
    },

    /// The consumer thread could not be started.
    #[error("cannot start the capture thread: {0}; the system is out of threads or memory")]
    Spawn(#[source] std::io::Error),
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "(none)".to_owned()
    } else {
        names.join(", ")
    }
}

/// One range of configurations an input device supports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputConfigRange {
    /// Interleaved channels.
    pub channels: u16,
    /// Lowest sample rate in Hz.
    pub min_sample_rate: u32,
    /// Highest sample rate in Hz.
    pub max_sample_rate: u32,
    /// Sample format as cpal names it (`i16`, `f32`, …).
    pub sample_format: String,
}

/// An input device as [`list_input_devices`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputDeviceInfo {
    /// The host's identifier (an ALSA PCM name such as `default` or
    /// `hw:CARD=0,DEV=0`); [`Capture::start`] accepts it.
    pub id: String,
    /// The human-readable name (the first line of the host's description;
    /// the id where there is none); [`Capture::start`] accepts it too.
    pub name: String,
    /// Whether this is the host's default input device.
    pub is_default: bool,
    /// The device's default input configuration, when it could be read.
    pub default_config: Option<InputConfigRange>,
    /// The supported input configurations (empty when they could not be read).
    pub configs: Vec<InputConfigRange>,
    /// Why the configurations could not be read (device busy, cannot be
    /// opened…), if they could not.
    pub config_error: Option<String>,
}

impl InputDeviceInfo {
    /// Whether it can be captured from here: its input configurations could
    /// be read and there is at least one.
    #[must_use]
    pub fn is_usable(&self) -> bool {
        self.config_error.is_none() && !self.configs.is_empty()
    }
}

/// The device and configuration a [`Capture`] runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureFormat {
    /// The device's identifier.
    pub device_id: String,
    /// The device's human-readable name.
    pub device_name: String,
    /// The device sample rate in Hz.
    pub sample_rate: u32,
    /// Interleaved device channels.
    pub channels: u16,
    /// The device sample format (`i16`, `f32`, …), converted to `f32`.
    pub sample_format: String,
    /// The period asked for, in device frames (`None`: the device's default,
    /// after it refused the one asked for).
    pub buffer_requested_frames: Option<u32>,
    /// The period the device granted, in device frames (`None`: the host
    /// cannot say).
    pub buffer_frames: Option<u32>,
    /// The device's supported period range in frames, when it says.
    pub buffer_supported: Option<(u32, u32)>,
    /// Why the period asked for differs from the one wanted (moved into the
    /// supported range, or refused), if it does.
    pub buffer_note: Option<String>,
}

impl CaptureFormat {
    /// The granted period in milliseconds, when the host says.
    #[must_use]
    pub fn buffer_ms(&self) -> Option<f64> {
        self.buffer_frames
            .map(|f| f64::from(f) * 1000.0 / f64::from(self.sample_rate.max(1)))
    }
}

/// How to open a [`Capture`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureOptions {
    /// The period (audio per callback) to ask the device for, in
    /// milliseconds; `None`: the smallest it supports from
    /// [`DEFAULT_BUFFER_MS`] up. Moved into the device's supported range.
    pub buffer_ms: Option<u32>,
}

/// Percentiles of a latency, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Values.
    pub n: u64,
    /// Smallest.
    pub min: f64,
    /// Median (±0.25 ms).
    pub p50: f64,
    /// 95th percentile (±0.25 ms).
    pub p95: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// A stretch of wall time the device delivered no audio for.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ClockGap {
    /// The 16 kHz stream position where it begins (the positions skip it).
    pub at_sample: u64,
    /// How long it was, in milliseconds.
    pub ms: f64,
}

/// How a capture placed its audio in time (see the module's *Timestamps*).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct CaptureTiming {
    /// Blocks placed by the device's capture timestamp.
    pub blocks_device_timed: u64,
    /// Blocks placed by their arrival (the host gave no usable timestamp).
    pub blocks_arrival_timed: u64,
    /// Device latency: capture of a block's first sample → its callback, as
    /// the device timestamps it (`None` when no block had a timestamp).
    pub device_latency_ms: Option<LatencySummary>,
    /// Clock gaps: times the device delivered fewer samples than wall time.
    pub clock_gaps: u64,
    /// Their total length, in milliseconds.
    pub clock_gap_ms: f64,
    /// The first 16 of them.
    pub gaps: Vec<ClockGap>,
}

/// Why the consumer thread ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CaptureEnd {
    /// [`Capture::stop`] (or dropping the [`Capture`]) ended it.
    Stopped,
    /// Every receiver of the output edge was gone.
    OutputDisconnected,
    /// The device went away or the stream broke.
    StreamFailed {
        /// What the audio host reported.
        reason: String,
    },
    /// Resampling failed (a bug in this crate).
    Internal {
        /// What failed.
        reason: String,
    },
}

/// Counters of one capture session, returned by [`Capture::stop`].
#[derive(Debug, Clone, PartialEq)]
pub struct CaptureStats {
    /// Device frames (one sample per channel) accepted into the ring.
    pub frames_captured: u64,
    /// Device frames the callback dropped because the ring was full.
    pub frames_dropped_in_ring: u64,
    /// Overruns (xruns) the audio host reported: audio lost before the callback.
    pub overruns: u64,
    /// 16 kHz mono samples sent to the output edge.
    pub samples_sent: u64,
    /// [`AudioFrame`]s sent to the output edge.
    pub frames_sent: u64,
    /// The 16 kHz stream position just past everything the device delivered,
    /// dropped audio included: where the next sample would have been.
    pub end_sample: u64,
    /// Non-fatal stream errors reported by the host (at most 16 kept).
    pub stream_errors: Vec<String>,
    /// How the audio was placed in time: device latency, clock gaps.
    pub timing: CaptureTiming,
    /// Why the capture ended.
    pub end: CaptureEnd,
}

/// Counters shared by the callback, the consumer and [`Capture`].
#[derive(Debug, Default)]
struct Counters {
    captured: AtomicU64,
    dropped: AtomicU64,
    overruns: AtomicU64,
}

/// When a block was captured, as its callback saw it.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    /// When the callback ran, on the session clock.
    arrived: Instant,
    /// Capture of the block's first sample → the callback, from the device's
    /// timestamps; `None` when the host gave no usable one.
    age: Option<Duration>,
}

impl Stamp {
    /// The stamp of a callback running now, with cpal's timestamps: the
    /// stream's instants are placed on the session clock through `now`.
    fn device(now: Instant, ts: cpal::InputStreamTimestamp) -> Stamp {
        Stamp {
            arrived: now,
            age: device_age(ts.callback, ts.capture),
        }
    }
}

/// `callback − capture`, when it is a plausible device latency: a zero
/// `capture` (cpal's floor when it could not subtract), a capture at or
/// after the callback (a host that reports none) or one older than
/// [`MAX_DEVICE_AGE`] is not.
fn device_age(callback: cpal::StreamInstant, capture: cpal::StreamInstant) -> Option<Duration> {
    if capture == cpal::StreamInstant::ZERO {
        return None;
    }
    callback
        .checked_duration_since(capture)
        .filter(|age| !age.is_zero() && *age <= MAX_DEVICE_AGE)
}

/// What the callback records about each block it put in the ring.
#[derive(Debug, Clone, Copy)]
struct Block {
    /// Device frames in the block.
    frames: usize,
    /// When it was captured.
    stamp: Stamp,
    /// Device frames dropped immediately before this block.
    gap_before: u64,
}

/// The callback's side of the ring. Nothing here allocates, blocks or locks.
struct BlockWriter {
    samples: rtrb::Producer<f32>,
    blocks: rtrb::Producer<Block>,
    channels: usize,
    /// Frames dropped since the last block that was written.
    pending_gap: u64,
    counters: Arc<Counters>,
}

impl BlockWriter {
    /// Copies one interleaved block into the ring as `f32`, or drops it whole
    /// (counting its frames) when the ring lacks room for it.
    fn write<T>(&mut self, data: &[T], stamp: Stamp)
    where
        T: Sample,
        f32: FromSample<T>,
    {
        let frames = data.len() / self.channels;
        if frames == 0 {
            return;
        }
        let n = frames * self.channels;
        let fits = self.blocks.slots() > 0 && self.samples.slots() >= n;
        let written = fits
            && match self.samples.write_chunk_uninit(n) {
                Ok(chunk) => {
                    chunk.fill_from_iter(data[..n].iter().map(|&s| f32::from_sample_(s)));
                    true
                }
                Err(_) => false,
            };
        if !written {
            self.pending_gap += frames as u64;
            self.counters
                .dropped
                .fetch_add(frames as u64, Ordering::Relaxed);
            return;
        }
        // A slot was free above and only this side fills the ring.
        let _ = self.blocks.push(Block {
            frames,
            stamp,
            gap_before: std::mem::take(&mut self.pending_gap),
        });
        self.counters
            .captured
            .fetch_add(frames as u64, Ordering::Relaxed);
    }
}

/// Builds the ring for `rate` Hz × `channels`, holding `seconds` of audio.
fn ring(
    rate: u32,
    channels: u16,
    seconds: u32,
    counters: Arc<Counters>,
    clock: Clock,
) -> Result<(BlockWriter, Drainer), AudioError> {
    let capacity = (rate as usize)
        .saturating_mul(usize::from(channels))
        .saturating_mul(seconds as usize)
        .max(1);
    let (sample_tx, sample_rx) = rtrb::RingBuffer::new(capacity);
    let (block_tx, block_rx) = rtrb::RingBuffer::new(BLOCK_RECORDS);
    let writer = BlockWriter {
        samples: sample_tx,
        blocks: block_tx,
        channels: usize::from(channels),
        pending_gap: 0,
        counters,
    };
    let drainer = Drainer {
        samples: sample_rx,
        blocks: block_rx,
        channels: usize::from(channels),
        rate,
        resampler: StreamResampler::new(rate, channels)?,
        run_base: 0,
        run_in: 0,
        run_out: 0,
        last_end: None,
        buf: Vec::new(),
        clock,
        samples_sent: 0,
        frames_sent: 0,
        gap_frames: 0,
        timing: TimingAcc::new(),
    };
    Ok((writer, drainer))
}

/// Why draining stopped early.
#[derive(Debug)]
enum DrainStop {
    Disconnected,
    Internal(String),
}

impl From<AudioError> for DrainStop {
    fn from(e: AudioError) -> Self {
        DrainStop::Internal(e.to_string())
    }
}

/// The consumer's side of the ring: resampling, stamping and sending.
struct Drainer {
    samples: rtrb::Consumer<f32>,
    blocks: rtrb::Consumer<Block>,
    channels: usize,
    rate: u32,
    resampler: StreamResampler,
    /// 16 kHz position of the first sample of the current run (audio since
    /// the start or the last gap).
    run_base: u64,
    /// Device frames fed to the resampler in this run.
    run_in: u64,
    /// 16 kHz samples emitted in this run.
    run_out: u64,
    /// When the sample just past the last block was (would have been) captured.
    last_end: Option<Instant>,
    buf: Vec<f32>,
    clock: Clock,
    samples_sent: u64,
    frames_sent: u64,
    /// Dropped device frames already accounted for as gaps.
    gap_frames: u64,
    timing: TimingAcc,
}

impl Drainer {
    /// Processes the blocks in the ring now (not those arriving meanwhile, so
    /// that a fast device cannot keep it busy forever); returns whether there
    /// were any.
    fn drain(&mut self, out: &EdgeSender<AudioFrame>) -> Result<bool, DrainStop> {
        let queued = self.blocks.slots();
        for _ in 0..queued {
            let Ok(block) = self.blocks.pop() else { break };
            if block.gap_before > 0 {
                self.end_run(out)?;
                self.run_base += rate_convert(block.gap_before, self.rate);
                self.gap_frames += block.gap_before;
            }
            self.place(&block, out)?;
            let n = block.frames * self.channels;
            let chunk = self
                .samples
                .read_chunk(n)
                .map_err(|e| DrainStop::Internal(format!("capture ring out of step: {e}")))?;
            let (a, b) = chunk.as_slices();
            self.resampler.process(a, &mut self.buf)?;
            self.resampler.process(b, &mut self.buf)?;
            chunk.commit_all();
            self.run_in += block.frames as u64;
            self.emit(out)?;
        }
        Ok(queued > 0)
    }

    /// Places `block` in time: sets [`Drainer::last_end`] to the capture
    /// instant just past its last sample and, when it starts later than the
    /// previous block ended by more than the jitter allows, ends the run
    /// there and skips the positions ahead by the gap.
    fn place(&mut self, block: &Block, out: &EdgeSender<AudioFrame>) -> Result<(), DrainStop> {
        let rate = f64::from(self.rate);
        let dur = Duration::from_secs_f64(block.frames as f64 / rate);
        let arrived = block.stamp.arrived;
        // Where the previous block says this one starts (after any ring drop).
        let expected = self
            .last_end
            .map(|e| e + Duration::from_secs_f64(block.gap_before as f64 / rate));
        // When the block started, and the slack its jitter needs.
        let (start, slack) = match block.stamp.age {
            Some(age) => {
                self.timing.device_timed(age);
                (
                    arrived.checked_sub(age).unwrap_or(arrived),
                    DEVICE_GAP_SLACK,
                )
            }
            None => {
                self.timing.blocks_arrival_timed += 1;
                // its last sample at arrival
                (
                    arrived.checked_sub(dur).unwrap_or(arrived),
                    ARRIVAL_GAP_SLACK,
                )
            }
        };
        let gap = expected
            .filter(|&e| start > e + slack.max(dur * 3))
            .map(|e| start - e);
        if let Some(gap) = gap {
            self.end_run(out)?;
            self.timing.gap(self.run_base, gap);
            self.run_base += (gap.as_secs_f64() * f64::from(TARGET_RATE)).round() as u64;
        }
        let end = match (block.stamp.age, expected) {
            // the last sample cannot have been captured after the callback ran
            (Some(_), _) => (start + dur).min(arrived),
            // Arrival instants only ever run late: chain on from the previous
            // block unless that puts the end after the arrival; a chain that
            // lags arrival is pulled towards it slowly, so it follows a device
            // clock that runs slow without taking on the jitter.
            (None, Some(e)) if gap.is_none() && e + dur < arrived => {
                let chained = e + dur;
                chained + (arrived - chained) / 16
            }
            (None, _) => arrived,
        };
        self.last_end = Some(end);
        Ok(())
    }

    /// The stream position after the last emitted sample plus the frames
    /// dropped after the last block (`dropped_total` counts all drops).
    fn end_sample(&self, dropped_total: u64) -> u64 {
        let trailing = dropped_total.saturating_sub(self.gap_frames);
        self.run_base + self.run_out + rate_convert(trailing, self.rate)
    }

    /// Processes blocks until the ring is empty (once the stream is stopped).
    fn drain_all(&mut self, out: &EdgeSender<AudioFrame>) -> Result<(), DrainStop> {
        while self.drain(out)? {}
        Ok(())
    }

    /// Flushes the resampler and emits the tail of the current run; the next
    /// run starts where this one ended.
    fn end_run(&mut self, out: &EdgeSender<AudioFrame>) -> Result<(), DrainStop> {
        self.resampler.flush(&mut self.buf)?;
        self.emit(out)?;
        self.run_base += self.run_out;
        self.run_in = 0;
        self.run_out = 0;
        Ok(())
    }

    /// Sends what is in `buf` as one frame, stamped with its capture instant.
    fn emit(&mut self, out: &EdgeSender<AudioFrame>) -> Result<(), DrainStop> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let arrived = self.last_end.unwrap_or_else(|| self.clock.now());
        // Audio between this frame's first sample and the end of the last block.
        let behind = self.run_in as f64 / f64::from(self.rate)
            - self.run_out as f64 / f64::from(TARGET_RATE);
        let captured = arrived
            .checked_sub(Duration::from_secs_f64(behind.max(0.0)))
            .unwrap_or(arrived);
        let samples = std::mem::take(&mut self.buf);
        let len = samples.len() as u64;
        let frame = AudioFrame {
            start_sample: self.run_base + self.run_out,
            samples,
            captured,
            new_recording: false,
        };
        self.run_out += len;
        out.send(frame).map_err(|_| DrainStop::Disconnected)?;
        self.samples_sent += len;
        self.frames_sent += 1;
        Ok(())
    }
}

/// The consumer's tally of [`CaptureTiming`].
struct TimingAcc {
    blocks_device_timed: u64,
    blocks_arrival_timed: u64,
    /// Device latencies in [`LATENCY_BUCKET_MS`] buckets.
    latency: Vec<u32>,
    latency_min: f64,
    latency_max: f64,
    latency_sum: f64,
    clock_gaps: u64,
    clock_gap_ms: f64,
    gaps: Vec<ClockGap>,
}

impl TimingAcc {
    fn new() -> TimingAcc {
        TimingAcc {
            blocks_device_timed: 0,
            blocks_arrival_timed: 0,
            latency: vec![0; LATENCY_BUCKETS],
            latency_min: f64::INFINITY,
            latency_max: 0.0,
            latency_sum: 0.0,
            clock_gaps: 0,
            clock_gap_ms: 0.0,
            gaps: Vec::new(),
        }
    }

    fn device_timed(&mut self, age: Duration) {
        self.blocks_device_timed += 1;
        let ms = age.as_secs_f64() * 1000.0;
        let bucket = ((ms / LATENCY_BUCKET_MS).round() as usize).min(LATENCY_BUCKETS - 1);
        self.latency[bucket] = self.latency[bucket].saturating_add(1);
        self.latency_min = self.latency_min.min(ms);
        self.latency_max = self.latency_max.max(ms);
        self.latency_sum += ms;
    }

    fn gap(&mut self, at_sample: u64, gap: Duration) {
        let ms = gap.as_secs_f64() * 1000.0;
        self.clock_gaps += 1;
        self.clock_gap_ms += ms;
        if self.gaps.len() < MAX_KEPT_GAPS {
            self.gaps.push(ClockGap { at_sample, ms });
        }
    }

    /// The bucket value at quantile `q`, clamped into the exact min and max.
    fn quantile(&self, q: f64) -> f64 {
        let n = self.blocks_device_timed;
        let rank = ((q * n as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.latency.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return (i as f64 * LATENCY_BUCKET_MS).clamp(self.latency_min, self.latency_max);
            }
        }
        self.latency_max
    }

    fn summary(&self) -> CaptureTiming {
        let n = self.blocks_device_timed;
        CaptureTiming {
            blocks_device_timed: n,
            blocks_arrival_timed: self.blocks_arrival_timed,
            device_latency_ms: (n > 0).then(|| LatencySummary {
                n,
                min: self.latency_min,
                p50: self.quantile(0.5),
                p95: self.quantile(0.95),
                max: self.latency_max,
                mean: self.latency_sum / n as f64,
            }),
            clock_gaps: self.clock_gaps,
            clock_gap_ms: self.clock_gap_ms,
            gaps: self.gaps.clone(),
        }
    }
}

/// `frames` at `rate` Hz as a count of 16 kHz samples, rounded.
fn rate_convert(frames: u64, rate: u32) -> u64 {
    let num = u128::from(frames) * u128::from(TARGET_RATE);
    let den = u128::from(rate.max(1));
    u64::try_from((num + den / 2) / den).unwrap_or(u64::MAX)
}

/// Lists the host's input devices with their supported configurations.
///
/// A device whose configurations cannot be read (busy, no permission) is
/// still listed, with [`InputDeviceInfo::config_error`] saying why.
///
/// # Errors
///
/// [`CaptureError::Enumerate`] (inside [`AudioError::Capture`]) when the audio
/// host cannot list its devices.
pub fn list_input_devices() -> Result<Vec<InputDeviceInfo>, AudioError> {
    crate::quiet::silence_audio_libraries();
    let host = cpal::default_host();
    let default_id = host
        .default_input_device()
        .and_then(|d| d.id().ok())
        .map(|id| id.id().to_owned());
    let devices = host.input_devices().map_err(|e| CaptureError::Enumerate {
        reason: e.to_string(),
    })?;
    let mut list = Vec::new();
    for device in devices {
        let (id, name) = device_names(&device);
        let (configs, config_error) = match device.supported_input_configs() {
            Ok(ranges) => (ranges.map(|r| config_range(&r)).collect(), None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        let default_config = device
            .default_input_config()
            .ok()
            .map(|c| InputConfigRange {
                channels: c.channels(),
                min_sample_rate: c.sample_rate(),
                max_sample_rate: c.sample_rate(),
                sample_format: c.sample_format().to_string(),
            });
        list.push(InputDeviceInfo {
            is_default: default_id.as_deref() == Some(id.as_str()),
            id,
            name,
            default_config,
            configs,
            config_error,
        });
    }
    Ok(list)
}

fn config_range(r: &cpal::SupportedStreamConfigRange) -> InputConfigRange {
    InputConfigRange {
        channels: r.channels(),
        min_sample_rate: r.min_sample_rate(),
        max_sample_rate: r.max_sample_rate(),
        sample_format: r.sample_format().to_string(),
    }
}

/// The device's `(id, human-readable name)`; either falls back to the other.
fn device_names(device: &cpal::Device) -> (String, String) {
    let id = device.id().ok().map(|id| id.id().to_owned());
    let name = device.description().ok().map(|d| d.name().to_owned());
    match (id, name) {
        (Some(id), Some(name)) => (id, name),
        (Some(id), None) => (id.clone(), id),
        (None, Some(name)) => (name.clone(), name),
        (None, None) => ("(unnamed)".to_owned(), "(unnamed)".to_owned()),
    }
}

/// Finds the input device `wanted` (by id first, then by name) or the default.
fn find_device(host: &cpal::Host, wanted: Option<&str>) -> Result<cpal::Device, CaptureError> {
    let Some(wanted) = wanted else {
        return host
            .default_input_device()
            .ok_or(CaptureError::NoInputDevice);
    };
    let mut devices: Vec<cpal::Device> = host
        .input_devices()
        .map_err(|e| CaptureError::Enumerate {
            reason: e.to_string(),
        })?
        .collect();
    let names: Vec<(String, String)> = devices.iter().map(device_names).collect();
    let by_id = names.iter().position(|(id, _)| id == wanted);
    let by_name = || names.iter().position(|(_, name)| name == wanted);
    match by_id.or_else(by_name) {
        Some(i) => Ok(devices.swap_remove(i)),
        None => Err(CaptureError::DeviceNotFound {
            name: wanted.to_owned(),
            available: names
                .into_iter()
                .map(|(id, name)| {
                    if id == name {
                        id
                    } else {
                        format!("{id} ({name})")
                    }
                })
                .collect(),
        }),
    }
}

/// The period to ask for, in device frames at `rate`: `wanted_ms` (default
/// [`DEFAULT_BUFFER_MS`]) moved into the `supported` range, with a note when
/// a period the caller asked for had to be moved.
fn choose_period(
    rate: u32,
    supported: &cpal::SupportedBufferSize,
    wanted_ms: Option<u32>,
) -> (u32, Option<String>) {
    let ms = wanted_ms
        .unwrap_or(DEFAULT_BUFFER_MS)
        .clamp(1, MAX_BUFFER_MS);
    let frames = u32::try_from((u64::from(rate) * u64::from(ms)).div_ceil(1000))
        .unwrap_or(u32::MAX)
        .max(1);
    match *supported {
        cpal::SupportedBufferSize::Range { min, max } if min.max(1) <= max => {
            let chosen = frames.clamp(min.max(1), max);
            let note = (wanted_ms.is_some() && chosen != frames).then(|| {
                let to_ms = |f: u32| f64::from(f) * 1000.0 / f64::from(rate.max(1));
                format!(
                    "{ms} ms is {frames} frames at {rate} Hz, outside the device's {min}–{max} frames \
                     ({:.1}–{:.1} ms): {chosen} frames ({:.1} ms) asked for",
                    to_ms(min),
                    to_ms(max),
                    to_ms(chosen)
                )
            });
            (chosen, note)
        }
        _ => (frames, None),
    }
}

/// Maps a cpal error met while opening `device` to a [`CaptureError`].
fn open_error(device: &str, e: &cpal::Error) -> CaptureError {
    use cpal::ErrorKind as K;
    let device = device.to_owned();
    // cpal's sentences end with a full stop; ours goes on after a semicolon
    let reason = e.to_string().trim_end().trim_end_matches('.').to_owned();
    match e.kind() {
        K::DeviceBusy => CaptureError::DeviceBusy { device, reason },
        K::UnsupportedConfig | K::UnsupportedOperation | K::InvalidInput => {
            CaptureError::UnsupportedConfig { device, reason }
        }
        _ => CaptureError::CannotOpen { device, reason },
    }
}

/// Whether a stream error ends the capture.
fn is_fatal(kind: cpal::ErrorKind) -> bool {
    use cpal::ErrorKind as K;
    matches!(
        kind,
        K::DeviceNotAvailable | K::StreamInvalidated | K::HostUnavailable | K::PermissionDenied
    )
}

/// A running live capture. Stop it with [`Capture::stop`]; dropping it stops
/// it too (discarding the statistics).
pub struct Capture {
    format: CaptureFormat,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<CaptureStats>>,
}

impl fmt::Debug for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capture")
            .field("format", &self.format)
            .field("running", &!self.is_finished())
            .finish_non_exhaustive()
    }
}

/// Checks that `device` (as [`Capture::start`] takes it) exists and reports
/// a default input configuration, without starting a stream: lets a caller
/// refuse a missing device before any expensive set-up (loading models).
///
/// # Errors
/// As [`Capture::start`]: [`CaptureError::NoInputDevice`],
/// [`CaptureError::DeviceNotFound`], [`CaptureError::DeviceBusy`],
/// [`CaptureError::CannotOpen`], [`CaptureError::UnsupportedConfig`].
pub fn check_input_device(device: Option<&str>) -> Result<(), AudioError> {
    crate::quiet::silence_audio_libraries();
    let host = cpal::default_host();
    let device = find_device(&host, device)?;
    let (device_id, _) = device_names(&device);
    device
        .default_input_config()
        .map_err(|e| open_error(&device_id, &e))?;
    Ok(())
}

impl Capture {
    /// [`Capture::start_with`] with the default [`CaptureOptions`].
    ///
    /// # Errors
    ///
    /// As [`Capture::start_with`].
    pub fn start(
        device: Option<&str>,
        out: EdgeSender<AudioFrame>,
        clock: Clock,
    ) -> Result<Capture, AudioError> {
        Capture::start_with(device, &CaptureOptions::default(), out, clock)
    }

    /// Opens `device` (an exact id or name from [`list_input_devices`]; the
    /// host's default input when `None`) in its default rate, channels and
    /// sample format, with a small period ([`CaptureOptions::buffer_ms`]),
    /// and starts sending 16 kHz mono [`AudioFrame`]s to `out`, stamped on
    /// `clock` from the device's own timestamps.
    ///
    /// A device that refuses the period asked for is opened with its default
    /// one instead ([`CaptureFormat::buffer_note`] says so). Capture ends at
    /// [`Capture::stop`], when every receiver of `out` is gone, or when the
    /// device goes away.
    ///
    /// # Errors
    ///
    /// [`AudioError::Capture`] with [`CaptureError::NoInputDevice`],
    /// [`CaptureError::DeviceNotFound`] (listing the devices that exist),
    /// [`CaptureError::DeviceBusy`], [`CaptureError::CannotOpen`],
    /// [`CaptureError::UnsupportedConfig`], [`CaptureError::Stream`] (the
    /// stream would not start) or [`CaptureError::Spawn`].
    pub fn start_with(
        device: Option<&str>,
        options: &CaptureOptions,
        out: EdgeSender<AudioFrame>,
        clock: Clock,
    ) -> Result<Capture, AudioError> {
        crate::quiet::silence_audio_libraries();
        let host = cpal::default_host();
        let device = find_device(&host, device)?;
        let (device_id, device_name) = device_names(&device);
        let supported = device
            .default_input_config()
            .map_err(|e| open_error(&device_id, &e))?;
        let mut config = supported.config();
        let sample_format = supported.sample_format();
        if config.sample_rate == 0
            || config.sample_rate > MAX_SAMPLE_RATE
            || config.channels == 0
            || config.channels > MAX_CHANNELS
        {
            return Err(CaptureError::UnsupportedConfig {
                device: device_id,
                reason: format!(
                    "{} Hz with {} channels (supported: up to {MAX_SAMPLE_RATE} Hz and {MAX_CHANNELS} channels)",
                    config.sample_rate, config.channels
                ),
            }
            .into());
        }
        let (period, mut buffer_note) = choose_period(
            config.sample_rate,
            supported.buffer_size(),
            options.buffer_ms,
        );
        let buffer_supported = match *supported.buffer_size() {
            cpal::SupportedBufferSize::Range { min, max } => Some((min, max)),
            cpal::SupportedBufferSize::Unknown => None,
        };

        let counters = Arc::new(Counters::default());
        let (err_tx, err_rx) = mpsc::sync_channel::<cpal::Error>(MAX_KEPT_ERRORS);
        let open = |config: cpal::StreamConfig| -> Result<(cpal::Stream, Drainer), AudioError> {
            let (writer, drainer) = ring(
                config.sample_rate,
                config.channels,
                RING_SECONDS,
                Arc::clone(&counters),
                clock,
            )?;
            let stream = build_stream(
                &device,
                &device_id,
                config,
                sample_format,
                writer,
                err_tx.clone(),
                Arc::clone(&counters),
                clock,
            )?;
            Ok((stream, drainer))
        };
        config.buffer_size = cpal::BufferSize::Fixed(period);
        let mut requested = Some(period);
        let (stream, drainer) = match open(config) {
            Ok(opened) => opened,
            Err(AudioError::Capture(CaptureError::UnsupportedConfig { reason, .. })) => {
                buffer_note = Some(format!(
                    "the device refused a {period}-frame period ({reason}); its default is used"
                ));
                requested = None;
                config.buffer_size = cpal::BufferSize::Default;
                open(config)?
            }
            Err(e) => return Err(e),
        };
        let format = CaptureFormat {
            device_id: device_id.clone(),
            device_name,
            sample_rate: config.sample_rate,
            channels: config.channels,
            sample_format: sample_format.to_string(),
            buffer_requested_frames: requested,
            buffer_frames: stream.buffer_size().ok().filter(|&f| f > 0),
            buffer_supported,
            buffer_note,
        };
        stream.play().map_err(|e| CaptureError::Stream {
            device: device_id.clone(),
            reason: e.to_string(),
        })?;

        let stop = Arc::new(AtomicBool::new(false));
        let consumer = Consumer {
            stream: Some(stream),
            drainer,
            out,
            errors: err_rx,
            stop: Arc::clone(&stop),
            counters: Arc::clone(&counters),
        };
        let thread = thread::Builder::new()
            .name("capture".to_owned())
            .spawn(move || consumer.run())
            .map_err(CaptureError::Spawn)?;
        Ok(Capture {
            format,
            counters,
            stop,
            thread: Some(thread),
        })
    }

    /// The device and configuration in use.
    #[must_use]
    pub fn format(&self) -> &CaptureFormat {
        &self.format
    }

    /// Device frames dropped so far because the ring was full.
    #[must_use]
    pub fn frames_dropped_in_ring(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// Device frames accepted into the ring so far.
    #[must_use]
    pub fn frames_captured(&self) -> u64 {
        self.counters.captured.load(Ordering::Relaxed)
    }

    /// Whether the consumer thread has ended on its own (output edge gone or
    /// stream failed); [`Capture::stop`] then returns at once with the reason.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stops the stream, sends what is left in the ring (and the resampler's
    /// tail) to the output edge, joins the consumer thread and returns the
    /// session's counters.
    #[must_use]
    pub fn stop(mut self) -> CaptureStats {
        self.stop.store(true, Ordering::Release);
        let joined = self.thread.take().map(JoinHandle::join);
        match joined {
            Some(Ok(stats)) => stats,
            Some(Err(_)) | None => CaptureStats {
                frames_captured: self.frames_captured(),
                frames_dropped_in_ring: self.frames_dropped_in_ring(),
                overruns: self.counters.overruns.load(Ordering::Relaxed),
                samples_sent: 0,
                frames_sent: 0,
                end_sample: 0,
                stream_errors: Vec::new(),
                timing: CaptureTiming::default(),
                end: CaptureEnd::Internal {
                    reason: "the capture thread panicked".to_owned(),
                },
            },
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Builds the cpal input stream whose callback feeds `writer`.
#[allow(clippy::too_many_arguments)]
fn build_stream(
    device: &cpal::Device,
    device_id: &str,
    config: cpal::StreamConfig,
    format: SampleFormat,
    writer: BlockWriter,
    errors: SyncSender<cpal::Error>,
    counters: Arc<Counters>,
    clock: Clock,
) -> Result<cpal::Stream, CaptureError> {
    fn typed<T>(
        device: &cpal::Device,
        config: cpal::StreamConfig,
        mut writer: BlockWriter,
        errors: SyncSender<cpal::Error>,
        counters: Arc<Counters>,
        clock: Clock,
    ) -> Result<cpal::Stream, cpal::Error>
    where
        T: SizedSample,
        f32: FromSample<T>,
    {
        device.build_input_stream::<T, _, _>(
            config,
            move |data: &[T], info: &cpal::InputCallbackInfo| {
                writer.write(data, Stamp::device(clock.now(), info.timestamp()));
            },
            move |e: cpal::Error| {
                if e.kind() == cpal::ErrorKind::Xrun {
                    counters.overruns.fetch_add(1, Ordering::Relaxed);
                } else {
                    // Full means the consumer already has plenty to report.
                    let _ = errors.try_send(e);
                }
            },
            None,
        )
    }
    let built = match format {
        SampleFormat::I8 => typed::<i8>(device, config, writer, errors, counters, clock),
        SampleFormat::I16 => typed::<i16>(device, config, writer, errors, counters, clock),
        SampleFormat::I24 => typed::<cpal::I24>(device, config, writer, errors, counters, clock),
        SampleFormat::I32 => typed::<i32>(device, config, writer, errors, counters, clock),
        SampleFormat::I64 => typed::<i64>(device, config, writer, errors, counters, clock),
        SampleFormat::U8 => typed::<u8>(device, config, writer, errors, counters, clock),
        SampleFormat::U16 => typed::<u16>(device, config, writer, errors, counters, clock),
        SampleFormat::U24 => typed::<cpal::U24>(device, config, writer, errors, counters, clock),
        SampleFormat::U32 => typed::<u32>(device, config, writer, errors, counters, clock),
        SampleFormat::U64 => typed::<u64>(device, config, writer, errors, counters, clock),
        SampleFormat::F32 => typed::<f32>(device, config, writer, errors, counters, clock),
        SampleFormat::F64 => typed::<f64>(device, config, writer, errors, counters, clock),
        other => {
            return Err(CaptureError::UnsupportedConfig {
                device: device_id.to_owned(),
                reason: format!("sample format {other} is not PCM audio"),
            })
        }
    };
    built.map_err(|e| open_error(device_id, &e))
}

/// The consumer thread's state.
struct Consumer {
    stream: Option<cpal::Stream>,
    drainer: Drainer,
    out: EdgeSender<AudioFrame>,
    errors: Receiver<cpal::Error>,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

impl Consumer {
    fn run(mut self) -> CaptureStats {
        let mut kept = Vec::new();
        let mut end = None;
        while end.is_none() {
            let stopping = self.stop.load(Ordering::Acquire);
            for e in self.errors.try_iter() {
                if is_fatal(e.kind()) {
                    end = Some(CaptureEnd::StreamFailed {
                        reason: e.to_string(),
                    });
                } else if kept.len() < MAX_KEPT_ERRORS {
                    kept.push(e.to_string());
                }
            }
            if end.is_some() {
                break;
            }
            if stopping {
                end = Some(CaptureEnd::Stopped);
                break;
            }
            match self.drainer.drain(&self.out) {
                Ok(true) => {}
                Ok(false) => thread::sleep(POLL_INTERVAL),
                Err(stop) => end = Some(stop_reason(stop)),
            }
        }
        // Stop the device first, then hand on what it had already delivered.
        if let Some(stream) = self.stream.take() {
            let _ = stream.pause();
            drop(stream);
        }
        let mut end = end.unwrap_or(CaptureEnd::Stopped);
        if end != CaptureEnd::OutputDisconnected {
            let tail = self
                .drainer
                .drain_all(&self.out)
                .and_then(|()| self.drainer.end_run(&self.out));
            if let (Err(stop), CaptureEnd::Stopped) = (tail, &end) {
                end = stop_reason(stop);
            }
        }
        let dropped = self.counters.dropped.load(Ordering::Relaxed);
        CaptureStats {
            frames_captured: self.counters.captured.load(Ordering::Relaxed),
            frames_dropped_in_ring: dropped,
            overruns: self.counters.overruns.load(Ordering::Relaxed),
            samples_sent: self.drainer.samples_sent,
            frames_sent: self.drainer.frames_sent,
            end_sample: self.drainer.end_sample(dropped),
            stream_errors: kept,
            timing: self.drainer.timing.summary(),
            end,
        }
    }
}

fn stop_reason(stop: DrainStop) -> CaptureEnd {
    match stop {
        DrainStop::Disconnected => CaptureEnd::OutputDisconnected,
        DrainStop::Internal(reason) => CaptureEnd::Internal { reason },
    }
}

#[cfg(test)]
mod tests {
    use voxline_core::{edge, FullPolicy};

    use super::*;

    fn setup(
        rate: u32,
        channels: u16,
        seconds: u32,
    ) -> (BlockWriter, Drainer, Arc<Counters>, Clock) {
        let counters = Arc::new(Counters::default());
        let clock = Clock::start();
        let (w, d) = ring(rate, channels, seconds, Arc::clone(&counters), clock).unwrap();
        (w, d, counters, clock)
    }

    /// A block placed by its arrival at `t` (no device timestamp).
    fn arrival(t: Instant) -> Stamp {
        Stamp {
            arrived: t,
            age: None,
        }
    }

    /// A block whose callback ran at `t`, its first sample captured `age_ms` earlier.
    fn device(t: Instant, age_ms: u64) -> Stamp {
        Stamp {
            arrived: t,
            age: Some(Duration::from_millis(age_ms)),
        }
    }

    fn near(a: Instant, b: Instant) -> bool {
        let d = if a > b { a - b } else { b - a };
        d < Duration::from_micros(1)
    }

    fn collect(rx: &voxline_core::EdgeReceiver<AudioFrame>) -> Vec<AudioFrame> {
        rx.try_iter().map(|e| e.item).collect()
    }

    #[test]
    fn integer_blocks_pass_through_as_f32_with_running_positions() {
        let (mut w, mut d, counters, clock) = setup(16_000, 1, 1);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let t0 = clock.origin() + Duration::from_secs(1);
        w.write(&[i16::MIN, 0, 16_384, i16::MAX][..], arrival(t0));
        w.write(
            &[-16_384i16; 160][..],
            arrival(t0 + Duration::from_millis(10)),
        );
        assert!(d.drain(&tx).unwrap());
        assert!(!d.drain(&tx).unwrap());
        let frames = collect(&rx);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].start_sample, 0);
        assert_eq!(frames[0].samples[..3], [-1.0, 0.0, 0.5]);
        assert!((frames[0].samples[3] - 1.0).abs() < 1e-4);
        assert_eq!(frames[1].start_sample, 4);
        assert!(frames[1].samples.iter().all(|&s| s == -0.5));
        // Without device timestamps each block's last sample was captured
        // when it arrived, its first one the block's duration earlier.
        assert!(near(frames[0].captured, t0 - Duration::from_micros(250)));
        assert!(near(frames[1].captured, t0));
        assert_eq!(counters.captured.load(Ordering::Relaxed), 164);
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn full_ring_drops_the_incoming_block_and_counts_its_frames() {
        // 1 s at 100 Hz stereo: 200 samples of room.
        let (mut w, mut d, counters, _) = setup(100, 2, 1);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let now = Instant::now();
        let block = [0.25f32; 120]; // 60 frames
        w.write(&block[..], arrival(now));
        w.write(&block[..], arrival(now)); // 240 > 200: dropped whole
        assert_eq!(counters.captured.load(Ordering::Relaxed), 60);
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 60);
        w.write(&[0.5f32; 80][..], arrival(now)); // 40 frames fit beside the first block
        assert_eq!(counters.captured.load(Ordering::Relaxed), 100);
        d.drain(&tx).unwrap();
        d.end_run(&tx).unwrap();
        let frames = collect(&rx);
        let total: usize = frames.iter().map(|f| f.samples.len()).sum();
        // 60 + 40 frames at 100 Hz kept, plus the 60-frame gap skipped.
        assert_eq!(
            total,
            rate_convert(60, 100) as usize + rate_convert(40, 100) as usize
        );
        let last = frames.last().unwrap();
        assert_eq!(
            last.end_sample(),
            rate_convert(60, 100) + rate_convert(60, 100) + rate_convert(40, 100)
        );
        // Drops after the last block count towards the end of the stream.
        w.write(&[0.5f32; 500][..], arrival(now)); // 250 frames: more than the whole ring
        let dropped = counters.dropped.load(Ordering::Relaxed);
        assert_eq!(dropped, 60 + 250);
        assert_eq!(
            d.end_sample(dropped),
            last.end_sample() + rate_convert(250, 100)
        );
    }

    #[test]
    fn a_gap_flushes_the_run_and_skips_the_dropped_duration() {
        let (mut w, mut d, _, _) = setup(16_000, 1, 1);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let now = Instant::now();
        w.write(&vec![0.1f32; 10_000][..], arrival(now));
        w.write(&vec![0.2f32; 10_000][..], arrival(now)); // dropped: 6 000 slots left
        w.write(&vec![0.3f32; 6_000][..], arrival(now));
        d.drain(&tx).unwrap();
        let frames = collect(&rx);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].start_sample, 0);
        assert_eq!(frames[1].start_sample, 20_000);
        assert!(frames[1].samples.iter().all(|&s| s == 0.3));
    }

    #[test]
    fn resampled_stereo_keeps_length_and_level() {
        let (mut w, mut d, _, _) = setup(48_000, 2, 2);
        let (tx, rx) = edge::<AudioFrame>("audio", 1_024, FullPolicy::Block);
        // 0.5 s of a 440 Hz tone, identical in both channels, in 10 ms blocks.
        let tone: Vec<f32> = (0..24_000)
            .flat_map(|i| {
                let s = 0.5 * (2.0 * std::f32::consts::PI * 440.0 * i as f32 / 48_000.0).sin();
                [s, s]
            })
            .collect();
        for block in tone.chunks(960) {
            w.write(block, arrival(Instant::now()));
            d.drain(&tx).unwrap();
        }
        d.end_run(&tx).unwrap();
        let frames = collect(&rx);
        let mut expected_start = 0;
        for f in &frames {
            assert_eq!(f.start_sample, expected_start);
            expected_start = f.end_sample();
        }
        let out: Vec<f32> = frames.into_iter().flat_map(|f| f.samples).collect();
        assert_eq!(out.len(), 8_000);
        let rms = (out[800..7_200].iter().map(|s| s * s).sum::<f32>() / 6_400.0).sqrt();
        assert!((rms - 0.5 / 2f32.sqrt()).abs() < 0.01, "rms {rms}");
    }

    #[test]
    fn a_disconnected_edge_stops_draining() {
        let (mut w, mut d, _, _) = setup(16_000, 1, 1);
        let (tx, rx) = edge::<AudioFrame>("audio", 4, FullPolicy::DropOldest);
        drop(rx);
        w.write(&[0.0f32; 100][..], arrival(Instant::now()));
        assert!(matches!(d.drain(&tx), Err(DrainStop::Disconnected)));
    }

    #[test]
    fn device_timestamps_place_each_block_and_give_the_device_latency() {
        let (mut w, mut d, _, clock) = setup(16_000, 1, 2);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let t0 = clock.origin() + Duration::from_secs(5);
        // 10 ms blocks whose callbacks run 30, 32 and 30 ms after their first sample
        w.write(&[0.1f32; 160][..], device(t0, 30));
        w.write(
            &[0.1f32; 160][..],
            device(t0 + Duration::from_millis(12), 32),
        );
        w.write(
            &[0.1f32; 160][..],
            device(t0 + Duration::from_millis(20), 30),
        );
        d.drain(&tx).unwrap();
        let frames = collect(&rx);
        assert_eq!(frames.len(), 3);
        for (i, f) in frames.iter().enumerate() {
            let first = t0 + Duration::from_millis(10 * i as u64) - Duration::from_millis(30);
            assert!(near(f.captured, first), "frame {i}");
            assert_eq!(f.start_sample, 160 * i as u64);
        }
        let timing = d.timing.summary();
        assert_eq!(timing.blocks_device_timed, 3);
        assert_eq!(timing.blocks_arrival_timed, 0);
        assert_eq!(timing.clock_gaps, 0);
        let lat = timing.device_latency_ms.unwrap();
        assert_eq!(lat.n, 3);
        assert!(
            (lat.min - 30.0).abs() < 1e-6 && (lat.max - 32.0).abs() < 1e-6,
            "{lat:?}"
        );
        assert!((lat.p50 - 30.0).abs() <= LATENCY_BUCKET_MS, "{lat:?}");
        assert!((lat.mean - 30.666_666).abs() < 1e-3, "{lat:?}");
    }

    #[test]
    fn a_device_that_delivers_less_than_wall_time_opens_a_counted_clock_gap() {
        let (mut w, mut d, _, clock) = setup(16_000, 1, 2);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let t0 = clock.origin() + Duration::from_secs(5);
        w.write(&[0.1f32; 160][..], device(t0, 20));
        // the source was suspended: the next block starts 500 ms after this one ended
        let resumed = t0 + Duration::from_millis(510);
        w.write(&[0.2f32; 160][..], device(resumed, 20));
        w.write(
            &[0.2f32; 160][..],
            device(resumed + Duration::from_millis(10), 20),
        );
        d.drain(&tx).unwrap();
        let frames = collect(&rx);
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0].start_sample, 0);
        // the position skipped the gap: 160 + 500 ms
        assert_eq!(frames[1].start_sample, 160 + 8_000);
        assert_eq!(frames[2].start_sample, 160 + 8_000 + 160);
        assert!(near(
            frames[1].captured,
            resumed - Duration::from_millis(20)
        ));
        let timing = d.timing.summary();
        assert_eq!(timing.clock_gaps, 1);
        assert!((timing.clock_gap_ms - 500.0).abs() < 1e-6, "{timing:?}");
        assert_eq!(
            timing.gaps,
            vec![ClockGap {
                at_sample: 160,
                ms: timing.clock_gap_ms
            }]
        );
        // jitter within the slack is no gap
        let (mut w, mut d, _, _) = setup(16_000, 1, 2);
        w.write(&[0.1f32; 160][..], device(t0, 20));
        w.write(
            &[0.1f32; 160][..],
            device(t0 + Duration::from_millis(50), 20),
        );
        d.drain(&tx).unwrap();
        assert_eq!(d.timing.summary().clock_gaps, 0);
    }

    #[test]
    fn arrival_stamps_chain_through_a_late_callback_and_reanchor_after_a_gap() {
        let (mut w, mut d, _, clock) = setup(16_000, 1, 2);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let t0 = clock.origin() + Duration::from_secs(5);
        let ms = Duration::from_millis;
        w.write(&[0.1f32; 160][..], arrival(t0));
        // a callback 100 ms late, then two more in a burst: the audio was there in time
        w.write(&[0.1f32; 160][..], arrival(t0 + ms(110)));
        w.write(&[0.1f32; 160][..], arrival(t0 + ms(111)));
        d.drain(&tx).unwrap();
        let frames = collect(&rx);
        assert_eq!(frames.len(), 3);
        assert!(near(frames[0].captured, t0 - ms(10)));
        // chained on (pulled towards the late arrival by 1/16 of 100 ms), not 100 ms late
        let second = frames[1].captured;
        assert!(second >= t0 && second <= t0 + ms(7), "{:?}", second - t0);
        assert!(frames[2].captured > second && frames[2].captured <= t0 + ms(25));
        assert_eq!(d.timing.summary().clock_gaps, 0);
        // a second without audio: a gap, and the stamps start again from the arrival
        let back = t0 + ms(1_500);
        w.write(&[0.1f32; 160][..], arrival(back));
        d.drain(&tx).unwrap();
        let frames = collect(&rx);
        assert!(near(frames.last().unwrap().captured, back - ms(10)));
        let timing = d.timing.summary();
        assert_eq!(timing.clock_gaps, 1);
        assert_eq!(timing.blocks_arrival_timed, 4);
        assert!(timing.device_latency_ms.is_none());
    }

    #[test]
    fn implausible_device_timestamps_are_not_used() {
        use cpal::StreamInstant;
        let at = |ms: u64| StreamInstant::from_nanos(ms * 1_000_000);
        assert_eq!(device_age(at(100), at(70)), Some(Duration::from_millis(30)));
        // no latency reported, capture after the callback, cpal's zero floor, absurd age
        assert_eq!(device_age(at(100), at(100)), None);
        assert_eq!(device_age(at(100), at(120)), None);
        assert_eq!(device_age(at(100), StreamInstant::ZERO), None);
        assert_eq!(device_age(at(60_000), at(10)), None);
    }

    #[test]
    fn the_period_is_small_and_within_what_the_device_supports() {
        use cpal::SupportedBufferSize::{Range, Unknown};
        // 10 ms by default
        assert_eq!(
            choose_period(
                48_000,
                &Range {
                    min: 16,
                    max: 8_192
                },
                None
            ),
            (480, None)
        );
        assert_eq!(choose_period(44_100, &Unknown, None), (441, None));
        // the smallest the device supports when that is more
        assert_eq!(
            choose_period(
                48_000,
                &Range {
                    min: 1_024,
                    max: 8_192
                },
                None
            ),
            (1_024, None)
        );
        // what was asked for, moved into the range with a note
        assert_eq!(
            choose_period(
                16_000,
                &Range {
                    min: 16,
                    max: 8_192
                },
                Some(25)
            ),
            (400, None)
        );
        let (frames, note) = choose_period(
            48_000,
            &Range {
                min: 1_024,
                max: 8_192,
            },
            Some(5),
        );
        assert_eq!(frames, 1_024);
        let note = note.unwrap();
        assert!(note.contains("5 ms is 240 frames"), "{note}");
        assert!(note.contains("1024 frames (21.3 ms)"), "{note}");
        let (frames, _) = choose_period(
            48_000,
            &Range {
                min: 16,
                max: 4_096,
            },
            Some(1_000),
        );
        assert_eq!(frames, 4_096);
    }

    #[test]
    fn not_found_lists_the_available_devices() {
        let e = CaptureError::DeviceNotFound {
            name: "usb mic".into(),
            available: vec!["default".into(), "hw:CARD=0,DEV=0 (HDA Intel)".into()],
        };
        let msg = e.to_string();
        assert!(msg.contains("`usb mic`"), "{msg}");
        assert!(
            msg.contains("default, hw:CARD=0,DEV=0 (HDA Intel)"),
            "{msg}"
        );
        let none = CaptureError::DeviceNotFound {
            name: "x".into(),
            available: vec![],
        };
        assert!(none.to_string().contains("(none)"));
    }
}
