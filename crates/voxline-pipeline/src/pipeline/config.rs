//! What every path runs with ([`PipelineConfig`]): replay, live, each
//! conversation of the server and of the capacity bench. The command line
//! validates it once; its [`Default`] is the command line's default.

use voxline_audio::VadConfig;

use super::{RunOptions, SemanticTurn};
use crate::settings::{CpuShare, DEFAULT_SPEC_SILENCE_MS};
use crate::BadInput;

/// The endpointing and CPU-sharing choices a pipeline runs with, whatever
/// feeds it. [`PipelineConfig::default`] is what `voxline` runs with no
/// flags; [`RunOptions::default`] and a server built on the default
/// ([`crate::sessions::Hub::start`]) run it too, so that a test built on
/// the library's defaults runs what a user runs.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The voice activity detector and its silence-only end of turn.
    pub vad: VadConfig,
    /// Speculative turn-taking: the silence, in ms, after which the VAD
    /// sends a turn early (`None`: off). Default
    /// [`DEFAULT_SPEC_SILENCE_MS`].
    pub spec_silence_ms: Option<u32>,
    /// The semantic end of turn: model and policy (`None`: the hangover
    /// alone ends a turn, the default).
    pub semantic_turn: Option<SemanticTurn>,
    /// How the two engines share the cores. Default
    /// [`CpuShare::Priority`]. A server's conversations always take turns
    /// on one lease.
    pub cpu_share: CpuShare,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            vad: VadConfig::default(),
            spec_silence_ms: Some(DEFAULT_SPEC_SILENCE_MS),
            semantic_turn: None,
            cpu_share: CpuShare::Priority,
        }
    }
}

impl PipelineConfig {
    /// Checks every value: the VAD's ranges, and a speculative silence
    /// within the VAD's lookahead.
    ///
    /// # Errors
    /// [`BadInput`] naming the first value out of range.
    pub fn validate(&self) -> Result<(), BadInput> {
        self.vad.validate().map_err(BadInput::from_display)?;
        if let Some(ms) = self.spec_silence_ms {
            if ms == 0 || ms > voxline_audio::vad::MAX_PAD_MS {
                return Err(BadInput(format!(
                    "speculative silence {ms} ms: use 1..={} ms, or no speculation",
                    voxline_audio::vad::MAX_PAD_MS
                )));
            }
        }
        if let Some((_, policy)) = &self.semantic_turn {
            policy.validate().map_err(BadInput::from_display)?;
            hangover_judged(self.vad.hangover_ms, self.spec_silence_ms, policy)?;
        }
        Ok(())
    }

    /// The speculative silence that takes effect: none when it is not
    /// shorter than the hangover (it would never fire).
    #[must_use]
    pub fn speculation(&self) -> Option<u32> {
        self.spec_silence_ms.filter(|&ms| ms < self.vad.hangover_ms)
    }

    /// A run's options with this configuration (a board of its own for the
    /// speculative attempts) and the rest as [`RunOptions::default`].
    #[must_use]
    pub fn run_options(&self) -> RunOptions {
        RunOptions {
            vad: self.vad.clone(),
            speculation: self
                .speculation()
                .map(|ms| (voxline_core::SpecBoard::new(), ms)),
            semantic_turn: self.semantic_turn.clone(),
            cpu_share: self.cpu_share,
            ..RunOptions::bare()
        }
    }
}

/// Checks that a pause lasts long enough, with the semantic end of turn,
/// for the end-of-turn model to judge it and for its words to be read:
/// `hangover_ms` above the model's probe point and above the speculative
/// silence `spec_silence_ms` (the attempt whose words say whether the
/// sentence is finished). A shorter hangover ends every pause before either
/// (with 0, 16 or 48 ms the three questions of a conversation were heard as
/// one turn; with 0 every utterance was once dropped at its first frame).
///
/// # Errors
/// [`BadInput`] naming `--hangover-ms` and the smallest value that works.
pub fn hangover_judged(
    hangover_ms: u32,
    spec_silence_ms: Option<u32>,
    policy: &voxline_audio::turn::TurnPolicy,
) -> Result<(), BadInput> {
    let floor = spec_silence_ms.unwrap_or(0).max(policy.probe_ms);
    if hangover_ms > floor {
        return Ok(());
    }
    Err(BadInput(format!(
        "--hangover-ms {hangover_ms}: with the semantic end of turn a pause is judged, and \
         its words read, after {floor} ms of silence, so a shorter hangover ends every pause \
         unjudged; give more than {floor} ms, or --no-semantic-turn to end turns on silence alone"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_run_options_run_the_default_configuration() {
        let c = PipelineConfig::default();
        let o = RunOptions::default();
        assert_eq!(o.vad, c.vad);
        assert_eq!(o.vad.hangover_ms, crate::settings::DEFAULT_HANGOVER_MS);
        assert_eq!(
            o.speculation.as_ref().map(|(_, ms)| *ms),
            Some(DEFAULT_SPEC_SILENCE_MS)
        );
        assert_eq!(o.cpu_share, CpuShare::Priority);
        assert!(o.semantic_turn.is_none());
        c.validate().unwrap();
    }

    #[test]
    fn a_speculative_silence_as_long_as_the_hangover_is_off() {
        let mut c = PipelineConfig::default();
        c.spec_silence_ms = Some(c.vad.hangover_ms);
        assert_eq!(c.speculation(), None);
        assert!(c.run_options().speculation.is_none());
        c.spec_silence_ms = Some(0);
        assert!(c
            .validate()
            .unwrap_err()
            .0
            .contains("speculative silence 0 ms"));
    }
}
