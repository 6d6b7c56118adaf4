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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Sender, TrySendError};
use voxline_audio::{AudioError, VadConfig, VadStage};
use voxline_core::{Clock, CpuLease, SpecBoard, ThreadMeter};
use voxline_llm::{LlmError, Stop};
use voxline_stt::{SttEngine, SttError};

use crate::settings::EngineSettings;

mod session;
mod worker;

pub use session::Session;
use session::SessionWorker;
use worker::llm_worker;

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
    /// The operating system would not start a thread (the LLM worker or a session's).
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
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
    /// The session left; `done` hears when its sequence is cleared and
    /// its slot free.
    Leave {
        slot: usize,
        done: Sender<()>,
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
            .map_err(HubError::Thread)?;
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
                return Err(HubError::Thread(e));
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

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The wall time sample `sample` of a stream pushed at real-time pace from
/// `origin` was (or is) due.
#[must_use]
pub fn due(origin: Instant, sample: u64) -> Instant {
    origin + Clock::samples_to_duration(sample)
}
