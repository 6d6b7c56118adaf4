//! The endpointer: any chunking of the stream in, earshot's detector on
//! each frame, the tracker's utterances out.

use super::{OpenUtterance, Segment, SegmentTracker, VadConfig, VadStats, FRAME_SAMPLES};
use crate::AudioError;

/// Cuts a 16 kHz mono stream into utterances with earshot's voice detector.
pub struct Endpointer {
    detector: Box<earshot::Detector>,
    tracker: SegmentTracker,
    /// Samples of the incomplete frame.
    pending: Vec<f32>,
    /// Scratch copy of a frame, clamped to [-1, 1] for the detector.
    scratch: [f32; FRAME_SAMPLES],
}

impl std::fmt::Debug for Endpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpointer")
            .field("tracker", &self.tracker)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl Endpointer {
    /// Creates an endpointer with a fresh detector.
    ///
    /// # Errors
    /// [`AudioError::InvalidVadConfig`] when `config` fails [`VadConfig::validate`].
    pub fn new(config: VadConfig) -> Result<Self, AudioError> {
        Ok(Endpointer {
            detector: earshot::Detector::default_boxed(),
            tracker: SegmentTracker::new(config)?,
            pending: Vec::with_capacity(FRAME_SAMPLES),
            scratch: [0.0; FRAME_SAMPLES],
        })
    }

    /// Feeds 16 kHz mono samples of any count; returns the segments that closed.
    pub fn push(&mut self, samples: &[f32]) -> Vec<Segment> {
        let mut segments = Vec::new();
        let mut rest = samples;
        if !self.pending.is_empty() {
            let take = (FRAME_SAMPLES - self.pending.len()).min(rest.len());
            self.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.pending.len() < FRAME_SAMPLES {
                return segments;
            }
            let frame = std::mem::take(&mut self.pending);
            segments.extend(self.judge(&frame));
            self.pending = frame;
            self.pending.clear();
        }
        let mut frames = rest.chunks_exact(FRAME_SAMPLES);
        for frame in &mut frames {
            segments.extend(self.judge(frame));
        }
        self.pending.extend_from_slice(frames.remainder());
        segments
    }

    /// Ends the stream: judges a final partial frame (zero-padded for the detector),
    /// then closes any open utterance. The endpointer then starts a new stream at
    /// position 0 with a reset detector; stats are kept.
    pub fn finish(&mut self) -> Option<Segment> {
        let mut from_frame = None;
        if !self.pending.is_empty() {
            let frame = std::mem::take(&mut self.pending);
            from_frame = self.judge(&frame);
            self.pending = frame;
            self.pending.clear();
        }
        // If the last frame closed or split the utterance, what is left open is
        // empty, so at most one of the two is a segment.
        let from_close = self.tracker.finish();
        self.detector.reset();
        from_close.or(from_frame)
    }

    /// Closes the open utterance now (see [`SegmentTracker::end_utterance`]);
    /// the partial detector frame pending stays for the stream's next frame.
    pub fn end_utterance(&mut self) -> Option<Segment> {
        self.tracker.end_utterance()
    }

    /// Cuts the open utterance's head off before `at` (see
    /// [`SegmentTracker::split_open`]).
    pub fn split_open(&mut self, at: u64, first_speech: u64) {
        self.tracker.split_open(at, first_speech);
    }

    /// Counters since creation.
    pub fn stats(&self) -> VadStats {
        self.tracker.stats()
    }

    /// A new recording starts with the next sample pushed: the partial
    /// detector frame still pending (less than 16 ms of what came before) is
    /// judged on its own (zero-padded for the detector, as at the end of a
    /// stream), then the pre-roll is forgotten (see
    /// [`SegmentTracker::clear_pre_roll`]). So the recording's first frame
    /// starts at its first sample, and nothing of what came before stands in
    /// front of its first utterance: how long the silence before it was no
    /// longer moves its cut. Returns the segment that frame closed, if any.
    pub fn clear_pre_roll(&mut self) -> Option<Segment> {
        let mut closed = None;
        if !self.pending.is_empty() {
            let frame = std::mem::take(&mut self.pending);
            closed = self.judge(&frame);
            self.pending = frame;
            self.pending.clear();
        }
        self.tracker.clear_pre_roll();
        closed
    }

    /// The open utterance as it would close now (see [`SegmentTracker::open_utterance`]).
    pub fn open_utterance(&self) -> Option<OpenUtterance<'_>> {
        self.tracker.open_utterance()
    }

    /// Judges the frames from now on against speech probability `threshold`.
    pub fn set_threshold(&mut self, threshold: f32) {
        self.tracker.set_threshold(threshold);
    }

    /// The configuration in use.
    pub fn config(&self) -> &VadConfig {
        self.tracker.config()
    }

    /// The absolute position of the next sample pushed, counting all samples pushed so far.
    pub fn position(&self) -> u64 {
        self.tracker.position() + self.pending.len() as u64
    }

    /// Scores one frame (zero-padding a short one) and feeds the tracker.
    fn judge(&mut self, frame: &[f32]) -> Option<Segment> {
        self.scratch.fill(0.0);
        for (dst, &src) in self.scratch.iter_mut().zip(frame) {
            // earshot expects [-1, 1]; NaN becomes silence.
            *dst = if src.is_nan() {
                0.0
            } else {
                src.clamp(-1.0, 1.0)
            };
        }
        let prob = self.detector.predict_f32(&self.scratch);
        self.tracker.push_frame(frame, prob)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = FRAME_SAMPLES as u64;

    #[test]
    fn endpointer_counts_every_sample_and_frames_any_chunking() {
        let mut ep = Endpointer::new(VadConfig::default()).unwrap();
        let mut total = 0u64;
        for (i, n) in [1usize, 255, 256, 257, 1000, 3, 0, 511]
            .into_iter()
            .enumerate()
        {
            let chunk = vec![0.0f32; n];
            assert!(
                ep.push(&chunk).is_empty(),
                "silence produced a segment at chunk {i}"
            );
            total += n as u64;
            assert_eq!(ep.position(), total);
            assert_eq!(ep.stats().frames, total / F);
        }
        assert!(ep.finish().is_none());
        // The trailing partial frame is judged at finish.
        assert_eq!(ep.stats().frames, total / F + 1);
        assert_eq!(ep.position(), 0);
    }

    #[test]
    fn endpointer_survives_out_of_range_input() {
        let mut ep = Endpointer::new(VadConfig::default()).unwrap();
        let wild: Vec<f32> = (0..4096)
            .map(|i| match i % 4 {
                0 => f32::NAN,
                1 => 7.5,
                2 => f32::NEG_INFINITY,
                _ => -3.0,
            })
            .collect();
        let _ = ep.push(&wild);
        let _ = ep.finish();
        assert_eq!(ep.stats().frames, 16);
    }
}
