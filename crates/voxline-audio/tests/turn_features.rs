//! The end-of-turn model's features against the reference implementation's
//! values for the same recordings: `tests/data/turn_features_reference.json`
//! holds, for the last 8 s of two fixtures, the mean, spread and range of
//! the 80 × 800 features and every 997th value, as Pipecat's numpy feature
//! extractor (pipecat-ai 1.14.0) computed them from 16-bit samples / 32768.

use voxline_audio::turn::{TurnFeatures, N_FRAMES, N_MELS};

fn samples(name: &str) -> Vec<f32> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../audio-fixtures")
        .join(name);
    let mut r = hound::WavReader::open(&path).unwrap();
    assert_eq!(r.spec().sample_rate, 16_000);
    r.samples::<i16>()
        .map(|s| f32::from(s.unwrap()) / 32768.0)
        .collect()
}

#[test]
fn features_match_the_reference_implementation() {
    let reference: serde_json::Value =
        serde_json::from_str(include_str!("data/turn_features_reference.json")).unwrap();
    let mut f = TurnFeatures::new();
    for name in ["q_capital.wav", "long_10s.wav"] {
        let want = &reference[name];
        let got = f.compute(&samples(name));
        assert_eq!(got.len(), N_MELS * N_FRAMES);
        let n = got.len() as f64;
        let mean = got.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let std = (got
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n)
            .sqrt();
        let close = |a: f64, b: f64, what: &str| {
            assert!(
                (a - b).abs() < 1e-4,
                "{name}: {what} {a} vs the reference's {b}"
            );
        };
        close(mean, want["mean"].as_f64().unwrap(), "mean");
        close(std, want["std"].as_f64().unwrap(), "std");
        let lo = got.iter().copied().fold(f32::MAX, f32::min);
        let hi = got.iter().copied().fold(f32::MIN, f32::max);
        close(f64::from(lo), want["min"].as_f64().unwrap(), "min");
        close(f64::from(hi), want["max"].as_f64().unwrap(), "max");
        let step = want["index_step"].as_u64().unwrap() as usize;
        let mut worst = 0f64;
        for (k, v) in want["values"].as_array().unwrap().iter().enumerate() {
            let (a, b) = (f64::from(got[k * step]), v.as_f64().unwrap());
            worst = worst.max((a - b).abs());
            close(a, b, &format!("value {}", k * step));
        }
        eprintln!("{name}: largest difference from the reference {worst:.2e}");
    }
}
