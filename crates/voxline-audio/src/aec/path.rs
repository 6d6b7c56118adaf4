//! Whether the microphone hears the voice at all.
//!
//! AEC3 suppresses what it cannot yet model: until its filter has
//! converged on an echo path, or its transparent mode has decided there is
//! none (8–12 s of the voice on this port), it treats everything the
//! microphone hears while the voice plays as possible echo. With headphones
//! there is no echo path, so the person speaking over the voice was taken
//! down by 45–70 dB for the first 300 ms of their speech, 0.5 s and 7.5 s
//! into the answer (the `aec` tests), and the endpointer heard their barge-in
//! late or not at all.
//!
//! [`EchoPath`] judges each stretch of the voice (an answer, after a
//! silence of [`NEW_STRETCH_AFTER_BLOCKS`]): while the voice speaks, does the
//! microphone's raw level rise above its own quiet floor?
//!
//! - The first stretch starts [`Heard::Unknown`], and the canceller
//!   cancels. If the microphone stays at its floor through
//!   [`EVIDENCE_BLOCKS`] of the voice, past the longest the echo may take
//!   to come ([`ECHO_DELAY_BLOCKS`]), there is no echo path: the
//!   canceller is handed silence for a far end (it stands aside, the
//!   person is heard as they are). If it rises with the voice, there is
//!   one, and AEC3 goes on cancelling. So a loudspeaker's echo is never
//!   let through while the evidence comes in; speech over the first
//!   answer's first ~0.6 s may be taken down with it.
//! - Each later stretch starts with the last verdict, so speech at the
//!   very start of an answer is heard as well as later in it, and is
//!   judged again. [`Heard::Present`] becomes [`Heard::Absent`] on the
//!   same evidence as at first (headphones put on). [`Heard::Absent`]
//!   becomes [`Heard::Present`] only when the microphone rose through a
//!   whole second of the voice ([`REJUDGE_BLOCKS`]): a person speaking
//!   over the voice stops it well within that (barge-in), and their
//!   "uh-huh" is shorter, so only an echo path (headphones taken off)
//!   keeps the microphone up that long. The echo comes some tens of ms
//!   after the voice at each word's onset, so for this the microphone at
//!   its floor counts only once the voice has spoken [`ONSET_BLOCKS`] in a
//!   row, and two blocks in three up are enough: counted from every onset,
//!   with nine in ten asked, an echo path 40 ms behind never overturned it
//!   (issue 65: "heard it in 0 of 8 answers").
//! - A stretch judged [`Heard::Absent`] is still watched to its end: if
//!   the microphone then rises with the voice for a quarter of a second
//!   ([`APPEARED_BLOCKS`], two blocks in three), [`EchoPath::appeared`]
//!   says so, and the stage checks that the microphone's level follows
//!   the voice's (a person speaking over it does not) before it takes it
//!   for an echo path that appeared mid-answer: the capture moved to the
//!   loudspeaker's monitor (PulseAudio does that when the microphone goes
//!   away, with no gap in the stream), or headphones taken off.
//! - [`EchoPath::rejudge`] forgets all of it (the floor too): the capture
//!   device changed, and the path is judged afresh, as at the start.

/// The voice speaks in a block (mean square above this, -40 dBFS): only
/// such blocks are evidence (the tail of a word, or a pause between two,
/// says little about an echo path).
pub const VOICE_SPEAKS: f32 = 1e-4;

/// How far above its quiet floor the microphone may be and still count as
/// not hearing the voice (6 dB: a floor's own wander).
const ABOVE_FLOOR: f32 = 4.0;

/// The lowest floor assumed (-90 dBFS): a digitally silent microphone.
const MIN_FLOOR: f32 = 1e-9;

/// How fast the floor may rise per block, while nothing plays (3 dB/s).
const FLOOR_RISE: f32 = 1.0069;

/// Blocks of the voice speaking (10 ms each) the evidence is drawn from:
/// a quarter of a second.
pub const EVIDENCE_BLOCKS: u32 = 25;

/// Blocks from the start of a stretch during which the microphone staying
/// quiet is no evidence: its echo may not have come yet (300 ms). AEC3
/// found the echo 68–80 ms behind the far end through PulseAudio here;
/// this covers a sound server four times as slow. Longer delays the
/// verdict: the first answer is cancelled for the wait plus the evidence,
/// ~0.6 s. A microphone that rises meanwhile is evidence at once.
pub const ECHO_DELAY_BLOCKS: u32 = 30;

/// Blocks of the voice speaking, nearly all with the microphone above its
/// floor, that overturn a stretch begun without an echo path (a second).
pub const REJUDGE_BLOCKS: u32 = 100;

