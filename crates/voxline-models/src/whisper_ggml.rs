//! Conversion of a CTranslate2 Whisper model to whisper.cpp's ggml format.
//!
//! whisper-rs loads only whisper.cpp's own ggml files; the speech model we can
//! install ships as CTranslate2. The conversion is deterministic: the same
//! inputs always give the same bytes.
//!
//! Output layout: `i32` magic [`GGML_MAGIC`]; eleven `i32` hyper-parameters;
//! the mel filterbank (`i32` n_mel, `i32` n_fft bins, `f32` values); the
//! vocabulary (`i32` count, then `i32` length + raw bytes per token); then
//! every tensor as `i32` n_dims, `i32` name length, `i32` ftype, dims
//! innermost-first, name bytes, data.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use crate::ct2::{Ct2Model, Variable};
use crate::ModelError;

/// The magic number that starts a whisper.cpp ggml model (`"ggml"` as a little-endian i32).
pub const GGML_MAGIC: u32 = 0x6767_6d6c;

/// Sample rate the Whisper front end expects.
pub const WHISPER_SAMPLE_RATE: u32 = 16_000;
/// FFT size of the Whisper front end (25 ms at 16 kHz).
pub const WHISPER_N_FFT: usize = 400;

/// Hyper-parameters written into the ggml header, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HParams {
    /// Rows of the token embedding.
    pub n_vocab: i32,
    /// Encoder positions (1500 for 30 s).
    pub n_audio_ctx: i32,
    /// Encoder width.
    pub n_audio_state: i32,
    /// Encoder attention heads.
    pub n_audio_head: i32,
    /// Encoder layers.
    pub n_audio_layer: i32,
    /// Decoder positions.
    pub n_text_ctx: i32,
    /// Decoder width.
    pub n_text_state: i32,
    /// Decoder attention heads.
    pub n_text_head: i32,
    /// Decoder layers.
    pub n_text_layer: i32,
    /// Mel bands.
    pub n_mels: i32,
    /// 1 = mostly f16.
    pub ftype: i32,
}

/// Element type of an output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    /// Stored as f32 (ggml type 0).
    F32,
    /// Stored as f16 (ggml type 1).
    F16,
    /// Stored in a ggml block-quantised format.
    Quant(crate::quant::WhisperQuant),
}

/// Copies a CTranslate2 variable (source name) into the output as a whisper.cpp tensor (destination name).
type CopyTensor<'a> = dyn FnMut(&mut Vec<OutTensor>, &str, &str) -> Result<(), ModelError> + 'a;

/// One tensor as it will be written.
#[derive(Debug, Clone, PartialEq)]
pub struct OutTensor {
    /// whisper.cpp tensor name.
    pub name: String,
    /// Dimensions, innermost first (ggml order).
    pub ne: Vec<usize>,
    /// Storage type.
    pub ty: OutType,
    /// Values (converted to `ty` when written).
    pub values: Vec<f32>,
}

/// What a conversion produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertSummary {
    /// Header hyper-parameters.
    pub hparams: HParams,
    /// Number of tensors written.
    pub tensors: usize,
    /// Number of vocabulary entries written.
    pub vocab: usize,
    /// Bytes written.
    pub bytes: u64,
}

/// The GPT-2 byte-level alphabet: maps each of the 256 byte values to the
/// printable character the tokenizer uses for it, and back.
#[must_use]
pub fn byte_decoder() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..=255u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    printable
        .into_iter()
        .zip(chars)
        .filter_map(|(b, c)| Some((char::from_u32(c)?, u8::try_from(b).ok()?)))
        .collect()
}

/// Decodes one byte-level BPE token string to its raw bytes.
///
/// # Errors
/// [`ModelError::Convert`] when the token holds a character outside the byte alphabet.
pub fn decode_token(token: &str, decoder: &HashMap<char, u8>) -> Result<Vec<u8>, ModelError> {
    token
        .chars()
        .map(|c| {
            decoder.get(&c).copied().ok_or_else(|| {
                ModelError::Convert(format!(
                    "token {token:?} has character {c:?} outside the byte-level alphabet"
                ))
            })
        })
        .collect()
}

fn hz_to_mel_slaney(f: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if f >= min_log_hz {
        min_log_mel + (f / min_log_hz).ln() / logstep
    } else {
        f / f_sp
    }
}

fn mel_to_hz_slaney(m: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if m >= min_log_mel {
        min_log_hz * (logstep * (m - min_log_mel)).exp()
    } else {
        f_sp * m
    }
}

