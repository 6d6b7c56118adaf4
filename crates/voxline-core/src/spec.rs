//! Speculative turns: work started before the end of a turn is certain,
//! held from the user until it is committed, and discarded if cancelled.
//!
//! The endpointer sends an utterance downstream as soon as it has seen a
//! short silence, under a fresh utterance id it registers as *pending* on a
//! [`SpecBoard`]. If the hangover then confirms the end of the turn it
//! *commits* the id; if speech resumes first it *cancels* it (and a later
//! attempt goes out under a new id). Downstream stages consult the board:
//! the recogniser aborts a cancelled attempt, the language model stops at
//! its next step and rolls its context back.
//!
//! A turn the endpointer ends early (the semantic end of turn judged its
//! sentence complete) may be *released* rather than committed: it is shown
//! and answered as a committed one, but stays revocable for a moment. If
//! the speaker goes on within it, the endpointer cancels the id and posts
//! [`PipelineEvent::Merged`]; the stages roll back what they did for it, as
//! for a cancelled attempt, and the turn's audio starts the next one.
//! Otherwise it commits the id once the moment has passed.
//!
//! The board also keeps what was heard in each attempt it knows (the
//! recogniser's transcript, noted by the runtime as it is emitted, see
//! [`SpecBoard::words`]), so the endpointer can take a second opinion from
//! the words while it waits on a pause.
//!
//! Nothing of a pending attempt reaches the user: a [`SpecGate`] in front of
//! every sink holds the attempt's events until its
//! [`PipelineEvent::Commit`] passes (then releases them in order) or its
//! [`PipelineEvent::SpecCancel`] does (then drops them, and everything the
//! attempt still produces afterwards).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::event::{PipelineEvent, TimedEvent};
use crate::message::UtteranceId;

/// Where a speculative attempt stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecState {
    /// Not a speculative attempt: an ordinary, final utterance.
    Final,
    /// Sent early; the turn's end is not confirmed yet.
    Pending,
    /// Shown and answered as committed, but the speaker may still go on
    /// (then it is cancelled, and merged into the next turn).
    Released,
    /// The end of the turn was confirmed: the work is used.
    Committed,
    /// Speech resumed: the work is thrown away.
    Cancelled,
}

/// How many resolved attempts the board remembers (older ones read as
/// [`SpecState::Final`]; a stage never asks about one that old).
const REMEMBERED: usize = 1024;

#[derive(Debug, Default)]
struct Board {
    states: HashMap<UtteranceId, SpecState>,
    /// When work on each attempt started (the first stage's call), on
    /// which thread, and that thread's wait for a CPU until then.
    started: HashMap<UtteranceId, Started>,
    /// The transcript of each attempt the board knows, once there is one,
    /// and how long after work on it started it came.
    words: HashMap<UtteranceId, (String, Duration)>,
    /// Attempts the recogniser is done with, words or not.
    done: std::collections::HashSet<UtteranceId>,
    /// A stage downstream is gone: no words are waited for any more.
    waits_ended: bool,
    /// The attempt whose words a stage is waiting for, if one is.
    awaited: Option<UtteranceId>,
    order: VecDeque<UtteranceId>,
}

#[derive(Debug, Default)]
struct Shared {
    board: Mutex<Board>,
    /// Signalled on every change, for [`SpecBoard::wait_words`].
    changed: Condvar,
}

/// The shared record of speculative attempts, written by the endpointer and
/// read by the stages downstream. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct SpecBoard(Arc<Shared>);

