//! One language model serving many conversations: a worker thread owns the
//! one llama.cpp context and continuously batches every conversation that
//! is answering ([`BatchEngine`]); each conversation's language-model stage
//! is a [`BatchClient`] of it, a [`ChatBackend`] like any other.
//!
//! Each step advances every answer at once, a new turn's prompt joins the
//! running batch, and a finished, cancelled or departed turn leaves it at
//! once. The worker holds the CPU lease for one step at a time (a step that
//! evaluates some turn's prompt at [`Priority::Committed`]: the end of that
//! turn's critical path; plain decoding at [`Priority::Streaming`]), so a
//! committed transcription waits at most one step, and counts its threads
//! on the pipeline's meter while it computes. A model offloaded whole to a
//! GPU ([`LlmModel::gpu`]) computes there: its steps take neither the lease
//! nor a place on the meter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use voxline_core::{CpuLease, Priority, ThreadMeter};

use crate::batch::{BatchEngine, StepEvent};
use crate::{ChatBackend, LlmConfig, LlmCounters, LlmError, LlmModel, Response, Stop};

/// How the worker computes.
#[derive(Debug, Clone)]
pub struct ServingOptions {
    /// Conversations served at once (KV sequences of the context).
    pub sessions: usize,
    /// The lease every step takes (shared with the other engines on the cores).
    pub lease: CpuLease,
    /// Where the worker's threads are counted while a step computes.
    pub meter: ThreadMeter,
}

/// What the worker has done since it started: the engine's own counts and
/// the time its steps computed (the pipeline's stages see only their own
/// conversation).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ServingTotals {
    /// Batched steps.
    pub steps: u64,
    /// Time the steps computed.
    pub busy: Duration,
    /// Answer tokens sampled, all conversations.
    pub tokens: u64,
    /// Prompt tokens evaluated, all conversations.
    pub prefill_tokens: u64,
    /// Time of the steps that evaluated prompt tokens.
    pub prefill_busy: Duration,
}

#[derive(Debug, Default)]
struct Counters {
    steps: AtomicU64,
    busy_ns: AtomicU64,
    tokens: AtomicU64,
    prefill_tokens: AtomicU64,
    prefill_busy_ns: AtomicU64,
}

/// What a client hears about its turn.
enum Heard {
    Token(String),
    Done(Result<Response, LlmError>),
}

/// A command to the worker.
enum Cmd {
    Start {
        slot: usize,
        user: String,
        reply: Sender<Heard>,
    },
    Cancel {
        slot: usize,
    },
    /// The conversation left; `done` hears when its sequence is cleared
    /// and its slot free.
    Leave {
        slot: usize,
        done: Sender<()>,
    },
    Shutdown,
}

struct Shared {
    slots: Mutex<Vec<bool>>,
    counters: Counters,
}

/// The worker serving conversations on one context; see the module
/// documentation. Dropping it stops the worker (conversations still
/// connected then see [`LlmError::Stopped`]).
pub struct BatchServer {
    shared: Arc<Shared>,
    tx: Sender<Cmd>,
    worker: Option<JoinHandle<()>>,
    threads: usize,
    gpu: Option<String>,
}

impl std::fmt::Debug for BatchServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchServer")
            .field("threads", &self.threads)
            .field("gpu", &self.gpu)
            .finish_non_exhaustive()
    }
}