/// The Slaney-scale, Slaney-normalised triangular mel filterbank from 0 Hz to
/// Nyquist, row-major `[n_mels][n_fft / 2 + 1]` (the filterbank Whisper was trained with).
#[must_use]
pub fn mel_filterbank(sample_rate: u32, n_fft: usize, n_mels: usize) -> Vec<f32> {
    let n_bins = n_fft / 2 + 1;
    let sr = f64::from(sample_rate);
    let fft_freqs: Vec<f64> = (0..n_bins).map(|k| k as f64 * sr / n_fft as f64).collect();
    let (lo, hi) = (hz_to_mel_slaney(0.0), hz_to_mel_slaney(sr / 2.0));
    let mel_f: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz_slaney(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut out = Vec::with_capacity(n_mels * n_bins);
    for m in 0..n_mels {
        let (left, centre, right) = (mel_f[m], mel_f[m + 1], mel_f[m + 2]);
        let enorm = 2.0 / (right - left);
        for &f in &fft_freqs {
            let lower = (f - left) / (centre - left);
            let upper = (right - f) / (right - centre);
            out.push((lower.min(upper).max(0.0) * enorm) as f32);
        }
    }
    out
}

fn f32_tensor(name: String, var: &Variable, src: &str) -> Result<OutTensor, ModelError> {
    let ne: Vec<usize> = var.dims.iter().rev().copied().collect();
    Ok(OutTensor {
        name,
        ne,
        ty: OutType::F32,
        values: var.to_f32(src)?,
    })
}

/// Maps a CTranslate2 Whisper model to the list of whisper.cpp tensors, in
/// the order they are written. Fused projections are split: the encoder and
/// decoder self-attention `linear_0` (q, k, v stacked by rows) and the
/// cross-attention `linear_1` (k, v); key projections carry no bias.
///
/// # Errors
/// [`ModelError::Convert`] when a variable is missing or has an unexpected shape.
pub fn plan_tensors(model: &Ct2Model) -> Result<(HParams, Vec<OutTensor>), ModelError> {
    if model.spec != "WhisperSpec" {
        return Err(ModelError::Convert(format!(
            "CTranslate2 model is a {}, not a WhisperSpec — give a Whisper model",
            model.spec
        )));
    }
    let count_layers = |prefix: &str| {
        (0..)
            .take_while(|l| {
                model
                    .variables
                    .contains_key(&format!("{prefix}/layer_{l}/ffn/linear_0/weight"))
            })
            .count()
    };
    let dim = |name: &str, axis: usize| -> Result<i32, ModelError> {
        let v = model.get(name)?;
        v.dims
            .get(axis)
            .and_then(|&d| i32::try_from(d).ok())
            .ok_or_else(|| {
                ModelError::Convert(format!(
                    "{name} has dims {:?}, expected an axis {axis}",
                    v.dims
                ))
            })
    };
    let heads = |name: &str| -> Result<i32, ModelError> {
        model
            .get(name)?
            .scalar_int()
            .and_then(|h| i32::try_from(h).ok())
            .ok_or_else(|| ModelError::Convert(format!("{name} is not an integer scalar")))
    };
    let hp = HParams {
        n_vocab: dim("decoder/embeddings/weight", 0)?,
        n_audio_ctx: dim("encoder/position_encodings/encodings", 0)?,
        n_audio_state: dim("encoder/position_encodings/encodings", 1)?,
        n_audio_head: heads("encoder/num_heads")?,
        n_audio_layer: count_layers("encoder") as i32,
        n_text_ctx: dim("decoder/position_encodings/encodings", 0)?,
        n_text_state: dim("decoder/position_encodings/encodings", 1)?,
        n_text_head: heads("decoder/num_heads")?,
        n_text_layer: count_layers("decoder") as i32,
        n_mels: dim("encoder/conv1/weight", 1)?,
        ftype: 1,
    };
    if hp.n_audio_layer == 0 || hp.n_text_layer == 0 {
        return Err(ModelError::Convert(
            "CTranslate2 Whisper model has no encoder or decoder layers".into(),
        ));
    }

    let mut out = Vec::new();
    // Plain copy: f16 when 2-D or more, f32 for vectors (ggml's convention).
    let mut copy = |out: &mut Vec<OutTensor>, src: &str, dst: &str| -> Result<(), ModelError> {
        let v = model.get(src)?;
        let mut t = f32_tensor(dst.to_string(), v, src)?;
        t.ty = if v.dims.len() >= 2 {
            OutType::F16
        } else {
            OutType::F32
        };
        out.push(t);
        Ok(())
    };
    // Splits rows [part*rows .. (part+1)*rows) out of a fused matrix or vector.
    let split =
        |src: &str, dst: &str, parts: usize, part: usize| -> Result<OutTensor, ModelError> {
            let v = model.get(src)?;
            let rows = *v
                .dims
                .first()
                .ok_or_else(|| ModelError::Convert(format!("{src} is a scalar")))?;
            if rows == 0 || rows % parts != 0 {
                return Err(ModelError::Convert(format!(
                    "{src} has {rows} rows, not divisible into {parts} non-empty parts"
                )));
            }
            let all = v.to_f32(src)?;
            let per_row = all.len() / rows;
            let n = rows / parts;
            let values = all[part * n * per_row..(part + 1) * n * per_row].to_vec();
            let mut dims = v.dims.clone();
            dims[0] = n;
            let ty = if dims.len() >= 2 {
                OutType::F16
            } else {
                OutType::F32
            };
            Ok(OutTensor {
                name: dst.to_string(),
                ne: dims.into_iter().rev().collect(),
                ty,
                values,
            })
        };
    let ln = |out: &mut Vec<OutTensor>,
              copy: &mut CopyTensor<'_>,
              src: &str,
              dst: &str|
     -> Result<(), ModelError> {
        copy(out, &format!("{src}/gamma"), &format!("{dst}.weight"))?;
        copy(out, &format!("{src}/beta"), &format!("{dst}.bias"))
    };
    let linear = |out: &mut Vec<OutTensor>,
                  copy: &mut CopyTensor<'_>,
                  src: &str,
                  dst: &str|
     -> Result<(), ModelError> {
        copy(out, &format!("{src}/weight"), &format!("{dst}.weight"))?;
        copy(out, &format!("{src}/bias"), &format!("{dst}.bias"))
    };

    // One transformer block's feed-forward and self-attention (the same in
    // the encoder and the decoder), fused q/k/v split by rows; no key bias.
    let block = |out: &mut Vec<OutTensor>,
                 copy: &mut CopyTensor<'_>,
                 s: &str,
                 d: &str|
     -> Result<(), ModelError> {
        ln(
            out,
            copy,
            &format!("{s}/ffn/layer_norm"),
            &format!("{d}.mlp_ln"),
        )?;
        linear(
            out,
            copy,
            &format!("{s}/ffn/linear_0"),
            &format!("{d}.mlp.0"),
        )?;
        linear(
            out,
            copy,
            &format!("{s}/ffn/linear_1"),
            &format!("{d}.mlp.2"),
        )?;
        ln(
            out,
            copy,
            &format!("{s}/self_attention/layer_norm"),
            &format!("{d}.attn_ln"),
        )?;
        let qkv = format!("{s}/self_attention/linear_0");
        for (part, name, bias) in [(0, "query", true), (1, "key", false), (2, "value", true)] {
            out.push(split(
                &format!("{qkv}/weight"),
                &format!("{d}.attn.{name}.weight"),
                3,
                part,
            )?);
            if bias {
                out.push(split(
                    &format!("{qkv}/bias"),
                    &format!("{d}.attn.{name}.bias"),
                    3,
                    part,
                )?);
            }
        }
        linear(
            out,
            copy,
            &format!("{s}/self_attention/linear_1"),
            &format!("{d}.attn.out"),
        )
    };

    // Encoder.
    let mut pos = f32_tensor(
        "encoder.positional_embedding".into(),
        model.get("encoder/position_encodings/encodings")?,
        "encoder/position_encodings/encodings",
    )?;
    pos.ty = OutType::F32;
    out.push(pos);
    for conv in ["conv1", "conv2"] {
        copy(
            &mut out,
            &format!("encoder/{conv}/weight"),
            &format!("encoder.{conv}.weight"),
        )?;
        let bias = model.get(&format!("encoder/{conv}/bias"))?;
        let mut t = f32_tensor(format!("encoder.{conv}.bias"), bias, conv)?;
        // whisper.cpp keeps conv biases as [n_state, 1] f32 (ne = [1, n_state]).
        t.ne = vec![1, bias.len()];
        out.push(t);
    }
    for l in 0..hp.n_audio_layer {
        let (s, d) = (format!("encoder/layer_{l}"), format!("encoder.blocks.{l}"));
        block(&mut out, &mut copy, &s, &d)?;
    }
    ln(&mut out, &mut copy, "encoder/layer_norm", "encoder.ln_post")?;

    // Decoder.
    let mut pos = f32_tensor(
        "decoder.positional_embedding".into(),
        model.get("decoder/position_encodings/encodings")?,
        "decoder/position_encodings/encodings",
    )?;
    pos.ty = OutType::F32;
    out.push(pos);
    copy(
        &mut out,
        "decoder/embeddings/weight",
        "decoder.token_embedding.weight",
    )?;
    for l in 0..hp.n_text_layer {
        let s = format!("decoder/layer_{l}");
        let d = format!("decoder.blocks.{l}");
        block(&mut out, &mut copy, &s, &d)?;
        ln(
            &mut out,
            &mut copy,
            &format!("{s}/attention/layer_norm"),
            &format!("{d}.cross_attn_ln"),
        )?;
        linear(
            &mut out,
            &mut copy,
            &format!("{s}/attention/linear_0"),
            &format!("{d}.cross_attn.query"),
        )?;
        let kv = format!("{s}/attention/linear_1");
        out.push(split(
            &format!("{kv}/weight"),
            &format!("{d}.cross_attn.key.weight"),
            2,
            0,
        )?);
        out.push(split(
            &format!("{kv}/weight"),
            &format!("{d}.cross_attn.value.weight"),
            2,
            1,
        )?);
        out.push(split(
            &format!("{kv}/bias"),
            &format!("{d}.cross_attn.value.bias"),
            2,
            1,
        )?);
        linear(
            &mut out,
            &mut copy,
            &format!("{s}/attention/linear_2"),
            &format!("{d}.cross_attn.out"),
        )?;
    }
    ln(&mut out, &mut copy, "decoder/layer_norm", "decoder.ln")?;
    Ok((hp, out))
}

/// Extracts the byte-level vocabulary (ids below `<|endoftext|>`) from a
/// Hugging Face `tokenizer.json`, as raw bytes in id order.
///
/// # Errors
/// [`ModelError::Convert`] when the JSON is not a BPE tokenizer, lacks
/// `<|endoftext|>`, has a gap in its ids, or holds a token outside the byte alphabet.
pub fn vocabulary(tokenizer_json: &[u8]) -> Result<Vec<Vec<u8>>, ModelError> {
    let json: serde_json::Value = serde_json::from_slice(tokenizer_json)
        .map_err(|e| ModelError::Convert(format!("tokenizer.json is not valid JSON: {e}")))?;
    let vocab = json
        .pointer("/model/vocab")
        .and_then(|v| v.as_object())
        .ok_or_else(|| ModelError::Convert("tokenizer.json has no model.vocab object".into()))?;
    let mut by_id: HashMap<u64, &str> = HashMap::with_capacity(vocab.len());
    for (tok, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| ModelError::Convert(format!("token {tok:?} has a non-integer id")))?;
        by_id.insert(id, tok);
    }
    let eot = vocab
        .get("<|endoftext|>")
        .and_then(serde_json::Value::as_u64)
        .or_else(|| {
            json.get("added_tokens")?.as_array()?.iter().find_map(|t| {
                (t.get("content")?.as_str()? == "<|endoftext|>")
                    .then(|| t.get("id")?.as_u64())
                    .flatten()
            })
        })
        .ok_or_else(|| ModelError::Convert("tokenizer.json lacks <|endoftext|>".into()))?;
    let decoder = byte_decoder();
    (0..eot)
        .map(|id| {
            let tok = by_id.get(&id).ok_or_else(|| {
                ModelError::Convert(format!("tokenizer.json has no token with id {id}"))
            })?;
            decode_token(tok, &decoder)
        })
        .collect()
}

