//! The loop of a stage or sink thread: receive, call, time, turn errors
//! and panics into events.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use super::shared::Shared;
use super::{CpuLease, EventBus, ShutdownHandle};
use crate::cpu::{Priority, ThreadMeter};
use crate::edge::{EdgeReceiver, EdgeSender, EdgeStats, Envelope, RecvTimeoutError};
use crate::event::PipelineEvent;
use crate::message::{Message, TurnError, UtteranceId};
use crate::span::{Span, SpanKind};
use crate::spec::{SpecBoard, SpecState};
use crate::stage::{CancelProbe, Emitter, Stage, StageError};

/// How often a commit gate holding an input looks at the board again.
const GATE_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Publishes a `Dropped` event for drops on `stats` not reported yet.
pub(super) fn report_drops(bus: &EventBus, stats: &EdgeStats) {
    let count = stats.take_unreported_drops();
    if count > 0 {
        bus.post(PipelineEvent::Dropped {
            edge: stats.name().to_owned(),
            count,
        });
    }
}

pub(super) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Whether a stage goes on after a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// What a stage thread needs besides its stage and edges.
pub(super) struct StageContext {
    pub(super) name: String,
    pub(super) shared: Arc<Shared>,
    pub(super) bus: EventBus,
    pub(super) publish_messages: bool,
    pub(super) lease: Option<CpuLease>,
    pub(super) cancel_queued: Option<ShutdownHandle>,
    /// Turns queued before this drain's moment are dropped.
    pub(super) drain: Option<super::DrainHandle>,
    /// Calls in flight stop (their probe reads cancelled) once this is requested.
    pub(super) cancel_calls: Option<ShutdownHandle>,
    /// Speculative attempts: skipped when cancelled, settled after.
    pub(super) board: Option<SpecBoard>,
    /// Engine threads computing now.
    pub(super) meter: ThreadMeter,
    /// Barge-in: interrupted turns are skipped and each stage hears of them.
    pub(super) barge: Option<crate::BargeIn>,
    /// Chaos tests: the call this fault names fails instead of running.
    pub(super) fault: Option<crate::InjectedFault>,
}

impl StageContext {
    fn bus_for_messages(&self) -> Option<&EventBus> {
        self.publish_messages.then_some(&self.bus)
    }

    /// Turns the result of one call into events and a decision.
    fn settle(
        &self,
        result: thread::Result<Result<(), StageError>>,
        input_id: Option<UtteranceId>,
    ) -> Flow {
        let stage = self.name.clone();
        match result {
            Ok(Ok(())) => Flow::Continue,
            Ok(Err(e)) if !e.fatal => {
                tracing::warn!(stage = %stage, error = %e.message, "turn failed");
                let event = match e.utterance.or(input_id) {
                    Some(id) => PipelineEvent::TurnError(TurnError {
                        id,
                        stage,
                        message: e.message,
                    }),
                    None => PipelineEvent::StageError {
                        stage,
                        message: e.message,
                    },
                };
                self.bus.post(event);
                Flow::Continue
            }
            Ok(Err(e)) => {
                tracing::error!(stage = %stage, error = %e.message, "stage failed");
                self.shared
                    .fail(format!("stage `{stage}` failed: {}", e.message));
                self.bus.post(PipelineEvent::StageFailed {
                    stage,
                    message: e.message,
                });
                Flow::Stop
            }
            Err(payload) => {
                let message = format!("panicked: {}", panic_message(payload.as_ref()));
                tracing::error!(stage = %stage, error = %message, "stage failed");
                self.shared.fail(format!("stage `{stage}` {message}"));
                self.bus.post(PipelineEvent::StageFailed { stage, message });
                Flow::Stop
            }
        }
    }
}

/// The speculative attempts a stage handled whose fate is not known yet.
#[derive(Default)]
struct Unsettled(Vec<UtteranceId>);

impl Unsettled {
    /// Rolls back the stage's cancelled attempts and commits its confirmed
    /// ones; pending ones stay.
    fn settle<S: Stage>(&mut self, stage: &mut S, board: &SpecBoard) -> Result<(), StageError> {
        let mut result = Ok(());
        self.0.retain(|&id| match board.state(id) {
            SpecState::Pending | SpecState::Released => true,
            SpecState::Cancelled => {
                if result.is_ok() {
                    result = stage.rollback(id);
                }
                false
            }
            SpecState::Committed | SpecState::Final => {
                stage.commit(id);
                false
            }
        });
        result
    }
}

/// Ends the waits for words on a board when dropped (see
/// [`SpecBoard::end_waits`]).
struct EndsWaits(SpecBoard);

impl Drop for EndsWaits {
    fn drop(&mut self) {
        self.0.end_waits();
    }
}

