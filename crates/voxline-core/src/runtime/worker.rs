//! The loop of a stage or sink thread: receive, call, time, turn errors
//! and panics into events.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use super::shared::Shared;
use super::{CpuLease, EventBus, ShutdownHandle};
use crate::edge::{EdgeReceiver, EdgeSender, EdgeStats, Envelope};
use crate::event::PipelineEvent;
use crate::message::{Message, TurnError, UtteranceId};
use crate::span::{Span, SpanKind};
use crate::stage::{Emitter, Stage, StageError};

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

/// The loop of one stage thread. Returning drops nothing here; the caller's
/// closure drops the input receiver and output sender when it ends.
pub(super) fn run_stage<S: Stage>(
    mut stage: S,
    input: &EdgeReceiver<S::In>,
    output: &EdgeSender<S::Out>,
    ctx: &StageContext,
) {
    let bus = ctx.bus_for_messages();
    while let Ok(envelope) = input.recv() {
        if ctx
            .cancel_queued
            .as_ref()
            .is_some_and(ShutdownHandle::is_requested)
        {
            if let Some(id) = envelope.item.utterance_id() {
                ctx.bus.post(PipelineEvent::TurnError(TurnError {
                    id,
                    stage: ctx.name.clone(),
                    message: "cancelled: the run was stopped before this turn was done".into(),
                }));
            }
            continue;
        }
        let depth = input.len();
        let mut out = Emitter::to_edge(output, bus);
        if let Some(lease) = &ctx.lease {
            out = out.with_lease(lease, stage.priority(&envelope.item));
        }
        let started = Instant::now();
        report_drops(&ctx.bus, &input.stats());
        let id = envelope.item.utterance_id();
        let result = catch_unwind(AssertUnwindSafe(|| stage.process(envelope.item, &mut out)));
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
        if ctx.settle(result, id) == Flow::Stop {
            return;
        }
        if closed {
            tracing::debug!(stage = %ctx.name, "downstream gone; stopping");
            return;
        }
    }
    report_drops(&ctx.bus, &input.stats());
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
        });
        if ctx.settle(result, id) == Flow::Stop {
            return;
        }
    }
    report_drops(&ctx.bus, &input.stats());
}
