//! The engine options (`--models-dir`, `--threads`, `--ctx`, ...) and their
//! validation into [`EngineSettings`], before any model loads.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use voxline_models::fetch;
use voxline_models::location;
use voxline_models::registry::{self, Role};
use voxline_pipeline::settings::{
    CpuShare, EngineSettings, LlamaSettings, LlmBackend, RemoteSettings, SttBackend, ThreadBudget,
    WhisperSettings,
};
use voxline_pipeline::BadInput;

use crate::cmd::models::fetch_command;

/// `--cpu-share`'s values.
const CPU_SHARES: &[(&str, &str)] = &[
    (
        "priority",
        "The engines take turns on all threads (one CPU lease), the current turn's critical \
         path first, their threads following the cores other processes leave free",
    ),
    (
        "split",
        "Each engine owns part of the threads; they may run at once",
    ),
    (
        "shared",
        "Each engine uses all threads; they take turns (one CPU lease), in the order they asked",
    ),
];

#[derive(Args, Clone)]
pub(crate) struct EngineArgs {
    /// Models directory holding the default models (default: $VOXLINE_MODELS, else ./models
    /// if it holds a manifest.json, else the user data directory, ~/.local/share/voxline/models).
    #[arg(long)]
    pub(crate) models_dir: Option<PathBuf>,
    /// The speech-to-text engine in this process: `ct2` (CTranslate2, the engine under
    /// faster-whisper: the installed tiny.en, float32), `whisper` (whisper.cpp), or `auto` (the
    /// default: ct2 when installed, whisper.cpp when an option only it takes is given,
    /// --stt-gpu among them, or when ct2 is not installed).
    #[arg(long, value_enum, default_value_t = SttEngineArg::Auto)]
    pub(crate) stt_engine: SttEngineArg,
    /// Speech-to-text beam size, either engine: 1 decodes greedily (the default), more
    /// searches that many hypotheses (slower; see docs/decisions.md for what it gained).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub(crate) stt_beam: u32,
    /// CTranslate2's precision: `float32` (the default: whisper.cpp's word error rate) or
    /// `int8` (faster-whisper's; a little faster, a little less accurate on the fixtures).
    #[arg(long, value_enum)]
    pub(crate) ct2_compute: Option<Ct2ComputeArg>,
    /// whisper.cpp ggml speech model (default: the installed tiny.en).
    #[arg(long)]
    pub(crate) whisper_model: Option<PathBuf>,
    /// Which installed tiny.en to use: its weights in f16, q8_0 (the default) or q4_0
    /// (`voxline models fetch --whisper-quant q4_0` installs it).
    #[arg(long, value_enum)]
    pub(crate) whisper_quant: Option<QuantArg>,
    /// GGUF language model (default: the installed SmolLM2-135M-Instruct); with --llm-url,
    /// the name of the model the server serves (default: the first it lists).
    #[arg(long)]
    pub(crate) llm_model: Option<PathBuf>,
    /// The language model on a remote OpenAI-compatible server (vLLM, SGLang, TGI,
    /// llama-server), e.g. http://gpu1:8000; its API key, if any, from $VOXLINE_LLM_API_KEY.
    #[arg(long, value_name = "URL")]
    pub(crate) llm_url: Option<String>,
    /// Speech to text on a remote OpenAI-compatible server (`/v1/audio/transcriptions`: vLLM,
    /// a faster-whisper server), e.g. http://gpu1:8001; its API key, if any, from $VOXLINE_STT_API_KEY.
    #[arg(long, value_name = "URL")]
    pub(crate) stt_url: Option<String>,
    /// With --stt-url, the model to ask the server for (default: the first it lists, else whisper-1).
    #[arg(long, value_name = "NAME")]
    pub(crate) stt_model: Option<String>,
    /// With --stt-url or --llm-url: seconds to wait for a server's reply, and between two pieces
    /// of a streamed one, before the turn is an error (connecting: 5 s).
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub(crate) remote_timeout_s: u64,
    /// CPU threads for the whole pipeline (default: the available cores; more is capped at them).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Of those, threads for whisper with `--cpu-share split` (default: half); the LLM gets the rest.
    #[arg(long)]
    pub(crate) stt_threads: Option<usize>,
    /// `priority`: the engines take turns on all threads, the current turn's critical
    /// path first, whisper's threads adapted to the free cores, LLM decode on one thread;
    /// `split`: each engine owns part of the threads and they may run at once;
    /// `shared`: each engine uses all of them and they take turns in arrival order.
    #[arg(long, value_parser = super::choice::<CpuShare>(CPU_SHARES), default_value = "priority")]
    pub(crate) cpu_share: CpuShare,
    /// whisper encoder window: `full` (30 s), `auto`, `auto+PAD`, or a number of positions (50 per second).
    #[arg(long, default_value = "default")]
    pub(crate) audio_ctx: String,
    /// Offload whisper to the GPU (needs a `cuda` build).
    #[arg(long)]
    pub(crate) stt_gpu: bool,
    /// Run whisper with flash attention (off by default: slower on the CPUs measured, see docs/decisions.md).
    #[arg(long)]
    pub(crate) flash_attn: bool,
    /// LLM layers to offload to the GPU (needs a `cuda` build).
    #[arg(long, default_value_t = 0)]
    pub(crate) n_gpu_layers: u32,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 64)]
    pub(crate) max_tokens: u32,
    /// LLM context size in tokens (history is trimmed, oldest first, to fit).
    #[arg(long = "ctx", default_value_t = 2048)]
    pub(crate) n_ctx: u32,
    /// The system prompt.
    #[arg(long, default_value = voxline_llm::DEFAULT_SYSTEM_PROMPT)]
    pub(crate) system_prompt: String,
    /// Re-evaluate the whole prompt every turn instead of reusing the cached system prompt and history.
    #[arg(long)]
    pub(crate) no_prompt_cache: bool,
    /// Forget earlier turns (each turn sees only the system prompt).
    #[arg(long)]
    pub(crate) no_memory: bool,
    /// Sampling temperature, 0 to 2 (0 = greedy, deterministic).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub(crate) temperature: f32,
    /// Sampling seed, 0 to 4294967295.
    #[arg(long, default_value_t = 42, value_parser = seed)]
    pub(crate) seed: u32,
    /// Who speaks the answers: `piper` (the neural voice), `espeak` (espeak-ng), `auto` (piper
    /// when installed, else espeak) or `off`. Default: `off`, but `auto` for `replay --voice-out`
    /// (`live` synthesises and measures the voice but does not play it yet).
    #[arg(long, value_enum)]
    pub(crate) voice: Option<VoiceArg>,
}

