//! The stage trait, its error type, and the emitter through which a stage
//! sends its outputs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cpu::{CpuLease, LeaseGuard, MeterGuard, Priority, ThreadMeter};
use crate::edge::EdgeSender;
use crate::event::{PipelineEvent, TimedEvent};
use crate::message::{Message, UtteranceId};
use crate::runtime::{EventBus, ShutdownHandle};
use crate::span::{Span, SpanKind};
use crate::spec::{SpecBoard, SpecState};

/// One step of the pipeline, run on its own thread by the
/// [`Pipeline`](crate::Pipeline).
///
/// A stage owns its engine and state. It does not time itself: the runtime
/// records a [`Span`] around every call. A stage that is [`Send`] is handed
/// to the runtime as it is; one that holds state bound to its thread (an
/// engine context) is built on that thread by a [`StartStage`].
pub trait Stage: 'static {
    /// What the stage consumes.
    type In: Message;
    /// What the stage produces.
    type Out: Message;

    /// A short, stable name, e.g. `"vad"`, `"stt"`, `"llm"`.
    fn name(&self) -> &str;

    /// Handles one input, emitting zero or more outputs through `out`.
    ///
    /// # Errors
    ///
    /// A non-fatal [`StageError`] fails only this input's turn (the runtime
    /// publishes a `TurnError` and goes on); a fatal one shuts the pipeline
    /// down.
    fn process(
        &mut self,
        input: Self::In,
        out: &mut Emitter<'_, Self::Out>,
    ) -> Result<(), StageError>;

    /// How urgent `input` is, for a stage that shares the cores under a
    /// [`CpuLease`](crate::CpuLease): the lease is taken at this priority
    /// before [`Stage::process`] runs. Default: [`Priority::Committed`].
    fn priority(&self, input: &Self::In) -> Priority {
        let _ = input;
        Priority::Committed
    }

    /// End of stream: flushes anything buffered (e.g. an open utterance).
    ///
    /// # Errors
    ///
    /// As [`Stage::process`].
    fn finish(&mut self, out: &mut Emitter<'_, Self::Out>) -> Result<(), StageError> {
        let _ = out;
        Ok(())
    }

    /// Engine threads the next call computes with, counted on the
    /// pipeline's [`ThreadMeter`] while it computes (not while it waits for
    /// room downstream or yields the cores). The runtime asks just before
    /// each call, so a stage whose engine follows the load adapts here.
    /// Default: 0 (no engine).
    fn threads(&mut self) -> usize {
        0
    }

    /// Whether the calls of a stage spawned under a
    /// [`CpuLease`](crate::CpuLease) take it. A stage whose engine computes
    /// elsewhere (a shared worker that takes the lease itself, a remote
    /// server) says no: holding the lease while it waits would keep the
    /// cores from the work it waits for. Default: `true`.
    fn leased(&self) -> bool {
        true
    }

    /// Speculation: the runtime is about to hand this stage the input of
    /// attempt `id`, whose turn is not confirmed yet. A stage with state
    /// that outlives a call (a conversation) remembers here what to return
    /// to. Default: nothing.
    fn speculate(&mut self, id: UtteranceId) {
        let _ = id;
    }

    /// Speculation: attempt `id`, which this stage handled, was cancelled;
    /// its state returns to what it was at [`Stage::speculate`]. Called by
    /// the runtime before the stage's next input (and at the end).
    ///
    /// # Errors
    ///
    /// As [`Stage::process`]; a failure to return is normally fatal.
    fn rollback(&mut self, id: UtteranceId) -> Result<(), StageError> {
        let _ = id;
        Ok(())
    }

    /// Speculation: attempt `id`, which this stage handled, was committed;
    /// what [`Stage::speculate`] kept may go.
    fn commit(&mut self, id: UtteranceId) {
        let _ = id;
    }

    /// Whether the stage takes committed input only: a stage with side
    /// effects (speech synthesis, playback) declares it, and the runtime
    /// holds each input of a pending attempt on the stage's input edge (a
    /// commit gate) until the attempt is committed (then hands it over) or
    /// cancelled (then drops it). Default: `false`.
    fn committed_only(&self) -> bool {
        false
    }
}

