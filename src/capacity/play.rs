//! One simulated user's conversation: the audio played at real-time pace
//! into a [`Conversation`] (a session in this process or a WebSocket to
//! `voxline serve`) and the turns collected from its events as the user saw
//! them ([`TurnSeen`]).

use std::time::{Duration, Instant};

use super::Script;
use crate::sessions::{due, Session, SessionEvent};

/// Samples per pushed block: 20 ms, a typical capture period.
const BLOCK: usize = 320;

/// One answered turn as a user saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSeen {
    /// The session's turn number.
    pub turn: u32,
    /// What whisper heard.
    pub transcript: String,
    /// The answer (empty when the turn failed).
    pub answer: String,
    /// Labelled true end of speech → first token, ms.
    pub response_ms: Option<f64>,
    /// Whisper's time and its wait for the CPU, ms.
    pub stt_ms: f64,
    /// Waiting for the CPU before whisper ran, ms.
    pub stt_wait_ms: f64,
    /// The transcript handed to the LLM → its first token, ms.
    pub first_token_ms: Option<f64>,
    /// Decode rate of the answer, tokens/s.
    pub decode_tps: Option<f64>,
    /// Tokens sampled.
    pub tokens: u32,
    /// Pieces of the answer received (token events).
    pub received: u32,
    /// The turn's error, if it failed.
    pub error: Option<String>,
}

/// One simulated user's line to the assistant: a [`Session`] in this
/// process, or a WebSocket connection to `voxline serve`
/// ([`remote::Remote`](super::remote::Remote)).
pub trait Conversation {
    /// Sends one block of 16 kHz mono samples.
    fn push(&mut self, block: &[f32]);
    /// The speaker is done.
    fn end_of_stream(&mut self);
    /// The events already arrived, without waiting.
    fn take_events(&mut self) -> Vec<SessionEvent>;
    /// The next event, waiting up to `timeout`.
    fn wait_event(&mut self, timeout: Duration) -> Option<SessionEvent>;
    /// Events and audio lost on the way.
    fn lost(&self) -> u64;
}

impl<C: Conversation + ?Sized> Conversation for &mut C {
    fn push(&mut self, block: &[f32]) {
        (**self).push(block);
    }
    fn end_of_stream(&mut self) {
        (**self).end_of_stream();
    }
    fn take_events(&mut self) -> Vec<SessionEvent> {
        (**self).take_events()
    }
    fn wait_event(&mut self, timeout: Duration) -> Option<SessionEvent> {
        (**self).wait_event(timeout)
    }
    fn lost(&self) -> u64 {
        (**self).lost()
    }
}

impl Conversation for &Session {
    fn push(&mut self, block: &[f32]) {
        Session::push(self, block.to_vec());
    }
    fn end_of_stream(&mut self) {
        Session::end_of_stream(self);
    }
    fn take_events(&mut self) -> Vec<SessionEvent> {
        self.events().try_iter().collect()
    }
    fn wait_event(&mut self, timeout: Duration) -> Option<SessionEvent> {
        self.events().recv_timeout(timeout).ok()
    }
    fn lost(&self) -> u64 {
        self.dropped_events() + self.refused_blocks()
    }
}

