//! The VAD stage: audio frames in, utterances out.

use std::collections::VecDeque;
use std::time::Instant;

use voxline_core::{
    AudioFrame, Clock, Emitter, PipelineEvent, SpecBoard, Stage, StageError, Utterance, UtteranceId,
};

use crate::barge::{BargeInOptions, BargeWatch};
use crate::turn::judge::{OpenTurn, TurnJudge};
use crate::turn::{SharedTurnModel, TurnDecision, TurnPolicy};
use crate::vad::{Endpointer, Segment, VadConfig, FRAME_SAMPLES, TAIL_GRACE};
use crate::AudioError;

/// A speculative attempt in flight.
#[derive(Debug, Clone, Copy)]
struct Pending {
    id: UtteranceId,
    start: u64,
    /// The end of the audio it sent (the position it was sent at).
    end: u64,
    /// The end of the last confident speech frame when it was sent.
    confident_end: Option<u64>,
    sent_at: u64,
    /// The model's decision on the pause it was sent on, if judged.
    judged: Option<TurnDecision>,
}

/// Frames whose capture instants [`VadStage`] keeps for placing utterance
/// ends in time (about 40 s of 10 ms capture blocks).
const RECENT_FRAMES: usize = 4_096;

/// Cuts the 16 kHz stream into [`Utterance`]s with an [`Endpointer`],
/// numbering them from 1 and placing each on the session clock: the wall
/// time of its end sample is the capture time of the frame holding it plus
/// the audio before it in that frame. Where the capture skipped positions
/// (a clock gap or dropped audio) the frames on either side carry their own
/// instants, so an end before the skip is not moved by it.
///
/// With [`VadStage::with_speculation`], an utterance is also sent early, as
/// a speculative attempt under its own id, once a short silence follows
/// speech; the hangover then commits it, or resumed speech cancels it (see
/// [`voxline_core::spec`]). Ids therefore number attempts, and a turn's id
/// may skip the ids of cancelled attempts.
///
/// An utterance cut at the maximum length is sent at once, as an ordinary
/// utterance with `forced_split` set (a pending attempt is cancelled first);
/// the rest, and any attempt on the rest, names it in `continues` and
/// carries the lead-in before the cut as `overlap_samples`.
pub struct VadStage {
    endpointer: Endpointer,
    next_id: UtteranceId,
    /// The board and the silence (in samples) after which to speculate.
    spec: Option<(SpecBoard, u64)>,
    /// The confident end whose soft tail cancelled an attempt (see `speculate`).
    soft_tail: Option<u64>,
    pending: Option<Pending>,
    /// Recent frames, oldest first: the endpointer position (plus origin) of
    /// each one's first sample and its capture instant.
    recent: VecDeque<(u64, Instant)>,
    /// Offset from endpointer positions to stream positions (the first frame's start,
    /// moved on by any audio dropped before a frame).
    origin: Option<u64>,
    /// Stream samples missing before frames (dropped upstream).
    gap_samples: u64,
    /// The id of the latest forced split, which a continuation names.
    last_forced: Option<UtteranceId>,
    /// Barge-in, when the pipeline speaks.
    barge: Option<BargeWatch>,
    /// The semantic end of turn, when a model judges the pauses.
    turn: Option<TurnJudge>,
    /// The turn released last, while the speaker may still go on.
    released: Option<merge::Released>,
    /// The pending attempt kept while resumed speech waits for its words.
    split_hold: Option<split::SplitHold>,
    /// A taken-back turn's audio, to go before the open utterance.
    lead_in: Option<merge::LeadIn>,
    /// Whether the audio comes faster than real time (see
    /// [`VadStage::with_words_in_stream_time`]).
    words_in_stream_time: bool,
    /// The words of the last two attempts asked about, once in: each id,
    /// and their verdict with the stream position from which it counts.
    words: Vec<(UtteranceId, Option<(crate::turn::WordsVerdict, u64)>)>,
}

