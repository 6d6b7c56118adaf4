//! Decoding a WAV `data` chunk: little-endian PCM bytes to `f32` frames,
//! read from any [`Read`]er a block at a time.

use std::io::{self, Read};

use super::header::{read_full, PcmLayout};

/// How a read of the data chunk ended.
#[derive(Debug)]
pub(crate) enum PcmEnd {
    /// More may follow.
    More,
    /// The declared length (or, for an unknown length, the end of the stream) was reached.
    Done,
    /// The stream ended before the declared length.
    Short,
    /// Reading failed.
    Failed(io::Error),
}

/// Streams the frames of a `data` chunk.
pub(crate) struct PcmStream {
    reader: Box<dyn Read + Send>,
    layout: PcmLayout,
    block_align: usize,
    /// Bytes still to read; `None` reads to the end of the stream.
    left: Option<u64>,
    /// Reused byte buffer for one block.
    bytes: Vec<u8>,
}

impl PcmStream {
    pub(crate) fn new(
        reader: Box<dyn Read + Send>,
        layout: PcmLayout,
        block_align: u16,
        data_len: Option<u64>,
    ) -> Self {
        PcmStream {
            reader,
            layout,
            block_align: usize::from(block_align),
            left: data_len,
            bytes: Vec::new(),
        }
    }

    /// Appends up to `frames` whole frames to `out` (interleaved, in `[-1, 1]` for
    /// integers; floats as stored). A partial frame at the end is dropped.
    pub(crate) fn read(&mut self, frames: usize, out: &mut Vec<f32>) -> PcmEnd {
        let mut want = frames * self.block_align;
        if let Some(left) = self.left {
            want = want.min(usize::try_from(left).unwrap_or(usize::MAX));
        }
        self.bytes.resize(want, 0);
        let got = match read_full(&mut self.reader, &mut self.bytes) {
            Ok(n) => n,
            Err(e) => return PcmEnd::Failed(e),
        };
        decode(
            self.layout,
            &self.bytes[..got - got % self.block_align],
            out,
        );
        if let Some(left) = &mut self.left {
            *left -= got as u64;
        }
        match self.left {
            None if got < want => PcmEnd::Done,
            Some(_) if got < want => PcmEnd::Short,
            Some(0) => PcmEnd::Done,
            _ => PcmEnd::More,
        }
    }
}

/// Decodes whole frames of little-endian PCM.
fn decode(layout: PcmLayout, bytes: &[u8], out: &mut Vec<f32>) {
    match layout {
        PcmLayout::U8 => out.extend(bytes.iter().map(|&b| (f32::from(b) - 128.0) / 128.0)),
        PcmLayout::Int(2) => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32_768.0),
        ),
        PcmLayout::Int(3) => out.extend(bytes.chunks_exact(3).map(|b| {
            // Place the 24 bits at the top of an i32: one scale for every container.
            i32::from_le_bytes([0, b[0], b[1], b[2]]) as f32 / 2_147_483_648.0
        })),
        PcmLayout::Int(_) => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32 / 2_147_483_648.0),
        ),
        PcmLayout::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
    }
}

/// Below this peak level a recording is "near-silent": speech that quiet is
/// unlikely to be detected or transcribed.
pub const NEAR_SILENT_PEAK_DBFS: f64 = -40.0;

/// The level reported for digital silence (and the floor of every level).
pub const LEVEL_FLOOR_DBFS: f64 = -120.0;

/// The measured level of the samples decoded so far, in dB relative to full scale.
///
/// Measured on the decoded samples of every channel, before down-mixing and
/// resampling. Levels are never below [`LEVEL_FLOOR_DBFS`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Level {
    /// Largest absolute sample, dBFS (0 = full scale).
    pub peak_dbfs: f64,
    /// Root mean square of all samples, dBFS.
    pub rms_dbfs: f64,
    /// How many samples (all channels) were measured.
    pub samples: u64,
}