/// Blocks the voice must have spoken in a row before the microphone at
/// its floor counts against an echo path, when a stretch begun without one
/// is judged again: the echo of a word's onset comes behind it (the sound
/// server's buffering, the room; 120 ms).
pub const ONSET_BLOCKS: u32 = 12;

/// Blocks of the voice speaking with the microphone above its floor, in a
/// stretch without an echo path, from which one may have appeared
/// mid-stretch (a quarter of a second; see [`EchoPath::appeared`]). The
/// microphone hearing the voice soon makes it pause (barge-in), so the
/// evidence must come before that: through PulseAudio it paused ~0.4 s
/// after the capture moved.
pub const APPEARED_BLOCKS: u32 = 25;

/// Blocks without the voice after which it is a new stretch of it, judged
/// afresh (2 s: between answers, not between two of an answer's
/// sentences).
pub const NEW_STRETCH_AFTER_BLOCKS: u32 = 200;

/// What the microphone says of the voice's echo in this stretch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// Not enough of the voice yet to tell.
    Unknown,
    /// The microphone stayed at its floor while the voice spoke: no echo
    /// path (headphones).
    Absent,
    /// The microphone rose with the voice: an echo path, or the person
    /// speaking from the start; the canceller cancels.
    Present,
}

/// The detector: fed each 10 ms block's mean squares, far end and raw
/// microphone (see the [module](self) documentation).
#[derive(Debug)]
pub struct EchoPath {
    /// The microphone's quiet level (mean square), followed while the
    /// voice is silent, from [`ECHO_DELAY_BLOCKS`] after it last sounded
    /// (before, its echo may still be coming): down at once, up slowly.
    floor: Option<f32>,
    heard: Heard,
    /// Whether this stretch has been judged.
    judged: bool,
    /// This stretch's blocks of the voice speaking with the microphone at
    /// its floor, and above it.
    quiet: u32,
    raised: u32,
    /// Blocks since the voice last sounded.
    silent: u32,
    /// Blocks since this stretch's voice first sounded.
    into_stretch: Option<u32>,
    /// Blocks the voice has spoken in a row.
    speaking: u32,
    /// Since this stretch was judged without an echo path: blocks of the
    /// voice speaking with the microphone above its floor, and at it.
    after_raised: u32,
    after_quiet: u32,
    /// When (blocks into the stretch) the first of them rose.
    raised_from: Option<u32>,
    /// Stretches ended or judged so far: without an echo path, and with
    /// one.
    absent_stretches: u64,
    present_stretches: u64,
}

impl Default for EchoPath {
    fn default() -> Self {
        Self {
            floor: None,
            heard: Heard::Unknown,
            judged: false,
            quiet: 0,
            raised: 0,
            silent: NEW_STRETCH_AFTER_BLOCKS,
            into_stretch: None,
            speaking: 0,
            after_raised: 0,
            after_quiet: 0,
            raised_from: None,
            absent_stretches: 0,
            present_stretches: 0,
        }
    }
}

impl EchoPath {
    /// One block: `far` (what the voice played, mean square; above
    /// -60 dBFS it sounds) and `mic` (the microphone before the canceller).
    /// Returns the verdict for this block.
    pub fn block(&mut self, far: f32, mic: f32) -> Heard {
        if let Some(n) = self.into_stretch.as_mut() {
            *n = n.saturating_add(1);
        }
        self.speaking = if far > VOICE_SPEAKS {
            self.speaking.saturating_add(1)
        } else {
            0
        };
        if far <= 1e-6 {
            self.silent = self.silent.saturating_add(1);
            if self.silent == NEW_STRETCH_AFTER_BLOCKS {
                // a new stretch starts from the last verdict, judged again
                (self.absent_stretches, self.present_stretches) = self.stretches();
                (self.judged, self.quiet, self.raised) = (false, 0, 0);
                (self.after_raised, self.after_quiet, self.raised_from) = (0, 0, None);
                self.into_stretch = None;
            }
            // the echo of the voice's last sound may still be coming
            if self.silent >= ECHO_DELAY_BLOCKS {
                self.floor = Some(match self.floor {
                    Some(f) if mic >= f => (f * FLOOR_RISE).min(mic),
                    _ => mic,
                });
            }
            return self.heard;
        }
        self.silent = 0;
        let into_stretch = *self.into_stretch.get_or_insert(0);
        let Some(floor) = self.floor else {
            // nothing was ever heard without the voice: no floor to judge by
            return self.heard;
        };
        if far <= VOICE_SPEAKS {
            return self.heard;
        }
        let at_floor = mic <= floor.max(MIN_FLOOR) * ABOVE_FLOOR;
        if self.heard == Heard::Absent {
            if at_floor {
                // the onset of a word's echo comes behind it
                if self.speaking >= ONSET_BLOCKS {
                    self.after_quiet += 1;
                }
            } else {
                self.after_raised += 1;
                self.raised_from.get_or_insert(into_stretch);
            }
        }
        if self.judged {
            return self.heard;
        }
        if at_floor {
            // quiet before the echo could have come says nothing
            let onset = self.heard == Heard::Absent && self.speaking < ONSET_BLOCKS;
            if into_stretch >= ECHO_DELAY_BLOCKS && !onset {
                self.quiet += 1;
            }
        } else {
            self.raised += 1;
        }
        // nine blocks in ten at the floor (a click or a breath aside)
        let unheard = self.quiet >= EVIDENCE_BLOCKS && self.raised * 10 <= self.quiet;
        let heard = match self.heard {
            Heard::Absent => self.raised >= REJUDGE_BLOCKS && self.quiet * 2 <= self.raised,
            _ => self.raised >= EVIDENCE_BLOCKS / 5 && self.raised * 10 > self.quiet,
        };
        if unheard {
            (self.heard, self.judged) = (Heard::Absent, true);
            self.absent_stretches += 1;
        } else if heard {
            (self.heard, self.judged) = (Heard::Present, true);
            self.present_stretches += 1;
        }
        self.heard
    }

