//! Many conversations in one process, sharing the engines.
//!
//! A [`Hub`] loads whisper once and the language model once. Each
//! [`Session`] is one conversation: its own endpointer (VAD and turn
//! state), its own whisper decoding state on the shared weights, its own KV
//! sequence in the one LLM context, its own history and events. The LLM
//! runs on one worker thread that continuously batches every session that
//! is answering ([`voxline_llm::batch::BatchEngine`]): each step advances
//! all of them at once, a new turn's prompt joins the running batch, and a
//! finished, superseded or departed turn leaves it at once.
//!
//! One CPU budget: whisper and the LLM never compute at the same time (one
//! [`CpuLease`]); a step holding some turn's first token and a committed
//! turn's transcription go first (the longest waiting first), then plain
//! decoding, then speculative transcriptions — the LLM takes the lease per
//! step, so a transcription waits at most one step.
//! Every engine call runs with the whole budget's threads (metered).
//!
//! A session's events go into a bounded queue: a reader that stops reading
//! loses events (counted in [`Session::dropped_events`]) and never stalls
//! the other sessions or the LLM worker.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use voxline_audio::{AudioError, VadConfig, VadStage};
use voxline_core::{
    AudioFrame, Clock, CpuLease, Emitter, Priority, SpecBoard, SpecState, Stage, ThreadMeter,
    Utterance, UtteranceId,
};
use voxline_llm::batch::{BatchEngine, StepEvent};
use voxline_llm::{LlmError, LlmModel, Stop};
use voxline_stt::{SttEngine, SttError, Transcription};

use crate::settings::EngineSettings;

/// Audio blocks a session queues before pushes are refused (about 20 s of
/// 20 ms blocks): the session's own thread is transcribing meanwhile.
const AUDIO_QUEUE: usize = 1024;

/// Events a session queues for its reader before it drops them.
const EVENT_QUEUE: usize = 4096;

/// Why the hub or a session could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Every session slot is taken.
    #[error("all {max} sessions are in use; wait for one to leave, or allow more sessions")]
    Full {
        /// The hub's session limit.
        max: usize,
    },
    /// A hub needs room for at least one session.
    #[error("a hub needs at least one session")]
    NoSessions,
    /// The speech engine failed.
    #[error(transparent)]
    Stt(#[from] SttError),
    /// The language model failed to load or start.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// The VAD settings are invalid.
    #[error(transparent)]
    Audio(#[from] AudioError),
    /// The LLM worker thread has stopped (it failed or the hub is shutting down).
    #[error("the language-model worker has stopped")]
    Stopped,
}

/// What a session reports, in order, for each turn.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// The turn's words.
    Transcript {
        /// The session's turn number, from 1.
        turn: u32,
        /// What whisper heard.
        text: String,
        /// The utterance's end in the session's stream (samples at 16 kHz).
        end_sample: u64,
        /// Waiting for the CPU before whisper ran.
        stt_wait: Duration,
        /// Whisper's own time.
        stt: Duration,
    },
    /// A piece of the answer.
    Token {
        /// The turn.
        turn: u32,
        /// The text.
        piece: String,
        /// When it was sampled.
        at: Instant,
    },
    /// The answer is complete.
    TurnDone {
        /// The turn.
        turn: u32,
        /// The whole answer.
        text: String,
        /// Tokens sampled.
        tokens: u32,
        /// Why it ended.
        stop: Stop,
        /// The transcript handed to the LLM → its first token.
        first_token: Option<Duration>,
        /// First token → last token.
        decode: Option<Duration>,
    },
    /// The stream ended ([`Session::end_of_stream`]) and every utterance in
    /// it has been transcribed (answers may still be streaming).
    StreamEnd,
    /// The turn failed.
    TurnError {
        /// The turn.
        turn: u32,
        /// What happened.
        message: String,
    },
}

/// Totals the hub keeps for utilisation and throughput.
#[derive(Debug, Default)]
struct Counters {
    stt_busy_ns: AtomicU64,
    stt_runs: AtomicU64,
    llm_busy_ns: AtomicU64,
    llm_steps: AtomicU64,
    tokens: AtomicU64,
    prefill_tokens: AtomicU64,
    prefill_busy_ns: AtomicU64,
}

