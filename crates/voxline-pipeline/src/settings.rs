//! Engine settings and the CPU thread budget.

use std::path::PathBuf;

use voxline_llm::{LlmConfig, Sampling};
use voxline_stt::{AudioCtx, SttConfig};

use crate::BadInput;

/// The VAD's defaults, which are the CLI's (`--spec-silence-ms`,
/// `--hangover-ms`); see [`voxline_audio::vad`].
pub use voxline_audio::vad::{DEFAULT_HANGOVER_MS, DEFAULT_SPEC_SILENCE_MS};

/// How the engines share the CPU threads: one type from the command line
/// (`--cpu-share`) through the settings, the run and the report to the
/// virtual clock's simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuShare {
    /// The engines take turns on all threads (one CPU lease), the current
    /// turn's critical path first, their threads following the cores other
    /// processes leave free.
    #[default]
    Priority,
    /// Each engine owns part of the threads; they may run at once.
    Split,
    /// Each engine uses all threads; they take turns (one CPU lease), in
    /// the order they asked.
    Shared,
}

impl CpuShare {
    /// Whether the engines take turns on the cores under one CPU lease.
    #[must_use]
    pub fn takes_turns(self) -> bool {
        self != Self::Split
    }

    /// As the report and the command line name it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Priority => "priority",
            Self::Split => "split",
            Self::Shared => "shared",
        }
    }
}

impl std::str::FromStr for CpuShare {
    type Err = crate::BadInput;
    fn from_str(s: &str) -> Result<Self, crate::BadInput> {
        [Self::Priority, Self::Split, Self::Shared]
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                crate::BadInput(format!(
                    "--cpu-share {s:?}: expected `priority`, `split` or `shared`"
                ))
            })
    }
}

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
    /// How the engines share them (a split of one thread is shared: the
    /// engines take turns on it).
    pub share: CpuShare,
    /// Threads the LLM decodes with (one token at a time); prefill uses `llm`.
    pub llm_decode: usize,
}

/// The cores this process may use.
#[must_use]
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

impl ThreadBudget {
    /// [`ThreadBudget::split`] or [`ThreadBudget::shared`] on a machine with
    /// `cores` cores, with a request for more threads than cores capped at
    /// the cores: ggml's threads spin, so 16 threads on 2 cores run many
    /// times slower than 2. The request is checked as given first (so an
    /// error does not depend on the machine); the second value is the
    /// warning to show when it was capped.
    ///
    /// # Errors
    /// As [`ThreadBudget::split`] and [`ThreadBudget::shared`].
    pub fn fit(
        total: Option<usize>,
        stt: Option<usize>,
        shared: bool,
        cores: usize,
    ) -> Result<(Self, Option<String>), BadInput> {
        let cores = cores.max(1);
        let given = if shared {
            Self::shared_on(total, cores)?
        } else {
            Self::split_on(total, stt, cores)?
        };
        let Some(asked) = total.filter(|&t| t > cores) else {
            return Ok((given, None));
        };
        let (budget, split) = if shared {
            (Self::shared_on(Some(cores), cores)?, String::new())
        } else {
            // keep whisper's share of the threads, each engine at least one
            let stt = stt.map(|s| {
                let scaled = (s * cores + asked / 2) / asked;
                scaled.clamp(1, cores.saturating_sub(1).max(1))
            });
            let b = Self::split_on(Some(cores), stt, cores)?;
            let split = if b.share.takes_turns() {
                " (the engines take turns on it)".to_string()
            } else {
                format!(" (whisper {}, the LLM {})", b.stt, b.llm)
            };
            (b, split)
        };
        let cores_word = if cores == 1 { "core" } else { "cores" };
        Ok((
            budget,
            Some(format!(
                "--threads {asked} is more than the {cores} available {cores_word}; using {cores}{split}: ggml's threads spin, so more threads than cores run many times slower"
            )),
        ))
    }

    fn shared_on(total: Option<usize>, cores: usize) -> Result<Self, BadInput> {
        let total = total.unwrap_or(cores);
        if total == 0 {
            return Err(BadInput(
                "--threads 0: the pipeline needs at least one thread".into(),
            ));
        }
        Ok(Self {
            total,
            stt: total,
            llm: total,
            share: CpuShare::Shared,
            llm_decode: total,
        })
    }

    /// The default: one engine computes at a time, the current turn's
    /// critical path first (committed STT > first token > streaming decode >
    /// speculative work), and whichever computes gets every thread the budget
    /// holds, less the cores other processes keep busy (a governor shared by
    /// both engines; the LLM moves its context to a new thread count between
    /// tokens, see `LlmEngine::set_governor`).
    ///
    /// # Errors
    /// [`BadInput`] when `total` is 0.
    pub fn priority(total: Option<usize>) -> Result<Self, BadInput> {
        let mut b = Self::shared(total)?;
        b.share = CpuShare::Priority;
        Ok(b)
    }

