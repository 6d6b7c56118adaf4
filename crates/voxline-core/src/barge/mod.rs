//! Barge-in: the user speaking over the assistant's voice.
//!
//! Three parts of a pipeline that speaks share one [`BargeIn`]: the output
//! that plays the voice says which turn is playing
//! ([`BargeIn::set_playing`]); the endpointer, hearing speech over it, asks
//! the output to pause ([`BargeIn::request`]); the output pauses it at once
//! ([`BargeIn::hold`]) and the words heard over the answer decide:
//!
//! - a backchannel ("uh-huh", "okay", a cough, fewer than two words that
//!   are not a command, see [`backchannel`]) resumes the answer where it
//!   paused, and is not a turn: a *false interruption*;
//! - anything else, or speech that goes on past the length of a
//!   backchannel ([`BargeIn::confirm`]), stops it: the output drops what is
//!   queued and records what the user heard of the answer
//!   ([`BargeIn::interrupt`]).
//!
//! The verdict reaches the hold without any stage's help: the endpointer
//! names the utterances it sends while the answer is held
//! ([`BargeIn::heard_over`]), and the runtime hands what the recogniser's
//! stage judged each of them ([`Heard`]) to [`BargeIn::heard`] as it is
//! emitted.
//!
//! **Echo.** With a loudspeaker the microphone hears the assistant's own
//! voice. The output tells the state what it says ([`BargeIn::said`]) and
//! when it sounds ([`BargeIn::sounding`]); an utterance heard while it
//! sounded (or in its echo tail) whose words are the assistant's own recent
//! words ([`BargeIn::is_echo`]) is echo, not the user: the recogniser marks
//! it as no turn, so nothing answers it and no loop of the assistant
//! answering itself can start.
//!
//! From an interruption on the runtime treats the turn as interrupted: its
//! inputs still queued are skipped, a call working on it reads cancelled
//! from its probe, and every stage hears of it before its next input
//! ([`Stage::interrupted`](crate::Stage::interrupted)) — the language model
//! keeps in its history only what was heard.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::message::{Heard, UtteranceId};

mod echo;
pub use echo::{
    level_correlation, ECHO_ANNOTATION, ECHO_MAX_LAG, ECHO_MEMORY, ECHO_MIN_LIKENESS,
    ECHO_MIN_SHARE, ECHO_TAIL, ECHO_TAKEN_DB,
};

/// What the endpointer asks of the voice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Pause it until the words heard over it decide.
    Hold,
    /// Stop it now.
    Stop,
}

/// The endpointer's request: the user's speech began at `speech_start`
/// and was sure at `detected`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// When the user's speech began.
    pub speech_start: Instant,
    /// When the endpointer was sure of it.
    pub detected: Instant,
    /// What it asks.
    pub ask: Ask,
}

/// An answer paused while the words heard over it are awaited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The turn whose answer is paused.
    pub turn: UtteranceId,
    /// The request that paused it.
    pub request: Request,
    /// When the device fell silent.
    pub stopped: Instant,
    /// When it was paused.
    pub since: Instant,
}

/// How a hold ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A backchannel, or nothing that became words: play on. The words
    /// heard (`None`: none came).
    Resume(Hold, Option<String>),
    /// A real interruption: stop the answer.
    Stop(Hold),
}

/// How long a hold waits for words when the endpointer sent nothing to
/// the recogniser (the sound was too short to be kept): then it resumes.
pub const HOLD_WITHOUT_SPEECH: Duration = Duration::from_millis(2_500);

/// How long a hold waits for the words of what the endpointer sent: then
/// it resumes, with a warning (a recogniser this slow is a fault).
pub const HOLD_FOR_WORDS: Duration = Duration::from_secs(8);

