//! What `replay`, `bench` and `live` share: the engine settings, VAD
//! configuration and budget checked from the command line ([`Session::new`]),
//! the outputs planned against the inputs ([`Session::plan_outputs`]), then
//! the models loaded and the pipeline run into a report ([`Session::run`]
//! with a [`Run`] the subcommand fills in). Each subcommand keeps only its
//! own checks, its source and what it makes of the report.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context as _;
use voxline_core::ShutdownHandle;
use voxline_pipeline::fault::Fault;
use voxline_pipeline::output::{self, Output};
use voxline_pipeline::pipeline::PipelineConfig;
use voxline_pipeline::pipeline::{self, EventHook, Pace, RunOptions, RunResult, Source};
use voxline_pipeline::settings::EngineSettings;
use voxline_pipeline::BadInput;
use voxline_report::budget::Budget;
use voxline_report::tally::Tally;
use voxline_report::{self as report, Report, RunConfig};

use crate::cli::{EngineArgs, VadArgs, VoiceArg};
use crate::signals::install_signal_handler;
use crate::Outcome;

/// A session's options, validated before any model loads.
pub(crate) struct Session {
    /// The engines' settings.
    pub(crate) settings: EngineSettings,
    /// Warnings about the settings, shown once every input is known good.
    pub(crate) warnings: Vec<String>,
    /// What the pipeline runs with (the semantic end of turn's model
    /// loaded), validated once; the report records it.
    pub(crate) pipeline: PipelineConfig,
    /// The budget the session is held to, if any.
    pub(crate) budget: Option<Budget>,
    /// Where the budget was read from (an input no output may overwrite).
    budget_path: Option<PathBuf>,
    /// The voice that speaks the answers, if any.
    pub(crate) voice: Option<voxline_pipeline::voice::VoiceChoice>,
    /// Ctrl-C and SIGTERM, once something can wait on them.
    shutdown: std::sync::OnceLock<ShutdownHandle>,
}

/// What a subcommand runs in a [`Session`].
pub(crate) struct Run<'a> {
    /// What the pipeline plays: recordings or a microphone.
    pub(crate) source: Source,
    /// How recordings are played (the report names a live source `live`).
    pub(crate) pace: Pace,
    /// The recordings as the report's configuration lists them.
    pub(crate) files: Vec<PathBuf>,
    /// Leading turns excluded from the summary as warm-up.
    pub(crate) warmup: usize,
    /// Silence between two recordings, ms (`None`: the pipeline's default).
    pub(crate) gap_ms: Option<u32>,
    /// Where every event goes as JSON lines, if anywhere.
    pub(crate) events: Option<Output>,
    /// Print transcripts and answers.
    pub(crate) console: bool,
    /// Called with every pipeline event (a progress bar).
    pub(crate) on_event: Option<EventHook>,
    /// The fault to inject (`VOXLINE_FAULT`), if any.
    pub(crate) fault: Option<Fault>,
    /// Cancel the answer in flight on Ctrl-C/SIGTERM instead of letting it finish.
    pub(crate) cancel_on_stop: bool,
    /// How speech over the voice stops it (live; `None`: never).
    pub(crate) barge_in: Option<voxline_audio::BargeInOptions>,
    /// Live with a voice: the echo canceller (`None`: `--no-aec`).
    pub(crate) echo_cancellation: Option<voxline_audio::AecOptions>,
    /// Probe the host's speed before the models load and after the run
    /// (`bench` always; any run whose budget has `[host]`).
    pub(crate) probe_host: bool,
    /// Called after the warnings are shown, just before the models load.
    pub(crate) before_load: &'a dyn Fn(),
    /// Called once the models are loaded, just before the audio starts.
    pub(crate) after_load: &'a dyn Fn(),
}

/// A session that ran: the pipeline's result and the report built from it.
pub(crate) struct Ran {
    /// What the pipeline returned.
    pub(crate) result: RunResult,
    /// The report, judged against the budget.
    pub(crate) report: Report,
}

