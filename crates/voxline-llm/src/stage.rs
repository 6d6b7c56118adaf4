//! The language-model stage: started on its own thread, where it makes its
//! engine; transcripts in, streamed tokens and completed turns out.

use crate::{Checkpoint, LlmCounters, LlmEngine, LlmModel, LlmOut, Stop, Token, TurnComplete};

/// The language-model stage as it is handed to the pipeline: a loaded
/// model and the stage's settings. It starts on the stage's own thread
/// ([`voxline_core::StartStage`]), where it creates the engine's context
/// and evaluates the system prompt; what runs is a [`RunningLlmStage`].
#[derive(Debug)]
pub struct LlmStage {
    model: LlmModel,
    cancel: Option<voxline_core::ShutdownHandle>,
    board: Option<voxline_core::SpecBoard>,
    meter: Option<voxline_core::ThreadMeter>,
    governor: Option<voxline_core::CpuGovernor>,
}

/// The stage's name in the pipeline.
pub const STAGE_NAME: &str = "llm";

/// The stage's identity in the pipeline's topology.
pub const STAGE: voxline_core::StageId = voxline_core::StageId::new(STAGE_NAME);

// The model and the stage as handed to the pipeline cross threads (the
// engine, which holds the context, does not: it is made on the stage's).
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    fn sent<T: Send>() {}
    shared::<LlmModel>();
    sent::<LlmStage>();
};

impl LlmStage {
    /// The stage for a loaded model.
    #[must_use]
    pub fn new(model: LlmModel) -> Self {
        Self {
            model,
            cancel: None,
            board: None,
            meter: None,
            governor: None,
        }
    }

    /// Counts the engine's threads on `meter` while it computes.
    #[must_use]
    pub fn with_meter(mut self, meter: voxline_core::ThreadMeter) -> Self {
        self.meter = Some(meter);
        self
    }

    /// Each turn runs with the threads `governor` grants (see
    /// [`LlmEngine::set_governor`]), counted on the meter.
    #[must_use]
    pub fn with_governor(mut self, governor: Option<voxline_core::CpuGovernor>) -> Self {
        self.governor = governor;
        self
    }

    /// Speculative turns on `board`: a cancelled one stops at the next token
    /// and the conversation (KV cache and history) returns to exactly what it
    /// was before it; one still pending when the next turn arrives is
    /// settled first.
    #[must_use]
    pub fn with_speculation(mut self, board: voxline_core::SpecBoard) -> Self {
        self.board = Some(board);
        self
    }

    /// Once `cancel` is requested, the answer in flight stops at the next
    /// token and queued turns end at once with a turn error ("cancelled").
    #[must_use]
    pub fn cancel_on(mut self, cancel: voxline_core::ShutdownHandle) -> Self {
        self.cancel = Some(cancel);
        self
    }
}

impl voxline_core::StartStage for LlmStage {
    type Stage = RunningLlmStage;

    fn stage_name(&self) -> &str {
        STAGE_NAME
    }

    /// Creates the engine's context here, on the stage's thread.
    fn start(self) -> Result<RunningLlmStage, voxline_core::StartError> {
        let mut engine = LlmEngine::new(self.model)?;
        engine.set_governor(self.governor)?;
        Ok(RunningLlmStage {
            engine,
            cancel: self.cancel,
            board: self.board,
            pending: None,
            meter: self.meter,
        })
    }
}

/// The language-model stage running on its thread: one
/// [`Transcript`](voxline_core::Transcript) in; its answer streamed out as
/// [`LlmOut::Token`]s as they decode, then one [`LlmOut::Done`]. An empty transcript is answered
/// with nothing (a turn with an empty response); an engine failure becomes a
/// turn error for that id.
pub struct RunningLlmStage {
    engine: LlmEngine,
    cancel: Option<voxline_core::ShutdownHandle>,
    board: Option<voxline_core::SpecBoard>,
    /// A speculative turn answered but not yet committed, with the
    /// conversation as it was before it.
    pending: Option<(voxline_core::UtteranceId, Checkpoint)>,
    meter: Option<voxline_core::ThreadMeter>,
}

impl RunningLlmStage {
    /// The engine (e.g. to inspect the conversation).
    #[must_use]
    pub fn engine(&self) -> &LlmEngine {
        &self.engine
    }

    fn spec_state(&self, id: voxline_core::UtteranceId) -> voxline_core::SpecState {
        self.board
            .as_ref()
            .map_or(voxline_core::SpecState::Final, |b| b.state(id))
    }

