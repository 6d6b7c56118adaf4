//! The language-model stage, written once for every [`ChatBackend`]:
//! transcripts in, streamed tokens and completed turns out.

use voxline_core::{Emitter, Priority, Stage, StageError, Transcript, UtteranceId};

use crate::{ChatBackend, LlmCounters, LlmEngine, LlmModel, LlmOut, Stop, Token, TurnComplete};

/// The stage's name in the pipeline.
pub const STAGE_NAME: &str = "llm";

/// The stage's identity in the pipeline's topology.
pub const STAGE: voxline_core::StageId = voxline_core::StageId::new(STAGE_NAME);

/// The language-model stage for llama.cpp in this process, as it is handed
/// to the pipeline: a loaded model. It starts on the stage's own thread
/// ([`voxline_core::StartStage`]), where it creates the engine's context
/// and evaluates the system prompt; what runs is a [`RunningLlmStage`] over
/// an [`LlmEngine`].
#[derive(Debug)]
pub struct LlmStage {
    model: LlmModel,
    governor: Option<voxline_core::CpuGovernor>,
}

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
            governor: None,
        }
    }

    /// Each turn runs with the threads `governor` grants (see
    /// [`LlmEngine::set_governor`]).
    #[must_use]
    pub fn with_governor(mut self, governor: Option<voxline_core::CpuGovernor>) -> Self {
        self.governor = governor;
        self
    }
}

impl voxline_core::StartStage for LlmStage {
    type Stage = RunningLlmStage<LlmEngine>;

    fn stage_name(&self) -> &str {
        STAGE_NAME
    }

    /// Creates the engine's context here, on the stage's thread.
    fn start(self) -> Result<RunningLlmStage<LlmEngine>, voxline_core::StartError> {
        let mut engine = LlmEngine::new(self.model)?;
        engine.set_governor(self.governor)?;
        Ok(RunningLlmStage::new(engine))
    }
}

/// The language-model stage running on its thread, over backend `B`: one
/// [`Transcript`] in; its answer streamed out as [`LlmOut::Token`]s as they
/// come, then one [`LlmOut::Done`]. A transcript of no words (empty, or
/// only whisper's `[BLANK_AUDIO]`, `[Music]`, `(phone ringing)`: see
/// [`Transcript::is_non_speech`]) is answered with nothing, never sent to
/// the model; a backend failure becomes a turn error for that id.
///
/// What is not the stage's is the runtime's: it skips cancelled attempts,
/// calls [`Stage::speculate`] before a pending one (the stage keeps the
/// backend's checkpoint) and [`Stage::rollback`] or [`Stage::commit`] once
/// it is decided, holds the CPU lease and counts the threads. The stage
/// stops an answer at the next token when its input was cancelled or
/// downstream is gone, and lets more urgent work have the cores between
/// tokens.
pub struct RunningLlmStage<B: ChatBackend> {
    backend: B,
    /// Speculative turns answered and not yet decided, each with the
    /// conversation as it was before it (and the turns answered then).
    checkpoints: Vec<(UtteranceId, B::Checkpoint, Vec<UtteranceId>)>,
    /// The backend could not adapt its threads before this call.
    adapt_failed: Option<crate::LlmError>,
    /// The turns whose answers the conversation holds, oldest first (the
    /// last [`REMEMBERED`]): where a barge-in's amendment goes.
    answered: Vec<UtteranceId>,
    /// The answers amended for a barge-in (the last [`REMEMBERED`]), made
    /// again after a rollback to a conversation from before them.
    amended: Vec<(UtteranceId, String)>,
}

/// How many answered turns, and amendments, the stage keeps track of: an
/// interruption is heard of within a turn or two of its answer.
const REMEMBERED: usize = 16;

/// How an answer the user interrupted is kept in the conversation: what
/// was heard of it, marked.
#[must_use]
pub fn interrupted_answer(heard: &str) -> String {
    let heard = heard.trim();
    if heard.is_empty() {
        "[interrupted]".to_owned()
    } else {
        format!("{heard} [interrupted]")
    }
}

impl<B: ChatBackend> RunningLlmStage<B> {
    /// The stage over `backend`.
    #[must_use]
    pub fn new(backend: B) -> Self {
        Self {
            backend,
            checkpoints: Vec::new(),
            adapt_failed: None,
            answered: Vec::new(),
            amended: Vec::new(),
        }
    }

    /// The backend (e.g. to inspect the conversation).
    #[must_use]
    pub fn backend(&self) -> &B {
        &self.backend
    }
}

impl RunningLlmStage<LlmEngine> {
    /// The engine (e.g. to inspect the conversation).
    #[must_use]
    pub fn engine(&self) -> &LlmEngine {
        &self.backend
    }
}

