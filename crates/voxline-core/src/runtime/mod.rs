//! The threaded runtime: runs each stage on its own thread, times it from
//! outside, turns errors and panics into events, and shuts down in order.
//!
//! Shutdown flows along the edges. When a stage's input edge disconnects
//! (every upstream sender gone, queue drained) the stage finishes, drops its
//! output sender and exits, so its downstream drains and finishes in turn.
//! When a stage fails fatally (a fatal [`StageError`] or a panic) it stops
//! consuming and drops its input receiver: upstream senders then see
//! [`Disconnected`](crate::Disconnected), their stages stop as well, and the
//! [`ShutdownHandle`] is raised so the source stops too. Downstream of the
//! failure, stages drain what they already have and finish.

mod bus;
mod shared;
mod worker;

use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use crossbeam_channel as cb;

pub use crate::cpu::CpuLease;
pub use bus::{DrainHandle, EventBus, EventReceiver, ShutdownHandle};

use crate::clock::Clock;
use crate::cpu::ThreadMeter;
use crate::edge::{EdgeReceiver, EdgeSender, EdgeStats, EdgeStatsSnapshot, Envelope};
use crate::event::{PipelineEvent, TimedEvent};
use crate::message::Message;
use crate::span::Span;
use crate::spec::SpecBoard;
use crate::stage::{Stage, StageError, StartError, StartStage};
use shared::{lock, Shared, SpanStore};
use worker::{panic_message, report_drops, run_sink, run_stage, StageContext};

/// The runtime could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The operating system refused a thread.
    #[error("could not start the thread of stage `{stage}`: {source}")]
    Spawn {
        /// The stage.
        stage: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A stage's start-up hook failed (or panicked) on its thread.
    #[error("stage `{stage}` could not start: {source}")]
    Start {
        /// The stage.
        stage: String,
        /// Why.
        #[source]
        source: StartError,
    },
}

/// What a finished run leaves behind.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Every span of every stage and sink, ordered by start (none when
    /// [`PipelineBuilder::observe_spans`] took them as they happened).
    pub spans: Vec<Span>,
    /// The counters of every edge the pipeline touched, in registration
    /// order.
    pub edges: Vec<EdgeStatsSnapshot>,
    /// The first fatal failure, if the run failed.
    pub failed: Option<String>,
    /// Events nobody read: all of them when [`Pipeline::events`] was never
    /// called, else none.
    pub events: Vec<TimedEvent>,
    /// When the last thread was joined.
    pub finished: Instant,
    /// How long the stages took to start on their threads (their start-up
    /// hooks, e.g. creating an engine context), together.
    pub startup: std::time::Duration,
}

impl RunOutcome {
    /// The spans of stage `name`.
    pub fn spans_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Span> + 'a {
        self.spans.iter().filter(move |s| s.stage == name)
    }

    /// The counters of edge `name`.
    #[must_use]
    pub fn edge(&self, name: &str) -> Option<&EdgeStatsSnapshot> {
        self.edges.iter().find(|e| e.name == name)
    }
}

/// Receives every span as it is recorded, from the stage threads (one call
/// at a time).
pub type SpanObserver = Box<dyn FnMut(Span) + Send>;

/// Configures a [`Pipeline`].
pub struct PipelineBuilder {
    clock: Clock,
    publish_messages: bool,
    cancel_queued: Option<ShutdownHandle>,
    cancel_calls: Option<ShutdownHandle>,
    drain: Option<DrainHandle>,
    board: Option<SpecBoard>,
    meter: ThreadMeter,
    observer: Option<SpanObserver>,
    barge: Option<crate::BargeIn>,
    fault: Option<crate::InjectedFault>,
}

impl std::fmt::Debug for PipelineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineBuilder")
            .field("clock", &self.clock)
            .field("publish_messages", &self.publish_messages)
            .field("cancel_queued", &self.cancel_queued)
            .field("cancel_calls", &self.cancel_calls)
            .field("speculation", &self.board.is_some())
            .field("observe_spans", &self.observer.is_some())
            .finish()
    }
}

impl PipelineBuilder {
    /// Whether every emitted message that has an event form (utterances,
    /// transcripts, tokens, completed turns) is published on the event bus,
    /// stamped with its emit instant. On by default.
    #[must_use]
    pub fn publish_messages(mut self, on: bool) -> Self {
        self.publish_messages = on;
        self
    }

