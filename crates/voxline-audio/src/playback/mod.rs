//! Playing the assistant's voice on an output device through cpal.
//!
//! A [`Speaker`] opens an output device in its default configuration and
//! owns two sides:
//!
//! - **cpal's audio callback** pops mono samples from a lock-free SPSC ring
//!   ([`rtrb`]) and writes each to every channel of the device's format; an
//!   empty ring plays silence. It never blocks, never allocates and never
//!   takes a lock: everything it shares is an atomic or an SPSC ring. The
//!   *marks* (positions in the played stream) reach it through a ring of
//!   their own, pushed before their samples; as it pops the sample a mark
//!   points at, it sends the mark back with the instant that sample reaches
//!   the device (the stream's `playback` timestamp, mapped onto the session
//!   clock through the one moment the callback reads both clocks). When
//!   asked to [`interrupt`](Speaker::interrupt) it fades out over
//!   [`FADE_MS`] and then drops what is queued; asked to
//!   [`pause`](SpeakerControl::pause) it fades out and plays silence,
//!   keeping what is queued, until it [resumes](SpeakerControl::resume)
//!   with a fade in. After each buffer it wakes the speaker's thread (an
//!   unpark).
//! - **the feeding side** ([`Speaker::play`], from the thread that owns the
//!   speaker) resamples each block to the device's rate and pushes it into
//!   the ring, waiting for room when the ring is full (a few seconds of
//!   audio: the voice is synthesised faster than it plays). The wait is a
//!   receive: the speaker's thread signals room after each buffer, and an
//!   interrupt or a close ends it.
//!
//! The stream itself lives on a thread of its own (`speaker`). Woken by
//! each buffer, that thread hands on what played as [`Played`] messages
//! (the marks as they reach the device, each buffer's level) on a bounded
//! channel ([`Speaker::played`]), and each buffer's samples to the echo
//! canceller's reference ([`SpeakerControl::echo_reference`]). Nothing
//! polls: every thread here sleeps until the device or a caller wakes it.
//!
//! **Every wait on the device is bounded.** A device can stop asking for
//! audio (a PulseAudio sink suspended, a stream the server stopped, a
//! disconnected device whose stream ended): its callback no longer runs and
//! the ring never drains. The callback stamps each buffer it is asked for,
//! so the feeding side sees how long the device has been silent
//! ([`SpeakerControl::silent_for`]); past [`STALL_AFTER`] with audio queued
//! it has *stalled* ([`SpeakerControl::is_stalled`]), and [`Speaker::play`]
//! stops waiting for room ([`Cut::Stalled`]). [`SpeakerControl::close`] ends
//! every wait at once (a stop, the end of a session's play-out); opening
//! waits [`OPEN_LIMIT`] for the stream, and dropping the speaker waits
//! [`CLOSE_LIMIT`] for its thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cpal::traits::{DeviceTrait, StreamTrait};
use cpal::SampleFormat;
use voxline_core::Clock;

use crate::{AudioError, StreamResampler};

/// Seconds of device audio the ring holds.
pub const RING_SECONDS: u32 = 4;

/// The fade when playback is interrupted, in milliseconds.
pub const FADE_MS: u32 = 5;

/// A device that has asked for no audio this long while audio is queued
/// has stalled: [`Speaker::play`] stops waiting for it to take audio. A
/// playing device asks every period (milliseconds to tens of milliseconds,
/// silence included), so this is far past a callback made late by a busy
/// machine.
pub const STALL_AFTER: Duration = Duration::from_secs(2);

/// How long [`Speaker::open`] waits for the device's stream to start.
pub const OPEN_LIMIT: Duration = Duration::from_secs(10);

/// How long dropping a [`Speaker`] waits for its thread to close the
/// stream; a thread that takes longer (a device that hangs on close) is
/// left behind, with a warning.
pub const CLOSE_LIMIT: Duration = Duration::from_secs(2);