/// A snapshot of the hub's totals since it started.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HubTotals {
    /// Time whisper computed.
    pub stt_busy: Duration,
    /// Transcriptions run.
    pub stt_runs: u64,
    /// Time the LLM computed (batched steps).
    pub llm_busy: Duration,
    /// Batched steps.
    pub llm_steps: u64,
    /// Answer tokens sampled, all sessions.
    pub tokens: u64,
    /// Prompt tokens evaluated, all sessions.
    pub prefill_tokens: u64,
    /// Time of the steps that evaluated prompt tokens.
    pub prefill_busy: Duration,
    /// Most engine threads that ever ran at once.
    pub peak_threads: usize,
}

/// A command to the LLM worker.
enum Cmd {
    Start {
        slot: usize,
        turn: u32,
        user: String,
        reply: Reply,
    },
    Leave {
        slot: usize,
    },
    Shutdown,
}

/// Where a session's events go.
#[derive(Clone)]
struct Reply {
    tx: Sender<SessionEvent>,
    dropped: Arc<AtomicU64>,
}

impl Reply {
    /// Queues `ev`; a full queue (a reader that stopped reading) drops it.
    fn send(&self, ev: SessionEvent) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(ev) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Shared {
    /// The loaded whisper model each session takes a state from.
    stt: Mutex<SttEngine>,
    vad: VadConfig,
    /// Speculative turn-taking's silence, ms (`None`: off).
    spec_silence_ms: Option<u32>,
    threads: usize,
    lease: CpuLease,
    meter: ThreadMeter,
    counters: Counters,
    /// Which session slots (= KV sequences) are taken.
    slots: Mutex<Vec<bool>>,
    llm: Sender<Cmd>,
}

/// Shared engines serving up to `max_sessions` conversations.
pub struct Hub {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("threads", &self.shared.threads)
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// Loads both models once and starts the LLM worker, with one context
    /// of `max_sessions` KV sequences (each `engine.n_ctx` tokens, plus one
    /// for the system prompt). Every engine call gets the budget's
    /// `threads.total` threads.
    ///
    /// # Errors
    /// [`HubError::NoSessions`] for 0 sessions; [`HubError::Audio`] for a bad
    /// VAD configuration; [`HubError::Stt`] or [`HubError::Llm`] when a model
    /// cannot be loaded.
    pub fn start(
        engine: &EngineSettings,
        vad: VadConfig,
        spec_silence_ms: Option<u32>,
        max_sessions: usize,
    ) -> Result<Self, HubError> {
        if max_sessions == 0 {
            return Err(HubError::NoSessions);
        }
        vad.validate()?;
        let threads = engine.threads.total.max(1);
        let mut stt_config = engine.stt_config();
        stt_config.threads = threads;
        let stt = SttEngine::load(stt_config)?;
        let mut llm_config = engine.llm_config();
        llm_config.threads = threads;
        llm_config.decode_threads = threads;
        let (tx, rx) = bounded::<Cmd>(4 * max_sessions + 16);
        let shared = Arc::new(Shared {
            stt: Mutex::new(stt),
            vad,
            spec_silence_ms,
            threads,
            lease: CpuLease::new(),
            meter: ThreadMeter::new(),
            counters: Counters::default(),
            slots: Mutex::new(vec![false; max_sessions]),
            llm: tx,
        });
        let (ready_tx, ready_rx) = bounded(1);
        let worker_shared = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("llm-batch".into())
            .spawn(move || llm_worker(&worker_shared, llm_config, max_sessions, &rx, &ready_tx))
            .map_err(|e| LlmError::Engine(format!("cannot start the LLM worker: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Hub {
                shared,
                worker: Some(worker),
            }),
            Ok(Err(e)) => {
                let _ = worker.join();
                Err(e.into())
            }
            Err(_) => {
                let _ = worker.join();
                Err(HubError::Stopped)
            }
        }
    }

