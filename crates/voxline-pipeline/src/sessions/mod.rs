//! Many conversations in one process, sharing the engines.
//!
//! A [`Hub`] loads whisper once and the language model once (or, for an
//! engine on a remote server, checks the server once). Each
//! [`Session`] is one conversation and one core pipeline, built from the
//! same topology and stage types as `replay` and `live`
//! ([`crate::pipeline::run_source_with`] on a [`Source::Pushed`]): its own
//! VAD, its own whisper decoding state on the shared weights
//! ([`SttEngine::share`]), an LLM stage whose backend is a client of the
//! one batching worker owning the context ([`BatchServer`]), plus any
//! stages added with [`Hub::with_stages`]. The runtime times every stage,
//! settles speculation and holds the CPU lease; the hub only hands the
//! shared engines out.
//!
//! With remote engines each session has its own client of the server (its
//! own conversation, sent whole each turn), and the hub counts the
//! sessions against its limit itself.
//!
//! One CPU budget: whisper and the LLM never compute at the same time (one
//! [`CpuLease`]); the LLM worker takes it per batched step, so a committed
//! transcription waits at most one step. Every engine call runs with the
//! whole budget's threads, counted on one meter.
//!
//! A session's events (the pipeline's, after its [`SpecGate`](voxline_core::SpecGate))
//! and its stages' spans go into a bounded queue ([`Observed`]): a reader
//! that stops reading loses items (counted in [`Session::dropped_events`])
//! and never stalls the other sessions or the engines.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TrySendError};
use voxline_audio::AudioError;
use voxline_core::{Clock, CpuLease, ShutdownHandle, Span, SpanKind, ThreadMeter, TimedEvent};
use voxline_llm::serving::{BatchServer, ServingOptions, ServingTotals};
use voxline_llm::LlmError;
use voxline_stt::{SttEngine, SttError, SttStage};

use crate::engines::{ChatStart, Stt};

use crate::pipeline::{self, Extras, Pace, Pushed, PushedAudio, RunOptions, Source};
use crate::settings::EngineSettings;
use crate::topology;

/// Audio a session queues before pushes are refused, in 16 kHz samples
/// (20 s, 1.3 MB): the session's pipeline is transcribing meanwhile. The
/// bound is in audio, not in messages, so that neither huge nor tiny
/// pushes change what a session holds.
pub const AUDIO_QUEUE_SAMPLES: u64 = 20 * voxline_core::SAMPLE_RATE as u64;

/// Pushes are gathered into blocks of at least this many samples (20 ms)
/// before they are queued: a client sending 1 ms frames costs the pipeline
/// no more messages than one sending 20 ms frames.
const MIN_BLOCK: usize = 320;

/// Items a session queues for its reader before it drops them.
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
    /// An audio stage failed to start.
    #[error(transparent)]
    Audio(#[from] AudioError),
    /// The pipeline's configuration has a value out of range.
    #[error("{0}")]
    Config(String),
    /// The operating system would not start a session's thread.
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The stages added to the sessions' pipeline do not fit in it.
    #[error("{0}")]
    Stages(String),
    /// A remote engine's server did not pass the start-up check.
    #[error(transparent)]
    Remote(#[from] crate::BadInput),
}

/// What a session's reader receives, in order of arrival: the pipeline's
/// events as a user may see them, and the spans the runtime recorded for
/// its turns (those of every stage but the VAD, whose spans are per frame).
#[derive(Debug, Clone)]
pub enum Observed {
    /// An event, after the speculation gate.
    Event(TimedEvent),
    /// A stage's call on one turn, as the runtime timed it.
    Span(Span),
}

/// One stage's work across every session.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StageBusy {
    /// The stage.
    pub stage: String,
    /// Time at least one session's call of it was running (the union of
    /// the calls' busy intervals, so sessions in parallel are not counted
    /// twice); for the LLM, the batching worker's compute.
    pub busy: Duration,
    /// Calls.
    pub calls: u64,
}

/// A snapshot of the hub's totals since it started.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HubTotals {
    /// Every stage of the topology that has run, in flow order.
    pub stages: Vec<StageBusy>,
    /// The batching worker's own counts (steps, tokens, prefill).
    pub llm: ServingTotals,
    /// Most engine threads that ever ran at once.
    pub peak_threads: usize,
}

