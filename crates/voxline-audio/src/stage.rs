//! The VAD stage: audio frames in, utterances out.

use std::time::{Duration, Instant};

use voxline_core::{AudioFrame, Clock, Emitter, Stage, StageError, Utterance, UtteranceId};

use crate::vad::{Endpointer, Segment, VadConfig};
use crate::AudioError;

/// Cuts the 16 kHz stream into [`Utterance`]s with an [`Endpointer`],
/// numbering them from 1 and placing each on the session clock: the wall
/// time of its end sample is extrapolated from the capture time of the
/// frame that closed it.
pub struct VadStage {
    endpointer: Endpointer,
    next_id: UtteranceId,
    /// Stream position and capture instant of the latest frame.
    last: Option<(u64, Instant)>,
    /// Offset from endpointer positions to stream positions (the first frame's start).
    origin: Option<u64>,
}

impl std::fmt::Debug for VadStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VadStage").field("next_id", &self.next_id).finish_non_exhaustive()
    }
}

impl VadStage {
    /// A stage with a fresh endpointer.
    ///
    /// # Errors
    /// [`AudioError::InvalidVadConfig`] for an invalid configuration.
    pub fn new(config: VadConfig) -> Result<Self, AudioError> {
        Ok(Self { endpointer: Endpointer::new(config)?, next_id: 1, last: None, origin: None })
    }

    fn wall_of(&self, sample: u64) -> Instant {
        match self.last {
            Some((pos, at)) if sample <= pos => at.checked_sub(Clock::samples_to_duration(pos - sample)).unwrap_or(at),
            Some((pos, at)) => at + Clock::samples_to_duration(sample - pos),
            None => Instant::now(),
        }
    }

    fn emit(&mut self, seg: Segment, closed: u64, out: &mut Emitter<'_, Utterance>) {
        let origin = self.origin.unwrap_or(0);
        let end_sample = seg.end_sample + origin;
        let id = self.next_id;
        self.next_id += 1;
        out.emit(Utterance {
            id,
            start_sample: seg.start_sample + origin,
            end_sample,
            end_wall: self.wall_of(end_sample),
            samples: seg.samples,
            forced_split: seg.forced_split,
            closed_sample: closed.max(end_sample),
        });
    }
}

impl Stage for VadStage {
    type In = AudioFrame;
    type Out = Utterance;

    fn name(&self) -> &str {
        "vad"
    }

    fn process(&mut self, frame: AudioFrame, out: &mut Emitter<'_, Utterance>) -> Result<(), StageError> {
        let origin = *self.origin.get_or_insert(frame.start_sample);
        let end = frame.end_sample();
        // The capture instant of the frame's end, for extrapolating end-of-speech times.
        self.last = Some((end, frame.captured + Duration::from_secs_f64(frame.samples.len() as f64 / f64::from(voxline_core::SAMPLE_RATE))));
        let segments = self.endpointer.push(&frame.samples);
        let closed = self.endpointer.position() + origin;
        for seg in segments {
            self.emit(seg, closed, out);
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Emitter<'_, Utterance>) -> Result<(), StageError> {
        let closed = self.endpointer.position() + self.origin.unwrap_or(0);
        if let Some(seg) = self.endpointer.finish() {
            self.emit(seg, closed, out);
        }
        Ok(())
    }
}