/// The speech-to-text engine in this process (`--stt-engine`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SttEngineArg {
    /// CTranslate2 where it is installed and no whisper.cpp option is given, else whisper.cpp.
    Auto,
    /// whisper.cpp (ggml), through whisper-rs.
    Whisper,
    /// CTranslate2 on the CPU (float32, or int8 with --ct2-compute int8).
    Ct2,
}

/// CTranslate2's precision (`--ct2-compute`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Ct2ComputeArg {
    /// 32-bit floats.
    Float32,
    /// Weights quantised to int8 as they load.
    Int8,
}

/// A voice for the answers (`--voice`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum VoiceArg {
    /// The neural voice when it is installed, else espeak-ng.
    Auto,
    /// The neural voice (Piper on ONNX Runtime).
    Piper,
    /// espeak-ng.
    Espeak,
    /// No voice: the answers are text only.
    Off,
}

/// A quantised whisper model.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum QuantArg {
    /// 16-bit floats: the converter's full precision.
    #[value(name = "f16")]
    F16,
    /// 8-bit blocks (ggml q8_0): the default.
    #[value(name = "q8_0")]
    Q8_0,
    /// 4-bit blocks (ggml q4_0): faster, less accurate.
    #[value(name = "q4_0")]
    Q4_0,
}