    /// All `total` threads (`None` = the available cores) to each engine, one at a time.
    ///
    /// # Errors
    /// [`BadInput`] when `total` is 0.
    pub fn shared(total: Option<usize>) -> Result<Self, BadInput> {
        Self::shared_on(total, available_cores())
    }

    /// Splits `total` threads (`None` = the available cores): `stt` threads to
    /// whisper if given, otherwise half (rounded down, at least one); the rest to the LLM.
    ///
    /// # Errors
    /// [`BadInput`] when `total` is 0 or the split leaves an engine without a thread.
    pub fn split(total: Option<usize>, stt: Option<usize>) -> Result<Self, BadInput> {
        Self::split_on(total, stt, available_cores())
    }

    fn split_on(total: Option<usize>, stt: Option<usize>, cores: usize) -> Result<Self, BadInput> {
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
                share: CpuShare::Shared,
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
            share: CpuShare::Split,
            llm_decode: total - stt,
        })
    }
}

/// The speech-to-text engine, and its own settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SttBackend {
    /// whisper.cpp in this process, on the pipeline's threads.
    Whisper(WhisperSettings),
    /// whisper on CTranslate2 in this process, on the pipeline's threads.
    Ct2(Ct2Settings),
    /// A server of the OpenAI transcription API.
    Remote(RemoteSettings),
}

/// The CTranslate2 engine's settings.
#[derive(Debug, Clone)]
pub struct Ct2Settings {
    /// The model directory (`model.bin`, `config.json`, `vocabulary.txt`).
    pub model_dir: PathBuf,
    /// The CTranslate2 library.
    pub library: PathBuf,
    /// Beam size (1: greedy).
    pub beam: usize,
    /// The weights' precision.
    pub compute: voxline_ct2::Compute,
}

/// A remote engine's server and model.
#[derive(Debug, Clone)]
pub struct RemoteSettings {
    /// The server, its API root and its key.
    pub endpoint: voxline_remote::Endpoint,
    /// The model to ask for; `None`: the one the server lists first (see
    /// [`crate::engines::connect`]).
    pub model: Option<String>,
    /// How long to wait for it.
    pub timeouts: voxline_remote::Timeouts,
}

/// whisper.cpp's settings.
#[derive(Debug, Clone)]
pub struct WhisperSettings {
    /// The ggml model file.
    pub model: PathBuf,
    /// The encoder window.
    pub audio_ctx: AudioCtx,
    /// Offload to the GPU.
    pub gpu: bool,
    /// Flash attention.
    pub flash_attn: bool,
    /// Beam size (1: greedy).
    pub beam: usize,
}

/// The language model's engine, and its own settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LlmBackend {
    /// llama.cpp in this process, on the pipeline's threads.
    Llama(LlamaSettings),
    /// A server of the OpenAI chat API, streamed (the conversation's
    /// history is kept to `n_ctx` tokens' worth of characters, about three a
    /// token).
    Remote(RemoteSettings, u32),
}

/// llama.cpp's settings.
#[derive(Debug, Clone)]
pub struct LlamaSettings {
    /// The GGUF model file.
    pub model: PathBuf,
    /// Layers offloaded to the GPU.
    pub n_gpu_layers: u32,
    /// Context size, tokens.
    pub n_ctx: u32,
    /// Reuse the cached system prompt and history KV across turns.
    pub cache_prompt: bool,
}

impl SttBackend {
    /// Its name in the report.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Whisper(_) => "whisper",
            Self::Ct2(_) => "ct2",
            Self::Remote(_) => "remote",
        }
    }

    /// The model file it reads (`None` for a remote engine).
    #[must_use]
    pub fn model(&self) -> Option<&std::path::Path> {
        match self {
            Self::Whisper(w) => Some(&w.model),
            Self::Ct2(c) => Some(&c.model_dir),
            Self::Remote(_) => None,
        }
    }

    /// Every file it reads: the model, and CTranslate2's model files and
    /// library (none for a remote engine). An output must name none of them.
    #[must_use]
    pub fn files(&self) -> Vec<PathBuf> {
        match self {
            Self::Whisper(w) => vec![w.model.clone()],
            Self::Ct2(c) => voxline_ct2::MODEL_FILES
                .iter()
                .map(|f| c.model_dir.join(f))
                .chain([c.library.clone()])
                .collect(),
            Self::Remote(_) => vec![],
        }
    }

    /// The remote server, if it runs on one.
    #[must_use]
    pub fn remote(&self) -> Option<&RemoteSettings> {
        match self {
            Self::Whisper(_) | Self::Ct2(_) => None,
            Self::Remote(r) => Some(r),
        }
    }
}

