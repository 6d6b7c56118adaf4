//! The policy at work in the VAD stage: when to ask the model, and when its
//! verdict closes the turn.

use std::time::Duration;

use voxline_core::{Clock, Emitter, Message, SAMPLE_RATE};

use crate::vad::TAIL_GRACE;

use super::{EndOfTurn, SharedTurnModel, TurnDecision, TurnPolicy, WINDOW_SAMPLES};

fn samples(ms: u32) -> u64 {
    u64::from(ms) * u64::from(SAMPLE_RATE) / 1000
}

/// The open utterance as the judge sees it (stream positions).
pub(crate) struct OpenTurn<'a> {
    /// Its first sample.
    pub start: u64,
    /// The end of its last speech frame.
    pub end: u64,
    /// The end of its last confident speech frame (see
    /// [`crate::VadConfig::spec_threshold`]), if it has one.
    pub confident_end: Option<u64>,
    /// Long enough to be kept.
    pub keepable: bool,
    /// Its audio up to now (the silence after `end` included).
    pub samples_to_now: &'a [f32],
    /// The audio of a turn taken back and merged into this one, before it.
    pub lead_in: &'a [f32],
}

#[derive(Debug, Clone, Copy)]
struct Verdict {
    /// The open turn's last confident speech frame's end when it was given.
    confident_end: Option<u64>,
    /// The end of the audio it heard.
    heard_to: u64,
    probability: Option<f32>,
    decision: TurnDecision,
}

#[derive(Debug, Clone, Copy)]
struct TurnState {
    start: u64,
    probes: u32,
    cost: Duration,
    verdict: Option<Verdict>,
    /// The confident end whose soft tail made a verdict stale: until the
    /// next confident frame, pauses are timed from the last speech frame.
    soft_tail: Option<u64>,
}

/// Judges each pause of the open utterance once (see [`TurnPolicy`]).
#[derive(Debug)]
pub(crate) struct TurnJudge {
    model: SharedTurnModel,
    policy: TurnPolicy,
    /// The silence-only hangover, used when the model fails on a pause.
    fallback: u64,
    turn: Option<TurnState>,
}

impl TurnJudge {
    pub(crate) fn new(model: SharedTurnModel, policy: TurnPolicy, fallback_ms: u32) -> Self {
        Self {
            model,
            policy,
            fallback: samples(fallback_ms),
            turn: None,
        }
    }

    /// The silence-only hangover, in samples.
    pub(crate) fn fallback_samples(&self) -> u64 {
        self.fallback
    }

    /// The silence-only hangover, but at least one detector frame: the
    /// position judged runs up to a frame's samples ahead of the last frame
    /// scored, so a hangover of 0 must still wait for one silent frame (it
    /// once ended every utterance at its first frame: nothing was heard).
    fn fallback_at_least_a_frame(&self) -> u64 {
        self.fallback.max(crate::vad::FRAME_SAMPLES as u64)
    }

    /// The policy it applies.
    pub(crate) fn policy(&self) -> &TurnPolicy {
        &self.policy
    }