    /// Once `stop` is requested, every stage discards the inputs still queued
    /// for it instead of processing them: an input that belongs to a turn ends
    /// that turn with a `TurnError` ("cancelled"), others vanish. Calls already
    /// running finish. For replay, where a Ctrl-C must not wait for every
    /// queued turn.
    #[must_use]
    pub fn cancel_queued_on(mut self, stop: ShutdownHandle) -> Self {
        self.cancel_queued = Some(stop);
        self
    }

    /// Once `drain` is requested, every stage drops the inputs of a turn
    /// that were queued for it before that moment: each such turn ends with
    /// a `TurnError` ("cancelled"). Inputs of no turn (audio frames, the
    /// end of a stream) still go through, so the stream ends in order, and
    /// what calls in flight send on after the moment is processed: the
    /// turns in flight finish. For a server stopping where it is.
    #[must_use]
    pub fn drain_on(mut self, drain: DrainHandle) -> Self {
        self.drain = Some(drain);
        self
    }

    /// Once `stop` is requested, the calls in flight are told their input
    /// was cancelled ([`Emitter::input_cancelled`](crate::Emitter::input_cancelled)):
    /// an answer streaming stops at its next token.
    #[must_use]
    pub fn cancel_calls_on(mut self, stop: ShutdownHandle) -> Self {
        self.cancel_calls = Some(stop);
        self
    }

    /// Speculative turns on `board` (see [`crate::spec`]), handled by the
    /// runtime for every stage: the input of a cancelled attempt is skipped;
    /// a pending attempt's call holds the CPU lease at
    /// [`Priority::Speculative`](crate::Priority::Speculative) and can ask
    /// whether it was cancelled meanwhile; what a stage did for an attempt
    /// is rolled back ([`Stage::rollback`]) or committed ([`Stage::commit`])
    /// once the endpointer decides; and a stage that takes committed input
    /// only ([`Stage::committed_only`]) never sees a pending attempt's input.
    #[must_use]
    pub fn speculation(mut self, board: SpecBoard) -> Self {
        self.board = Some(board);
        self
    }

    /// Barge-in ([`crate::BargeIn`]): once the user speaks over a turn's
    /// answer, every stage skips that turn's inputs still queued, a call
    /// working on it reads cancelled, and each stage hears of it
    /// ([`Stage::interrupted`]) before its next input.
    #[must_use]
    pub fn barge_in(mut self, barge: crate::BargeIn) -> Self {
        self.barge = Some(barge);
        self
    }

    /// Chaos tests: the runtime fails the call of the stage `fault` names on
    /// its utterance (a turn error, or a panic caught like a stage's own),
    /// instead of calling the stage. The stage itself is not wrapped, so
    /// every hook it has still runs as without the fault.
    #[must_use]
    pub fn inject_fault(mut self, fault: Option<crate::InjectedFault>) -> Self {
        self.fault = fault;
        self
    }

    /// Counts every stage's engine threads ([`Stage::threads`]) on `meter`
    /// while its calls compute (by default, a meter of the pipeline's own).
    #[must_use]
    pub fn meter(mut self, meter: ThreadMeter) -> Self {
        self.meter = meter;
        self
    }

    /// Hands every span to `observer` as it is recorded instead of keeping
    /// it for [`RunOutcome::spans`] (which is then empty): a session that
    /// runs for weeks keeps what it needs of them and no more. The observer
    /// runs on the stage threads, one call at a time; keep it short.
    #[must_use]
    pub fn observe_spans(mut self, observer: impl FnMut(Span) + Send + 'static) -> Self {
        self.observer = Some(Box::new(observer));
        self
    }

    /// Builds the pipeline; no thread runs yet.
    #[must_use]
    pub fn build(self) -> Pipeline {
        let (bus, events) = EventBus::new();
        let shared = Shared {
            spans: Mutex::new(match self.observer {
                Some(o) => SpanStore::Observe(o),
                None => SpanStore::Keep(Vec::new()),
            }),
            ..Shared::default()
        };
        Pipeline {
            clock: self.clock,
            shared: Arc::new(shared),
            bus,
            events,
            events_taken: false,
            publish_messages: self.publish_messages,
            cancel_queued: self.cancel_queued,
            cancel_calls: self.cancel_calls,
            drain: self.drain,
            board: self.board,
            meter: self.meter,
            barge: self.barge,
            fault: self.fault,
            threads: Vec::new(),
            edges: Vec::new(),
            startup: std::time::Duration::ZERO,
        }
    }
}

