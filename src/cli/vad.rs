//! The endpointing options (`--vad-threshold`, `--hangover-ms`,
//! `--spec-silence-ms`, ...) and their validation into a [`VadConfig`].

use std::path::PathBuf;

use clap::Args;
use voxline_audio::turn::{SharedTurnModel, TurnModel, TurnPolicy};
use voxline_audio::VadConfig;
use voxline_models::location::ModelsDir;
use voxline_models::registry;
use voxline_pipeline::pipeline::PipelineConfig;
use voxline_pipeline::BadInput;

#[derive(Args, Clone)]
pub(crate) struct VadArgs {
    /// Speech probability at or above which a frame is speech.
    #[arg(long, default_value_t = VadConfig::default().threshold)]
    pub(crate) vad_threshold: f32,
    /// Speech probability of a confident speech frame: a speculative end of
    /// turn starts --spec-silence-ms after the last one.
    #[arg(long, default_value_t = VadConfig::default().spec_threshold)]
    pub(crate) spec_threshold: f32,
    /// Shortest utterance kept, ms.
    #[arg(long, default_value_t = VadConfig::default().min_speech_ms)]
    pub(crate) min_speech_ms: u32,
    /// Silence that ends an utterance, ms.
    #[arg(long, default_value_t = voxline_pipeline::settings::DEFAULT_HANGOVER_MS)]
    pub(crate) hangover_ms: u32,
    /// Audio kept before the detected start, ms.
    #[arg(long, default_value_t = VadConfig::default().pre_roll_ms)]
    pub(crate) pre_roll_ms: u32,
    /// Longest utterance before a forced split, ms.
    #[arg(long, default_value_t = VadConfig::default().max_utterance_ms)]
    pub(crate) max_utterance_ms: u32,
    /// Silence after the last confident speech frame (--spec-threshold) after
    /// which a turn is sent to STT and the LLM early (speculatively), ms; the
    /// hangover then commits it, or resumed speech cancels it.
    #[arg(long, default_value_t = voxline_pipeline::settings::DEFAULT_SPEC_SILENCE_MS)]
    pub(crate) spec_silence_ms: u32,
    /// Wait for the hangover before any work starts (no speculative turns).
    #[arg(long)]
    pub(crate) no_speculation: bool,
    /// The semantic end of turn (the default wherever its model is
    /// installed; with this flag, an error where it is not): the end-of-turn
    /// model (smart-turn) judges each pause; one it finds complete ends the
    /// turn after --turn-complete-ms, one it finds incomplete waits up to
    /// --turn-incomplete-ms, and an unsure one --hangover-ms, unless the
    /// words of the pause's speculative transcript make a finished sentence.
    #[arg(long, conflicts_with = "no_semantic_turn")]
    pub(crate) semantic_turn: bool,
    /// End a turn on silence alone (--hangover-ms), without the end-of-turn
    /// model (the --turn-* options, which set it, are refused with it).
    #[arg(long, conflicts_with_all = [
        "turn_threshold", "turn_incomplete_below", "turn_probe_ms", "turn_complete_ms",
        "turn_incomplete_ms", "turn_merge_ms", "no_turn_words", "turn_model",
    ])]
    pub(crate) no_semantic_turn: bool,
    /// The end-of-turn model's probability above which a pause ends the turn.
    #[arg(long, default_value_t = TurnPolicy::default().threshold, allow_hyphen_values = true)]
    pub(crate) turn_threshold: f32,
    /// The probability below which a pause is judged incomplete (between it
    /// and --turn-threshold the silence-only --hangover-ms ends the turn).
    #[arg(long, default_value_t = TurnPolicy::default().incomplete_below, allow_hyphen_values = true)]
    pub(crate) turn_incomplete_below: f32,
    /// Silence after the last confident speech frame at which the
    /// end-of-turn model judges the pause, ms.
    #[arg(long, default_value_t = TurnPolicy::default().probe_ms)]
    pub(crate) turn_probe_ms: u32,
    /// Silence that ends a turn the model judged complete, ms.
    #[arg(long, default_value_t = TurnPolicy::default().complete_ms)]
    pub(crate) turn_complete_ms: u32,
    /// Silence that ends a turn the model judged incomplete (the speaker
    /// paused mid-sentence and said no more), ms.
    #[arg(long, default_value_t = TurnPolicy::default().incomplete_ms)]
    pub(crate) turn_incomplete_ms: u32,
    /// A turn the model ended early is taken back, and merged into the
    /// next, when speech starts again within this long of its end, ms (0:
    /// never; needs speculation, so it is refused with --no-speculation).
    #[arg(long, default_value_t = TurnPolicy::default().merge_ms, conflicts_with = "no_speculation")]
    pub(crate) turn_merge_ms: u32,
    /// With --semantic-turn, no second opinion from the words: a pause the
    /// model judged incomplete waits out --turn-incomplete-ms even when the
    /// speculative transcript is a finished sentence, and a turn the model
    /// ended is taken back by speech within --turn-merge-ms whatever its
    /// words.
    #[arg(long)]
    pub(crate) no_turn_words: bool,
    /// The end-of-turn model (default: smart-turn in the models directory).
    #[arg(long, value_name = "PATH")]
    pub(crate) turn_model: Option<PathBuf>,
}

