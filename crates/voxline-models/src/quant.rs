//! ggml's block quantisation formats, written by the converter: whisper
//! weights as `q8_0` or `q4_0` instead of f16.
//!
//! Both formats cut a row into blocks of [`QK`] values, each stored with one
//! f16 scale `d`:
//! - `q8_0` (34 bytes a block): `d = max|x| / 127`, then 32 signed bytes
//!   `round(x / d)`; a value is `q · d`.
//! - `q4_0` (18 bytes a block): `d = m / −8` where `m` is the value of
//!   largest magnitude (sign kept), then 16 bytes holding 32 four-bit codes
//!   `min(15, trunc(x / d + 8.5))`; byte `j` holds value `j` in its low
//!   nibble and value `j + 16` in its high one; a value is `(code − 8) · d`.
//!
//! These are the layouts and rounding rules of ggml's reference
//! quantisers, so a file written here loads in whisper.cpp exactly like one
//! its own quantize tool wrote.

use half::f16;

/// Values per block, in both formats.
pub const QK: usize = 32;

/// A quantised storage type for whisper's weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhisperQuant {
    /// 8-bit blocks: ~half the size of f16, accuracy of f16.
    Q8_0,
    /// 4-bit blocks: ~a quarter of f16; faster, less accurate.
    Q4_0,
}

impl WhisperQuant {
    /// The ggml tensor type id (`GGML_TYPE_*`).
    #[must_use]
    pub fn ggml_type(self) -> i32 {
        match self {
            Self::Q4_0 => 2,
            Self::Q8_0 => 8,
        }
    }

    /// The model file's `ftype` (`GGML_FTYPE_MOSTLY_*`) with ggml's
    /// quantisation version (2) in the thousands, as whisper.cpp reads it.
    #[must_use]
    pub fn file_ftype(self) -> i32 {
        let mostly = match self {
            Self::Q4_0 => 2,
            Self::Q8_0 => 7,
        };
        2 * 1000 + mostly
    }

    /// Bytes per block of [`QK`] values.
    #[must_use]
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 2 + QK / 2,
            Self::Q8_0 => 2 + QK,
        }
    }

    /// The name used in flags and file names (`q8_0`, `q4_0`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "q4_0",
            Self::Q8_0 => "q8_0",
        }
    }

    /// Quantises `values` (a whole number of blocks).
    ///
    /// # Panics
    /// Never for a length that is a multiple of [`QK`]; a trailing partial
    /// block is not written (callers only quantise rows divisible by `QK`).
    #[must_use]
    pub fn quantize(self, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(values.len() / QK * self.block_bytes());
        for block in values.chunks_exact(QK) {
            match self {
                Self::Q8_0 => q8_0_block(block, &mut out),
                Self::Q4_0 => q4_0_block(block, &mut out),
            }
        }
        out
    }

    /// The values `bytes` (written by [`WhisperQuant::quantize`]) stand for.
    #[must_use]
    pub fn dequantize(self, bytes: &[u8]) -> Vec<f32> {
        let mut out = Vec::with_capacity(bytes.len() / self.block_bytes() * QK);
        for b in bytes.chunks_exact(self.block_bytes()) {
            let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
            match self {
                Self::Q8_0 => out.extend(b[2..].iter().map(|&q| f32::from(q as i8) * d)),
                Self::Q4_0 => {
                    let qs = &b[2..];
                    out.extend(qs.iter().map(|&q| (f32::from(q & 0x0F) - 8.0) * d));
                    out.extend(qs.iter().map(|&q| (f32::from(q >> 4) - 8.0) * d));
                }
            }
        }
        out
    }
}

impl std::str::FromStr for WhisperQuant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "q8_0" => Ok(Self::Q8_0),
            "q4_0" => Ok(Self::Q4_0),
            other => Err(format!("{other:?}: expected `q8_0` or `q4_0`")),
        }
    }
}

fn q8_0_block(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
}