impl BatchServer {
    /// Loads the model of `config` on a worker thread and makes one context
    /// of `opts.sessions` KV sequences (each `config.n_ctx` tokens, plus one
    /// for the system prompt), computing with `config.threads` (or on the
    /// GPU, when the model is offloaded whole).
    ///
    /// # Errors
    /// [`LlmError::Config`] for 0 sessions; the model's or context's load
    /// error; [`LlmError::Stopped`] when the worker thread cannot start.
    pub fn start(config: LlmConfig, opts: ServingOptions) -> Result<Self, LlmError> {
        if opts.sessions == 0 {
            return Err(LlmError::Config(
                "batching needs at least one session".into(),
            ));
        }
        let config_threads = config.threads.max(1);
        let shared = Arc::new(Shared {
            slots: Mutex::new(vec![false; opts.sessions]),
            counters: Counters::default(),
        });
        let (tx, rx) = unbounded::<Cmd>();
        let (ready_tx, ready_rx) = bounded(1);
        let worker_shared = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("llm-batch".into())
            .spawn(move || {
                let model = match LlmModel::load(config) {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let engine = match BatchEngine::new(&model, opts.sessions) {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let gpu = model.gpu().map(str::to_owned);
                let _ = ready_tx.send(Ok(gpu.clone()));
                Worker::new(engine, &worker_shared, &opts, gpu.is_none()).run(&rx);
            })
            .map_err(|_| LlmError::Stopped)?;
        match ready_rx.recv() {
            Ok(Ok(gpu)) => Ok(Self {
                shared,
                tx,
                worker: Some(worker),
                threads: if gpu.is_some() { 0 } else { config_threads },
                gpu,
            }),
            Ok(Err(e)) => {
                let _ = worker.join();
                Err(e)
            }
            Err(_) => {
                let _ = worker.join();
                Err(LlmError::Stopped)
            }
        }
    }

    /// A conversation in a free slot.
    ///
    /// # Errors
    /// [`LlmError::Full`] when every slot is taken.
    pub fn client(&self) -> Result<BatchClient, LlmError> {
        let mut slots = lock(&self.shared.slots);
        let max = slots.len();
        let slot = slots
            .iter()
            .position(|taken| !taken)
            .ok_or(LlmError::Full { max })?;
        slots[slot] = true;
        Ok(BatchClient {
            slot,
            tx: self.tx.clone(),
            shared: Arc::clone(&self.shared),
        })
    }

    /// Conversations connected now.
    #[must_use]
    pub fn sessions(&self) -> usize {
        lock(&self.shared.slots).iter().filter(|t| **t).count()
    }

    /// The session limit.
    #[must_use]
    pub fn max_sessions(&self) -> usize {
        lock(&self.shared.slots).len()
    }

    /// Threads of the CPU budget every step computes with (0 on the GPU).
    #[must_use]
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The GPU the model computes on, when it was offloaded whole.
    #[must_use]
    pub fn gpu(&self) -> Option<&str> {
        self.gpu.as_deref()
    }

    /// What the worker has done since it started.
    #[must_use]
    pub fn totals(&self) -> ServingTotals {
        let c = &self.shared.counters;
        ServingTotals {
            steps: c.steps.load(Ordering::Relaxed),
            busy: Duration::from_nanos(c.busy_ns.load(Ordering::Relaxed)),
            tokens: c.tokens.load(Ordering::Relaxed),
            prefill_tokens: c.prefill_tokens.load(Ordering::Relaxed),
            prefill_busy: Duration::from_nanos(c.prefill_busy_ns.load(Ordering::Relaxed)),
        }
    }
}

impl Drop for BatchServer {
    fn drop(&mut self) {
        let _ = self.tx.send(Cmd::Shutdown);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// One conversation on a [`BatchServer`]: its own KV sequence, history and
/// sampler in the shared context. Dropping it leaves: its answer leaves the
/// batch, and its slot is freed for the next conversation.
///
/// It cannot return its conversation to a checkpoint (the sequence is the
/// worker's), so its stage takes committed turns only: a speculative
/// attempt is transcribed early but answered only once it is committed,
/// and never takes batch room from the other conversations.
pub struct BatchClient {
    slot: usize,
    tx: Sender<Cmd>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for BatchClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchClient")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl BatchClient {
    /// The conversation's slot (its KV sequence).
    #[must_use]
    pub fn slot(&self) -> usize {
        self.slot
    }
}

impl ChatBackend for BatchClient {
    type Checkpoint = ();

    /// The worker computes, holding the lease per step.
    fn computes_here(&self) -> bool {
        false
    }

    fn respond(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Response, LlmError> {
        let (reply, heard) = unbounded();
        self.tx
            .send(Cmd::Start {
                slot: self.slot,
                user: user.to_owned(),
                reply,
            })
            .map_err(|_| LlmError::Stopped)?;
        let mut cancelled = false;
        loop {
            match heard.recv() {
                Ok(Heard::Token(piece)) => {
                    if !cancelled && !on_token(&piece) {
                        cancelled = true;
                        // the turn leaves the batch at the worker's next look
                        let _ = self.tx.send(Cmd::Cancel { slot: self.slot });
                    }
                }
                Ok(Heard::Done(r)) => return r,
                Err(_) => return Err(LlmError::Stopped),
            }
        }
    }
}

impl Drop for BatchClient {
    fn drop(&mut self) {
        // leaving waits for the slot to be free, so whoever joins next can
        // have it (the worker handles it between two steps)
        let (done, cleared) = bounded(1);
        if self
            .tx
            .send(Cmd::Leave {
                slot: self.slot,
                done,
            })
            .is_ok()
            && cleared.recv_timeout(Duration::from_secs(10)).is_ok()
        {
            return;
        }
        // the worker is gone: free the slot here
        if let Some(s) = lock(&self.shared.slots).get_mut(self.slot) {
            *s = false;
        }
    }
}

use voxline_core::sync::lock;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A turn the worker is answering.
struct Answering {
    reply: Sender<Heard>,
    n_prompt: u32,
}

/// The worker's loop and state.
struct Worker<'e, 'm> {
    engine: BatchEngine<'m>,
    shared: &'e Shared,
    /// `None` on the GPU: the steps do not compute on the cores.
    lease: Option<CpuLease>,
    meter: ThreadMeter,
    threads: usize,
    answering: Vec<Option<Answering>>,
}

impl<'e, 'm> Worker<'e, 'm> {
    fn new(
        engine: BatchEngine<'m>,
        shared: &'e Shared,
        opts: &ServingOptions,
        on_cpu: bool,
    ) -> Self {
        let threads = engine.threads();
        Self {
            answering: (0..opts.sessions).map(|_| None).collect(),
            engine,
            shared,
            lease: on_cpu.then(|| opts.lease.clone()),
            meter: opts.meter.clone(),
            threads: if on_cpu { threads } else { 0 },
        }
    }

    /// Serves commands, and steps the batch while any conversation answers.
    fn run(mut self, rx: &Receiver<Cmd>) {
        loop {
            let cmd = if self.engine.busy() == 0 {
                match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                }
            } else {
                rx.try_recv().ok()
            };
            match cmd {
                Some(Cmd::Shutdown) => {
                    // conversations leaving now hear that their slot is free
                    for cmd in rx.try_iter() {
                        if let Cmd::Leave { .. } = cmd {
                            self.handle(cmd);
                        }
                    }
                    return;
                }
                Some(cmd) => self.handle(cmd),
                None => self.step(),
            }
        }
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Start { slot, user, reply } => {
                if let Err(e) = self.engine.start(slot, &user) {
                    let _ = reply.send(Heard::Done(Err(e)));
                    return;
                }
                self.answering[slot] = Some(Answering {
                    reply,
                    n_prompt: self.engine.prompt_tokens(slot),
                });
            }
            Cmd::Cancel { slot } => {
                // the turn leaves the batch now; its client hears it ended
                let cancelled = self.engine.cancel(slot);
                if let Some(a) = self.answering[slot].take() {
                    let r = cancelled.map(|()| Response {
                        text: String::new(),
                        n_prompt_tokens: a.n_prompt,
                        n_prefill_tokens: 0,
                        n_sampled: 0,
                        n_streamed: 0,
                        stop: Stop::Cancelled,
                        dropped_turns: 0,
                        engine: LlmCounters::default(),
                        server: None,
                    });
                    let _ = a.reply.send(Heard::Done(r));
                }
            }
            Cmd::Shutdown => {}
            Cmd::Leave { slot, done } => {
                self.answering[slot] = None;
                // a sequence that cannot be cleared is not given to anyone else
                if self.engine.reset(slot).is_ok() {
                    if let Some(s) = lock(&self.shared.slots).get_mut(slot) {
                        *s = false;
                    }
                }
                let _ = done.send(());
            }
        }
    }

    fn step(&mut self) {
        let priority = if self.engine.prefilling() {
            Priority::Committed
        } else {
            Priority::Streaming
        };
        let lease = self.lease.as_ref().map(|l| l.acquire(priority));
        let meter = self.meter.enter(self.threads);
        let prefilled_before = self.engine.prefilled_tokens();
        let began = Instant::now();
        let result = self.engine.step();
        let busy = began.elapsed();
        let prefilled = self.engine.prefilled_tokens() - prefilled_before;
        drop(meter);
        drop(lease);
        let c = &self.shared.counters;
        c.busy_ns.fetch_add(nanos(busy), Ordering::Relaxed);
        c.steps.fetch_add(1, Ordering::Relaxed);
        if prefilled > 0 {
            c.prefill_tokens.fetch_add(prefilled, Ordering::Relaxed);
            c.prefill_busy_ns.fetch_add(nanos(busy), Ordering::Relaxed);
        }
        let events = match result {
            Ok(ev) => ev,
            Err(e) => {
                // the engine cancelled every turn in the batch
                let message = e.to_string();
                for a in self.answering.iter_mut().filter_map(Option::take) {
                    let _ = a
                        .reply
                        .send(Heard::Done(Err(LlmError::Failed(message.clone()))));
                }
                return;
            }
        };
        for ev in events {
            match ev {
                StepEvent::Token { session, piece } => {
                    c.tokens.fetch_add(1, Ordering::Relaxed);
                    if let Some(a) = self.answering[session].as_ref() {
                        let _ = a.reply.send(Heard::Token(piece));
                    }
                }
                StepEvent::Done {
                    session,
                    text,
                    n_sampled,
                    stop,
                } => {
                    if let Some(a) = self.answering[session].take() {
                        let _ = a.reply.send(Heard::Done(Ok(Response {
                            text,
                            n_prompt_tokens: a.n_prompt,
                            n_prefill_tokens: 0,
                            n_sampled,
                            n_streamed: n_sampled,
                            stop,
                            dropped_turns: 0,
                            engine: LlmCounters::default(),
                            server: None,
                        })));
                    }
                }
            }
        }
    }
}
