//! The segmentation rules (see [`super`]): frames and their speech
//! probabilities in, utterances out.

use std::collections::VecDeque;

use super::split::quietest_cut;
use super::{ms_to_samples, VadConfig, FRAME_SAMPLES};
use crate::{AudioError, TARGET_RATE};

/// One utterance cut from the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// First sample (16 kHz, absolute in the stream), pre-roll included.
    pub start_sample: u64,
    /// One past the last sample: the end of the last speech frame, or the split point for a forced split.
    pub end_sample: u64,
    /// The audio from `start_sample` to `end_sample`.
    pub samples: Vec<f32>,
    /// `true` when the utterance hit `max_utterance_ms` and was cut; the next segment continues it.
    pub forced_split: bool,
    /// `true` when this segment is the rest of the previous one, which was a forced split.
    pub continues_previous: bool,
    /// Leading samples that repeat the end of the previous segment (a
    /// continuation's lead-in); 0 unless `continues_previous`.
    pub overlap_samples: u64,
}

impl Segment {
    /// The segment's length in seconds.
    pub fn duration_secs(&self) -> f64 {
        (self.end_sample - self.start_sample) as f64 / f64::from(TARGET_RATE)
    }
}

/// A view of the open utterance (see [`SegmentTracker::open_utterance`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpenUtterance<'a> {
    /// First sample, pre-roll included.
    pub start_sample: u64,
    /// One past the end of the last speech frame.
    pub end_sample: u64,
    /// Whether it would be kept if it closed now (long enough, or a continuation).
    pub keepable: bool,
    /// The start of its first speech frame (after the pre-roll).
    pub first_speech: u64,
    /// The audio from `start_sample` to `end_sample`.
    pub samples: &'a [f32],
    /// One past the end of the last confident speech frame (see
    /// [`VadConfig::spec_threshold`]), at most `end_sample`; `None` while the
    /// utterance holds none.
    pub confident_end: Option<u64>,
    /// The audio from `start_sample` up to the current position (the
    /// silence after `end_sample` so far included).
    pub samples_to_now: &'a [f32],
    /// Whether it is the rest of a forced split (see [`Segment::continues_previous`]).
    pub continues_previous: bool,
    /// Its lead-in (see [`Segment::overlap_samples`]).
    pub overlap_samples: u64,
}

/// Counters kept by the tracker since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VadStats {
    /// Frames judged.
    pub frames: u64,
    /// Frames judged to be speech.
    pub speech_frames: u64,
    /// Segments emitted (forced splits included).
    pub segments: u64,
    /// Utterances dropped for being shorter than `min_speech_ms`.
    pub discarded_short: u64,
    /// Segments emitted because they reached `max_utterance_ms`.
    pub forced_splits: u64,
}

/// An utterance that is still open.
#[derive(Debug)]
struct Open {
    start: u64,
    /// Audio from `start` up to the current position.
    samples: Vec<f32>,
    /// Start of the first speech frame, if any speech has been seen.
    first_speech: Option<u64>,
    /// End of the last speech frame (== `start` until speech is seen).
    speech_end: u64,
    /// End of the last confident speech frame (see [`VadConfig::spec_threshold`]).
    confident_end: Option<u64>,
    /// Opened by a forced split: exempt from the minimum-length check.
    continuation: bool,
    /// A continuation's lead-in before the cut.
    overlap: u64,
}

/// The end-pointing state machine, fed one frame and its speech probability at a time.
///
/// See the [module documentation](self) for the rules. Memory is bounded by the
/// pre-roll ring plus one utterance of at most `max_utterance_ms`.
#[derive(Debug)]
pub struct SegmentTracker {
    config: VadConfig,
    min_speech: u64,
    hangover: u64,
    pre_roll: usize,
    max_len: u64,
    /// The forced-split search window and lead-in, in samples (capped).
    split_search: u64,
    split_overlap: u64,
    /// `(start, end, is_speech)` of the most recent frames: those ending in
    /// the last `split_search` samples, where a forced split may cut.
    recent: VecDeque<(u64, u64, bool)>,
    /// Position of the next sample.
    pos: u64,
    /// The most recent audio while no utterance is open (at most `pre_roll` samples).
    ring: VecDeque<f32>,
    open: Option<Open>,
    stats: VadStats,
}

