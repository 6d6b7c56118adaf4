//! The consumer thread: drains the ring until the capture is stopped, the
//! output edge is gone or the stream fails, then hands on the tail and
//! returns the session's [`CaptureStats`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use cpal::traits::StreamTrait;
use voxline_core::{AudioFrame, EdgeSender};

use super::drain::{DrainStop, Drainer};
use super::ring::Counters;
use super::{CaptureEnd, CaptureStats};

/// The longest the consumer sleeps when the ring is empty: the input
/// callback wakes it after each block (an unpark, which never blocks), and
/// so do a stream error and a stop; this timer only bounds a wake missed.
const EMPTY_WAIT: Duration = Duration::from_millis(100);

/// Non-fatal stream error messages kept for [`CaptureStats::stream_errors`].
pub(super) const MAX_KEPT_ERRORS: usize = 16;

/// Whether a stream error ends the capture.
fn is_fatal(kind: cpal::ErrorKind) -> bool {
    use cpal::ErrorKind as K;
    matches!(
        kind,
        K::DeviceNotAvailable | K::StreamInvalidated | K::HostUnavailable | K::PermissionDenied
    )
}

/// The consumer thread's state.
pub(super) struct Consumer {
    /// The running stream (paused and dropped when the consumer ends).
    pub(super) stream: Option<cpal::Stream>,
    /// The ring's consumer side.
    pub(super) drainer: Drainer,
    /// Where the 16 kHz frames go.
    pub(super) out: EdgeSender<AudioFrame>,
    /// Stream errors from the callback's error handler.
    pub(super) errors: Receiver<cpal::Error>,
    /// Set by [`Capture::stop`](super::Capture::stop) or dropping the handle.
    pub(super) stop: Arc<AtomicBool>,
    /// Shared with the callback and the handle.
    pub(super) counters: Arc<Counters>,
}

impl Consumer {
    pub(super) fn run(mut self) -> CaptureStats {
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
            let drained = self.drainer.drain(&self.out);
            let (gaps, last_ms) = self.drainer.timing.gaps_so_far();
            self.counters
                .last_gap_ms
                .store(last_ms.round() as u64, Ordering::Relaxed);
            self.counters.clock_gaps.store(gaps, Ordering::Release);
            match drained {
                Ok(true) => {}
                Ok(false) => thread::park_timeout(EMPTY_WAIT),
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
