//! Acoustic echo cancellation: what the loudspeaker played, taken out of
//! what the microphone hears, before the VAD and the recogniser.
//!
//! The voice's output callback records the exact samples it sent and when
//! they reached the device ([`EchoReference`], fed by the output's watcher;
//! the callback itself never blocks or allocates). [`AecStage`] runs on its
//! own thread between the capture and the VAD: for each 10 ms block of the
//! microphone, captured at `t`, it hands WebRTC's echo canceller (AEC3,
//! through the pure-Rust port `sonora`) the far end that sounded from
//! `t + LEAD` on (waiting for it to be known, up to 20 ms), then the
//! block. AEC3 finds the echo's delay behind that
//! far end itself (its matched filters search some hundreds of ms), so
//! the sound server's buffering, which moves under load, is followed;
//! the lead covers a device that reports its playback a little late, so
//! the echo never comes before its reference.

mod delay;
mod path;
mod reference;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sonora::config::{EchoCanceller, HighPassFilter, NoiseSuppression, NoiseSuppressionLevel};
use sonora::{AudioProcessing, Config, StreamConfig};
use voxline_core::{AudioFrame, Emitter, Stage, StageError, StageId};

use delay::CoarseDelay;
use path::{EchoPath, Heard};
pub use reference::EchoReference;

/// The stage's name.
pub const AEC_STAGE_NAME: &str = "aec";
/// The stage's id in a topology.
pub const AEC_STAGE: StageId = StageId::new(AEC_STAGE_NAME);

/// Samples in one 10 ms block at 16 kHz: what AEC3 processes at a time.
pub const BLOCK: usize = 160;

/// How far ahead of a microphone block the far end is read: a device
/// that reports its playback up to this late still has its echo after
/// the reference. The far end must also be known by the time the block
/// is processed: the capture's and the output's latencies (~20 ms each
/// through PulseAudio here) bound the lead, or every block waits (below).
/// Through PulseAudio AEC3 found the echo 12 ms after a far end read
/// 40 ms ahead in most runs.
pub const LEAD: Duration = Duration::from_millis(40);

/// The longest a block waits for the far end it needs: the speaker's
/// thread moves what played after each buffer the device plays. A far end further behind than
/// this (a stalled output) is not waited for at all, and what is not known
/// is taken as silence, rather than holding the microphone back.
const REFERENCE_WAIT: Duration = Duration::from_millis(20);

/// How far the far end may drift from where the instants place it, on
/// average over the last blocks, before it is moved (see
/// `AecStage::align`): more than the jitter of the devices' instants.
const REALIGN_AFTER: Duration = Duration::from_millis(16);

/// A jump of the instants this large moves the far end at once.
const REALIGN_AT_ONCE: Duration = Duration::from_millis(120);

/// The weight of each block's offset in the average drift (a time
/// constant of ten blocks, 100 ms).
const DRIFT_SMOOTHING: f64 = 0.1;

/// The echo return loss enhancement over a second of the voice from which
/// the canceller counts as converged: speech over the voice is then judged
/// at the endpointer's usual threshold instead of the raised one. The
/// person talking over the voice counts in the figure too, so a second of
/// double talk may read lower.
const CONVERGED_DB: f64 = 10.0;

/// Blocks between two readings of the canceller's figures (1 s).
const STATS_EVERY: u64 = 100;

/// A skip this long in the capture's stream positions (a clock gap; 60 ms,
/// the capture's own threshold) is taken for a capture device that may have
/// changed: the echo path is judged afresh ([`DeviceChange::ClockGap`]).
const DEVICE_CHANGE_SKIP: u64 = 960;

/// The capture device may have changed: the canceller starts again and the
/// echo path is judged afresh, the echo guard strict meanwhile.
/// `"type": "capture_device_changed"`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CaptureDeviceChanged {
    /// The stream position where it was seen.
    pub at_sample: u64,
    /// How it showed.
    pub cause: DeviceChange,
    /// How much the stream positions skipped (ms), for a clock gap.
    pub skipped_ms: Option<f64>,
}