    /// Starts a conversation in a free slot.
    ///
    /// # Errors
    /// [`HubError::Full`] when every slot is taken; [`HubError::Stt`] when
    /// whisper cannot allocate the session's state.
    pub fn join(&self) -> Result<Session, HubError> {
        let slot = {
            let mut slots = self
                .shared
                .slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let max = slots.len();
            let free = slots.iter().position(|taken| !taken);
            let slot = free.ok_or(HubError::Full { max })?;
            slots[slot] = true;
            slot
        };
        let made = self
            .shared
            .stt
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .share()
            .map_err(HubError::from)
            .and_then(|stt| Ok((stt, VadStage::new(self.shared.vad.clone())?)));
        let (stt, vad) = match made {
            Ok(m) => m,
            Err(e) => {
                self.free(slot);
                return Err(e);
            }
        };
        let (audio_tx, audio_rx) = bounded(AUDIO_QUEUE);
        let (event_tx, event_rx) = bounded(EVENT_QUEUE);
        let reply = Reply {
            tx: event_tx,
            dropped: Arc::new(AtomicU64::new(0)),
        };
        let leaving = Arc::new(AtomicBool::new(false));
        let board = SpecBoard::new();
        let vad = match self.shared.spec_silence_ms {
            Some(ms) => vad.with_speculation(board.clone(), ms),
            None => vad,
        };
        let worker = SessionWorker {
            shared: Arc::clone(&self.shared),
            slot,
            stt,
            vad,
            board,
            attempt: None,
            position: 0,
            reply: reply.clone(),
            leaving: Arc::clone(&leaving),
            turn: 0,
        };
        let thread = std::thread::Builder::new()
            .name(format!("session-{slot}"))
            .spawn(move || worker.run(&audio_rx));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                self.free(slot);
                return Err(HubError::Llm(LlmError::Engine(format!(
                    "cannot start a session thread: {e}"
                ))));
            }
        };
        Ok(Session {
            shared: Arc::clone(&self.shared),
            slot,
            audio: Some(audio_tx),
            events: event_rx,
            dropped: reply.dropped,
            refused: AtomicU64::new(0),
            leaving,
            thread: Some(thread),
        })
    }

    fn free(&self, slot: usize) {
        if let Some(s) = self
            .shared
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(slot)
        {
            *s = false;
        }
    }

    /// Sessions connected now.
    #[must_use]
    pub fn sessions(&self) -> usize {
        self.shared
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|t| **t)
            .count()
    }

    /// The session limit.
    #[must_use]
    pub fn max_sessions(&self) -> usize {
        self.shared
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Totals since the hub started.
    #[must_use]
    pub fn totals(&self) -> HubTotals {
        let c = &self.shared.counters;
        HubTotals {
            stt_busy: Duration::from_nanos(c.stt_busy_ns.load(Ordering::Relaxed)),
            stt_runs: c.stt_runs.load(Ordering::Relaxed),
            llm_busy: Duration::from_nanos(c.llm_busy_ns.load(Ordering::Relaxed)),
            llm_steps: c.llm_steps.load(Ordering::Relaxed),
            tokens: c.tokens.load(Ordering::Relaxed),
            prefill_tokens: c.prefill_tokens.load(Ordering::Relaxed),
            prefill_busy: Duration::from_nanos(c.prefill_busy_ns.load(Ordering::Relaxed)),
            peak_threads: self.shared.meter.peak(),
        }
    }

    /// Threads every engine call runs with.
    #[must_use]
    pub fn threads(&self) -> usize {
        self.shared.threads
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        // Sessions still connected then see a stopped worker: their turns
        // end with an error, their slots are freed when they leave.
        let _ = self.shared.llm.send(Cmd::Shutdown);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// One conversation on a [`Hub`]. Dropping it leaves: its transcription
/// in progress is aborted, its answer leaves the batch, and its slot is
/// freed for the next session to join.
pub struct Session {
    shared: Arc<Shared>,
    slot: usize,
    audio: Option<Sender<Input>>,
    events: Receiver<SessionEvent>,
    dropped: Arc<AtomicU64>,
    refused: AtomicU64,
    leaving: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

enum Input {
    Audio(Vec<f32>),
    End,
}

impl Session {
    /// Queues 16 kHz mono samples captured just now. Never blocks: when the
    /// session's queue is full (its thread far behind), the block is refused
    /// and counted ([`Session::refused_blocks`]); returns whether it was queued.
    pub fn push(&self, samples: Vec<f32>) -> bool {
        let Some(tx) = &self.audio else {
            return false;
        };
        let ok = tx.try_send(Input::Audio(samples)).is_ok();
        if !ok {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// The stream ends (the speaker is done): an open utterance is closed
    /// now instead of after the hangover. More audio may follow as a new stream.
    pub fn end_of_stream(&self) {
        if let Some(tx) = &self.audio {
            let _ = tx.send(Input::End);
        }
    }

    /// The session's events, in order.
    #[must_use]
    pub fn events(&self) -> &Receiver<SessionEvent> {
        &self.events
    }

    /// Events dropped because the reader did not keep up.
    #[must_use]
    pub fn dropped_events(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Audio blocks refused because the session's queue was full.
    #[must_use]
    pub fn refused_blocks(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The session's slot (its KV sequence) in the hub.
    #[must_use]
    pub fn slot(&self) -> usize {
        self.slot
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.leaving.store(true, Ordering::Relaxed);
        self.audio = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // After the session thread has stopped, so no turn of it starts after this.
        if self
            .shared
            .llm
            .send(Cmd::Leave { slot: self.slot })
            .is_err()
        {
            // the worker is gone: free the slot here
            if let Some(s) = self
                .shared
                .slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut(self.slot)
            {
                *s = false;
            }
        }
    }
}

/// A transcribed speculative attempt: its id, its end sample, whisper's
/// result, the wait for the CPU and whisper's time.
type Attempt = (
    UtteranceId,
    u64,
    Result<Transcription, SttError>,
    Duration,
    Duration,
);

/// A session's own thread: VAD, then whisper, then the turn to the LLM worker.
///
/// With speculation, an attempt (the utterance so far, sent after a short
/// silence) is transcribed at once at the lowest priority; the VAD's
/// verdict on it comes with the audio that follows, which queues meanwhile:
/// a commit hands the transcript already made to the LLM, a cancel drops it.
struct SessionWorker {
    shared: Arc<Shared>,
    slot: usize,
    stt: SttEngine,
    vad: VadStage,
    board: SpecBoard,
    /// A transcribed attempt awaiting the VAD's commit or cancel.
    attempt: Option<Attempt>,
    /// Samples pushed so far.
    position: u64,
    reply: Reply,
    leaving: Arc<AtomicBool>,
    turn: u32,
}

impl SessionWorker {
    fn run(mut self, audio: &Receiver<Input>) {
        while let Ok(input) = audio.recv() {
            if self.leaving.load(Ordering::Relaxed) {
                return;
            }
            let mut out: Vec<Utterance> = Vec::new();
            let end = matches!(input, Input::End);
            let result = match input {
                Input::Audio(samples) => {
                    let frame = AudioFrame {
                        start_sample: self.position,
                        new_recording: self.position == 0,
                        samples,
                        captured: Instant::now(),
                    };
                    self.position += frame.samples.len() as u64;
                    self.vad.process(frame, &mut Emitter::to_vec(&mut out))
                }
                Input::End => self.vad.finish(&mut Emitter::to_vec(&mut out)),
            };
            if let Err(e) = result {
                self.reply.send(SessionEvent::TurnError {
                    turn: self.turn + 1,
                    message: e.to_string(),
                });
            }
            self.settle_attempt();
            for u in out {
                self.utterance(&u);
                self.settle_attempt();
            }
            if end {
                self.reply.send(SessionEvent::StreamEnd);
            }
        }
    }

    /// Delivers the transcribed attempt the VAD committed; drops a cancelled one.
    fn settle_attempt(&mut self) {
        let Some((id, ..)) = &self.attempt else {
            return;
        };
        match self.board.state(*id) {
            SpecState::Committed => {
                if let Some((_, end_sample, result, wait, stt)) = self.attempt.take() {
                    self.deliver(end_sample, result, wait, stt);
                }
            }
            SpecState::Cancelled => self.attempt = None,
            SpecState::Pending | SpecState::Final => {}
        }
    }

    fn utterance(&mut self, u: &Utterance) {
        let speculative = self.board.state(u.id) == SpecState::Pending;
        let priority = if speculative {
            Priority::Speculative
        } else {
            Priority::Committed
        };
        let asked = Instant::now();
        let lease = self.shared.lease.acquire(priority);
        let wait = asked.elapsed();
        let meter = self.shared.meter.enter(self.shared.threads);
        let began = Instant::now();
        let (leaving, board, id) = (&self.leaving, &self.board, u.id);
        let result = self.stt.transcribe_abortable(&u.samples, &|| {
            leaving.load(Ordering::Relaxed) || board.is_cancelled(id)
        });
        let stt = began.elapsed();
        drop(meter);
        drop(lease);
        let c = &self.shared.counters;
        c.stt_busy_ns.fetch_add(nanos(stt), Ordering::Relaxed);
        c.stt_runs.fetch_add(1, Ordering::Relaxed);
        if speculative {
            // its verdict comes with later audio (see `settle_attempt`)
            self.attempt = Some((u.id, u.end_sample, result, wait, stt));
        } else {
            self.deliver(u.end_sample, result, wait, stt);
        }
    }

    /// A committed turn: its transcript to the reader, its words to the LLM.
    fn deliver(
        &mut self,
        end_sample: u64,
        result: Result<Transcription, SttError>,
        stt_wait: Duration,
        stt: Duration,
    ) {
        self.turn += 1;
        let turn = self.turn;
        match result {
            Ok(t) => {
                let text = t.text;
                self.reply.send(SessionEvent::Transcript {
                    turn,
                    text: text.clone(),
                    end_sample,
                    stt_wait,
                    stt,
                });
                if text.is_empty() {
                    self.reply.send(SessionEvent::TurnError {
                        turn,
                        message: "nothing intelligible was heard".into(),
                    });
                    return;
                }
                let cmd = Cmd::Start {
                    slot: self.slot,
                    turn,
                    user: text,
                    reply: self.reply.clone(),
                };
                if self.shared.llm.send(cmd).is_err() {
                    self.reply.send(SessionEvent::TurnError {
                        turn,
                        message: "the language-model worker has stopped".into(),
                    });
                }
            }
            Err(SttError::Aborted) => {}
            Err(e) => self.reply.send(SessionEvent::TurnError {
                turn,
                message: e.to_string(),
            }),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A turn the LLM worker is answering.
struct Answering {
    turn: u32,
    reply: Reply,
    sent: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
}

/// The LLM worker: loads the model, then serves commands and steps the
/// batch while any session is answering.
fn llm_worker(
    shared: &Shared,
    config: voxline_llm::LlmConfig,
    max_sessions: usize,
    rx: &Receiver<Cmd>,
    ready: &Sender<Result<(), LlmError>>,
) {
    let model = match LlmModel::load(config) {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut engine = match BatchEngine::new(&model, max_sessions) {
        Ok(e) => e,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut answering: Vec<Option<Answering>> = (0..max_sessions).map(|_| None).collect();
    let mut queued: Vec<VecDeque<Queued>> = (0..max_sessions).map(|_| VecDeque::new()).collect();
    loop {
        let cmd = if engine.busy() == 0 {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        } else {
            rx.try_recv().ok()
        };
        match cmd {
            Some(Cmd::Shutdown) => return,
            Some(cmd) => handle(&mut engine, &mut answering, &mut queued, shared, cmd),
            None => {
                step(&mut engine, &mut answering, shared);
                // a session whose answer ended starts its next turn
                for slot in 0..max_sessions {
                    if answering[slot].is_none() {
                        if let Some(q) = queued[slot].pop_front() {
                            begin(&mut engine, &mut answering, slot, q);
                        }
                    }
                }
            }
        }
    }
}

/// A turn waiting for its session's previous answer to end.
struct Queued {
    turn: u32,
    user: String,
    reply: Reply,
    sent: Instant,
}

fn handle(
    engine: &mut BatchEngine<'_>,
    answering: &mut [Option<Answering>],
    queued: &mut [VecDeque<Queued>],
    shared: &Shared,
    cmd: Cmd,
) {
    match cmd {
        Cmd::Start {
            slot,
            turn,
            user,
            reply,
        } => {
            let q = Queued {
                turn,
                user,
                reply,
                sent: Instant::now(),
            };
            // One answer at a time per conversation, in order (as the
            // single-conversation pipeline does): a turn spoken while the
            // previous answer streams waits for it.
            if answering[slot].is_some() || !queued[slot].is_empty() {
                queued[slot].push_back(q);
            } else {
                begin(engine, answering, slot, q);
            }
        }
        Cmd::Shutdown => {}
        Cmd::Leave { slot } => {
            answering[slot] = None;
            queued[slot].clear();
            // A sequence that cannot be cleared is not given to anyone else.
            if engine.reset(slot).is_ok() {
                if let Some(s) = shared
                    .slots
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_mut(slot)
                {
                    *s = false;
                }
            }
        }
    }
}

/// Starts `q`'s answer in the running batch.
fn begin(
    engine: &mut BatchEngine<'_>,
    answering: &mut [Option<Answering>],
    slot: usize,
    q: Queued,
) {
    if let Err(e) = engine.start(slot, &q.user) {
        q.reply.send(SessionEvent::TurnError {
            turn: q.turn,
            message: e.to_string(),
        });
        return;
    }
    answering[slot] = Some(Answering {
        turn: q.turn,
        reply: q.reply,
        sent: q.sent,
        first: None,
        last: None,
    });
}

fn step(engine: &mut BatchEngine<'_>, answering: &mut [Option<Answering>], shared: &Shared) {
    // A step holding some turn's first token is the end of that turn's
    // critical path (its transcript is done; ~100 ms remain): it goes before
    // another conversation's transcription starts (~1 s), as that
    // transcription's own turn would (shortest remaining work first; with
    // the STT ahead, four users on two cores waited 35 s for first tokens).
    let priority = if engine.prefilling() {
        Priority::Committed
    } else {
        Priority::Streaming
    };
    let lease = shared.lease.acquire(priority);
    let meter = shared.meter.enter(shared.threads);
    let prefilled_before = engine.prefilled_tokens();
    let began = Instant::now();
    let result = engine.step();
    let busy = began.elapsed();
    let prefilled = engine.prefilled_tokens() - prefilled_before;
    drop(meter);
    drop(lease);
    let now = Instant::now();
    let c = &shared.counters;
    c.llm_busy_ns.fetch_add(nanos(busy), Ordering::Relaxed);
    c.llm_steps.fetch_add(1, Ordering::Relaxed);
    if prefilled > 0 {
        c.prefill_tokens.fetch_add(prefilled, Ordering::Relaxed);
        c.prefill_busy_ns.fetch_add(nanos(busy), Ordering::Relaxed);
    }
    let events = match result {
        Ok(ev) => ev,
        Err(e) => {
            // the engine cancelled every turn in the batch
            for a in answering.iter_mut().filter_map(Option::take) {
                a.reply.send(SessionEvent::TurnError {
                    turn: a.turn,
                    message: e.to_string(),
                });
            }
            return;
        }
    };
    for ev in events {
        match ev {
            StepEvent::Token { session, piece } => {
                c.tokens.fetch_add(1, Ordering::Relaxed);
                if let Some(a) = answering[session].as_mut() {
                    a.first.get_or_insert(now);
                    a.last = Some(now);
                    a.reply.send(SessionEvent::Token {
                        turn: a.turn,
                        piece,
                        at: now,
                    });
                }
            }
            StepEvent::Done {
                session,
                text,
                n_sampled,
                stop,
            } => {
                if let Some(a) = answering[session].take() {
                    a.reply.send(SessionEvent::TurnDone {
                        turn: a.turn,
                        text,
                        tokens: n_sampled,
                        stop,
                        first_token: a.first.map(|f| f - a.sent),
                        decode: a.first.zip(a.last).map(|(f, l)| l - f),
                    });
                }
            }
        }
    }
}

/// The wall time sample `sample` of a stream pushed at real-time pace from
/// `origin` was (or is) due.
#[must_use]
pub fn due(origin: Instant, sample: u64) -> Instant {
    origin + Clock::samples_to_duration(sample)
}
