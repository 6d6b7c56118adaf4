//! A live session's source: how it runs and ends ([`LiveOptions`]), the
//! capture loop that watches the queues in front of the engines, and what
//! the capture did ([`LiveReport`]).

use std::time::Instant;

use voxline_core::StageId;

/// How a live session runs and when it ends.
#[derive(Debug, Clone, Default)]
pub struct LiveOptions {
    /// The input device (`None` = the default one).
    pub device: Option<String>,
    /// End after this many turns.
    pub max_turns: Option<u64>,
    /// End after this long.
    pub max_duration: Option<std::time::Duration>,
    /// Frames the audio edge holds before dropping the oldest.
    pub audio_queue_frames: usize,
    /// The capture period to ask the device for, in ms (`None`: the smallest
    /// it supports from 10 ms up).
    pub capture_buffer_ms: Option<u32>,
    /// Where a pipeline that speaks plays its voice (`None` = the default output).
    pub output_device: Option<String>,
}

/// What the live capture did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LiveReport {
    /// The device opened.
    pub device: String,
    /// Its native format: rate, channels, sample format.
    pub format: String,
    /// Device frames captured.
    pub frames_captured: u64,
    /// Device frames dropped because the capture ring was full.
    pub frames_dropped_in_ring: u64,
    /// The same drops in 16 kHz frames (the unit of `summary.dropped`).
    #[serde(skip)]
    pub frames_dropped_in_ring_16k: u64,
    /// Why capture ended.
    pub end: String,
    /// Stream errors reported by the device.
    pub stream_errors: Vec<String>,
    /// The capture period asked for, in device frames (null: the device's default).
    pub buffer_requested_frames: Option<u32>,
    /// The period the device granted, in device frames (null: the host cannot say).
    pub buffer_frames: Option<u32>,
    /// The granted period in ms.
    pub buffer_ms: Option<f64>,
    /// Why the period asked for differs from the one wanted, if it does.
    pub buffer_note: Option<String>,
    /// Times the capture device may have changed mid-session, each with a
    /// warning: the capture stream broke (a clock gap: a suspended source,
    /// an overrun, a device that went away where the sound server shows it
    /// so), or, with the echo canceller, the microphone began to hear the
    /// voice mid-answer (PulseAudio moves a capture whose device went away
    /// to the loudspeaker's monitor with no gap). Each one the echo path is
    /// judged again.
    pub device_changes: u64,
    /// Capture placement: blocks timed by the device or by arrival, the
    /// device latency (capture → callback) and clock gaps.
    pub timing: voxline_audio::CaptureTiming,
    /// Where the voice played, if the pipeline speaks.
    pub voice_output: Option<VoiceOutputReport>,
}

/// What the playback of the voice did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VoiceOutputReport {
    /// The output device.
    pub device: String,
    /// Its format: rate, channels, sample format.
    pub format: String,
    /// The output stream's latency (callback → playback) at the end, ms.
    pub output_latency_ms: f64,
    /// Callbacks that ran dry while more of the voice was coming.
    pub underruns: u64,
    /// Times the device stopped taking audio while the voice was queued on
    /// it (it asked for none for 2 s: a suspended or stalled output).
    pub stalls: u64,
    /// How long it took no audio in those stalls, ms (to the end of the
    /// session for one still going on).
    pub stalled_ms: f64,
    /// The voice lost to the stalls, ms: queued on the device when it
    /// stalled, or given to it while it was stalled.
    pub stalled_voice_ms: f64,
    /// How the play-out at the end of the session ended: `played` (all of
    /// the voice played), `stopped` (a stop was asked for: the rest was
    /// dropped), `time_limit` (30 s after the run ended) or `stalled` (the
    /// device took no audio).
    pub play_out: String,
    /// What the echo canceller did (`None`: none ran, `--no-aec`).
    pub echo_cancellation: Option<voxline_audio::AecSummary>,
}

/// `frames` at `rate` Hz as 16 kHz frames (rounded).
fn to_16k(frames: u64, rate: u32) -> u64 {
    let rate = u128::from(rate.max(1));
    ((u128::from(frames) * 16_000 + rate / 2) / rate) as u64
}

/// Runs live capture until it should stop; returns the capture figures, the
/// 16 kHz samples captured, and whether a stop was requested.
pub(super) fn live_source(
    live: &LiveOptions,
    capture: voxline_audio::Capture,
    turns_done: &std::sync::atomic::AtomicU64,
    watched: &[(StageId, Option<std::sync::Arc<voxline_core::EdgeStats>>)],
    stop: &dyn Fn() -> bool,
) -> ((LiveReport, u64), bool) {
    let f = capture.format().clone();
    let started = Instant::now();
    let mut last_depth: Vec<usize> = vec![0; watched.len()];
    let mut growing: Vec<u32> = vec![0; watched.len()];
    let mut next_check = started + std::time::Duration::from_secs(1);
    let mut gaps_seen = 0;
    let stopped = loop {
        if stop() {
            break true;
        }
        if live
            .max_turns
            .is_some_and(|n| turns_done.load(std::sync::atomic::Ordering::Relaxed) >= n)
            || live.max_duration.is_some_and(|d| started.elapsed() >= d)
            || capture.is_finished()
        {
            break false;
        }
        let (gaps, last_ms) = capture.clock_gaps();
        if gaps > gaps_seen {
            gaps_seen = gaps;
            eprintln!(
                "voxline: warning: capture device changed or stalled: the capture clock skipped {last_ms} ms \
                 (a device that went away, a suspended source); the echo path is judged again"
            );
        }
        if Instant::now() >= next_check {
            next_check += std::time::Duration::from_secs(1);
            for (i, (stage, stats)) in watched.iter().enumerate() {
                let Some(st) = stats else { continue };
                let depth = st.sent().saturating_sub(st.received() + st.dropped()) as usize;
                growing[i] = if depth > last_depth[i] {
                    growing[i] + 1
                } else {
                    0
                };
                if growing[i] == 3 || (depth >= 3 && depth > last_depth[i]) {
                    eprintln!("voxline: warning: {stage} is falling behind real time ({depth} turns waiting for it)");
                }
                last_depth[i] = depth;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stats = capture.stop();
    let report = LiveReport {
        device: format!("{} ({})", f.device_id, f.device_name),
        format: format!(
            "{} Hz, {} ch, {}",
            f.sample_rate, f.channels, f.sample_format
        ),
        frames_captured: stats.frames_captured,
        frames_dropped_in_ring: stats.frames_dropped_in_ring,
        frames_dropped_in_ring_16k: to_16k(stats.frames_dropped_in_ring, f.sample_rate),
        end: format!("{:?}", stats.end),
        stream_errors: stats.stream_errors.clone(),
        buffer_requested_frames: f.buffer_requested_frames,
        buffer_frames: f.buffer_frames,
        buffer_ms: f.buffer_ms(),
        buffer_note: f.buffer_note.clone(),
        device_changes: stats.timing.clock_gaps,
        timing: stats.timing.clone(),
        voice_output: None,
    };
    ((report, stats.end_sample), stopped)
}