/// How a capture device change showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceChange {
    /// The capture stream skipped (a clock gap): a suspended source, or a
    /// device that went away where the sound server shows it so.
    ClockGap,
    /// In the middle of an answer judged without an echo path, the
    /// microphone began to hear the voice, its level following the
    /// voice's: PulseAudio moved a capture whose device went away to the
    /// loudspeaker's monitor, with no gap in the stream (issue 65), or
    /// headphones were taken off mid-answer.
    VoiceHeard,
}

impl voxline_core::EngineEvent for CaptureDeviceChanged {
    fn kind(&self) -> &'static str {
        "capture_device_changed"
    }
    fn utterance_id(&self) -> Option<voxline_core::UtteranceId> {
        None
    }
    fn sample(&self) -> Option<u64> {
        Some(self.at_sample)
    }
    fn fields_json(&self, _: &voxline_core::Clock) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

/// How the echo canceller runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AecOptions {
    /// WebRTC's noise suppressor (moderate) after the canceller: off by
    /// default (`--noise-suppression`).
    pub noise_suppression: bool,
}

/// What the echo canceller did over a session.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct AecSummary {
    /// 10 ms blocks of the microphone it processed.
    pub blocks: u64,
    /// Of them, blocks with the voice sounding in the far end.
    pub blocks_with_voice: u64,
    /// Echo return loss enhancement (dB): how much quieter the microphone's
    /// audio left the canceller than it came in, over the blocks the voice
    /// sounded in, the mean of its one-second figures; `None` before a
    /// second of the voice. The person speaking over the voice is in both,
    /// so double talk makes it lower than the echo alone would.
    pub erle_db: Option<f64>,
    /// The echo's delay behind the far end it was handed, as AEC3 found it
    /// (ms; the lead, the sound server's buffering and the room), the
    /// median of its one-second figures.
    pub delay_ms: Option<i32>,
    /// Whether noise suppression ran too.
    pub noise_suppression: bool,
    /// Times the far end was moved because the devices' instants drifted
    /// from it (see the stage).
    pub realignments: u64,
    /// How far behind where the devices' instants place it the far end is
    /// read (ms), when the echo came later than AEC3 searches: 0 unless
    /// they misreport by ~400 ms or more.
    pub far_end_back_ms: i64,
    /// Stretches of the voice (answers) the microphone did not hear at
    /// all (headphones): the canceller stood aside for them, so the person
    /// speaking over the voice was heard as they were.
    pub stretches_without_echo: u64,
    /// Stretches of the voice the microphone heard (or the person spoke
    /// from their start): the canceller took the voice out.
    pub stretches_with_echo: u64,
    /// Times the capture device may have changed (a clock gap, or the
    /// voice heard mid-answer): each time the canceller started again and
    /// the echo path was judged afresh.
    pub rejudged: u64,
    /// Of them, times the microphone began to hear the voice in the middle
    /// of an answer judged without an echo path ([`DeviceChange::VoiceHeard`]).
    pub voice_heard: u64,
}

/// Where a session's [`AecSummary`] is kept while the stage runs; cloning
/// shares it.
#[derive(Debug, Clone, Default)]
pub struct AecMeter(Arc<Mutex<Meter>>);

#[derive(Debug, Default)]
struct Meter {
    summary: AecSummary,
    erle: Vec<f64>,
    delays: Vec<i32>,
    /// The voice's blocks since the last ERLE figure, and the microphone's
    /// energy in them before and after the canceller.
    loud: u64,
    energy_in: f64,
    energy_out: f64,
}

impl Meter {
    /// ERLE over the blocks counted since the last figure, in dB.
    fn erle(&self) -> Option<f64> {
        (self.energy_in > 0.0).then(|| 10.0 * (self.energy_in / self.energy_out.max(1e-12)).log10())
    }
}