impl<B: ChatBackend> Stage for RunningLlmStage<B> {
    type In = Transcript;
    type Out = LlmOut;

    fn name(&self) -> &str {
        STAGE_NAME
    }

    fn priority(&self, _: &Transcript) -> Priority {
        Priority::FirstToken
    }

    fn threads(&mut self) -> usize {
        match self.backend.adapt_threads() {
            Ok(n) => n,
            Err(e) => {
                self.adapt_failed = Some(e);
                0
            }
        }
    }

    fn leased(&self) -> bool {
        self.backend.computes_here()
    }

    fn committed_only(&self) -> bool {
        !self.backend.can_roll_back()
    }

    fn speculate(&mut self, id: UtteranceId) {
        if let Some(cp) = self.backend.checkpoint() {
            self.checkpoints.push((id, cp, self.answered.clone()));
        }
    }

    fn rollback(&mut self, id: UtteranceId) -> Result<(), StageError> {
        let Some(i) = self.checkpoints.iter().position(|(c, ..)| *c == id) else {
            return Ok(());
        };
        // what came after it is undone with it; its answer is gone, so an
        // interruption heard of it later amends nothing
        let (_, cp, answered) = self.checkpoints.swap_remove(i);
        self.checkpoints.retain(|(c, ..)| *c < id);
        self.answered = answered;
        self.backend.rollback(cp).map_err(|e| {
            StageError::fatal(format!("rolling back cancelled turn {id}: {e}")).caused_by(e)
        })?;
        // the conversation is as it was before `id`: amendments heard of
        // since, of the answers it still holds, are made again
        for (turn, kept) in &self.amended {
            if let Some(back) = self.answered.iter().rev().position(|a| a == turn) {
                self.backend.amend_answer(back, kept);
            }
        }
        Ok(())
    }

    fn commit(&mut self, id: UtteranceId) {
        self.checkpoints.retain(|(c, ..)| *c != id);
    }

    /// The user spoke over the answer to `id`: the conversation keeps what
    /// was heard of it ([`interrupted_answer`]), not what was generated.
    /// The interruption may be heard of after the next turn was answered
    /// (the words that stopped the voice went on to the language model at
    /// once): that answer stays, and the one before it is amended.
    fn interrupted(&mut self, id: UtteranceId, heard: &str) {
        let Some(back) = self.answered.iter().rev().position(|a| *a == id) else {
            return;
        };
        let kept = interrupted_answer(heard);
        self.backend.amend_answer(back, &kept);
        tracing::info!(turn = %id, back, kept = %kept, "the conversation keeps what was heard of the answer");
        self.amended.retain(|(t, _)| *t != id);
        self.amended.push((id, kept));
        if self.amended.len() > REMEMBERED {
            self.amended.remove(0);
        }
    }

    fn process(&mut self, t: Transcript, out: &mut Emitter<'_, LlmOut>) -> Result<(), StageError> {
        let id = t.id;
        if let Some(e) = self.adapt_failed.take() {
            return Err(StageError::turn(id, e.to_string()).caused_by(e));
        }
        if out.input_cancelled() {
            return Err(StageError::turn(
                id,
                "cancelled: the session was stopped before this turn was answered",
            ));
        }
        if t.is_non_speech() {
            // no words (silence, a tone, music): not a turn, nothing to answer
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
        // a stalled server is waited on only until the run stops: at once
        // where calls in flight are cancelled, else after a short grace
        let probe = out.cancel_probe();
        let stopped = || probe.is_cancelled() || probe.outside_wait_over();
        let r = self.backend.respond_until(
            &t.text,
            &mut |piece| {
                out.emit(LlmOut::Token(Token {
                    id,
                    index,
                    text: piece.to_string(),
                }));
                index += 1;
                // the answer streams: more urgent work (a committed turn's STT) goes first
                out.yield_cpu();
                !out.is_closed() && !out.input_cancelled()
            },
            &stopped,
        );
        if out.cancel_probe().spec_state() == voxline_core::SpecState::Cancelled {
            // what it produced is never shown; the runtime rolls the conversation back
            return Ok(());
        }
        let r = r.map_err(|e| StageError::turn(id, e.to_string()).caused_by(e))?;
        self.answered.push(id);
        if self.answered.len() > REMEMBERED {
            self.answered.remove(0);
        }
        let server = r.server.clone();
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
        if let Some(counts) = server {
            out.publish(voxline_core::PipelineEvent::engine_event(
                crate::ServerTurn { id, counts },
            ));
        }
        Ok(())
    }
}