/// Why an output device could not play.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlaybackError {
    /// No default output device.
    #[error("there is no audio output device; connect one, or run with --voice off")]
    NoOutputDevice,
    /// The device asked for is not there.
    #[error("no output device `{name}`; the outputs are: {}; `voxline devices` lists them", available.join(", "))]
    DeviceNotFound {
        /// What was asked for.
        name: String,
        /// What there is.
        available: Vec<String>,
    },
    /// The device could not be opened or started.
    #[error("output device `{device}` cannot play: {reason}; pick another with --output-device")]
    CannotOpen {
        /// The device.
        device: String,
        /// Why.
        reason: String,
    },
    /// The host could not list its devices.
    #[error("the audio host cannot list its output devices: {0}")]
    Enumerate(String),
}

/// What the callback and the feeding side share (atomics only).
#[derive(Debug, Default)]
struct Shared {
    /// Samples pushed into the ring.
    pushed: AtomicU64,
    /// Samples taken out of the ring (played, or dropped by an interrupt).
    taken: AtomicU64,
    /// Fade out, then drop what is queued.
    interrupt: AtomicBool,
    /// Fade out and play silence, keeping what is queued (until cleared).
    paused: AtomicBool,
    /// Samples dropped by interrupts.
    dropped: AtomicU64,
    /// Interrupts done (fade finished, queue dropped).
    interrupts: AtomicU64,
    /// Callbacks that found the ring empty while more was queued behind (underruns).
    underruns: AtomicU64,
    /// The stream's output latency at the last callback (playback − callback), ns.
    latency_ns: AtomicU64,
    /// When the device last asked for audio (a callback began), ns since
    /// the clock's origin; before its first callback, when the stream started.
    asked_ns: AtomicU64,
    /// Closed: nothing more is queued ([`SpeakerControl::close`]).
    closed: AtomicBool,
    /// How far the speaker's thread has handed on what played (in
    /// [`Shared::taken`]'s count): every mark before it was sent.
    forwarded: AtomicU64,
    /// [`Played`] messages lost because their channel was full.
    lost: AtomicU64,
}

impl Shared {
    /// How long the device has asked for no audio, on `clock`.
    fn silent_for(&self, clock: &Clock) -> Duration {
        let asked = clock.origin() + Duration::from_nanos(self.asked_ns.load(Ordering::Acquire));
        clock.now().saturating_duration_since(asked)
    }

    /// Records that the device asks for audio at `now`.
    fn asked_at(&self, clock: &Clock, now: Instant) {
        let ns = now.saturating_duration_since(clock.origin()).as_nanos();
        self.asked_ns
            .store(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::Release);
    }
}

/// What [`Speaker::play`] did with a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fed {
    /// Samples queued, at the device's rate.
    pub queued: usize,
    /// Samples not queued, at the device's rate ([`Fed::cut`] says why).
    pub left_out: usize,
    /// Why the wait for room ended before all of the block was queued.
    pub cut: Option<Cut>,
}

/// Why [`Speaker::play`] stopped waiting for room in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cut {
    /// An interrupt came while it waited.
    Interrupted,
    /// The device has asked for no audio for [`STALL_AFTER`]: it stopped
    /// taking audio.
    Stalled,
    /// The speaker was closed ([`SpeakerControl::close`]), or is being dropped.
    Closed,
}

mod callback;
mod control;
mod device;
mod played;

use callback::{build, Callback};
pub use control::SpeakerControl;
pub use device::check_output_device;
use device::find_output;

pub use played::{Played, PlayedLevel};
use played::{PlayedRings, RawLevel, PLAYED_SECONDS};

/// Buffers' levels the ring between the callback and the speaker's thread
/// holds, and [`Played`] messages the channel from that thread holds.
const LEVELS: usize = 4096;

/// Marks the rings to and from the callback hold (one per answer begun:
/// far more than can be queued in [`RING_SECONDS`]).
const MARKS: usize = 256;

/// A mark the callback played, and when it reached the device (ns since
/// the clock's origin).
type PlayedMark = (Mark, u64);

/// A position in the played stream: the `n`th sample pushed, and what the
/// caller calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The caller's tag (e.g. the turn it starts).
    pub tag: u64,
    /// Its sample, counted from the first pushed.
    pub sample: u64,
}

/// The format the device plays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeakerFormat {
    /// The device's id.
    pub device: String,
    /// Its sample rate.
    pub sample_rate: u32,
    /// Its channels (the voice is written to each).
    pub channels: u16,
    /// Its sample format as cpal names it.
    pub sample_format: String,
}

