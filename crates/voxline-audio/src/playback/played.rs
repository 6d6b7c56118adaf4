//! What the output played, as its watcher reads it from the callback's
//! rings: each buffer's level (the echo guard's) and its samples (the
//! echo canceller's far end).

use std::time::{Duration, Instant};

/// How loud one buffer of the voice was as it reached the device: the
/// echo guard compares what the microphone hears with it
/// ([`SpeakerControl::take_levels`](super::SpeakerControl::take_levels)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlayedLevel {
    /// When the buffer's first frame reached the device.
    pub at: Instant,
    /// How long it played.
    pub duration: Duration,
    /// Its mean square (mono, as played: after the pause's fade).
    pub mean_square: f32,
}

/// A buffer's level as the callback records it: ns since the clock's
/// origin, frames, mean square, and whether its samples are in the
/// samples' ring (they are left out whole when it is full).
pub(super) type RawLevel = (u64, u32, f32, bool);

/// What the watcher reads of what played: each buffer's level, its
/// samples (mono, at the device's rate), and the echo canceller's
/// reference they go on to.
pub(super) struct PlayedRings {
    pub(super) levels: rtrb::Consumer<RawLevel>,
    pub(super) samples: rtrb::Consumer<f32>,
    pub(super) reference: crate::aec::EchoReference,
}

impl std::fmt::Debug for PlayedRings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlayedRings").finish_non_exhaustive()
    }
}

/// Seconds of played samples the ring to the watcher holds.
pub(super) const PLAYED_SECONDS: u32 = 2;

impl PlayedRings {
    /// The levels of the buffers played since the last call, oldest
    /// first (the clock's `origin`, the device's `rate`); their samples go
    /// on to the echo reference.
    pub(super) fn take(&mut self, origin: Instant, rate: u32) -> Vec<PlayedLevel> {
        let mut out = Vec::with_capacity(self.levels.slots());
        while let Ok((ns, frames, mean_square, with_samples)) = self.levels.pop() {
            let at = origin + Duration::from_nanos(ns);
            if with_samples {
                let n = (frames as usize).min(self.samples.slots());
                if let Ok(chunk) = self.samples.read_chunk(n) {
                    let (a, b) = chunk.as_slices();
                    let mut buf = Vec::with_capacity(n);
                    buf.extend_from_slice(a);
                    buf.extend_from_slice(b);
                    chunk.commit_all();
                    self.reference.push(at, &buf, rate);
                }
            }
            out.push(PlayedLevel {
                at,
                duration: Duration::from_secs_f64(f64::from(frames) / f64::from(rate.max(1))),
                mean_square,
            });
        }
        out
    }
}