    /// After a detector frame ending at `pos`: judges the pause of `open`
    /// once its silence reaches the probe point, and says whether the turn
    /// ends now (judged complete and the short wait is over, or the model
    /// failed and the silence-only hangover is).
    pub(crate) fn after_frame<T: Message>(
        &mut self,
        open: Option<OpenTurn<'_>>,
        pos: u64,
        out: &mut Emitter<'_, T>,
    ) -> bool {
        let Some(open) = open else {
            return false;
        };
        let turn = match &mut self.turn {
            Some(t) if t.start == open.start => t,
            slot => slot.insert(TurnState {
                start: open.start,
                probes: 0,
                cost: Duration::ZERO,
                verdict: None,
                soft_tail: None,
            }),
        };
        // The pause is timed from the last confident speech frame: earshot's
        // score decays for 80-100 ms after the last word, and judging after
        // that tail would add it to every commit.
        if turn.soft_tail.is_some() && turn.soft_tail != open.confident_end {
            turn.soft_tail = None;
        }
        if let Some(v) = turn.verdict {
            if v.confident_end != open.confident_end {
                // speech went on after the pause judged: judged anew
                turn.verdict = None;
            } else if open.end > v.heard_to + TAIL_GRACE {
                // the tail ran on past what was heard: speech going on
                // softly, whose pause is timed from its last speech frame
                turn.soft_tail = open.confident_end;
                turn.verdict = None;
            }
        }
        let anchor = open
            .confident_end
            .filter(|c| turn.soft_tail != Some(*c))
            .unwrap_or(open.end);
        let silence = pos.saturating_sub(open.end);
        if !open.keepable {
            // too short to be kept: dropped when the silence-only hangover
            // would have dropped it, not held open for the long wait; never
            // while it is still speech (a hangover of 0 ends it at its first
            // silent frame, as the silence-only endpointer does, not at its
            // first speech frame, nor in the samples after it not yet judged)
            return silence >= self.fallback_at_least_a_frame();
        }
        if turn.verdict.is_none() && pos >= anchor + samples(self.policy.probe_ms) {
            let audio = open.samples_to_now;
            // the last 8 s, reaching back into a merged turn's audio
            let own = audio.len().min(WINDOW_SAMPLES);
            let lead = open.lead_in;
            let mut heard = lead[lead.len().saturating_sub(WINDOW_SAMPLES - own)..].to_vec();
            heard.extend_from_slice(&audio[audio.len() - own..]);
            let model = &self.model;
            // on all the pipeline's threads if the engines' cores are free
            // (the speculative attempt is sent after this judgement, so on a
            // single conversation they usually are), else on one beside them
            let cores = out.free_cores(model.threads());
            let (scored, took) = out.timed(|| model.probability_on(&heard, cores.is_some()));
            drop(cores);
            turn.probes += 1;
            turn.cost += took;
            turn.verdict = Some(match scored {
                Ok(p) => Verdict {
                    confident_end: open.confident_end,
                    heard_to: pos,
                    probability: Some(p),
                    decision: if p > self.policy.threshold {
                        TurnDecision::Complete
                    } else if p < self.policy.incomplete_below {
                        TurnDecision::Incomplete
                    } else {
                        TurnDecision::Unsure
                    },
                },
                Err(e) => {
                    tracing::warn!("{e}; this pause ends the turn after the silence-only hangover");
                    Verdict {
                        confident_end: open.confident_end,
                        heard_to: pos,
                        probability: None,
                        decision: TurnDecision::Failed,
                    }
                }
            });
        }
        match turn.verdict.map(|v| v.decision) {
            Some(TurnDecision::Complete) => silence >= samples(self.policy.complete_ms),
            Some(TurnDecision::Words) => true,
            Some(TurnDecision::Unsure | TurnDecision::Failed) => {
                silence >= self.fallback_at_least_a_frame()
            }
            _ => false,
        }
    }

    /// The model's decision on the pause of the open turn starting at
    /// `start` (the last pause judged), if it was judged.
    pub(crate) fn decision(&self, start: u64) -> Option<TurnDecision> {
        self.turn
            .as_ref()
            .filter(|t| t.start == start)
            .and_then(|t| t.verdict)
            .map(|v| v.decision)
    }

    /// The words ended the open turn starting at `start` (see
    /// [`TurnPolicy::words`]): its account says so.
    pub(crate) fn ended_by_words(&mut self, start: u64) {
        if let Some(v) = self
            .turn
            .as_mut()
            .filter(|t| t.start == start)
            .and_then(|t| t.verdict.as_mut())
        {
            v.decision = TurnDecision::Words;
        }
    }

    /// Forgets the open turn's verdict: a taken-back turn was put before
    /// it, so its pause is judged again on the whole.
    pub(crate) fn rejudge(&mut self) {
        if let Some(t) = self.turn.as_mut() {
            t.verdict = None;
        }
    }

    /// The verdict on the turn that just closed as utterance `id` (its first
    /// sample `start`, closed at `closed`, its speech ending at `end`).
    pub(crate) fn outcome(&mut self, id: u64, start: u64, end: u64, closed: u64) -> EndOfTurn {
        let turn = self.turn.take().filter(|t| t.start == start);
        let verdict = turn.and_then(|t| t.verdict);
        let decision = verdict.map_or(TurnDecision::Unjudged, |v| v.decision);
        EndOfTurn {
            id,
            decision,
            probability: verdict.and_then(|v| v.probability),
            probes: turn.map_or(0, |t| t.probes),
            cost_ms: turn.map_or(0.0, |t| t.cost.as_secs_f64() * 1000.0),
            silence_ms: Clock::samples_to_ms(closed.saturating_sub(end)),
        }
    }
}