impl HubTotals {
    /// Stage `name`'s figures (zero when it never ran).
    #[must_use]
    pub fn stage(&self, name: &str) -> StageBusy {
        self.stages
            .iter()
            .find(|s| s.stage == name)
            .cloned()
            .unwrap_or_else(|| StageBusy {
                stage: name.to_owned(),
                ..StageBusy::default()
            })
    }
}

/// The spans of every session, folded into per-stage totals as they come.
#[derive(Debug, Default)]
struct Load {
    /// Per stage: busy so far, calls, and the end of the latest interval counted.
    stages: BTreeMap<String, (Duration, u64, Option<Instant>)>,
}

impl Load {
    fn add(&mut self, s: &Span) {
        if s.kind != SpanKind::Process {
            return;
        }
        let e = self.stages.entry(s.stage.clone()).or_default();
        e.1 += 1;
        let from = e.2.map_or(s.started, |c| c.max(s.started));
        if s.finished > from {
            e.0 += s.finished - from;
            e.2 = Some(s.finished);
        }
    }
}

/// Builds the stages a session adds to the standard pipeline.
type StagesFn = Arc<dyn Fn() -> Extras + Send + Sync>;

/// The hub's speech to text: whisper's weights every session shares, or a
/// remote server.
enum HubStt {
    Whisper(Mutex<SttEngine>),
    Ct2(Mutex<voxline_ct2::Ct2Engine>),
    Remote(voxline_remote::RemoteStt),
}

/// The hub's language model: the batching worker every session is a client
/// of, or a remote server each session talks to on its own.
enum HubLlm {
    Batch(BatchServer),
    Remote {
        remotes: Box<crate::engines::Remotes>,
        settings: Box<EngineSettings>,
        slots: Arc<Mutex<Vec<bool>>>,
    },
}

/// A session's slot in a hub whose language model is remote, freed as it drops.
struct Slot {
    slots: Arc<Mutex<Vec<bool>>>,
    index: usize,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(s) = lock(&self.slots).get_mut(self.index) {
            *s = false;
        }
    }
}

/// Shared engines serving up to `max_sessions` conversations.
pub struct Hub {
    stt: HubStt,
    llm: HubLlm,
    /// What every conversation runs with.
    config: crate::pipeline::PipelineConfig,
    lease: CpuLease,
    meter: ThreadMeter,
    threads: usize,
    load: Arc<Mutex<Load>>,
    stages: StagesFn,
    /// The sessions' pipeline, for the order of its stages.
    topology: voxline_core::Topology,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

use voxline_core::sync::lock;

impl Hub {
    /// Loads both models once and starts the LLM worker, with one context
    /// of `max_sessions` KV sequences (each `engine.n_ctx` tokens, plus one
    /// for the system prompt). Every engine call gets the budget's
    /// `threads.total` threads.
    ///
    /// Every conversation runs `config` (the command line's, validated
    /// once), except that they always take turns on the hub's one CPU
    /// lease whatever its `cpu_share`.
    ///
    /// # Errors
    /// [`HubError::NoSessions`] for 0 sessions; [`HubError::Config`] for a
    /// configuration out of range; [`HubError::Stt`] or [`HubError::Llm`]
    /// when a model cannot be loaded.
    pub fn start(
        engine: &EngineSettings,
        config: crate::pipeline::PipelineConfig,
        max_sessions: usize,
    ) -> Result<Self, HubError> {
        if max_sessions == 0 {
            return Err(HubError::NoSessions);
        }
        config.validate().map_err(|e| HubError::Config(e.0))?;
        let threads = engine.threads.total.max(1);
        let remotes = crate::engines::connect(engine)?;
        let stt = match (remotes.stt(), engine.stt_config(), engine.ct2_config()) {
            (Some(remote), _, _) => HubStt::Remote(remote),
            (None, _, Some(mut ct2)) => {
                ct2.threads = threads;
                HubStt::Ct2(Mutex::new(voxline_ct2::Ct2Engine::load(ct2)?))
            }
            (None, Some(mut stt_config), None) => {
                stt_config.threads = threads;
                HubStt::Whisper(Mutex::new(SttEngine::load(stt_config)?))
            }
            (None, None, None) => {
                return Err(HubError::Stages(
                    "speech to text has neither a model nor a server".into(),
                ))
            }
        };
        let (lease, meter) = (CpuLease::new(), ThreadMeter::new());
        let llm = match engine.llm_config() {
            Some(mut llm_config) if remotes.llm.is_none() => {
                llm_config.threads = threads;
                llm_config.decode_threads = threads;
                HubLlm::Batch(BatchServer::start(
                    llm_config,
                    ServingOptions {
                        sessions: max_sessions,
                        lease: lease.clone(),
                        meter: meter.clone(),
                    },
                )?)
            }
            _ => HubLlm::Remote {
                remotes: Box::new(remotes),
                settings: Box::new(engine.clone()),
                slots: Arc::new(Mutex::new(vec![false; max_sessions])),
            },
        };
        Ok(Hub {
            stt,
            llm,
            config,
            lease,
            meter,
            threads,
            load: Arc::default(),
            stages: Arc::new(Extras::default),
            topology: topology::standard(topology::AudioEdge::Replay, 1),
        })
    }

