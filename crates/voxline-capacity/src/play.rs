//! One simulated user's conversation: the audio played at real-time pace
//! into a [`Conversation`] (a session in this process or a WebSocket to
//! `voxline serve`) and the turns collected from its events as the user saw
//! them ([`TurnSeen`]).

use std::time::{Duration, Instant};

use super::Script;
use voxline_pipeline::sessions::{due, Session};
use voxline_serve::protocol::ServerEvent;
use voxline_serve::turns::Turns;

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
/// process ([`Local`]), or a WebSocket connection to `voxline serve`
/// ([`remote::Remote`](super::remote::Remote)). Either way the user hears
/// the protocol's events, each with when it reached them.
pub trait Conversation {
    /// Sends one block of 16 kHz mono samples.
    fn push(&mut self, block: &[f32]);
    /// The speaker is done.
    fn end_of_stream(&mut self);
    /// The events already arrived, without waiting.
    fn take_events(&mut self) -> Vec<Heard>;
    /// The next events, waiting up to `timeout` for one.
    fn wait_event(&mut self, timeout: Duration) -> Vec<Heard>;
    /// Events and audio lost on the way.
    fn lost(&self) -> u64;
}

/// An event as a user heard it, and when.
pub type Heard = (ServerEvent, Instant);

impl<C: Conversation + ?Sized> Conversation for &mut C {
    fn push(&mut self, block: &[f32]) {
        (**self).push(block);
    }
    fn end_of_stream(&mut self) {
        (**self).end_of_stream();
    }
    fn take_events(&mut self) -> Vec<Heard> {
        (**self).take_events()
    }
    fn wait_event(&mut self, timeout: Duration) -> Vec<Heard> {
        (**self).wait_event(timeout)
    }
    fn lost(&self) -> u64 {
        (**self).lost()
    }
}

/// A conversation with a [`Session`] in this process: its pipeline's
/// events read as the server's bridge reads them ([`Turns`]).
pub struct Local<'s> {
    session: &'s Session,
    turns: Turns,
    origin: Instant,
}

impl<'s> Local<'s> {
    /// A user of `session`.
    #[must_use]
    pub fn new(session: &'s Session) -> Self {
        let origin = Instant::now();
        Self {
            session,
            turns: Turns::new(origin),
            origin,
        }
    }

    fn heard(&self, told: Vec<ServerEvent>) -> Vec<Heard> {
        told.into_iter()
            .map(|e| {
                // tokens reached the user when the pipeline emitted them
                let at = match &e {
                    ServerEvent::Token { t_ms, .. } => {
                        self.origin + Duration::from_secs_f64(t_ms.max(0.0) / 1e3)
                    }
                    _ => Instant::now(),
                };
                (e, at)
            })
            .collect()
    }
}

impl Conversation for Local<'_> {
    fn push(&mut self, block: &[f32]) {
        self.session.push(block.to_vec());
    }
    fn end_of_stream(&mut self) {
        self.session.end_of_stream();
    }
    fn take_events(&mut self) -> Vec<Heard> {
        let mut told = Vec::new();
        while let Ok(item) = self.session.events().try_recv() {
            told.extend(self.turns.push(item, &|_| None));
        }
        told.extend(self.turns.poll(&|_| None));
        self.heard(told)
    }
    fn wait_event(&mut self, timeout: Duration) -> Vec<Heard> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let told = match self
                .session
                .events()
                .recv_timeout(left.min(Duration::from_millis(100)))
            {
                Ok(item) => self.turns.push(item, &|_| None),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => self.turns.poll(&|_| None),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Vec::new(),
            };
            if !told.is_empty() || left.is_zero() {
                return self.heard(told);
            }
        }
    }
    fn lost(&self) -> u64 {
        self.session.dropped_events() + self.session.refused_blocks()
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
        let ended = log
            .iter()
            .any(|(e, _)| matches!(e, ServerEvent::StreamEnd { .. }));
        if ended && open_turns(&log) == 0 {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let heard = conversation.wait_event(left);
        if heard.is_empty() && Instant::now() < deadline {
            // the conversation is gone
            break;
        }
        log.extend(heard);
    }
    turns_of(&log, script, origin)
}

/// Transcribed turns not yet answered or failed.
fn open_turns(log: &[Heard]) -> usize {
    let heard = log
        .iter()
        .filter_map(|(e, _)| match e {
            ServerEvent::Transcript { id, .. } => Some(*id),
            _ => None,
        })
        .collect::<std::collections::HashSet<_>>()
        .len();
    let ended = log
        .iter()
        .filter(|(e, _)| {
            matches!(
                e,
                ServerEvent::TurnComplete { .. } | ServerEvent::TurnError { .. }
            )
        })
        .count();
    heard.saturating_sub(ended)
}

