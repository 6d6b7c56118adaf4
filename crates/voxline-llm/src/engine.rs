//! The engine: a llama.cpp context made from a loaded model, and the
//! conversation in its KV cache.

use std::num::NonZeroU32;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

use crate::model::{backend, piece_bytes, render_chat, tokenize_with};
use crate::{LlmConfig, LlmCounters, LlmError, LlmModel, Sampling, Stop, Utf8Stream};

/// The conversation at one moment (see [`LlmEngine::checkpoint`]).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    cached: Vec<LlamaToken>,
    history: Vec<(String, String)>,
}

/// One turn's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The answer text.
    pub text: String,
    /// Tokens of the rendered prompt.
    pub n_prompt_tokens: u32,
    /// Prompt tokens that had to be evaluated (the rest came from the cache).
    pub n_prefill_tokens: u32,
    /// Tokens sampled, the end-of-generation token included.
    pub n_sampled: u32,
    /// Tokens streamed as text (end-of-generation excluded).
    pub n_streamed: u32,
    /// Why generation stopped.
    pub stop: Stop,
    /// Turns of history dropped to fit the context.
    pub dropped_turns: u32,
    /// llama.cpp's counts for this turn.
    pub engine: LlmCounters,
    /// What a remote server reported (`None` for an engine in this process).
    pub server: Option<crate::ServerCounts>,
}

/// An engine's llama.cpp contexts, borrowing the model they were made from.
struct Contexts<'a> {
    /// The context the engine computes with.
    ctx: LlamaContext<'a>,
    /// The context used before the last thread change, with its threads.
    spare: Option<((usize, usize), LlamaContext<'a>)>,
}

self_cell::self_cell!(
    /// A model and the contexts made from it (they borrow it).
    struct Session {
        owner: LlmModel,
        #[covariant]
        dependent: Contexts,
    }
);

/// A language model's context and conversation, made from an [`LlmModel`].
///
/// The llama.cpp context is bound to the thread that created it: an engine
/// is neither [`Send`] nor [`Sync`]. In the pipeline, [`LlmStage`] makes it
/// on the stage's own thread.
pub struct LlmEngine {
    /// The model (the session's owner too: a cheap handle, kept apart so it
    /// can be read while a context is written).
    model: LlmModel,
    session: Session,
    /// Tokens whose KV is in the cache, in order (sequence 0).
    cached: Vec<LlamaToken>,
    /// Completed turns: (user, assistant).
    history: Vec<(String, String)>,
    batch: LlamaBatch<'static>,
    /// Threads the context computes with now: (prompt batches, single tokens).
    threads_now: (usize, usize),
    /// Grants the threads each turn runs with (the cores other processes leave free).
    governor: Option<voxline_core::CpuGovernor>,
}

impl std::fmt::Debug for LlmEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmEngine")
            .field("config", self.config())
            .field("cached_tokens", &self.cached.len())
            .finish_non_exhaustive()
    }
}

impl LlmEngine {
    /// Loads the model ([`LlmModel::load`]) and makes an engine from it
    /// ([`LlmEngine::new`]), on this thread.
    ///
    /// # Errors
    /// As [`LlmModel::load`] and [`LlmEngine::new`].
    pub fn load(config: LlmConfig) -> Result<Self, LlmError> {
        Self::new(LlmModel::load(config)?)
    }

    /// Creates a context for `model` on this thread and evaluates the system
    /// prompt once, so every turn starts from its cached KV.
    ///
    /// # Errors
    /// [`LlmError::Load`] when llama.cpp cannot create the context,
    /// [`LlmError::Engine`] when the system prompt cannot be evaluated.
    pub fn new(model: LlmModel) -> Result<Self, LlmError> {
        let threads_now = model.context_threads();
        let session = Session::try_new(model.clone(), |m| {
            Ok::<_, LlmError>(Contexts {
                ctx: new_context(m.llama(), m.config(), threads_now)?,
                spare: None,
            })
        })?;
        let mut engine = Self {
            model,
            session,
            cached: Vec::new(),
            history: Vec::new(),
            batch: LlamaBatch::new(512, 1),
            threads_now,
            governor: None,
        };
        let model = engine.model.clone();
        engine.prefill(&model.0.system_tokens)?;
        let config = model.config();
        if config.cache_prompt {
            engine.prefill_next_opening(config.n_ctx.saturating_sub(config.max_tokens) as usize);
        }
        Ok(engine)
    }

