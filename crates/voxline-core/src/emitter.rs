//! The emitter through which a stage sends its outputs, and the probe a
//! call polls to learn that its input was cancelled.

use std::time::{Duration, Instant};

use crate::cpu::{CpuLease, FreeCores, LeaseGuard, MeterGuard, Priority, ThreadMeter};
use crate::edge::EdgeSender;
use crate::event::{PipelineEvent, TimedEvent};
use crate::message::{Message, UtteranceId};
use crate::runtime::{EventBus, ShutdownHandle};
use crate::span::{Span, SpanKind};
use crate::spec::{SpecBoard, SpecState};

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
    /// The engine threads this call computes with (kept for its span after
    /// the meter stops counting them).
    threads: u32,
    /// For a stage without an engine in a pipeline whose engines take turns
    /// on the cores: their lease, and the meter their threads are counted on
    /// (see [`Emitter::free_cores`]).
    spare_cores: Option<(&'a CpuLease, &'a ThreadMeter)>,
    /// Whether the input of this call was cancelled.
    probe: CancelProbe,
}

/// How long a stopping run still waits on a call to something outside the
/// process (a remote server) to finish the turn in flight.
const OUTSIDE_WAIT_AFTER_STOP: std::time::Duration = std::time::Duration::from_secs(2);

