//! Watching and interrupting the playback from any thread: what is queued,
//! how long the device has been silent, pause, resume, interrupt, close.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use voxline_core::Clock;

use super::{Shared, STALL_AFTER};

/// Watches and interrupts a [`Speaker`](super::Speaker)'s playback from any thread.
#[derive(Debug, Clone)]
pub struct SpeakerControl {
    pub(super) shared: Arc<Shared>,
    pub(super) reference: crate::aec::EchoReference,
    /// Wakes [`Speaker::play`](super::Speaker::play)'s wait for room.
    pub(super) room: crossbeam_channel::Sender<()>,
    pub(super) clock: Clock,
    pub(super) rate: u32,
}

impl SpeakerControl {
    /// Whether audio is queued or playing.
    #[must_use]
    pub fn is_playing(&self) -> bool {
        self.shared.pushed.load(Ordering::Acquire) > self.shared.taken.load(Ordering::Acquire)
    }

    /// Whether every sample queued has been taken by the device and what
    /// played handed on ([`Speaker::played`](super::Speaker::played)): the marks of all of it
    /// have been sent.
    #[must_use]
    pub fn is_handed_on(&self) -> bool {
        self.shared.forwarded.load(Ordering::Acquire) >= self.shared.pushed.load(Ordering::Acquire)
    }

    /// [`Played`](super::Played) messages lost so far because their reader fell behind.
    #[must_use]
    pub fn lost(&self) -> u64 {
        self.shared.lost.load(Ordering::Relaxed)
    }

    /// Samples queued on the device and not yet taken (at its rate).
    #[must_use]
    pub fn queued(&self) -> u64 {
        self.shared
            .pushed
            .load(Ordering::Acquire)
            .saturating_sub(self.shared.taken.load(Ordering::Acquire))
    }

    /// The device's sample rate.
    #[must_use]
    pub fn sample_rate(&self) -> u32 {
        self.rate
    }

    /// Samples (at the device's rate) taken by the device so far: played,
    /// or dropped by an interrupt.
    #[must_use]
    pub fn taken(&self) -> u64 {
        self.shared.taken.load(Ordering::Acquire)
    }

    /// Samples dropped by interrupts so far.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Acquire)
    }

    /// Interrupts done so far (each fade finished and its queue dropped).
    #[must_use]
    pub fn interrupts(&self) -> u64 {
        self.shared.interrupts.load(Ordering::Acquire)
    }

    /// Callbacks that ran dry while audio was still coming.
    #[must_use]
    pub fn underruns(&self) -> u64 {
        self.shared.underruns.load(Ordering::Relaxed)
    }

    /// The stream's output latency at its last callback.
    #[must_use]
    pub fn output_latency(&self) -> Duration {
        Duration::from_nanos(self.shared.latency_ns.load(Ordering::Relaxed))
    }

    /// Stops what is playing: the callback fades out over [`FADE_MS`](super::FADE_MS) and
    /// drops the rest of what is queued (a paused speaker drops it at once,
    /// and plays again what is queued after). Returns at once.
    pub fn interrupt(&self) {
        self.shared.interrupt.store(true, Ordering::Release);
        let _ = self.room.try_send(());
    }

    /// Pauses what is playing: the callback fades out over [`FADE_MS`](super::FADE_MS) and
    /// plays silence, keeping what is queued. Returns at once.
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::Release);
    }

    /// What the device played, sample by sample, as the speaker's thread
    /// hands it on after each buffer: the echo canceller's far end
    /// ([`AecStage`](crate::AecStage)).
    #[must_use]
    pub fn echo_reference(&self) -> crate::aec::EchoReference {
        self.reference.clone()
    }

    /// How long the device has asked for no audio: since its last callback
    /// began (before the first one, since the stream started). A device
    /// that plays calls back every period, playing silence when nothing is
    /// queued, paused or not.
    #[must_use]
    pub fn silent_for(&self) -> Duration {
        self.shared.silent_for(&self.clock)
    }

    /// Whether the device has stalled: audio is queued and it has asked for
    /// none for [`STALL_AFTER`] or more.
    #[must_use]
    pub fn is_stalled(&self) -> bool {
        self.is_playing() && self.silent_for() >= STALL_AFTER
    }

    /// Ends the playback for good: what is queued is dropped (as by
    /// [`interrupt`](Self::interrupt), at the device's next buffer) and
    /// [`Speaker::play`](super::Speaker::play) queues nothing more, returning at once, a wait for
    /// room included. Returns at once.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.interrupt.store(true, Ordering::Release);
        let _ = self.room.try_send(());
    }

    /// Whether it was closed ([`SpeakerControl::close`]).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Whether it is paused ([`SpeakerControl::pause`]).
    #[must_use]
    pub fn is_paused(&self) -> bool {
        self.shared.paused.load(Ordering::Acquire)
    }

    /// Plays on where [`SpeakerControl::pause`] stopped, fading in over
    /// [`FADE_MS`](super::FADE_MS).
    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::Release);
    }
}