impl SpecBoard {
    /// An empty board.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Board> {
        crate::sync::lock(&self.0.board)
    }

    fn set(&self, id: UtteranceId, state: SpecState) {
        let mut b = self.lock();
        if b.states.insert(id, state).is_none() {
            b.order.push_back(id);
            while b.order.len() > REMEMBERED {
                if let Some(old) = b.order.pop_front() {
                    b.states.remove(&old);
                    b.started.remove(&old);
                    b.words.remove(&old);
                    b.done.remove(&old);
                }
            }
        }
        drop(b);
        self.0.changed.notify_all();
    }

    /// Registers `id` as a pending attempt (before it is sent downstream).
    pub fn start(&self, id: UtteranceId) {
        self.set(id, SpecState::Pending);
    }

    /// Confirms attempt `id`.
    pub fn commit(&self, id: UtteranceId) {
        self.set(id, SpecState::Committed);
    }

    /// Releases attempt `id`: committed for everything downstream (a
    /// [`PipelineEvent::Commit`] shows it), while the stages keep what
    /// would undo it until [`SpecBoard::commit`] or [`SpecBoard::cancel`].
    pub fn release(&self, id: UtteranceId) {
        self.set(id, SpecState::Released);
    }

    /// Holds released attempt `id` again, as a pending one: the stages that
    /// take committed input only (the voice) wait for
    /// [`SpecBoard::commit`], [`SpecBoard::release`] or
    /// [`SpecBoard::cancel`] before they take what it produces. Nothing for
    /// an attempt that is not released.
    pub fn hold(&self, id: UtteranceId) {
        let mut b = self.lock();
        if let Some(s @ SpecState::Released) = b.states.get_mut(&id) {
            *s = SpecState::Pending;
        }
        drop(b);
        self.0.changed.notify_all();
    }

    /// Cancels attempt `id`.
    pub fn cancel(&self, id: UtteranceId) {
        self.set(id, SpecState::Cancelled);
    }

    /// The state of `id` ([`SpecState::Final`] for an ordinary utterance).
    #[must_use]
    pub fn state(&self, id: UtteranceId) -> SpecState {
        self.lock()
            .states
            .get(&id)
            .copied()
            .unwrap_or(SpecState::Final)
    }

    /// Notes what was heard in attempt `id` (its transcript); nothing for
    /// an id the board does not know (an ordinary utterance). The runtime
    /// notes every transcript a stage emits for an attempt.
    pub fn note_words(&self, id: UtteranceId, text: &str) {
        let mut b = self.lock();
        if b.states.contains_key(&id) {
            let took = b.started.get(&id).map_or(Duration::ZERO, Started::took);
            b.words.insert(id, (text.to_owned(), took));
            drop(b);
            self.0.changed.notify_all();
        }
    }

    /// Notes that a stage starts its call on attempt `id` (the runtime
    /// notes it before every call; the first one counts): the words' time
    /// is counted from here.
    pub fn note_working(&self, id: UtteranceId) {
        let mut b = self.lock();
        if b.states.contains_key(&id) {
            b.started.entry(id).or_insert_with(Started::now);
        }
    }

    /// Notes that the recogniser is done with attempt `id`, whether or not
    /// it heard words in it (it failed, or found nothing to say): nobody
    /// waits for its words any more. The runtime notes it for every
    /// attempt a stage took.
    pub fn note_done(&self, id: UtteranceId) {
        let mut b = self.lock();
        if b.states.contains_key(&id) && b.done.insert(id) {
            drop(b);
            self.0.changed.notify_all();
        }
    }

    /// Ends every wait for words, now and later ([`SpecBoard::wait_words`]
    /// returns at once): a stage that would hear them is gone. The runtime
    /// calls it when a stage thread ends.
    pub fn end_waits(&self) {
        self.lock().waits_ended = true;
        self.0.changed.notify_all();
    }

    /// What was heard in attempt `id`, once its transcript exists.
    #[must_use]
    pub fn words(&self, id: UtteranceId) -> Option<String> {
        self.lock().words.get(&id).map(|(w, _)| w.clone())
    }

    /// Waits up to `limit` for the words of attempt `id`: its transcript,
    /// and how long the recogniser's call took to hear it (from
    /// [`SpecBoard::note_working`]), or `None` once the attempt is
    /// cancelled, its recogniser is done with no words, a stage is gone
    /// ([`SpecBoard::end_waits`]), the board does not know it, or `limit`
    /// has passed.
    ///
    /// A replay faster than real time uses it to place the words where
    /// they would have come in real time: its audio runs ahead of the
    /// recogniser, so the words would otherwise always come too late.
    #[must_use]
    pub fn wait_words(&self, id: UtteranceId, limit: Duration) -> Option<(String, Duration)> {
        let until = Instant::now() + limit;
        let mut b = self.lock();
        loop {
            if let Some(w) = b.words.get(&id) {
                let w = w.clone();
                b.awaited = None;
                return Some(w);
            }
            let over = matches!(
                b.states.get(&id),
                None | Some(SpecState::Cancelled | SpecState::Final)
            ) || b.done.contains(&id)
                || b.waits_ended;
            let left = until.saturating_duration_since(Instant::now());
            if over || left.is_zero() {
                b.awaited = None;
                return None;
            }
            b.awaited = Some(id);
            b = self
                .0
                .changed
                .wait_timeout(b, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The attempt whose words a stage is blocked waiting for
    /// ([`SpecBoard::wait_words`]), if one is: a harness that plays the
    /// recogniser in stream time delivers them then, as the stream cannot
    /// move on until it does.
    #[must_use]
    pub fn awaited(&self) -> Option<UtteranceId> {
        self.lock().awaited
    }

    /// Whether `id` was cancelled (its work should stop now).
    #[must_use]
    pub fn is_cancelled(&self, id: UtteranceId) -> bool {
        self.state(id) == SpecState::Cancelled
    }
}

/// Holds the events of pending attempts until they are committed or
/// cancelled; everything else passes straight through, in order.
///
/// Feed it every event in bus order with [`SpecGate::push`]; it returns what
/// may be shown now. A released [`PipelineEvent::Utterance`] carries the
/// commit position as its `closed_sample` (when the turn's end was
/// confirmed), not the earlier point the attempt was sent at.
#[derive(Debug, Default)]
pub struct SpecGate {
    held: HashMap<UtteranceId, Vec<TimedEvent>>,
    cancelled: std::collections::HashSet<UtteranceId>,
    /// `cancelled` in order, so only the last [`REMEMBERED`] are kept: a
    /// session of weeks cancels attempts without end, and an attempt's late
    /// events follow its cancel closely.
    cancelled_order: VecDeque<UtteranceId>,
}

impl SpecGate {
    /// An empty gate.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one event; returns the events that may be shown now.
    pub fn push(&mut self, ev: TimedEvent) -> Vec<TimedEvent> {
        match &ev.event {
            PipelineEvent::SpecStart { id, .. } => {
                self.held.insert(*id, Vec::new());
                vec![ev]
            }
            PipelineEvent::SpecCancel { id, .. } => {
                self.drop_id(*id);
                vec![ev]
            }
            PipelineEvent::Merged { id, .. } => {
                self.drop_id(*id);
                vec![ev]
            }
            PipelineEvent::Commit { id, sample, .. } => {
                let (id, sample) = (*id, *sample);
                let mut out = vec![ev];
                for mut held in self.held.remove(&id).unwrap_or_default() {
                    if let PipelineEvent::Utterance(u) = &mut held.event {
                        u.closed_sample = u.closed_sample.max(sample);
                    }
                    out.push(held);
                }
                out
            }
            other => match other.utterance_id() {
                Some(id) if self.cancelled.contains(&id) => Vec::new(),
                Some(id) if self.held.contains_key(&id) => {
                    if let Some(h) = self.held.get_mut(&id) {
                        h.push(ev);
                    }
                    Vec::new()
                }
                _ => vec![ev],
            },
        }
    }

    /// Drops what `id` holds and everything it produces from now on.
    fn drop_id(&mut self, id: UtteranceId) {
        self.held.remove(&id);
        if self.cancelled.insert(id) {
            self.cancelled_order.push_back(id);
            while self.cancelled_order.len() > REMEMBERED {
                if let Some(old) = self.cancelled_order.pop_front() {
                    self.cancelled.remove(&old);
                }
            }
        }
    }

    /// Attempts still waiting for a decision.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.held.len()
    }
}

/// Where a call on an attempt started: when, on which thread, and how
/// long that thread had waited, runnable, for a CPU.
#[derive(Debug, Clone, Copy)]
struct Started {
    at: Instant,
    thread: std::thread::ThreadId,
    queued: Option<Duration>,
}

impl Started {
    fn now() -> Self {
        Self {
            at: Instant::now(),
            thread: std::thread::current().id(),
            queued: run_queue_wait(),
        }
    }

    /// How long the call took to hear its words, less the time its thread
    /// waited for a CPU other processes held (noted on the same thread):
    /// what it would have taken on this machine with nothing else running,
    /// so a loaded machine does not move where a fast replay counts them.
    fn took(&self) -> Duration {
        let wall = self.at.elapsed();
        if std::thread::current().id() != self.thread {
            return wall;
        }
        match (self.queued, run_queue_wait()) {
            (Some(then), Some(now)) => wall.saturating_sub(now.saturating_sub(then)),
            _ => wall,
        }
    }
}

/// How long the calling thread has waited, runnable, for a CPU (Linux's
/// schedstat), where the system says.
fn run_queue_wait() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EngineEvent;
    use crate::message::TurnError;
    use std::time::Instant;

    #[test]
    fn a_call_that_sleeps_took_its_whole_wait() {
        // a remote recogniser's call waits on the network, asleep: none of
        // that is a wait for a CPU, so all of it counts
        let b = SpecBoard::new();
        b.start(1);
        b.note_working(1);
        std::thread::sleep(Duration::from_millis(60));
        b.note_words(1, "Hello.");
        let (_, took) = b.wait_words(1, Duration::ZERO).unwrap();
        assert!(took >= Duration::from_millis(55), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    /// An engine's event, as the language model's tokens are.
    #[derive(Debug, Clone, PartialEq)]
    struct Token {
        id: UtteranceId,
        index: u32,
    }

    impl EngineEvent for Token {
        fn kind(&self) -> &'static str {
            "token"
        }
        fn utterance_id(&self) -> Option<UtteranceId> {
            Some(self.id)
        }
        fn fields_json(&self, _: &crate::Clock) -> Result<String, serde_json::Error> {
            Ok(format!("{{\"index\":{}}}", self.index))
        }
    }

    fn ev(event: PipelineEvent) -> TimedEvent {
        TimedEvent {
            at: Instant::now(),
            event,
        }
    }

    fn token(id: u64, index: u32) -> TimedEvent {
        ev(PipelineEvent::engine_event(Token { id, index }))
    }

    fn kinds(evs: &[TimedEvent]) -> Vec<(&'static str, Option<u64>)> {
        evs.iter()
            .map(|e| (e.event.kind(), e.event.utterance_id()))
            .collect()
    }

    #[test]
    fn the_board_tracks_attempts_and_forgets_old_ones() {
        let b = SpecBoard::new();
        assert_eq!(b.state(1), SpecState::Final);
        b.start(1);
        assert_eq!(b.state(1), SpecState::Pending);
        b.cancel(1);
        assert!(b.is_cancelled(1));
        b.start(2);
        b.commit(2);
        assert_eq!(b.state(2), SpecState::Committed);
        for id in 10..(10 + REMEMBERED as u64) {
            b.start(id);
        }
        assert_eq!(b.state(1), SpecState::Final, "bounded memory");
    }

    #[test]
    fn the_board_keeps_the_words_of_attempts_only_and_forgets_them_with_the_attempt() {
        let b = SpecBoard::new();
        b.note_words(1, "an ordinary utterance");
        assert_eq!(b.words(1), None, "not an attempt: not kept");
        b.start(2);
        assert_eq!(b.words(2), None, "not transcribed yet");
        b.note_words(2, "What is the capital of France?");
        assert_eq!(
            b.words(2).as_deref(),
            Some("What is the capital of France?")
        );
        b.release(2);
        assert!(b.words(2).is_some(), "kept across its states");
        for id in 10..(10 + REMEMBERED as u64) {
            b.start(id);
        }
        assert_eq!(b.words(2), None, "forgotten with the attempt");
    }

    #[test]
    fn pending_events_are_held_until_commit_and_dropped_on_cancel() {
        let mut g = SpecGate::new();
        assert_eq!(g.push(token(7, 0)).len(), 1, "ordinary turns pass");
        let out = g.push(ev(PipelineEvent::SpecStart { id: 1, sample: 100 }));
        assert_eq!(kinds(&out), [("spec_start", Some(1))]);
        assert!(g.push(token(1, 0)).is_empty());
        assert!(g.push(token(1, 1)).is_empty());
        assert_eq!(g.pending(), 1);
        let out = g.push(ev(PipelineEvent::SpecCancel { id: 1, sample: 200 }));
        assert_eq!(kinds(&out), [("spec_cancel", Some(1))]);
        // late work of the cancelled attempt never shows
        assert!(g.push(token(1, 2)).is_empty());
        assert!(g
            .push(ev(PipelineEvent::TurnError(TurnError {
                id: 1,
                stage: "stt".into(),
                message: "aborted".into()
            })))
            .is_empty());
        g.push(ev(PipelineEvent::SpecStart { id: 2, sample: 300 }));
        assert!(g.push(token(2, 0)).is_empty());
        let out = g.push(ev(PipelineEvent::Commit {
            id: 2,
            spec_sample: 300,
            sample: 400,
        }));
        assert_eq!(kinds(&out), [("commit", Some(2)), ("token", Some(2))]);
        // after the commit the attempt's events flow
        assert_eq!(g.push(token(2, 1)).len(), 1);
        assert_eq!(g.pending(), 0);
    }

    #[test]
    fn a_merged_turn_shows_until_it_is_taken_back_then_nothing_more() {
        let mut g = SpecGate::new();
        g.push(ev(PipelineEvent::SpecStart { id: 3, sample: 100 }));
        assert!(g.push(token(3, 0)).is_empty());
        let out = g.push(ev(PipelineEvent::Commit {
            id: 3,
            spec_sample: 100,
            sample: 150,
        }));
        assert_eq!(kinds(&out), [("commit", Some(3)), ("token", Some(3))]);
        assert_eq!(g.push(token(3, 1)).len(), 1, "a released turn flows");
        let out = g.push(ev(PipelineEvent::Merged { id: 3, sample: 180 }));
        assert_eq!(kinds(&out), [("turn_merged", Some(3))]);
        assert!(
            g.push(token(3, 2)).is_empty(),
            "the rest of its answer is dropped"
        );
        let b = SpecBoard::new();
        b.start(3);
        b.release(3);
        assert_eq!(b.state(3), SpecState::Released);
        assert!(!b.is_cancelled(3));
        b.cancel(3);
        assert!(b.is_cancelled(3));
    }

    #[test]
    fn a_released_turn_held_again_is_pending_until_decided() {
        let b = SpecBoard::new();
        b.start(4);
        b.hold(4);
        assert_eq!(b.state(4), SpecState::Pending, "not released: unchanged");
        b.release(4);
        b.hold(4);
        assert_eq!(b.state(4), SpecState::Pending);
        b.commit(4);
        assert_eq!(b.state(4), SpecState::Committed);
        b.hold(4);
        assert_eq!(b.state(4), SpecState::Committed, "a final turn stays final");
    }
}