    /// Whether, in a stretch judged without an echo path (or begun with
    /// that verdict), the microphone has risen with the voice for
    /// [`APPEARED_BLOCKS`], two blocks in three: an echo path may have
    /// appeared mid-stretch, or a person is speaking over the voice; the
    /// caller tells which by the levels. If so, the blocks since the
    /// microphone first rose (what to compare). [`EchoPath::not_appeared`]
    /// says it was the person.
    #[must_use]
    pub fn appeared(&self) -> Option<usize> {
        let from = self.raised_from?;
        (self.heard == Heard::Absent
            && self.after_raised >= APPEARED_BLOCKS
            && self.after_quiet * 2 <= self.after_raised)
            .then(|| (self.into_stretch.unwrap_or(from).saturating_sub(from) + 1) as usize)
    }

    /// What [`EchoPath::appeared`] saw was not an echo path: it is
    /// counted afresh from here.
    pub fn not_appeared(&mut self) {
        (self.after_raised, self.after_quiet, self.raised_from) = (0, 0, None);
    }

    /// The capture device changed (or its stream broke): what was learnt
    /// of the microphone, its floor included, no longer holds. The path is
    /// judged afresh, as at the start ([`Heard::Unknown`]: the canceller
    /// cancels meanwhile); the stretches counted so far stay counted.
    pub fn rejudge(&mut self) {
        (self.absent_stretches, self.present_stretches) = self.stretches();
        self.floor = None;
        self.heard = Heard::Unknown;
        (self.judged, self.quiet, self.raised) = (false, 0, 0);
        self.into_stretch = None;
        self.speaking = 0;
        (self.after_raised, self.after_quiet, self.raised_from) = (0, 0, None);
    }