impl AecMeter {
    /// What the canceller did so far.
    #[must_use]
    pub fn summary(&self) -> AecSummary {
        let m = self.lock();
        let mut erle = m.erle.clone();
        // a short answer: what a quarter of a second of it shows
        if m.loud >= STATS_EVERY / 4 {
            erle.extend(m.erle());
        }
        let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let mut delays = m.delays.clone();
        delays.sort_unstable();
        AecSummary {
            erle_db: mean(&erle),
            delay_ms: delays.get(delays.len() / 2).copied(),
            ..m.summary.clone()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Meter> {
        voxline_core::sync::lock(&self.0)
    }
}

/// The echo canceller as a pipeline stage: 16 kHz frames in, the same
/// frames with the loudspeaker's echo taken out (10 ms later at most: it
/// works in whole blocks).
pub struct AecStage {
    apm: AudioProcessing,
    reference: EchoReference,
    meter: AecMeter,
    options: AecOptions,
    /// Microphone samples not yet a whole block, from `pending_start`
    /// (stream position, when captured).
    pending: Vec<f32>,
    pending_start: Option<(u64, Instant)>,
    /// The next frame's flag, carried to the first frame sent after it.
    new_recording: bool,
    /// Blocks with the voice in the far end since the canceller's delay
    /// was last read.
    loud_blocks: u64,
    far: [f32; BLOCK],
    near: [f32; BLOCK],
    /// The echo guard, told how loud each block was before the canceller.
    guard: Option<voxline_core::BargeIn>,
    /// Where the next block's far end starts in the reference (16 kHz
    /// position), once anything played.
    cursor: Option<i64>,
    /// The average offset of where the instants place the far end from
    /// the cursor, in samples.
    drift: f64,
    /// Whether the microphone hears the voice at all, stretch by stretch.
    path: EchoPath,
    /// An echo further behind than AEC3 searches, found by the levels.
    coarse: CoarseDelay,
    /// The far end as placed, for its level.
    placed: [f32; BLOCK],
    /// The last second's verdict on AEC3 (it took the voice out), and
    /// whether the echo guard was told otherwise since, for a stretch
    /// without an echo path.
    converged: bool,
    stood_aside: bool,
    /// The microphone began to hear the voice mid-answer, in the block
    /// just cancelled ([`DeviceChange::VoiceHeard`]).
    voice_heard: bool,
}

impl std::fmt::Debug for AecStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AecStage").finish_non_exhaustive()
    }
}

impl AecStage {
    /// A canceller taking `reference` out of the microphone, its figures
    /// kept in `meter`, as `options` say.
    #[must_use]
    pub fn new(reference: EchoReference, meter: AecMeter, options: AecOptions) -> Self {
        let suppress_noise = options.noise_suppression;
        meter.lock().summary.noise_suppression = suppress_noise;
        Self {
            apm: Self::canceller(suppress_noise),
            reference,
            meter,
            options,
            pending: Vec::with_capacity(BLOCK * 8),
            pending_start: None,
            new_recording: false,
            loud_blocks: 0,
            far: [0.0; BLOCK],
            near: [0.0; BLOCK],
            guard: None,
            cursor: None,
            drift: 0.0,
            path: EchoPath::default(),
            coarse: CoarseDelay::default(),
            placed: [0.0; BLOCK],
            converged: false,
            stood_aside: false,
            voice_heard: false,
        }
    }

    /// A fresh AEC3 (with noise suppression after it when asked).
    fn canceller(suppress_noise: bool) -> AudioProcessing {
        let config = Config {
            echo_canceller: Some(EchoCanceller::default()),
            high_pass_filter: Some(HighPassFilter::default()),
            noise_suppression: suppress_noise.then(|| NoiseSuppression {
                level: NoiseSuppressionLevel::Moderate,
                ..NoiseSuppression::default()
            }),
            ..Config::default()
        };
        let stream = StreamConfig::new(voxline_core::SAMPLE_RATE, 1);
        AudioProcessing::builder()
            .config(config)
            .capture_config(stream)
            .render_config(stream)
            .build()
    }