fn w_i32(w: &mut (impl Write + ?Sized), v: i32) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

/// Writes a whisper.cpp ggml model from its parts.
///
/// # Errors
/// [`ModelError::Io`]-like errors from the writer (reported against `what`).
pub fn write_ggml(
    w: &mut dyn Write,
    hp: &HParams,
    mel: &[f32],
    n_mels: usize,
    vocab: &[Vec<u8>],
    tensors: &[OutTensor],
    progress: &mut dyn FnMut(usize, usize),
) -> std::io::Result<u64> {
    let mut n: u64 = 0;
    let mut put = |w: &mut dyn Write, b: &[u8]| -> std::io::Result<()> {
        n += b.len() as u64;
        w.write_all(b)
    };
    let mut header = Vec::new();
    header.extend_from_slice(&GGML_MAGIC.to_le_bytes());
    for v in [
        hp.n_vocab,
        hp.n_audio_ctx,
        hp.n_audio_state,
        hp.n_audio_head,
        hp.n_audio_layer,
        hp.n_text_ctx,
        hp.n_text_state,
        hp.n_text_head,
        hp.n_text_layer,
        hp.n_mels,
        hp.ftype,
    ] {
        w_i32(&mut header, v)?;
    }
    w_i32(&mut header, n_mels as i32)?;
    w_i32(&mut header, (mel.len() / n_mels.max(1)) as i32)?;
    for v in mel {
        header.extend_from_slice(&v.to_le_bytes());
    }
    w_i32(&mut header, vocab.len() as i32)?;
    for t in vocab {
        w_i32(&mut header, t.len() as i32)?;
        header.extend_from_slice(t);
    }
    put(w, &header)?;
    for (i, t) in tensors.iter().enumerate() {
        let mut head = Vec::with_capacity(16 + t.name.len());
        w_i32(&mut head, t.ne.len() as i32)?;
        w_i32(&mut head, t.name.len() as i32)?;
        w_i32(
            &mut head,
            match t.ty {
                OutType::F32 => 0,
                OutType::F16 => 1,
                OutType::Quant(q) => q.ggml_type(),
            },
        )?;
        for &d in &t.ne {
            w_i32(&mut head, d as i32)?;
        }
        head.extend_from_slice(t.name.as_bytes());
        put(w, &head)?;
        let data: Vec<u8> = match t.ty {
            OutType::F32 => t.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            OutType::F16 => t
                .values
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            OutType::Quant(q) => q.quantize(&t.values),
        };
        put(w, &data)?;
        progress(i + 1, tensors.len());
    }
    Ok(n)
}