#[derive(Debug, Default)]
struct State {
    playing: Option<UtteranceId>,
    /// The turns whose answers began to play lately, newest last.
    voiced: std::collections::VecDeque<UtteranceId>,
    /// The endpointer's request, not yet served.
    request: Option<Request>,
    /// The answer paused, if one is.
    hold: Option<Hold>,
    /// The utterances heard over the held answer (or over the answer a
    /// request not yet served will hold).
    over: Vec<UtteranceId>,
    /// How the hold ended, for the output to act on.
    verdict: Option<Verdict>,
    /// Interrupted turns and what was heard of each, in order.
    interrupted: Vec<(UtteranceId, String)>,
    /// What the voice said lately, and when it was queued.
    said: std::collections::VecDeque<(Instant, String)>,
    /// When the voice sounded lately: (from, to), newest last.
    sounded: std::collections::VecDeque<(Instant, Instant)>,
    /// How loud the voice was at the device lately, buffer by buffer:
    /// (from, to, mean square), oldest first.
    played: std::collections::VecDeque<(Instant, Instant, f32)>,
    /// How loud the microphone was before an echo canceller took the
    /// voice out of it, block by block: (captured, mean square), oldest
    /// first. The echo guard compares these with the voice, where they
    /// cover what it is asked about: the canceller leaves too little of
    /// the echo to follow the voice's level.
    heard_raw: std::collections::VecDeque<(Instant, f32)>,
    /// Whether an echo canceller takes the voice out of the microphone:
    /// its last figure, over a second the voice sounded in, showed it
    /// converged ([`BargeIn::echo_cancelled`]).
    cancelled: bool,
}

/// The barge-in state a pipeline's endpointer, output and runtime share.
#[derive(Debug, Clone)]
pub struct BargeIn {
    state: Arc<Mutex<State>>,
    /// Signalled when there is a request or a verdict for the output
    /// ([`BargeIn::changes`]).
    changed: (
        crossbeam_channel::Sender<()>,
        crossbeam_channel::Receiver<()>,
    ),
}

impl Default for BargeIn {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            changed: crossbeam_channel::bounded(1),
        }
    }
}

/// Interrupted turns remembered (older ones are forgotten; a stage hears of
/// each as it happens).
const KEEP: usize = 64;

/// Words that end an answer however few they are.
const COMMANDS: &[&str] = &[
    "stop",
    "wait",
    "no",
    "nope",
    "pause",
    "quiet",
    "enough",
    "cancel",
    "hold",
    "hang",
    "shush",
    "silence",
    "hey",
    "actually",
    "but",
    "what",
    "why",
    "how",
    "who",
    "where",
    "when",
    "which",
    "repeat",
    "again",
    "louder",
    "slower",
    "sorry",
    "pardon",
    "help",
    "listen",
    "excuse",
    "shut",
    "halt",
    "quit",
    "never",
    "nevermind",
];

/// Words of agreement, attention and hesitation: a listener's, not a turn.
const LISTENING: &[&str] = &[
    "uh",
    "huh",
    "uhhuh",
    "mm",
    "mmm",
    "hm",
    "hmm",
    "mhm",
    "mmhmm",
    "hmhm",
    "um",
    "umm",
    "ah",
    "ahh",
    "oh",
    "ooh",
    "aha",
    "yeah",
    "yea",
    "yes",
    "yep",
    "yup",
    "ok",
    "okay",
    "kay",
    "right",
    "alright",
    "all",
    "sure",
    "i",
    "see",
    "got",
    "it",
    "gotcha",
    "cool",
    "nice",
    "great",
    "good",
    "fine",
    "wow",
    "true",
    "exactly",
    "indeed",
    "interesting",
    "really",
    "thanks",
    "thank",
    "you",
    "understood",
    "totally",
    "definitely",
    "absolutely",
    "perfect",
    "awesome",
    "go",
    "on",
];

/// The words of `text`, lower case, punctuation and hyphens out
/// ("Uh-huh." → `uhhuh`).
fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '-'))
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .map(|w| w.chars().filter(|c| c.is_alphanumeric()).collect())
        .collect()
}

/// Whether `text`, heard over the assistant's answer, is a listener's
/// backchannel rather than a turn: no words at all (a cough, a sound
/// whisper annotates), fewer than two words, or only words of agreement
/// and attention ("uh-huh", "mm-hmm", "okay", "yeah, I see", "go on") —
/// unless one of them asks the assistant to stop, for help, or is a
/// question word ("stop", "wait", "no", "help!", "what?"), or the one word
/// is asked ("Paris?") rather than agreed ("Really?" stays a listener's).
#[must_use]
pub fn backchannel(text: &str) -> bool {
    if crate::message::non_speech(text) {
        return true;
    }
    // "uh-huh", "mm-hmm": one word
    let words = words(text);
    if words.iter().any(|w| COMMANDS.contains(&w.as_str())) {
        return false;
    }
    let listening = words.iter().all(|w| LISTENING.contains(&w.as_str()));
    let asked = text.trim_end().ends_with('?');
    listening || (words.len() < 2 && !asked)
}

