//! The end-pointing settings and their checks.

use serde::Deserialize;

use super::{FRAME_SAMPLES, MAX_PAD_MS, MAX_UTTERANCE_LIMIT_MS};
use crate::{AudioError, TARGET_RATE};

/// End-pointing settings. Deserialises from e.g. a `[vad]` TOML table; missing
/// fields take their defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VadConfig {
    /// Speech-probability threshold in `[0, 1]`; a frame scoring at or above it is speech. Default 0.5.
    pub threshold: f32,
    /// The probability at or above which a frame is *confident* speech
    /// (a value below `threshold` acts as `threshold`). A speculative end of
    /// turn may start once a short silence follows the last confident frame
    /// ([`OpenUtterance::confident_end`]) rather than the last speech frame:
    /// earshot's score decays over 80–100 ms after the last word, and most of
    /// that tail then is no longer waited for. Segment bounds do not depend
    /// on it. Default 0.6 (chosen with `cargo bench --bench hangover`).
    pub spec_threshold: f32,
    /// Shortest speech span kept, in ms; shorter utterances are discarded. Default 250.
    pub min_speech_ms: u32,
    /// Non-speech that must follow the last speech frame before an utterance
    /// closes, in ms. Default [`DEFAULT_HANGOVER_MS`] (700), the CLI's.
    pub hangover_ms: u32,
    /// Audio kept before the first speech frame, in ms. Default 200.
    pub pre_roll_ms: u32,
    /// Longest utterance before a forced split, in ms. Default 20 000.
    pub max_utterance_ms: u32,
    /// How far before the `max_utterance_ms` limit a forced split looks for
    /// the quietest point to cut at, in ms (capped at a quarter of
    /// `max_utterance_ms`; 0 = cut at the limit). Default 2 500.
    pub split_search_ms: u32,
    /// Audio before a forced split's cut that the continuation repeats as
    /// lead-in, in ms (capped at a quarter of `max_utterance_ms`; 0 = none).
    /// Default 1 000.
    pub split_overlap_ms: u32,
}

/// The default silence that ends a turn, ms (the CLI's `--hangover-ms` and
/// [`VadConfig::default`]). With speculation a hangover costs no latency
/// while it is shorter than STT plus the first token (~950 ms on 2 cores),
/// and a longer one cuts fewer sentences at a breath pause: on the nine
/// real recordings in `audio-fixtures/human` 500 ms splits a counted list
/// in three, 600 ms and more keep every recording whole (`cargo bench
/// --bench hangover`). 700 ms leaves a margin.
pub const DEFAULT_HANGOVER_MS: u32 = 700;

/// The default silence after the last confident speech frame (see
/// [`VadConfig::spec_threshold`]) after which a turn is sent early
/// (speculative turn-taking), ms: three detector frames. Chosen by
/// measurement (see docs/turn-taking.md): an attempt that speech
/// interrupts is aborted at the engine's next step (whisper.cpp's next
/// graph node, CTranslate2's next encoder layer) and costs little, so a
/// short wait buys latency (the attempt starts ~95 ms after the true end of
/// speech, against ~150 ms with 64 ms after the last speech frame) for more
/// cancelled attempts.
pub const DEFAULT_SPEC_SILENCE_MS: u32 = 48;

impl Default for VadConfig {
    fn default() -> Self {
        VadConfig {
            threshold: 0.5,
            spec_threshold: 0.6,
            min_speech_ms: 250,
            hangover_ms: DEFAULT_HANGOVER_MS,
            pre_roll_ms: 200,
            max_utterance_ms: 20_000,
            split_search_ms: 2_500,
            split_overlap_ms: 1_000,
        }
    }
}