/// Converts a CTranslate2 Whisper model directory (`model.bin` and
/// `tokenizer.json`) into a whisper.cpp ggml file at `out`, written to a
/// temporary file beside it and renamed into place, so a failure never
/// leaves a partial model behind.
///
/// # Errors
/// [`ModelError`] for unreadable, malformed or unsupported inputs and for write failures.
pub fn convert_dir(
    model_dir: &Path,
    out: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConvertSummary, ModelError> {
    convert_dir_with(model_dir, out, None, progress)
}

/// [`convert_dir`], optionally storing the weight matrices quantised (see [`quantize_plan`]).
///
/// # Errors
/// As [`convert_dir`].
pub fn convert_dir_with(
    model_dir: &Path,
    out: &Path,
    quant: Option<crate::quant::WhisperQuant>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConvertSummary, ModelError> {
    let model = Ct2Model::read(&model_dir.join("model.bin"))?;
    let tok_path = model_dir.join("tokenizer.json");
    let tok = std::fs::read(&tok_path).map_err(|e| ModelError::io(&tok_path, e))?;
    convert_with(&model, &tok, out, quant, progress)
}

/// Converts a parsed model plus its tokenizer JSON into a ggml file at `out` (atomically).
///
/// # Errors
/// As [`convert_dir`].
pub fn convert(
    model: &Ct2Model,
    tokenizer_json: &[u8],
    out: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConvertSummary, ModelError> {
    convert_with(model, tokenizer_json, out, None, progress)
}

/// Stores the weight matrices of a planned model as `quant`: every f16
/// matrix (2-D) whose rows are whole blocks, which are exactly the tensors
/// whisper.cpp creates with the model's weight type; the convolutions (3-D,
/// f16 whatever the weight type), biases, norms and positional embeddings
/// (f32) stay as they are. Sets the header's `ftype` to match.
pub fn quantize_plan(
    hp: &mut HParams,
    tensors: &mut [OutTensor],
    quant: crate::quant::WhisperQuant,
) {
    hp.ftype = quant.file_ftype();
    for t in tensors.iter_mut() {
        if t.ty == OutType::F16 && t.ne.len() == 2 && t.ne[0] % crate::quant::QK == 0 {
            t.ty = OutType::Quant(quant);
        }
    }
}

/// Like [`convert`], optionally storing the weight matrices quantised (see [`quantize_plan`]).
///
/// # Errors
/// As [`convert_dir`].
pub fn convert_with(
    model: &Ct2Model,
    tokenizer_json: &[u8],
    out: &Path,
    quant: Option<crate::quant::WhisperQuant>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConvertSummary, ModelError> {
    let (mut hp, mut tensors) = plan_tensors(model)?;
    if let Some(q) = quant {
        quantize_plan(&mut hp, &mut tensors, q);
    }
    let vocab = vocabulary(tokenizer_json)?;
    let n_mels =
        usize::try_from(hp.n_mels).map_err(|_| ModelError::Convert("negative n_mels".into()))?;
    let mel = mel_filterbank(WHISPER_SAMPLE_RATE, WHISPER_N_FFT, n_mels);
    crate::atomic_write(out, |w| {
        write_ggml(w, &hp, &mel, n_mels, &vocab, &tensors, progress)
    })
    .map(|bytes| ConvertSummary {
        hparams: hp,
        tensors: tensors.len(),
        vocab: vocab.len(),
        bytes,
    })
}

#[cfg(test)]
mod tests;
