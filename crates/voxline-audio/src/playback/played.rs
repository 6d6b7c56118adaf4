//! What the output played, as the speaker's thread reads it from the
//! callback's rings once the callback wakes it: the marks that reached the
//! device, each buffer's level (the echo guard's) and its samples (the
//! echo canceller's far end), handed on as [`Played`] messages.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Mark, PlayedMark, Shared};

/// How loud one buffer of the voice was as it reached the device: the
/// echo guard compares what the microphone hears with it
/// (a [`Played::Level`] from [`Speaker::played`](super::Speaker::played)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlayedLevel {
    /// When the buffer's first frame reached the device.
    pub at: Instant,
    /// How long it played.
    pub duration: Duration,
    /// Its mean square (mono, as played: after the pause's fade).
    pub mean_square: f32,
}

/// What the device played, in the order it played it, as the speaker's
/// thread hands it on ([`Speaker::played`](super::Speaker::played)): a
/// bounded channel that its reader receives from, woken by each buffer the
/// device plays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Played {
    /// A mark's sample reached the device at this instant.
    Mark(Mark, Instant),
    /// One buffer reached the device, this loud.
    Level(PlayedLevel),
}

/// A buffer's level as the callback records it: ns since the clock's
/// origin, frames, mean square, and whether its samples are in the
/// samples' ring (they are left out whole when it is full).
pub(super) type RawLevel = (u64, u32, f32, bool);

/// What the speaker's thread reads of what played: the marks, each
/// buffer's level, its samples (mono, at the device's rate), and the echo
/// canceller's reference they go on to.
pub(super) struct PlayedRings {
    pub(super) marks: rtrb::Consumer<PlayedMark>,
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
    /// Hands on what played since the last call, in order (the marks
    /// before the levels of the buffers they played in), through `send`;
    /// each buffer's samples go on to the echo reference. Then records in
    /// `shared` how far the stream has been handed on (every mark of a
    /// sample before it was sent), and returns the number of messages
    /// `send` could not take.
    pub(super) fn forward(
        &mut self,
        shared: &Shared,
        origin: Instant,
        rate: u32,
        send: &mut dyn FnMut(Played) -> bool,
    ) -> u64 {
        // the callback pushes a buffer's marks before it stores how far it took
        let taken = shared.taken.load(Ordering::Acquire);
        let mut lost = 0;
        while let Ok((m, ns)) = self.marks.pop() {
            lost += u64::from(!send(Played::Mark(m, origin + Duration::from_nanos(ns))));
        }
        for l in self.take(origin, rate) {
            lost += u64::from(!send(Played::Level(l)));
        }
        shared.forwarded.store(taken, Ordering::Release);
        lost
    }

    /// The levels of the buffers played since the last call, oldest
    /// first (the clock's `origin`, the device's `rate`); their samples go
    /// on to the echo reference.
    fn take(&mut self, origin: Instant, rate: u32) -> Vec<PlayedLevel> {
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