/// A boxed stage is a stage: lets a pipeline hold added stages of one
/// message type in a list.
impl<I: Message, O: Message> Stage for Box<dyn Stage<In = I, Out = O> + Send> {
    type In = I;
    type Out = O;

    fn name(&self) -> &str {
        (**self).name()
    }

    fn process(&mut self, input: I, out: &mut Emitter<'_, O>) -> Result<(), StageError> {
        (**self).process(input, out)
    }

    fn priority(&self, input: &I) -> Priority {
        (**self).priority(input)
    }

    fn finish(&mut self, out: &mut Emitter<'_, O>) -> Result<(), StageError> {
        (**self).finish(out)
    }

    fn threads(&mut self) -> usize {
        (**self).threads()
    }

    fn leased(&self) -> bool {
        (**self).leased()
    }

    fn speculate(&mut self, id: UtteranceId) {
        (**self).speculate(id);
    }

    fn rollback(&mut self, id: UtteranceId) -> Result<(), StageError> {
        (**self).rollback(id)
    }

    fn commit(&mut self, id: UtteranceId) {
        (**self).commit(id);
    }

    fn committed_only(&self) -> bool {
        (**self).committed_only()
    }
}

/// Why a stage could not start: the engine's own error, kept as the source.
pub type StartError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What the runtime moves onto a stage's thread and starts there, before the
/// stage's first input: [`StartStage::start`] runs on that thread, so state
/// that must not cross threads (a llama.cpp context) is created where it
/// lives. Every [`Send`] stage is its own starter; [`on_thread`] makes one
/// from a closure.
pub trait StartStage: Send + 'static {
    /// The stage that runs.
    type Stage: Stage;

    /// The stage's name (its thread's name, and the name in start errors).
    fn stage_name(&self) -> &str;

    /// Builds the stage, on its own thread.
    ///
    /// # Errors
    ///
    /// Whatever keeps the stage from starting; the runtime reports it from
    /// [`Pipeline::spawn_stage`](crate::Pipeline::spawn_stage) before any
    /// input is read.
    fn start(self) -> Result<Self::Stage, StartError>;
}

impl<S: Stage + Send> StartStage for S {
    type Stage = S;

    fn stage_name(&self) -> &str {
        self.name()
    }

    fn start(self) -> Result<S, StartError> {
        Ok(self)
    }
}

/// A [`StartStage`] made from a closure; see [`on_thread`].
pub struct OnThread<F, S> {
    name: String,
    build: F,
    stage: std::marker::PhantomData<fn() -> S>,
}

impl<F, S> std::fmt::Debug for OnThread<F, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnThread")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A starter that builds stage `name` by calling `build` on the stage's own
/// thread, e.g. to wrap a stage whose starter is not the stage itself.
#[must_use]
pub fn on_thread<F, S>(name: impl Into<String>, build: F) -> OnThread<F, S>
where
    S: Stage,
    F: FnOnce() -> Result<S, StartError> + Send + 'static,
{
    OnThread {
        name: name.into(),
        build,
        stage: std::marker::PhantomData,
    }
}

impl<F, S> StartStage for OnThread<F, S>
where
    S: Stage,
    F: FnOnce() -> Result<S, StartError> + Send + 'static,
{
    type Stage = S;

    fn stage_name(&self) -> &str {
        &self.name
    }

    fn start(self) -> Result<S, StartError> {
        (self.build)()
    }
}

/// The error behind a [`StageError`] (an engine's), kept as its source.
pub type StageErrorSource = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A stage's failure to handle an input.
///
/// Two stage errors are equal when they say the same (their sources are
/// compared by what they say too).
#[derive(Debug, Clone)]
pub struct StageError {
    /// The utterance whose turn failed; when `None`, the runtime uses the
    /// input's utterance.
    pub utterance: Option<UtteranceId>,
    /// What went wrong, for the user (the turn error's message).
    pub message: String,
    /// Whether the stage cannot go on: a fatal error shuts the pipeline down.
    pub fatal: bool,
    /// The error that caused this one, if any (see [`StageError::caused_by`]).
    pub source: Option<StageErrorSource>,
}