impl EngineArgs {
    /// The voice that speaks, `default` when `--voice` is not given; `None`
    /// for no voice. Checked before any model loads.
    ///
    /// # Errors
    /// [`BadInput`] when `--voice piper` is asked for and is not installed.
    pub(crate) fn voice_choice(
        &self,
        default: VoiceArg,
    ) -> Result<Option<voxline_pipeline::voice::VoiceChoice>, BadInput> {
        use voxline_pipeline::voice::VoiceChoice;
        let models_dir = location::resolve_from_process(self.models_dir.as_deref());
        let files = [
            &registry::PIPER_JOE,
            &registry::PIPER_JOE_CONFIG,
            &registry::ONNX_RUNTIME,
        ]
        .map(|m| models_dir.path.join(m.file));
        let piper = VoiceChoice::Piper {
            model: files[0].clone(),
            runtime: files[2].clone(),
        };
        Ok(match self.voice.unwrap_or(default) {
            VoiceArg::Off => None,
            VoiceArg::Espeak => Some(VoiceChoice::Espeak),
            VoiceArg::Auto if files.iter().all(|f| f.is_file()) => Some(piper),
            VoiceArg::Auto => Some(VoiceChoice::Espeak),
            VoiceArg::Piper => {
                if let Some(missing) = files.iter().find(|f| !f.is_file()) {
                    return Err(BadInput(format!(
                        "--voice piper: {} is not installed — run {} (or choose --voice espeak)",
                        missing.display(),
                        fetch_command(&models_dir)
                    )));
                }
                Some(piper)
            }
        })
    }
}

impl QuantArg {
    /// The pinned whisper model in this precision.
    pub(crate) fn model(self) -> &'static voxline_models::registry::PinnedModel {
        use voxline_models::quant::WhisperQuant;
        match self {
            Self::F16 => &registry::WHISPER_TINY_EN,
            Self::Q8_0 => registry::whisper_quantised(WhisperQuant::Q8_0),
            Self::Q4_0 => registry::whisper_quantised(WhisperQuant::Q4_0),
        }
    }

    /// The name `--whisper-quant` takes.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
        }
    }
}