/// The loop of one stage thread. Returning drops nothing here; the caller's
/// closure drops the input receiver and output sender when it ends.
///
/// Around each call the runtime does what no stage does for itself: it
/// skips the input of a cancelled attempt, holds a pending one back from a
/// stage that takes committed input only, takes the CPU lease (a pending
/// attempt at [`Priority::Speculative`]), counts the engine's threads, times
/// the call, and afterwards rolls back or commits what the stage did for an
/// attempt.
pub(super) fn run_stage<S: Stage>(
    mut stage: S,
    input: &EdgeReceiver<S::In>,
    output: &EdgeSender<S::Out>,
    ctx: &StageContext,
) {
    // whoever waits for an attempt's words stops waiting once this stage
    // is gone, however it ends (a panic, a stop, the end of input)
    let _ends_waits = ctx.board.clone().map(EndsWaits);
    let bus = ctx.bus_for_messages();
    let gated = ctx.board.is_some() && stage.committed_only();
    let mut unsettled = Unsettled::default();
    // inputs held by the commit gate, in order
    let mut held: std::collections::VecDeque<Envelope<S::In>> = std::collections::VecDeque::new();
    let mut upstream_done = false;
    let mut barge_seen = 0usize;
    loop {
        let envelope = match next_input(input, &mut held, ctx.board.as_ref(), gated, upstream_done)
        {
            Next::Item(e) => e,
            Next::Wait => continue,
            Next::UpstreamDone => {
                upstream_done = true;
                continue;
            }
            Next::End => break,
        };
        if let Some(board) = &ctx.board {
            if let Err(e) = unsettled.settle(&mut stage, board) {
                if ctx.settle(Ok(Err(e)), None) == Flow::Stop {
                    return;
                }
            }
        }
        let id = envelope.item.utterance_id();
        if let Some(barge) = &ctx.barge {
            let (new, cursor) = barge.since(barge_seen);
            barge_seen = cursor;
            for (turn, heard) in new {
                stage.interrupted(turn, &heard);
            }
            if id.is_some_and(|id| barge.is_interrupted(id)) {
                // the user spoke over this turn: what is left of it is not wanted
                continue;
            }
        }
        let state = match (&ctx.board, id) {
            (Some(b), Some(id)) => b.state(id),
            _ => SpecState::Final,
        };
        if state == SpecState::Cancelled {
            // a thrown-away attempt: nothing of it is computed any more
            continue;
        }
        let drained = ctx
            .drain
            .as_ref()
            .and_then(super::DrainHandle::requested_at)
            .is_some_and(|at| id.is_some() && envelope.enqueued < at);
        if drained
            || ctx
                .cancel_queued
                .as_ref()
                .is_some_and(ShutdownHandle::is_requested)
        {
            if let Some(id) = id {
                if let Some(board) = &ctx.board {
                    board.note_done(id);
                }
                ctx.bus.post(PipelineEvent::TurnError(TurnError {
                    id,
                    stage: ctx.name.clone(),
                    message: "cancelled: the run was stopped before this turn was done".into(),
                }));
            }
            continue;
        }
        let pending = state == SpecState::Pending;
        // a released turn is computed as a committed one, but can still be undone
        let revocable = pending || state == SpecState::Released;
        if let (true, Some(id)) = (revocable, id) {
            stage.speculate(id);
            unsettled.0.push(id);
        }
        let depth = input.len();
        let threads = stage.threads();
        let probe = CancelProbe::new(ctx.board.clone(), id, ctx.cancel_calls.clone())
            .with_barge_in(ctx.barge.clone())
            .with_stopping(ctx.cancel_queued.clone());
        let mut out = Emitter::to_edge(output, bus).with_probe(probe);
        match ctx.lease.as_ref() {
            Some(lease) if stage.leased() => {
                let priority = if pending {
                    Priority::Speculative
                } else {
                    stage.priority(&envelope.item)
                };
                out = out.with_lease(lease, priority);
            }
            // a stage under the lease whose calls do not take it may still
            // compute on the cores while they are free
            Some(lease) => out = out.with_spare_cores(lease, &ctx.meter),
            None => {}
        }
        let mut out = out.with_meter(&ctx.meter, threads);
        if let (true, Some(id), Some(board)) = (revocable, id, &ctx.board) {
            // the lease is held: the call's own time starts
            board.note_working(id);
        }
        let started = Instant::now();
        report_drops(&ctx.bus, &input.stats());
        let result = catch_unwind(AssertUnwindSafe(|| match &ctx.fault {
            Some(f) => f
                .strike(&ctx.name, id)
                .and_then(|()| stage.process(envelope.item, &mut out)),
            None => stage.process(envelope.item, &mut out),
        }));
        let finished = Instant::now();
        out.release_lease();
        ctx.shared.record(out.span(
            &ctx.name,
            id,
            SpanKind::Process,
            envelope.enqueued,
            started,
            finished,
            depth,
        ));
        let closed = out.is_closed();
        // an attempt cancelled while it ran: of no use, whatever it returned
        let cancelled = revocable
            && id
                .zip(ctx.board.as_ref())
                .is_some_and(|(id, b)| b.is_cancelled(id));
        let result = match result {
            Ok(Err(e)) if cancelled && !e.fatal => Ok(Ok(())),
            other => other,
        };
        if let (true, Some(id), Some(board)) = (revocable, id, &ctx.board) {
            // whatever it emitted (its words are noted as they go out)
            board.note_done(id);
        }
        if ctx.settle(result, id) == Flow::Stop {
            return;
        }
        if let Some(board) = &ctx.board {
            if let Err(e) = unsettled.settle(&mut stage, board) {
                if ctx.settle(Ok(Err(e)), None) == Flow::Stop {
                    return;
                }
            }
        }
        if closed {
            tracing::debug!(stage = %ctx.name, "downstream gone; stopping");
            return;
        }
    }
    report_drops(&ctx.bus, &input.stats());
    if let Some(board) = &ctx.board {
        if let Err(e) = unsettled.settle(&mut stage, board) {
            ctx.settle(Ok(Err(e)), None);
        }
    }
    let started = Instant::now();
    let mut out = Emitter::to_edge(output, bus);
    let result = catch_unwind(AssertUnwindSafe(|| stage.finish(&mut out)));
    let finished = Instant::now();
    ctx.shared.record(out.span(
        &ctx.name,
        None,
        SpanKind::Finish,
        started,
        started,
        finished,
        0,
    ));
    ctx.settle(result, None);
    tracing::debug!(stage = %ctx.name, "finished");
}