    /// The capture device may have changed, as `change` shows: the
    /// microphone may be another device, with another echo path, or none.
    /// AEC3 starts again, the echo path is judged afresh (cancelling
    /// meanwhile), the far end is placed again by the instants, and the
    /// echo guard is strict until the canceller has taken the voice out
    /// again. Before, a verdict of no echo path stood: a capture PulseAudio
    /// moved onto the loudspeaker's monitor heard the voice at full level,
    /// let through, and it was answered (issue 65).
    fn device_changed(&mut self, change: CaptureDeviceChanged, out: &mut Emitter<'_, AudioFrame>) {
        self.apm = Self::canceller(self.options.noise_suppression);
        self.path.rejudge();
        let back = self.coarse.back_blocks();
        self.coarse = CoarseDelay::default();
        if let Some(c) = self.cursor.as_mut().filter(|_| back != 0) {
            // the far end is placed by the instants again
            *c += back * BLOCK as i64;
        }
        self.drift = 0.0;
        if change.cause == DeviceChange::ClockGap {
            self.cursor = None;
        }
        (self.converged, self.stood_aside) = (false, false);
        if let Some(g) = &self.guard {
            g.set_echo_cancelled(false);
        }
        {
            let mut m = self.meter.lock();
            m.summary.rejudged += 1;
            if change.cause == DeviceChange::VoiceHeard {
                m.summary.voice_heard += 1;
            }
            (m.loud, m.energy_in, m.energy_out) = (0, 0.0, 0.0);
        }
        match change.cause {
            DeviceChange::ClockGap => tracing::warn!(
                skipped_ms = change.skipped_ms,
                "aec: the capture stream skipped (its device may have changed): the echo path is judged again"
            ),
            DeviceChange::VoiceHeard => tracing::warn!(
                "aec: the microphone began to hear the voice mid-answer (its device may have changed): \
                 the echo path is judged again"
            ),
        }
        out.publish(voxline_core::PipelineEvent::engine_event(change));
    }

    /// Tells `guard` how loud each block was before the canceller: the echo
    /// guard follows the voice's level in that, not in what is left of the
    /// echo after it ([`voxline_core::BargeIn::heard_raw`]); and, after
    /// each second of the voice, whether the canceller took it out
    /// ([`voxline_core::BargeIn::set_echo_cancelled`]).
    #[must_use]
    pub fn with_echo_guard(mut self, guard: voxline_core::BargeIn) -> Self {
        self.guard = Some(guard);
        self
    }

    /// Cancels one block in place; `captured` is when its first sample was.
    fn block(
        &mut self,
        block: &mut [f32],
        captured: Instant,
        out: &mut Emitter<'_, AudioFrame>,
    ) -> Result<(), StageError> {
        self.align(captured);
        let Some(cursor) = self.cursor else {
            // nothing has played yet
            self.far.fill(0.0);
            return self.cancel(block, captured);
        };
        // the far end this block needs may not have reached the reference
        // yet; one further behind than the wait (a stalled output) is not
        // waited for, or every block would wait and the audio fall behind
        let needed = cursor + BLOCK as i64;
        let deadline = Instant::now() + REFERENCE_WAIT;
        let behind = REFERENCE_WAIT.as_millis() as i64 * 16;
        // a wait on the output's device, not this stage's work
        out.waiting(|| self.reference.wait_known(needed, behind, deadline));
        self.reference.read_index(cursor, &mut self.far);
        let back = self.coarse.back_blocks() * BLOCK as i64;
        if back == 0 {
            self.placed = self.far;
        } else {
            self.reference.read_index(cursor + back, &mut self.placed);
        }
        self.cursor = Some(needed);
        self.cancel(block, captured)
    }

    /// Where the far end handed to AEC3 next starts. AEC3 needs it as one
    /// continuous stream, each sample once and in order: its filter models
    /// the echo path from it. The instants that place it (the capture's and
    /// the output's, as their devices report them) jitter by some ms, so
    /// the far end is read on from where the last block ended, and moved
    /// only when the instants say it has drifted: by more than
    /// `REALIGN_AFTER` on average (two devices' clocks drifting, the sound
    /// server's buffering changing), or by more than `REALIGN_AT_ONCE` at
    /// one block (the output restarted).
    ///
    /// An echo further behind than AEC3 finds moves the far end back
    /// ([`CoarseDelay`]): it is placed that much earlier.
    fn align(&mut self, captured: Instant) {
        let Some(ideal) = self.reference.index_at(captured + LEAD) else {
            return;
        };
        let ideal = ideal - (self.coarse.back_blocks() * BLOCK as i64) as f64;
        let Some(cursor) = self.cursor else {
            self.cursor = Some(ideal.round() as i64);
            return;
        };
        let off = ideal - cursor as f64;
        self.drift += DRIFT_SMOOTHING * (off - self.drift);
        let limit = |d: Duration| d.as_secs_f64() * 16_000.0;
        if off.abs() > limit(REALIGN_AT_ONCE) || self.drift.abs() > limit(REALIGN_AFTER) {
            let by = if off.abs() > limit(REALIGN_AT_ONCE) {
                off
            } else {
                self.drift
            };
            self.cursor = Some(cursor + by.round() as i64);
            self.drift = 0.0;
            self.meter.lock().summary.realignments += 1;
            tracing::debug!(by_ms = by / 16.0, "aec: the far end re-aligned");
        }
    }

