//! Taking a turn back: a turn the semantic end of turn ended that its
//! speaker goes on with a moment later is merged into the next one.

use voxline_core::{Emitter, PipelineEvent, Utterance, UtteranceId, SAMPLE_RATE};

/// The longest the stage waits for an attempt's words: faster than real
/// time, or in real time once speech held for them closes (the recogniser
/// may first finish other turns' work, or the answer before it may hold
/// the cores; the audio meanwhile waits in the stage's queue).
const WORDS_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The silence kept, in ms, between a released turn's sending and the
/// first speech held after it, when whisper hears the two as one clip to
/// tell whether a finished sentence went on
/// ([`VadStage::heard_whole_goes_on`]). Heard with the speaker's own pause
/// of 1–1.5 s, whisper wrote a sentence end inside 8 of 33 human and 16 of
/// 39 Piper sentences cut there, and dropped what followed in 2 and 5 more;
/// with 300 ms of silence, in 0 and 4, dropping 0 and 7 (`cargo bench
/// --bench pairs`, `VOXLINE_BENCH_ROWS=whole`). In the stage, with a voice:
/// 300 and 500 ms cut 2 of 57 human pause clips and merge one human pair
/// ("7 of clubs" | "go forward 10 meters", 1.2 and 1.5 s apart); 800 ms
/// cuts 5 and merges none; the speaker's own pause cut 8.
const HEARD_WHOLE_PAUSE_MS: u64 = 500;

use super::VadStage;
use crate::turn::{
    asks, goes_on, goes_on_over_its_voice, heard_apart, heard_as_one, sentence_end, WordsVerdict,
};

/// A turn released early (see [`voxline_core::SpecBoard::release`]), while
/// speech starting before `until` would re-join it.
#[derive(Debug)]
pub(super) struct Released {
    pub id: UtteranceId,
    /// The stream position it was sent at.
    pub sent_at: u64,
    /// Its first sample (stream position; a merged turn's lead-in included).
    pub start: u64,
    /// The stream audio from `start` to now.
    pub audio: Vec<f32>,
    /// Speech whose first frame starts before this position re-joins it.
    pub until: u64,
    /// What it continues, and its lead-in (see [`Utterance::continues`]).
    pub continues: Option<UtteranceId>,
    pub overlap_samples: u64,
    /// Speech that resumed within the window before the turn's words were
    /// in, or after words that read as finished (its start and first
    /// speech): merged or not once it ends, from the words of both. While
    /// it is held the turn is held on the board (the voice waits).
    pub held: Option<(u64, u64)>,
}

/// The audio of a taken-back turn, which goes before the utterance the
/// endpointer opened at `at`.
#[derive(Debug, Clone)]
pub(super) struct LeadIn {
    /// The taken-back turn's first sample.
    pub start: u64,
    /// The stream audio from `start` to `at`.
    pub samples: Vec<f32>,
    /// The open utterance's first sample.
    pub at: u64,
    pub continues: Option<UtteranceId>,
    pub overlap_samples: u64,
}

/// Where an utterance starts, its audio and what it continues.
#[derive(Debug)]
pub(super) struct Head {
    pub start: u64,
    pub samples: Vec<f32>,
    pub continues: Option<UtteranceId>,
    pub overlap_samples: u64,
}

impl Head {
    /// The same utterance with `lead` (a taken-back turn) in front of it.
    pub(super) fn after(self, lead: Option<&LeadIn>) -> Self {
        let Some(l) = lead else {
            return self;
        };
        let mut samples = l.samples.clone();
        samples.extend(self.samples);
        Self {
            start: l.start,
            samples,
            continues: l.continues,
            overlap_samples: l.overlap_samples,
        }
    }
}

