//! Speculation: an utterance sent early, as an attempt, once a short
//! silence follows its speech; cancelled when the speech goes on.

use voxline_core::{Emitter, PipelineEvent, Utterance};

use super::{merge, Pending, VadStage};
use crate::vad::TAIL_GRACE;

impl VadStage {
    /// After each detector frame: cancels an attempt whose utterance went on
    /// (a confident speech frame after it, or the detector's tail running more
    /// than [`TAIL_GRACE`] past its audio), and starts one, with the audio
    /// up to now, when the silence after the last confident speech frame is
    /// long enough.
    pub(super) fn speculate(&mut self, pos: u64, out: &mut Emitter<'_, Utterance>) {
        let Some((board, silence)) = self.spec.clone() else {
            return;
        };
        let origin = self.origin.unwrap_or(0);
        let open = self.endpointer.open_utterance().map(|o| {
            (
                o.start_sample + origin,
                o.end_sample + origin,
                o.confident_end.map(|c| c + origin),
                o.keepable,
                o.continues_previous,
                o.overlap_samples,
            )
        });
        if let Some(p) = self.pending {
            let went_on = open.is_none_or(|(start, end, confident, ..)| {
                start != p.start || confident > p.confident_end || end > p.end + TAIL_GRACE
            });
            // Speech went on softly (no new confident frame): until the
            // next confident frame, wait for silence after the last speech
            // frame instead, so a long soft tail is not chased with an
            // attempt every few frames.
            let soft_tail = open
                .filter(|&(start, _, confident, ..)| {
                    start == p.start && confident == p.confident_end
                })
                .and_then(|(_, _, confident, ..)| confident);
            let holds_a_turn = self
                .released
                .as_ref()
                .is_some_and(|r| r.held.is_some_and(|(s, _)| s == p.start));
            if went_on && holds_a_turn {
                // Speech held after a released turn paused and goes on: the
                // held turn is decided first, from the words of both (only
                // one turn is held at a time), so this pause may hold the
                // speech after it in its turn.
                self.settle_held(Some(p.start), pos, true, out);
                if self.pending.is_none() {
                    // taken back: the attempt went with it, as one on
                    // speech that goes on
                    self.soft_tail = soft_tail;
                    return;
                }
            }
            let held = went_on
                && open.is_some_and(|(start, end, ..)| {
                    start == p.start && self.hold_for_words(p, end, pos, out)
                });
            if held && self.pending.is_none() {
                // split at the pause as the speech resumed: the utterance
                // now open is judged, and sent, from the next frame
                return;
            }
            if went_on && !held {
                self.soft_tail = soft_tail;
                board.cancel(p.id);
                out.publish(PipelineEvent::SpecCancel {
                    id: p.id,
                    sample: pos,
                });
                self.pending = None;
            }
        }
        let Some((start, speech_end, confident_end, keepable, continues_previous, overlap_samples)) =
            open
        else {
            return;
        };
        // After the last confident frame; after the last speech frame when
        // there is none, or its soft tail already cancelled an attempt.
        let after = confident_end
            .filter(|c| self.soft_tail != Some(*c))
            .unwrap_or(speech_end);
        if self.pending.is_some() || !keepable || pos < after + silence {
            return;
        }
        let own = self
            .endpointer
            .open_utterance()
            .map(|o| o.samples_to_now.to_vec())
            .unwrap_or_default();
        let end = start + own.len() as u64;
        let head = merge::Head {
            start,
            samples: own,
            continues: self.last_forced.filter(|_| continues_previous),
            overlap_samples,
        }
        .after(self.lead_in.as_ref().filter(|l| l.at == start));
        let id = self.next_id;
        self.next_id += 1;
        board.start(id);
        out.publish(PipelineEvent::SpecStart { id, sample: pos });
        self.pending = Some(Pending {
            id,
            start,
            end,
            confident_end,
            sent_at: pos,
            judged: self.turn.as_ref().and_then(|j| j.decision(start)),
        });
        self.sending(id, end);
        out.emit(Utterance {
            id,
            start_sample: head.start,
            end_sample: end,
            end_wall: self.wall_of(end),
            samples: head.samples,
            forced_split: false,
            closed_sample: pos,
            continues: head.continues,
            overlap_samples: head.overlap_samples,
        });
    }
}