impl VadArgs {
    /// Validates the endpointing options into the VAD's configuration.
    ///
    /// # Errors
    /// [`BadInput`] naming the option out of range.
    pub(crate) fn config(&self) -> Result<VadConfig, BadInput> {
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

    /// The semantic end of turn's policy, checked (`None`: turned off by
    /// --no-semantic-turn; on by default, where its model is installed).
    ///
    /// # Errors
    /// [`BadInput`] naming the option out of range.
    pub(crate) fn turn_policy(&self) -> Result<Option<TurnPolicy>, BadInput> {
        if self.no_semantic_turn {
            return Ok(None);
        }
        let policy = TurnPolicy {
            threshold: self.turn_threshold,
            incomplete_below: self.turn_incomplete_below,
            complete_ms: self.turn_complete_ms,
            incomplete_ms: self.turn_incomplete_ms,
            probe_ms: self.turn_probe_ms,
            merge_ms: self.turn_merge_ms,
            words: !self.no_turn_words,
        };
        policy.validate().map_err(|e| match e {
            voxline_audio::AudioError::InvalidVadConfig { field, reason } => {
                BadInput(format!("--{}: {reason}", field.replace('_', "-")))
            }
            other => BadInput::from_display(other),
        })?;
        Ok(Some(policy))
    }

    /// Loads the end-of-turn model unless --no-semantic-turn: to run on the
    /// VAD stage's thread beside the engines, and on the pipeline's
    /// `threads` while the engines' cores are free. When neither flag asks
    /// for it and the model or its runtime is not installed, turns end on
    /// silence alone (and a line says so).
    ///
    /// # Errors
    /// [`BadInput`] for an option out of range, a model or runtime that is
    /// missing when a flag asks for it, or one that is damaged or not what
    /// it should be.
    pub(crate) fn semantic_turn(
        &self,
        models_dir: &ModelsDir,
        threads: usize,
    ) -> Result<Option<(SharedTurnModel, TurnPolicy)>, BadInput> {
        let Some(policy) = self.turn_policy()? else {
            return Ok(None);
        };
        let runtime = models_dir.path.join(registry::ONNX_RUNTIME.file);
        let model = self
            .turn_model
            .clone()
            .unwrap_or_else(|| models_dir.path.join(registry::SMART_TURN.file));
        let fetch = crate::cmd::models::fetch_command(models_dir);
        let asked = self.semantic_turn || self.turn_model.is_some();
        if !(asked || model.is_file() && runtime.is_file()) {
            tracing::info!(
                "the semantic end of turn is off: its model is not installed (run {fetch}); \
                 turns end on silence alone"
            );
            return Ok(None);
        }
        voxline_pipeline::pipeline::hangover_judged(
            self.hangover_ms,
            (!self.no_speculation).then_some(self.spec_silence_ms),
            &policy,
        )?;
        for (path, given) in [(&model, self.turn_model.is_some()), (&runtime, false)] {
            if !path.is_file() {
                let hint = if given {
                    "check the path given to --turn-model".to_owned()
                } else {
                    format!("run {fetch}")
                };
                return Err(BadInput(format!(
                    "{}: not installed — {hint}, or run with --no-semantic-turn",
                    path.display()
                )));
            }
            voxline_models::installed::check_installed(path).map_err(BadInput::from_display)?;
        }
        // one thread beside the engines; all the pipeline's while they are idle
        let loaded = TurnModel::load(&model, &runtime, threads).map_err(BadInput::from_display)?;
        Ok(Some((SharedTurnModel::new(loaded), policy)))
    }

    /// The pipeline's configuration from these options and the engines'
    /// `settings` (how they share the cores), validated once, with the
    /// semantic end of turn's model loaded.
    ///
    /// # Errors
    /// [`BadInput`] for an option out of range, or an end-of-turn model that
    /// is missing or damaged.
    pub(crate) fn pipeline(
        &self,
        settings: &voxline_pipeline::settings::EngineSettings,
        models_dir: &ModelsDir,
    ) -> Result<PipelineConfig, BadInput> {
        let config = PipelineConfig {
            vad: self.config()?,
            spec_silence_ms: (!self.no_speculation).then_some(self.spec_silence_ms),
            semantic_turn: self.semantic_turn(models_dir, settings.threads.total)?,
            cpu_share: settings.threads.share,
        };
        config.validate()?;
        Ok(config)
    }
}
