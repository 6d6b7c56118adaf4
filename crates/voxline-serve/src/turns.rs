//! A session's pipeline, as its client sees it: the pipeline's events and
//! spans ([`Observed`]) turned into the protocol's turns ([`ServerEvent`]),
//! numbered per session, each with its latency figures. The server's
//! bridge and the capacity bench's in-process users read the same.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use voxline_core::{PipelineEvent, Span, TimedEvent, UtteranceId};
use voxline_llm::{Token, TurnComplete};

use super::protocol::{Latency, ServerEvent};
use voxline_pipeline::sessions::Observed;
use voxline_pipeline::topology;

/// The longest a transcript waits for its speech-to-text span (recorded
/// just after the transcript was emitted).
const SPAN_WAIT: Duration = Duration::from_millis(500);

/// Speech-to-text timings remembered for transcripts still to come.
const SPANS_KEPT: usize = 256;

/// A turn between its transcript and its end.
struct TurnState {
    turn: u32,
    transcript: String,
    end_sample: u64,
    stt: Duration,
    stt_wait: Duration,
    /// When the LLM could start on it: the words ready and the turn certain.
    transcribed: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    /// Nothing intelligible was heard: the turn was told as an error.
    silent: bool,
}

/// Turns a session's [`Observed`] items into [`ServerEvent`]s, in order.
///
/// A turn is numbered at its first transcript; a stage after the STT that
/// makes the transcript anew (the words the LLM answers) sends it again
/// under the same number.
pub struct Turns {
    origin: Instant,
    turns: u32,
    open: HashMap<UtteranceId, TurnState>,
    /// Events waiting (in order) for the span of the transcript at their head.
    waiting: VecDeque<TimedEvent>,
    /// The STT's timings per utterance: (queue wait, busy).
    stt: HashMap<UtteranceId, (Duration, Duration)>,
    stt_order: VecDeque<UtteranceId>,
    /// Utterances sent downstream and not yet transcribed (or failed).
    untranscribed: HashSet<UtteranceId>,
    /// The stream ended: the utterances it still waits for.
    stream_end: Option<(HashSet<UtteranceId>, Instant)>,
    /// When speculative attempts were committed (their turn could be answered).
    committed: HashMap<UtteranceId, Instant>,
    /// Answers still being spoken (after their end): the turn number and
    /// where its end of speech is in the stream.
    speaking: VecDeque<(UtteranceId, u32, u64)>,
}

/// Answers whose voice may still be coming after their text ended.
const SPEAKING_KEPT: usize = 16;

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns")
            .field("turns", &self.turns)
            .finish_non_exhaustive()
    }
}

impl Turns {
    /// Turns of a session whose times are told as milliseconds since `origin`.
    #[must_use]
    pub fn new(origin: Instant) -> Self {
        Self {
            origin,
            turns: 0,
            open: HashMap::new(),
            waiting: VecDeque::new(),
            stt: HashMap::new(),
            stt_order: VecDeque::new(),
            untranscribed: HashSet::new(),
            stream_end: None,
            committed: HashMap::new(),
            speaking: VecDeque::new(),
        }
    }

    /// Takes one item; returns what the client may be told now.
    /// `arrived(sample)` says when the stream's sample `sample` reached the
    /// server (for the response latency), where that is known.
    pub fn push(
        &mut self,
        item: Observed,
        arrived: &dyn Fn(u64) -> Option<Instant>,
    ) -> Vec<ServerEvent> {
        match item {
            Observed::Span(s) => self.span(&s),
            Observed::Event(e) => self.waiting.push_back(e),
        }
        self.poll(arrived)
    }

    /// Turns transcribed and not yet answered or failed.
    #[must_use]
    pub fn open_turns(&self) -> usize {
        self.open.len()
    }

    /// What may be told now without a new item (a transcript whose span
    /// did not come in time goes without it).
    pub fn poll(&mut self, arrived: &dyn Fn(u64) -> Option<Instant>) -> Vec<ServerEvent> {
        let mut out = Vec::new();
        while let Some(head) = self.waiting.front() {
            if let PipelineEvent::Transcript(t) = &head.event {
                if !self.stt.contains_key(&t.id) && head.at.elapsed() < SPAN_WAIT {
                    break;
                }
            }
            if let Some(e) = self.waiting.pop_front() {
                self.event(e, arrived, &mut out);
            }
        }
        if let Some((waits, at)) = &self.stream_end {
            if waits.is_disjoint(&self.untranscribed) {
                out.push(ServerEvent::StreamEnd { t_ms: self.ms(*at) });
                self.stream_end = None;
            }
        }
        out
    }

    fn span(&mut self, s: &Span) {
        let Some(id) = s.utterance else { return };
        if s.stage != topology::STT.as_str() {
            return;
        }
        let wait = s.started.saturating_duration_since(s.enqueued);
        self.stt.insert(id, (wait, s.busy()));
        self.stt_order.push_back(id);
        while self.stt_order.len() > SPANS_KEPT {
            if let Some(old) = self.stt_order.pop_front() {
                self.stt.remove(&old);
            }
        }
    }

    fn ms(&self, at: Instant) -> f64 {
        ms(at.saturating_duration_since(self.origin))
    }