/// An open output device playing what it is given.
pub struct Speaker {
    format: SpeakerFormat,
    producer: rtrb::Producer<f32>,
    shared: Arc<Shared>,
    marks: rtrb::Producer<Mark>,
    resampler: Option<(u32, StreamResampler)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the speaker's thread ends (it never sends).
    ended: std::sync::mpsc::Receiver<()>,
    /// What played, from the speaker's thread.
    played: crossbeam_channel::Receiver<Played>,
    /// A signal of room in the ring (after each buffer, an interrupt, a close).
    room: crossbeam_channel::Receiver<()>,
    room_tx: crossbeam_channel::Sender<()>,
    reference: crate::aec::EchoReference,
    clock: Clock,
}

impl std::fmt::Debug for Speaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speaker")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl Speaker {
    /// Opens output device `device` (its id or name; the default when
    /// `None`) in its default configuration and starts playing silence.
    /// What it plays is handed on as [`Played`] messages
    /// ([`Speaker::played`]).
    ///
    /// # Errors
    /// [`PlaybackError`] (inside [`AudioError::Playback`]) when there is no
    /// such device or it cannot be opened.
    pub fn open(device: Option<&str>, clock: Clock) -> Result<Self, AudioError> {
        crate::quiet::silence_audio_libraries();
        let wanted = device.map(str::to_owned);
        let shared = Arc::new(Shared::default());
        let (marks, marks_out) = rtrb::RingBuffer::<Mark>::new(MARKS);
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let (ended_tx, ended) = std::sync::mpsc::channel::<()>();
        let (played_tx, played) = crossbeam_channel::bounded(LEVELS);
        let (room_tx, room) = crossbeam_channel::bounded(1);
        let reference = crate::aec::EchoReference::new();
        let ends = ThreadEnds {
            shared: shared.clone(),
            marks: marks_out,
            stop: stop.clone(),
            played: played_tx,
            room: room_tx.clone(),
            reference: reference.clone(),
        };
        // the stream is built and kept on the thread that owns it
        let thread = std::thread::Builder::new()
            .name("speaker".into())
            .spawn(move || {
                let _ended = ended_tx;
                speaker_thread(wanted, clock, ends, ready_tx);
            })
            .map_err(|e| PlaybackError::CannotOpen {
                device: device.unwrap_or("default").to_owned(),
                reason: e.to_string(),
            })?;
        let cannot = |reason: String| PlaybackError::CannotOpen {
            device: device.unwrap_or("default").to_owned(),
            reason,
        };
        let (format, producer) = match ready_rx.recv_timeout(OPEN_LIMIT) {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e.into());
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
                return Err(cannot("the speaker thread ended".into()).into());
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // left behind: it ends once its stream opens (or never)
                stop.store(true, Ordering::Release);
                return Err(cannot(format!(
                    "its stream did not start within {} s",
                    OPEN_LIMIT.as_secs()
                ))
                .into());
            }
        };
        Ok(Self {
            ended,
            played,
            room,
            room_tx,
            reference,
            clock,
            format,
            producer,
            shared,
            marks,
            resampler: None,
            stop,
            thread: Some(thread),
        })
    }

    /// The format the device plays.
    #[must_use]
    pub fn format(&self) -> &SpeakerFormat {
        &self.format
    }

    /// What the device plays, in order, as it plays it: each [`Mark`] as
    /// its sample reaches the device, each buffer's level. A bounded
    /// channel (a few seconds of buffers) for one reader that receives as
    /// the device plays; a message it has no room for is lost and counted
    /// ([`SpeakerControl::lost`]), the device never waits on it.
    #[must_use]
    pub fn played(&self) -> crossbeam_channel::Receiver<Played> {
        self.played.clone()
    }

    /// Queues `samples` (mono at `rate`) to play after what is queued,
    /// resampled to the device's rate, waiting while the ring is full; `mark`
    /// tags the block's first sample ([`Speaker::open`]'s `on_played` hears
    /// when it reaches the device; a block of which nothing is queued leaves
    /// no mark). Says what was queued: all of it, or less when the wait
    /// for room ended first — an [`interrupt`](SpeakerControl::interrupt)
    /// came, `give_way` said so when an interrupt woke the wait
    /// ([`Cut::Interrupted`] both), the device stalled ([`STALL_AFTER`]: the
    /// wait is never longer), or the speaker was
    /// [closed](SpeakerControl::close).
    ///
    /// # Errors
    /// [`AudioError`] when `rate` cannot be resampled from.
    pub fn play(
        &mut self,
        samples: &[f32],
        rate: u32,
        mark: Option<u64>,
        give_way: &dyn Fn() -> bool,
    ) -> Result<Fed, AudioError> {
        let device_rate = self.format.sample_rate;
        if self.resampler.as_ref().is_none_or(|(r, _)| *r != rate) {
            self.resampler = Some((rate, StreamResampler::to_rate(rate, 1, device_rate)?));
        }
        let mut out =
            Vec::with_capacity(samples.len() * device_rate as usize / rate.max(1) as usize + 64);
        if let Some((_, r)) = self.resampler.as_mut() {
            r.process(samples, &mut out)?;
        }
        let interrupted_at = self.shared.interrupts.load(Ordering::Acquire);
        let mut mark = mark;
        let mut rest: &[f32] = &out;
        let mut queued = 0;
        let cut = loop {
            if self.shared.closed.load(Ordering::Acquire) || self.stop.load(Ordering::Acquire) {
                break Some(Cut::Closed);
            }
            if rest.is_empty() {
                break None;
            }
            let n = self.producer.slots().min(rest.len());
            if n == 0 {
                if self.shared.interrupts.load(Ordering::Acquire) != interrupted_at || give_way() {
                    break Some(Cut::Interrupted);
                }
                let silent = self.shared.silent_for(&self.clock);
                if silent >= STALL_AFTER {
                    break Some(Cut::Stalled);
                }
                // until the device takes audio (or an interrupt, a close)
                let _ = self.room.recv_timeout(STALL_AFTER - silent);
                continue;
            }
            self.push_mark(mark.take());
            if let Ok(chunk) = self.producer.write_chunk_uninit(n) {
                let written = chunk.fill_from_iter(rest[..n].iter().copied());
                self.shared
                    .pushed
                    .fetch_add(written as u64, Ordering::AcqRel);
                rest = &rest[written..];
                queued += written;
            }
        };
        if cut.is_none() {
            // a block the resampler gave nothing for yet: its mark points
            // at the next sample pushed
            self.push_mark(mark);
        }
        Ok(Fed {
            queued,
            left_out: rest.len(),
            cut,
        })
    }

    /// Queues mark `tag` (if any) at the next sample pushed: before its
    /// samples, so the callback sees it before it can pop the sample it
    /// points at.
    fn push_mark(&mut self, tag: Option<u64>) {
        let Some(tag) = tag else { return };
        let sample = self.shared.pushed.load(Ordering::Acquire);
        if self.marks.push(Mark { tag, sample }).is_err() {
            tracing::warn!(
                tag,
                "{MARKS} marks are waiting to play; this one is not reported"
            );
        }
    }

    /// Samples pushed so far (at the device's rate): where the next block
    /// starts, in [`SpeakerControl::taken`]'s count.
    #[must_use]
    pub fn pushed(&self) -> u64 {
        self.shared.pushed.load(Ordering::Acquire)
    }

    /// A handle that watches and interrupts the playback from another
    /// thread (while this one waits to push).
    #[must_use]
    pub fn control(&self) -> SpeakerControl {
        SpeakerControl {
            shared: self.shared.clone(),
            reference: self.reference.clone(),
            room: self.room_tx.clone(),
            clock: self.clock,
            rate: self.format.sample_rate,
        }
    }
}

