//! Barge-in: the user speaking over the assistant's voice.
//!
//! Three parts of a pipeline that speaks share one [`BargeIn`]: the output
//! that plays the voice says which turn is playing
//! ([`BargeIn::set_playing`]); the endpointer, hearing speech over it,
//! asks for the voice to stop ([`BargeIn::request`]); the output stops it
//! and records what the user heard of the answer ([`BargeIn::interrupt`]).
//! From then on the runtime treats the turn as interrupted: its inputs
//! still queued are skipped, a call working on it reads cancelled from its
//! probe, and every stage hears of it before its next input
//! ([`Stage::interrupted`](crate::Stage::interrupted)) — the language model
//! keeps in its history only what was heard.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::message::UtteranceId;

#[derive(Debug, Default)]
struct State {
    playing: Option<UtteranceId>,
    /// The user's speech start and when it was detected, not yet served.
    request: Option<(Instant, Instant)>,
    /// Interrupted turns and what was heard of each, in order.
    interrupted: Vec<(UtteranceId, String)>,
}

/// The barge-in state a pipeline's endpointer, output and runtime share.
#[derive(Debug, Clone, Default)]
pub struct BargeIn {
    state: Arc<Mutex<State>>,
}

/// Interrupted turns remembered (older ones are forgotten; a stage hears of
/// each as it happens).
const KEEP: usize = 64;

impl BargeIn {
    /// Nothing playing, nothing interrupted.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The output plays turn `id`'s answer now (`None`: nothing plays).
    pub fn set_playing(&self, id: Option<UtteranceId>) {
        self.lock().playing = id;
    }

    /// The turn whose answer is playing, if any.
    #[must_use]
    pub fn playing(&self) -> Option<UtteranceId> {
        self.lock().playing
    }

    /// The endpointer heard the user start speaking at `speech_start`
    /// (detected at `detected`) while an answer plays: asks the output to
    /// stop. A no-op when nothing plays.
    pub fn request(&self, speech_start: Instant, detected: Instant) {
        let mut s = self.lock();
        if s.playing.is_some() && s.request.is_none() {
            s.request = Some((speech_start, detected));
        }
    }

    /// Takes the pending request, if any: `(speech start, detected)`.
    #[must_use]
    pub fn take_request(&self) -> Option<(Instant, Instant)> {
        self.lock().request.take()
    }

    /// The output stopped turn `id`'s answer; the user heard `heard` of it.
    pub fn interrupt(&self, id: UtteranceId, heard: String) {
        let mut s = self.lock();
        if s.playing == Some(id) {
            s.playing = None;
        }
        if !s.interrupted.iter().any(|(i, _)| *i == id) {
            s.interrupted.push((id, heard));
        }
        if s.interrupted.len() > KEEP {
            s.interrupted.remove(0);
        }
    }

    /// Whether turn `id` was interrupted.
    #[must_use]
    pub fn is_interrupted(&self, id: UtteranceId) -> bool {
        self.lock().interrupted.iter().any(|(i, _)| *i == id)
    }

    /// The interruptions after the first `seen` (a stage's cursor), and the
    /// new cursor.
    #[must_use]
    pub fn since(&self, seen: usize) -> (Vec<(UtteranceId, String)>, usize) {
        let s = self.lock();
        let total = s.interrupted.len();
        (s.interrupted[seen.min(total)..].to_vec(), total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_served_only_while_an_answer_plays_and_the_turn_stays_interrupted() {
        let b = BargeIn::new();
        let now = Instant::now();
        b.request(now, now);
        assert!(b.take_request().is_none(), "nothing plays: nothing to stop");
        b.set_playing(Some(3));
        b.request(now, now);
        b.request(now, Instant::now());
        assert_eq!(b.take_request(), Some((now, now)), "the first request wins");
        assert!(b.take_request().is_none());
        b.interrupt(3, "Paris is".into());
        assert_eq!(b.playing(), None);
        assert!(b.is_interrupted(3) && !b.is_interrupted(4));
        let (new, cursor) = b.since(0);
        assert_eq!((new, cursor), (vec![(3, "Paris is".to_string())], 1));
        assert!(b.since(cursor).0.is_empty());
        b.interrupt(3, "again".into());
        assert_eq!(b.since(0).1, 1, "once per turn");
    }
}