impl std::fmt::Display for StageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The source is the error itself, not the `Arc` that shares it, so it
/// downcasts to the engine's error type.
impl std::error::Error for StageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl PartialEq for StageError {
    fn eq(&self, other: &Self) -> bool {
        let said = |s: &Option<StageErrorSource>| s.as_ref().map(ToString::to_string);
        self.utterance == other.utterance
            && self.message == other.message
            && self.fatal == other.fatal
            && said(&self.source) == said(&other.source)
    }
}

impl Eq for StageError {}

impl StageError {
    /// A non-fatal error that fails the turn of utterance `id`.
    #[must_use]
    pub fn turn(id: UtteranceId, message: impl Into<String>) -> Self {
        Self {
            utterance: Some(id),
            message: message.into(),
            fatal: false,
            source: None,
        }
    }

    /// A non-fatal error that fails the current input's turn.
    #[must_use]
    pub fn recoverable(message: impl Into<String>) -> Self {
        Self {
            utterance: None,
            message: message.into(),
            fatal: false,
            source: None,
        }
    }

    /// A fatal error: the stage cannot go on and the pipeline shuts down.
    #[must_use]
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            utterance: None,
            message: message.into(),
            fatal: true,
            source: None,
        }
    }

    /// The same error, caused by `source` (an engine's error), which it
    /// keeps as its [`source`](std::error::Error::source); the message says
    /// what the user reads.
    #[must_use]
    pub fn caused_by(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The same error, attributed to utterance `id`.
    #[must_use]
    pub fn with_utterance(mut self, id: UtteranceId) -> Self {
        self.utterance = Some(id);
        self
    }
}