/// The turns in `log`, with each one's latency from its labelled true end
/// (the label nearest the utterance's end) to its first token reaching the user.
fn turns_of(log: &[Heard], script: &Script, origin: Instant) -> Vec<TurnSeen> {
    let mut turns: Vec<TurnSeen> = Vec::new();
    let mut first_at: Vec<(u32, Instant)> = Vec::new();
    let mut ends: Vec<(u32, u64)> = Vec::new();
    for (ev, at) in log {
        match ev {
            ServerEvent::Transcript { id, text, .. } if turns.iter().any(|t| t.turn == *id) => {
                // the words a stage after the STT made of it
                if let Some(t) = turns.iter_mut().find(|t| t.turn == *id) {
                    t.transcript.clone_from(text);
                }
            }
            ServerEvent::Transcript {
                id,
                text,
                sample,
                stt_ms,
                stt_wait_ms,
                ..
            } => {
                ends.push((*id, *sample));
                turns.push(TurnSeen {
                    turn: *id,
                    transcript: text.clone(),
                    answer: String::new(),
                    response_ms: None,
                    stt_ms: *stt_ms,
                    stt_wait_ms: *stt_wait_ms,
                    first_token_ms: None,
                    decode_tps: None,
                    tokens: 0,
                    received: 0,
                    error: None,
                });
            }
            ServerEvent::Token { id, .. } => {
                if let Some(t) = turns.iter_mut().find(|t| t.turn == *id) {
                    t.received += 1;
                }
                if !first_at.iter().any(|(t, _)| t == id) {
                    first_at.push((*id, *at));
                }
            }
            ServerEvent::TurnComplete {
                id,
                response,
                n_generated,
                latency,
                ..
            } => {
                if let Some(t) = turns.iter_mut().find(|t| t.turn == *id) {
                    t.answer.clone_from(response);
                    t.tokens = *n_generated;
                    t.first_token_ms = latency.first_token_ms;
                    t.decode_tps = latency
                        .decode_ms
                        .filter(|d| *d > 0.0 && *n_generated > 1)
                        .map(|d| f64::from(*n_generated - 1) / (d / 1e3));
                }
            }
            ServerEvent::TurnError { id, message, .. } => {
                if let Some(t) = turns.iter_mut().find(|t| t.turn == *id) {
                    t.error = Some(message.clone());
                }
            }
            _ => {}
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
    use voxline_serve::protocol::Latency;

    fn transcript(id: u32, sample: u64) -> ServerEvent {
        ServerEvent::Transcript {
            id,
            sample,
            t_ms: 0.0,
            text: format!("question {id}"),
            stt_ms: 900.0,
            stt_wait_ms: 10.0,
        }
    }

    fn done(id: u32) -> ServerEvent {
        ServerEvent::TurnComplete {
            id,
            t_ms: 0.0,
            transcript: format!("question {id}"),
            response: format!("answer {id}"),
            n_generated: 11,
            stop: Stop::EndOfGeneration,
            latency: Latency {
                response_ms: None,
                stt_ms: 900.0,
                stt_wait_ms: 10.0,
                first_token_ms: Some(100.0),
                decode_ms: Some(200.0),
            },
        }
    }

    #[test]
    fn a_turn_is_timed_from_the_nearest_labelled_end_of_speech() {
        let origin = Instant::now();
        let script = Script {
            samples: vec![0.0; 160_000],
            true_ends: vec![16_000, 96_000],
        };
        let at = |ms| origin + Duration::from_millis(ms);
        let token = |id, ms| {
            (
                ServerEvent::Token {
                    id,
                    t_ms: 0.0,
                    index: 0,
                    text: "x".into(),
                },
                at(ms),
            )
        };
        // the VAD's ends lie ~100 ms after the labels
        let log = vec![
            (transcript(1, 17_600), at(2_000)),
            token(1, 2_200),
            token(1, 2_300),
            (done(1), at(2_400)),
            (transcript(2, 97_600), at(7_000)),
            (
                ServerEvent::TurnError {
                    id: 2,
                    t_ms: 0.0,
                    message: "boom".into(),
                },
                at(7_100),
            ),
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
        assert_eq!(t.received, 2);
        assert_eq!(turns[1].error.as_deref(), Some("boom"));
        assert_eq!(turns[1].response_ms, None);
        assert_eq!(open_turns(&log), 0);
        assert_eq!(open_turns(&log[..5]), 1);
    }
}