    /// The settings this engine runs with.
    #[must_use]
    pub fn config(&self) -> &LlmConfig {
        self.model.config()
    }

    /// The model this engine was made from.
    #[must_use]
    pub fn model(&self) -> &LlmModel {
        &self.model
    }

    /// The context the engine computes with.
    fn ctx(&self) -> &LlamaContext<'_> {
        &self.session.borrow_dependent().ctx
    }

    /// Threads the engine computes with now: (prompt batches, single tokens).
    #[must_use]
    pub fn threads(&self) -> (usize, usize) {
        self.threads_now
    }

    /// Computes prompt batches on `batch` threads and single tokens on
    /// `decode` threads from now on. llama.cpp fixes a context's threads
    /// when it is made, so a change makes a new context and moves the whole
    /// state into it (KV cache, logits). Making a context takes tens of
    /// milliseconds, so the one left is kept for a move back, which costs
    /// only the state copy. Returns whether the threads changed.
    ///
    /// # Errors
    /// [`LlmError::Config`] for 0 threads, [`LlmError::Load`] when llama.cpp
    /// cannot make the new context, [`LlmError::Engine`] when the state does
    /// not move whole.
    pub fn set_threads(&mut self, batch: usize, decode: usize) -> Result<bool, LlmError> {
        if batch == 0 || decode == 0 {
            return Err(LlmError::Config(
                "the language model needs at least one thread".into(),
            ));
        }
        if (batch, decode) == self.threads_now {
            return Ok(false);
        }
        let size = self.ctx().get_state_size();
        let mut state = vec![0u8; size];
        // SAFETY (FFI: llama.cpp's state copy): `state` holds
        // `get_state_size()` bytes, the most llama.cpp writes for this
        // context (its documented requirement).
        #[allow(unsafe_code)]
        let written = unsafe { self.ctx().copy_state_data(state.as_mut_ptr()) };
        if written > size {
            return Err(LlmError::Failed(format!(
                "moving the context: {written} bytes of state written into {size}"
            )));
        }
        state.truncate(written);
        let threads_now = self.threads_now;
        self.session.with_dependent_mut(|model, contexts| {
            let mut ctx = match contexts.spare.take() {
                Some((threads, ctx)) if threads == (batch, decode) => ctx,
                other => {
                    contexts.spare = other;
                    new_context(model.llama(), model.config(), (batch, decode))?
                }
            };
            // SAFETY (FFI: llama.cpp's state restore): `state` is exactly what
            // `copy_state_data` wrote for a context of the same model and
            // parameters (only the thread counts differ), the format
            // llama.cpp reads back.
            #[allow(unsafe_code)]
            let read = unsafe { ctx.set_state_data(&state) };
            if read != written {
                return Err(LlmError::Failed(format!(
                    "moving the context: {read} of {written} bytes of state read back"
                )));
            }
            let previous = std::mem::replace(&mut contexts.ctx, ctx);
            // kept for a move back (load comes and goes): reading a state replaces
            // everything a context holds, so its stale cache does no harm
            contexts.spare = Some((threads_now, previous));
            Ok(())
        })?;
        self.threads_now = (batch, decode);
        Ok(true)
    }

    /// Follows the threads `governor` grants, for prompt batches and single
    /// tokens alike (instead of the configured counts): a turn runs with what
    /// [`LlmEngine::adapt_threads`] took before it, and an answer moves to
    /// fewer threads at the next token when other processes take cores (a
    /// ggml thread sharing its core with another process stalls its
    /// siblings at every barrier). It never moves to more threads within a
    /// turn, so the threads counted when a turn starts are its most.
    ///
    /// With a governor, the context for one thread (where a loaded machine
    /// sends the engine) is made now, beside the current one, so memory
    /// does not step up hours into a session when load first appears, and
    /// the first move costs only the state copy.
    ///
    /// # Errors
    /// [`LlmError::Load`] when llama.cpp cannot make that context.
    pub fn set_governor(
        &mut self,
        governor: Option<voxline_core::CpuGovernor>,
    ) -> Result<(), LlmError> {
        if self.model.gpu().is_some() {
            // on the GPU: the CPU's load does not slow it, and its 1 thread stays
            return Ok(());
        }
        let one = (1, 1);
        if governor.is_some() && self.threads_now != one {
            self.session.with_dependent_mut(|model, contexts| {
                if contexts.spare.is_none() {
                    let ctx = new_context(model.llama(), model.config(), one)?;
                    contexts.spare = Some((one, ctx));
                }
                Ok::<(), LlmError>(())
            })?;
        }
        self.governor = governor;
        Ok(())
    }

    /// Moves to the threads the governor grants now (none set: the
    /// configured ones stay) and returns them; call it before a turn.
    ///
    /// # Errors
    /// As [`LlmEngine::set_threads`].
    pub fn adapt_threads(&mut self) -> Result<(usize, usize), LlmError> {
        self.follow_governor(true)?;
        Ok(self.threads_now)
    }

    /// The threads the governor grants now, moving the context to them when
    /// they differ and `more_allowed` or they are fewer.
    fn follow_governor(&mut self, more_allowed: bool) -> Result<(), LlmError> {
        let Some(g) = &self.governor else {
            return Ok(());
        };
        let t = g.threads();
        if more_allowed || t < self.threads_now.0.max(self.threads_now.1) {
            self.set_threads(t, t)?;
        }
        Ok(())
    }

    /// Tokens of the rendered system prompt.
    #[must_use]
    pub fn system_prompt_tokens(&self) -> usize {
        self.model.0.system_tokens.len()
    }

    /// Tokens whose KV is currently cached.
    #[must_use]
    pub fn cached_tokens(&self) -> usize {
        self.cached.len()
    }

    /// Completed turns remembered.
    #[must_use]
    pub fn history_len(&self) -> usize {
        self.history.len()
    }

    /// Replaces the answer `back` turns before the last (0: the last) with
    /// `answer` (barge-in: what the user heard of it); nothing when the
    /// conversation remembers fewer turns. The next turn's prompt then
    /// differs from the cache from that answer on, and only that is
    /// evaluated again.
    pub fn amend_answer(&mut self, back: usize, answer: &str) {
        let Some(i) = self.history.len().checked_sub(back + 1) else {
            return;
        };
        answer.clone_into(&mut self.history[i].1);
    }

    /// Forgets the conversation (the system prompt stays cached).
    pub fn reset_conversation(&mut self) {
        self.history.clear();
    }

    /// The conversation as it is now, to return to with [`LlmEngine::rollback`].
    #[must_use]
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            cached: self.cached.clone(),
            history: self.history.clone(),
        }
    }

    /// Returns the conversation to `cp`: the history exactly as it was, and
    /// the KV cache trimmed to the longest prefix it still shares with what
    /// was cached then (normally all of it: a turn only appends). Whatever
    /// is missing is evaluated again by the next turn.
    ///
    /// # Errors
    /// [`LlmError::Engine`] when llama.cpp refuses to trim the cache.
    pub fn rollback(&mut self, cp: Checkpoint) -> Result<(), LlmError> {
        let keep = self
            .cached
            .iter()
            .zip(&cp.cached)
            .take_while(|(a, b)| a == b)
            .count();
        self.trim_cache(keep)?;
        self.history = cp.history;
        Ok(())
    }

    /// After the oldest turns were dropped from `remembered` to fit the
    /// context: removes their tokens from the KV cache and shifts every
    /// later token back into place (llama.cpp re-rotates the cached keys),
    /// so the turns that stay are not evaluated again — without this, the
    /// whole remaining history was re-evaluated at every turn once the
    /// context was full (seconds per turn on one thread). The shifted
    /// entries were computed while the dropped turns were still there, the
    /// approximation llama.cpp's own context shift makes. Nothing happens
    /// when the cache does not line up with the new prompt.
    fn shift_out_dropped(
        &mut self,
        remembered: &[(String, String)],
        prompt: &[LlamaToken],
    ) -> Result<(), LlmError> {
        let rendered = |h: &[(String, String)]| -> Result<usize, LlmError> {
            Ok(self.tokenize(&self.render(h, None)?)?.len())
        };
        let dropped = remembered.len() - self.history.len();
        let Some(d) = rendered(remembered)?.checked_sub(rendered(&remembered[dropped..])?) else {
            return Ok(());
        };
        let shared = |a: &[LlamaToken], b: &[LlamaToken]| {
            a.iter().zip(b).take_while(|(x, y)| x == y).count()
        };
        let at = shared(&self.cached, prompt);
        if d == 0
            || at + d >= self.cached.len()
            || shared(&self.cached[at + d..], &prompt[at..]) == 0
        {
            return Ok(());
        }
        let pos = |p: usize| u32::try_from(p).unwrap_or(u32::MAX);
        self.session.with_dependent_mut(|_, c| {
            c.ctx
                .clear_kv_cache_seq(Some(0), Some(pos(at)), Some(pos(at + d)))
                .map_err(|e| LlmError::engine("context shift", e))?;
            c.ctx
                .kv_cache_seq_add(
                    0,
                    Some(pos(at + d)),
                    None,
                    -i32::try_from(d).unwrap_or(i32::MAX),
                )
                .map_err(|e| LlmError::engine("context shift", e))
        })?;
        self.cached.drain(at..at + d);
        Ok(())
    }

    /// Drops the cached KV (and its tokens) from position `keep` on.
    fn trim_cache(&mut self, keep: usize) -> Result<(), LlmError> {
        if keep < self.cached.len() {
            let p0 = u32::try_from(keep).unwrap_or(u32::MAX);
            self.session
                .with_dependent_mut(|_, c| c.ctx.clear_kv_cache_seq(Some(0), Some(p0), None))
                .map_err(|e| LlmError::engine("trimming the KV cache", e))?;
            self.cached.truncate(keep);
        }
        Ok(())
    }

    /// The remembered turns, oldest first: (user, assistant).
    #[must_use]
    pub fn history(&self) -> &[(String, String)] {
        &self.history
    }

    fn render(&self, history: &[(String, String)], user: Option<&str>) -> Result<String, LlmError> {
        let m = &self.model.0;
        render_chat(&m.model, &m.template, &m.config, history, user)
    }

    fn tokenize(&self, text: &str) -> Result<Vec<LlamaToken>, LlmError> {
        tokenize_with(self.model.llama(), text)
    }

    /// Evaluates the batch as it is now.
    fn decode_batch(&mut self, what: &'static str) -> Result<(), LlmError> {
        let batch = &mut self.batch;
        self.session
            .with_dependent_mut(|_, c| c.ctx.decode(batch))
            .map_err(|e| LlmError::engine(what, e))
    }

    /// Evaluates `tokens` after what is cached, in batches; logits for the last one.
    fn prefill(&mut self, tokens: &[LlamaToken]) -> Result<(), LlmError> {
        let n = tokens.len();
        for (c, chunk) in tokens.chunks(512).enumerate() {
            self.batch.clear();
            for (i, &t) in chunk.iter().enumerate() {
                let pos = i32::try_from(self.cached.len()).unwrap_or(i32::MAX);
                let last = c * 512 + i + 1 == n;
                self.batch
                    .add(t, pos, &[0], last)
                    .map_err(|e| LlmError::engine("batching a prompt", e))?;
                self.cached.push(t);
            }
            self.decode_batch("prefill")?;
        }
        // Wait for the evaluation to finish so llama.cpp books it now (its
        // counters are updated on synchronisation, not on submission).
        if n > 0 {
            let _ = self.ctx().get_logits_ith(self.batch.n_tokens() - 1);
        }
        Ok(())
    }

    /// Evaluates now, while nobody waits, what the next turn's prompt starts
    /// with: the conversation so far and the template's opening of a user
    /// message (`<|im_end|>`, `<|im_start|>user` and the line break, for
    /// ChatML). The next turn then evaluates only the user's words and the
    /// assistant's opening before its first token. Skipped where the prefix
    /// would not fit the prompt's budget (the next turn drops history, and
    /// evaluates again anyway). A failure here costs the next turn only
    /// this time: the cache is trimmed back to what it shares with the
    /// prefix, and the next turn evaluates the rest.
    fn prefill_next_opening(&mut self, budget: usize) {
        // a marker no transcript holds, to find where the user's words would start
        const MARK: &str = "\u{2063}voxline:next-user\u{2063}";
        let opening = match self.render(&self.history, Some(MARK)) {
            Ok(text) => match text.find(MARK) {
                Some(at) => self.tokenize(&text[..at]),
                None => return,
            },
            Err(e) => Err(e),
        };
        let tokens = match opening {
            Ok(t) if t.len() < budget => t,
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, "the next turn's opening was not evaluated ahead");
                return;
            }
        };
        let keep = self
            .cached
            .iter()
            .zip(&tokens)
            .take_while(|(a, b)| a == b)
            .count();
        if keep == tokens.len() {
            return;
        }
        let done = self
            .trim_cache(keep)
            .and_then(|()| self.prefill(&tokens[keep..]));
        if let Err(e) = done {
            tracing::debug!(error = %e, "the next turn's opening was not evaluated ahead");
            let _ = self.trim_cache(keep);
        }
    }

    /// Answers `user`, calling `on_token` with each piece of text as it is
    /// decoded; `on_token` returns `false` to stop early.
    ///
    /// The prompt keeps `max_tokens` of the context free for the answer,
    /// dropping the oldest turns of history while it does not. A prompt that
    /// takes more than that even without history is answered in the room
    /// left, and the answer stops with [`Stop::ContextFull`] when the
    /// context is full.
    ///
    /// # Errors
    /// [`LlmError::ContextFull`] when the prompt leaves no room for an
    /// answer even without history, [`LlmError::Engine`] when evaluation
    /// fails.
    pub fn respond(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Response, LlmError> {
        let handle = self.model.clone();
        let config = handle.config();
        let budget = (config.n_ctx - config.max_tokens) as usize;
        let mut dropped_turns = 0u32;
        if !config.memory {
            self.history.clear();
        }
        let remembered = self.history.clone();
        let prompt = loop {
            let text = self.render(&self.history, Some(user))?;
            let tokens = self.tokenize(&text)?;
            if tokens.len() <= budget {
                break tokens;
            }
            if self.history.is_empty() {
                // Nothing left to drop: the answer gets the room there is
                // and stops with `Stop::ContextFull` when the context is full.
                if fits_with_answer(tokens.len(), config.n_ctx) {
                    break tokens;
                }
                return Err(LlmError::ContextFull {
                    needed: tokens.len(),
                    n_ctx: config.n_ctx,
                });
            }
            self.history.remove(0);
            dropped_turns += 1;
        };
        if dropped_turns > 0 && config.cache_prompt {
            self.shift_out_dropped(&remembered, &prompt)?;
        }
        // Reuse the longest cached prefix (at least one token is always re-evaluated for logits).
        let mut keep = if config.cache_prompt {
            self.cached
                .iter()
                .zip(&prompt)
                .take_while(|(a, b)| a == b)
                .count()
        } else {
            0
        };
        keep = keep.min(prompt.len().saturating_sub(1));
        self.trim_cache(keep)?;
        self.follow_governor(false)?;
        self.session
            .with_dependent_mut(|_, c| c.ctx.reset_timings());
        let n_prefill = prompt.len() - keep;
        self.prefill(&prompt[keep..])?;

        let mut sampler = sampler(&config.sampling);
        let model = handle.llama();
        let mut text = String::new();
        let mut utf8 = Utf8Stream::default();
        let (mut n_sampled, mut n_streamed) = (0u32, 0u32);
        let mut logits_at = self.batch.n_tokens() - 1;
        let stop = loop {
            let token = sampler.sample(self.ctx(), logits_at);
            sampler.accept(token);
            n_sampled += 1;
            if model.is_eog_token(token) {
                break Stop::EndOfGeneration;
            }
            let bytes = piece_bytes(model, token)?;
            let piece = utf8.push(&bytes);
            n_streamed += 1;
            text.push_str(&piece);
            let go_on = on_token(&piece);
            if n_sampled >= config.max_tokens {
                break Stop::MaxTokens;
            }
            if !go_on {
                break Stop::Cancelled;
            }
            if self.cached.len() + 1 >= config.n_ctx as usize {
                break Stop::ContextFull;
            }
            // the sampled token's logits are used: the state can move now
            self.follow_governor(false)?;
            self.batch.clear();
            let pos = i32::try_from(self.cached.len()).unwrap_or(i32::MAX);
            self.batch
                .add(token, pos, &[0], true)
                .map_err(|e| LlmError::engine("batching a token", e))?;
            self.decode_batch("decode")?;
            self.cached.push(token);
            logits_at = 0;
        };
        let tail = utf8.finish();
        if !tail.is_empty() {
            text.push_str(&tail);
            on_token(&tail);
        }
        let t = self.session.with_dependent_mut(|_, c| c.ctx.timings());
        // llama.cpp reports at least 1 for each counter; an idle counter is 0.
        let engine = LlmCounters {
            n_prefill_tokens: if n_prefill > 1 {
                u32::try_from(t.n_p_eval()).unwrap_or(0)
            } else {
                0
            },
            n_decode_tokens: if n_sampled > 1 || n_prefill == 1 {
                u32::try_from(t.n_eval()).unwrap_or(0)
            } else {
                0
            },
        };
        let answer = text.trim().to_string();
        if config.memory {
            self.history.push((user.to_string(), answer.clone()));
        }
        if config.cache_prompt && stop != Stop::Cancelled {
            // a cancelled answer is amended or rolled back: its next prompt is not known yet
            self.prefill_next_opening(budget);
        }
        Ok(Response {
            text: answer,
            n_prompt_tokens: u32::try_from(prompt.len()).unwrap_or(u32::MAX),
            n_prefill_tokens: u32::try_from(n_prefill).unwrap_or(u32::MAX),
            n_sampled,
            n_streamed,
            stop,
            dropped_turns,
            engine,
            server: None,
        })
    }
}