/// Asks whether the input a call is working on was cancelled: its
/// speculative attempt was thrown away, or the run is being stopped and
/// calls in flight are cancelled. Cheap to clone; can be polled from an
/// engine's abort callback on any thread.
#[derive(Debug, Clone, Default)]
pub struct CancelProbe {
    board: Option<SpecBoard>,
    id: Option<UtteranceId>,
    stop: Option<ShutdownHandle>,
    barge: Option<crate::BargeIn>,
    /// The run's stop, whether or not it cancels calls in flight.
    stopping: Option<ShutdownHandle>,
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
        Self {
            board,
            id,
            stop,
            barge: None,
            stopping: None,
        }
    }

    /// The probe also tells when `stopping` was requested (see
    /// [`CancelProbe::outside_wait_over`]).
    #[must_use]
    pub fn with_stopping(mut self, stopping: Option<ShutdownHandle>) -> Self {
        self.stopping = stopping;
        self
    }

    /// Whether the run has been stopping for longer than a call that waits
    /// on something outside the process (a remote server) is still given:
    /// an orderly stop finishes the turn in flight, but not by waiting
    /// out a stalled server's timeouts (2 s more).
    #[must_use]
    pub fn outside_wait_over(&self) -> bool {
        self.stopping
            .as_ref()
            .or(self.stop.as_ref())
            .and_then(ShutdownHandle::requested_at)
            .is_some_and(|at| at.elapsed() >= OUTSIDE_WAIT_AFTER_STOP)
    }

    /// The probe also reads cancelled once the user barged in on the
    /// input's turn ([`crate::BargeIn`]).
    #[must_use]
    pub fn with_barge_in(mut self, barge: Option<crate::BargeIn>) -> Self {
        self.barge = barge;
        self
    }

    /// Whether the user barged in on this input's turn.
    #[must_use]
    pub fn is_interrupted(&self) -> bool {
        self.barge
            .as_ref()
            .zip(self.id)
            .is_some_and(|(b, id)| b.is_interrupted(id))
    }

    /// Whether this input was heard over an answer that is held until its
    /// words decide ([`crate::BargeIn::is_over_held`]): a recogniser marks
    /// a [`crate::backchannel`] in it as no turn.
    #[must_use]
    pub fn is_over_held_answer(&self) -> bool {
        self.barge
            .as_ref()
            .zip(self.id)
            .is_some_and(|(b, id)| b.is_over_held(id))
    }

    /// Whether `text`, heard in audio from `start` to `end`, is the
    /// assistant's own voice come back through the microphone
    /// ([`crate::BargeIn::is_echo`]); never without a voice that plays.
    #[must_use]
    pub fn is_echo(&self, text: &str, start: Instant, end: Instant) -> bool {
        self.barge
            .as_ref()
            .is_some_and(|b| b.is_echo(text, start, end))
    }

    /// How much `samples` (ending at `end`) sound like the assistant's
    /// voice as it played ([`crate::BargeIn::echo_likeness`]); `None`
    /// without a voice that played over them.
    #[must_use]
    pub fn echo_likeness(&self, samples: &[f32], end: Instant) -> Option<f32> {
        self.barge
            .as_ref()
            .and_then(|b| b.echo_likeness(samples, end))
    }

    /// Whether the work should stop now.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.stop.as_ref().is_some_and(ShutdownHandle::is_requested)
            || self.spec_state() == SpecState::Cancelled
            || self.is_interrupted()
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
    /// tests, or see [`drive`](crate::drive)).
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
            threads: 0,
            spare_cores: None,
            probe: CancelProbe::default(),
        }
    }

    /// Counts `threads` engine threads on `meter` while the call computes.
    pub(crate) fn with_meter(mut self, meter: &'a ThreadMeter, threads: usize) -> Self {
        if threads > 0 {
            self.meter = Some((meter, threads, Some(meter.enter(threads))));
        }
        self.threads = u32::try_from(threads).unwrap_or(u32::MAX);
        self
    }

    /// Lets the call use the engines' cores while they are free (see
    /// [`Emitter::free_cores`]).
    pub(crate) fn with_spare_cores(mut self, lease: &'a CpuLease, meter: &'a ThreadMeter) -> Self {
        self.spare_cores = Some((lease, meter));
        self
    }

    /// The engines' cores for `threads` threads of this call's work, if
    /// they are free right now: the CPU lease, taken without waiting (so no
    /// engine starts until the guard drops), with the threads counted on the
    /// meter. `None` when an engine holds or waits for them, when the
    /// engines own their threads (no lease), or for a stage that computes
    /// under the lease anyway: then the work should use one thread. For a
    /// stage that computes a little beside the engines (the end-of-turn
    /// model).
    #[must_use]
    pub fn free_cores(&self, threads: usize) -> Option<FreeCores> {
        let (lease, meter) = self.spare_cores?;
        let lease = lease.try_acquire(Priority::Committed)?;
        Some(FreeCores {
            _lease: lease,
            _meter: meter.enter(threads),
        })
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

    /// Runs `wait`, a wait on other stages' work (a stage that needs a
    /// result from downstream before it decides): its time counts as
    /// blocked, as a blocked send's does, not as this stage's busy time,
    /// and no engine threads are counted meanwhile.
    pub fn waiting<R>(&mut self, wait: impl FnOnce() -> R) -> R {
        self.pause_meter();
        let at = Instant::now();
        let r = wait();
        self.blocked += at.elapsed();
        self.resume_meter();
        r
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
        let id = item.utterance_id();
        // what an attempt was heard to say, for the endpointer's second
        // opinion while it waits on the pause (see `SpecBoard::words`)
        if let (Some(board), Some(id), Some(t)) = (&self.probe.board, id, item.transcript()) {
            board.note_words(id, &t.text);
        }
        // what was heard over the assistant's held answer resumes or stops it
        if let (Some(barge), Some(id), Some(t)) = (&self.probe.barge, id, item.transcript()) {
            barge.heard(id, &t.heard, &t.text);
        }
        // Published before the item is sent on: a downstream stage that
        // takes it at once and publishes what it made cannot get its event
        // onto the bus before this one (observers see events in causal
        // order, e.g. a stage's revised transcript after the STT's).
        if let Some(event) = self.bus.and_then(|_| item.event()) {
            if let Some(bus) = self.bus {
                bus.publish(TimedEvent { at, event });
            }
        }
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
        self.after_output();
    }

    /// Runs `work` (a model the stage consults on the side, say) on the
    /// runtime's clock: its result and how long it took, for the stage to
    /// report in an event. The call's own span times the whole call.
    pub fn timed<R>(&mut self, work: impl FnOnce() -> R) -> (R, Duration) {
        let at = Instant::now();
        let r = work();
        (r, at.elapsed())
    }

    /// Publishes a control event (not a message) on the event bus, stamped
    /// now; a no-op for an emitter without a bus (e.g. [`drive`](crate::drive)).
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
            threads: self.threads,
        }
    }
}