impl std::fmt::Debug for VadStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VadStage")
            .field("next_id", &self.next_id)
            .finish_non_exhaustive()
    }
}

impl VadStage {
    /// A stage with a fresh endpointer.
    ///
    /// # Errors
    /// [`AudioError::InvalidVadConfig`] for an invalid configuration.
    pub fn new(config: VadConfig) -> Result<Self, AudioError> {
        Ok(Self {
            endpointer: Endpointer::new(config)?,
            next_id: 1,
            spec: None,
            soft_tail: None,
            pending: None,
            recent: VecDeque::new(),
            origin: None,
            gap_samples: 0,
            last_forced: None,
            barge: None,
            turn: None,
            released: None,
            split_hold: None,
            lead_in: None,
            words_in_stream_time: false,
            words: Vec::new(),
        })
    }

    /// For audio that comes faster than real time (a fast replay): the
    /// words of an attempt, when the semantic end of turn asks for them
    /// (see [`TurnPolicy::words`]), are waited for, then counted from the
    /// stream position at which they would have come in real time: the
    /// attempt's position plus the time the recogniser's call took (from
    /// when it held the cores, less its thread's waits for a CPU other
    /// processes held). Without it the stream runs ahead of the
    /// recogniser, and the words come too late to count.
    #[must_use]
    pub fn with_words_in_stream_time(mut self) -> Self {
        self.words_in_stream_time = true;
        self
    }

    /// The semantic end of turn: each pause of an utterance is judged by
    /// `model` once `policy.probe_ms` of silence follows its last confident
    /// speech frame (before the speculative attempt starts). A pause
    /// judged complete (above `policy.threshold`) ends the turn after
    /// `policy.complete_ms` of silence; one judged incomplete (below
    /// `policy.incomplete_below`) waits up to `policy.incomplete_ms` (the
    /// hangover from then on) for the speaker to go on; the configured
    /// hangover ends one the model is unsure of, or fails on. Each turn's
    /// account ([`crate::turn::EndOfTurn`]) is published when it is sent or
    /// committed.
    ///
    /// With speculation on, a turn the judge ends is released rather than
    /// committed ([`SpecBoard::release`]) for `policy.merge_ms` after its
    /// speech: should speech that is kept start within that window, the turn
    /// is cancelled, [`PipelineEvent::Merged`] says so, and its audio goes
    /// before the new utterance, which is sent (and judged) as one turn.
    ///
    /// # Errors
    /// [`AudioError::InvalidVadConfig`] when a wait of `policy` is out of range.
    pub fn with_turn_model(
        mut self,
        model: SharedTurnModel,
        policy: TurnPolicy,
    ) -> Result<Self, AudioError> {
        let config = self.endpointer.config().clone();
        policy.validate()?;
        let patient = VadConfig {
            hangover_ms: policy.incomplete_ms,
            ..config.clone()
        };
        self.endpointer = Endpointer::new(patient)?;
        self.turn = Some(TurnJudge::new(model, policy, config.hangover_ms));
        Ok(self)
    }

    /// After a detector frame: the judge's verdict on the pause, closing
    /// the utterance when it ends the turn.
    fn judge_turn(&mut self, pos: u64, out: &mut Emitter<'_, Utterance>) {
        let Some(judge) = self.turn.as_mut() else {
            return;
        };
        let origin = self.origin.unwrap_or(0);
        let lead_in = self.lead_in.as_ref();
        let open = self.endpointer.open_utterance().map(|o| {
            let start = o.start_sample + origin;
            OpenTurn {
                start,
                end: o.end_sample + origin,
                confident_end: o.confident_end.map(|c| c + origin),
                keepable: o.keepable,
                samples_to_now: o.samples_to_now,
                // a taken-back turn, or one whose words are awaited
                // before it is (see `settle_held`): judged as one
                lead_in: lead_in
                    .filter(|l| l.at == start)
                    .map_or_else(|| held_lead(self.released.as_ref(), start), |l| &l.samples),
            }
        });
        let mut ends = judge.after_frame(open, pos, out);
        let merge_ms = judge.policy().merge_ms;
        if !ends {
            ends = self.words_end_turn(origin, pos, out);
        }
        if !ends {
            return;
        }
        // a turn the judge ends (complete, or on the hangover when unsure)
        // stays revocable for the merge window: its audio to now is kept
        let audio = (merge_ms > 0)
            .then(|| {
                self.endpointer
                    .open_utterance()
                    .map(|o| o.samples_to_now.to_vec())
            })
            .flatten();
        if let Some(seg) = self.endpointer.end_utterance() {
            match audio {
                Some(audio) => self.close_revocable(seg, pos, audio, merge_ms, out),
                None => self.close(seg, pos, out),
            }
        }
    }

