//! Which answer the loudspeaker is on: when one ends, and an answer queued
//! behind another.

use std::collections::VecDeque;

/// How many completed turns are remembered: more than can be queued on
/// the device at once.
const REMEMBERED: usize = 16;

/// The answers given to the loudspeaker, for `voice_ended`.
///
/// An answer has ended when all of it was synthesised (its `VoiceDone`
/// came) and the device has nothing left to play. Completion is kept per
/// turn: a later turn that gives no audio (a noise turn's empty answer)
/// completes on its own without hiding the end of the one still playing.
///
/// An answer queued while another still plays (the user's next turn began
/// before the voice did, so nothing asked to stop it) waits behind it: it
/// becomes the one playing when its first sample sounds, and the one before
/// ends there.
#[derive(Debug, Default)]
pub(super) struct Answers {
    /// Turns whose voice is complete, latest last.
    complete: VecDeque<u64>,
    /// A turn queued behind the one playing.
    next: Option<u64>,
    /// A turn that was queued behind one stopped: its mark, reported when
    /// the device next plays, is no beginning.
    unheard: Option<u64>,
    /// The answer being stopped: from the moment the stop begins, none of
    /// its blocks is queued any more (the sink's next block would hold the
    /// device's feed the stop needs).
    halting: Option<u64>,
}

/// What the first sample of a turn's answer sounding means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sounded {
    /// The answer began, with nothing before it.
    Began,
    /// It waited behind another answer, which ended here.
    Followed,
    /// It was stopped before it sounded (queued behind an answer that
    /// was): nothing of it played.
    Unheard,
}

impl Answers {
    /// All of turn `id`'s voice has been synthesised.
    pub(super) fn done(&mut self, id: u64) {
        self.complete.push_back(id);
        while self.complete.len() > REMEMBERED {
            self.complete.pop_front();
        }
    }

    /// A block of turn `id` is queued while `playing` plays: whether `id` is
    /// now the answer playing (otherwise it waits behind `playing`).
    pub(super) fn queued(&mut self, id: u64, playing: Option<u64>) -> bool {
        if self.next == Some(id) {
            return false;
        }
        match playing {
            Some(p) if p != id => {
                self.next = Some(id);
                false
            }
            _ => true,
        }
    }

    /// Turn `id`'s first sample was reported played.
    pub(super) fn sounded(&mut self, id: u64) -> Sounded {
        if self.unheard == Some(id) {
            self.unheard = None;
            Sounded::Unheard
        } else if self.next == Some(id) {
            self.next = None;
            Sounded::Followed
        } else {
            Sounded::Began
        }
    }

    /// Whether `playing`'s answer has ended: complete, and nothing left on
    /// the device (`device_playing` false).
    pub(super) fn ended(&self, playing: u64, device_playing: bool) -> bool {
        !device_playing && self.next.is_none() && self.complete.contains(&playing)
    }

    /// Turn `id`'s answer, playing, is being stopped: nothing more of it is
    /// queued, and the one queued behind it, which never sounded, is stopped
    /// with it (returned).
    pub(super) fn halt(&mut self, id: u64) -> Option<u64> {
        self.halting = Some(id);
        let next = self.next.take();
        if next.is_some() {
            self.unheard = next;
        }
        next
    }

    /// Whether turn `id`'s answer is being stopped, or was stopped before
    /// it sounded: its blocks are not queued.
    pub(super) fn halted(&self, id: u64) -> bool {
        self.halting == Some(id) || self.unheard == Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_turn_with_no_audio_does_not_hide_the_end_of_the_one_playing() {
        let mut a = Answers::default();
        assert!(a.queued(27, None));
        a.done(27);
        // a noise turn: nothing to say, done at once
        a.done(28);
        assert!(!a.ended(27, true), "still on the device");
        assert!(a.ended(27, false));
    }

    #[test]
    fn an_answer_is_not_over_until_all_of_it_was_synthesised() {
        let mut a = Answers::default();
        assert!(a.queued(5, None));
        // a pause between chunks: the device ran dry
        assert!(!a.ended(5, false));
        a.done(5);
        assert!(a.ended(5, false));
    }

    #[test]
    fn an_answer_queued_behind_another_begins_when_it_sounds() {
        let mut a = Answers::default();
        assert!(a.queued(1, None));
        a.done(1);
        // turn 2's first block comes while turn 1 still plays
        assert!(!a.queued(2, Some(1)));
        assert!(!a.queued(2, Some(1)), "its next blocks wait too");
        // turn 1's audio is done but turn 2's is on the device: turn 1
        // ends where turn 2 begins, not when the device goes quiet
        assert!(!a.ended(1, false));
        assert_eq!(a.sounded(3), Sounded::Began);
        assert_eq!(a.sounded(2), Sounded::Followed);
        assert!(a.queued(2, Some(2)));
        a.done(2);
        assert!(a.ended(2, false));
    }

    #[test]
    fn an_answer_queued_behind_one_that_is_stopped_is_stopped_with_it() {
        let mut a = Answers::default();
        assert!(a.queued(1, None));
        assert!(!a.queued(2, Some(1)));
        assert_eq!(a.halt(1), Some(2));
        assert!(a.halted(1) && a.halted(2), "no more blocks of either");
        assert_eq!(a.halt(1), None);
        // its mark, reported late, is not a turn beginning
        assert_eq!(a.sounded(2), Sounded::Unheard);
        assert_eq!(a.sounded(3), Sounded::Began);
        assert!(!a.halted(3));
    }

    #[test]
    fn completion_is_remembered_for_a_bounded_number_of_turns() {
        let mut a = Answers::default();
        for id in 0..100 {
            a.done(id);
        }
        assert!(a.complete.len() <= REMEMBERED);
        assert!(a.ended(99, false));
        assert!(!a.ended(0, false));
    }
}
