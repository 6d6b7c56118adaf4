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
//! Each frame's `start_sample` is a running 16 kHz position. `captured` is
//! the instant its first sample was captured, derived from the wall time the
//! most recent block arrived minus the audio between that sample and the end
//! of the block. After audio was dropped in the ring, the position skips
//! ahead by the dropped duration (the resampler is flushed at the gap), so
//! positions keep tracking real time.

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
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// What the callback records about each block it put in the ring.
#[derive(Debug, Clone, Copy)]
struct Block {
    /// Device frames in the block.
    frames: usize,
    /// When the block reached the callback.
    arrived: Instant,
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
    fn write<T>(&mut self, data: &[T], arrived: Instant)
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
            arrived,
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
        last_arrival: None,
        buf: Vec::new(),
        clock,
        samples_sent: 0,
        frames_sent: 0,
        gap_frames: 0,
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
    last_arrival: Option<Instant>,
    buf: Vec<f32>,
    clock: Clock,
    samples_sent: u64,
    frames_sent: u64,
    /// Dropped device frames already accounted for as gaps.
    gap_frames: u64,
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
            self.last_arrival = Some(block.arrived);
            self.emit(out)?;
        }
        Ok(queued > 0)
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
        let arrived = self.last_arrival.unwrap_or_else(|| self.clock.now());
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
        };
        self.run_out += len;
        out.send(frame).map_err(|_| DrainStop::Disconnected)?;
        self.samples_sent += len;
        self.frames_sent += 1;
        Ok(())
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
    let host = cpal::default_host();
    let device = find_device(&host, device)?;
    let (device_id, _) = device_names(&device);
    device
        .default_input_config()
        .map_err(|e| open_error(&device_id, &e))?;
    Ok(())
}

impl Capture {
    /// Opens `device` (an exact id or name from [`list_input_devices`]; the
    /// host's default input when `None`) in its default configuration and
    /// starts sending 16 kHz mono [`AudioFrame`]s to `out`, stamped on
    /// `clock`.
    ///
    /// Capture ends at [`Capture::stop`], when every receiver of `out` is
    /// gone, or when the device goes away.
    ///
    /// # Errors
    ///
    /// [`AudioError::Capture`] with [`CaptureError::NoInputDevice`],
    /// [`CaptureError::DeviceNotFound`] (listing the devices that exist),
    /// [`CaptureError::DeviceBusy`], [`CaptureError::CannotOpen`],
    /// [`CaptureError::UnsupportedConfig`], [`CaptureError::Stream`] (the
    /// stream would not start) or [`CaptureError::Spawn`].
    pub fn start(
        device: Option<&str>,
        out: EdgeSender<AudioFrame>,
        clock: Clock,
    ) -> Result<Capture, AudioError> {
        let host = cpal::default_host();
        let device = find_device(&host, device)?;
        let (device_id, device_name) = device_names(&device);
        let supported = device
            .default_input_config()
            .map_err(|e| open_error(&device_id, &e))?;
        let config = supported.config();
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
        let format = CaptureFormat {
            device_id: device_id.clone(),
            device_name,
            sample_rate: config.sample_rate,
            channels: config.channels,
            sample_format: sample_format.to_string(),
        };

        let counters = Arc::new(Counters::default());
        let (writer, drainer) = ring(
            config.sample_rate,
            config.channels,
            RING_SECONDS,
            Arc::clone(&counters),
            clock,
        )?;
        let (err_tx, err_rx) = mpsc::sync_channel::<cpal::Error>(MAX_KEPT_ERRORS);
        let stream = build_stream(
            &device,
            &device_id,
            config,
            sample_format,
            writer,
            err_tx,
            Arc::clone(&counters),
            clock,
        )?;
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
            move |data: &[T], _: &cpal::InputCallbackInfo| writer.write(data, clock.now()),
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

    fn collect(rx: &voxline_core::EdgeReceiver<AudioFrame>) -> Vec<AudioFrame> {
        rx.try_iter().map(|e| e.item).collect()
    }

    #[test]
    fn integer_blocks_pass_through_as_f32_with_running_positions() {
        let (mut w, mut d, counters, clock) = setup(16_000, 1, 1);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let t0 = clock.origin() + Duration::from_secs(1);
        w.write(&[i16::MIN, 0, 16_384, i16::MAX][..], t0);
        w.write(&[-16_384i16; 160][..], t0 + Duration::from_millis(10));
        assert!(d.drain(&tx).unwrap());
        assert!(!d.drain(&tx).unwrap());
        let frames = collect(&rx);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].start_sample, 0);
        assert_eq!(frames[0].samples[..3], [-1.0, 0.0, 0.5]);
        assert!((frames[0].samples[3] - 1.0).abs() < 1e-4);
        assert_eq!(frames[1].start_sample, 4);
        assert!(frames[1].samples.iter().all(|&s| s == -0.5));
        // Each block's first sample was captured its duration before it arrived.
        let near = |a: Instant, b: Instant| {
            let d = if a > b { a - b } else { b - a };
            d < Duration::from_micros(1)
        };
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
        w.write(&block[..], now);
        w.write(&block[..], now); // 240 > 200: dropped whole
        assert_eq!(counters.captured.load(Ordering::Relaxed), 60);
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 60);
        w.write(&[0.5f32; 80][..], now); // 40 frames fit beside the first block
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
        w.write(&[0.5f32; 500][..], now); // 250 frames: more than the whole ring
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
        w.write(&vec![0.1f32; 10_000][..], now);
        w.write(&vec![0.2f32; 10_000][..], now); // dropped: 6 000 slots left
        w.write(&vec![0.3f32; 6_000][..], now);
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
            w.write(block, Instant::now());
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
        w.write(&[0.0f32; 100][..], Instant::now());
        assert!(matches!(d.drain(&tx), Err(DrainStop::Disconnected)));
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
