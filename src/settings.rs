//! Engine settings and the CPU thread budget.

use std::path::PathBuf;

use voxline_llm::{LlmConfig, Sampling};
use voxline_stt::{AudioCtx, SttConfig};

use crate::BadInput;

/// The default silence after which a turn is sent early (speculative
/// turn-taking), ms; chosen by measurement (see the README's latency section).
pub const DEFAULT_SPEC_SILENCE_MS: u32 = 200;

/// How the CPU thread budget is shared by the two engines.
///
/// ggml's CPU threads spin while they wait, so two engines whose threads
/// add up to more than the cores collapse each other's throughput. The
/// pipeline owns the budget, in one of two ways: *split* — each engine owns
/// part of the cores and they may run at once; *shared* — each engine uses
/// all of them, and a CPU lease makes them take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ThreadBudget {
    /// Threads in all (default: the available cores).
    pub total: usize,
    /// Threads given to whisper.
    pub stt: usize,
    /// Threads given to llama.cpp.
    pub llm: usize,
    /// The engines take turns on all `total` threads (under one CPU lease).
    pub shared: bool,
    /// Taking turns by priority (the critical path first), with whisper's
    /// threads adapted to the cores other processes leave free.
    pub priority: bool,
    /// Threads the LLM decodes with (one token at a time); prefill uses `llm`.
    pub llm_decode: usize,
}

impl ThreadBudget {
    /// All `total` threads (`None` = the available cores) to each engine, one at a time.
    ///
    /// # Errors
    /// [`BadInput`] when `total` is 0.
    pub fn shared(total: Option<usize>) -> Result<Self, BadInput> {
        let total =
            total.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
        if total == 0 {
            return Err(BadInput(
                "--threads 0: the pipeline needs at least one thread".into(),
            ));
        }
        Ok(Self {
            total,
            stt: total,
            llm: total,
            shared: true,
            priority: false,
            llm_decode: total,
        })
    }

    /// The default: one engine computes at a time, with every thread, the
    /// current turn's critical path first (committed STT > first token >
    /// streaming decode > speculative work); whisper gets as many threads as
    /// other processes leave free cores; the LLM decodes on one thread
    /// (decoding is memory-bound: one thread is ~80 % of two, and a single
    /// thread cannot stall on a barrier when another process takes a core).
    ///
    /// # Errors
    /// [`BadInput`] when `total` is 0.
    pub fn priority(total: Option<usize>) -> Result<Self, BadInput> {
        let mut b = Self::shared(total)?;
        b.priority = true;
        b.llm_decode = 1;
        Ok(b)
    }

    /// How the budget is shared, as the report names it.
    #[must_use]
    pub fn mode(&self) -> &'static str {
        match (self.shared, self.priority) {
            (_, true) => "priority",
            (true, false) => "shared",
            (false, false) => "split",
        }
    }

    /// Splits `total` threads (`None` = the available cores): `stt` threads to
    /// whisper if given, otherwise half (rounded down, at least one); the rest to the LLM.
    ///
    /// # Errors
    /// [`BadInput`] when `total` is 0 or the split leaves an engine without a thread.
    pub fn split(total: Option<usize>, stt: Option<usize>) -> Result<Self, BadInput> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let total = total.unwrap_or(cores);
        if total == 0 {
            return Err(BadInput(
                "--threads 0: the pipeline needs at least one thread".into(),
            ));
        }
        if total == 1 {
            // One core cannot be split: the engines take turns on it (a CPU lease),
            // never two engine threads at once.
            return Ok(Self {
                total,
                stt: 1,
                llm: 1,
                shared: true,
                priority: false,
                llm_decode: 1,
            });
        }
        let stt = stt.unwrap_or((total / 2).max(1));
        if stt == 0 || stt >= total {
            return Err(BadInput(format!(
                "--stt-threads {stt} with --threads {total}: each engine needs at least one thread, so give whisper 1..={}",
                total - 1
            )));
        }
        Ok(Self {
            total,
            stt,
            llm: total - stt,
            shared: false,
            priority: false,
            llm_decode: total - stt,
        })
    }
}

/// Everything the engines need.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// whisper.cpp ggml model.
    pub whisper_model: PathBuf,
    /// GGUF language model.
    pub llm_model: PathBuf,
    /// Thread budget.
    pub threads: ThreadBudget,
    /// whisper encoder window.
    pub audio_ctx: AudioCtx,
    /// Offload whisper to the GPU.
    pub stt_gpu: bool,
    /// LLM layers offloaded to the GPU.
    pub n_gpu_layers: u32,
    /// Most tokens per answer.
    pub max_tokens: u32,
    /// LLM context size.
    pub n_ctx: u32,
    /// System prompt.
    pub system_prompt: String,
    /// Reuse the cached system prompt and history KV across turns.
    pub cache_prompt: bool,
    /// Remember earlier turns.
    pub memory: bool,
    /// Sampling.
    pub sampling: Sampling,
}

impl EngineSettings {
    /// The whisper engine's configuration.
    #[must_use]
    pub fn stt_config(&self) -> SttConfig {
        let mut c = SttConfig::new(&self.whisper_model, self.threads.stt);
        c.audio_ctx = self.audio_ctx;
        c.use_gpu = self.stt_gpu;
        c
    }

    /// The LLM engine's configuration.
    #[must_use]
    pub fn llm_config(&self) -> LlmConfig {
        let mut c = LlmConfig::new(&self.llm_model, self.threads.llm);
        c.decode_threads = self.threads.llm_decode;
        c.n_gpu_layers = self.n_gpu_layers;
        c.max_tokens = self.max_tokens;
        c.n_ctx = self.n_ctx;
        c.system_prompt.clone_from(&self.system_prompt);
        c.cache_prompt = self.cache_prompt;
        c.memory = self.memory;
        c.sampling = self.sampling.clone();
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_splits_without_oversubscribing() {
        let b = ThreadBudget::split(Some(2), None).unwrap();
        assert_eq!((b.stt, b.llm), (1, 1));
        let b = ThreadBudget::split(Some(8), None).unwrap();
        assert_eq!((b.stt, b.llm), (4, 4));
        let b = ThreadBudget::split(Some(8), Some(2)).unwrap();
        assert_eq!((b.stt, b.llm), (2, 6));
        let b = ThreadBudget::split(Some(1), None).unwrap();
        assert_eq!(
            (b.stt, b.llm, b.shared),
            (1, 1, true),
            "one core: take turns"
        );
        assert!(ThreadBudget::split(Some(0), None).is_err());
        assert!(ThreadBudget::split(Some(4), Some(4)).is_err());
        assert!(ThreadBudget::split(Some(4), Some(0)).is_err());
        let b = ThreadBudget::split(None, None).unwrap();
        assert_eq!(b.stt + b.llm, b.total.max(2));
        let b = ThreadBudget::shared(Some(2)).unwrap();
        assert_eq!((b.stt, b.llm, b.shared), (2, 2, true));
        assert!(ThreadBudget::shared(Some(0)).is_err());
        let b = ThreadBudget::priority(Some(2)).unwrap();
        assert_eq!(
            (b.stt, b.llm, b.llm_decode, b.mode()),
            (2, 2, 1, "priority")
        );
        assert_eq!(ThreadBudget::split(Some(2), None).unwrap().mode(), "split");
    }
}
