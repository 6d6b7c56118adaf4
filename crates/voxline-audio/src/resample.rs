//! Streaming down-mix and resampling to 16 kHz mono.
//!
//! [`StreamResampler`] is shared by file replay and live capture: it accepts
//! interleaved `f32` blocks of any size, averages the channels, and resamples
//! to [`TARGET_RATE`] with rubato's synchronous FFT resampler. The
//! resampler's group delay is trimmed from the start of the stream and the
//! tail is flushed by [`StreamResampler::flush`], so an event at input time
//! `t` appears at output sample `t * 16000` (within a sample or two) and the
//! total output length is `round(frames * 16000 / rate)`.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler};

use crate::{AudioError, MAX_CHANNELS, MAX_SAMPLE_RATE, TARGET_RATE};

/// Input frames handed to the FFT resampler per call: 20 ms of input audio.
fn chunk_frames(rate: u32) -> usize {
    (rate as usize / 50).max(1)
}

/// The FFT resampler and its working buffers (absent when the input is already 16 kHz).
struct Engine {
    fft: Fft<f32>,
    /// Mono input frames waiting for a full resampler chunk.
    pending: Vec<f32>,
    /// Scratch output of one resampler call.
    scratch: Vec<f32>,
    /// Leading output samples still to drop (the resampler's delay).
    to_trim: usize,
}

/// Down-mixes interleaved audio to mono and resamples it to 16 kHz, block by block.
///
/// Memory is bounded by one resampler chunk (about 20 ms of input) plus the
/// FFT state; nothing grows with stream length. When the input rate is
/// already 16 kHz the resampler is bypassed and samples pass through
/// unchanged apart from the down-mix.
///
/// Non-finite input samples (NaN, ±∞) are replaced by silence.
pub struct StreamResampler {
    /// The output rate (16 kHz unless made with [`StreamResampler::to_rate`]).
    out_rate: u32,
    in_rate: u32,
    channels: usize,
    engine: Option<Engine>,
    /// Samples of an incomplete interleaved frame left over from the last call.
    carry: Vec<f32>,
    /// Mono input frames accepted since the start of the stream.
    frames_in: u64,
    /// Output samples appended since the start of the stream.
    frames_out: u64,
}

impl std::fmt::Debug for StreamResampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamResampler")
            .field("in_rate", &self.in_rate)
            .field("channels", &self.channels)
            .field("resampling", &self.engine.is_some())
            .field("frames_in", &self.frames_in)
            .field("frames_out", &self.frames_out)
            .finish()
    }
}

impl StreamResampler {
    /// Creates a resampler from `in_rate` Hz with `channels` interleaved channels to 16 kHz mono.
    ///
    /// # Errors
    /// [`AudioError::InvalidStreamFormat`] when `in_rate` is outside `1..=384000` or
    /// `channels` outside `1..=8`; [`AudioError::ResamplerConstruction`] if rubato
    /// rejects the rate pair.
    pub fn new(in_rate: u32, channels: u16) -> Result<Self, AudioError> {
        Self::to_rate(in_rate, channels, TARGET_RATE)
    }

    /// Like [`StreamResampler::new`], to `out_rate` instead of 16 kHz (the
    /// voice to an output device's rate).
    ///
    /// # Errors
    /// As [`StreamResampler::new`], for either rate.
    pub fn to_rate(in_rate: u32, channels: u16, out_rate: u32) -> Result<Self, AudioError> {
        if out_rate == 0 || out_rate > MAX_SAMPLE_RATE {
            return Err(AudioError::InvalidStreamFormat {
                sample_rate: out_rate,
                channels,
            });
        }
        if in_rate == 0 || in_rate > MAX_SAMPLE_RATE || channels == 0 || channels > MAX_CHANNELS {
            return Err(AudioError::InvalidStreamFormat {
                sample_rate: in_rate,
                channels,
            });
        }
        let engine = if in_rate == out_rate {
            None
        } else {
            let fft = Fft::<f32>::new(
                in_rate as usize,
                out_rate as usize,
                chunk_frames(in_rate),
                1,
                FixedSync::Input,
            )
            .map_err(|source| AudioError::ResamplerConstruction {
                sample_rate: in_rate,
                source,
            })?;
            let scratch = vec![0.0; fft.output_frames_max()];
            let to_trim = fft.output_delay();
            let pending = Vec::with_capacity(fft.input_frames_max());
            Some(Engine {
                fft,
                pending,
                scratch,
                to_trim,
            })
        };
        Ok(StreamResampler {
            in_rate,
            out_rate,
            channels: usize::from(channels),
            engine,
            carry: Vec::with_capacity(usize::from(channels)),
            frames_in: 0,
            frames_out: 0,
        })
    }