/// A running set of stages.
///
/// Build one with [`Pipeline::builder`], create the edges, start each stage
/// with [`Pipeline::spawn_stage`] and the consumers with
/// [`Pipeline::spawn_sink`], drive the source from your own thread (it pushes
/// into the first edge and watches [`Pipeline::shutdown_handle`]), drop the
/// source's sender at end of input, and [`Pipeline::join`].
#[derive(Debug)]
pub struct Pipeline {
    clock: Clock,
    shared: Arc<Shared>,
    bus: EventBus,
    events: EventReceiver,
    events_taken: bool,
    publish_messages: bool,
    cancel_queued: Option<ShutdownHandle>,
    cancel_calls: Option<ShutdownHandle>,
    drain: Option<DrainHandle>,
    board: Option<SpecBoard>,
    meter: ThreadMeter,
    barge: Option<crate::BargeIn>,
    fault: Option<crate::InjectedFault>,
    threads: Vec<(String, JoinHandle<()>)>,
    edges: Vec<Arc<EdgeStats>>,
    startup: std::time::Duration,
}

impl Pipeline {
    /// A builder for a pipeline on `clock`.
    #[must_use]
    pub fn builder(clock: Clock) -> PipelineBuilder {
        PipelineBuilder {
            clock,
            publish_messages: true,
            cancel_queued: None,
            cancel_calls: None,
            drain: None,
            board: None,
            meter: ThreadMeter::new(),
            observer: None,
            barge: None,
            fault: None,
        }
    }

    /// A pipeline on `clock` with default settings.
    #[must_use]
    pub fn new(clock: Clock) -> Self {
        Self::builder(clock).build()
    }

    /// The session clock.
    #[must_use]
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// The meter the stages' engine threads are counted on.
    #[must_use]
    pub fn meter(&self) -> ThreadMeter {
        self.meter.clone()
    }