impl Level {
    /// Whether the peak is below [`NEAR_SILENT_PEAK_DBFS`] — worth a warning such
    /// as "FILE: near-silent (peak -60 dBFS); check the recording level".
    /// Nothing measured yet is not near-silent.
    pub fn is_near_silent(&self) -> bool {
        self.samples > 0 && self.peak_dbfs < NEAR_SILENT_PEAK_DBFS
    }
}

impl std::fmt::Display for Level {
    /// `peak -60 dBFS, RMS -63 dBFS`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "peak {:.0} dBFS, RMS {:.0} dBFS",
            self.peak_dbfs, self.rms_dbfs
        )
    }
}

/// Accumulates peak and mean square.
#[derive(Debug, Default, Clone)]
pub(crate) struct LevelMeter {
    peak: f32,
    sum_squares: f64,
    samples: u64,
}

impl LevelMeter {
    /// Measures `samples` (non-finite values count as 0).
    pub(crate) fn add(&mut self, samples: &[f32]) {
        let mut sum = 0.0f64;
        for &s in samples {
            let a = if s.is_finite() { s.abs() } else { 0.0 };
            self.peak = self.peak.max(a);
            sum += f64::from(a) * f64::from(a);
        }
        self.sum_squares += sum;
        self.samples += samples.len() as u64;
    }

    pub(crate) fn level(&self) -> Level {
        let db = |x: f64| {
            if x > 0.0 {
                (20.0 * x.log10()).max(LEVEL_FLOOR_DBFS)
            } else {
                LEVEL_FLOOR_DBFS
            }
        };
        let rms = if self.samples == 0 {
            0.0
        } else {
            (self.sum_squares / self.samples as f64).sqrt()
        };
        Level {
            peak_dbfs: db(f64::from(self.peak)),
            rms_dbfs: db(rms),
            samples: self.samples,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_of_a_sine_and_of_silence() {
        let mut m = LevelMeter::default();
        assert_eq!(m.level().peak_dbfs, LEVEL_FLOOR_DBFS);
        assert!(!m.level().is_near_silent());
        // A full period of a sine at 0.001 (-60 dBFS peak, -63 dBFS RMS).
        let sine: Vec<f32> = (0..1600)
            .map(|i| 0.001 * (2.0 * std::f32::consts::PI * i as f32 / 160.0).sin())
            .collect();
        m.add(&sine);
        let l = m.level();
        assert!((l.peak_dbfs + 60.0).abs() < 0.01, "{l:?}");
        assert!((l.rms_dbfs + 63.01).abs() < 0.05, "{l:?}");
        assert_eq!(l.samples, 1600);
        assert!(l.is_near_silent());
        assert_eq!(l.to_string(), "peak -60 dBFS, RMS -63 dBFS");

        let mut loud = LevelMeter::default();
        loud.add(&[0.5, -1.0, f32::NAN, 0.0]);
        let l = loud.level();
        assert_eq!(l.peak_dbfs, 0.0);
        assert!(!l.is_near_silent());

        let mut zero = LevelMeter::default();
        zero.add(&[0.0; 100]);
        assert_eq!(zero.level().rms_dbfs, LEVEL_FLOOR_DBFS);
        assert!(zero.level().is_near_silent());
    }

    #[test]
    fn pcm_layouts_scale_by_the_container() {
        let mut out = Vec::new();
        decode(PcmLayout::U8, &[0, 128, 255], &mut out);
        assert_eq!(out, [-1.0, 0.0, 127.0 / 128.0]);
        out.clear();
        // -2^23 in 24 bits, and the same value left-justified in 32 bits.
        decode(PcmLayout::Int(3), &[0, 0, 0x80], &mut out);
        decode(PcmLayout::Int(4), &[0, 0, 0, 0x80], &mut out);
        decode(PcmLayout::Int(4), &[0, 0, 0, 0x40], &mut out);
        assert_eq!(out, [-1.0, -1.0, 0.5]);
    }
}