    /// Whether the words end the turn now: the model judged the open
    /// turn's pause incomplete or was unsure, and the transcript of the
    /// attempt sent on that pause (still its whole audio) is a finished
    /// sentence (see [`TurnPolicy::words`]).
    fn words_end_turn(&mut self, origin: u64, pos: u64, out: &mut Emitter<'_, Utterance>) -> bool {
        let Some(p) = self.pending else {
            return false;
        };
        let Some(o) = self.endpointer.open_utterance() else {
            return false;
        };
        let current = o.start_sample + origin == p.start
            && o.confident_end.map(|c| c + origin) == p.confident_end
            && o.end_sample + origin <= p.end + TAIL_GRACE;
        let waiting = matches!(
            self.turn.as_ref().and_then(|j| j.decision(p.start)),
            Some(TurnDecision::Incomplete | TurnDecision::Unsure)
        );
        if !(current && waiting)
            || self.words_verdict(p.id, p.sent_at, pos, out)
                != Some(crate::turn::WordsVerdict::Complete)
        {
            return false;
        }
        if let Some(judge) = self.turn.as_mut() {
            judge.ended_by_words(p.start);
        }
        tracing::debug!(
            turn = p.id,
            "the words make a finished sentence: the turn ends without waiting out the pause"
        );
        true
    }

    /// Publishes the account of turn `id` (its first sample `start` and
    /// its speech's end `end`, stream positions) when a model judges.
    fn account(
        &mut self,
        id: UtteranceId,
        start: u64,
        end: u64,
        closed: u64,
        out: &mut Emitter<'_, Utterance>,
    ) {
        if let Some(judge) = self.turn.as_mut() {
            let e = judge.outcome(id, start, end, closed);
            out.publish(PipelineEvent::engine_event(e));
        }
    }

    /// Publishes the account of the turn `id` sent from `seg`.
    fn account_seg(
        &mut self,
        id: UtteranceId,
        seg: &Segment,
        closed: u64,
        out: &mut Emitter<'_, Utterance>,
    ) {
        let origin = self.origin.unwrap_or(0);
        self.account(
            id,
            seg.start_sample + origin,
            seg.end_sample + origin,
            closed,
            out,
        );
    }

    /// Barge-in: while an answer plays ([`voxline_core::BargeIn::playing`])
    /// frames are judged against `options.threshold`, and once
    /// `options.min_speech_ms` of speech is heard over it the stage asks
    /// for the voice to stop ([`voxline_core::BargeIn::request`]), naming
    /// when the speech began.
    #[must_use]
    pub fn with_barge_in(mut self, barge: voxline_core::BargeIn, options: BargeInOptions) -> Self {
        let base = self.endpointer.config().threshold;
        self.barge = Some(BargeWatch::new(barge, options, base));
        self
    }

    /// While an answer plays, the frames about to be pushed are judged
    /// against the raised threshold.
    fn barge_threshold(&mut self) {
        if let Some(w) = &self.barge {
            self.endpointer.set_threshold(w.threshold());
        }
    }