impl BargeIn {
    /// Nothing playing, nothing interrupted.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Receives a signal whenever there is something new for the output
    /// to take ([`take_request`](Self::take_request),
    /// [`take_verdict`](Self::take_verdict)): the output's thread sleeps
    /// on it, with [`hold_ends`](Self::hold_ends) as its timer, instead of
    /// polling. Signals do not queue up: one wakes for all before it.
    #[must_use]
    pub fn changes(&self) -> crossbeam_channel::Receiver<()> {
        self.changed.1.clone()
    }

    fn signal(&self) {
        let _ = self.changed.0.try_send(());
    }

    /// When the hold, if there is one, resumes without words (see
    /// [`take_verdict`](Self::take_verdict)).
    #[must_use]
    pub fn hold_ends(&self) -> Option<Instant> {
        let s = self.lock();
        let limit = if s.over.is_empty() {
            HOLD_WITHOUT_SPEECH
        } else {
            HOLD_FOR_WORDS
        };
        s.hold.as_ref().map(|h| h.since + limit)
    }

    /// The output plays turn `id`'s answer now (`None`: nothing plays).
    pub fn set_playing(&self, id: Option<UtteranceId>) {
        let mut s = self.lock();
        s.playing = id;
        if let Some(id) = id.filter(|id| !s.voiced.contains(id)) {
            s.voiced.push_back(id);
            while s.voiced.len() > KEEP {
                s.voiced.pop_front();
            }
        }
    }

    /// Whether turn `id`'s answer has begun to play (playing now, or
    /// played lately): the user has heard it, so the endpointer no longer
    /// takes the turn back when the speaker goes on.
    #[must_use]
    pub fn has_played(&self, id: UtteranceId) -> bool {
        self.lock().voiced.contains(&id)
    }

    /// The turn whose answer is playing, if any.
    #[must_use]
    pub fn playing(&self) -> Option<UtteranceId> {
        self.lock().playing
    }

    /// The endpointer heard the user start speaking at `speech_start`
    /// (detected at `detected`) while an answer plays: asks the output to
    /// pause it until the words decide. A no-op when nothing plays or an
    /// answer is already held.
    pub fn request(&self, speech_start: Instant, detected: Instant) {
        let mut s = self.lock();
        if s.playing.is_some() && s.request.is_none() && s.hold.is_none() {
            s.request = Some(Request {
                speech_start,
                detected,
                ask: Ask::Hold,
            });
            s.over.clear();
            drop(s);
            self.signal();
        }
    }

    /// The speech over the answer is no backchannel (it went on too long):
    /// a held answer stops, a pause not yet served becomes a stop, and an
    /// answer playing again after a false interruption is stopped, from
    /// `speech_start`.
    pub fn confirm(&self, speech_start: Instant, detected: Instant) {
        let mut s = self.lock();
        if let Some(h) = s.hold.take() {
            s.verdict = Some(Verdict::Stop(h));
        } else if let Some(r) = s.request.as_mut() {
            r.ask = Ask::Stop;
        } else if s.playing.is_some() && s.verdict.is_none() {
            s.request = Some(Request {
                speech_start,
                detected,
                ask: Ask::Stop,
            });
        } else {
            return;
        }
        drop(s);
        self.signal();
    }

    /// Takes the pending request, if any.
    #[must_use]
    pub fn take_request(&self) -> Option<Request> {
        self.lock().request.take()
    }

    /// The output paused turn `turn`'s answer for `request`; the device is
    /// silent from `stopped`.
    pub fn hold(&self, turn: UtteranceId, request: Request, stopped: Instant) {
        self.lock().hold = Some(Hold {
            turn,
            request,
            stopped,
            since: Instant::now(),
        });
    }

    /// Whether an answer is held, or about to be, for the words heard over
    /// it.
    #[must_use]
    pub fn holding(&self) -> bool {
        let s = self.lock();
        s.hold.is_some() || s.request.is_some_and(|r| r.ask == Ask::Hold)
    }