    /// The input sample rate in Hz.
    pub fn input_rate(&self) -> u32 {
        self.in_rate
    }

    /// The number of interleaved input channels.
    pub fn channels(&self) -> u16 {
        // Constructed from a u16, so this cannot truncate.
        self.channels as u16
    }

    /// Whether samples pass through without resampling (the input is already 16 kHz).
    pub fn is_passthrough(&self) -> bool {
        self.engine.is_none()
    }

    /// The resampler's delay in output samples, which this wrapper trims from the
    /// start of the stream (0 in pass-through).
    pub fn delay_samples(&self) -> usize {
        self.engine.as_ref().map_or(0, |e| e.fft.output_delay())
    }

    /// Down-mixes and resamples one block of interleaved samples, appending the
    /// 16 kHz mono result to `out`. Returns how many samples were appended.
    ///
    /// `interleaved` may have any length, including one that ends mid-frame (the
    /// partial frame is kept for the next call). The output lags the input by
    /// up to one resampler chunk (about 20 ms); [`flush`](Self::flush) releases it.
    ///
    /// # Errors
    /// [`AudioError::Resample`] if rubato reports a buffer-size mismatch, which
    /// would be a bug in this wrapper.
    pub fn process(
        &mut self,
        interleaved: &[f32],
        out: &mut Vec<f32>,
    ) -> Result<usize, AudioError> {
        let before = out.len();
        let mut rest = interleaved;
        // Complete a frame started in an earlier call.
        if !self.carry.is_empty() {
            let need = self.channels - self.carry.len();
            let take = need.min(rest.len());
            self.carry.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.carry.len() == self.channels {
                let frame = std::mem::take(&mut self.carry);
                self.push_mono(&frame, out)?;
                self.carry = frame;
                self.carry.clear();
            }
        }
        let whole = rest.len() - rest.len() % self.channels;
        self.push_mono(&rest[..whole], out)?;
        self.carry.extend_from_slice(&rest[whole..]);
        Ok(out.len() - before)
    }

    /// Ends the stream: pushes the buffered input and the resampler's tail through,
    /// appending the remaining output to `out`, so the whole stream yields
    /// `round(frames_in * 16000 / in_rate)` samples. Returns how many samples were
    /// appended. An incomplete trailing frame is dropped.
    ///
    /// Afterwards the resampler is reset and can take a new stream.
    ///
    /// # Errors
    /// [`AudioError::Resample`] as for [`process`](Self::process).
    pub fn flush(&mut self, out: &mut Vec<f32>) -> Result<usize, AudioError> {
        let before = out.len();
        let expected = self.expected_output_len();
        if let Some(engine) = self.engine.as_mut() {
            let chunk = engine.fft.input_frames_next();
            // Pad with silence and keep pumping until every real input frame has come out.
            while self.frames_out < expected {
                engine.pending.resize(chunk, 0.0);
                let remaining = expected - self.frames_out;
                let appended = Self::run_engine(engine, out, Some(remaining))?;
                self.frames_out += appended as u64;
            }
            engine.fft.reset();
            engine.pending.clear();
            engine.to_trim = engine.fft.output_delay();
        }
        self.carry.clear();
        self.frames_in = 0;
        self.frames_out = 0;
        Ok(out.len() - before)
    }

    /// `round(frames_in * 16000 / in_rate)`: the output length of the whole stream.
    fn expected_output_len(&self) -> u64 {
        let num = u128::from(self.frames_in) * u128::from(self.out_rate);
        let den = u128::from(self.in_rate);
        ((num + den / 2) / den) as u64
    }