    /// Once enough speech is heard over the answer: the request to stop it.
    fn barge_in(&mut self, origin: u64) {
        if self.barge.is_none() {
            return;
        }
        let open = self.endpointer.open_utterance();
        let end_wall = open
            .as_ref()
            .map_or_else(Instant::now, |o| self.wall_of(o.end_sample + origin));
        let Some(w) = self.barge.as_mut() else {
            return;
        };
        if let Some((over, first_speech)) = w.speech_over_answer(open, origin, end_wall) {
            let start = self.wall_of(first_speech);
            if let Some(w) = &self.barge {
                w.request(over, start);
            }
        }
    }

    /// Utterance `id`, ending at `end_sample`, is about to be sent: named to
    /// the barge-in state if it was heard over a paused answer.
    fn sending(&self, id: voxline_core::UtteranceId, end_sample: u64) {
        if let Some(w) = &self.barge {
            w.sending(id, end_sample);
        }
    }

    /// Stream samples that never arrived (dropped before the VAD); positions
    /// after a gap are still true stream positions.
    #[must_use]
    pub fn gap_samples(&self) -> u64 {
        self.gap_samples
    }

    /// Sends each utterance early, as a speculative attempt registered on
    /// `board`, once `silence_ms` of non-speech follows its speech (0 = never).
    /// A silence as long as the hangover or longer never fires: the utterance
    /// closes first.
    #[must_use]
    pub fn with_speculation(mut self, board: SpecBoard, silence_ms: u32) -> Self {
        self.spec = (silence_ms > 0).then(|| {
            (
                board,
                u64::from(silence_ms) * u64::from(voxline_core::SAMPLE_RATE) / 1000,
            )
        });
        self
    }

    /// Handles a closed segment: commits the attempt that sent it (the same
    /// start; its speech ending within [`TAIL_GRACE`] of the attempt's
    /// audio), or cancels a stale attempt and sends the segment as an
    /// ordinary utterance.
    fn close(&mut self, mut seg: Segment, closed: u64, out: &mut Emitter<'_, Utterance>) {
        let start = seg.start_sample + self.origin.unwrap_or(0);
        self.settle_held(Some(start), closed, false, out);
        self.settle_split(&mut seg, closed, out);
        self.close_as(seg, closed, false, out);
    }

    /// As [`VadStage::close`], for a turn whose end was judged early; its
    /// id stays revocable on the board for `merge_ms` after its speech, and
    /// `audio` (its audio up to `closed`) is kept for the merge.
    fn close_revocable(
        &mut self,
        mut seg: Segment,
        closed: u64,
        mut audio: Vec<f32>,
        merge_ms: u32,
        out: &mut Emitter<'_, Utterance>,
    ) {
        let origin = self.origin.unwrap_or(0);
        self.settle_held(Some(seg.start_sample + origin), closed, false, out);
        let cut = self.settle_split(&mut seg, closed, out);
        audio.drain(..cut.min(audio.len()));
        let own_start = seg.start_sample + origin;
        // peeked, not taken: the utterance sent takes it
        let head = merge::Head {
            start: own_start,
            samples: audio,
            continues: self.last_forced.filter(|_| seg.continues_previous),
            overlap_samples: seg.overlap_samples,
        }
        .after(self.lead_in.as_ref().filter(|l| l.at == own_start));
        let until = Self::merge_until(seg.end_sample + origin, merge_ms);
        // a turn still revocable (its words awaited) is final before another
        self.commit_released();
        let sent = self.close_as(seg, closed, true, out);
        self.released = sent.map(|(id, sent_at)| merge::Released {
            id,
            sent_at,
            start: head.start,
            audio: head.samples,
            until,
            continues: head.continues,
            overlap_samples: head.overlap_samples,
            held: None,
        });
    }

