//! voxline's language model: llama.cpp through llama-cpp-2.
//!
//! The model ([`LlmModel`]) loads once, on any thread, and can be shared;
//! its context ([`LlmEngine`]) is bound to the thread that made it, so the
//! pipeline's stage ([`LlmStage`]) creates it on its own thread when it
//! starts. The conversation lives in the
//! KV cache as one token sequence: the system prompt, then each turn. A new
//! turn is rendered with the model's own chat template, tokenised, and only
//! the tokens after the longest prefix already in the cache are evaluated —
//! so the system prompt's KV is computed once (at load) and reused every
//! turn, and so is the unchanged part of the history. When the context
//! budget is exceeded the oldest turns are dropped first. Tokens are
//! streamed to a callback as they are decoded.
#![warn(missing_docs)]
// The only unsafe code moves a context's state through llama.cpp's C API
// (`LlmEngine::set_threads`), allowed there alone.
#![deny(unsafe_code)]

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{AddBos, LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::TokenToStringError;
use serde::{Deserialize, Serialize};

pub mod batch;
pub mod message;

pub use message::{LlmCounters, LlmOut, Stop, Token, TurnComplete};

/// Errors of the language model engine.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The model file is missing, of the wrong kind or incomplete.
    #[error(transparent)]
    Model(#[from] voxline_models::ModelError),
    /// llama.cpp could not load the model or create its context.
    #[error("{path}: llama.cpp could not load this model ({detail}); is it a complete GGUF? Fetch it again, or run with VOXLINE_LOG=llama-cpp-2=info for llama.cpp's reasons")]
    Load {
        /// The model file.
        path: PathBuf,
        /// The engine's error.
        detail: String,
    },
    /// The model has no usable chat template.
    #[error("{path}: the model has no chat template llama.cpp can apply ({detail}); use an instruction-tuned GGUF with a template")]
    Template {
        /// The model file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// A turn's prompt leaves no room in the context for an answer, even
    /// with no history.
    #[error("the prompt needs {needed} tokens but the context holds {n_ctx} with room for the answer; shorten what is said or the system prompt, or raise --ctx")]
    ContextFull {
        /// Tokens of the prompt.
        needed: usize,
        /// Context size.
        n_ctx: u32,
    },
    /// The system prompt leaves no room in the context for a turn and its answer.
    #[error("the system prompt needs {prompt_tokens} tokens but only {fit} fit (--ctx {n_ctx} less {max_tokens} reserved for the answer by --max-tokens, less one for what is said); shorten the system prompt, lower --max-tokens or raise --ctx")]
    SystemPromptTooLong {
        /// Tokens of the rendered system prompt.
        prompt_tokens: usize,
        /// Prompt tokens that fit.
        fit: usize,
        /// Context size.
        n_ctx: u32,
        /// Tokens reserved for generation.
        max_tokens: u32,
    },
    /// Evaluation or sampling failed.
    #[error("the language model failed: {0}")]
    Engine(String),
    /// The configuration is invalid.
    #[error("{0}")]
    Config(String),
}

/// Sampling settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Temperature; 0 means greedy (deterministic).
    pub temperature: f32,
    /// Top-k (0 = off).
    pub top_k: i32,
    /// Top-p (1.0 = off).
    pub top_p: f32,
    /// Seed for the random sampler.
    pub seed: u32,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            seed: 42,
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmConfig {
    /// The GGUF model.
    pub model: PathBuf,
    /// CPU threads for prompt evaluation (from the pipeline's budget; never the engine's default).
    pub threads: usize,
    /// CPU threads for decoding one token at a time.
    pub decode_threads: usize,
    /// Layers to offload to a GPU (0 = CPU only; needs the `cuda` feature).
    pub n_gpu_layers: u32,
    /// Context size in tokens.
    pub n_ctx: u32,
    /// Most tokens generated per turn.
    pub max_tokens: u32,
    /// Sampling.
    pub sampling: Sampling,
    /// The system prompt.
    pub system_prompt: String,
    /// Keep the system prompt and history in the KV cache across turns
    /// (off = evaluate the whole prompt every turn; for A/B comparisons).
    pub cache_prompt: bool,
    /// Remember earlier turns (off = each turn sees only the system prompt).
    pub memory: bool,
}

/// The default system prompt: short answers suit a voice assistant.
pub const DEFAULT_SYSTEM_PROMPT: &str =
    "You are a helpful voice assistant. Answer in one or two short sentences.";

impl LlmConfig {
    /// Settings for `model` with `threads` threads and defaults otherwise.
    #[must_use]
    pub fn new(model: impl Into<PathBuf>, threads: usize) -> Self {
        Self {
            model: model.into(),
            threads,
            decode_threads: threads,
            n_gpu_layers: 0,
            n_ctx: 2048,
            max_tokens: 64,
            sampling: Sampling::default(),
            system_prompt: DEFAULT_SYSTEM_PROMPT.into(),
            cache_prompt: true,
            memory: true,
        }
    }
}

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
}

fn backend() -> Result<&'static LlamaBackend, LlmError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| LlmError::Engine(format!("llama.cpp backend: {e}")))
}