impl VadStage {
    /// After a detector frame (`part`, ending at `pos`): merges the released
    /// turn into the open utterance once that has speech enough to be kept
    /// and its first speech frame started within the merge window, or
    /// commits the released turn once the window has passed with no such
    /// speech. A turn longer than half the longest utterance is never
    /// merged: with what follows it would not fit one.
    pub(super) fn watch_released(
        &mut self,
        part: &[f32],
        pos: u64,
        out: &mut Emitter<'_, Utterance>,
    ) {
        let words = self
            .released
            .as_ref()
            .map(|r| (r.id, r.sent_at))
            .and_then(|(id, sent_at)| self.words_verdict(id, sent_at, pos, out));
        let words_on = self.words_on();
        let Some(r) = self.released.as_mut() else {
            return;
        };
        r.audio.extend_from_slice(part);
        let origin = self.origin.unwrap_or(0);
        let open = self
            .endpointer
            .open_utterance()
            .map(|o| (o.start_sample + origin, o.first_speech + origin, o.keepable));
        let max_lead =
            u64::from(self.endpointer.config().max_utterance_ms) * u64::from(SAMPLE_RATE) / 2000;
        match open {
            Some((start, first, keepable)) if first < r.until && start >= r.start => {
                let lead = start - r.start;
                if lead > max_lead || lead > r.audio.len() as u64 {
                    self.commit_released();
                } else if keepable && words_on && words.is_none_or(WordsVerdict::may_hold) {
                    // Its words are not in yet (or came in since, reading
                    // as finished, as a number that may go on, or with no
                    // final mark): the new speech is held until it ends,
                    // and what both say then decides. Its answer has not
                    // begun (the language model needs its words), or only
                    // its voice's first words, which barge-in pauses; the
                    // voice takes no more of it meanwhile.
                    if r.held.is_none() {
                        if let Some((board, _)) = &self.spec {
                            board.hold(r.id);
                        }
                    }
                    r.held = Some((start, first));
                } else if keepable {
                    self.merge(start, first, out);
                }
                // else: speech too short yet to be kept; a blip is dropped
            }
            _ if pos >= r.until => self.commit_released(),
            _ => {
                // the speech held was dropped (a blip): released again
                if r.held.take().is_some() {
                    if let Some((board, _)) = &self.spec {
                        board.release(r.id);
                    }
                }
            }
        }
    }

    /// Before the utterance starting at `start` closes (any, with `None`):
    /// speech held after the released turn is decided now. A finished
    /// sentence (or a number, or words with no final mark) stays its own
    /// turn unless what followed goes on with it ([`crate::turn::goes_on`]:
    /// whisper heard it start mid-sentence, more of the same number, or
    /// the next item of a list; or heard whole, one sentence); otherwise,
    /// or with no words yet, the turn is taken back. `going_on`: the held
    /// speech paused and goes on (it is decided at that pause), rather
    /// than ended.
    pub(super) fn settle_held(
        &mut self,
        start: Option<u64>,
        pos: u64,
        going_on: bool,
        out: &mut Emitter<'_, Utterance>,
    ) {
        let Some((id, sent_at, (held_start, first))) = self
            .released
            .as_ref()
            .and_then(|r| Some((r.id, r.sent_at, r.held?)))
        else {
            return;
        };
        if start.is_some_and(|s| s != held_start) {
            return;
        }
        if going_on && self.voice_begun(id) {
            // Speech over the turn's voice is decided once it ends, from
            // all its words: what was said before its own first pause
            // ("And we're glad.") is too little to tell, and the voice,
            // paused by barge-in, waits for no next turn meanwhile.
            return;
        }
        let verdict = self
            .words_verdict(id, sent_at, pos, out)
            .or_else(|| self.await_words(id, sent_at, out));
        let finished = verdict.is_some_and(WordsVerdict::may_hold);
        let unmarked = verdict == Some(WordsVerdict::Unmarked);
        let on = if finished {
            self.held_goes_on(id, held_start, (unmarked, going_on), out)
        } else {
            Some(true)
        };
        match on {
            Some(false) => {
                tracing::debug!(
                    turn = id,
                    "what followed does not go on with its words: the turn is final"
                );
                self.commit_released();
            }
            Some(true) => self.merge(held_start, first, out),
            // one word before the held speech's own pause: decided at its
            // next pause, or its end
            None => {}
        }
    }

