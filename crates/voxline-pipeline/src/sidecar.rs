//! Fixture sidecars: the expected transcript and true speech boundaries of a recording.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::BadInput;

/// One spoken turn in a recording.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SidecarTurn {
    /// What was said.
    pub text: String,
    /// First speech sample (at the file's rate).
    pub start_sample: u64,
    /// One past the last speech sample (at the file's rate).
    pub end_sample: u64,
}

/// The sidecar JSON next to a fixture (`NAME.json` beside `NAME.wav`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Sidecar {
    /// The file's sample rate (boundaries are in its samples).
    pub sample_rate: u32,
    /// The spoken turns, in order.
    pub turns: Vec<SidecarTurn>,
}

impl Sidecar {
    /// The sidecar path for a recording.
    #[must_use]
    pub fn path_for(wav: &Path) -> PathBuf {
        wav.with_extension("json")
    }

    /// Loads the sidecar beside `wav`, if there is one.
    ///
    /// # Errors
    /// [`BadInput`] naming the file when it exists but is malformed or inconsistent.
    pub fn load_for(wav: &Path) -> Result<Option<Self>, BadInput> {
        let path = Self::path_for(wav);
        if path.is_dir() {
            return Err(BadInput(format!(
                "{}: the sidecar of {} is a directory, not a JSON file; move it out of the way (a sidecar is optional)",
                path.display(),
                wav.display()
            )));
        }
        match std::fs::read(&path) {
            Ok(bytes) => Self::parse(&bytes)
                .map(Some)
                .map_err(|e| BadInput(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(BadInput(format!(
                "{}: cannot read the sidecar of {} ({}); fix its permissions or move it out of the way",
                path.display(),
                wav.display(),
                crate::io_reason(&e)
            ))),
        }
    }

    /// Checks the sidecar against its recording: the same sample rate, and
    /// every turn inside the audio (`frames` = the file's length in samples
    /// per channel, when known).
    ///
    /// # Errors
    /// A message naming the field that does not match the audio.
    pub fn check_against(&self, sample_rate: u32, frames: Option<u64>) -> Result<(), String> {
        if self.sample_rate != sample_rate {
            return Err(format!(
                "sample_rate is {} but the recording is {sample_rate} Hz; set sample_rate to {sample_rate} (the turn boundaries count the recording's samples)",
                self.sample_rate
            ));
        }
        if let Some(frames) = frames {
            for (i, t) in self.turns.iter().enumerate() {
                if t.end_sample > frames {
                    return Err(format!(
                        "turn {i} end_sample {} is past the end of the recording ({frames} samples); fix the turn's boundaries",
                        t.end_sample
                    ));
                }
            }
        }
        Ok(())
    }

    /// Parses and checks a sidecar.
    ///
    /// # Errors
    /// A message saying what is wrong: invalid JSON, a 0 Hz rate, a turn
    /// ending before it starts, or turns out of order.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let s: Self =
            serde_json::from_slice(bytes).map_err(|e| format!("invalid sidecar JSON ({e})"))?;
        if s.sample_rate == 0 {
            return Err("sidecar sample_rate is 0".into());
        }
        let mut prev_end = 0;
        for (i, t) in s.turns.iter().enumerate() {
            if t.end_sample <= t.start_sample {
                return Err(format!(
                    "sidecar turn {i} ends at {} before it starts at {}",
                    t.end_sample, t.start_sample
                ));
            }
            if t.start_sample < prev_end {
                return Err(format!("sidecar turn {i} overlaps the turn before it"));
            }
            prev_end = t.end_sample;
        }
        Ok(s)
    }

    /// Converts a position at the file's rate to 16 kHz.
    #[must_use]
    pub fn to_16k(&self, sample: u64) -> u64 {
        ((u128::from(sample) * u128::from(voxline_core::SAMPLE_RATE)
            + u128::from(self.sample_rate) / 2)
            / u128::from(self.sample_rate)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks() {
        let s = Sidecar::parse(br#"{"sample_rate":44100,"turns":[{"text":"hi","start_sample":22050,"end_sample":44100}],"extra":1}"#).unwrap();
        assert_eq!(s.to_16k(22050), 8000);
        assert_eq!(s.to_16k(44100), 16000);
        assert!(Sidecar::parse(b"{")
            .unwrap_err()
            .contains("invalid sidecar JSON"));
        assert!(Sidecar::parse(br#"{"sample_rate":0,"turns":[]}"#).is_err());
        assert!(Sidecar::parse(
            br#"{"sample_rate":16000,"turns":[{"text":"a","start_sample":5,"end_sample":5}]}"#
        )
        .is_err());
        assert!(Sidecar::parse(br#"{"sample_rate":16000,"turns":[{"text":"a","start_sample":0,"end_sample":9},{"text":"b","start_sample":5,"end_sample":12}]}"#).is_err());
    }

    #[test]
    fn checked_against_the_recording() {
        let s = Sidecar::parse(
            br#"{"sample_rate":16000,"turns":[{"text":"a","start_sample":0,"end_sample":16000}]}"#,
        )
        .unwrap();
        assert!(s.check_against(16_000, Some(16_000)).is_ok());
        assert!(s.check_against(16_000, None).is_ok());
        let e = s.check_against(44_100, Some(44_100)).unwrap_err();
        assert!(
            e.contains("sample_rate is 16000") && e.contains("44100 Hz"),
            "{e}"
        );
        let e = s.check_against(16_000, Some(15_999)).unwrap_err();
        assert!(
            e.contains("turn 0 end_sample 16000") && e.contains("15999"),
            "{e}"
        );
    }
}
