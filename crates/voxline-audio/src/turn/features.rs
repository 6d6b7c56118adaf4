//! What a semantic end-of-turn model hears: whisper's log-mel spectrogram
//! of the last 8 s of a turn, as Pipecat's smart-turn v3 takes it
//! (`input_features`, 80 mel bands × 800 frames of 10 ms).
//!
//! The recipe: the last 8 s, left-padded with silence; the waveform
//! normalised to zero mean and unit variance; a centred STFT (reflected
//! edges, periodic Hann window of 400 samples, hop 160); the power of each
//! bin projected on 80 Slaney mel filters (area-normalised, 0 to 8 kHz);
//! `log10` with a floor of 1e-10; the last frame dropped; everything below
//! the maximum − 8 raised to it; then `(x + 4) / 4`. Checked against
//! values the reference implementation computed for two fixtures
//! (`tests/data/turn_features_reference.json`).

use crate::mel::LogMel;

/// Samples of audio the features cover (8 s at 16 kHz).
pub const WINDOW_SAMPLES: usize = 8 * voxline_core::SAMPLE_RATE as usize;
/// Mel bands.
pub const N_MELS: usize = crate::mel::N_MELS;
/// Frames (10 ms each).
pub const N_FRAMES: usize = 800;

const VARIANCE_EPS: f32 = 1e-7;

/// Computes the features; holds whisper's log-mel transform.
#[derive(Debug, Default)]
pub struct TurnFeatures {
    mel: LogMel,
}

impl TurnFeatures {
    /// The transform for 16 kHz audio.
    #[must_use]
    pub fn new() -> Self {
        Self { mel: LogMel::new() }
    }

    /// The features of the last 8 s of `audio` (16 kHz mono), row-major:
    /// `N_MELS` bands of `N_FRAMES` frames.
    pub fn compute(&mut self, audio: &[f32]) -> Vec<f32> {
        let mut x = vec![0f32; WINDOW_SAMPLES];
        let take = audio.len().min(WINDOW_SAMPLES);
        x[WINDOW_SAMPLES - take..].copy_from_slice(&audio[audio.len() - take..]);
        normalise(&mut x);
        self.mel.compute(&x, N_FRAMES)
    }
}

/// Zero mean, unit variance (in f32, as the reference does).
fn normalise(x: &mut [f32]) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    #[allow(clippy::cast_possible_truncation)]
    let (mean, scale) = (mean as f32, (var as f32 + VARIANCE_EPS).sqrt());
    for v in x {
        *v = (*v - mean) / scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_and_a_tone_give_the_shapes_and_ranges_expected() {
        let mut f = TurnFeatures::new();
        let silence = f.compute(&[]);
        assert_eq!(silence.len(), N_MELS * N_FRAMES);
        // all at the floor: one value everywhere
        assert!(silence.iter().all(|&v| (v - silence[0]).abs() < 1e-6));
        let tone: Vec<f32> = (0..16_000)
            .map(|i| (std::f32::consts::TAU * 1000.0 * i as f32 / 16_000.0).sin() * 0.5)
            .collect();
        let t = f.compute(&tone);
        let top = t.iter().copied().fold(f32::MIN, f32::max);
        let low = t.iter().copied().fold(f32::MAX, f32::min);
        // the clamp: at most 8 decades (2.0 after the scaling) below the top
        assert!(top - low <= 2.0 + 1e-5, "{top} {low}");
        // the tone is in the last second (the right end) only
        let band = (0..N_MELS)
            .max_by(|&a, &b| t[a * N_FRAMES + 790].total_cmp(&t[b * N_FRAMES + 790]))
            .unwrap_or(0);
        assert!(t[band * N_FRAMES + 790] > t[band * N_FRAMES + 100] + 1.0);
    }
}
