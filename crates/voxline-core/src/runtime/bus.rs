//! Where events are published, and the flag that stops the source.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel as cb;

use crate::event::{PipelineEvent, TimedEvent};

/// The receiving end of the event bus.
pub type EventReceiver = cb::Receiver<TimedEvent>;

/// Where the runtime (and anyone holding a clone) publishes
/// [`PipelineEvent`]s. Unbounded, so publishing never blocks a stage.
#[derive(Debug, Clone)]
pub struct EventBus {
    tx: cb::Sender<TimedEvent>,
}

impl EventBus {
    pub(super) fn new() -> (Self, EventReceiver) {
        let (tx, rx) = cb::unbounded();
        (Self { tx }, rx)
    }

    /// Publishes `event`, stamped now.
    pub fn post(&self, event: PipelineEvent) {
        self.publish(TimedEvent {
            at: Instant::now(),
            event,
        });
    }

    /// Publishes an already stamped event. If every reader is gone the event
    /// is discarded: events are a report, never back-pressure.
    pub fn publish(&self, event: TimedEvent) {
        // Only fails when every receiver is gone, which is no error here.
        let _ = self.tx.send(event);
    }
}

/// A flag the source polls to stop early (Ctrl-C, or a failed stage).
#[derive(Debug, Clone, Default)]
pub struct ShutdownHandle(Arc<std::sync::OnceLock<std::time::Instant>>);

impl ShutdownHandle {
    /// A new, lowered flag.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the source to stop (the first request's moment counts).
    pub fn request(&self) {
        let _ = self.0.set(std::time::Instant::now());
    }

    /// Whether a stop was asked for.
    #[must_use]
    pub fn is_requested(&self) -> bool {
        self.0.get().is_some()
    }

    /// When the stop was asked for, if it was.
    #[must_use]
    pub fn requested_at(&self) -> Option<std::time::Instant> {
        self.0.get().copied()
    }
}

/// A drain: once requested, the turns queued before that moment are
/// dropped, while calls in flight and what they send on still finish (a
/// server stopping "where it is").
#[derive(Debug, Clone, Default)]
pub struct DrainHandle(Arc<std::sync::OnceLock<std::time::Instant>>);

impl DrainHandle {
    /// A new drain, not requested.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Drains from now on (the first request's moment counts).
    pub fn request(&self) {
        let _ = self.0.set(std::time::Instant::now());
    }

    /// When the drain was requested, if it was.
    #[must_use]
    pub fn requested_at(&self) -> Option<std::time::Instant> {
        self.0.get().copied()
    }
}