impl VadConfig {
    /// Checks every field's range.
    ///
    /// # Errors
    /// [`AudioError::InvalidVadConfig`] naming the first bad field: `threshold`
    /// or `spec_threshold` not in `[0, 1]`; `pre_roll_ms`, `hangover_ms`, `split_search_ms` or
    /// `split_overlap_ms` above 10 000;
    /// `max_utterance_ms` above 600 000, not longer than `pre_roll_ms` plus two
    /// 16 ms frames, or shorter than `min_speech_ms`.
    pub fn validate(&self) -> Result<(), AudioError> {
        let bad = |field, reason: String| Err(AudioError::InvalidVadConfig { field, reason });
        if !(0.0..=1.0).contains(&self.threshold) {
            return bad(
                "threshold",
                format!(
                    "{} is not a probability; use a value in [0, 1], e.g. 0.5",
                    self.threshold
                ),
            );
        }
        if !(0.0..=1.0).contains(&self.spec_threshold) {
            return bad(
                "spec_threshold",
                format!(
                    "{} is not a probability; use a value in [0, 1], e.g. 0.7",
                    self.spec_threshold
                ),
            );
        }
        if self.pre_roll_ms > MAX_PAD_MS {
            return bad(
                "pre_roll_ms",
                format!(
                    "{} ms is too long; use at most {MAX_PAD_MS} ms",
                    self.pre_roll_ms
                ),
            );
        }
        if self.hangover_ms > MAX_PAD_MS {
            return bad(
                "hangover_ms",
                format!(
                    "{} ms is too long; use at most {MAX_PAD_MS} ms",
                    self.hangover_ms
                ),
            );
        }
        for (field, value) in [
            ("split_search_ms", self.split_search_ms),
            ("split_overlap_ms", self.split_overlap_ms),
        ] {
            if value > MAX_PAD_MS {
                return bad(
                    field,
                    format!("{value} ms is too long; use at most {MAX_PAD_MS} ms"),
                );
            }
        }
        if self.max_utterance_ms > MAX_UTTERANCE_LIMIT_MS {
            return bad(
                "max_utterance_ms",
                format!(
                    "{} ms is too long; use at most {MAX_UTTERANCE_LIMIT_MS} ms",
                    self.max_utterance_ms
                ),
            );
        }
        // Room for the pre-roll and two frames, so an utterance can hold speech before a split.
        let frames_ms = (2 * FRAME_SAMPLES as u32 * 1000).div_ceil(TARGET_RATE);
        if self.max_utterance_ms <= self.pre_roll_ms + frames_ms {
            return bad(
                "max_utterance_ms",
                format!(
                    "{} ms leaves no room for speech after the {} ms pre-roll; use more than {} ms",
                    self.max_utterance_ms,
                    self.pre_roll_ms,
                    self.pre_roll_ms + frames_ms
                ),
            );
        }
        if self.max_utterance_ms < self.min_speech_ms {
            return bad(
                "max_utterance_ms",
                format!(
                    "{} ms is shorter than min_speech_ms ({} ms), so every utterance would be split",
                    self.max_utterance_ms, self.min_speech_ms
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vad::{Endpointer, SegmentTracker};

    #[test]
    fn config_validation() {
        assert!(VadConfig::default().validate().is_ok());
        let cases = [
            (
                VadConfig {
                    threshold: 1.5,
                    ..VadConfig::default()
                },
                "threshold",
            ),
            (
                VadConfig {
                    threshold: f32::NAN,
                    ..VadConfig::default()
                },
                "threshold",
            ),
            (
                VadConfig {
                    threshold: -0.1,
                    ..VadConfig::default()
                },
                "threshold",
            ),
            (
                VadConfig {
                    pre_roll_ms: 20_000,
                    ..VadConfig::default()
                },
                "pre_roll_ms",
            ),
            (
                VadConfig {
                    hangover_ms: 20_000,
                    ..VadConfig::default()
                },
                "hangover_ms",
            ),
            (
                VadConfig {
                    max_utterance_ms: 200,
                    ..VadConfig::default()
                },
                "max_utterance_ms",
            ),
            (
                VadConfig {
                    max_utterance_ms: 300,
                    min_speech_ms: 400,
                    ..VadConfig::default()
                },
                "max_utterance_ms",
            ),
            (
                VadConfig {
                    max_utterance_ms: 700_000,
                    ..VadConfig::default()
                },
                "max_utterance_ms",
            ),
            (
                VadConfig {
                    split_search_ms: 20_000,
                    ..VadConfig::default()
                },
                "split_search_ms",
            ),
            (
                VadConfig {
                    split_overlap_ms: 10_001,
                    ..VadConfig::default()
                },
                "split_overlap_ms",
            ),
        ];
        for (config, field) in cases {
            match config.validate() {
                Err(AudioError::InvalidVadConfig { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{config:?}: expected an error on {field}, got {other:?}"),
            }
            assert!(SegmentTracker::new(config.clone()).is_err());
            assert!(Endpointer::new(config).is_err());
        }
    }

    #[test]
    fn config_deserialises_with_defaults() {
        let config: VadConfig =
            serde_json::from_str(r#"{"hangover_ms": 300, "threshold": 0.6}"#).unwrap();
        assert_eq!(
            config,
            VadConfig {
                hangover_ms: 300,
                threshold: 0.6,
                ..VadConfig::default()
            }
        );
        assert!(serde_json::from_str::<VadConfig>(r#"{"hangover": 300}"#).is_err());
    }
}