    /// Rolls back a speculative turn that was cancelled; forgets one that was committed.
    fn settle(&mut self) -> Result<(), voxline_core::StageError> {
        let Some((id, _)) = &self.pending else {
            return Ok(());
        };
        let state = self.spec_state(*id);
        if state == voxline_core::SpecState::Pending {
            return Ok(());
        }
        if let Some((id, cp)) = self.pending.take() {
            if state == voxline_core::SpecState::Cancelled {
                self.engine.rollback(cp).map_err(|e| {
                    voxline_core::StageError::fatal(format!(
                        "rolling back cancelled turn {id}: {e}"
                    ))
                    .caused_by(e)
                })?;
            }
        }
        Ok(())
    }

    fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(voxline_core::ShutdownHandle::is_requested)
    }
}

impl voxline_core::Stage for RunningLlmStage {
    type In = voxline_core::Transcript;
    type Out = LlmOut;

    fn name(&self) -> &str {
        STAGE_NAME
    }

    fn finish(
        &mut self,
        _out: &mut voxline_core::Emitter<'_, Self::Out>,
    ) -> Result<(), voxline_core::StageError> {
        self.settle()
    }

    fn priority(&self, t: &Self::In) -> voxline_core::Priority {
        if self.spec_state(t.id) == voxline_core::SpecState::Pending {
            voxline_core::Priority::Speculative
        } else {
            voxline_core::Priority::FirstToken
        }
    }

    fn process(
        &mut self,
        t: Self::In,
        out: &mut voxline_core::Emitter<'_, Self::Out>,
    ) -> Result<(), voxline_core::StageError> {
        let id = t.id;
        self.settle()?;
        if self.spec_state(id) == voxline_core::SpecState::Cancelled {
            return Ok(());
        }
        if self.spec_state(id) == voxline_core::SpecState::Pending {
            self.pending = Some((id, self.engine.checkpoint()));
        }
        if self.cancelled() {
            return Err(voxline_core::StageError::turn(
                id,
                "cancelled: the session was stopped before this turn was answered",
            ));
        }
        if t.text.trim().is_empty() {
            out.emit(LlmOut::Done(TurnComplete {
                id,
                transcript: t.text,
                response: String::new(),
                n_prompt_tokens: 0,
                n_generated: 0,
                engine: LlmCounters::default(),
                stop: Stop::EndOfGeneration,
                history_dropped: 0,
            }));
            return Ok(());
        }
        let mut index = 0u32;
        let cancel = self.cancel.clone();
        let board = self.board.clone();
        let spec_cancelled = || board.as_ref().is_some_and(|b| b.is_cancelled(id));
        let speculative = || {
            board
                .as_ref()
                .is_some_and(|b| b.state(id) == voxline_core::SpecState::Pending)
        };
        // the most this turn runs with (never more mid-answer)
        let (batch, decode) = self
            .engine
            .adapt_threads()
            .map_err(|e| voxline_core::StageError::turn(id, e.to_string()).caused_by(e))?;
        let threads = batch.max(decode);
        let meter = self.meter.clone();
        let mut running = meter.as_ref().map(|m| m.enter(threads));
        // the lease's priority changes only when the turn's state does
        let mut priority = None;
        let r = self.engine.respond(&t.text, &mut |piece| {
            // not computing while waiting for room downstream
            let waits = out.would_block();
            if waits {
                running = None;
            }
            out.emit(LlmOut::Token(Token {
                id,
                index,
                text: piece.to_string(),
            }));
            if waits {
                running = meter.as_ref().map(|m| m.enter(threads));
            }
            index += 1;
            // the answer streams: more urgent work (a committed turn's STT) goes first
            let now = if speculative() {
                voxline_core::Priority::Speculative
            } else {
                voxline_core::Priority::Streaming
            };
            if priority != Some(now) {
                out.set_priority(now);
                priority = Some(now);
            }
            if out.cpu_wanted() {
                // not computing while the urgent work runs
                running = None;
                out.yield_cpu();
                running = meter.as_ref().map(|m| m.enter(threads));
            }
            !out.is_closed()
                && !spec_cancelled()
                && !cancel
                    .as_ref()
                    .is_some_and(voxline_core::ShutdownHandle::is_requested)
        });
        drop(running);
        if spec_cancelled() {
            // what it produced is never shown; the conversation goes back now
            self.settle()?;
            return Ok(());
        }
        let r = r.map_err(|e| voxline_core::StageError::turn(id, e.to_string()).caused_by(e))?;
        out.emit(LlmOut::Done(TurnComplete {
            id,
            transcript: t.text,
            response: r.text,
            n_prompt_tokens: r.n_prompt_tokens,
            n_generated: r.n_sampled,
            engine: r.engine,
            stop: r.stop,
            history_dropped: r.dropped_turns,
        }));
        Ok(())
    }
}