/// Turns streamed token bytes into text without splitting a UTF-8 character.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds bytes and returns the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(n) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + n);
                        }
                    }
                }
            }
        }
    }

    /// Flushes an incomplete tail as a replacement character.
    pub fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            String::new()
        } else {
            self.pending.clear();
            "\u{FFFD}".into()
        }
    }
}

/// A loaded language model: the weights, its chat template, the settings
/// and the tokenised system prompt. [`Send`] and [`Sync`], cheap to clone
/// (shared); a conversation needs an [`LlmEngine`] made from it.
#[derive(Clone)]
pub struct LlmModel(Arc<ModelParts>);

struct ModelParts {
    model: LlamaModel,
    template: LlamaChatTemplate,
    config: LlmConfig,
    system_tokens: Vec<LlamaToken>,
}

impl std::fmt::Debug for LlmModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmModel")
            .field("config", &self.0.config)
            .finish_non_exhaustive()
    }
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

impl LlmModel {
    /// Loads the GGUF model and checks that the system prompt and an
    /// answer fit in the context. Runs on any thread; nothing here is tied
    /// to one.
    ///
    /// # Errors
    /// [`LlmError::Model`] for a missing, foreign or truncated file,
    /// [`LlmError::Load`] when llama.cpp refuses it, [`LlmError::Template`]
    /// without a chat template, [`LlmError::Config`] for 0 threads, a tiny
    /// context or a temperature outside 0..=2,
    /// [`LlmError::SystemPromptTooLong`] when the system prompt and the
    /// answer cannot fit in the context.
    pub fn load(config: LlmConfig) -> Result<Self, LlmError> {
        if config.threads == 0 {
            return Err(LlmError::Config(
                "the language model needs at least one thread".into(),
            ));
        }
        let t = config.sampling.temperature;
        if !(0.0..=2.0).contains(&t) {
            return Err(LlmError::Config(format!(
                "temperature {t} is out of range: give a number from 0 (greedy) to 2"
            )));
        }
        if config.n_ctx < 64 || config.max_tokens == 0 || config.max_tokens >= config.n_ctx {
            return Err(LlmError::Config(format!(
                "context {} tokens with max {} new tokens is not usable: need ctx >= 64 and 0 < max tokens < ctx",
                config.n_ctx, config.max_tokens
            )));
        }
        voxline_models::kind::check_llm_model(&config.model)?;
        let backend = backend()?;
        let load_err = |detail: String| LlmError::Load {
            path: config.model.clone(),
            detail,
        };
        let mparams = LlamaModelParams::default().with_n_gpu_layers(config.n_gpu_layers);
        let model = LlamaModel::load_from_file(backend, &config.model, &mparams)
            .map_err(|e| load_err(e.to_string()))?;
        let template = model.chat_template(None).map_err(|e| LlmError::Template {
            path: config.model.clone(),
            detail: e.to_string(),
        })?;
        // Tokenise the system prompt before the context (and its KV cache) is
        // made: one that cannot fit is the user's to fix, not a failure later.
        let system = render_chat(&model, &template, &config, &[], None)?;
        let system_tokens = tokenize_with(&model, &system)?;
        let fit = (config.n_ctx as usize).saturating_sub(config.max_tokens as usize + 1);
        if system_tokens.len() > fit {
            return Err(LlmError::SystemPromptTooLong {
                prompt_tokens: system_tokens.len(),
                fit,
                n_ctx: config.n_ctx,
                max_tokens: config.max_tokens,
            });
        }
        Ok(Self(Arc::new(ModelParts {
            model,
            template,
            config,
            system_tokens,
        })))
    }

