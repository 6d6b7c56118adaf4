//! The endpointing options (`--vad-threshold`, `--hangover-ms`,
//! `--spec-silence-ms`, ...) and their validation into a [`VadConfig`].

use clap::Args;
use voxline_audio::VadConfig;
use voxline_pipeline::BadInput;
use voxline_report::RunConfig;

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

    /// The silence after which turns are sent early, if speculation is on
    /// (a silence as long as the hangover never fires, so it is off then too).
    pub(crate) fn speculation(&self) -> Option<u32> {
        (!self.no_speculation && self.spec_silence_ms < self.hangover_ms)
            .then_some(self.spec_silence_ms)
    }

    /// Records the endpointing choices in the report's configuration.
    pub(crate) fn record(&self, config: &mut RunConfig) {
        config.hangover_ms = self.hangover_ms;
        config.spec_silence_ms = self.speculation();
    }
}