    /// Commits the attempt that sent `seg` or sends `seg` as an utterance;
    /// with `revocable`, releases it instead of committing it (see
    /// [`SpecBoard::release`]). Returns the turn's id, and the position it
    /// was sent at, when it is revocable.
    fn close_as(
        &mut self,
        seg: Segment,
        closed: u64,
        revocable: bool,
        out: &mut Emitter<'_, Utterance>,
    ) -> Option<(UtteranceId, u64)> {
        let origin = self.origin.unwrap_or(0);
        if let Some(p) = self.pending.take() {
            let same = !seg.forced_split
                && p.start == seg.start_sample + origin
                && seg.end_sample + origin <= p.end + TAIL_GRACE;
            if same && self.spec.is_some() {
                self.account_seg(p.id, &seg, closed, out);
            }
            if let Some((board, _)) = &self.spec {
                if same {
                    if revocable {
                        board.release(p.id);
                    } else {
                        board.commit(p.id);
                    }
                    out.publish(PipelineEvent::Commit {
                        id: p.id,
                        spec_sample: p.sent_at,
                        sample: closed,
                    });
                    self.lead_in_for(p.start);
                    return revocable.then_some((p.id, p.sent_at));
                }
                board.cancel(p.id);
                out.publish(PipelineEvent::SpecCancel {
                    id: p.id,
                    sample: closed,
                });
            }
        }
        let id = self.next_id;
        let board = self
            .spec
            .as_ref()
            .map(|(b, _)| b.clone())
            .filter(|_| revocable);
        if let Some(b) = &board {
            // an ordinary utterance, revocable all the same
            b.start(id);
            b.release(id);
        }
        self.account_seg(id, &seg, closed, out);
        self.emit(seg, closed, out);
        board.map(|_| (id, closed))
    }

    fn wall_of(&self, sample: u64) -> Instant {
        let i = self.recent.partition_point(|&(pos, _)| pos <= sample);
        match (
            i.checked_sub(1).map(|j| self.recent[j]),
            self.recent.front(),
        ) {
            (Some((pos, at)), _) => at + Clock::samples_to_duration(sample - pos),
            (None, Some(&(pos, at))) => at
                .checked_sub(Clock::samples_to_duration(pos - sample))
                .unwrap_or(at),
            (None, None) => Instant::now(),
        }
    }

    fn emit(&mut self, seg: Segment, closed: u64, out: &mut Emitter<'_, Utterance>) {
        let origin = self.origin.unwrap_or(0);
        let end_sample = seg.end_sample + origin;
        let id = self.next_id;
        self.next_id += 1;
        let own_start = seg.start_sample + origin;
        // a taken-back turn and what the speaker went on with: one turn
        let head = merge::Head {
            start: own_start,
            samples: seg.samples,
            continues: self.last_forced.filter(|_| seg.continues_previous),
            overlap_samples: seg.overlap_samples,
        }
        .after(self.lead_in_for(own_start).as_ref());
        self.last_forced = seg.forced_split.then_some(id);
        self.sending(id, end_sample);
        out.emit(Utterance {
            id,
            start_sample: head.start,
            end_sample,
            end_wall: self.wall_of(end_sample),
            samples: head.samples,
            forced_split: seg.forced_split,
            closed_sample: closed.max(end_sample),
            continues: head.continues,
            overlap_samples: head.overlap_samples,
        });
    }
}

/// The audio of `released` before `start`, when speech starting there is
/// held for its words (see [`merge::Released::held`]).
fn held_lead(released: Option<&merge::Released>, start: u64) -> &[f32] {
    released
        .filter(|r| r.held.is_some_and(|(s, _)| s == start))
        .and_then(|r| r.audio.get(..usize::try_from(start - r.start).ok()?))
        .unwrap_or(&[])
}

/// The VAD stage's name in the pipeline.
pub const VAD_STAGE_NAME: &str = "vad";

/// The VAD stage's identity in the pipeline's topology.
pub const VAD_STAGE: voxline_core::StageId = voxline_core::StageId::new(VAD_STAGE_NAME);

impl Stage for VadStage {
    type In = AudioFrame;
    type Out = Utterance;

    fn name(&self) -> &str {
        VAD_STAGE_NAME
    }