enum Target<'a, T> {
    Edge(&'a EdgeSender<T>),
    Buffer(&'a mut Vec<T>),
}

/// Where a stage puts its outputs; owned by the runtime, which records when
/// each output was emitted.
pub struct Emitter<'a, T> {
    target: Target<'a, T>,
    bus: Option<&'a EventBus>,
    emitted: u32,
    first_emit: Option<Instant>,
    last_emit: Option<Instant>,
    first_utterance: Option<UtteranceId>,
    blocked: Duration,
    closed: bool,
    /// The CPU lease this call holds, if the stage is leased (`None` inside
    /// while it is let go around a blocked send).
    lease: Option<(&'a CpuLease, Option<LeaseGuard>, Priority)>,
    /// The engine threads this call computes with, counted while it computes
    /// (`None` inside while it waits).
    meter: Option<(&'a ThreadMeter, usize, Option<MeterGuard>)>,
    /// Whether the input of this call was cancelled.
    probe: CancelProbe,
}

/// Asks whether the input a call is working on was cancelled: its
/// speculative attempt was thrown away, or the run is being stopped and
/// calls in flight are cancelled. Cheap to clone; can be polled from an
/// engine's abort callback on any thread.
#[derive(Debug, Clone, Default)]
pub struct CancelProbe {
    board: Option<SpecBoard>,
    id: Option<UtteranceId>,
    stop: Option<ShutdownHandle>,
}

impl CancelProbe {
    /// A probe for input `id` of a pipeline with speculation on `board`
    /// whose calls in flight are cancelled when `stop` is requested.
    #[must_use]
    pub fn new(
        board: Option<SpecBoard>,
        id: Option<UtteranceId>,
        stop: Option<ShutdownHandle>,
    ) -> Self {
        Self { board, id, stop }
    }

    /// Whether the work should stop now.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.stop.as_ref().is_some_and(ShutdownHandle::is_requested)
            || self.spec_state() == SpecState::Cancelled
    }

    /// Where the input's speculative attempt stands ([`SpecState::Final`]
    /// for an ordinary input).
    #[must_use]
    pub fn spec_state(&self) -> SpecState {
        match (&self.board, self.id) {
            (Some(b), Some(id)) => b.state(id),
            _ => SpecState::Final,
        }
    }
}

impl<'a, T: Message> Emitter<'a, T> {
    /// An emitter that sends to `output`, publishing each output's event (if
    /// it has one) on `bus`.
    #[must_use]
    pub fn to_edge(output: &'a EdgeSender<T>, bus: Option<&'a EventBus>) -> Self {
        Self::new(Target::Edge(output), bus)
    }

    /// An emitter that appends to `buffer`, for driving a stage by hand (in
    /// tests, or see [`drive`]).
    #[must_use]
    pub fn to_vec(buffer: &'a mut Vec<T>) -> Self {
        Self::new(Target::Buffer(buffer), None)
    }

    fn new(target: Target<'a, T>, bus: Option<&'a EventBus>) -> Self {
        Self {
            target,
            bus,
            emitted: 0,
            first_emit: None,
            last_emit: None,
            first_utterance: None,
            blocked: Duration::ZERO,
            closed: false,
            lease: None,
            meter: None,
            probe: CancelProbe::default(),
        }
    }

    /// Counts `threads` engine threads on `meter` while the call computes.
    pub(crate) fn with_meter(mut self, meter: &'a ThreadMeter, threads: usize) -> Self {
        if threads > 0 {
            self.meter = Some((meter, threads, Some(meter.enter(threads))));
        }
        self
    }

    /// The call's cancellation probe.
    pub(crate) fn with_probe(mut self, probe: CancelProbe) -> Self {
        self.probe = probe;
        self
    }

    /// Whether the input of this call was cancelled (its attempt thrown
    /// away, or the run stopped with calls in flight cancelled): a long call
    /// stops at its next step when it was.
    #[must_use]
    pub fn input_cancelled(&self) -> bool {
        self.probe.is_cancelled()
    }

    /// A probe an engine's abort callback can poll (see [`CancelProbe`]).
    #[must_use]
    pub fn cancel_probe(&self) -> CancelProbe {
        self.probe.clone()
    }

    /// Stops counting the call's engine threads (it waits).
    fn pause_meter(&mut self) {
        if let Some((_, _, guard)) = &mut self.meter {
            *guard = None;
        }
    }

    /// Counts the call's engine threads again (it computes).
    fn resume_meter(&mut self) {
        if let Some((meter, threads, guard)) = &mut self.meter {
            if guard.is_none() {
                *guard = Some(meter.enter(*threads));
            }
        }
    }

    /// Takes `lease` for the duration of the call. While a send would block
    /// on a full edge the lease is let go (the stage downstream may need it
    /// to make room) and taken back afterwards.
    pub(crate) fn with_lease(mut self, lease: &'a CpuLease, priority: Priority) -> Self {
        self.lease = Some((lease, Some(lease.acquire(priority)), priority));
        self
    }

    /// Changes how urgent the rest of this call is (e.g. from first token to
    /// streaming once an answer streams); no-op for a stage without a lease.
    pub fn set_priority(&mut self, priority: Priority) {
        if let Some((_, guard, p)) = &mut self.lease {
            *p = priority;
            if let Some(g) = guard {
                g.set_priority(priority);
            }
        }
    }

    /// Whether the next [`Emitter::emit`] would wait for room downstream.
    #[must_use]
    pub fn would_block(&self) -> bool {
        match &self.target {
            Target::Edge(tx) => tx.stats().capacity() <= tx.len(),
            Target::Buffer(_) => false,
        }
    }

    /// Whether more urgent work is waiting for the cores this call holds.
    #[must_use]
    pub fn cpu_wanted(&self) -> bool {
        match &self.lease {
            Some((lease, Some(_), p)) => lease.wanted_above(*p),
            _ => false,
        }
    }

    /// At a step boundary of long work (a token): if more urgent work waits
    /// for the cores, lets it run first. The wait is not counted as busy.
    pub fn yield_cpu(&mut self) {
        if !self.cpu_wanted() {
            return;
        }
        self.pause_meter();
        if let Some((_, Some(g), _)) = &mut self.lease {
            self.blocked += g.yield_to_urgent();
        }
        self.resume_meter();
    }

    /// Lets go of the lease and the meter (the call is over).
    pub(crate) fn release_lease(&mut self) {
        // the threads stop counting before another call can take the cores
        self.meter = None;
        self.lease = None;
    }

    /// After a call's first output it streams: a call that was on a turn's
    /// first output goes on at [`Priority::Streaming`], one on a speculative
    /// attempt that was committed meanwhile too.
    fn after_output(&mut self) {
        let now = match self.lease.as_ref().map(|l| l.2) {
            Some(Priority::FirstToken) => Priority::Streaming,
            Some(Priority::Speculative) if self.probe.spec_state() != SpecState::Pending => {
                Priority::Streaming
            }
            _ => return,
        };
        self.set_priority(now);
    }

    /// Sends `item` downstream and records the instant.
    ///
    /// On a blocking edge this waits while the downstream queue is full. If
    /// the downstream stage is gone, the item is discarded and the emitter
    /// becomes closed ([`Emitter::is_closed`]); the runtime then stops this
    /// stage too.
    pub fn emit(&mut self, item: T) {
        if self.closed {
            return;
        }
        let at = Instant::now();
        let event = self.bus.and_then(|_| item.event());
        let id = item.utterance_id();
        match &mut self.target {
            Target::Edge(tx) => {
                // Holding the CPU lease while waiting for room downstream would
                // deadlock with a downstream stage that needs the lease to drain.
                // Try first: only a send that really has to wait lets the lease
                // go (a check of the queue's length, then a send, would race
                // with other producers filling it in between).
                let sent = match tx.try_send_stamped(item, at) {
                    Ok(()) => Ok(()),
                    Err(crate::edge::TrySend::Disconnected) => Err(crate::edge::Disconnected),
                    Err(crate::edge::TrySend::Full(item)) => {
                        // not computing while waiting for room downstream
                        if let Some((_, _, guard)) = &mut self.meter {
                            *guard = None;
                        }
                        let lease = match &mut self.lease {
                            Some((lease, guard, p)) => {
                                *guard = None;
                                Some((*lease, *p))
                            }
                            None => None,
                        };
                        let sent = tx.send_stamped(item, at);
                        if let (Some((lease, p)), Some((_, guard, _))) = (lease, &mut self.lease) {
                            *guard = Some(lease.acquire(p));
                        }
                        if let Some((meter, threads, guard)) = &mut self.meter {
                            *guard = Some(meter.enter(*threads));
                        }
                        sent
                    }
                };
                if sent.is_err() {
                    self.closed = true;
                    return;
                }
                self.blocked += at.elapsed();
            }
            Target::Buffer(buffer) => buffer.push(item),
        }
        self.emitted = self.emitted.saturating_add(1);
        self.first_emit.get_or_insert(at);
        self.last_emit = Some(at);
        if self.first_utterance.is_none() {
            self.first_utterance = id;
        }
        if let (Some(bus), Some(event)) = (self.bus, event) {
            bus.publish(TimedEvent { at, event });
        }
        self.after_output();
    }

    /// Publishes a control event (not a message) on the event bus, stamped
    /// now; a no-op for an emitter without a bus (e.g. [`drive`]).
    pub fn publish(&mut self, event: PipelineEvent) {
        if let Some(bus) = self.bus {
            bus.post(event);
        }
    }

    /// Whether downstream has gone away; a long-running stage (e.g. one
    /// generating tokens) should stop early when it has.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Outputs emitted so far.
    #[must_use]
    pub fn emitted(&self) -> u32 {
        self.emitted
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn span(
        &self,
        stage: &str,
        utterance: Option<UtteranceId>,
        kind: SpanKind,
        enqueued: Instant,
        started: Instant,
        finished: Instant,
        queue_depth_at_start: usize,
    ) -> Span {
        Span {
            stage: stage.to_owned(),
            utterance: utterance.or(self.first_utterance),
            kind,
            enqueued,
            started,
            finished,
            emitted: self.emitted,
            first_emit: self.first_emit,
            last_emit: self.last_emit,
            emit_blocked: self.blocked,
            queue_depth_at_start,
        }
    }
}

/// Runs `stage` synchronously on `inputs`, then finishes it, returning every
/// output in order. For testing a stage without threads.
///
/// # Errors
///
/// The first error `process` or `finish` returns, fatal or not.
pub fn drive<S: Stage>(
    stage: &mut S,
    inputs: impl IntoIterator<Item = S::In>,
) -> Result<Vec<S::Out>, StageError> {
    let mut outputs = Vec::new();
    for input in inputs {
        stage.process(input, &mut Emitter::to_vec(&mut outputs))?;
    }
    stage.finish(&mut Emitter::to_vec(&mut outputs))?;
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test message: a piece of text of one turn.
    #[derive(Debug, Clone, PartialEq)]
    struct Token {
        id: UtteranceId,
        index: u32,
        text: String,
    }

    impl Message for Token {
        fn utterance_id(&self) -> Option<UtteranceId> {
            Some(self.id)
        }
    }

    /// Splits text into word tokens; flushes a count at the end.
    struct Words {
        seen: u32,
    }

    impl Stage for Words {
        type In = Token;
        type Out = Token;
        fn name(&self) -> &str {
            "words"
        }
        fn process(
            &mut self,
            input: Token,
            out: &mut Emitter<'_, Token>,
        ) -> Result<(), StageError> {
            if input.text.is_empty() {
                return Err(StageError::recoverable("empty text"));
            }
            for word in input.text.split_whitespace() {
                out.emit(Token {
                    id: input.id,
                    index: self.seen,
                    text: word.to_owned(),
                });
                self.seen += 1;
            }
            Ok(())
        }
        fn finish(&mut self, out: &mut Emitter<'_, Token>) -> Result<(), StageError> {
            out.emit(Token {
                id: u64::MAX,
                index: self.seen,
                text: format!("{} words", self.seen),
            });
            Ok(())
        }
    }

    fn tok(id: u64, text: &str) -> Token {
        Token {
            id,
            index: 0,
            text: text.into(),
        }
    }

    #[test]
    fn drive_runs_process_then_finish() {
        let mut stage = Words { seen: 0 };
        let out = drive(&mut stage, [tok(1, "hello there"), tok(2, "bye")]).unwrap();
        let texts: Vec<&str> = out.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(texts, ["hello", "there", "bye", "3 words"]);
        assert_eq!(out[2].id, 2);
        assert_eq!(out[2].index, 2);
    }

    #[test]
    fn drive_returns_the_stage_error() {
        let mut stage = Words { seen: 0 };
        let err = drive(&mut stage, [tok(1, "a"), tok(2, "")]).unwrap_err();
        assert_eq!(err.message, "empty text");
        assert!(!err.fatal);
        assert_eq!(err.clone().with_utterance(2).utterance, Some(2));
    }

    #[test]
    fn emitter_closes_when_downstream_is_gone() {
        let (tx, rx) = crate::edge::edge::<Token>("out", 1, crate::FullPolicy::Block);
        let mut out = Emitter::to_edge(&tx, None);
        out.emit(tok(1, "a"));
        assert_eq!(out.emitted(), 1);
        drop(rx);
        out.emit(tok(1, "b"));
        assert!(out.is_closed());
        assert_eq!(out.emitted(), 1);
    }

    #[test]
    fn error_constructors() {
        assert_eq!(StageError::turn(4, "bad").utterance, Some(4));
        assert!(StageError::fatal("gone").fatal);
        assert_eq!(StageError::fatal("gone").to_string(), "gone");
        let io = std::io::Error::other("disk full");
        let e = StageError::turn(4, "could not write: disk full").caused_by(io);
        let source = std::error::Error::source(&e);
        assert_eq!(
            source.map(ToString::to_string).as_deref(),
            Some("disk full")
        );
        assert!(source.is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()));
        assert_eq!(e.to_string(), "could not write: disk full");
        assert_ne!(e, StageError::turn(4, "could not write: disk full"));
        assert_eq!(e.clone(), e);
    }
}
