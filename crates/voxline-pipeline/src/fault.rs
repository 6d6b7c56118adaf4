//! Fault injection for chaos tests.
//!
//! `VOXLINE_FAULT=KIND:STAGE:ID` makes stage `STAGE` (`stt` or `llm`) fail on
//! utterance `ID`: `KIND` is `panic` (the stage panics: the pipeline shuts
//! down in order, the report records the failure, exit code 3) or `error`
//! (the turn fails with an error event and the next turns go on). Unset, the
//! wrapper is a pass-through. It exists so the failure paths are tested on
//! the real binary with the real engines.

use voxline_core::{Emitter, Message, Stage, StageError, UtteranceId};

use crate::BadInput;

/// What to inject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// Panic (true) or return a turn error (false).
    pub panic: bool,
    /// The stage to fail.
    pub stage: String,
    /// The utterance to fail on.
    pub id: UtteranceId,
}

impl Fault {
    /// Reads `VOXLINE_FAULT`.
    ///
    /// # Errors
    /// [`BadInput`] when it is set but malformed.
    pub fn from_env() -> Result<Option<Self>, BadInput> {
        let Ok(spec) = std::env::var("VOXLINE_FAULT") else {
            return Ok(None);
        };
        let bad = || {
            BadInput(format!(
                "VOXLINE_FAULT={spec}: expected KIND:STAGE:ID, e.g. panic:stt:2 or error:llm:1"
            ))
        };
        let parts: Vec<&str> = spec.split(':').collect();
        let [kind, stage, id] = parts.as_slice() else {
            return Err(bad());
        };
        let panic = match *kind {
            "panic" => true,
            "error" => false,
            _ => return Err(bad()),
        };
        Ok(Some(Self {
            panic,
            stage: (*stage).to_string(),
            id: id.parse().map_err(|_| bad())?,
        }))
    }
}

/// A stage that fails as told, else does what `inner` does.
pub struct Faulty<S> {
    inner: S,
    fault: Option<Fault>,
}

impl<S: Stage> Faulty<S> {
    /// Wraps `inner`; the fault applies only if it names this stage.
    pub fn new(inner: S, fault: Option<Fault>) -> Self {
        let fault = fault.filter(|f| f.stage == inner.name());
        Self { inner, fault }
    }
}

impl<S: Stage> Stage for Faulty<S> {
    type In = S::In;
    type Out = S::Out;

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn process(&mut self, input: S::In, out: &mut Emitter<'_, S::Out>) -> Result<(), StageError> {
        if let (Some(f), Some(id)) = (&self.fault, input.utterance_id()) {
            if f.id == id {
                assert!(!f.panic, "injected panic in {} on utterance {id}", f.stage);
                return Err(StageError::turn(
                    id,
                    format!("injected error in {} on utterance {id}", f.stage),
                ));
            }
        }
        self.inner.process(input, out)
    }

    fn finish(&mut self, out: &mut Emitter<'_, S::Out>) -> Result<(), StageError> {
        self.inner.finish(out)
    }

    fn priority(&self, input: &S::In) -> voxline_core::Priority {
        self.inner.priority(input)
    }

    fn threads(&mut self) -> usize {
        self.inner.threads()
    }

    fn leased(&self) -> bool {
        self.inner.leased()
    }

    fn speculate(&mut self, id: voxline_core::UtteranceId) {
        self.inner.speculate(id);
    }

    fn rollback(&mut self, id: voxline_core::UtteranceId) -> Result<(), StageError> {
        self.inner.rollback(id)
    }

    fn commit(&mut self, id: voxline_core::UtteranceId) {
        self.inner.commit(id);
    }

    fn committed_only(&self) -> bool {
        self.inner.committed_only()
    }
}