impl Drop for Speaker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.room_tx.try_send(());
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        // the thread closes the stream (joining cpal's worker); a device that
        // hangs there is not waited for past the limit
        match self.ended.recv_timeout(CLOSE_LIMIT) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => tracing::warn!(
                device = %self.format.device,
                "the output device did not close within {} s; left behind",
                CLOSE_LIMIT.as_secs()
            ),
        }
    }
}

type Ready = Result<(SpeakerFormat, rtrb::Producer<f32>), PlaybackError>;

/// What the speaker's thread is handed: the callback's ends, and where
/// what played goes.
struct ThreadEnds {
    shared: Arc<Shared>,
    marks: rtrb::Consumer<Mark>,
    stop: Arc<AtomicBool>,
    played: crossbeam_channel::Sender<Played>,
    room: crossbeam_channel::Sender<()>,
    reference: crate::aec::EchoReference,
}

/// The speaker's thread: builds and owns the stream, hands the ring's
/// producer back, then, woken by each buffer the callback fills, hands on
/// what played until stopped.
fn speaker_thread(
    wanted: Option<String>,
    clock: Clock,
    ends: ThreadEnds,
    ready: std::sync::mpsc::SyncSender<Ready>,
) {
    let ThreadEnds {
        shared,
        marks,
        stop,
        played: played_tx,
        room,
        reference,
    } = ends;
    let opened = (|| {
        let host = cpal::default_host();
        let device = find_output(&host, wanted.as_deref())?;
        let (id, _) = crate::capture::device_names(&device);
        let cannot = |e: &dyn std::fmt::Display| PlaybackError::CannotOpen {
            device: id.clone(),
            reason: e.to_string().trim_end_matches('.').to_owned(),
        };
        let config = device.default_output_config().map_err(|e| cannot(&e))?;
        let format = SpeakerFormat {
            device: id.clone(),
            sample_rate: config.sample_rate(),
            channels: config.channels(),
            sample_format: config.sample_format().to_string(),
        };
        let (producer, consumer) =
            rtrb::RingBuffer::<f32>::new((config.sample_rate() * RING_SECONDS) as usize);
        let (levels, levels_out) = rtrb::RingBuffer::<RawLevel>::new(LEVELS);
        let (played, played_out) =
            rtrb::RingBuffer::<f32>::new((config.sample_rate() * PLAYED_SECONDS) as usize);
        let (played_marks, played_marks_out) = rtrb::RingBuffer::<PlayedMark>::new(MARKS);
        let stream_config: cpal::StreamConfig = config.into();
        let cb = Callback {
            consumer,
            marks,
            played_marks,
            shared: shared.clone(),
            clock,
            channels: usize::from(config.channels().max(1)),
            rate: config.sample_rate(),
            fade_left: None,
            level: usize::MAX,
            levels,
            played,
            wake: Some(std::thread::current()),
        };
        let stream = match config.sample_format() {
            SampleFormat::F32 => build::<f32>(&device, &stream_config, cb),
            SampleFormat::I16 => build::<i16>(&device, &stream_config, cb),
            SampleFormat::I32 => build::<i32>(&device, &stream_config, cb),
            SampleFormat::U16 => build::<u16>(&device, &stream_config, cb),
            SampleFormat::U8 => build::<u8>(&device, &stream_config, cb),
            other => {
                return Err(cannot(&format!(
                    "its sample format {other} is not supported"
                )));
            }
        }
        .map_err(|e| cannot(&e))?;
        // the device's silence is counted from here until it first asks
        shared.asked_at(&clock, clock.now());
        stream.play().map_err(|e| cannot(&e))?;
        let rings = PlayedRings {
            marks: played_marks_out,
            levels: levels_out,
            samples: played_out,
            reference,
        };
        Ok((format, producer, (stream, rings)))
    })();
    let (stream, mut rings, rate) = match opened {
        Ok((format, producer, (stream, rings))) => {
            let rate = format.sample_rate;
            if ready.send(Ok((format, producer))).is_err() {
                return;
            }
            (stream, rings, rate)
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut send = |p: Played| played_tx.try_send(p).is_ok();
    while !stop.load(Ordering::Acquire) {
        // until the callback has filled a buffer (or the speaker is dropped)
        std::thread::park();
        let lost = rings.forward(&shared, clock.origin(), rate, &mut send);
        if lost > 0 {
            shared.lost.fetch_add(lost, Ordering::Relaxed);
        }
        let _ = room.try_send(());
    }
    drop(stream);
}

#[cfg(test)]
mod tests;