    /// Whether the speech held after released turn `id`, starting at
    /// `held_start`, goes on with that turn's sentence: read from the words
    /// of both, once the attempt sent on the held speech's pause has them
    /// (waited for, as [`VadStage::await_words`]), then heard whole. The
    /// words of a finished sentence (or a number) end the turn unless
    /// shown to go on; those with no final mark (`unmarked`) go on unless
    /// shown apart. With nothing to show, that is the answer. Over the
    /// turn's voice, held speech that has ended (not `going_on`) and reads
    /// as a backchannel ("uh-huh", a cough) does not go on. `None`: too
    /// little to tell yet, a single word heard alone before the held
    /// speech's own pause (`going_on`) that does not go on by its words:
    /// whisper, given one word, makes a sentence of its own of it ("Milk,"
    /// after "I need eggs." heard as "No."), so the turn stays held until
    /// the held speech's next pause or its end.
    fn held_goes_on(
        &mut self,
        id: UtteranceId,
        held_start: u64,
        (unmarked, going_on): (bool, bool),
        out: &mut Emitter<'_, Utterance>,
    ) -> Option<bool> {
        let Some(p) = self.pending.filter(|p| p.start == held_start) else {
            return Some(unmarked);
        };
        self.await_words(p.id, p.sent_at, out);
        let Some((board, _)) = &self.spec else {
            return Some(unmarked);
        };
        let (Some(before), Some(after)) = (board.words(id), board.words(p.id)) else {
            return Some(unmarked);
        };
        let voiced = self.voice_begun(id);
        if voiced && !going_on && voxline_core::barge::backchannel(&after) {
            // a listener's word over the answer ("uh-huh", a cough): the
            // voice plays on, and the turn is final; speech that goes on
            // past it is no backchannel, whatever its first words
            return Some(false);
        }
        // Over its voice the words must show more: what followed, heard
        // alone, may start in lower case though it is a sentence of its
        // own ("go forward 10 meters." after "7 of clubs.").
        let on = if voiced {
            goes_on_over_its_voice(&before, &after)
        } else {
            goes_on(&before, &after)
        };
        tracing::debug!(
            turn = id,
            before,
            after,
            on,
            voiced,
            "does what followed go on?"
        );
        if on {
            return Some(true);
        }
        if going_on && after.split_whitespace().count() < 2 {
            tracing::debug!(turn = id, after, "one word before its pause: held on");
            return None;
        }
        // a question is final unless its words show more (`asks`)
        Some(!asks(&before) && self.heard_whole_goes_on(id, &before, unmarked, out))
    }

    /// Whether whisper, hearing released turn `id` and the speech held
    /// after it as one clip, writes them as one sentence
    /// ([`heard_as_one`]; `before`: the turn's own words), or, for words
    /// with no final mark (`unmarked`), does not write a sentence end
    /// where they ended ([`heard_apart`]). The clip (the turn's audio with
    /// everything since; for a finished sentence, the pause cut to
    /// [`HEARD_WHOLE_PAUSE_MS`]) is sent as an attempt of its own, its words
    /// waited for as [`VadStage::await_words`] does, and it is cancelled
    /// once they are in: nothing answers it (the language model rolls back
    /// what it began of it). No words: `unmarked`.
    fn heard_whole_goes_on(
        &mut self,
        id: UtteranceId,
        before: &str,
        unmarked: bool,
        out: &mut Emitter<'_, Utterance>,
    ) -> bool {
        let Some((board, _)) = self.spec.clone() else {
            return unmarked;
        };
        let Some(r) = self.released.as_ref().filter(|r| r.id == id) else {
            return unmarked;
        };
        let end = r.start + r.audio.len() as u64;
        // Shortened, the pause biases whisper towards one sentence: for a
        // finished sentence, which is final unless shown to go on. Words
        // with no final mark go on unless shown apart, so they are heard
        // with the pause the speaker made ("7F Clubs" then "Go forward ten
        // meters." a second later: "7 of clubs. Go forward 10 meters.").
        let samples = if unmarked {
            r.audio.clone()
        } else {
            pause_shortened(r, HEARD_WHOLE_PAUSE_MS * u64::from(SAMPLE_RATE) / 1000)
        };
        // the clip ends where the stream is; it starts later by what was cut
        let start = end - samples.len() as u64;
        let (continues, overlap_samples) = (r.continues, r.overlap_samples);
        let whole = self.next_id;
        self.next_id += 1;
        board.start(whole);
        out.publish(PipelineEvent::SpecStart {
            id: whole,
            sample: end,
        });
        out.emit(Utterance {
            id: whole,
            start_sample: start,
            end_sample: end,
            end_wall: self.wall_of(end),
            samples,
            forced_split: false,
            closed_sample: end,
            continues,
            overlap_samples,
        });
        let heard = out.waiting(|| board.wait_words(whole, WORDS_WAIT_LIMIT));
        board.cancel(whole);
        out.publish(PipelineEvent::SpecCancel {
            id: whole,
            sample: end,
        });
        let Some((words, took)) = heard else {
            tracing::debug!(turn = id, "no words came for the turn heard whole");
            return unmarked;
        };
        let on = if unmarked {
            !heard_apart(before, &words)
        } else {
            heard_as_one(before, &words)
        };
        tracing::debug!(
            turn = id,
            before,
            whole = words,
            ?took,
            on,
            "heard whole, is it one sentence?"
        );
        on
    }