    /// Every session's pipeline gets the stages `stages` makes (one set per
    /// session), as `replay` gets the same [`Extras`].
    ///
    /// # Errors
    /// [`HubError::Stages`] when an added stage's name is taken.
    pub fn with_stages(
        mut self,
        stages: impl Fn() -> Extras + Send + Sync + 'static,
    ) -> Result<Self, HubError> {
        self.topology = stages()
            .topology(topology::AudioEdge::Replay, 1)
            .map_err(|e| HubError::Stages(e.0))?;
        self.stages = Arc::new(stages);
        Ok(self)
    }

    /// Starts a conversation in a free slot.
    ///
    /// # Errors
    /// [`HubError::Full`] when every slot is taken; [`HubError::Stt`] when
    /// whisper cannot allocate the session's state; [`HubError::Thread`]
    /// when its pipeline cannot start.
    pub fn join(&self) -> Result<Session, HubError> {
        let (chat, slot, held) = match &self.llm {
            HubLlm::Batch(server) => {
                let client = server.client().map_err(|e| match e {
                    LlmError::Full { max } => HubError::Full { max },
                    e => HubError::Llm(e),
                })?;
                let slot = client.slot();
                (ChatStart::Shared(client), slot, None)
            }
            HubLlm::Remote {
                remotes,
                settings,
                slots,
            } => {
                let mut taken = lock(slots);
                let max = taken.len();
                let index = taken
                    .iter()
                    .position(|t| !*t)
                    .ok_or(HubError::Full { max })?;
                taken[index] = true;
                drop(taken);
                let held = Slot {
                    slots: Arc::clone(slots),
                    index,
                };
                let chat = remotes
                    .chat(settings)
                    .ok_or(HubError::Stages("no remote language model".into()))?;
                (ChatStart::Remote(chat), index, Some(held))
            }
        };
        // on failure the client (or the slot) leaves as it drops, and the slot is free again
        let stt = match &self.stt {
            HubStt::Whisper(e) => Stt::Whisper(lock(e).share()?),
            HubStt::Ct2(e) => Stt::Ct2(lock(e).share()?),
            HubStt::Remote(r) => Stt::Remote(r.clone()),
        };
        // unbounded in messages, bounded in samples (`queued`)
        let (audio_tx, audio_rx) = unbounded();
        let queued = Arc::new(AtomicU64::new(0));
        let (out_tx, out_rx) = bounded(EVENT_QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let reader = Reader {
            tx: out_tx,
            dropped: Arc::clone(&dropped),
        };
        let leaving = ShutdownHandle::new();
        let draining = voxline_core::DrainHandle::new();
        let spans = reader.clone();
        let load = Arc::clone(&self.load);
        let opts = RunOptions {
            pace: Pace::Realtime,
            gap_ms: 0,
            on_event: Some(Arc::new(move |ev: &TimedEvent| {
                reader.send(Observed::Event(ev.clone()));
            })),
            on_span: Some(Arc::new(move |s: &Span| {
                lock(&load).add(s);
                if s.utterance.is_some() && s.stage != topology::VAD.as_str() {
                    spans.send(Observed::Span(s.clone()));
                }
            })),
            cpu_share: crate::settings::CpuShare::Priority,
            lease: Some(self.lease.clone()),
            meter: self.meter.clone(),
            cancel_on_stop: true,
            drain: Some(draining.clone()),
            ..self.config.run_options()
        };
        let extras = (self.stages)();
        let stop = leaving.clone();
        let source = Source::Pushed(Pushed {
            audio: audio_rx.clone(),
            queued: Arc::clone(&queued),
        });
        let thread = std::thread::Builder::new()
            .name(format!("session-{slot}"))
            .spawn(move || {
                let run = pipeline::run_source_with(
                    source,
                    SttStage::new(stt),
                    chat,
                    extras,
                    &opts,
                    Some(stop),
                );
                if let Err(e) = run {
                    tracing::error!(session = slot, error = %e, "the session's pipeline did not start");
                }
                // a remote session's slot is free once its pipeline has ended
                drop(held);
            })
            .map_err(HubError::Thread)?;
        Ok(Session {
            slot,
            audio: Some(audio_tx),
            queue: audio_rx,
            queued,
            pending: Mutex::new(Vec::new()),
            ended: AtomicBool::new(false),
            draining,
            events: out_rx,
            dropped,
            refused: AtomicU64::new(0),
            leaving,
            thread: Some(thread),
        })
    }

    /// Sessions connected now.
    #[must_use]
    pub fn sessions(&self) -> usize {
        match &self.llm {
            HubLlm::Batch(b) => b.sessions(),
            HubLlm::Remote { slots, .. } => lock(slots).iter().filter(|t| **t).count(),
        }
    }

    /// The session limit.
    #[must_use]
    pub fn max_sessions(&self) -> usize {
        match &self.llm {
            HubLlm::Batch(b) => b.max_sessions(),
            HubLlm::Remote { slots, .. } => lock(slots).len(),
        }
    }

    /// The remote servers the engines run on, as `(stage, host:port)`.
    #[must_use]
    pub fn remote_servers(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let HubStt::Remote(r) = &self.stt {
            out.push((
                voxline_stt::STAGE_NAME,
                r.client().endpoint().server().to_owned(),
            ));
        }
        if let HubLlm::Remote { remotes, .. } = &self.llm {
            if let Some((c, _)) = &remotes.llm {
                out.push((voxline_llm::STAGE_NAME, c.endpoint().server().to_owned()));
            }
        }
        out
    }

    /// Totals since the hub started.
    #[must_use]
    pub fn totals(&self) -> HubTotals {
        let llm = match &self.llm {
            HubLlm::Batch(b) => Some(b.totals()),
            HubLlm::Remote { .. } => None,
        };
        let load = lock(&self.load);
        let mut stages: Vec<StageBusy> = load
            .stages
            .iter()
            .map(|(stage, (busy, calls, _))| StageBusy {
                stage: stage.clone(),
                busy: *busy,
                calls: *calls,
            })
            .collect();
        drop(load);
        let rank = |s: &str| {
            self.topology
                .stages()
                .iter()
                .position(|x| x.id == s)
                .unwrap_or(usize::MAX)
        };
        stages.sort_by_key(|s| rank(&s.stage));
        if let (Some(l), Some(worker)) = (
            stages
                .iter_mut()
                .find(|s| s.stage == topology::LLM.as_str()),
            &llm,
        ) {
            // the sessions' LLM calls wait on one worker: its compute is the stage's work
            l.busy = worker.busy;
        }
        HubTotals {
            stages,
            llm: llm.unwrap_or_default(),
            peak_threads: self.meter.peak(),
        }
    }

    /// Threads every engine call runs with.
    #[must_use]
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// What every conversation runs with.
    #[must_use]
    pub fn config(&self) -> &crate::pipeline::PipelineConfig {
        &self.config
    }
}

/// Where a session's items go.
#[derive(Clone)]
struct Reader {
    tx: Sender<Observed>,
    dropped: Arc<AtomicU64>,
}

impl Reader {
    /// Queues `item`; a full queue (a reader that stopped reading) drops it.
    fn send(&self, item: Observed) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(item) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One conversation on a [`Hub`]. Dropping it leaves: its transcription in
/// progress is aborted, its answer leaves the batch, and its slot is freed
/// for the next session to join.
pub struct Session {
    slot: usize,
    audio: Option<Sender<PushedAudio>>,
    /// The queue's other end, to empty it at shutdown.
    queue: Receiver<PushedAudio>,
    /// Samples queued and not yet played into the pipeline.
    queued: Arc<AtomicU64>,
    /// Pushed samples not yet a whole block.
    pending: Mutex<Vec<f32>>,
    /// The last thing queued was the end of a stream.
    ended: AtomicBool,
    /// Turns queued before it was requested are dropped.
    draining: voxline_core::DrainHandle,
    events: Receiver<Observed>,
    dropped: Arc<AtomicU64>,
    refused: AtomicU64,
    leaving: ShutdownHandle,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Queues 16 kHz mono samples captured just now. Never blocks: when the
    /// session already holds [`AUDIO_QUEUE_SAMPLES`] (its pipeline far
    /// behind), the block is refused and counted
    /// ([`Session::refused_blocks`]); returns whether it was taken. Blocks
    /// shorter than 20 ms are gathered until they make one.
    pub fn push(&self, samples: Vec<f32>) -> bool {
        let Some(tx) = &self.audio else {
            return false;
        };
        let n = samples.len() as u64;
        if self.queued.load(Ordering::SeqCst) + n > AUDIO_QUEUE_SAMPLES {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let mut pending = lock(&self.pending);
        pending.extend_from_slice(&samples);
        if pending.len() < MIN_BLOCK {
            return true;
        }
        let block = std::mem::take(&mut *pending);
        self.queued.fetch_add(block.len() as u64, Ordering::SeqCst);
        self.ended.store(false, Ordering::SeqCst);
        // the receiver lives as long as the session's pipeline; after it has
        // gone nothing is played anyway
        let _ = tx.send(PushedAudio::Samples(block, Instant::now()));
        true
    }

    /// The stream ends (the speaker is done): an open utterance is closed
    /// now instead of after the hangover. More audio may follow as a new
    /// stream. Never blocks; ends in a row count once.
    pub fn end_of_stream(&self) {
        let Some(tx) = &self.audio else {
            return;
        };
        let mut pending = lock(&self.pending);
        if !pending.is_empty() {
            let block = std::mem::take(&mut *pending);
            self.queued.fetch_add(block.len() as u64, Ordering::SeqCst);
            let _ = tx.send(PushedAudio::Samples(block, Instant::now()));
        } else if self.ended.load(Ordering::SeqCst) {
            return;
        }
        self.ended.store(true, Ordering::SeqCst);
        let _ = tx.send(PushedAudio::End);
    }

    /// Stops where it is (a server stopping): the audio queued that has
    /// not reached the VAD yet is dropped, the turns queued in front of the
    /// engines are cancelled (each a `cancelled` turn error), the stream
    /// ends; the turns in flight finish. Returns the samples dropped.
    pub fn discard_queued(&self) -> u64 {
        self.draining.request();
        let mut dropped = {
            let mut pending = lock(&self.pending);
            let n = pending.len() as u64;
            pending.clear();
            n
        };
        while let Ok(item) = self.queue.try_recv() {
            if let PushedAudio::Samples(block, _) = item {
                let n = block.len() as u64;
                self.queued.fetch_sub(n, Ordering::SeqCst);
                dropped += n;
            }
        }
        self.ended.store(false, Ordering::SeqCst);
        self.end_of_stream();
        dropped
    }

    /// The session's events and spans, in order of arrival.
    #[must_use]
    pub fn events(&self) -> &Receiver<Observed> {
        &self.events
    }

    /// Items dropped because the reader did not keep up.
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
        // what is queued is dropped, what runs is cancelled; the pipeline's
        // threads end, and its LLM client leaves the batch as it drops
        self.leaving.request();
        self.audio = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The wall time sample `sample` of a stream pushed at real-time pace from
/// `origin` was (or is) due.
#[must_use]
pub fn due(origin: Instant, sample: u64) -> Instant {
    origin + Clock::samples_to_duration(sample)
}
