//! Regenerates the committed seed corpora under `seeds/`.
//!
//! Run from anywhere: `cargo run --manifest-path tests/fuzz/Cargo.toml --example make_seeds`.
//! Seeds are small (a fuzzer mutates small inputs faster) but valid: each WAV
//! seed opens and streams, each sidecar and budget parses, and the CT2 seed
//! parses and plans into whisper.cpp tensors. The generator checks that
//! before writing, so a seed can never silently rot into an invalid input.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use voxline_models::ct2::{encode, Ct2Model, DType};
use voxline_models::whisper_ggml::plan_tensors;

type Error = Box<dyn std::error::Error>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn write(target: &str, name: &str, bytes: &[u8]) -> Result<(), Error> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds").join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), bytes)?;
    println!("seeds/{target}/{name}: {} bytes", bytes.len());
    Ok(())
}

/// Re-encodes `frames` frames of a fixture (starting at its first speech
/// sample) in the fixture's own format.
fn wav_excerpt(fixture: &str, frames: usize) -> Result<Vec<u8>, Error> {
    let dir = root().join("audio-fixtures");
    let sidecar: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(fixture).with_extension("json"))?)?;
    let start = sidecar["turns"][0]["start_sample"].as_u64().unwrap_or(0) as usize;
    let mut reader = hound::WavReader::open(dir.join(fixture))?;
    let spec = reader.spec();
    let ch = usize::from(spec.channels);
    let mut out = Cursor::new(Vec::new());
    {
        let mut w = hound::WavWriter::new(&mut out, spec)?;
        match spec.sample_format {
            hound::SampleFormat::Float => {
                for s in reader.samples::<f32>().skip(start * ch).take(frames * ch) {
                    w.write_sample(s?)?;
                }
            }
            hound::SampleFormat::Int => {
                for s in reader.samples::<i32>().skip(start * ch).take(frames * ch) {
                    w.write_sample(s?)?;
                }
            }
        }
        w.finalize()?;
    }
    Ok(out.into_inner())
}

/// A synthetic tone in an arbitrary integer format.
fn wav_tone(rate: u32, channels: u16, bits: u16, frames: usize) -> Result<Vec<u8>, Error> {
    let spec = hound::WavSpec { channels, sample_rate: rate, bits_per_sample: bits, sample_format: hound::SampleFormat::Int };
    let amp = f64::from((1u32 << (bits - 2)) as f32);
    let mut out = Cursor::new(Vec::new());
    {
        let mut w = hound::WavWriter::new(&mut out, spec)?;
        for i in 0..frames {
            let v = (amp * (i as f64 * 440.0 * std::f64::consts::TAU / f64::from(rate)).sin()) as i32;
            for _ in 0..channels {
                if bits == 8 {
                    w.write_sample(v as i8)?;
                } else {
                    w.write_sample(v)?;
                }
            }
        }
        w.finalize()?;
    }
    Ok(out.into_inner())
}

fn check_wav(bytes: &[u8]) -> Result<(), Error> {
    let path = std::env::temp_dir().join(format!("voxline-seed-check-{}.wav", std::process::id()));
    std::fs::write(&path, bytes)?;
    let result = (|| -> Result<usize, Error> {
        let mut src = voxline_audio::WavSource::open(&path)?;
        let mut n = 0;
        while let Some(chunk) = src.next_chunk()? {
            n += chunk.len();
        }
        Ok(n)
    })();
    std::fs::remove_file(&path)?;
    if result? == 0 {
        return Err("a WAV seed streamed no audio".into());
    }
    Ok(())
}

fn wav_seeds() -> Result<(), Error> {
    let mut seeds = vec![
        ("s16_16k_mono.wav", wav_excerpt("q_capital.wav", 800)?),
        ("s24_16k_mono.wav", wav_excerpt("q_capital_24bit.wav", 600)?),
        ("s16_44k1_stereo.wav", wav_excerpt("q_capital_44k_stereo.wav", 900)?),
        ("f32_48k_mono.wav", wav_excerpt("q_capital_48k_f32.wav", 960)?),
        ("s16_8k_mono.wav", wav_excerpt("q_capital_8k.wav", 800)?),
        ("u8_22k05_mono.wav", wav_tone(22_050, 1, 8, 441)?),
        ("s32_11k025_6ch.wav", wav_tone(11_025, 6, 32, 60)?),
    ];
    // A header that declares more audio than the file holds (streams, then reports truncation).
    let mut truncated = seeds[0].1.clone();
    truncated.truncate(truncated.len() - 301);
    seeds.push(("s16_16k_truncated.wav", truncated));
    for (name, bytes) in &seeds {
        if *name != "s16_16k_truncated.wav" {
            check_wav(bytes)?;
        }
        write("wav_ingest", name, bytes)?;
    }
    Ok(())
}

fn sidecar_budget_seeds() -> Result<(), Error> {
    let fixtures = root().join("audio-fixtures");
    for name in ["q_capital.json", "multi_turn.json"] {
        let bytes = std::fs::read(fixtures.join(name))?;
        voxline_check::sidecar(&bytes)?;
        write("sidecar_budget", &format!("sidecar_{name}"), &bytes)?;
    }
    let budgets = [
        ("budget_p95.toml", "[response_latency_ms]\np95 = 3000\n"),
        (
            "budget_full.toml",
            "[response_latency_ms]\np50 = 2500\np95 = 4000\n\n[stt_ms]\np90 = 1500\np99 = 2000\n\n\
             [endpoint_delay_ms]\np50 = 400\n\n[llm_ttft_ms]\np95 = 800\n\n\
             [min]\nllm_decode_tps = 20.0\nllm_prefill_tps = 100.0\nstt_rtfx = 1.0\n\n\
             [max]\ndropped = 0\nerrors = 0\nwer = 0.1\n",
        ),
    ];
    for (name, text) in budgets {
        write("sidecar_budget", name, text.as_bytes())?;
    }
    Ok(())
}