    /// Takes the released turn back: cancelled on the board (the stages
    /// undo what they did for it), [`PipelineEvent::Merged`] published,
    /// and its audio kept as the lead-in of the utterance open at `start`.
    fn merge(&mut self, start: u64, first_speech: u64, out: &mut Emitter<'_, Utterance>) {
        let Some(mut r) = self.released.take() else {
            return;
        };
        let Some((board, _)) = &self.spec else {
            return;
        };
        board.cancel(r.id);
        out.publish(PipelineEvent::Merged {
            id: r.id,
            sample: first_speech,
        });
        if let Some(w) = &self.barge {
            // its voice, if it began, stops: the turn is answered whole
            w.taken_back(r.id, self.wall_of(first_speech));
        }
        if let Some(p) = self.pending.filter(|p| p.start == start) {
            // an attempt on the open utterance alone lacks the lead-in
            board.cancel(p.id);
            out.publish(PipelineEvent::SpecCancel {
                id: p.id,
                sample: first_speech,
            });
            self.pending = None;
        }
        if let Some(judge) = self.turn.as_mut() {
            // its pause, if judged, was judged without the turn before it
            judge.rejudge();
        }
        r.audio.truncate((start - r.start) as usize);
        self.lead_in = Some(LeadIn {
            start: r.start,
            samples: r.audio,
            at: start,
            continues: r.continues,
            overlap_samples: r.overlap_samples,
        });
        tracing::debug!(
            turn = r.id,
            "speech went on within the merge window: the turn is taken back"
        );
    }

    /// Whether turn `id`'s answer has begun to play.
    fn voice_begun(&self, id: UtteranceId) -> bool {
        self.barge.as_ref().is_some_and(|w| w.has_played(id))
    }

    /// Whether the words of a turn are a second opinion (a model judges
    /// the pauses, speculation is on, and the policy asks for them).
    pub(super) fn words_on(&self) -> bool {
        self.spec.is_some() && self.turn.as_ref().is_some_and(|j| j.policy().words)
    }

    /// What the words of attempt `id` (sent at stream position `sent_at`)
    /// say at `pos`, once its transcript exists and when they are a second
    /// opinion. The verdict is reached once per attempt. Faster than real
    /// time, the words are waited for and count from where they would have
    /// come (see [`VadStage::with_words_in_stream_time`]).
    pub(super) fn words_verdict(
        &mut self,
        id: UtteranceId,
        sent_at: u64,
        pos: u64,
        out: &mut Emitter<'_, Utterance>,
    ) -> Option<WordsVerdict> {
        let (board, _) = self.spec.as_ref().filter(|_| self.words_on())?;
        let known = self.words.iter().find(|(seen, _)| *seen == id).map(|w| w.1);
        let words = match known {
            Some(w) => w,
            None => {
                let heard = if self.words_in_stream_time {
                    // a wait on the recogniser's work, not this stage's
                    let heard = out.waiting(|| board.wait_words(id, WORDS_WAIT_LIMIT));
                    heard.map(|(w, took)| {
                        let late = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
                        (
                            w,
                            sent_at.saturating_add(late * u64::from(SAMPLE_RATE) / 1000),
                        )
                    })
                } else {
                    // in real time: in when they are in (asked again until then)
                    Some((board.words(id)?, 0))
                };
                if let Some((w, from)) = &heard {
                    tracing::debug!(turn = id, words = ?w, verdict = ?sentence_end(w), from, "the attempt's words are in");
                }
                let words = heard.map(|(w, from)| (sentence_end(&w), from));
                self.keep_words(id, words);
                words
            }
        };
        match words {
            Some((verdict, from)) if pos >= from => Some(verdict),
            _ => None,
        }
    }

    /// Keeps the verdict of attempt `id`'s words: the last two asked about
    /// (a released turn's and the open utterance's attempt).
    fn keep_words(&mut self, id: UtteranceId, words: Option<(WordsVerdict, u64)>) {
        self.words.retain(|(seen, _)| *seen != id);
        if self.words.len() == 2 {
            self.words.remove(0);
        }
        self.words.push((id, words));
    }