    /// The endpointer sends utterance `id` while an answer is held (or
    /// about to be): its words decide the hold.
    pub fn heard_over(&self, id: UtteranceId) {
        let mut s = self.lock();
        if s.hold.is_some() || s.request.is_some_and(|r| r.ask == Ask::Hold) {
            s.over.push(id);
        }
    }

    /// Whether utterance `id` was heard over a held answer that its words
    /// have not yet decided (the recogniser then marks a backchannel as no
    /// turn, see [`backchannel`]).
    #[must_use]
    pub fn is_over_held(&self, id: UtteranceId) -> bool {
        let s = self.lock();
        s.verdict.is_none() && s.over.contains(&id)
    }

    /// The recogniser's stage judged utterance `id` ([`Heard`], its text
    /// `text`): if it was heard over the held answer, that decides. Words
    /// stop the answer; anything else (a backchannel, the voice's own echo,
    /// a sound) lets it play on. The runtime calls this for every
    /// transcript a stage emits; nothing is judged again here.
    pub fn heard(&self, id: UtteranceId, heard: &Heard, text: &str) {
        let mut s = self.lock();
        if !s.over.contains(&id) {
            return;
        }
        if let Some(h) = s.hold.take() {
            s.verdict = Some(if heard.is_words() {
                Verdict::Stop(h)
            } else {
                Verdict::Resume(h, Some(text.to_owned()))
            });
        } else if let Some(r) = s.request.as_mut().filter(|_| heard.is_words()) {
            r.ask = Ask::Stop;
        } else {
            return;
        }
        drop(s);
        self.signal();
    }

    /// How the hold ended, once it has: the output resumes or stops the
    /// answer. A hold no words came for resumes after
    /// [`HOLD_WITHOUT_SPEECH`] (nothing was sent to the recogniser) or
    /// [`HOLD_FOR_WORDS`].
    #[must_use]
    pub fn take_verdict(&self) -> Option<Verdict> {
        let mut s = self.lock();
        if let Some(v) = s.verdict.take() {
            return Some(v);
        }
        let limit = if s.over.is_empty() {
            HOLD_WITHOUT_SPEECH
        } else {
            HOLD_FOR_WORDS
        };
        if s.hold.as_ref().is_some_and(|h| h.since.elapsed() >= limit) {
            return s.hold.take().map(|h| Verdict::Resume(h, None));
        }
        None
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
        let r = b.take_request().unwrap();
        assert_eq!((r.speech_start, r.detected, r.ask), (now, now, Ask::Hold));
        assert!(b.take_request().is_none());
        b.interrupt(3, "Paris is".into());
        assert_eq!(b.playing(), None);
        assert!(
            b.has_played(3) && !b.has_played(4),
            "a turn whose answer began to play is remembered as played after it stops"
        );
        assert!(b.is_interrupted(3) && !b.is_interrupted(4));
        let (new, cursor) = b.since(0);
        assert_eq!((new, cursor), (vec![(3, "Paris is".to_string())], 1));
        assert!(b.since(cursor).0.is_empty());
        b.interrupt(3, "again".into());
        assert_eq!(b.since(0).1, 1, "once per turn");
    }

    /// The output's side of a hold: request, pause, and a verdict.
    fn held(b: &BargeIn, over: UtteranceId) -> Request {
        let now = Instant::now();
        b.set_playing(Some(1));
        b.request(now, now);
        b.heard_over(over);
        let r = b.take_request().unwrap();
        b.hold(1, r, now);
        r
    }