impl Session {
    /// Checks the engine and VAD options and loads the budget, in that
    /// order (the first bad input is the one reported).
    ///
    /// # Errors
    /// [`BadInput`] for an engine or VAD option; the budget's error when it
    /// cannot be read or parsed.
    pub(crate) fn new(
        engine: &EngineArgs,
        vad: &VadArgs,
        budget: Option<&Path>,
        voice: VoiceArg,
    ) -> anyhow::Result<Self> {
        let (settings, warnings) = engine.settings()?;
        let voice = engine.voice_choice(voice)?;
        let models_dir =
            voxline_models::location::resolve_from_process(engine.models_dir.as_deref());
        let pipeline = vad.pipeline(&settings, &models_dir)?;
        let loaded = budget.map(Budget::load).transpose()?;
        if let (Some(b), Some(path)) = (&loaded, budget) {
            // the CLI's pipeline is the standard one
            let standard = voxline_pipeline::topology::standard(
                voxline_pipeline::topology::AudioEdge::Replay,
                1,
            );
            b.check_terms(&standard)
                .map_err(|e| voxline_pipeline::BadInput(format!("{}: {}", path.display(), e.0)))?;
        }
        Ok(Self {
            settings,
            warnings,
            pipeline,
            budget: loaded,
            budget_path: budget.map(Path::to_path_buf),
            voice,
            shutdown: std::sync::OnceLock::new(),
        })
    }

    /// The session's stop: Ctrl-C and SIGTERM are the session's from the
    /// first call on (e.g. before waiting for a named pipe's writer).
    pub(crate) fn stop(&self) -> &ShutdownHandle {
        self.shutdown.get_or_init(|| {
            let h = ShutdownHandle::new();
            install_signal_handler(h.clone());
            h
        })
    }