/// The sidecar check needs the root `voxline` crate, which this example does
/// not link (it would pull the C++ engines); a structural check stands in.
mod voxline_check {
    pub fn sidecar(bytes: &[u8]) -> Result<(), super::Error> {
        let v: serde_json::Value = serde_json::from_slice(bytes)?;
        if v["sample_rate"].as_u64().unwrap_or(0) == 0 || !v["turns"].is_array() {
            return Err("fixture sidecar lacks sample_rate or turns".into());
        }
        Ok(())
    }
}

/// A complete miniature Whisper model: width 3, one layer each side, vocab 4,
/// 2 mel bands, FFN width 4, 2 audio and 2 text positions.
fn tiny_whisper() -> Vec<u8> {
    const D: usize = 3;
    const FF: usize = 4;
    let mut owned: Vec<(String, Vec<usize>, DType, Vec<u8>)> = Vec::new();
    let mut counter = 0.0f32;
    let mut tensor = |name: &str, dims: &[usize]| {
        let n: usize = dims.iter().product();
        let vals: Vec<f32> = (0..n).map(|i| (counter + i as f32) / 16.0).collect();
        counter += 1.0;
        let (dtype, data) = if dims.len() >= 2 {
            (DType::F16, vals.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect())
        } else {
            (DType::F32, vals.iter().flat_map(|v| v.to_le_bytes()).collect())
        };
        owned.push((name.to_string(), dims.to_vec(), dtype, data));
    };
    let ln = |t: &mut dyn FnMut(&str, &[usize]), p: &str| {
        t(&format!("{p}/gamma"), &[D]);
        t(&format!("{p}/beta"), &[D]);
    };
    let lin = |t: &mut dyn FnMut(&str, &[usize]), p: &str, rows: usize, cols: usize| {
        t(&format!("{p}/weight"), &[rows, cols]);
        t(&format!("{p}/bias"), &[rows]);
    };
    tensor("encoder/position_encodings/encodings", &[2, D]);
    tensor("encoder/conv1/weight", &[D, 2, 3]);
    tensor("encoder/conv1/bias", &[D]);
    tensor("encoder/conv2/weight", &[D, D, 3]);
    tensor("encoder/conv2/bias", &[D]);
    for side in ["encoder", "decoder"] {
        let s = format!("{side}/layer_0");
        ln(&mut tensor, &format!("{s}/ffn/layer_norm"));
        lin(&mut tensor, &format!("{s}/ffn/linear_0"), FF, D);
        lin(&mut tensor, &format!("{s}/ffn/linear_1"), D, FF);
        ln(&mut tensor, &format!("{s}/self_attention/layer_norm"));
        lin(&mut tensor, &format!("{s}/self_attention/linear_0"), 3 * D, D);
        lin(&mut tensor, &format!("{s}/self_attention/linear_1"), D, D);
        if side == "decoder" {
            ln(&mut tensor, &format!("{s}/attention/layer_norm"));
            lin(&mut tensor, &format!("{s}/attention/linear_0"), D, D);
            lin(&mut tensor, &format!("{s}/attention/linear_1"), 2 * D, D);
            lin(&mut tensor, &format!("{s}/attention/linear_2"), D, D);
        }
        ln(&mut tensor, &format!("{side}/layer_norm"));
    }
    tensor("decoder/embeddings/weight", &[4, D]);
    tensor("decoder/position_encodings/encodings", &[2, D]);
    let heads = 1i16.to_le_bytes().to_vec();
    owned.push(("encoder/num_heads".into(), vec![], DType::I16, heads.clone()));
    owned.push(("decoder/num_heads".into(), vec![], DType::I16, heads));
    let vars: Vec<(&str, &[usize], DType, &[u8])> =
        owned.iter().map(|(n, d, t, b)| (n.as_str(), d.as_slice(), *t, b.as_slice())).collect();
    encode("WhisperSpec", 3, &vars, &[("decoder/projection/weight", "decoder/embeddings/weight")])
}

fn ct2_seeds() -> Result<(), Error> {
    let whisper = tiny_whisper();
    let model = Ct2Model::parse(&whisper)?;
    let (hp, tensors) = plan_tensors(&model)?;
    if hp.n_audio_layer != 1 || hp.n_text_layer != 1 || tensors.is_empty() {
        return Err("the tiny Whisper seed did not plan as expected".into());
    }
    write("ct2_reader", "tiny_whisper.bin", &whisper)?;
    // A small non-Whisper model exercising every dtype, a scalar and an alias.
    let other = encode(
        "TransformerSpec",
        1,
        &[
            ("a/f32", &[2], DType::F32, &[0, 0, 128, 63, 0, 0, 0, 64]),
            ("a/i8", &[3], DType::I8, &[1, 2, 255]),
            ("a/i16", &[], DType::I16, &[7, 0]),
            ("a/i32", &[1, 1], DType::I32, &[9, 0, 0, 0]),
            ("a/f16", &[2], DType::F16, &[0, 60, 0, 64]),
            ("a/bf16", &[1], DType::BF16, &[128, 63]),
        ],
        &[("b/alias", "a/f32")],
    );
    Ct2Model::parse(&other)?;
    write("ct2_reader", "all_dtypes.bin", &other)?;
    Ok(())
}

fn main() -> Result<(), Error> {
    wav_seeds()?;
    sidecar_budget_seeds()?;
    ct2_seeds()?;
    Ok(())
}