impl LlmBackend {
    /// Its name in the report.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Llama(_) => "llama",
            Self::Remote(..) => "remote",
        }
    }

    /// The model file it reads (`None` for a remote engine).
    #[must_use]
    pub fn model(&self) -> Option<&std::path::Path> {
        match self {
            Self::Llama(l) => Some(&l.model),
            Self::Remote(..) => None,
        }
    }

    /// The remote server, if it runs on one.
    #[must_use]
    pub fn remote(&self) -> Option<&RemoteSettings> {
        match self {
            Self::Llama(_) => None,
            Self::Remote(r, _) => Some(r),
        }
    }

    /// The context size, tokens: llama.cpp's, or what a remote
    /// conversation's history is kept to.
    #[must_use]
    pub fn n_ctx(&self) -> u32 {
        match self {
            Self::Llama(l) => l.n_ctx,
            Self::Remote(_, n) => *n,
        }
    }
}

/// Everything the engines need: which backend each stage runs, with its
/// own settings, and what any backend of a kind takes.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Speech to text.
    pub stt: SttBackend,
    /// The language model.
    pub llm: LlmBackend,
    /// Thread budget.
    pub threads: ThreadBudget,
    /// Most tokens per answer.
    pub max_tokens: u32,
    /// System prompt.
    pub system_prompt: String,
    /// Remember earlier turns.
    pub memory: bool,
    /// Sampling.
    pub sampling: Sampling,
}

impl EngineSettings {
    /// whisper.cpp with `whisper_model` and llama.cpp with `llm_model`, in
    /// this process on `threads`, with the command line's defaults: the
    /// full encoder window, no GPU, a 2048-token context with the prompt
    /// cached, the default system prompt, memory on, greedy sampling and at
    /// most 64 tokens per answer.
    #[must_use]
    pub fn local(whisper_model: PathBuf, llm_model: PathBuf, threads: ThreadBudget) -> Self {
        Self {
            stt: SttBackend::Whisper(WhisperSettings {
                model: whisper_model,
                audio_ctx: AudioCtx::Default,
                gpu: false,
                flash_attn: false,
                beam: 1,
            }),
            llm: LlmBackend::Llama(LlamaSettings {
                model: llm_model,
                n_gpu_layers: 0,
                n_ctx: 2048,
                cache_prompt: true,
            }),
            threads,
            max_tokens: 64,
            system_prompt: voxline_llm::DEFAULT_SYSTEM_PROMPT.into(),
            memory: true,
            sampling: Sampling::default(),
        }
    }

    /// whisper's settings (`None` when speech to text is remote).
    #[must_use]
    pub fn whisper(&self) -> Option<&WhisperSettings> {
        match &self.stt {
            SttBackend::Whisper(w) => Some(w),
            SttBackend::Ct2(_) | SttBackend::Remote(_) => None,
        }
    }

    /// whisper's settings, to change.
    pub fn whisper_mut(&mut self) -> Option<&mut WhisperSettings> {
        match &mut self.stt {
            SttBackend::Whisper(w) => Some(w),
            SttBackend::Ct2(_) | SttBackend::Remote(_) => None,
        }
    }

    /// llama.cpp's settings (`None` when the language model is remote).
    #[must_use]
    pub fn llama(&self) -> Option<&LlamaSettings> {
        match &self.llm {
            LlmBackend::Llama(l) => Some(l),
            LlmBackend::Remote(..) => None,
        }
    }

    /// llama.cpp's settings, to change.
    pub fn llama_mut(&mut self) -> Option<&mut LlamaSettings> {
        match &mut self.llm {
            LlmBackend::Llama(l) => Some(l),
            LlmBackend::Remote(..) => None,
        }
    }

    /// The whisper engine's configuration (`None` when speech to text is remote).
    #[must_use]
    pub fn stt_config(&self) -> Option<SttConfig> {
        let w = self.whisper()?;
        let mut c = SttConfig::new(&w.model, self.threads.stt);
        c.audio_ctx = w.audio_ctx;
        c.use_gpu = w.gpu;
        c.flash_attn = w.flash_attn;
        c.beam = w.beam;
        Some(c)
    }

    /// The CTranslate2 engine's configuration (`None` unless speech to text
    /// runs on it).
    #[must_use]
    pub fn ct2_config(&self) -> Option<voxline_ct2::Ct2Config> {
        match &self.stt {
            SttBackend::Ct2(c) => Some(voxline_ct2::Ct2Config {
                model_dir: c.model_dir.clone(),
                library: c.library.clone(),
                threads: self.threads.stt,
                beam: c.beam,
                compute: c.compute,
            }),
            _ => None,
        }
    }