    /// Plans the outputs (`(flag, path)`; `None` = not given) against each
    /// other and everything the session reads: the `recordings`, the
    /// models, the budget and `other_inputs`. The result is aligned with
    /// `outputs`.
    ///
    /// # Errors
    /// [`BadInput`] when an output clashes with another or with an input,
    /// or cannot be written.
    pub(crate) fn plan_outputs(
        &self,
        outputs: &[(&'static str, Option<&Path>)],
        recordings: &[PathBuf],
        other_inputs: &[Option<&Path>],
    ) -> Result<Vec<Option<Output>>, BadInput> {
        let mut others = vec![self.budget_path.as_deref()];
        others.extend_from_slice(other_inputs);
        plan_outputs(outputs, &self.settings, recordings, &others)
    }

    /// Runs the session: installs the signal handler, shows the warnings,
    /// loads the engines, runs the pipeline from `run.source` and builds the
    /// report. `None` when a signal came during the model load (no session
    /// happened).
    ///
    /// # Errors
    /// When a model cannot be loaded or the pipeline cannot run.
    pub(crate) fn run(mut self, run: Run<'_>) -> anyhow::Result<Option<Ran>> {
        let shutdown = self.stop().clone();
        for w in &self.warnings {
            eprintln!("voxline: warning: {w}");
        }
        // the probe runs with nothing loaded yet, on the pipeline's threads
        let probe = (run.probe_host || self.budget.as_ref().is_some_and(|b| b.host.is_some()))
            .then(|| report::host::HostProbe::before(self.settings.threads.total));
        (run.before_load)();
        let Some((stt, llm, mut model_load_ms)) = load_engines(&mut self.settings, &shutdown)?
        else {
            return Ok(None);
        };
        let t0 = Instant::now();
        let voice = match &self.voice {
            Some(v) => Some(v.load(self.settings.threads.total)?),
            None => None,
        };
        model_load_ms += t0.elapsed().as_secs_f64() * 1000.0;
        if shutdown.is_requested() {
            return Ok(None);
        }
        // a live session's report is tallied as it goes (nothing is kept)
        let tally = matches!(run.source, Source::Live(_) | Source::Pushed(_))
            .then(|| Arc::new(Mutex::new(Tally::for_session(run.warmup))));
        let opts = RunOptions {
            pace: run.pace,
            events: run.events,
            console: run.console,
            on_event: run.on_event,
            cancel_on_stop: run.cancel_on_stop,
            barge_in: run.barge_in,
            echo_cancellation: run.echo_cancellation,
            observer: tally.clone().map(|t| t as pipeline::SharedObserver),
            gap_ms: run.gap_ms.unwrap_or(RunOptions::default().gap_ms),
            fault: run.fault,
            ..self.pipeline.run_options()
        };
        let gap_ms = matches!(run.source, Source::Replay(_)).then_some(opts.gap_ms);
        let (stt, llm) = engine_stages(stt, llm, &self.settings.threads);
        (run.after_load)();
        let pace = match run.source {
            Source::Live(_) | Source::Pushed(_) => Pace::Live,
            Source::Replay(_) => run.pace,
        };
        let extras = match voice {
            Some(v) => pipeline::Extras::default().voice(v),
            None => pipeline::Extras::default(),
        };
        let result =
            pipeline::run_source_with(run.source, stt, llm, extras, &opts, Some(shutdown))?;
        let mut config = RunConfig::from_settings(&self.settings, pace, run.files, run.warmup);
        config.voice = self.voice.as_ref().map(|v| v.name().to_owned());
        config.gap_ms = gap_ms;
        config.record_pipeline(&self.pipeline);
        let load_ms = model_load_ms + result.outcome.startup.as_secs_f64() * 1000.0;
        let mut report = match tally {
            Some(t) => {
                // every thread is joined: nothing else holds it now
                let mut t = voxline_core::sync::lock(&t);
                t.close(result.outcome.failed.as_deref());
                t.report(&result, config, load_ms, self.budget.as_ref())
            }
            None => report::build(&result, config, load_ms, self.budget.as_ref()),
        };
        if let Some(p) = probe {
            report.set_host(p.after(), self.budget.as_ref());
        }
        Ok(Some(Ran { result, report }))
    }
}

/// The language model as loaded: llama.cpp's weights, or a conversation
/// on a remote server.
enum LlmLoaded {
    Llama(voxline_llm::LlmModel),
    Remote(Box<voxline_remote::RemoteChat>),
}

/// Loads both engines, timing it (the cold-start figure; the language
/// model's context is made when its stage starts, counted in
/// [`RunOutcome::startup`](voxline_core::RunOutcome)). A remote engine's
/// server is checked instead, before anything loads (one line and exit 2
/// when it does not answer). The language model loads first: its system
/// prompt is checked against the context before anything else is spent.
/// `None` when a stop came during the servers' check.
fn load_engines(
    settings: &mut EngineSettings,
    shutdown: &ShutdownHandle,
) -> anyhow::Result<Option<(voxline_pipeline::engines::Stt, LlmLoaded, f64)>> {
    use voxline_pipeline::engines::Stt;
    use voxline_pipeline::settings::{LlmBackend, SttBackend};
    let t0 = Instant::now();
    let remotes = if settings.stt.remote().is_some() || settings.llm.remote().is_some() {
        // a server that stalls the check holds the first Ctrl-C up no
        // longer than the stop's poll: the check runs beside this thread
        let checked = settings.clone();
        let Some(remotes) = until_stopped(shutdown, move || {
            voxline_pipeline::engines::connect(&checked)
        })?
        else {
            return Ok(None);
        };
        remotes?
    } else {
        voxline_pipeline::engines::Remotes::default()
    };
    // the report names the models the servers serve
    if let (SttBackend::Remote(r), Some((_, model))) = (&mut settings.stt, &remotes.stt) {
        r.model = Some(model.clone());
    }
    if let (LlmBackend::Remote(r, _), Some((_, model))) = (&mut settings.llm, &remotes.llm) {
        r.model = Some(model.clone());
    }
    let settings = &*settings;
    let llm = match (remotes.chat(settings), settings.llm_config()) {
        (Some(chat), _) => LlmLoaded::Remote(Box::new(chat)),
        (None, Some(config)) => LlmLoaded::Llama(
            voxline_llm::LlmModel::load(config).context("loading the language model")?,
        ),
        (None, None) => anyhow::bail!("the language model has neither a model nor a server"),
    };
    let stt = match (remotes.stt(), settings.stt_config(), settings.ct2_config()) {
        (Some(remote), _, _) => Stt::Remote(remote),
        (None, _, Some(config)) => {
            Stt::Ct2(voxline_ct2::Ct2Engine::load(config).context("loading the speech model")?)
        }
        (None, Some(config), None) => {
            Stt::Whisper(voxline_stt::SttEngine::load(config).context("loading the speech model")?)
        }
        (None, None, None) => anyhow::bail!("speech to text has neither a model nor a server"),
    };
    Ok(Some((stt, llm, t0.elapsed().as_secs_f64() * 1000.0)))
}

/// Runs `f` on a thread of its own and waits for it or for a stop,
/// whichever comes first (`None`: the stop; the thread is left to end with
/// the process).
///
/// # Errors
/// When no thread can be made for it.
fn until_stopped<T: Send + 'static>(
    shutdown: &ShutdownHandle,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<Option<T>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("server-check".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .context("no thread could be made to check the servers")?;
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(100)) {
            Ok(v) => return Ok(Some(v)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !shutdown.is_requested() => {}
            Err(_) => return Ok(None),
        }
    }
}

/// The engine stages as the session runs them, their threads following
/// the load in priority mode.
fn engine_stages(
    stt: voxline_pipeline::engines::Stt,
    llm: LlmLoaded,
    threads: &voxline_pipeline::settings::ThreadBudget,
) -> (
    voxline_stt::SttStage<voxline_pipeline::engines::Stt>,
    voxline_pipeline::engines::ChatStart,
) {
    use voxline_pipeline::engines::ChatStart;
    // in priority mode both engines' threads follow the cores other processes leave free
    let governor = (threads.share == voxline_pipeline::settings::CpuShare::Priority)
        .then(|| voxline_core::CpuGovernor::new(threads.total, true));
    let stt = voxline_stt::SttStage::new(stt).with_governor(governor.clone());
    let llm = match llm {
        LlmLoaded::Llama(model) => ChatStart::Llama(model, governor),
        LlmLoaded::Remote(chat) => ChatStart::Remote(*chat),
    };
    (stt, llm)
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
    inputs.extend(settings.stt.files());
    inputs.extend(settings.llm.model().map(Path::to_path_buf));
    inputs.extend(other_inputs.iter().flatten().map(|p| p.to_path_buf()));
    let mut planned = output::plan(&given, &inputs, recordings)?.into_iter();
    Ok(outputs
        .iter()
        .map(|(_, p)| p.and_then(|_| planned.next()))
        .collect())
}

/// Writes a whole output (atomically for a file).
pub(crate) fn write_output(out: &Output, bytes: &[u8]) -> anyhow::Result<()> {
    out.write_all(bytes).map_err(anyhow::Error::msg)
}

/// Writes the report as JSON to `json` if given, then tells the user how
/// the session went: the inputs refused, a failure, the summary line (unless
/// `quiet` without a budget) and every broken budget limit.
///
/// # Errors
/// When the report cannot be written.
pub(crate) fn finish_report(
    rep: &Report,
    json: Option<&Output>,
    quiet: bool,
) -> anyhow::Result<()> {
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

/// The exit status a session's report calls for.
pub(crate) fn outcome_of(rep: &Report) -> Outcome {
    if rep.failed.is_some() {
        Outcome::Failed
    } else if rep.interrupted && rep.config.pace != Pace::Live {
        Outcome::Interrupted
    } else if !rep.input_errors.is_empty() {
        Outcome::BadInputSeen
    } else if !rep.summary.budget.passed {
        Outcome::BudgetBroken
    } else {
        Outcome::Ok
    }
}