    #[test]
    fn the_words_heard_over_a_held_answer_resume_or_stop_it() {
        let b = BargeIn::new();
        let r = held(&b, 7);
        assert!(b.holding() && b.is_over_held(7) && !b.is_over_held(8));
        b.heard(8, &Heard::Words, "Tell me about Mars instead.");
        assert!(b.take_verdict().is_none(), "not the words heard over it");
        b.heard(7, &Heard::Backchannel, "Uh-huh.");
        match b.take_verdict() {
            Some(Verdict::Resume(h, Some(w))) => {
                assert_eq!((h.turn, h.request, w.as_str()), (1, r, "Uh-huh."))
            }
            other => panic!("{other:?}"),
        }
        assert!(!b.holding() && b.take_verdict().is_none());

        let b = BargeIn::new();
        held(&b, 7);
        b.heard(7, &Heard::Words, "Tell me about Mars instead.");
        assert!(matches!(b.take_verdict(), Some(Verdict::Stop(h)) if h.turn == 1));

        // long speech stops it before any words
        let b = BargeIn::new();
        held(&b, 7);
        let now = Instant::now();
        b.confirm(now, now);
        assert!(matches!(b.take_verdict(), Some(Verdict::Stop(_))));
        assert!(b.take_request().is_none(), "stopped once");
        // ... and a request not yet served becomes a stop
        b.set_playing(Some(2));
        b.request(now, now);
        b.confirm(now, now);
        assert_eq!(b.take_request().map(|r| r.ask), Some(Ask::Stop));
        // ... and an answer that plays on after a false interruption is stopped
        b.confirm(now, now);
        assert_eq!(b.take_request().map(|r| r.ask), Some(Ask::Stop));
    }

    #[test]
    fn a_hold_no_words_come_for_resumes() {
        let b = BargeIn::new();
        let now = Instant::now();
        b.set_playing(Some(1));
        b.request(now, now);
        let r = b.take_request().unwrap();
        let long_ago = now.checked_sub(HOLD_WITHOUT_SPEECH).unwrap_or(now);
        b.hold(1, r, now);
        b.lock().hold.as_mut().unwrap().since = long_ago;
        assert!(matches!(b.take_verdict(), Some(Verdict::Resume(_, None))));
    }

    /// The output sleeps on [`BargeIn::changes`]: a request, a stop and a
    /// verdict each signal it; nothing else does, and signals do not pile
    /// up. Its timer is the hold's end.
    #[test]
    fn requests_and_verdicts_wake_the_output_and_the_hold_sets_its_timer() {
        let b = BargeIn::new();
        let woken = b.changes();
        let now = Instant::now();
        b.request(now, now);
        assert!(woken.try_recv().is_err(), "nothing plays: no request");
        b.set_playing(Some(1));
        b.request(now, now);
        b.request(now, now);
        assert!(woken.try_recv().is_ok(), "a request");
        assert!(woken.try_recv().is_err(), "one signal for both");
        assert_eq!(b.hold_ends(), None);
        let r = b.take_request().unwrap();
        b.hold(1, r, now);
        let ends = b.hold_ends().unwrap();
        assert!(
            ends >= now + HOLD_WITHOUT_SPEECH,
            "no words sent: the shorter wait"
        );
        b.heard_over(2);
        assert!(b.hold_ends().unwrap() >= now + HOLD_FOR_WORDS);
        assert!(
            woken.try_recv().is_err(),
            "naming what is heard over it decides nothing"
        );
        b.heard(3, &Heard::Words, "Not over it.");
        assert!(woken.try_recv().is_err(), "words not heard over it");
        b.heard(2, &Heard::Words, "Stop that.");
        assert!(woken.try_recv().is_ok(), "a verdict");
        assert!(matches!(b.take_verdict(), Some(Verdict::Stop(_))));
        assert_eq!(b.hold_ends(), None);
        b.confirm(now, now);
        assert!(woken.try_recv().is_ok(), "a stop asked for while it plays");
    }

    #[test]
    fn backchannels_are_told_from_turns() {
        for text in [
            "Uh-huh.",
            "Mm-hmm.",
            "Okay.",
            "Yeah.",
            "Yeah, I see.",
            "(coughing)",
            "",
            "Right, right.",
            "Okay, got it.",
            "Go on.",
            "Thank you.",
            "Paris.",
            "[BLANK_AUDIO]",
            "Really?",
            "Right?",
        ] {
            assert!(backchannel(text), "{text:?} is a backchannel");
        }
        for text in [
            "Stop.",
            "Wait.",
            "No.",
            "What?",
            "Tell me about Mars.",
            "Okay, but what about Mars?",
            "How far is the moon?",
            "Yes please.",
            "Sorry?",
            "Help!",
            "Paris?",
            "Excuse me.",
            "Never mind.",
        ] {
            assert!(!backchannel(text), "{text:?} is a turn");
        }
    }
}
