//! The endpointer's side of barge-in: while the assistant's answer plays,
//! a raised speech threshold, and the request to stop the voice once the
//! user has spoken over it long enough ([`crate::VadStage::with_barge_in`]).

use std::time::Instant;

use voxline_core::{BargeIn, UtteranceId};

use crate::vad::OpenUtterance;

/// How speech over the assistant's voice stops it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BargeInOptions {
    /// The speech probability a frame needs while an answer plays (higher
    /// than the usual threshold: the assistant's own voice reaching the
    /// microphone must not stop it).
    pub threshold: f32,
    /// Speech over the answer this long, in ms, stops it.
    pub min_speech_ms: u32,
}

impl Default for BargeInOptions {
    fn default() -> Self {
        Self {
            threshold: 0.8,
            min_speech_ms: 200,
        }
    }
}

/// What the VAD stage keeps for barge-in.
#[derive(Debug)]
pub(crate) struct BargeWatch {
    barge: BargeIn,
    options: BargeInOptions,
    /// The endpointer's own threshold, when nothing plays.
    base: f32,
    /// The turn whose answer this stage already asked to stop.
    asked: Option<UtteranceId>,
}

impl BargeWatch {
    pub(crate) fn new(barge: BargeIn, options: BargeInOptions, base: f32) -> Self {
        Self {
            barge,
            options,
            base,
            asked: None,
        }
    }

    /// The threshold the next frames are judged against.
    pub(crate) fn threshold(&self) -> f32 {
        if self.barge.playing().is_some() {
            self.options.threshold.max(self.base)
        } else {
            self.base
        }
    }

    /// After the frames: where the user's speech over the playing answer
    /// began (endpointer position), once it is long enough to stop it —
    /// once per answer.
    pub(crate) fn speech_over_answer(&mut self, open: Option<OpenUtterance<'_>>) -> Option<u64> {
        let (id, open) = self.barge.playing().zip(open)?;
        let min =
            u64::from(self.options.min_speech_ms) * u64::from(voxline_core::SAMPLE_RATE) / 1000;
        if self.asked == Some(id) || open.end_sample.saturating_sub(open.first_speech) < min {
            return None;
        }
        self.asked = Some(id);
        Some(open.first_speech)
    }

    /// Asks for the voice to stop: the speech began at `start`.
    pub(crate) fn request(&self, start: Instant) {
        self.barge.request(start, Instant::now());
    }
}