    /// The flag the source must poll; raised when a stage fails, and by
    /// whoever handles Ctrl-C.
    #[must_use]
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shared.shutdown.clone()
    }

    /// A handle for publishing events (e.g. from the source). Drop it before
    /// waiting for the event stream to end.
    #[must_use]
    pub fn event_bus(&self) -> EventBus {
        self.bus.clone()
    }

    /// The event stream. Every event goes to exactly one reader, so take it
    /// once. The stream ends after [`Pipeline::join`] has dropped the
    /// runtime's handles and every [`Pipeline::event_bus`] clone is gone.
    /// Read it from a thread of your own: events are kept in memory until
    /// read.
    pub fn events(&mut self) -> EventReceiver {
        self.events_taken = true;
        self.events.clone()
    }

    /// Counts `stats` in the run's edge report (edges passed to
    /// [`Pipeline::spawn_stage`] and [`Pipeline::spawn_sink`] are counted
    /// already). Drops not reported by a consumer are published at join.
    pub fn register_edge(&mut self, stats: Arc<EdgeStats>) {
        if !self.edges.iter().any(|e| Arc::ptr_eq(e, &stats)) {
            self.edges.push(stats);
        }
    }

    fn context(&self, name: String) -> StageContext {
        let fault = self.fault.clone().filter(|f| f.stage == name);
        StageContext {
            name,
            shared: Arc::clone(&self.shared),
            bus: self.bus.clone(),
            publish_messages: self.publish_messages,
            lease: None,
            cancel_queued: self.cancel_queued.clone(),
            cancel_calls: self.cancel_calls.clone(),
            drain: self.drain.clone(),
            board: self.board.clone(),
            meter: self.meter.clone(),
            barge: self.barge.clone(),
            fault,
        }
    }

    fn spawn(
        &mut self,
        name: String,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), RuntimeError> {
        let handle = thread::Builder::new()
            .name(format!("voxline-{name}"))
            .spawn(body)
            .map_err(|source| RuntimeError::Spawn {
                stage: name.clone(),
                source,
            })?;
        self.threads.push((name, handle));
        Ok(())
    }

    /// The statistics of a registered edge, by name.
    #[must_use]
    pub fn edge_stats(&self, name: &str) -> Option<Arc<EdgeStats>> {
        self.edges.iter().find(|e| e.name() == name).cloned()
    }

    /// Runs a stage on its own thread, reading `input` and writing `output`.
    ///
    /// `stage` is a [`Stage`] that is [`Send`], or a [`StartStage`] that
    /// builds one: its [`StartStage::start`] runs on the new thread, and this
    /// waits for it (a start-up barrier), so a stage that cannot start is
    /// reported here, before any input is read.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Spawn`] when the thread cannot be started,
    /// [`RuntimeError::Start`] when the stage's start-up fails.
    pub fn spawn_stage<S: StartStage>(
        &mut self,
        stage: S,
        input: EdgeReceiver<<S::Stage as Stage>::In>,
        output: EdgeSender<<S::Stage as Stage>::Out>,
    ) -> Result<(), RuntimeError> {
        self.start_stage(stage, input, output, None)
    }

    fn start_stage<S: StartStage>(
        &mut self,
        starter: S,
        input: EdgeReceiver<<S::Stage as Stage>::In>,
        output: EdgeSender<<S::Stage as Stage>::Out>,
        lease: Option<CpuLease>,
    ) -> Result<(), RuntimeError> {
        self.register_edge(input.stats());
        self.register_edge(output.stats());
        let name = starter.stage_name().to_owned();
        let mut ctx = self.context(name.clone());
        ctx.lease = lease;
        let (ready_tx, ready_rx) = cb::bounded::<Result<(), StartError>>(1);
        let began = Instant::now();
        self.spawn(name.clone(), move || {
            let failed = match catch_unwind(AssertUnwindSafe(|| starter.start())) {
                Ok(Ok(stage)) => Ok(stage),
                Ok(Err(e)) => Err(e),
                Err(payload) => {
                    Err(format!("panicked: {}", panic_message(payload.as_ref())).into())
                }
            };
            let stage = match failed {
                Ok(stage) => stage,
                Err(e) => {
                    // the edges go first: whoever hears of the failure finds them closed
                    drop(input);
                    drop(output);
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            drop(ready_tx);
            run_stage(stage, &input, &output, &ctx);
        })?;
        let started = ready_rx
            .recv()
            .unwrap_or_else(|_| Err("its thread ended before it started".into()));
        self.startup += began.elapsed();
        started.map_err(|source| RuntimeError::Start {
            stage: name,
            source,
        })
    }

    /// Like [`spawn_stage`](Self::spawn_stage), but every call of the stage
    /// holds `lease` (see [`CpuLease`]); the wait for it counts as queue wait.
    /// A stage that says it is not [`leased`](Stage::leased) does not take
    /// it, but may compute on the cores while nobody holds it
    /// ([`Emitter::free_cores`](crate::Emitter::free_cores)).
    ///
    /// # Errors
    ///
    /// As [`spawn_stage`](Self::spawn_stage).
    pub fn spawn_stage_leased<S: StartStage>(
        &mut self,
        stage: S,
        input: EdgeReceiver<<S::Stage as Stage>::In>,
        output: EdgeSender<<S::Stage as Stage>::Out>,
        lease: CpuLease,
    ) -> Result<(), RuntimeError> {
        self.start_stage(stage, input, output, Some(lease))
    }

    /// Runs a consumer on its own thread: `sink` is called with every
    /// envelope of `input` until the edge disconnects. Its calls are spanned
    /// like a stage's; an error it returns is handled like a stage's.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Spawn`] when the thread cannot be started.
    pub fn spawn_sink<T, F>(
        &mut self,
        name: &str,
        input: EdgeReceiver<T>,
        sink: F,
    ) -> Result<(), RuntimeError>
    where
        T: Message,
        F: FnMut(Envelope<T>) -> Result<(), StageError> + Send + 'static,
    {
        self.register_edge(input.stats());
        let ctx = self.context(name.to_owned());
        self.spawn(name.to_owned(), move || run_sink(sink, &input, &ctx))
    }

    /// Waits for every stage and sink thread and returns what the run left.
    ///
    /// Call it after the source has dropped its sender of the first edge (or
    /// after [`ShutdownHandle::request`] made it do so); it cannot deadlock
    /// on the event bus, which is unbounded.
    #[must_use]
    pub fn join(self) -> RunOutcome {
        for (name, handle) in self.threads {
            if let Err(payload) = handle.join() {
                // A panic outside `process`/`finish`, e.g. in a stage's Drop.
                let message = format!("panicked: {}", panic_message(payload.as_ref()));
                self.bus.post(PipelineEvent::StageFailed {
                    stage: name.clone(),
                    message: message.clone(),
                });
                self.shared.fail(format!("stage `{name}` {message}"));
            }
        }
        for stats in &self.edges {
            report_drops(&self.bus, stats);
        }
        drop(self.bus);
        let events = if self.events_taken {
            Vec::new()
        } else {
            self.events.try_iter().collect()
        };
        let mut spans = match &mut *lock(&self.shared.spans) {
            SpanStore::Keep(v) => std::mem::take(v),
            SpanStore::Observe(_) => Vec::new(),
        };
        spans.sort_by_key(|s| s.started);
        RunOutcome {
            spans,
            edges: self.edges.iter().map(|e| e.snapshot()).collect(),
            failed: lock(&self.shared.failure).clone(),
            events,
            finished: Instant::now(),
            startup: self.startup,
        }
    }
}