/// What the stage loop does next.
enum Next<T> {
    /// Handle this input.
    Item(Envelope<T>),
    /// The commit gate holds inputs of a pending attempt: look again.
    Wait,
    /// Upstream is gone; held inputs may still be released.
    UpstreamDone,
    /// Nothing more will come.
    End,
}

/// The next input: straight from the edge, or (for a stage that takes
/// committed input only) through the commit gate, which hands inputs over
/// in order once their attempt is decided and drops a cancelled one's.
fn next_input<T: Message>(
    input: &EdgeReceiver<T>,
    held: &mut std::collections::VecDeque<Envelope<T>>,
    board: Option<&SpecBoard>,
    gated: bool,
    upstream_done: bool,
) -> Next<T> {
    let (Some(board), true) = (board, gated) else {
        return input.recv().map_or(Next::End, Next::Item);
    };
    // release what is decided, in order
    while let Some(head) = held.front() {
        match head.item.utterance_id().map(|id| board.state(id)) {
            // upstream is gone: an attempt it never decided is not a turn
            Some(SpecState::Pending) if upstream_done => {
                held.pop_front();
            }
            Some(SpecState::Pending) => break,
            Some(SpecState::Cancelled) => {
                held.pop_front();
            }
            _ => return held.pop_front().map_or(Next::Wait, Next::Item),
        }
    }
    if upstream_done {
        return Next::End;
    }
    let got = if held.is_empty() {
        input.recv().map_err(|_| RecvTimeoutError::Disconnected)
    } else {
        input.recv_timeout(GATE_POLL)
    };
    match got {
        Ok(e) => {
            let pending =
                e.item.utterance_id().map(|id| board.state(id)) == Some(SpecState::Pending);
            if held.is_empty() && !pending {
                Next::Item(e)
            } else {
                held.push_back(e);
                Next::Wait
            }
        }
        Err(RecvTimeoutError::Timeout) => Next::Wait,
        Err(RecvTimeoutError::Disconnected) => Next::UpstreamDone,
    }
}

pub(super) fn run_sink<T, F>(mut sink: F, input: &EdgeReceiver<T>, ctx: &StageContext)
where
    T: Message,
    F: FnMut(Envelope<T>) -> Result<(), StageError>,
{
    while let Ok(envelope) = input.recv() {
        let started = Instant::now();
        let depth = input.len();
        report_drops(&ctx.bus, &input.stats());
        let id = envelope.item.utterance_id();
        let enqueued = envelope.enqueued;
        let result = catch_unwind(AssertUnwindSafe(|| sink(envelope)));
        let finished = Instant::now();
        ctx.shared.record(Span {
            stage: ctx.name.clone(),
            utterance: id,
            kind: SpanKind::Process,
            enqueued,
            started,
            finished,
            emitted: 0,
            first_emit: None,
            last_emit: None,
            emit_blocked: std::time::Duration::ZERO,
            queue_depth_at_start: depth,
            threads: 0,
        });
        if ctx.settle(result, id) == Flow::Stop {
            return;
        }
    }
    report_drops(&ctx.bus, &input.stats());
}