    /// The verdict of attempt `id`'s words once held speech closes before
    /// they are in: in real time they are waited for (up to
    /// [`WORDS_WAIT_LIMIT`]), since the recogniser is busy (other work
    /// holds the cores) and the next turn could not be heard before this
    /// one anyway, so waiting costs its answer next to nothing, where
    /// deciding without its words would make two sentences one turn.
    /// Faster than real time, the words already waited for count now.
    pub(super) fn await_words(
        &mut self,
        id: UtteranceId,
        sent_at: u64,
        out: &mut Emitter<'_, Utterance>,
    ) -> Option<WordsVerdict> {
        if self.words_in_stream_time {
            return self.words_verdict(id, sent_at, u64::MAX, out);
        }
        let (board, _) = self.spec.as_ref().filter(|_| self.words_on())?;
        let Some((words, took)) = out.waiting(|| board.wait_words(id, WORDS_WAIT_LIMIT)) else {
            tracing::debug!(turn = id, "no words came for the attempt");
            return None;
        };
        let verdict = sentence_end(&words);
        tracing::debug!(turn = id, words = ?words, ?verdict, ?took, "waited for the attempt's words");
        self.keep_words(id, Some((verdict, 0)));
        Some(verdict)
    }

    /// The released turn, if any, is final.
    pub(super) fn commit_released(&mut self) {
        if let (Some(r), Some((board, _))) = (self.released.take(), &self.spec) {
            board.commit(r.id);
        }
    }

    /// The lead-in for the utterance starting at `start`, taken.
    pub(super) fn lead_in_for(&mut self, start: u64) -> Option<LeadIn> {
        if self.lead_in.as_ref().is_some_and(|l| l.at == start) {
            self.lead_in.take()
        } else {
            None
        }
    }

    /// The merge window after speech ending at `end`.
    pub(super) fn merge_until(end: u64, merge_ms: u32) -> u64 {
        end + u64::from(merge_ms) * u64::from(SAMPLE_RATE) / 1000
    }
}

/// Released turn `r`'s audio with everything since, the silence between
/// its sending and the first speech held after it cut to `keep` samples
/// (unchanged when nothing is held, the silence is no longer, or the held
/// speech is not in the audio).
fn pause_shortened(r: &Released, keep: u64) -> Vec<f32> {
    let Some((_, first)) = r.held else {
        return r.audio.clone();
    };
    let at = |pos: u64| {
        usize::try_from(pos.saturating_sub(r.start)).map_or(r.audio.len(), |i| i.min(r.audio.len()))
    };
    let (cut_from, cut_to) = (at(r.sent_at), at(first.saturating_sub(keep)));
    if cut_to <= cut_from || cut_to >= r.audio.len() {
        return r.audio.clone();
    }
    let mut v = Vec::with_capacity(r.audio.len() - (cut_to - cut_from));
    v.extend_from_slice(&r.audio[..cut_from]);
    v.extend_from_slice(&r.audio[cut_to..]);
    v
}

#[cfg(test)]
mod tests {
    use super::{pause_shortened, Released};

    fn released(held: Option<(u64, u64)>) -> Released {
        // 1 000 samples from stream position 500: the turn's speech to 800
        // (sent at 800), silence, then held speech from 1 300 (first at 1 400)
        let audio: Vec<f32> = (0..1_000u16).map(f32::from).collect();
        Released {
            id: 1,
            sent_at: 800,
            start: 500,
            audio,
            until: 5_000,
            continues: None,
            overlap_samples: 0,
            held,
        }
    }

    #[test]
    fn heard_whole_the_pause_is_cut_to_what_is_kept() {
        let r = released(Some((1_300, 1_400)));
        let v = pause_shortened(&r, 100);
        // the turn to its sending, then from 100 samples before the held speech's first
        assert_eq!(v.len(), 300 + (1_000 - 800));
        assert_eq!(v[299], 299.0);
        assert_eq!(v[300], 800.0);
        assert_eq!(*v.last().unwrap(), 999.0);
        // a pause no longer than what is kept, or nothing held: unchanged
        assert_eq!(pause_shortened(&r, 600), r.audio);
        assert_eq!(pause_shortened(&r, 10_000), r.audio);
        assert_eq!(pause_shortened(&released(None), 100), r.audio);
        // positions outside the audio: unchanged, never a panic
        let mut odd = released(Some((1_300, 9_999)));
        odd.sent_at = 100;
        assert_eq!(pause_shortened(&odd, 100), odd.audio);
    }
}
