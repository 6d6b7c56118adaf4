//! Splitting at a pause the words end: speech that resumes after a pause
//! the model judged incomplete, before the words of the attempt sent on
//! that pause are in, is held for them instead of cancelling the attempt.
//! A finished sentence (or a number, or words with no final mark) then
//! ends the turn at the pause, and the new speech is held in its turn: it
//! stays a turn of its own unless the new speech goes on with it, read
//! from the words of both once it ends, or heard whole (see
//! [`VadStage::settle_held`]); otherwise the attempt is cancelled and the
//! utterance goes on, as when the words come in time and say so.

use voxline_core::{Emitter, PipelineEvent, Utterance, UtteranceId};

use super::{merge, Pending, VadStage};
use crate::turn::{TurnDecision, WordsVerdict};
use crate::vad::{Segment, FRAME_SAMPLES};

/// An attempt kept while the speech after its pause waits for its words.
#[derive(Debug, Clone, Copy)]
pub(super) struct SplitHold {
    pub id: UtteranceId,
    /// The stream position where the speech resumed (its first frame).
    pub resume: u64,
}

impl VadStage {
    /// Whether the pending attempt `p`, whose utterance went on (its last
    /// speech frame now ending at `speech_end`, stream position), is kept
    /// for its words: the model judged its pause incomplete or was unsure,
    /// the pause was one silence alone would have ended (the hangover
    /// long), no released turn waits on this speech, and the words are not
    /// in yet.
    pub(super) fn hold_for_words(
        &mut self,
        p: Pending,
        speech_end: u64,
        pos: u64,
        out: &mut Emitter<'_, Utterance>,
    ) -> bool {
        if self.split_hold.is_some_and(|h| h.id == p.id) {
            return true;
        }
        let Some(fallback) = self.turn.as_ref().map(|j| j.fallback_samples()) else {
            return false;
        };
        let resume = speech_end.saturating_sub(FRAME_SAMPLES as u64);
        let paused = resume.saturating_sub(p.confident_end.unwrap_or(p.end));
        let unsure = matches!(
            p.judged,
            Some(TurnDecision::Incomplete | TurnDecision::Unsure)
        );
        if !unsure || paused < fallback || self.released.is_some() || !self.words_on() {
            return false;
        }
        match self.words_verdict(p.id, p.sent_at, pos, out) {
            None => {}
            Some(v) if v.may_hold() => {
                // in as the speech resumed (waited for to decide a turn
                // held before it): they end the turn at the pause, and the
                // speech that resumed is held in its turn
                self.split_open_at(p, SplitHold { id: p.id, resume }, pos, out);
                return true;
            }
            Some(_) => return false,
        }
        tracing::debug!(
            turn = p.id,
            "speech resumed before the words of the pause were in: held for them"
        );
        self.split_hold = Some(SplitHold { id: p.id, resume });
        true
    }

    /// After a detector frame: once the held attempt's words are in, the
    /// open utterance is split at the pause (a finished sentence) or goes
    /// on as one (the attempt cancelled).
    pub(super) fn watch_split(&mut self, pos: u64, out: &mut Emitter<'_, Utterance>) {
        let Some(h) = self.split_hold else {
            return;
        };
        let Some(p) = self.pending.filter(|p| p.id == h.id) else {
            self.split_hold = None;
            return;
        };
        match self.words_verdict(p.id, p.sent_at, pos, out) {
            Some(v) if v.may_hold() => self.split_open_at(p, h, pos, out),
            Some(_) => self.unhold(pos, out),
            None => {}
        }
    }

    /// After a detector frame: once the speech held for the words pauses
    /// in its turn (the probe point of a pause after it), the hold is
    /// decided before that pause is judged, its words waited for if need
    /// be (see [`VadStage::await_words`]): only one attempt is in flight,
    /// and this pause needs its own.
    pub(super) fn settle_split_at_pause(&mut self, pos: u64, out: &mut Emitter<'_, Utterance>) {
        let Some(h) = self.split_hold else {
            return;
        };
        let Some(probe) = self
            .turn
            .as_ref()
            .map(|j| crate::vad::ms_to_samples(j.policy().probe_ms))
        else {
            return;
        };
        let origin = self.origin.unwrap_or(0);
        let paused = self.endpointer.open_utterance().is_some_and(|o| {
            let anchor = o.confident_end.unwrap_or(o.end_sample) + origin;
            anchor > h.resume && pos >= anchor + probe
        });
        let Some(p) = self.pending.filter(|p| p.id == h.id && paused) else {
            return;
        };
        let verdict = self
            .words_verdict(p.id, p.sent_at, pos, out)
            .or_else(|| self.await_words(p.id, p.sent_at, out));
        if verdict.is_some_and(WordsVerdict::may_hold) {
            self.split_open_at(p, h, pos, out);
        } else {
            self.unhold(pos, out);
        }
    }