fn q4_0_block(x: &[f32], out: &mut Vec<u8>) {
    // the value of largest magnitude, sign kept
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    let code = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    for j in 0..QK / 2 {
        out.push(code(x[j]) | (code(x[j + QK / 2]) << 4));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values with a spread of magnitudes and signs.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 11) as f32 / (1u64 << 53) as f32 - 0.5;
                u * if i % 7 == 0 { 4.0 } else { 0.3 }
            })
            .collect()
    }

    #[test]
    fn layouts_are_ggmls() {
        assert_eq!(WhisperQuant::Q8_0.block_bytes(), 34);
        assert_eq!(WhisperQuant::Q4_0.block_bytes(), 18);
        assert_eq!(WhisperQuant::Q8_0.quantize(&values(64, 1)).len(), 68);
        assert_eq!(WhisperQuant::Q4_0.quantize(&values(96, 1)).len(), 54);
        assert_eq!(
            (
                WhisperQuant::Q8_0.ggml_type(),
                WhisperQuant::Q4_0.ggml_type()
            ),
            (8, 2)
        );
        assert_eq!(WhisperQuant::Q8_0.file_ftype() % 1000, 7);
        assert_eq!("q4_0".parse(), Ok(WhisperQuant::Q4_0));
        assert!("q5_1".parse::<WhisperQuant>().is_err());
    }

    #[test]
    fn q8_0_block_by_hand() {
        // max |x| = 1.27 → d = 0.01; codes round(x / d)
        let mut x = vec![0.0f32; QK];
        x[0] = 1.27;
        x[1] = -0.635;
        x[2] = 0.004;
        x[3] = 0.006;
        let b = WhisperQuant::Q8_0.quantize(&x);
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        assert!((d - 0.01).abs() < 1e-5, "{d}");
        assert_eq!(&b[2..6], &[127u8, (-64i8) as u8, 0, 1]);
        let back = WhisperQuant::Q8_0.dequantize(&b);
        assert!((back[0] - 1.27).abs() < 0.01 && (back[1] + 0.64).abs() < 0.01);
    }

    #[test]
    fn q4_0_block_by_hand() {
        // the largest magnitude is negative: d = m / −8 = 0.25 (positive)
        let mut x = vec![0.0f32; QK];
        x[0] = -2.0;
        x[1] = 1.0;
        x[16] = 0.5;
        let b = WhisperQuant::Q4_0.quantize(&x);
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        assert!((d - 0.25).abs() < 1e-6, "{d}");
        // code(x) = trunc(x/d + 8.5): −2 → 0, 1 → 12, 0.5 → 10, 0 → 8
        assert_eq!(b[2], 10 << 4, "codes 0 (low) and 10 (high)");
        assert_eq!(b[3], 12 | (8 << 4));
        let back = WhisperQuant::Q4_0.dequantize(&b);
        assert_eq!((back[0], back[1], back[16], back[2]), (-2.0, 1.0, 0.5, 0.0));
    }

    #[test]
    fn round_trip_errors_stay_within_a_step() {
        for q in [WhisperQuant::Q8_0, WhisperQuant::Q4_0] {
            let x = values(QK * 64, 7);
            let back = q.dequantize(&q.quantize(&x));
            assert_eq!(back.len(), x.len());
            for (block, got) in x.chunks(QK).zip(back.chunks(QK)) {
                let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                // q8_0 rounds to the nearest of ±127 steps; q4_0's codes run
                // −8..=7, so a value opposite in sign to the block's extreme
                // and as large is clipped one step short (ggml's own rule)
                let bound = match q {
                    WhisperQuant::Q8_0 => amax / 127.0 * 0.5,
                    WhisperQuant::Q4_0 => amax / 8.0,
                };
                for (a, b) in block.iter().zip(got) {
                    // plus the f16 rounding of the scale
                    assert!(
                        (a - b).abs() <= bound + amax * 2e-3 + 1e-6,
                        "{q:?}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_all_zero_block_is_zero() {
        for q in [WhisperQuant::Q8_0, WhisperQuant::Q4_0] {
            let back = q.dequantize(&q.quantize(&[0.0; QK]));
            assert!(back.iter().all(|v| *v == 0.0), "{q:?}");
        }
    }
}
