//! The engine's settings, and how much of whisper's encoder window to run.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{SttError, MAX_POSITIONS, POSITIONS_PER_SECOND, SAMPLE_RATE};

/// How much of whisper's 30 s encoder window to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase", tag = "mode", content = "value")]
pub enum AudioCtx {
    /// The full window (1500 positions), whisper's default: slowest, the reference accuracy.
    Full,
    /// Sized to the utterance: its positions plus `pad` more, rounded up to a multiple of 64.
    Auto {
        /// Extra positions beyond the audio (50 per second).
        pad: u32,
    },
    /// A fixed number of positions.
    Fixed(u32),
    /// The default: [`AudioCtx::Full`] (see the README's audio_ctx table for why).
    #[default]
    Default,
}

impl AudioCtx {
    /// Parses `full`, `auto`, `auto+PAD` (PAD at most [`MAX_POSITIONS`]) or a number.
    ///
    /// # Errors
    /// [`SttError::Config`] on anything else, and for a PAD above
    /// [`MAX_POSITIONS`] (the whole window: a larger pad cannot mean anything).
    pub fn parse(s: &str) -> Result<Self, SttError> {
        let bad = || {
            SttError::Config(format!("--audio-ctx {s:?}: expected `full`, `auto`, `auto+PAD` or a number of encoder positions (1..=1500)"))
        };
        match s {
            "full" => Ok(Self::Full),
            "default" => Ok(Self::Default),
            "auto" => Ok(Self::Auto { pad: 64 }),
            _ => {
                if let Some(p) = s.strip_prefix("auto+") {
                    let too_big = || {
                        SttError::Config(format!(
                            "--audio-ctx {s:?}: the pad is at most {MAX_POSITIONS} encoder positions (the whole 30 s window); use `full` for the whole window"
                        ))
                    };
                    // digits only: a pad too large for a number is as wrong as one over the window
                    if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                        return match p.parse::<u32>() {
                            Ok(pad) if pad <= MAX_POSITIONS => Ok(Self::Auto { pad }),
                            _ => Err(too_big()),
                        };
                    }
                    return Err(bad());
                }
                match s.parse::<u32>() {
                    Ok(n) if (1..=MAX_POSITIONS).contains(&n) => Ok(Self::Fixed(n)),
                    _ => Err(bad()),
                }
            }
        }
    }

    /// The encoder positions to use for `n_samples` of 16 kHz audio (0 = the
    /// full window). Saturating: any length and pad give a valid answer.
    #[must_use]
    pub fn positions(self, n_samples: usize) -> u32 {
        match self {
            Self::Full | Self::Default => 0,
            Self::Fixed(n) => n.min(MAX_POSITIONS),
            Self::Auto { pad } => {
                // (a float-to-int `as` saturates)
                let audio = (n_samples as f64 / f64::from(SAMPLE_RATE) * POSITIONS_PER_SECOND)
                    .ceil() as u32;
                let rounded = audio.saturating_add(pad).div_ceil(64).saturating_mul(64);
                if rounded >= MAX_POSITIONS {
                    0
                } else {
                    rounded
                }
            }
        }
    }
}

impl std::fmt::Display for AudioCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Full => f.write_str("full"),
            Self::Default => f.write_str("default(full)"),
            Self::Auto { pad } => write!(f, "auto+{pad}"),
            Self::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SttConfig {
    /// The whisper.cpp ggml model file.
    pub model: PathBuf,
    /// CPU threads (from the pipeline's budget; never the engine's default).
    pub threads: usize,
    /// Offload to a GPU (needs the `cuda` feature).
    pub use_gpu: bool,
    /// Encoder window policy.
    pub audio_ctx: AudioCtx,
    /// Spoken language (`en`); ignored by English-only models.
    pub language: String,
    /// Flash attention in the encoder and decoder (whisper.cpp's own CLI
    /// default since 1.8). Off by default here: measured with this build on
    /// the 2-core machine it made tiny.en slower (q_capital, 2 threads:
    /// 1050 ms against 869 ms; 1 thread: 2038 against 1642) and, greedy,
    /// mis-heard the noisy fixture ("What is my capital of France?").
    pub flash_attn: bool,
    /// Beam size: 1 decodes greedily (the default: on tiny.en the beam
    /// costs time and gains nothing measured, see docs/decisions.md).
    pub beam: usize,
}

impl SttConfig {
    /// Settings for `model` with `threads` threads and defaults otherwise.
    #[must_use]
    pub fn new(model: impl Into<PathBuf>, threads: usize) -> Self {
        Self {
            model: model.into(),
            threads,
            use_gpu: false,
            audio_ctx: AudioCtx::Default,
            language: "en".into(),
            flash_attn: false,
            beam: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audio_ctx_parses_and_sizes() {
        assert_eq!(AudioCtx::parse("full").unwrap(), AudioCtx::Full);
        assert_eq!(AudioCtx::parse("auto").unwrap(), AudioCtx::Auto { pad: 64 });
        assert_eq!(
            AudioCtx::parse("auto+32").unwrap(),
            AudioCtx::Auto { pad: 32 }
        );
        assert_eq!(AudioCtx::parse("768").unwrap(), AudioCtx::Fixed(768));
        for bad in [
            "0", "1501", "auto+x", "fast", "", "auto+", "auto+-1", "auto+ 5",
        ] {
            assert!(AudioCtx::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            AudioCtx::parse("auto+1500").unwrap(),
            AudioCtx::Auto { pad: 1500 }
        );
        // 2.2 s → 110 positions + 64 pad = 174 → 192
        assert_eq!(AudioCtx::Auto { pad: 64 }.positions(35_200), 192);
        assert_eq!(AudioCtx::Full.positions(35_200), 0);
        assert_eq!(AudioCtx::Fixed(128).positions(1), 128);
        // long audio falls back to the full window
        assert_eq!(AudioCtx::Auto { pad: 64 }.positions(16_000 * 29), 0);
    }

    #[test]
    fn a_huge_audio_ctx_pad_is_bad_input_not_an_overflow() {
        for huge in [
            "auto+1501",
            "auto+4294967295",
            "auto+4294967296",
            "auto+99999999999999999999",
        ] {
            let err = AudioCtx::parse(huge).unwrap_err().to_string();
            assert!(
                err.contains("at most 1500") && err.contains("use `full`"),
                "{huge}: {err}"
            );
        }
        // however the value was made, sizing saturates to the full window
        for pad in [1500, 1501, u32::MAX - 63, u32::MAX] {
            assert_eq!(AudioCtx::Auto { pad }.positions(35_200), 0, "pad {pad}");
            assert_eq!(AudioCtx::Auto { pad }.positions(usize::MAX), 0, "pad {pad}");
        }
        assert_eq!(AudioCtx::Auto { pad: 0 }.positions(usize::MAX), 0);
        assert_eq!(AudioCtx::Fixed(u32::MAX).positions(1), 1500);
    }
}