    /// It has no engine; its end-of-turn model computes on the engines'
    /// cores only while they are free ([`Emitter::free_cores`]).
    fn leased(&self) -> bool {
        false
    }

    fn process(
        &mut self,
        frame: AudioFrame,
        out: &mut Emitter<'_, Utterance>,
    ) -> Result<(), StageError> {
        let mut origin = *self.origin.get_or_insert(frame.start_sample);
        let expected = origin + self.endpointer.position();
        if frame.start_sample > expected {
            // Audio was dropped before this frame (a live queue that overflowed):
            // the utterance it interrupted ends where the audio stopped, and the
            // stream goes on at the frame's true position.
            let closed = expected;
            if let Some(seg) = self.endpointer.finish() {
                self.close(seg, closed, out);
            }
            if let (Some(p), Some((board, _))) = (self.pending.take(), &self.spec) {
                board.cancel(p.id);
                out.publish(voxline_core::PipelineEvent::SpecCancel {
                    id: p.id,
                    sample: closed,
                });
            }
            self.gap_samples += frame.start_sample - expected;
            self.origin = Some(frame.start_sample);
            origin = frame.start_sample;
        }
        if frame.new_recording || frame.start_sample > expected {
            // nothing of another recording, or across a gap, is merged
            self.commit_released();
        }
        if frame.new_recording {
            // a new recording: the pre-roll must not reach into what came before it
            if let Some(seg) = self.endpointer.clear_pre_roll() {
                let closed = self.endpointer.position() + origin;
                self.close(seg, closed, out);
            }
            // and an utterance still open ends with its recording: a pause
            // judged unfinished waits up to `incomplete_ms` (2 s), longer
            // than replay's 1 s between recordings, and the next one's
            // speech would otherwise join it
            if let Some(seg) = self.endpointer.end_utterance() {
                let closed = self.endpointer.position() + origin;
                self.close(seg, closed, out);
            }
        }
        // Where the frame starts in the endpointer's count, and when it was captured.
        if self.recent.len() == RECENT_FRAMES {
            self.recent.pop_front();
        }
        self.recent
            .push_back((self.endpointer.position() + origin, frame.captured));
        self.barge_threshold();
        if self.spec.is_none() && self.turn.is_none() {
            let segments = self.endpointer.push(&frame.samples);
            let closed = self.endpointer.position() + origin;
            for seg in segments {
                self.emit(seg, closed, out);
            }
        } else {
            // Detector frame by detector frame, so an attempt starts (or is
            // cancelled), or a pause is judged, at the frame where the
            // silence reached its length.
            for part in frame.samples.chunks(FRAME_SAMPLES) {
                let segments = self.endpointer.push(part);
                let pos = self.endpointer.position() + origin;
                for seg in segments {
                    self.close(seg, pos, out);
                }
                self.watch_released(part, pos, out);
                self.watch_split(pos, out);
                self.settle_split_at_pause(pos, out);
                self.judge_turn(pos, out);
                self.speculate(pos, out);
            }
        }
        self.barge_in(origin);
        if frame.end_of_stream {
            // the speaker is done: what is open closes now, as at the end of input
            self.finish(out)?;
            out.publish(PipelineEvent::StreamEnd {
                sample: self.endpointer.position() + origin,
            });
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Emitter<'_, Utterance>) -> Result<(), StageError> {
        let closed = self.endpointer.position() + self.origin.unwrap_or(0);
        self.watch_released(&[], closed, out);
        self.settle_held(None, closed, false, out);
        self.commit_released();
        if let Some(seg) = self.endpointer.finish() {
            self.close(seg, closed, out);
        }
        if let (Some(p), Some((board, _))) = (self.pending.take(), &self.spec) {
            board.cancel(p.id);
            out.publish(PipelineEvent::SpecCancel {
                id: p.id,
                sample: closed,
            });
        }
        Ok(())
    }
}

mod merge;
mod speculate;
mod split;
#[cfg(test)]
mod tests;
