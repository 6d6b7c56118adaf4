//! The chat-backend trait the language-model stage is generic over.

use crate::{Checkpoint, LlmEngine, LlmError, Response};

/// What the language-model stage asks of an engine that answers a
/// conversation: llama.cpp in this process ([`LlmEngine`]), a client of the
/// batching worker shared by many conversations
/// ([`BatchClient`](crate::serving::BatchClient)), a remote server.
///
/// The stage, written once, gives every backend speculation (through
/// [`ChatBackend::checkpoint`] and [`ChatBackend::rollback`] where the
/// backend can, else by taking committed turns only), cancellation and the
/// pipeline's metrics. Timing is the runtime's: a backend reports what it
/// computed, never how long it took.
pub trait ChatBackend: 'static {
    /// A conversation state to return to ([`ChatBackend::checkpoint`]).
    type Checkpoint: Send;

    /// Answers `user` as the next turn of the conversation, calling
    /// `on_token` with each piece of text as it is produced; `on_token`
    /// returns `false` to stop (the answer then ends with
    /// [`Stop::Cancelled`](crate::Stop::Cancelled), at no further cost).
    ///
    /// # Errors
    /// The backend's failure; the turn fails, the conversation goes on.
    fn respond(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Response, LlmError>;

    /// As [`ChatBackend::respond`], for a backend that may wait on something
    /// outside the process (a server that stalls): `stop` is asked every
    /// few hundred milliseconds while no text comes, and once it says so
    /// the answer ends as cancelled. Default: [`ChatBackend::respond`],
    /// for a backend that produces every piece itself.
    ///
    /// # Errors
    /// As [`ChatBackend::respond`].
    fn respond_until(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
        stop: &dyn Fn() -> bool,
    ) -> Result<Response, LlmError> {
        let _ = stop;
        self.respond(user, on_token)
    }

    /// Whether the backend can return its conversation to a checkpoint. A
    /// backend that cannot answers committed turns only (the stage then
    /// takes committed input only, and a speculative attempt never reaches
    /// it). Default: `false`.
    fn can_roll_back(&self) -> bool {
        false
    }

    /// The conversation as it is now, to return to with
    /// [`ChatBackend::rollback`]; `None` where the backend cannot.
    fn checkpoint(&mut self) -> Option<Self::Checkpoint> {
        None
    }

    /// Returns the conversation to `checkpoint`, as if the turns answered
    /// since had never been.
    ///
    /// # Errors
    /// The backend's failure to return.
    fn rollback(&mut self, checkpoint: Self::Checkpoint) -> Result<(), LlmError> {
        let _ = checkpoint;
        Ok(())
    }

    /// Whether the backend computes on this thread (and the stage's calls
    /// take the pipeline's CPU lease). A client of a shared worker that
    /// takes the lease itself, or of a remote server, does not. Default: `true`.
    fn computes_here(&self) -> bool {
        true
    }

    /// Barge-in: the answer `back` turns before the last one remembered
    /// (0: the last) becomes `answer` (what the user heard of it, marked as
    /// interrupted), so the next turn follows what was said; nothing when
    /// fewer turns are remembered. Default: the backend keeps what it
    /// generated.
    fn amend_answer(&mut self, back: usize, answer: &str) {
        let _ = (back, answer);
    }

    /// Thread adaptation, where the backend can: moves to the threads the
    /// load allows now, before a turn, and returns how many of this
    /// process's threads the turn computes with (0 for a backend that
    /// computes elsewhere, or in a worker that counts its own).
    ///
    /// # Errors
    /// The backend's failure to move.
    fn adapt_threads(&mut self) -> Result<usize, LlmError> {
        Ok(0)
    }
}

impl ChatBackend for LlmEngine {
    type Checkpoint = Checkpoint;

    fn respond(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Response, LlmError> {
        LlmEngine::respond(self, user, on_token)
    }

    fn can_roll_back(&self) -> bool {
        true
    }

    fn checkpoint(&mut self) -> Option<Checkpoint> {
        Some(LlmEngine::checkpoint(self))
    }

    fn rollback(&mut self, checkpoint: Checkpoint) -> Result<(), LlmError> {
        LlmEngine::rollback(self, checkpoint)
    }

    fn amend_answer(&mut self, back: usize, answer: &str) {
        LlmEngine::amend_answer(self, back, answer);
    }

    /// 0 when the model is on the GPU: its 1 host thread is not the
    /// pipeline's CPU budget.
    fn adapt_threads(&mut self) -> Result<usize, LlmError> {
        let (batch, decode) = LlmEngine::adapt_threads(self)?;
        Ok(if self.model().gpu().is_some() {
            0
        } else {
            batch.max(decode)
        })
    }

    /// Not when the model is on the GPU: holding the CPU lease while the GPU
    /// computes would keep the cores from the engines that need them.
    fn computes_here(&self) -> bool {
        self.model().gpu().is_none()
    }
}