    /// The settings the model was loaded with.
    #[must_use]
    pub fn config(&self) -> &LlmConfig {
        &self.0.config
    }

    fn llama(&self) -> &LlamaModel {
        &self.0.model
    }
}

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
        let config = model.config();
        let threads_now = (config.threads, config.decode_threads.max(1));
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
            return Err(LlmError::Engine(format!(
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
                return Err(LlmError::Engine(format!(
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
        let engine = |e: &dyn std::fmt::Display| LlmError::Engine(format!("context shift: {e}"));
        self.session.with_dependent_mut(|_, c| {
            c.ctx
                .clear_kv_cache_seq(Some(0), Some(pos(at)), Some(pos(at + d)))
                .map_err(|e| engine(&e))?;
            c.ctx
                .kv_cache_seq_add(
                    0,
                    Some(pos(at + d)),
                    None,
                    -i32::try_from(d).unwrap_or(i32::MAX),
                )
                .map_err(|e| engine(&e))
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
                .map_err(|e| LlmError::Engine(e.to_string()))?;
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
    fn decode_batch(&mut self, what: &str) -> Result<(), LlmError> {
        let batch = &mut self.batch;
        self.session
            .with_dependent_mut(|_, c| c.ctx.decode(batch))
            .map_err(|e| LlmError::Engine(format!("{what}: {e}")))
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
                    .map_err(|e| LlmError::Engine(e.to_string()))?;
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
                .map_err(|e| LlmError::Engine(e.to_string()))?;
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
        Ok(Response {
            text: answer,
            n_prompt_tokens: u32::try_from(prompt.len()).unwrap_or(u32::MAX),
            n_prefill_tokens: u32::try_from(n_prefill).unwrap_or(u32::MAX),
            n_sampled,
            n_streamed,
            stop,
            dropped_turns,
            engine,
        })
    }
}

/// Whether a prompt of `prompt_tokens` leaves room in a context of `n_ctx`
/// tokens for an answer of more than one token (the answer stops with
/// [`Stop::ContextFull`] when the context's last position is taken).
fn fits_with_answer(prompt_tokens: usize, n_ctx: u32) -> bool {
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
            detail: e.to_string(),
        })
}

/// Renders the system prompt, `history` and `user` with the model's chat template.
fn render_chat(
    model: &LlamaModel,
    template: &LlamaChatTemplate,
    config: &LlmConfig,
    history: &[(String, String)],
    user: Option<&str>,
) -> Result<String, LlmError> {
    let msg = |role: &str, content: &str| {
        LlamaChatMessage::new(role.into(), content.into())
            .map_err(|e| LlmError::Engine(format!("chat message: {e}")))
    };
    let mut chat = Vec::with_capacity(2 + 2 * history.len());
    if !config.system_prompt.is_empty() {
        chat.push(msg("system", &config.system_prompt)?);
    }
    for (u, a) in history {
        chat.push(msg("user", u)?);
        chat.push(msg("assistant", a)?);
    }
    if let Some(u) = user {
        chat.push(msg("user", u)?);
    }
    if chat.is_empty() {
        return Ok(String::new());
    }
    model
        .apply_chat_template(template, &chat, user.is_some())
        .map_err(|e| LlmError::Template {
            path: config.model.clone(),
            detail: e.to_string(),
        })
}

/// The text of `token` as bytes, however long: a piece that does not fit
/// the first buffer is decoded again in one of the size llama.cpp asks for
/// (whitespace runs in SmolLM2's vocabulary reach 81 bytes). A token with no
/// text (llama.cpp writes nothing, as for a control token) is empty.
///
/// # Errors
/// [`LlmError::Engine`] when llama.cpp cannot decode the token.
fn piece_bytes(model: &LlamaModel, token: LlamaToken) -> Result<Vec<u8>, LlmError> {
    const FIRST_TRY: usize = 64;
    let decode = |size: usize| model.token_to_piece_bytes(token, size, false, None);
    let failed = |e: TokenToStringError| LlmError::Engine(format!("token {}: {e}", token.0));
    match decode(FIRST_TRY) {
        Ok(bytes) => Ok(bytes),
        Err(TokenToStringError::InsufficientBufferSpace(needed)) => {
            let size = usize::try_from(needed.unsigned_abs()).unwrap_or(usize::MAX);
            decode(size).map_err(failed)
        }
        Err(TokenToStringError::UnknownTokenType) => Ok(Vec::new()),
        Err(e) => Err(failed(e)),
    }
}

fn tokenize_with(model: &LlamaModel, text: &str) -> Result<Vec<LlamaToken>, LlmError> {
    // Chat templates carry their own BOS where the model wants one.
    model
        .str_to_token(text, AddBos::Never)
        .map_err(|e| LlmError::Engine(format!("tokenize: {e}")))
}

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
            .map_err(|e| voxline_core::StageError::turn(id, e.to_string()))?;
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
        let r = r.map_err(|e| voxline_core::StageError::turn(id, e.to_string()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The default language model in the repository's models directory
    /// (`VOXLINE_MODELS_DIR` to look elsewhere).
    fn model_path() -> PathBuf {
        std::env::var_os("VOXLINE_MODELS_DIR")
            .map_or_else(
                || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"),
                PathBuf::from,
            )
            .join(voxline_models::registry::SMOLLM2_135M.file)
    }

    #[test]
    fn every_token_decodes_to_its_whole_text() {
        let model = LlmModel::load(LlmConfig::new(model_path(), 1)).unwrap();
        let model = model.llama();
        let mut longer_than_first_try = 0;
        for id in 0..model.n_vocab() {
            let token = LlamaToken::new(id);
            // the reference: a buffer larger than any piece in the vocabulary
            let want = model
                .token_to_piece_bytes(token, 4096, false, None)
                .unwrap_or_default();
            let got = piece_bytes(model, token).unwrap();
            assert_eq!(got, want, "token {id}");
            longer_than_first_try += usize::from(got.len() > 64);
        }
        // SmolLM2 has whitespace runs of up to 81 bytes, which a fixed
        // 64-byte buffer turned into empty text
        assert!(longer_than_first_try > 0);
    }

    #[test]
    fn utf8_stream_never_splits_a_character() {
        let mut s = Utf8Stream::default();
        let e = "é".as_bytes();
        assert_eq!(s.push(&e[..1]), "");
        assert_eq!(s.push(&e[1..]), "é");
        assert_eq!(s.push(b"ab"), "ab");
        assert_eq!(s.push(&[0xff, b'x']), "\u{FFFD}x");
        assert_eq!(s.push(&"😀".as_bytes()[..3]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn bad_configs_are_refused_before_loading() {
        let mut c = LlmConfig::new("/nonexistent.gguf", 0);
        assert!(LlmEngine::load(c.clone())
            .unwrap_err()
            .to_string()
            .contains("at least one thread"));
        c.threads = 1;
        c.max_tokens = 4096;
        assert!(matches!(
            LlmEngine::load(c.clone()),
            Err(LlmError::Config(_))
        ));
        c.max_tokens = 16;
        for t in [-1.0, f32::NAN, 2.5, f32::INFINITY] {
            let mut bad = c.clone();
            bad.sampling.temperature = t;
            assert!(
                matches!(LlmEngine::load(bad), Err(LlmError::Config(ref m)) if m.contains("0 (greedy) to 2")),
                "temperature {t}"
            );
        }
        assert!(matches!(LlmEngine::load(c), Err(LlmError::Model(_))));
    }
}