    /// Before `seg` (closing at `closed`) is sent: a hold on it is decided,
    /// its words waited for if they are not in yet (see
    /// [`VadStage::await_words`]). Returns how many samples were cut from
    /// the front of `seg` (the split-off turn's).
    pub(super) fn settle_split(
        &mut self,
        seg: &mut Segment,
        closed: u64,
        out: &mut Emitter<'_, Utterance>,
    ) -> usize {
        let Some(h) = self.split_hold else {
            return 0;
        };
        let origin = self.origin.unwrap_or(0);
        let Some(p) = self
            .pending
            .filter(|p| p.id == h.id && p.start == seg.start_sample + origin)
        else {
            self.split_hold = None;
            return 0;
        };
        let verdict = self
            .words_verdict(p.id, p.sent_at, closed, out)
            .or_else(|| self.await_words(p.id, p.sent_at, out));
        if verdict != Some(WordsVerdict::Complete) {
            // the attempt, no longer the segment's, is cancelled on close
            self.split_hold = None;
            return 0;
        }
        let at = self.split_point(p, h);
        self.split_off(p, closed, false, out);
        let cut = usize::try_from(at - p.start)
            .unwrap_or(usize::MAX)
            .min(seg.samples.len());
        seg.samples.drain(..cut);
        seg.start_sample += cut as u64;
        seg.continues_previous = false;
        seg.overlap_samples = 0;
        cut
    }

    /// Attempt `p` is a turn of its own, and the open utterance starts
    /// where the speech resumed; the turn is released and held (see
    /// [`VadStage::settle_held`]): it is taken back if the speech that
    /// resumed goes on with its sentence, which its own words tell once
    /// it ends (whisper writes "and we are glad …" in lower case), and is
    /// final otherwise.
    fn split_open_at(
        &mut self,
        p: Pending,
        h: SplitHold,
        pos: u64,
        out: &mut Emitter<'_, Utterance>,
    ) {
        let at = self.split_point(p, h);
        let origin = self.origin.unwrap_or(0);
        let head = self
            .endpointer
            .open_utterance()
            .map(|o| merge::Head {
                start: p.start,
                samples: o.samples_to_now.to_vec(),
                continues: self.last_forced.filter(|_| o.continues_previous),
                overlap_samples: o.overlap_samples,
            })
            .map(|h| h.after(self.lead_in.as_ref().filter(|l| l.at == p.start)));
        // with taking turns back off (`merge_ms` 0) the split is final
        let revocable = self.turn.as_ref().is_some_and(|j| j.policy().merge_ms > 0);
        self.split_off(p, pos, revocable, out);
        self.endpointer
            .split_open(at.saturating_sub(origin), h.resume.saturating_sub(origin));
        if !revocable {
            return;
        }
        if let Some((board, _)) = &self.spec {
            board.hold(p.id);
        }
        self.released = head.map(|head| merge::Released {
            id: p.id,
            sent_at: p.sent_at,
            start: head.start,
            audio: head.samples,
            until: h.resume + FRAME_SAMPLES as u64,
            continues: head.continues,
            overlap_samples: head.overlap_samples,
            held: Some((at, h.resume)),
        });
    }

    /// Where the turn after a split starts: the resumed speech with the
    /// pre-roll before it, never before the end of the attempt's audio.
    fn split_point(&self, p: Pending, h: SplitHold) -> u64 {
        let pre_roll = crate::vad::ms_to_samples(self.endpointer.config().pre_roll_ms);
        h.resume.saturating_sub(pre_roll).max(p.end)
    }

    /// Attempt `p` is a turn of its own at `pos`: final, or released (see
    /// [`voxline_core::SpecBoard::release`]) with `revocable`.
    fn split_off(
        &mut self,
        p: Pending,
        pos: u64,
        revocable: bool,
        out: &mut Emitter<'_, Utterance>,
    ) {
        self.split_hold = None;
        self.pending = None;
        self.soft_tail = None;
        let Some((board, _)) = &self.spec else {
            return;
        };
        if revocable {
            board.release(p.id);
        } else {
            board.commit(p.id);
        }
        out.publish(PipelineEvent::Commit {
            id: p.id,
            spec_sample: p.sent_at,
            sample: pos,
        });
        if let Some(judge) = self.turn.as_mut() {
            judge.ended_by_words(p.start);
        }
        self.account(p.id, p.start, p.end, pos, out);
        self.lead_in_for(p.start);
        tracing::debug!(
            turn = p.id,
            "its words make a finished sentence: the pause ended the turn"
        );
    }

    /// The held attempt's words are no finished sentence: it is cancelled,
    /// and the utterance goes on as one.
    fn unhold(&mut self, pos: u64, out: &mut Emitter<'_, Utterance>) {
        self.split_hold = None;
        tracing::debug!("the held attempt's words are no finished sentence: the utterance goes on");
        if let (Some(p), Some((board, _))) = (self.pending.take(), &self.spec) {
            board.cancel(p.id);
            out.publish(PipelineEvent::SpecCancel {
                id: p.id,
                sample: pos,
            });
        }
    }
}
