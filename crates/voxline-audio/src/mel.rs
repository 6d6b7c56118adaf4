//! Whisper's log-mel spectrogram, the input of whisper's encoder and of the
//! end-of-turn model trained on it.
//!
//! A centred STFT (reflected edges, periodic Hann window of 400 samples,
//! hop 160, 16 kHz); the power of each bin projected on 80 Slaney mel
//! filters (area-normalised, 0 to 8 kHz); `log10` with a floor of 1e-10;
//! the last frame dropped; everything below the maximum − 8 raised to it;
//! then `(x + 4) / 4`. Frames past the audio are left at 0, as whisper pads
//! its 30 s window.

use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

/// Mel bands.
pub const N_MELS: usize = 80;
/// Samples per frame (10 ms at 16 kHz).
pub const HOP: usize = 160;
/// Length of the transform (25 ms).
pub const N_FFT: usize = 400;
/// Frequency bins of one transform.
pub const N_BINS: usize = N_FFT / 2 + 1;
const MEL_FLOOR: f64 = 1e-10;

/// The transform: the FFT plan, the window and the filter bank, with their
/// scratch buffers (made once, reused for every call).
pub struct LogMel {
    fft: Arc<dyn RealToComplex<f64>>,
    window: Vec<f64>,
    /// `N_MELS` rows of `N_BINS` weights.
    filters: Vec<f64>,
    frame: Vec<f64>,
    spectrum: Vec<Complex<f64>>,
}

impl std::fmt::Debug for LogMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMel").finish_non_exhaustive()
    }
}

impl Default for LogMel {
    fn default() -> Self {
        Self::new()
    }
}

impl LogMel {
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

    /// The features of `x`, row-major: `N_MELS` bands of `frames` frames.
    /// `x` gives `x.len() / HOP` frames (the centred transform's last one
    /// dropped); fewer are cut, the ones missing stay 0 (faster-whisper's
    /// padding, in the features).
    pub fn compute(&mut self, x: &[f32], frames: usize) -> Vec<f32> {
        self.features(x, frames, frames, false)
    }

    /// The features of `audio` followed by silence to `frames` frames, as
    /// whisper and whisper.cpp pad their 30 s window (with zeros in the
    /// audio, so the frames past it are at the floor, 8 decades under the
    /// loudest): what whisper was trained on. Frames of silence alone are
    /// not transformed.
    pub fn compute_in_silence(&mut self, audio: &[f32], frames: usize) -> Vec<f32> {
        // every frame whose window reaches the audio, on zeros long enough
        // that no window reflects back into it
        let reached = ((audio.len() + N_FFT / 2) / HOP + 1).min(frames);
        let mut x = Vec::with_capacity((reached + 1) * HOP + N_FFT);
        x.extend_from_slice(audio);
        x.resize((reached + 1) * HOP + N_FFT, 0.0);
        self.features(&x[..], reached, frames, true)
    }

    /// At most `computed` frames of `x`, in a window of `frames`; the rest
    /// is silence (the floor) or 0.
    fn features(
        &mut self,
        x: &[f32],
        computed: usize,
        frames: usize,
        silence_after: bool,
    ) -> Vec<f32> {
        let n = x.len();
        let pad = N_FFT / 2;
        // a reflection needs more samples than the half window
        let have = if n > pad { (n / HOP).min(computed) } else { 0 };
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
        let mut log_mel = vec![0f64; N_MELS * have];
        let mut power = [0f64; N_BINS];
        for t in 0..have {
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
                log_mel[m * have + t] = e.max(MEL_FLOOR).log10();
            }
        }
        let silence = MEL_FLOOR.log10();
        let mut top = log_mel.iter().copied().fold(f64::MIN, f64::max);
        if silence_after {
            top = top.max(silence);
        }
        let rest = if silence_after {
            ((silence.max(top - 8.0) + 4.0) / 4.0) as f32
        } else {
            0.0
        };
        let mut out = vec![rest; N_MELS * frames];
        for m in 0..N_MELS {
            for t in 0..have {
                out[m * frames + t] = ((log_mel[m * have + t].max(top - 8.0) + 4.0) / 4.0) as f32;
            }
        }
        out
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
#[must_use]
pub fn slaney_filters() -> Vec<f64> {
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
    fn frames_past_the_audio_stay_zero_and_short_input_gives_none() {
        let mut mel = LogMel::new();
        let tone: Vec<f32> = (0..16_160)
            .map(|i| (std::f32::consts::TAU * 440.0 * i as f32 / 16_000.0).sin() * 0.3)
            .collect();
        let f = mel.compute(&tone, 3000);
        assert_eq!(f.len(), N_MELS * 3000);
        // 16 160 samples: 101 frames, the rest of the window untouched
        assert!((0..N_MELS).all(|m| f[m * 3000 + 101..(m + 1) * 3000].iter().all(|&v| v == 0.0)));
        assert!((0..N_MELS).any(|m| f[m * 3000 + 100] != 0.0));
        // the band holding 440 Hz is the loudest
        let loudest = (0..N_MELS)
            .max_by(|&a, &b| f[a * 3000 + 50].total_cmp(&f[b * 3000 + 50]))
            .unwrap_or(0);
        let centre_hz = mel_to_hz(hz_to_mel(8000.0) * (loudest + 1) as f64 / (N_MELS + 1) as f64);
        assert!(
            (centre_hz - 440.0).abs() < 60.0,
            "band {loudest} at {centre_hz} Hz"
        );
        assert!(mel.compute(&tone[..100], 3000).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn audio_in_silence_is_what_the_whole_padded_window_gives() {
        let mut mel = LogMel::new();
        let tone: Vec<f32> = (0..20_000)
            .map(|i| (std::f32::consts::TAU * 700.0 * i as f32 / 16_000.0).sin() * 0.2)
            .collect();
        // the reference: the audio followed by zeros to the whole window, transformed frame by frame
        let mut whole = tone.clone();
        whole.resize(300 * HOP, 0.0);
        let reference = mel.compute(&whole, 300);
        let fast = mel.compute_in_silence(&tone, 300);
        assert_eq!(fast.len(), reference.len());
        for (i, (a, b)) in fast.iter().zip(&reference).enumerate() {
            assert!((a - b).abs() < 1e-5, "value {i}: {a} against {b}");
        }
        // past the audio: the floor, 2.0 (8 decades) under the loudest
        let top = fast.iter().copied().fold(f32::MIN, f32::max);
        assert!((fast[299] - (top - 2.0)).abs() < 1e-5);
        // nothing at all: the floor everywhere
        let none = mel.compute_in_silence(&[], 10);
        assert!(
            none.iter().all(|&v| (v - (-1.5)).abs() < 1e-6),
            "{:?}",
            &none[..3]
        );
    }
}