impl EngineArgs {
    /// Validates the engine options into settings, before any model loads.
    /// The second value holds warnings to show once every input is known to
    /// be good (so that a bad input is still one line).
    ///
    /// # Errors
    /// [`BadInput`] naming the flag at fault: a value out of range, options
    /// that do not go together, or a model file missing or of the wrong kind.
    pub(crate) fn settings(&self) -> Result<(EngineSettings, Vec<String>), BadInput> {
        let mut warnings = Vec::new();
        let shared = self.cpu_share.takes_turns();
        if shared && self.stt_threads.is_some() {
            return Err(BadInput("--stt-threads only applies to --cpu-share split; with priority or shared the engines take turns on --threads".into()));
        }
        let (threads, capped) = ThreadBudget::fit(
            self.threads,
            self.stt_threads,
            shared,
            voxline_pipeline::settings::available_cores(),
        )?;
        warnings.extend(capped);
        if !cfg!(feature = "cuda") {
            if self.n_gpu_layers > 0 {
                warnings.push(format!(
                    "--n-gpu-layers {}: this build has no GPU support (built without --features cuda); nothing is offloaded, the LLM runs on the CPU",
                    self.n_gpu_layers
                ));
            }
            if self.stt_gpu {
                warnings.push("--stt-gpu: this build has no GPU support (built without --features cuda); whisper runs on the CPU".into());
            }
        } else if (self.stt_gpu || self.n_gpu_layers > 0) && voxline_llm::gpu_devices().is_empty() {
            warnings.push(
                "--stt-gpu/--n-gpu-layers: this CUDA build finds no GPU (no device, or no driver); both engines run on the CPU".into(),
            );
        }
        let threads = if self.cpu_share == CpuShare::Priority {
            ThreadBudget::priority(Some(threads.total))?
        } else {
            threads
        };
        let audio_ctx =
            voxline_stt::AudioCtx::parse(&self.audio_ctx).map_err(BadInput::from_display)?;
        let t = self.temperature;
        if !(0.0..=2.0).contains(&t) {
            return Err(BadInput(format!(
                "--temperature {t}: give a number from 0 (greedy, the default) to 2"
            )));
        }
        if self.max_tokens == 0 {
            return Err(BadInput(
                "--max-tokens 0: allow at least one token per answer".into(),
            ));
        }
        if self.n_ctx < 64 {
            return Err(BadInput(format!(
                "--ctx {}: the context needs at least 64 tokens (default 2048)",
                self.n_ctx
            )));
        }
        if self.max_tokens >= self.n_ctx {
            return Err(BadInput(format!(
                "--max-tokens {} with --ctx {}: the answer and the prompt must fit in the context; give --max-tokens below --ctx, or raise --ctx",
                self.max_tokens, self.n_ctx
            )));
        }
        let remote = self.remotes()?;
        let models_dir = location::resolve_from_process(self.models_dir.as_deref());
        let ct2 = self.ct2(&models_dir, remote.0.is_some())?;
        if self.whisper_model.is_some() && self.whisper_quant.is_some() {
            return Err(BadInput(
                "--whisper-quant picks an installed model; with --whisper-model give the quantised file itself".into(),
            ));
        }
        let whisper_model =
            self.whisper_model
                .clone()
                .unwrap_or_else(|| match self.whisper_quant {
                    Some(q) => models_dir.path.join(q.model().file),
                    None => fetch::default_path(&models_dir.path, Role::Stt),
                });
        let llm_model = self
            .llm_model
            .clone()
            .unwrap_or_else(|| fetch::default_path(&models_dir.path, Role::Llm));
        let local = [
            (
                &whisper_model,
                "--whisper-model",
                Role::Stt,
                self.whisper_model.is_some(),
            ),
            (
                &llm_model,
                "--llm-model",
                Role::Llm,
                self.llm_model.is_some(),
            ),
        ];
        // a remote engine reads no model file; CTranslate2's are checked above
        let local = local.into_iter().filter(|(_, _, role, _)| match role {
            Role::Stt => remote.0.is_none() && ct2.is_none(),
            _ => remote.1.is_none(),
        });
        for (path, flag, role, given) in local {
            match std::fs::metadata(path) {
                // a loop of links, a directory that cannot be read: say so,
                // as `models verify` would
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(BadInput(
                        voxline_models::ModelError::io(path, e).to_string(),
                    ));
                }
                _ => {}
            }
            if !path.is_file() {
                let hint = if given {
                    format!("check the path given to {flag}")
                } else {
                    let fetch = match (role, self.whisper_quant) {
                        (Role::Stt, Some(q @ QuantArg::Q4_0)) => format!(
                            "{} with --whisper-quant {}",
                            fetch_command(&models_dir),
                            q.name()
                        ),
                        _ => fetch_command(&models_dir),
                    };
                    format!(
                        "the models directory is {} ({}); run {fetch} or pass {flag}",
                        models_dir.path.display(),
                        models_dir.source,
                    )
                };
                return Err(BadInput(format!(
                    "{}: no such {role} model file — {hint}",
                    path.display()
                )));
            }
            let check = match role {
                Role::Stt => voxline_models::kind::check_whisper_model(path),
                Role::Llm => voxline_models::kind::check_llm_model(path),
                // the voice and the turn model are checked where they are loaded
                Role::Tts | Role::Turn => Ok(()),
            };
            check.map_err(BadInput::from_display)?;
            voxline_models::installed::check_installed(path).map_err(BadInput::from_display)?;
        }
        let trained = match remote.1 {
            Some(_) => None,
            None => voxline_models::kind::gguf_context_length(&llm_model)
                .map_err(BadInput::from_display)?,
        };
        if let Some(trained) = trained.filter(|&n| u64::from(self.n_ctx) > n) {
            return Err(BadInput(format!(
                "--ctx {}: {} was trained with a context of {trained} tokens; give --ctx {trained} or less",
                self.n_ctx,
                llm_model
                    .file_name()
                    .map_or_else(|| llm_model.display().to_string(), |n| n.to_string_lossy().into_owned())
            )));
        }
        let settings = EngineSettings {
            stt: match (remote.0, ct2) {
                (Some(r), _) => SttBackend::Remote(r),
                (None, Some(c)) => SttBackend::Ct2(c),
                (None, None) => SttBackend::Whisper(WhisperSettings {
                    model: whisper_model,
                    audio_ctx,
                    gpu: self.stt_gpu,
                    flash_attn: self.flash_attn,
                    beam: self.stt_beam as usize,
                }),
            },
            llm: match remote.1 {
                Some(r) => LlmBackend::Remote(r, self.n_ctx),
                None => LlmBackend::Llama(LlamaSettings {
                    model: llm_model,
                    n_gpu_layers: self.n_gpu_layers,
                    n_ctx: self.n_ctx,
                    cache_prompt: !self.no_prompt_cache,
                }),
            },
            threads,
            max_tokens: self.max_tokens,
            system_prompt: self.system_prompt.clone(),
            memory: !self.no_memory,
            sampling: voxline_llm::Sampling {
                temperature: self.temperature,
                seed: self.seed,
                ..Default::default()
            },
        };
        Ok((settings, warnings))
    }
}

