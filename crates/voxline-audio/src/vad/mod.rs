//! Voice activity detection and end-pointing on 16 kHz mono audio.
//!
//! Two layers:
//! - [`SegmentTracker`] holds the decision logic. It is fed one frame at a time
//!   together with that frame's speech probability and cuts utterances out of
//!   the stream. It knows nothing about the detector, so it can be tested with
//!   exact, synthetic decisions.
//! - [`Endpointer`] buffers arbitrary chunks into 256-sample (16 ms) frames,
//!   scores each with earshot's detector and feeds the tracker.
//!
//! In files: the settings (`config`), the tracker and its segments
//! (`tracker`), where a forced split cuts (`split`), the endpointer
//! (`endpointer`).
//!
//! # Segmentation rules
//! All positions are absolute sample indices at 16 kHz counting every sample
//! pushed since the start of the stream.
//! - A frame is *speech* when its probability is `>= threshold`.
//! - An utterance opens at the first speech frame. Its `start_sample` is that
//!   frame's start minus `pre_roll_ms`, clamped at 0 and never reaching back into
//!   the previous segment, nor past the start of a new recording
//!   ([`SegmentTracker::clear_pre_roll`]).
//! - Every speech frame moves the utterance's end to that frame's end. Once
//!   `hangover_ms` of non-speech has followed the last speech frame, the
//!   utterance closes with `end_sample` = end of the last speech frame (the
//!   hangover silence is not included). The endpoint delay is therefore the
//!   hangover rounded up to the frame size.
//! - A closed utterance whose speech span (first speech frame start to last
//!   speech frame end, pre-roll excluded) is shorter than `min_speech_ms` is
//!   discarded and counted in [`VadStats::discarded_short`].
//! - When one more frame would take an open utterance past `max_utterance_ms`
//!   (measured from `start_sample`, pre-roll included) it is emitted at once
//!   with `forced_split = true` (so no segment is longer than
//!   `max_utterance_ms`). It is not cut at the limit, which in continuous
//!   speech falls mid-word, but at the quietest point of the last
//!   `split_search_ms` before it: after the frame, among those ending in that
//!   window (the current one included), that is not speech, or if all are,
//!   the one with the least energy (mean square, averaged with the five
//!   frames on either side: the quietest 176 ms, a gap between words rather
//!   than a soft consonant inside one). Equally quiet neighbouring
//!   frames (a pause of digital silence) form a run; the cut is after the
//!   middle frame of the latest such run. The window is at most a quarter of
//!   `max_utterance_ms`; with `split_search_ms = 0` the cut is at the limit.
//! - The rest continues at once as a *continuation* whose `start_sample` is
//!   `split_overlap_ms` (at most a quarter of `max_utterance_ms`, and never
//!   before the cut segment's start) before the cut: its `overlap_samples`
//!   lead-in repeats the end of the cut segment, so a recogniser hears the
//!   words around the cut in context, and `continues_previous` is `true`.
//!   No pre-roll is added. Only speech frames after the cut count as the
//!   continuation's speech. Continuations are never discarded as short (they
//!   are the rest of a long utterance); one that holds no speech frame after
//!   the cut before its hangover elapses is dropped silently, and so is an
//!   open continuation without speech that reaches the limit.
//! - A segment's `samples` are exactly the audio from `start_sample` to
//!   `end_sample` (no padding): `samples.len() == end_sample - start_sample`.
//!   Segments never overlap, except by a continuation's `overlap_samples`.

mod config;
mod endpointer;
mod split;
mod tracker;

pub use config::{VadConfig, DEFAULT_HANGOVER_MS, DEFAULT_SPEC_SILENCE_MS};
pub use endpointer::Endpointer;
pub use tracker::{OpenUtterance, Segment, SegmentTracker, VadStats};

use crate::TARGET_RATE;

/// Samples per detector frame (16 ms at 16 kHz), fixed by earshot.
pub const FRAME_SAMPLES: usize = 256;

/// How far the detector's decaying tail (frames at or above the speech
/// threshold but below the confident one) may run past the audio that was
/// sent or judged at a pause before that is stale: 64 ms, four detector
/// frames. A tail that runs on is speech going on softly. Shared by the
/// speculative attempt and the end-of-turn judgement.
pub(crate) const TAIL_GRACE: u64 = 4 * FRAME_SAMPLES as u64;

/// Largest accepted `max_utterance_ms` (10 minutes), which bounds memory per utterance.
pub const MAX_UTTERANCE_LIMIT_MS: u32 = 600_000;

/// Largest accepted `pre_roll_ms` and `hangover_ms` (10 seconds).
pub const MAX_PAD_MS: u32 = 10_000;

/// `ms` milliseconds in samples at 16 kHz.
pub(crate) fn ms_to_samples(ms: u32) -> u64 {
    u64::from(ms) * u64::from(TARGET_RATE) / 1000
}
