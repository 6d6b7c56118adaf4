//! Whose fault an error is: what the user gave, or the system.

/// Whose fault an error is. Every library error says ([`Fault::Input`]:
/// a file, a flag, a model the user gave; [`Fault::System`]: the machine,
/// an engine, a thread), so the binary picks its exit code (2 for the
/// user's input) without knowing any crate's variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// What the user gave is wrong: they can fix it (exit code 2).
    Input,
    /// The system failed: a runtime failure (exit code 3).
    System,
}

/// A failure the runtime injects into one stage's call on one utterance,
/// for chaos tests on the real binary: the runtime does it itself, around
/// the stage's call, so no stage is wrapped (a wrapper must forward every
/// hook of [`Stage`](crate::Stage), and one that forgets a hook silently
/// changes what the stage does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectedFault {
    /// Panic (true: the pipeline shuts down in order) or fail only the turn.
    pub panic: bool,
    /// The stage (by name) whose call fails.
    pub stage: String,
    /// The utterance on which it fails.
    pub id: crate::UtteranceId,
}

impl InjectedFault {
    /// Fails the call on `id` of the stage this fault names: a panic, or a
    /// turn error. `Ok` for every other call.
    ///
    /// # Errors
    /// The injected turn error.
    ///
    /// # Panics
    /// When the fault is a panic on this call (the runtime catches it as it
    /// catches a stage's own panic).
    pub(crate) fn strike(
        &self,
        stage: &str,
        id: Option<crate::UtteranceId>,
    ) -> Result<(), crate::StageError> {
        if stage != self.stage || id != Some(self.id) {
            return Ok(());
        }
        assert!(
            !self.panic,
            "injected panic in {stage} on utterance {}",
            self.id
        );
        Err(crate::StageError::turn(
            self.id,
            format!("injected error in {stage} on utterance {}", self.id),
        ))
    }
}