/// Whether a prompt of `prompt_tokens` leaves room in a context of `n_ctx`
/// tokens for an answer of more than one token (the answer stops with
/// [`Stop::ContextFull`] when the context's last position is taken).
pub(crate) fn fits_with_answer(prompt_tokens: usize, n_ctx: u32) -> bool {
    prompt_tokens + 1 < n_ctx as usize
}

/// The sampler `s` asks for.
fn sampler(s: &Sampling) -> LlamaSampler {
    if s.temperature <= 0.0 {
        LlamaSampler::greedy()
    } else {
        LlamaSampler::chain_simple([
            LlamaSampler::top_k(s.top_k),
            LlamaSampler::top_p(s.top_p, 1),
            LlamaSampler::temp(s.temperature),
            LlamaSampler::dist(s.seed),
        ])
    }
}

/// A context for `model` with `config`'s size and `threads` (prompt
/// batches, single tokens) — always the pipeline's, never llama.cpp's default.
fn new_context<'m>(
    model: &'m LlamaModel,
    config: &LlmConfig,
    threads: (usize, usize),
) -> Result<LlamaContext<'m>, LlmError> {
    let n = |t: usize| i32::try_from(t.max(1)).unwrap_or(1);
    let cparams = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(config.n_ctx))
        .with_n_batch(512)
        .with_n_threads(n(threads.1))
        .with_n_threads_batch(n(threads.0));
    model
        .new_context(backend()?, cparams)
        .map_err(|e| LlmError::Load {
            path: config.model.clone(),
            source: e.into(),
        })
}
