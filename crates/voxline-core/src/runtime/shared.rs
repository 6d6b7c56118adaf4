//! What every stage thread of a pipeline shares: the spans recorded and
//! the first failure.

use std::sync::Mutex;

use super::{ShutdownHandle, SpanObserver};
use crate::span::Span;

/// Where recorded spans go.
pub(super) enum SpanStore {
    /// Kept for the outcome.
    Keep(Vec<Span>),
    /// Handed over as they happen.
    Observe(SpanObserver),
}

impl Default for SpanStore {
    fn default() -> Self {
        Self::Keep(Vec::new())
    }
}

impl std::fmt::Debug for SpanStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Keep(v) => write!(f, "Keep({} spans)", v.len()),
            Self::Observe(_) => f.write_str("Observe"),
        }
    }
}

/// Spans and failure state shared by all stage threads.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) spans: Mutex<SpanStore>,
    pub(super) failure: Mutex<Option<String>>,
    pub(super) shutdown: ShutdownHandle,
}

pub(super) use crate::sync::lock;

impl Shared {
    pub(super) fn record(&self, span: Span) {
        match &mut *lock(&self.spans) {
            SpanStore::Keep(v) => v.push(span),
            SpanStore::Observe(o) => o(span),
        }
    }

    pub(super) fn fail(&self, message: String) {
        let mut failure = lock(&self.failure);
        if failure.is_none() {
            *failure = Some(message);
        }
        drop(failure);
        self.shutdown.request();
    }
}