    fn event(
        &mut self,
        e: TimedEvent,
        arrived: &dyn Fn(u64) -> Option<Instant>,
        out: &mut Vec<ServerEvent>,
    ) {
        let at = e.at;
        match e.event {
            PipelineEvent::Utterance(u) => {
                self.untranscribed.insert(u.id);
            }
            PipelineEvent::SpecCancel { id, .. } => {
                self.untranscribed.remove(&id);
            }
            PipelineEvent::Commit { id, .. } => {
                self.committed.insert(id, at);
            }
            PipelineEvent::Merged { id, .. } => {
                self.untranscribed.remove(&id);
                self.committed.remove(&id);
                let turn = self.open.remove(&id).map(|s| s.turn).or_else(|| {
                    let i = self.speaking.iter().position(|(s, _, _)| *s == id)?;
                    self.speaking.remove(i).map(|(_, turn, _)| turn)
                });
                if let Some(turn) = turn {
                    out.push(ServerEvent::TurnMerged {
                        id: turn,
                        t_ms: self.ms(at),
                    });
                }
            }
            PipelineEvent::StreamEnd { .. } => {
                self.stream_end = Some((self.untranscribed.clone(), at));
            }
            PipelineEvent::Transcript(t) if self.open.contains_key(&t.id) => {
                // a stage after the STT made the transcript anew: the turn's words now
                if let Some(s) = self.open.get_mut(&t.id).filter(|s| !s.silent) {
                    s.transcript.clone_from(&t.text);
                    out.push(ServerEvent::Transcript {
                        id: s.turn,
                        sample: t.end_sample,
                        t_ms: ms(at.saturating_duration_since(self.origin)),
                        text: t.text,
                        stt_ms: ms(s.stt),
                        stt_wait_ms: ms(s.stt_wait),
                    });
                }
            }
            PipelineEvent::Transcript(t) => {
                self.untranscribed.remove(&t.id);
                self.turns += 1;
                let (stt_wait, stt) = self.stt.remove(&t.id).unwrap_or_default();
                let silent = t.text.trim().is_empty();
                out.push(ServerEvent::Transcript {
                    id: self.turns,
                    sample: t.end_sample,
                    t_ms: self.ms(at),
                    text: t.text.clone(),
                    stt_ms: ms(stt),
                    stt_wait_ms: ms(stt_wait),
                });
                if silent {
                    out.push(ServerEvent::TurnError {
                        id: self.turns,
                        t_ms: self.ms(at),
                        message: "nothing intelligible was heard".into(),
                    });
                }
                self.open.insert(
                    t.id,
                    TurnState {
                        turn: self.turns,
                        transcript: t.text,
                        end_sample: t.end_sample,
                        stt,
                        stt_wait,
                        // the LLM can answer once the words are there and the turn is certain
                        transcribed: self.committed.remove(&t.id).map_or(at, |c| c.max(at)),
                        first: None,
                        last: None,
                        silent,
                    },
                );
            }
            PipelineEvent::TurnError(err) => {
                self.untranscribed.remove(&err.id);
                self.committed.remove(&err.id);
                let turn = match self.open.remove(&err.id) {
                    Some(s) if s.silent => return,
                    Some(s) => s.turn,
                    None => {
                        // failed before its transcript
                        self.turns += 1;
                        self.turns
                    }
                };
                out.push(ServerEvent::TurnError {
                    id: turn,
                    t_ms: self.ms(at),
                    message: err.message,
                });
            }
            PipelineEvent::Engine(ref any) => {
                if let Some(tok) = any.downcast_ref::<Token>() {
                    let Some(s) = self.open.get_mut(&tok.id).filter(|s| !s.silent) else {
                        return;
                    };
                    s.first.get_or_insert(at);
                    s.last = Some(at);
                    let turn = s.turn;
                    out.push(ServerEvent::Token {
                        id: turn,
                        t_ms: self.ms(at),
                        index: tok.index,
                        text: tok.text.clone(),
                    });
                } else if let Some(done) = any.downcast_ref::<TurnComplete>() {
                    let Some(s) = self.open.remove(&done.id) else {
                        return;
                    };
                    if s.silent {
                        return;
                    }
                    self.speaking.push_back((done.id, s.turn, s.end_sample));
                    if self.speaking.len() > SPEAKING_KEPT {
                        self.speaking.pop_front();
                    }
                    let response = s
                        .first
                        .zip(arrived(s.end_sample))
                        .map(|(f, a)| f.saturating_duration_since(a));
                    out.push(ServerEvent::TurnComplete {
                        id: s.turn,
                        t_ms: self.ms(at),
                        transcript: s.transcript,
                        response: done.response.clone(),
                        n_generated: done.n_generated,
                        stop: done.stop,
                        latency: Latency {
                            response_ms: response.map(ms),
                            stt_ms: ms(s.stt),
                            stt_wait_ms: ms(s.stt_wait),
                            first_token_ms: s
                                .first
                                .map(|f| ms(f.saturating_duration_since(s.transcribed))),
                            decode_ms: s.first.zip(s.last).map(|(f, l)| ms(l - f)),
                        },
                    });
                } else if let Some(a) = any.downcast_ref::<voxline_tts::VoiceAudio>() {
                    let turn = self
                        .open
                        .get(&a.id)
                        .map(|s| (s.turn, s.end_sample))
                        .or_else(|| {
                            self.speaking
                                .iter()
                                .find(|(id, _, _)| *id == a.id)
                                .map(|(_, t, end)| (*t, *end))
                        });
                    let Some((turn, end_sample)) = turn else {
                        return;
                    };
                    let first = a.chunk == 0 && a.block == 0;
                    let voice_latency_ms = arrived(end_sample)
                        .filter(|_| first)
                        .map(|a| ms(at.saturating_duration_since(a)));
                    out.push(ServerEvent::Voice {
                        id: turn,
                        t_ms: self.ms(at),
                        chunk: a.chunk,
                        sample_rate: a.sample_rate,
                        format: "s16le".into(),
                        samples: a.samples.len(),
                        text: a.text.as_deref().map(str::to_owned),
                        voice_latency_ms,
                        pcm: a
                            .samples
                            .iter()
                            .flat_map(|x| {
                                ((x.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes()
                            })
                            .collect(),
                    });
                }
            }
            _ => {}
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