/// The environment variable holding the language model's server's API key.
pub(crate) const LLM_KEY_VAR: &str = "VOXLINE_LLM_API_KEY";
/// The environment variable holding the speech server's API key.
pub(crate) const STT_KEY_VAR: &str = "VOXLINE_STT_API_KEY";

impl EngineArgs {
    /// CTranslate2's settings when `--stt-engine ct2` asks for it, its
    /// installed library and model checked; refused beside the options that
    /// only whisper.cpp takes and beside a remote speech server.
    fn ct2(
        &self,
        models_dir: &location::ModelsDir,
        remote_stt: bool,
    ) -> Result<Option<voxline_pipeline::settings::Ct2Settings>, BadInput> {
        let whisper_only = [
            (self.whisper_model.is_some(), "--whisper-model"),
            (self.whisper_quant.is_some(), "--whisper-quant"),
            (self.stt_gpu, "--stt-gpu"),
            (self.flash_attn, "--flash-attn"),
            (self.audio_ctx != "default", "--audio-ctx"),
        ];
        let needed = [
            registry::CT2_LIBRARY,
            registry::CT2_OPENMP,
            registry::CT2_WHISPER_MODEL,
            registry::CT2_WHISPER_CONFIG,
            registry::CT2_WHISPER_VOCABULARY,
        ];
        let dir = &models_dir.path;
        let not_ct2 = |why: &str| {
            if self.ct2_compute.is_some() {
                Err(BadInput(format!(
                    "--ct2-compute applies to CTranslate2, and this run's speech engine is not it ({why}); drop --ct2-compute, or run --stt-engine ct2"
                )))
            } else {
                Ok(None)
            }
        };
        match self.stt_engine {
            SttEngineArg::Whisper => return not_ct2("--stt-engine whisper"),
            SttEngineArg::Auto => {
                if remote_stt {
                    return not_ct2("--stt-url");
                }
                if let Some((_, flag)) = whisper_only.iter().find(|(given, _)| *given) {
                    return not_ct2(&format!("{flag} asks for whisper.cpp"));
                }
                if voxline_ct2::built_with_engine().is_err()
                    || !needed.iter().all(|m| dir.join(m.file).is_file())
                {
                    return not_ct2("CTranslate2 is not installed");
                }
            }
            SttEngineArg::Ct2 => {}
        }
        if remote_stt {
            return Err(BadInput(
                "--stt-engine ct2 runs speech to text in this process; with --stt-url the server transcribes: give one of them".into(),
            ));
        }
        for (given, flag) in whisper_only {
            if given {
                return Err(BadInput(format!(
                    "{flag} applies to whisper.cpp; --stt-engine ct2 runs the installed tiny.en on CTranslate2 (drop {flag}, or use --stt-engine whisper)"
                )));
            }
        }
        voxline_ct2::built_with_engine().map_err(BadInput)?;
        for m in needed {
            if !dir.join(m.file).is_file() {
                return Err(BadInput(format!(
                    "{}: not installed, and --stt-engine ct2 needs it — the models directory is {} ({}); run {}",
                    dir.join(m.file).display(),
                    dir.display(),
                    models_dir.source,
                    fetch_command(models_dir)
                )));
            }
            voxline_models::installed::check_installed_in(dir, m.file)
                .map_err(BadInput::from_display)?;
        }
        Ok(Some(voxline_pipeline::settings::Ct2Settings {
            model_dir: dir.join(registry::CT2_WHISPER_DIR),
            library: dir.join(registry::CT2_LIBRARY.file),
            beam: self.stt_beam as usize,
            compute: match self.ct2_compute {
                None | Some(Ct2ComputeArg::Float32) => voxline_ct2::Compute::Float32,
                Some(Ct2ComputeArg::Int8) => voxline_ct2::Compute::Int8,
            },
        }))
    }

