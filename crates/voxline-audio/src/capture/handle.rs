//! [`Capture`], the handle of a running capture: opening the device, starting
//! the stream and the consumer thread, stopping them; what it reports.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use cpal::traits::{DeviceTrait, StreamTrait};
use voxline_core::{AudioFrame, Clock, EdgeSender};

use super::consumer::{Consumer, MAX_KEPT_ERRORS};
use super::devices::{device_names, find_device, open_error};
use super::drain::Drainer;
use super::ring::{ring, Counters};
use super::stream::{build_stream, choose_period};
#[cfg(doc)]
use super::{list_input_devices, DEFAULT_BUFFER_MS};
use super::{CaptureError, CaptureTiming, RING_SECONDS};
use crate::{AudioError, MAX_CHANNELS, MAX_SAMPLE_RATE};

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
        let wake = super::stream::Waker::default();
        let open = |config: cpal::StreamConfig| -> Result<(cpal::Stream, Drainer), AudioError> {
            let (writer, drainer) = ring(
                config.sample_rate,
                config.channels,
                RING_SECONDS,
                Arc::clone(&counters),
                clock,
            )?;
            let ends = super::stream::Ends {
                writer,
                errors: err_tx.clone(),
                counters: Arc::clone(&counters),
                wake: Arc::clone(&wake),
            };
            let stream = build_stream(&device, &device_id, config, sample_format, ends, clock)?;
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
            .spawn(move || {
                let _ = wake.set(thread::current());
                consumer.run()
            })
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

    /// Clock gaps so far (the device delivered less than wall time: a
    /// suspended source, an overrun, or a capture PulseAudio moved to
    /// another device when its own went away), and the last one's length
    /// in ms. ALSA gives no notice of a device change; this is what the
    /// stream shows of one.
    #[must_use]
    pub fn clock_gaps(&self) -> (u64, u64) {
        (
            self.counters.clock_gaps.load(Ordering::Acquire),
            self.counters.last_gap_ms.load(Ordering::Relaxed),
        )
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
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
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
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
