//! Many conversations on one context: continuous batching.
//!
//! One model and one llama.cpp context serve several sessions, each with
//! its own KV sequence (sequence 0 holds the system prompt, evaluated once
//! and copied into a session's sequence when it starts). Every
//! [`BatchEngine::step`] is one `llama_decode` over one batch that advances
//! every session with work: the next token of each answer being generated,
//! and the whole prompt of each turn that has just started — a new turn
//! joins the running batch instead of waiting for the others to finish. A
//! finished or cancelled turn leaves the batch at once. Each session samples
//! with its own sampler (temperature, seed), so sessions stay independent.
//!
//! Decoding one token reads all the weights; decoding eight in one batch
//! reads them once, which is where the aggregate throughput comes from.
//!
//! Without a unified KV cache (this llama.cpp's default) the context is
//! divided evenly between the sequences, so the context is made
//! `per-session context × (sessions + 1)` tokens.

use std::num::NonZeroU32;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

use crate::engine::fits_with_answer;
use crate::model::{backend, piece_bytes, render_chat, tokenize_with};
use crate::{LlmConfig, LlmError, LlmModel, Stop, Utf8Stream};

/// One session of a [`BatchEngine`] (its index, from 0).
pub type SessionId = usize;

/// What one [`BatchEngine::step`] produced for a session.
#[derive(Debug, Clone, PartialEq)]
pub enum StepEvent {
    /// A piece of an answer's text.
    Token {
        /// The session.
        session: SessionId,
        /// The text.
        piece: String,
    },
    /// An answer ended; the session is idle again.
    Done {
        /// The session.
        session: SessionId,
        /// The whole answer.
        text: String,
        /// Tokens sampled (the end-of-generation token included).
        n_sampled: u32,
        /// Why it ended.
        stop: Stop,
    },
}

/// A turn being answered.
struct Turn {
    user: String,
    /// Prompt tokens still to evaluate.
    to_prefill: Vec<LlamaToken>,
    /// The sampled token still to evaluate.
    last: Option<LlamaToken>,
    sampler: LlamaSampler,
    utf8: Utf8Stream,
    text: String,
    n_sampled: u32,
    /// The sequence's length before the turn (its state on cancel).
    start_len: usize,
    /// Tokens of the rendered prompt.
    n_prompt: u32,
}

/// One session's conversation.
#[derive(Default)]
struct Session {
    /// Tokens in this session's KV sequence, in order.
    cached: Vec<LlamaToken>,
    history: Vec<(String, String)>,
    turn: Option<Turn>,
}

/// Several conversations answered at once on one context.
pub struct BatchEngine<'m> {
    model: &'m LlmModel,
    ctx: LlamaContext<'m>,
    config: LlmConfig,
    system: Vec<LlamaToken>,
    sessions: Vec<Session>,
    batch: LlamaBatch<'m>,
    /// Tokens one session's sequence may hold.
    per_session_ctx: usize,
    /// Prompt tokens evaluated since the engine was made.
    prefilled: u64,
}

impl std::fmt::Debug for BatchEngine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchEngine")
            .field("sessions", &self.sessions.len())
            .field("per_session_ctx", &self.per_session_ctx)
            .finish_non_exhaustive()
    }
}

/// The batch holds every generating session's token plus the prompts that join.
const BATCH_TOKENS: usize = 1024;