    /// The remote engines asked for (`--stt-url`, `--llm-url`), checked
    /// against the options that apply to local engines only.
    fn remotes(&self) -> Result<(Option<RemoteSettings>, Option<RemoteSettings>), BadInput> {
        use voxline_remote::{ApiKey, Endpoint, Timeouts};
        if !(1..=3600).contains(&self.remote_timeout_s) {
            return Err(BadInput(format!(
                "--remote-timeout-s {}: give 1 to 3600 seconds",
                self.remote_timeout_s
            )));
        }
        let wait = std::time::Duration::from_secs(self.remote_timeout_s);
        let timeouts = Timeouts {
            response: wait,
            read: wait,
            total: wait * 4,
            ..Timeouts::default()
        };
        let stt = match &self.stt_url {
            Some(url) => {
                for (given, flag) in [
                    (self.whisper_model.is_some(), "--whisper-model"),
                    (self.whisper_quant.is_some(), "--whisper-quant"),
                    (self.stt_gpu, "--stt-gpu"),
                ] {
                    if given {
                        return Err(BadInput(format!(
                            "{flag} applies to whisper in this process; with --stt-url the server's model is named with --stt-model"
                        )));
                    }
                }
                let endpoint = Endpoint::parse("--stt-url", url, ApiKey::from_env(STT_KEY_VAR))
                    .map_err(BadInput::from_display)?;
                Some(RemoteSettings {
                    endpoint,
                    model: self.stt_model.clone(),
                    timeouts,
                })
            }
            None if self.stt_model.is_some() => {
                return Err(BadInput(
                    "--stt-model names a model on a speech server: give the server with --stt-url (a local model is --whisper-model)".into(),
                ));
            }
            None => None,
        };
        let llm = match &self.llm_url {
            Some(url) => {
                if self.n_gpu_layers > 0 {
                    return Err(BadInput(
                        "--n-gpu-layers applies to llama.cpp in this process; with --llm-url the server decides".into(),
                    ));
                }
                let endpoint = Endpoint::parse("--llm-url", url, ApiKey::from_env(LLM_KEY_VAR))
                    .map_err(BadInput::from_display)?;
                Some(RemoteSettings {
                    endpoint,
                    model: self
                        .llm_model
                        .as_ref()
                        .map(|m| m.to_string_lossy().into_owned()),
                    timeouts,
                })
            }
            None => None,
        };
        Ok((stt, llm))
    }
}

/// `--seed`: a whole number that fits the sampler's 32 bits.
fn seed(s: &str) -> Result<u32, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("give a whole number from 0 to {}", u32::MAX))
}