/// Plays `script` into `conversation` at real-time pace from `origin` and
/// collects its turns; waits up to `settle` after the audio for the last
/// answers.
pub fn play(
    mut conversation: impl Conversation,
    script: &Script,
    origin: Instant,
    settle: Duration,
) -> Vec<TurnSeen> {
    let mut log = Vec::new();
    for (k, block) in script.samples.chunks(BLOCK).enumerate() {
        let at = due(origin, (k * BLOCK) as u64);
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        conversation.push(block);
        log.extend(conversation.take_events());
    }
    conversation.end_of_stream();
    let deadline = Instant::now() + settle;
    loop {
        let ended = log.iter().any(|e| matches!(e, SessionEvent::StreamEnd));
        if ended && open_turns(&log) == 0 {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match conversation.wait_event(left) {
            Some(ev) => log.push(ev),
            None => break,
        }
    }
    turns_of(&log, script, origin)
}

/// Transcribed turns not yet answered or failed.
fn open_turns(log: &[SessionEvent]) -> usize {
    let heard = log
        .iter()
        .filter(|e| matches!(e, SessionEvent::Transcript { .. }))
        .count();
    let ended = log
        .iter()
        .filter(|e| {
            matches!(
                e,
                SessionEvent::TurnDone { .. } | SessionEvent::TurnError { .. }
            )
        })
        .count();
    heard.saturating_sub(ended)
}

/// The turns in `log`, with each one's latency from its labelled true end
/// (the label nearest the utterance's end).
fn turns_of(log: &[SessionEvent], script: &Script, origin: Instant) -> Vec<TurnSeen> {
    let mut turns: Vec<TurnSeen> = Vec::new();
    let mut first_at: Vec<(u32, Instant)> = Vec::new();
    let mut ends: Vec<(u32, u64)> = Vec::new();
    for ev in log {
        match ev {
            SessionEvent::Transcript {
                turn,
                text,
                end_sample,
                stt_wait,
                stt,
            } => {
                ends.push((*turn, *end_sample));
                turns.push(TurnSeen {
                    turn: *turn,
                    transcript: text.clone(),
                    answer: String::new(),
                    response_ms: None,
                    stt_ms: ms(*stt),
                    stt_wait_ms: ms(*stt_wait),
                    first_token_ms: None,
                    decode_tps: None,
                    tokens: 0,
                    received: 0,
                    error: None,
                });
            }
            SessionEvent::Token { turn, at, .. } => {
                if let Some(t) = turns.iter_mut().find(|t| t.turn == *turn) {
                    t.received += 1;
                }
                if !first_at.iter().any(|(t, _)| t == turn) {
                    first_at.push((*turn, *at));
                }
            }
            SessionEvent::TurnDone {
                turn,
                text,
                tokens,
                first_token,
                decode,
                ..
            } => {
                if let Some(t) = turns.iter_mut().find(|t| t.turn == *turn) {
                    t.answer.clone_from(text);
                    t.tokens = *tokens;
                    t.first_token_ms = first_token.map(ms);
                    t.decode_tps = decode
                        .filter(|d| !d.is_zero() && *tokens > 1)
                        .map(|d| f64::from(*tokens - 1) / d.as_secs_f64());
                }
            }
            SessionEvent::TurnError { turn, message } => {
                if let Some(t) = turns.iter_mut().find(|t| t.turn == *turn) {
                    t.error = Some(message.clone());
                }
            }
            SessionEvent::StreamEnd => {}
        }
    }
    for t in &mut turns {
        let end = ends.iter().find(|(n, _)| *n == t.turn).map(|e| e.1);
        let first = first_at.iter().find(|(n, _)| *n == t.turn).map(|f| f.1);
        let true_end = end.and_then(|e| {
            script
                .true_ends
                .iter()
                .min_by_key(|&&x| x.abs_diff(e))
                .copied()
        });
        if let (Some(te), Some(f)) = (true_end, first) {
            let due_at = due(origin, te);
            t.response_ms = Some(if f >= due_at {
                ms(f - due_at)
            } else {
                -ms(due_at - f)
            });
        }
    }
    turns
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use voxline_llm::Stop;

    fn transcript(turn: u32, end_sample: u64) -> SessionEvent {
        SessionEvent::Transcript {
            turn,
            text: format!("question {turn}"),
            end_sample,
            stt_wait: Duration::from_millis(10),
            stt: Duration::from_millis(900),
        }
    }

    fn done(turn: u32) -> SessionEvent {
        SessionEvent::TurnDone {
            turn,
            text: format!("answer {turn}"),
            tokens: 11,
            stop: Stop::EndOfGeneration,
            first_token: Some(Duration::from_millis(100)),
            decode: Some(Duration::from_millis(200)),
        }
    }

    #[test]
    fn a_turn_is_timed_from_the_nearest_labelled_end_of_speech() {
        let origin = Instant::now();
        let script = Script {
            samples: vec![0.0; 160_000],
            true_ends: vec![16_000, 96_000],
        };
        let token = |turn, ms| SessionEvent::Token {
            turn,
            piece: "x".into(),
            at: origin + Duration::from_millis(ms),
        };
        // the VAD's ends lie ~100 ms after the labels
        let log = vec![
            transcript(1, 17_600),
            token(1, 2_200),
            token(1, 2_300),
            done(1),
            transcript(2, 97_600),
            SessionEvent::TurnError {
                turn: 2,
                message: "boom".into(),
            },
        ];
        let turns = turns_of(&log, &script, origin);
        assert_eq!(turns.len(), 2);
        let t = &turns[0];
        // labelled end at 1.0 s, first token at 2.2 s
        assert!((t.response_ms.unwrap() - 1_200.0).abs() < 1e-6);
        assert_eq!(t.answer, "answer 1");
        assert!(
            (t.decode_tps.unwrap() - 50.0).abs() < 1e-9,
            "10 tokens in 200 ms"
        );
        assert_eq!(turns[1].error.as_deref(), Some("boom"));
        assert_eq!(turns[1].response_ms, None);
        assert_eq!(open_turns(&log), 0);
        assert_eq!(open_turns(&log[..5]), 1);
    }
}