    /// Hands AEC3 the far end in `self.far`, then cancels `block`.
    fn cancel(&mut self, block: &mut [f32], captured: Instant) -> Result<(), StageError> {
        let mean_square = |s: &[f32]| s.iter().map(|x| x * x).sum::<f32>() / s.len().max(1) as f32;
        let far = mean_square(&self.far);
        let n = block.len();
        let raw = mean_square(block);
        // the voice sounds in the block: above -60 dBFS
        let loud = far > 1e-6;
        let heard = self.path.block(far, raw);
        self.coarse.block(mean_square(&self.placed), raw);
        if let Some(since) = self.path.appeared().filter(|_| heard == Heard::Absent) {
            if self.coarse.follows_the_voice(since) {
                // judged afresh once this block is out (`send`)
                self.voice_heard = true;
            } else {
                // a person speaking over the voice
                self.path.not_appeared();
            }
        }
        if heard == Heard::Absent {
            // no echo path in this stretch of the voice: nothing to take
            // out, and AEC3 would take the person down while it learns that
            self.far.fill(0.0);
        }
        let bad = |e: sonora::Error| StageError::fatal(format!("echo cancellation failed: {e}"));
        let mut far_out = [0.0f32; BLOCK];
        self.apm
            .process_render_f32(&[&self.far], &mut [&mut far_out])
            .map_err(bad)?;
        if let Some(g) = &self.guard {
            g.heard_raw(captured, raw);
        }
        self.near[..n].copy_from_slice(block);
        self.near[n..].fill(0.0);
        let mut out = [0.0f32; BLOCK];
        self.apm
            .process_capture_f32(&[&self.near], &mut [&mut out])
            .map_err(bad)?;
        block.copy_from_slice(&out[..n]);
        let mut m = self.meter.lock();
        m.summary.blocks += 1;
        (
            m.summary.stretches_without_echo,
            m.summary.stretches_with_echo,
        ) = self.path.stretches();
        if loud && heard == Heard::Absent {
            m.summary.blocks_with_voice += 1;
            // nothing sounds like the voice: speech over it is speech
            if let (Some(g), false) = (&self.guard, self.stood_aside) {
                g.set_echo_cancelled(true);
            }
            self.stood_aside = true;
        } else if loud {
            if let (Some(g), true) = (&self.guard, std::mem::take(&mut self.stood_aside)) {
                g.set_echo_cancelled(self.converged);
            }
            m.summary.blocks_with_voice += 1;
            self.loud_blocks += 1;
            let energy = |s: &[f32]| s.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>();
            m.loud += 1;
            m.energy_in += energy(&self.near[..n]);
            m.energy_out += energy(block);
            // a figure for each second of the voice
            if m.loud == STATS_EVERY {
                let e = m.erle();
                m.erle.extend(e);
                (m.loud, m.energy_in, m.energy_out) = (0, 0.0, 0.0);
                let was =
                    std::mem::replace(&mut self.converged, e.is_some_and(|e| e >= CONVERGED_DB));
                if let Some(g) = &self.guard {
                    g.set_echo_cancelled(self.converged);
                }
                // two seconds of the voice heard and not taken out: is the
                // echo further behind than AEC3 looks?
                if !was && !self.converged && heard == Heard::Present {
                    if let Some(moved) = self.coarse.not_converged() {
                        if let Some(c) = self.cursor.as_mut() {
                            *c -= moved * BLOCK as i64;
                        }
                        m.summary.far_end_back_ms = self.coarse.back_ms();
                        tracing::info!(
                            back_ms = self.coarse.back_ms(),
                            "aec: the echo comes later than the canceller looks: the far end is read further back"
                        );
                    }
                }
            }
        }
        // AEC3's delay, aggregated by the second, for a second the voice sounded in
        if m.summary.blocks.is_multiple_of(STATS_EVERY) {
            if self.loud_blocks >= STATS_EVERY / 4 {
                if let Some(d) = self.apm.statistics().delay_ms {
                    m.delays.push(d);
                }
            }
            self.loud_blocks = 0;
        }
        Ok(())
    }