    /// The LLM engine's configuration (`None` when the language model is remote).
    #[must_use]
    pub fn llm_config(&self) -> Option<LlmConfig> {
        let l = self.llama()?;
        let mut c = LlmConfig::new(&l.model, self.threads.llm);
        c.decode_threads = self.threads.llm_decode;
        c.n_gpu_layers = l.n_gpu_layers;
        c.max_tokens = self.max_tokens;
        c.n_ctx = l.n_ctx;
        c.system_prompt.clone_from(&self.system_prompt);
        c.cache_prompt = l.cache_prompt;
        c.memory = self.memory;
        c.sampling = self.sampling.clone();
        Some(c)
    }

    /// A remote conversation's options, `model` being the one the server serves.
    #[must_use]
    pub fn chat_options(&self, model: String) -> voxline_remote::ChatOptions {
        voxline_remote::ChatOptions {
            model,
            system_prompt: self.system_prompt.clone(),
            max_tokens: self.max_tokens,
            temperature: self.sampling.temperature,
            seed: self.sampling.seed,
            memory: self.memory,
            history_chars: self.llm.n_ctx() as usize * 3,
        }
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
            (b.stt, b.llm, b.share.takes_turns()),
            (1, 1, true),
            "one core: take turns"
        );
        assert!(ThreadBudget::split(Some(0), None).is_err());
        assert!(ThreadBudget::split(Some(4), Some(4)).is_err());
        assert!(ThreadBudget::split(Some(4), Some(0)).is_err());
        let b = ThreadBudget::split(None, None).unwrap();
        assert_eq!(b.stt + b.llm, b.total.max(2));
        let b = ThreadBudget::shared(Some(2)).unwrap();
        assert_eq!((b.stt, b.llm, b.share.takes_turns()), (2, 2, true));
        assert!(ThreadBudget::shared(Some(0)).is_err());
        let b = ThreadBudget::priority(Some(2)).unwrap();
        assert_eq!(
            (b.stt, b.llm, b.llm_decode, b.share),
            (2, 2, 2, CpuShare::Priority)
        );
        assert_eq!(
            ThreadBudget::split(Some(2), None).unwrap().share,
            CpuShare::Split
        );
    }

    #[test]
    fn more_threads_than_cores_are_capped_with_a_warning() {
        // as many as the cores, or fewer: untouched, no warning
        let (b, w) = ThreadBudget::fit(Some(2), None, false, 2).unwrap();
        assert_eq!((b.total, b.stt, b.llm, w), (2, 1, 1, None));
        let (b, w) = ThreadBudget::fit(None, None, false, 8).unwrap();
        assert_eq!((b.total, w), (8, None));
        // 16 on 2 cores: 2, split 1 + 1
        let (b, w) = ThreadBudget::fit(Some(16), None, false, 2).unwrap();
        assert_eq!(
            (b.total, b.stt, b.llm, b.share.takes_turns()),
            (2, 1, 1, false)
        );
        let w = w.unwrap();
        assert!(
            w.contains("--threads 16") && w.contains("2 available cores") && w.contains("using 2"),
            "{w}"
        );
        // whisper's share is kept: 4 of 16 on 8 cores → 2 of 8
        let (b, _) = ThreadBudget::fit(Some(16), Some(4), false, 8).unwrap();
        assert_eq!((b.total, b.stt, b.llm), (8, 2, 6));
        // 15 of 16 on 2 cores: each engine still gets one
        let (b, _) = ThreadBudget::fit(Some(16), Some(15), false, 2).unwrap();
        assert_eq!((b.stt, b.llm), (1, 1));
        // one core: the engines take turns
        let (b, w) = ThreadBudget::fit(Some(4), None, false, 1).unwrap();
        assert_eq!((b.total, b.share.takes_turns()), (1, true));
        assert!(w.unwrap().contains("1 available core;"));
        // shared: capped too
        let (b, w) = ThreadBudget::fit(Some(16), None, true, 2).unwrap();
        assert_eq!(
            (b.total, b.stt, b.llm, b.share.takes_turns()),
            (2, 2, 2, true)
        );
        assert!(w.is_some());
        // the request is checked as given, whatever the machine
        assert!(ThreadBudget::fit(Some(2), Some(5), false, 1).is_err());
        assert!(ThreadBudget::fit(Some(0), None, false, 4).is_err());
        assert!(ThreadBudget::fit(Some(0), None, true, 4).is_err());
    }
}