    /// Stretches of the voice without an echo path, and with one, by
    /// their verdict (one begun from the last verdict and not overturned
    /// counts with it).
    pub fn stretches(&self) -> (u64, u64) {
        let (mut absent, mut present) = (self.absent_stretches, self.present_stretches);
        if !self.judged && self.quiet + self.raised > 0 {
            match self.heard {
                Heard::Absent => absent += 1,
                Heard::Present => present += 1,
                Heard::Unknown => {}
            }
        }
        (absent, present)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOICE: f32 = 1e-2;

    fn run(path: &mut EchoPath, blocks: u32, far: f32, mic: f32) -> Heard {
        (0..blocks).fold(Heard::Unknown, |_, _| path.block(far, mic))
    }

    #[test]
    fn a_microphone_that_stays_at_its_floor_while_the_voice_speaks_hears_no_echo() {
        let mut p = EchoPath::default();
        assert_eq!(run(&mut p, 50, 0.0, 1e-7), Heard::Unknown);
        assert_eq!(
            run(&mut p, ECHO_DELAY_BLOCKS + EVIDENCE_BLOCKS - 1, VOICE, 2e-7),
            Heard::Unknown
        );
        assert_eq!(p.block(VOICE, 1e-7), Heard::Absent);
        // then the person speaks over it: still no echo path
        assert_eq!(run(&mut p, 100, VOICE, 1e-2), Heard::Absent);
        assert_eq!(p.stretches(), (1, 0));
    }

    #[test]
    fn a_digitally_silent_microphone_hears_no_echo() {
        let mut p = EchoPath::default();
        run(&mut p, 10, 0.0, 0.0);
        assert_eq!(
            run(&mut p, ECHO_DELAY_BLOCKS + EVIDENCE_BLOCKS, VOICE, 0.0),
            Heard::Absent
        );
    }

    #[test]
    fn an_echo_30_db_down_is_an_echo_path_within_a_few_blocks() {
        let mut p = EchoPath::default();
        run(&mut p, 50, 0.0, 1e-8);
        // the echo, 30 dB under the voice, 50 dB over the floor
        assert_eq!(run(&mut p, 4, VOICE, VOICE * 1e-3), Heard::Unknown);
        assert_eq!(p.block(VOICE, VOICE * 1e-3), Heard::Present);
        // the voice's quiet moments later do not undo it
        assert_eq!(run(&mut p, 200, VOICE, 1e-8), Heard::Present);
        assert_eq!(p.stretches(), (0, 1));
    }

    #[test]
    fn a_click_or_a_breath_among_the_evidence_does_not_make_an_echo_path() {
        let mut p = EchoPath::default();
        run(&mut p, 50, 0.0, 1e-8);
        run(&mut p, ECHO_DELAY_BLOCKS + 10, VOICE, 1e-8);
        p.block(VOICE, 1e-3);
        p.block(VOICE, 1e-3);
        assert_eq!(run(&mut p, EVIDENCE_BLOCKS, VOICE, 1e-8), Heard::Absent);
    }

    #[test]
    fn each_answer_starts_from_the_last_verdict_and_is_judged_again() {
        let mut p = EchoPath::default();
        run(&mut p, 50, 0.0, 1e-8);
        assert_eq!(run(&mut p, 70, VOICE, 1e-8), Heard::Absent);
        // a pause between two sentences of the answer: the same stretch
        run(&mut p, NEW_STRETCH_AFTER_BLOCKS - 1, 0.0, 1e-8);
        assert_eq!(p.block(VOICE, 1e-3), Heard::Absent);
        // the next answer: the person speaks at its very start, and is
        // heard as they are; the voice stops (a barge-in) within a second
        run(&mut p, NEW_STRETCH_AFTER_BLOCKS, 0.0, 1e-8);
        assert_eq!(run(&mut p, 40, VOICE, 1e-3), Heard::Absent);
        // the answer after, through a loudspeaker now: a second of it
        // heard overturns the verdict
        run(&mut p, NEW_STRETCH_AFTER_BLOCKS, 0.0, 1e-8);
        assert_eq!(run(&mut p, REJUDGE_BLOCKS - 1, VOICE, 1e-4), Heard::Absent);
        assert_eq!(p.block(VOICE, 1e-4), Heard::Present);
        // and headphones again: a quarter-second unheard, once the echo
        // would have come
        run(&mut p, NEW_STRETCH_AFTER_BLOCKS, 0.0, 1e-8);
        assert_eq!(
            run(&mut p, ECHO_DELAY_BLOCKS + 4, VOICE, 1e-8),
            Heard::Present
        );
        assert_eq!(run(&mut p, EVIDENCE_BLOCKS, VOICE, 1e-8), Heard::Absent);
        assert_eq!(p.stretches(), (3, 1));
    }

    #[test]
    fn the_floor_follows_a_noisier_room_slowly_and_a_quieter_one_at_once() {
        let mut p = EchoPath::default();
        run(&mut p, 50, 0.0, 1e-8);
        // a fan starts, 30 dB up: a second later the floor is still far below it
        run(&mut p, 100, 0.0, 1e-5);
        assert_eq!(run(&mut p, 10, VOICE, 1e-5), Heard::Present);
        let mut q = EchoPath::default();
        run(&mut q, 50, 0.0, 1e-5);
        run(&mut q, 1, 0.0, 1e-8);
        assert_eq!(run(&mut q, 10, VOICE, 1e-5), Heard::Present);
    }

    #[test]
    fn an_echo_that_comes_late_is_an_echo_path() {
        // the sound server holds the echo back 250 ms behind its far end
        let mut p = EchoPath::default();
        run(&mut p, 50, 0.0, 1e-8);
        assert_eq!(run(&mut p, 25, VOICE, 1e-8), Heard::Unknown);
        assert_eq!(run(&mut p, 5, VOICE, 1e-4), Heard::Present);
        // and in a later stretch, begun with it, the wait before it comes
        // does not end the cancelling
        run(&mut p, NEW_STRETCH_AFTER_BLOCKS, 0.0, 1e-8);
        assert_eq!(run(&mut p, 25, VOICE, 1e-8), Heard::Present);
        assert_eq!(run(&mut p, 100, VOICE, 1e-4), Heard::Present);
        assert_eq!(p.stretches(), (0, 2));
    }

    /// Words of the voice (`on` blocks speaking, `off` silent) with the
    /// microphone hearing each `lag` blocks behind, for `blocks`.
    fn words(p: &mut EchoPath, blocks: u32, lag: u32, mic: f32) -> Heard {
        let (on, off) = (25, 6);
        let speaks = |i: u32| i % (on + off) < on;
        (0..blocks).fold(Heard::Unknown, |_, i| {
            let far = if speaks(i) { VOICE } else { 0.0 };
            let heard = i >= lag && speaks(i - lag);
            p.block(far, if heard { mic } else { 1e-8 })
        })
    }

    #[test]
    fn an_echo_path_that_appears_behind_each_word_overturns_a_stretch_without_one() {
        // issue 65: the headphones taken off mid-session; the echo comes
        // 80 ms behind each word's onset, and with nine blocks in ten asked
        // the verdict never changed
        let mut p = EchoPath::default();
        run(&mut p, 50, 0.0, 1e-8);
        assert_eq!(words(&mut p, 100, 0, 1e-8), Heard::Absent);
        run(&mut p, NEW_STRETCH_AFTER_BLOCKS, 0.0, 1e-8);
        assert_eq!(words(&mut p, 200, 8, 1e-3), Heard::Present);
        assert_eq!(p.stretches(), (1, 1));
        // and headphones put on again still end it
        run(&mut p, NEW_STRETCH_AFTER_BLOCKS, 0.0, 1e-8);
        assert_eq!(words(&mut p, 100, 8, 1e-8), Heard::Absent);
    }

    #[test]
    fn a_device_change_judges_the_path_afresh() {
        let mut p = EchoPath::default();
        run(&mut p, 50, 0.0, 1e-8);
        assert_eq!(run(&mut p, 70, VOICE, 1e-8), Heard::Absent);
        p.rejudge();
        // no floor yet on the new device: it cancels meanwhile
        assert_eq!(run(&mut p, 10, VOICE, VOICE), Heard::Unknown);
        // the pauses between words are no floor: the echo's tail is in them
        run(&mut p, 5, 0.0, VOICE);
        assert_eq!(run(&mut p, 10, VOICE, VOICE), Heard::Unknown);
        run(&mut p, ECHO_DELAY_BLOCKS, 0.0, 0.0);
        assert_eq!(run(&mut p, 5, VOICE, VOICE), Heard::Present);
        assert_eq!(p.stretches(), (1, 1));
    }

    #[test]
    fn an_echo_path_that_appears_mid_stretch_is_seen_before_the_stretch_ends() {
        // issue 65: the capture moved to the loudspeaker's monitor half a
        // second into an answer judged without an echo path
        let mut p = EchoPath::default();
        run(&mut p, 50, 0.0, 1e-8);
        assert_eq!(words(&mut p, 80, 0, 1e-8), Heard::Absent);
        assert_eq!(p.appeared(), None);
        words(&mut p, 40, 2, VOICE);
        let since = p.appeared().expect("a voice heard at full level for 0.4 s");
        assert!((30..=40).contains(&since), "{since}");
        // the verdict itself is the stage's to change
        assert_eq!(p.block(VOICE, VOICE), Heard::Absent);
        // a person, not the voice: counted afresh
        p.not_appeared();
        assert_eq!(p.appeared(), None);
        // a word over the voice is not enough
        words(&mut p, 20, 2, VOICE);
        assert_eq!(p.appeared(), None);
        // and a new stretch starts counting from nothing
        p.rejudge();
        assert_eq!(p.appeared(), None);
    }

    #[test]
    fn a_microphone_at_its_floor_through_an_answer_sees_nothing_appear() {
        let mut p = EchoPath::default();
        run(&mut p, 50, 0.0, 1e-8);
        assert_eq!(words(&mut p, 600, 0, 1e-8), Heard::Absent);
        assert_eq!(p.appeared(), None);
        // an echo path present from the start is judged so, not "appeared"
        let mut q = EchoPath::default();
        run(&mut q, 50, 0.0, 1e-8);
        assert_eq!(words(&mut q, 600, 4, 1e-3), Heard::Present);
        assert_eq!(q.appeared(), None);
    }

    #[test]
    fn without_a_floor_nothing_is_judged() {
        let mut p = EchoPath::default();
        assert_eq!(run(&mut p, 100, VOICE, 0.0), Heard::Unknown);
    }
}