impl SegmentTracker {
    /// Creates a tracker.
    ///
    /// # Errors
    /// [`AudioError::InvalidVadConfig`] when `config` fails [`VadConfig::validate`].
    pub fn new(config: VadConfig) -> Result<Self, AudioError> {
        config.validate()?;
        let pre_roll = usize::try_from(ms_to_samples(config.pre_roll_ms)).unwrap_or(usize::MAX);
        let max_len = ms_to_samples(config.max_utterance_ms);
        let split_search = ms_to_samples(config.split_search_ms).min(max_len / 4);
        Ok(SegmentTracker {
            min_speech: ms_to_samples(config.min_speech_ms),
            hangover: ms_to_samples(config.hangover_ms),
            max_len,
            split_search,
            split_overlap: ms_to_samples(config.split_overlap_ms).min(max_len / 4),
            recent: VecDeque::with_capacity(
                usize::try_from(split_search / FRAME_SAMPLES as u64 + 2).unwrap_or(0),
            ),
            pre_roll,
            ring: VecDeque::with_capacity(pre_roll),
            pos: 0,
            open: None,
            stats: VadStats::default(),
            config,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &VadConfig {
        &self.config
    }

    /// Judges the frames from now on against speech probability `threshold`
    /// (e.g. a higher one while the assistant's voice plays).
    pub fn set_threshold(&mut self, threshold: f32) {
        self.config.threshold = threshold;
    }

    /// Counters since creation.
    pub fn stats(&self) -> VadStats {
        self.stats
    }

    /// The absolute position of the next sample.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Whether an utterance is open (speech seen and not yet closed).
    pub fn in_utterance(&self) -> bool {
        self.open.is_some()
    }

    /// Forgets the audio kept for pre-roll: a new recording starts here, so
    /// an utterance opening next does not reach back before this point.
    pub fn clear_pre_roll(&mut self) {
        self.ring.clear();
    }

    /// The open utterance as it would close now, if one is open and holds
    /// speech: what a speculative end of turn sends downstream.
    pub fn open_utterance(&self) -> Option<OpenUtterance<'_>> {
        let open = self.open.as_ref()?;
        let first_speech = open.first_speech?;
        if open.speech_end <= open.start {
            return None;
        }
        let keep = usize::try_from(open.speech_end - open.start)
            .unwrap_or(usize::MAX)
            .min(open.samples.len());
        Some(OpenUtterance {
            start_sample: open.start,
            first_speech,
            end_sample: open.speech_end,
            keepable: open.continuation || open.speech_end - first_speech >= self.min_speech,
            samples: &open.samples[..keep],
            confident_end: open.confident_end,
            samples_to_now: &open.samples,
            continues_previous: open.continuation,
            overlap_samples: open.overlap,
        })
    }

    /// Feeds one frame (normally [`FRAME_SAMPLES`] long; any length is accepted)
    /// with its speech probability; returns a segment when one closes.
    pub fn push_frame(&mut self, frame: &[f32], speech_prob: f32) -> Option<Segment> {
        let frame_start = self.pos;
        let frame_end = frame_start + frame.len() as u64;
        self.pos = frame_end;
        self.stats.frames += 1;
        let is_speech = speech_prob >= self.config.threshold;
        if is_speech {
            self.stats.speech_frames += 1;
        }
        // Frames a forced split may cut after: those ending in the search window.
        while self
            .recent
            .front()
            .is_some_and(|&(_, end, _)| end + self.split_search < frame_end)
        {
            self.recent.pop_front();
        }
        self.recent.push_back((frame_start, frame_end, is_speech));

        let Some(open) = self.open.as_mut() else {
            if is_speech {
                let mut samples = Vec::with_capacity(self.ring.len() + frame.len());
                samples.extend(self.ring.drain(..));
                samples.extend_from_slice(frame);
                self.open = Some(Open {
                    start: frame_start - (samples.len() - frame.len()) as u64,
                    samples,
                    first_speech: Some(frame_start),
                    speech_end: frame_end,
                    confident_end: (speech_prob >= self.config.spec_threshold).then_some(frame_end),
                    continuation: false,
                    overlap: 0,
                });
                return self.check_forced_split(frame_end, frame.len() as u64);
            }
            self.remember(frame);
            return None;
        };

        open.samples.extend_from_slice(frame);
        if is_speech {
            open.first_speech.get_or_insert(frame_start);
            open.speech_end = frame_end;
            if speech_prob >= self.config.spec_threshold {
                open.confident_end = Some(frame_end);
            }
        } else if frame_end - open.speech_end >= self.hangover {
            return self.close();
        }
        self.check_forced_split(frame_end, frame.len() as u64)
    }

    /// Closes the open utterance now, at the end of its last speech frame,
    /// without waiting for the hangover (the end of turn was decided
    /// otherwise), applying the usual minimum-length rule; the stream goes on.
    pub fn end_utterance(&mut self) -> Option<Segment> {
        if self.open.is_some() {
            self.close()
        } else {
            None
        }
    }

    /// Cuts the open utterance's head off before position `at`: what came
    /// before it was decided to be a turn of its own (see the VAD stage's
    /// split at a pause). `first_speech` is the first speech frame after
    /// the cut. Nothing happens when no utterance is open or `at` is not
    /// inside it.
    pub fn split_open(&mut self, at: u64, first_speech: u64) {
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if at <= open.start || at > open.speech_end {
            return;
        }
        let cut = usize::try_from(at - open.start)
            .unwrap_or(usize::MAX)
            .min(open.samples.len());
        open.samples.drain(..cut);
        open.start += cut as u64;
        open.first_speech = Some(first_speech.max(open.start));
        open.confident_end = open.confident_end.filter(|&c| c > open.start);
        open.continuation = false;
        open.overlap = 0;
    }

    /// Ends the stream: closes an open utterance at the end of its last speech
    /// frame (no hangover wait), applying the usual minimum-length rule. The
    /// tracker then starts a new stream at position 0; stats are kept.
    pub fn finish(&mut self) -> Option<Segment> {
        let segment = if self.open.is_some() {
            self.close()
        } else {
            None
        };
        self.pos = 0;
        self.ring.clear();
        self.recent.clear();
        self.open = None;
        segment
    }

    /// Adds audio to the pre-roll ring, keeping only the newest `pre_roll` samples.
    fn remember(&mut self, audio: &[f32]) {
        if self.pre_roll == 0 {
            return;
        }
        let audio = &audio[audio.len().saturating_sub(self.pre_roll)..];
        let overflow = (self.ring.len() + audio.len()).saturating_sub(self.pre_roll);
        self.ring.drain(..overflow);
        self.ring.extend(audio.iter().copied());
    }

    /// Closes the open utterance at its last speech frame.
    fn close(&mut self) -> Option<Segment> {
        let open = self.open.take()?;
        let keep = usize::try_from(open.speech_end - open.start)
            .unwrap_or(usize::MAX)
            .min(open.samples.len());
        // The silence after the last speech frame becomes pre-roll for the next utterance.
        self.ring.clear();
        self.remember(&open.samples[keep..]);
        let first_speech = open.first_speech?;
        if open.speech_end <= open.start {
            // A continuation that a forced split left empty.
            return None;
        }
        if !open.continuation && open.speech_end - first_speech < self.min_speech {
            self.stats.discarded_short += 1;
            tracing::debug!(
                start = first_speech,
                end = open.speech_end,
                "discarding an utterance shorter than min_speech_ms"
            );
            return None;
        }
        let mut samples = open.samples;
        samples.truncate(keep);
        self.stats.segments += 1;
        Some(Segment {
            start_sample: open.start,
            end_sample: open.speech_end,
            samples,
            forced_split: false,
            continues_previous: open.continuation,
            overlap_samples: open.overlap,
        })
    }

    /// Emits the open utterance when another frame of `frame_len` samples would
    /// take it past the maximum length, cut at the quietest point of the search
    /// window, and opens its continuation with the lead-in before the cut.
    fn check_forced_split(&mut self, frame_end: u64, frame_len: u64) -> Option<Segment> {
        let open = self.open.as_mut()?;
        if frame_end - open.start + frame_len <= self.max_len {
            return None;
        }
        if open.first_speech.is_none() {
            // A continuation that never heard speech after its cut: nothing to split.
            return self.close();
        }
        let start = open.start;
        let cut = quietest_cut(&self.recent, start, frame_end, &open.samples);
        let lead = self.split_overlap.min(cut - start);
        let from = cut - lead;
        let rest_at = usize::try_from(from - start).unwrap_or(usize::MAX);
        let rest = open.samples[rest_at..].to_vec();
        let mut samples = std::mem::take(&mut open.samples);
        samples.truncate(usize::try_from(cut - start).unwrap_or(usize::MAX));
        // Only speech after the cut is the continuation's own.
        let spoken_after = |&&(_, end, speech): &&(u64, u64, bool)| speech && end > cut;
        let first_speech = self
            .recent
            .iter()
            .find(spoken_after)
            .map(|&(s, _, _)| s.max(cut));
        let speech_end = self
            .recent
            .iter()
            .rfind(spoken_after)
            .map_or(cut, |&(_, end, _)| end);
        let (continues_previous, overlap) = (open.continuation, open.overlap);
        *open = Open {
            start: from,
            samples: rest,
            first_speech,
            speech_end,
            confident_end: (speech_end > cut).then_some(speech_end),
            continuation: true,
            overlap: lead,
        };
        self.stats.segments += 1;
        self.stats.forced_splits += 1;
        Some(Segment {
            start_sample: start,
            end_sample: cut,
            samples,
            forced_split: true,
            continues_previous,
            overlap_samples: overlap,
        })
    }
}

#[cfg(test)]
mod tests;