    /// Down-mixes whole interleaved frames and feeds them onwards.
    fn push_mono(&mut self, frames: &[f32], out: &mut Vec<f32>) -> Result<(), AudioError> {
        if frames.is_empty() {
            return Ok(());
        }
        let channels = self.channels;
        let scale = 1.0 / channels as f32;
        let mono = frames.chunks_exact(channels).map(move |frame| {
            let sum: f32 = frame
                .iter()
                // Non-finite samples become silence and everything is clamped to
                // full scale: float WAVs can hold any value, and values near f32::MAX
                // overflow the FFT resampler (found by fuzzing wav_ingest).
                .map(|&s| {
                    if s.is_finite() {
                        s.clamp(-1.0, 1.0)
                    } else {
                        0.0
                    }
                })
                .sum();
            sum * scale
        });
        let n = frames.len() / channels;
        self.frames_in += n as u64;
        match self.engine.as_mut() {
            None => {
                out.extend(mono);
                self.frames_out += n as u64;
            }
            Some(engine) => {
                let chunk = engine.fft.input_frames_next();
                for sample in mono {
                    engine.pending.push(sample);
                    if engine.pending.len() >= chunk {
                        let appended = Self::run_engine(engine, out, None)?;
                        self.frames_out += appended as u64;
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs one resampler chunk from `engine.pending`, trims the start-up delay and
    /// appends at most `limit` samples to `out`.
    fn run_engine(
        engine: &mut Engine,
        out: &mut Vec<f32>,
        limit: Option<u64>,
    ) -> Result<usize, AudioError> {
        let chunk = engine.fft.input_frames_next();
        let out_frames = engine.scratch.len();
        let input = InterleavedSlice::new(&engine.pending[..chunk], 1, chunk).map_err(|e| {
            AudioError::Resample {
                reason: e.to_string(),
            }
        })?;
        let mut output = InterleavedSlice::new_mut(&mut engine.scratch[..], 1, out_frames)
            .map_err(|e| AudioError::Resample {
                reason: e.to_string(),
            })?;
        let (consumed, produced) = engine
            .fft
            .process_into_buffer(&input, &mut output, None)
            .map_err(|e| AudioError::Resample {
                reason: e.to_string(),
            })?;
        engine.pending.drain(..consumed);
        let trim = engine.to_trim.min(produced);
        engine.to_trim -= trim;
        let mut fresh = &engine.scratch[trim..produced];
        if let Some(limit) = limit {
            let keep = usize::try_from(limit)
                .unwrap_or(usize::MAX)
                .min(fresh.len());
            fresh = &fresh[..keep];
        }
        out.extend_from_slice(fresh);
        Ok(fresh.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, secs: f32, freq: f32, amp: f32) -> Vec<f32> {
        let n = (rate as f32 * secs) as usize;
        (0..n)
            .map(|i| amp * (2.0 * std::f32::consts::PI * freq * i as f32 / rate as f32).sin())
            .collect()
    }

    #[test]
    fn rejects_bad_formats() {
        for (rate, ch) in [(0, 1), (16_000, 0), (400_000, 1), (16_000, 9)] {
            let err = StreamResampler::new(rate, ch).unwrap_err();
            assert!(
                matches!(err, AudioError::InvalidStreamFormat { .. }),
                "{rate} {ch}: {err}"
            );
        }
    }

    #[test]
    fn passthrough_downmixes_and_keeps_partial_frames() {
        let mut r = StreamResampler::new(16_000, 2).unwrap();
        assert!(r.is_passthrough());
        let mut out = Vec::new();
        // Frames (1, 3) and (-1, 0.5), split in the middle of the second frame;
        // 3 and 4 are clamped to full scale, NaN becomes silence.
        r.process(&[1.0, 3.0, -1.0], &mut out).unwrap();
        assert_eq!(out, vec![1.0]);
        r.process(&[0.5, f32::NAN, 4.0], &mut out).unwrap();
        assert_eq!(out, vec![1.0, -0.25, 0.5]);
        assert_eq!(r.flush(&mut out).unwrap(), 0);
    }

    #[test]
    fn output_length_matches_ratio_for_odd_block_sizes() {
        for rate in [8_000, 11_025, 22_050, 44_100, 48_000, 96_000, 7_919] {
            let input = tone(rate, 0.73, 300.0, 0.5);
            let mut r = StreamResampler::new(rate, 1).unwrap();
            let mut out = Vec::new();
            // Feed in irregular blocks.
            let mut pos = 0;
            let mut step = 1;
            while pos < input.len() {
                let end = (pos + step).min(input.len());
                r.process(&input[pos..end], &mut out).unwrap();
                pos = end;
                step = step * 7 % 1013 + 1;
            }
            r.flush(&mut out).unwrap();
            let expected = (input.len() as f64 * 16_000.0 / rate as f64).round() as usize;
            assert_eq!(out.len(), expected, "rate {rate}");
        }
    }

    #[test]
    fn resampler_is_reusable_after_flush() {
        let input = tone(48_000, 0.25, 500.0, 0.5);
        let mut r = StreamResampler::new(48_000, 1).unwrap();
        let mut first = Vec::new();
        r.process(&input, &mut first).unwrap();
        r.flush(&mut first).unwrap();
        let mut second = Vec::new();
        r.process(&input, &mut second).unwrap();
        r.flush(&mut second).unwrap();
        assert_eq!(first.len(), 4_000);
        assert_eq!(first, second);
    }
}
