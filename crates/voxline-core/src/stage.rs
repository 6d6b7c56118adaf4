//! The stage trait, its error type, and the emitter through which a stage
//! sends its outputs.

use std::sync::Arc;

use crate::cpu::Priority;
use crate::message::{Message, UtteranceId};

pub use crate::emitter::{CancelProbe, Emitter};

/// One step of the pipeline, run on its own thread by the
/// [`Pipeline`](crate::Pipeline).
///
/// A stage owns its engine and state. It does not time itself: the runtime
/// records a [`Span`](crate::Span) around every call. A stage that is [`Send`] is handed
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
    /// pipeline's [`ThreadMeter`](crate::ThreadMeter) while it computes (not while it waits for
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
    /// cores from the work it waits for; so does a stage without an engine
    /// that computes a little only when the cores are free
    /// ([`Emitter::free_cores`](crate::Emitter::free_cores)).
    /// Default: `true`.
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

    /// Barge-in: the user spoke over turn `id`'s answer and heard `heard`
    /// of it ([`BargeIn`](crate::BargeIn)). Called by the runtime before the
    /// stage's next input; a stage with a conversation keeps only what was
    /// heard, one that speaks drops what is left of the turn. Default: nothing.
    fn interrupted(&mut self, id: UtteranceId, heard: &str) {
        let _ = (id, heard);
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

    fn interrupted(&mut self, id: UtteranceId, heard: &str) {
        (**self).interrupted(id, heard);
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
