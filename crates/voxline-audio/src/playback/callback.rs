//! cpal's output callback: pops the ring, reports marks, fades and
//! drops on an interrupt, and wakes the speaker's thread to hand on what
//! it played; never blocks, allocates or locks (the wake is an unpark: an
//! atomic swap, and a futex wake when the thread is parked).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cpal::traits::DeviceTrait;
use cpal::{FromSample, SizedSample};
use voxline_core::Clock;

use super::{Mark, PlayedMark, RawLevel, Shared, FADE_MS};

/// The audio callback's state.
pub(super) struct Callback {
    pub(super) consumer: rtrb::Consumer<f32>,
    /// Marks to report, in order, each pushed before its sample.
    pub(super) marks: rtrb::Consumer<Mark>,
    /// Marks played, with their instants, for the speaker's thread (one
    /// is lost when nobody reads: never blocks).
    pub(super) played_marks: rtrb::Producer<PlayedMark>,
    pub(super) shared: Arc<Shared>,
    pub(super) clock: Clock,
    pub(super) channels: usize,
    pub(super) rate: u32,
    /// Frames of fade left once an interrupt began.
    pub(super) fade_left: Option<usize>,
    /// The pause's gain, in frames of fade (the fade's length: full; 0:
    /// paused, silent).
    pub(super) level: usize,
    /// Each buffer's level, for the echo guard (dropped when full).
    pub(super) levels: rtrb::Producer<RawLevel>,
    /// Each buffer's samples, mono as played, for the echo canceller
    /// (a buffer is left out whole when they do not fit).
    pub(super) played: rtrb::Producer<f32>,
    /// The speaker's thread, woken after each buffer to hand on what
    /// played (`None` without one: the tests drive the callback alone).
    pub(super) wake: Option<std::thread::Thread>,
}

impl Callback {
    /// Fills one buffer of `T` samples; never blocks or allocates.
    pub(super) fn fill<T: SizedSample + FromSample<f32>>(
        &mut self,
        data: &mut [T],
        info: &cpal::OutputCallbackInfo,
    ) {
        let ts = info.timestamp();
        let latency = ts.playback.duration_since(ts.callback);
        self.fill_at(data, self.clock.now(), latency);
    }

    /// [`fill`](Self::fill) for a buffer whose first sample reaches the
    /// device `latency` after `now`.
    pub(super) fn fill_at<T: SizedSample + FromSample<f32>>(
        &mut self,
        data: &mut [T],
        now: Instant,
        latency: Duration,
    ) {
        self.shared
            .latency_ns
            .store(latency.as_nanos() as u64, Ordering::Relaxed);
        // the device asks: it is not stalled
        self.shared.asked_at(&self.clock, now);
        let fade_frames = (self.rate * FADE_MS / 1000).max(1) as usize;
        let paused = self.shared.paused.load(Ordering::Acquire);
        self.level = self.level.min(fade_frames);
        if self.fade_left.is_none() && self.shared.interrupt.swap(false, Ordering::AcqRel) {
            // already silent when paused: nothing to fade
            self.fade_left = Some(if self.level == 0 { 0 } else { fade_frames });
        }
        let mut taken = self.shared.taken.load(Ordering::Acquire);
        let mut ran_dry = false;
        // the buffer's samples go to the watcher whole, or not at all
        // (with their level: the watcher pairs them by it)
        let with_samples =
            !self.levels.is_full() && self.played.slots() >= data.len() / self.channels.max(1);
        let mut energy = 0.0f32;
        let mut frames = 0u32;
        for (i, frame) in data.chunks_mut(self.channels).enumerate() {
            let mut s = 0.0f32;
            // the pause's fade, frame by frame
            let gain = if paused {
                self.level = self.level.saturating_sub(1);
                self.level as f32 / fade_frames as f32
            } else {
                self.level = (self.level + 1).min(fade_frames);
                self.level as f32 / fade_frames as f32
            };
            let held = paused && self.level == 0 && gain == 0.0;
            if held && self.fade_left.is_some() {
                // the pause's fade has silenced it: a drop's own fade is
                // over too (it counts only samples played, and a held
                // answer plays none)
                self.fade_left = Some(0);
            }
            if self.fade_left != Some(0) && !held {
                match self.consumer.pop() {
                    Ok(x) => {
                        // every mark at (or, never expected, before) this sample
                        while let Ok(&m) = self.marks.peek() {
                            if m.sample > taken {
                                break;
                            }
                            let _ = self.marks.pop();
                            let at = now
                                + latency
                                + Duration::from_secs_f64(i as f64 / f64::from(self.rate));
                            let ns =
                                at.saturating_duration_since(self.clock.origin()).as_nanos() as u64;
                            let _ = self.played_marks.push((m, ns));
                        }
                        taken += 1;
                        s = x;
                    }
                    Err(_) => ran_dry = true,
                }
                if let Some(left) = self.fade_left.as_mut() {
                    s *= *left as f32 / fade_frames as f32;
                    *left = left.saturating_sub(1);
                }
                s *= gain;
            }
            energy += s * s;
            frames += 1;
            if with_samples {
                let _ = self.played.push(s);
            }
            let v = T::from_sample(s);
            for out in frame.iter_mut() {
                *out = v;
            }
        }
        if self.fade_left == Some(0) {
            // faded out: what is left of the answer is not played
            let n = self.consumer.slots();
            if let Ok(chunk) = self.consumer.read_chunk(n) {
                chunk.commit_all();
            }
            taken += n as u64;
            // marks of audio dropped never play
            while self.marks.peek().is_ok_and(|m| m.sample < taken) {
                let _ = self.marks.pop();
            }
            self.shared.dropped.fetch_add(n as u64, Ordering::AcqRel);
            self.shared.interrupts.fetch_add(1, Ordering::AcqRel);
            self.fade_left = None;
        }
        if frames > 0 {
            let at = (now + latency)
                .saturating_duration_since(self.clock.origin())
                .as_nanos() as u64;
            // a full ring (nobody reading) loses levels, never blocks
            let _ = self
                .levels
                .push((at, frames, energy / frames as f32, with_samples));
        }
        if ran_dry && self.shared.pushed.load(Ordering::Acquire) > taken {
            self.shared.underruns.fetch_add(1, Ordering::Relaxed);
        }
        self.shared.taken.store(taken, Ordering::Release);
        if let Some(t) = &self.wake {
            t.unpark();
        }
    }
}

pub(super) fn build<T>(
    device: &cpal::Device,
    config: &cpal::StreamConfig,
    mut cb: Callback,
) -> Result<cpal::Stream, cpal::Error>
where
    T: SizedSample + FromSample<f32> + Send + 'static,
{
    device.build_output_stream::<T, _, _>(
        *config,
        move |data: &mut [T], info: &cpal::OutputCallbackInfo| cb.fill(data, info),
        |e: cpal::Error| tracing::warn!(error = %e, "output stream error"),
        None,
    )
}