    /// Sends what is pending as a frame: the whole blocks, or everything
    /// (the last block padded for the canceller) when `all`.
    fn send(
        &mut self,
        all: bool,
        end_of_stream: bool,
        out: &mut Emitter<'_, AudioFrame>,
    ) -> Result<(), StageError> {
        let Some((start, captured)) = self.pending_start else {
            return Ok(());
        };
        let whole = if all {
            self.pending.len()
        } else {
            self.pending.len() - self.pending.len() % BLOCK
        };
        if whole == 0 && !end_of_stream {
            return Ok(());
        }
        let mut samples: Vec<f32> = self.pending.drain(..whole).collect();
        for (i, b) in samples.chunks_mut(BLOCK).enumerate() {
            let at = captured + Duration::from_secs_f64((i * BLOCK) as f64 / 16_000.0);
            self.block(b, at, out)?;
            if std::mem::take(&mut self.voice_heard) {
                let change = CaptureDeviceChanged {
                    at_sample: start + (i * BLOCK) as u64,
                    cause: DeviceChange::VoiceHeard,
                    skipped_ms: None,
                };
                self.device_changed(change, out);
            }
        }
        let sent = samples.len() as u64;
        out.emit(AudioFrame {
            start_sample: start,
            samples,
            captured,
            new_recording: std::mem::take(&mut self.new_recording),
            end_of_stream,
        });
        self.pending_start = (!self.pending.is_empty()).then(|| {
            (
                start + sent,
                captured + Duration::from_secs_f64(sent as f64 / 16_000.0),
            )
        });
        Ok(())
    }
}

impl Stage for AecStage {
    type In = AudioFrame;
    type Out = AudioFrame;

    fn name(&self) -> &str {
        AEC_STAGE_NAME
    }

    /// No engine: ~0.1 ms of one core per 10 ms block, beside them.
    fn leased(&self) -> bool {
        false
    }

    fn process(
        &mut self,
        frame: AudioFrame,
        out: &mut Emitter<'_, AudioFrame>,
    ) -> Result<(), StageError> {
        let expected = self
            .pending_start
            .map(|(s, _)| s + self.pending.len() as u64);
        if expected.is_some_and(|e| e != frame.start_sample) || frame.new_recording {
            // audio was lost before this frame: what came before goes on
            // its own, and the blocks start again at the frame
            self.send(true, false, out)?;
        }
        if let Some(skipped) = expected
            .and_then(|e| frame.start_sample.checked_sub(e))
            .filter(|&s| s >= DEVICE_CHANGE_SKIP)
        {
            let change = CaptureDeviceChanged {
                at_sample: frame.start_sample,
                cause: DeviceChange::ClockGap,
                skipped_ms: Some(skipped as f64 / 16.0),
            };
            self.device_changed(change, out);
        }
        if frame.new_recording {
            self.new_recording = true;
        }
        match self.pending_start.as_mut() {
            None => self.pending_start = Some((frame.start_sample, frame.captured)),
            // the samples carried over are placed by the newest frame's
            // instant: the capture re-anchors its instants on the device's
            // clock, and a position counted on from the first frame would
            // drift from them (by 0.66 s in a live test's first turn)
            Some((_, captured)) => {
                let carried = Duration::from_secs_f64(self.pending.len() as f64 / 16_000.0);
                *captured = frame
                    .captured
                    .checked_sub(carried)
                    .unwrap_or(frame.captured);
            }
        }
        self.pending.extend_from_slice(&frame.samples);
        if frame.end_of_stream {
            self.send(true, true, out)
        } else {
            self.send(false, false, out)
        }
    }

    fn finish(&mut self, out: &mut Emitter<'_, AudioFrame>) -> Result<(), StageError> {
        self.send(true, false, out)
    }
}

#[cfg(test)]
mod tests;
