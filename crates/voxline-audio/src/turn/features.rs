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

use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

/// Samples of audio the features cover (8 s at 16 kHz).
pub const WINDOW_SAMPLES: usize = 8 * voxline_core::SAMPLE_RATE as usize;
/// Mel bands.
pub const N_MELS: usize = 80;
/// Frames (10 ms each).
pub const N_FRAMES: usize = 800;

const N_FFT: usize = 400;
const HOP: usize = 160;
const N_BINS: usize = N_FFT / 2 + 1;
const MEL_FLOOR: f64 = 1e-10;
const VARIANCE_EPS: f32 = 1e-7;

/// Computes the features; holds the FFT plan, the window and the filters.
pub struct TurnFeatures {
    fft: Arc<dyn RealToComplex<f64>>,
    window: Vec<f64>,
    /// `N_MELS` rows of `N_BINS` weights.
    filters: Vec<f64>,
    frame: Vec<f64>,
    spectrum: Vec<Complex<f64>>,
}

impl std::fmt::Debug for TurnFeatures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnFeatures").finish_non_exhaustive()
    }
}

impl Default for TurnFeatures {
    fn default() -> Self {
        Self::new()
    }
}

impl TurnFeatures {
    /// The plan, window and filter bank for 16 kHz audio.
    #[must_use]
    pub fn new() -> Self {
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT);
        let spectrum = fft.make_output_vec();
        let frame = fft.make_input_vec();
        let window = (0..N_FFT)
            .map(|n| 0.5 - 0.5 * (std::f64::consts::TAU * n as f64 / N_FFT as f64).cos())
            .collect();
        Self {
            fft,
            window,
            filters: slaney_filters(),
            frame,
            spectrum,
        }
    }

    /// The features of the last 8 s of `audio` (16 kHz mono), row-major:
    /// `N_MELS` bands of `N_FRAMES` frames.
    pub fn compute(&mut self, audio: &[f32]) -> Vec<f32> {
        let mut x = vec![0f32; WINDOW_SAMPLES];
        let take = audio.len().min(WINDOW_SAMPLES);
        x[WINDOW_SAMPLES - take..].copy_from_slice(&audio[audio.len() - take..]);
        normalise(&mut x);
        let pad = N_FFT / 2;
        let n = x.len();
        // reflected edges (the edge sample itself is not repeated)
        let at = |i: usize| -> f64 {
            let j = if i < pad {
                pad - i
            } else if i - pad >= n {
                2 * n - 2 - (i - pad)
            } else {
                i - pad
            };
            f64::from(x[j])
        };
        let mut log_mel = vec![0f64; N_MELS * N_FRAMES];
        let mut power = [0f64; N_BINS];
        for t in 0..N_FRAMES {
            for (k, v) in self.frame.iter_mut().enumerate() {
                *v = at(t * HOP + k) * self.window[k];
            }
            // lengths match the plan: the transform cannot fail
            let _ = self.fft.process(&mut self.frame, &mut self.spectrum);
            for (p, c) in power.iter_mut().zip(&self.spectrum) {
                *p = c.norm_sqr();
            }
            for m in 0..N_MELS {
                let row = &self.filters[m * N_BINS..(m + 1) * N_BINS];
                let e: f64 = row.iter().zip(&power).map(|(w, p)| w * p).sum();
                log_mel[m * N_FRAMES + t] = e.max(MEL_FLOOR).log10();
            }
        }
        let top = log_mel.iter().copied().fold(f64::MIN, f64::max);
        log_mel
            .iter()
            .map(|&v| ((v.max(top - 8.0) + 4.0) / 4.0) as f32)
            .collect()
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

fn hz_to_mel(f: f64) -> f64 {
    if f < 1000.0 {
        3.0 * f / 200.0
    } else {
        15.0 + (f / 1000.0).ln() * 27.0 / 6.4f64.ln()
    }
}

fn mel_to_hz(m: f64) -> f64 {
    if m < 15.0 {
        200.0 * m / 3.0
    } else {
        1000.0 * ((m - 15.0) * 6.4f64.ln() / 27.0).exp()
    }
}

/// Triangular Slaney mel filters, area-normalised, from 0 to 8 kHz:
/// `N_MELS` rows of `N_BINS` weights.
fn slaney_filters() -> Vec<f64> {
    let nyquist = f64::from(voxline_core::SAMPLE_RATE) / 2.0;
    let top = hz_to_mel(nyquist);
    let edges: Vec<f64> = (0..N_MELS + 2)
        .map(|i| mel_to_hz(top * i as f64 / (N_MELS + 1) as f64))
        .collect();
    let mut w = vec![0f64; N_MELS * N_BINS];
    for m in 0..N_MELS {
        let (lo, mid, hi) = (edges[m], edges[m + 1], edges[m + 2]);
        let norm = 2.0 / (hi - lo);
        for b in 0..N_BINS {
            let f = nyquist * b as f64 / (N_BINS - 1) as f64;
            let down = (f - lo) / (mid - lo);
            let up = (hi - f) / (hi - mid);
            w[m * N_BINS + b] = down.min(up).max(0.0) * norm;
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_are_triangles_of_equal_area_that_cover_the_band() {
        let w = slaney_filters();
        for m in 0..N_MELS {
            let row = &w[m * N_BINS..(m + 1) * N_BINS];
            assert!(row.iter().all(|&v| v >= 0.0));
            let peak = row.iter().copied().fold(0.0, f64::max);
            assert!(peak > 0.0, "band {m} is empty");
        }
        assert_eq!(w.len(), N_MELS * N_BINS);
    }

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
