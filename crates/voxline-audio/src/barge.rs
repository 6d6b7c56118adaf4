//! The endpointer's side of barge-in: while the assistant's answer plays,
//! a raised speech threshold; the request to pause the voice once the user
//! has spoken over it long enough; the utterances sent meanwhile named to
//! the barge-in state, whose words decide whether it resumes; and a stop
//! once the speech goes on past the length of a backchannel
//! ([`crate::VadStage::with_barge_in`]).

use std::time::Instant;

use voxline_core::barge::Ask;
use voxline_core::{BargeIn, UtteranceId};

use crate::vad::OpenUtterance;

/// How speech over the assistant's voice stops it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BargeInOptions {
    /// The speech probability a frame needs while an answer plays (higher
    /// than the usual threshold: the assistant's own voice reaching the
    /// microphone must not stop it), unless an echo canceller has shown it
    /// takes the voice out.
    pub threshold: f32,
    /// Speech over the answer this long, in ms, pauses it until the words
    /// heard decide (a backchannel resumes it).
    pub min_speech_ms: u32,
    /// Speech over the answer this long, in ms, is no backchannel: it stops
    /// the answer without waiting for its words. 0: any speech over the
    /// answer stops it at `min_speech_ms`, whatever its words.
    pub backchannel_max_ms: u32,
}

impl Default for BargeInOptions {
    fn default() -> Self {
        Self {
            threshold: 0.8,
            min_speech_ms: 200,
            backchannel_max_ms: 1_000,
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
    /// The answer and the speech over it (its first speech frame, stream
    /// position) this stage already asked to pause, and to stop.
    asked: Option<(UtteranceId, u64)>,
    stopped: Option<(UtteranceId, u64)>,
}

impl BargeWatch {
    pub(crate) fn new(barge: BargeIn, options: BargeInOptions, base: f32) -> Self {
        Self {
            barge,
            options,
            base,
            asked: None,
            stopped: None,
        }
    }

    /// The threshold the next frames are judged against: the raised one
    /// while an answer plays, unless an echo canceller has shown it takes
    /// the voice out ([`BargeIn::echo_cancelled`]).
    pub(crate) fn threshold(&self) -> f32 {
        if self.barge.playing().is_some() && !self.barge.echo_cancelled() {
            self.options.threshold.max(self.base)
        } else {
            self.base
        }
    }

    /// After the frames: what the user's speech over the playing answer
    /// asks for, and where it began (stream position): a pause once it is
    /// `min_speech_ms` long, a stop once it is longer than a backchannel
    /// (each once per answer and utterance).
    ///
    /// Speech that follows the level the voice played at (its own echo,
    /// [`voxline_core::BargeIn::echo_likeness`]; `end_wall`: when the open
    /// utterance's last speech was captured) asks for nothing.
    pub(crate) fn speech_over_answer(
        &mut self,
        open: Option<OpenUtterance<'_>>,
        origin: u64,
        end_wall: Instant,
    ) -> Option<(Ask, u64)> {
        let (id, open) = self.barge.playing().zip(open)?;
        let ms = |ms: u32| u64::from(ms) * u64::from(voxline_core::SAMPLE_RATE) / 1000;
        let span = open.end_sample.saturating_sub(open.first_speech);
        let key = (id, open.first_speech + origin);
        let max = self.options.backchannel_max_ms;
        let stop_now =
            max > 0 && span >= ms(max.max(self.options.min_speech_ms)) && self.stopped != Some(key);
        let hold_now = span >= ms(self.options.min_speech_ms) && self.asked != Some(key);
        if !(stop_now || hold_now) {
            return None;
        }
        if self
            .barge
            .echo_likeness(open.samples, end_wall)
            .is_some_and(|l| l >= voxline_core::barge::ECHO_MIN_LIKENESS)
        {
            // the assistant hearing itself: not the user
            return None;
        }
        self.asked = Some(key);
        if stop_now || max == 0 {
            self.stopped = Some(key);
            return Some((Ask::Stop, key.1));
        }
        Some((Ask::Hold, key.1))
    }

    /// Whether turn `id`'s answer has begun to play.
    pub(crate) fn has_played(&self, id: UtteranceId) -> bool {
        self.barge.has_played(id)
    }

    /// Turn `id` was taken back by speech that began at `start`: its
    /// answer, if it plays (or is paused for the words heard over it),
    /// stops, and what the user heard of it is recorded as for any
    /// interruption.
    pub(crate) fn taken_back(&self, id: UtteranceId, start: Instant) {
        if self.barge.playing() == Some(id) {
            self.barge.confirm(start, Instant::now());
        }
    }

    /// Asks for the voice to pause or stop: the speech began at `start`.
    pub(crate) fn request(&self, over: Ask, start: Instant) {
        match over {
            Ask::Hold => self.barge.request(start, Instant::now()),
            Ask::Stop => self.barge.confirm(start, Instant::now()),
        }
    }

    /// The stage sends utterance `id`, ending at `end_sample`: if it holds
    /// speech heard over the paused answer, its words decide the pause.
    pub(crate) fn sending(&self, id: UtteranceId, end_sample: u64) {
        if self.asked.is_some_and(|(_, from)| end_sample > from) {
            self.barge.heard_over(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_raised_threshold_stands_in_only_until_the_canceller_takes_the_voice_out() {
        let barge = BargeIn::new();
        let w = BargeWatch::new(barge.clone(), BargeInOptions::default(), 0.5);
        assert!((w.threshold() - 0.5).abs() < f32::EPSILON, "nothing plays");
        barge.set_playing(Some(3));
        assert!(
            (w.threshold() - 0.8).abs() < f32::EPSILON,
            "no canceller yet"
        );
        barge.set_echo_cancelled(true);
        assert!((w.threshold() - 0.5).abs() < f32::EPSILON, "converged");
        // a second it took less of the voice out in
        barge.set_echo_cancelled(false);
        assert!((w.threshold() - 0.8).abs() < f32::EPSILON);
    }

    #[test]
    fn a_turn_taken_back_stops_its_own_voice_only() {
        let barge = BargeIn::new();
        let w = BargeWatch::new(barge.clone(), BargeInOptions::default(), 0.5);
        let now = Instant::now();
        // nothing plays, or another turn does: nothing to stop
        w.taken_back(3, now);
        assert!(barge.take_request().is_none());
        barge.set_playing(Some(4));
        w.taken_back(3, now);
        assert!(barge.take_request().is_none());
        // its voice plays: stopped
        w.taken_back(4, now);
        assert_eq!(
            barge.take_request().map(|r| r.ask),
            Some(voxline_core::barge::Ask::Stop)
        );
        // paused for the words heard over it: the pause ends in a stop
        barge.request(now, now);
        let r = barge.take_request().unwrap();
        barge.hold(4, r, now);
        w.taken_back(4, now);
        assert!(matches!(
            barge.take_verdict(),
            Some(voxline_core::barge::Verdict::Stop(h)) if h.turn == 4
        ));
    }
}