impl<'m> BatchEngine<'m> {
    /// A context for `sessions` sessions of the model's `n_ctx` tokens each
    /// (plus one sequence for the system prompt), on its `threads` threads
    /// for every step; evaluates the system prompt once.
    ///
    /// # Errors
    /// [`LlmError::Config`] for 0 sessions; [`LlmError::Load`] when
    /// llama.cpp cannot make the context; [`LlmError::Engine`] when the
    /// system prompt cannot be evaluated.
    pub fn new(model: &'m LlmModel, sessions: usize) -> Result<Self, LlmError> {
        if sessions == 0 {
            return Err(LlmError::Config(
                "batching needs at least one session".into(),
            ));
        }
        let config = model.config().clone();
        let n_seq = u32::try_from(sessions + 1).unwrap_or(u32::MAX);
        let threads = i32::try_from(model.context_threads().0).unwrap_or(1);
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(config.n_ctx.saturating_mul(n_seq)))
            .with_n_seq_max(n_seq)
            .with_n_batch(BATCH_TOKENS as u32)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let ctx = model
            .llama()
            .new_context(backend()?, params)
            .map_err(|e| LlmError::Load {
                path: config.model.clone(),
                source: e.into(),
            })?;
        let mut engine = Self {
            model,
            ctx,
            per_session_ctx: config.n_ctx as usize,
            prefilled: 0,
            config,
            system: model.0.system_tokens.clone(),
            sessions: (0..sessions).map(|_| Session::default()).collect(),
            batch: LlamaBatch::new(BATCH_TOKENS, 1),
        };
        engine.batch.clear();
        let last = engine.system.len().saturating_sub(1);
        for (i, &t) in engine.system.iter().enumerate() {
            engine
                .batch
                .add(t, pos(i), &[0], i == last)
                .map_err(|e| LlmError::engine("system prompt batch", e))?;
        }
        if !engine.system.is_empty() {
            engine
                .ctx
                .decode(&mut engine.batch)
                .map_err(|e| LlmError::engine("system prompt", e))?;
        }
        Ok(engine)
    }

    /// Threads the context computes with: the configured ones, or 1 when
    /// the model is on the GPU ([`LlmModel::gpu`]).
    #[must_use]
    pub fn threads(&self) -> usize {
        self.model.context_threads().0
    }

    /// Sessions this engine serves.
    #[must_use]
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Whether `session` is answering a turn.
    #[must_use]
    pub fn is_busy(&self, session: SessionId) -> bool {
        self.sessions.get(session).is_some_and(|s| s.turn.is_some())
    }

    /// Sessions answering a turn now.
    #[must_use]
    pub fn busy(&self) -> usize {
        self.sessions.iter().filter(|s| s.turn.is_some()).count()
    }

    /// Tokens of the prompt of `session`'s turn (0 when it answers none).
    #[must_use]
    pub fn prompt_tokens(&self, session: SessionId) -> u32 {
        self.sessions
            .get(session)
            .and_then(|s| s.turn.as_ref())
            .map_or(0, |t| t.n_prompt)
    }

    /// Completed turns `session` remembers.
    #[must_use]
    pub fn history_len(&self, session: SessionId) -> usize {
        self.sessions.get(session).map_or(0, |s| s.history.len())
    }

    /// Starts answering `user` in `session`; the prompt is evaluated by the
    /// next [`BatchEngine::step`], in the same batch as the other sessions'
    /// tokens. Only what the session's sequence does not hold yet is
    /// evaluated; a session's first turn starts from a copy of the system
    /// prompt's KV. The oldest turns are dropped when the session's share
    /// of the context would overflow.
    ///
    /// # Errors
    /// [`LlmError::Config`] for a session out of range or one already
    /// answering; [`LlmError::ContextFull`] when the prompt leaves no room
    /// for an answer even without history; [`LlmError::Engine`] when the KV cache refuses.
    pub fn start(&mut self, session: SessionId, user: &str) -> Result<(), LlmError> {
        let n = self.sessions.len();
        let Some(s) = self.sessions.get_mut(session) else {
            return Err(LlmError::Config(format!(
                "session {session} of {n}: no such session"
            )));
        };
        if s.turn.is_some() {
            return Err(LlmError::Config(format!(
                "session {session} is still answering; cancel it or wait for its answer"
            )));
        }
        if !self.config.memory {
            s.history.clear();
        }
        let budget = self.per_session_ctx - self.config.max_tokens as usize;
        let (model, template) = (self.model.llama(), &self.model.0.template);
        let prompt = loop {
            let text = render_chat(model, template, &self.config, &s.history, Some(user))?;
            let tokens = tokenize_with(model, &text)?;
            if tokens.len() <= budget {
                break tokens;
            }
            if s.history.is_empty() {
                // as `LlmEngine::respond`: the answer gets the room there is
                if fits_with_answer(tokens.len(), self.config.n_ctx) {
                    break tokens;
                }
                return Err(LlmError::ContextFull {
                    needed: tokens.len(),
                    n_ctx: self.config.n_ctx,
                });
            }
            s.history.remove(0);
        };
        let seq = seq_of(session);
        if s.cached.is_empty() && !self.system.is_empty() {
            self.ctx
                .copy_kv_cache_seq(0, seq, None, None)
                .map_err(|e| LlmError::engine("copying the system prompt's KV cache", e))?;
            s.cached.clone_from(&self.system);
        }
        let keep = s
            .cached
            .iter()
            .zip(&prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1));
        if keep < s.cached.len() {
            self.ctx
                .clear_kv_cache_seq(Some(seq.unsigned_abs()), Some(pos_u(keep)), None)
                .map_err(|e| LlmError::engine("trimming the KV cache", e))?;
            s.cached.truncate(keep);
        }
        let sampler = sampler(&self.config, session);
        s.turn = Some(Turn {
            user: user.to_string(),
            to_prefill: prompt[keep..].to_vec(),
            n_prompt: u32::try_from(prompt.len()).unwrap_or(u32::MAX),
            last: None,
            sampler,
            utf8: Utf8Stream::default(),
            text: String::new(),
            n_sampled: 0,
            start_len: keep,
        });
        Ok(())
    }

    /// Stops `session`'s answer at once: it leaves the batch, its sequence
    /// returns to what it held before the turn, and its history is unchanged.
    ///
    /// # Errors
    /// [`LlmError::Engine`] when the KV cache refuses to trim.
    pub fn cancel(&mut self, session: SessionId) -> Result<(), LlmError> {
        let Some(s) = self.sessions.get_mut(session) else {
            return Ok(());
        };
        if let Some(turn) = s.turn.take() {
            self.ctx
                .clear_kv_cache_seq(
                    Some(seq_of(session).unsigned_abs()),
                    Some(pos_u(turn.start_len)),
                    None,
                )
                .map_err(|e| LlmError::engine("dropping a turn from the KV cache", e))?;
            s.cached.truncate(turn.start_len);
        }
        Ok(())
    }

    /// Empties `session` for a new conversation (a session that left, its
    /// slot given to the next one to join): its turn stops, its KV sequence
    /// is cleared and its history forgotten.
    ///
    /// # Errors
    /// [`LlmError::Engine`] when the KV cache refuses to clear.
    pub fn reset(&mut self, session: SessionId) -> Result<(), LlmError> {
        let Some(s) = self.sessions.get_mut(session) else {
            return Ok(());
        };
        s.turn = None;
        s.history.clear();
        s.cached.clear();
        self.ctx
            .clear_kv_cache_seq(Some(seq_of(session).unsigned_abs()), None, None)
            .map_err(|e| LlmError::engine("clearing a session's KV cache", e))?;
        Ok(())
    }

    /// Prompt tokens evaluated for turns since the engine was made (the
    /// system prompt excluded).
    #[must_use]
    pub fn prefilled_tokens(&self) -> u64 {
        self.prefilled
    }

    /// Whether some session's turn has not sampled its first token yet (its
    /// prompt still to evaluate): the next step is then on a first token's
    /// critical path.
    #[must_use]
    pub fn prefilling(&self) -> bool {
        self.sessions
            .iter()
            .filter_map(|s| s.turn.as_ref())
            .any(|t| t.n_sampled == 0)
    }

    /// One decode over every session with work: each generating session's
    /// last token and each new turn's prompt, in one batch; then each of
    /// them samples its next token. Returns what each produced (nothing when
    /// no session has work).
    ///
    /// # Errors
    /// [`LlmError::Engine`] when evaluation fails (every turn in the batch
    /// is then cancelled, so the engine stays usable).
    pub fn step(&mut self) -> Result<Vec<StepEvent>, LlmError> {
        self.batch.clear();
        // (session, index of its logits in the batch)
        let mut sampling: Vec<(SessionId, i32)> = Vec::new();
        let mut room = BATCH_TOKENS;
        for (i, s) in self.sessions.iter_mut().enumerate() {
            let Some(turn) = s.turn.as_mut() else {
                continue;
            };
            let seq = [seq_of(i)];
            if let Some(t) = turn.last {
                if room == 0 {
                    continue;
                }
                self.batch
                    .add(t, pos(s.cached.len()), &seq, true)
                    .map_err(|e| LlmError::engine("batching a token", e))?;
                s.cached.push(t);
                turn.last = None;
                room -= 1;
            } else if !turn.to_prefill.is_empty() {
                // a prompt joins as far as the batch has room; the rest next step
                let take = turn.to_prefill.len().min(room);
                if take == 0 {
                    continue;
                }
                let whole = take == turn.to_prefill.len();
                for (k, t) in turn.to_prefill.drain(..take).enumerate() {
                    let logits = whole && k + 1 == take;
                    self.batch
                        .add(t, pos(s.cached.len()), &seq, logits)
                        .map_err(|e| LlmError::engine("batching a prompt", e))?;
                    s.cached.push(t);
                }
                room -= take;
                self.prefilled += take as u64;
                if !whole {
                    continue;
                }
            } else {
                continue;
            }
            sampling.push((i, self.batch.n_tokens() - 1));
        }
        if self.batch.n_tokens() == 0 {
            return Ok(Vec::new());
        }
        if let Err(e) = self.ctx.decode(&mut self.batch) {
            for i in 0..self.sessions.len() {
                self.cancel(i)?;
            }
            return Err(LlmError::engine("batched decode", e));
        }
        let mut events = Vec::new();
        for (i, at) in sampling {
            let Some(turn) = self.sessions[i].turn.as_mut() else {
                continue;
            };
            let token = turn.sampler.sample(&self.ctx, at);
            turn.sampler.accept(token);
            turn.n_sampled += 1;
            let stop = if self.model.llama().is_eog_token(token) {
                Some(Stop::EndOfGeneration)
            } else {
                let piece = turn.utf8.push(&piece_bytes(self.model.llama(), token)?);
                turn.text.push_str(&piece);
                if !piece.is_empty() {
                    events.push(StepEvent::Token { session: i, piece });
                }
                turn.last = Some(token);
                if turn.n_sampled >= self.config.max_tokens {
                    Some(Stop::MaxTokens)
                } else if self.sessions[i].cached.len() + 1 >= self.per_session_ctx {
                    Some(Stop::ContextFull)
                } else {
                    None
                }
            };
            if let Some(done) = stop.and_then(|stop| self.finish(i, stop)) {
                events.push(done);
            }
        }
        Ok(events)
    }

    /// Ends `session`'s turn: remembers it, leaves the batch (nothing when
    /// the session has no turn).
    fn finish(&mut self, session: SessionId, stop: Stop) -> Option<StepEvent> {
        let s = self.sessions.get_mut(session)?;
        let mut turn = s.turn.take()?;
        let tail = turn.utf8.finish();
        turn.text.push_str(&tail);
        let text = turn.text.trim().to_string();
        if self.config.memory {
            s.history.push((turn.user, text.clone()));
        }
        Some(StepEvent::Done {
            session,
            text,
            n_sampled: turn.n_sampled,
            stop,
        })
    }
}

/// The KV sequence of `session` (0 is the system prompt's).
fn seq_of(session: SessionId) -> i32 {
    i32::try_from(session + 1).unwrap_or(i32::MAX)
}

fn pos(p: usize) -> i32 {
    i32::try_from(p).unwrap_or(i32::MAX)
}

fn pos_u(p: usize) -> u32 {
    u32::try_from(p).unwrap_or(u32::MAX)
}

/// `config`'s sampler; with a temperature each session gets its own seed
/// (the configured one plus its index), so sessions stay independent and
/// each is deterministic for a fixed seed.
fn sampler(config: &LlmConfig, session: SessionId) -> LlamaSampler {
    let s = &config.sampling;
    if s.temperature <= 0.0 {
        LlamaSampler::greedy()
    } else {
        let seed = s.seed.wrapping_add(u32::try_from(session).unwrap_or(0));
        LlamaSampler::chain_simple([
            LlamaSampler::top_k(s.top_k),
            LlamaSampler::top_p(s.top_p, 1),
            LlamaSampler::temp(s.temperature),
            LlamaSampler::dist(seed),
        ])
    }
}
