//! Structure-aware companion of `ct2_reader`: builds a CTranslate2 Whisper
//! model whose variable names come from the real layout, with shapes, dtypes
//! and values chosen by the fuzzer, then parses it and plans the whisper.cpp
//! tensors.
//!
//! Byte-level mutation of a `model.bin` almost never yields a model that gets
//! past the parser and reaches the name mapping in `plan_tensors`; this target
//! starts there. It checks the same invariants as `ct2_reader`.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use voxline_models::ct2::{encode, Ct2Model, DType};
use voxline_models::whisper_ggml::plan_tensors;

/// Every variable name `plan_tensors` looks up, for layer 0 of each side
/// plus the first names of a layer 1 (so the layer count can vary).
fn names() -> Vec<String> {
    let mut v: Vec<String> = [
        "encoder/position_encodings/encodings",
        "encoder/conv1/weight",
        "encoder/conv1/bias",
        "encoder/conv2/weight",
        "encoder/conv2/bias",
        "encoder/num_heads",
        "encoder/layer_norm/gamma",
        "encoder/layer_norm/beta",
        "decoder/embeddings/weight",
        "decoder/position_encodings/encodings",
        "decoder/num_heads",
        "decoder/layer_norm/gamma",
        "decoder/layer_norm/beta",
        "encoder/layer_1/ffn/linear_0/weight",
        "decoder/layer_1/ffn/linear_0/weight",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for side in ["encoder", "decoder"] {
        let s = format!("{side}/layer_0");
        let mut blocks = vec!["ffn/layer_norm", "self_attention/layer_norm"];
        let mut linears = vec!["ffn/linear_0", "ffn/linear_1", "self_attention/linear_0", "self_attention/linear_1"];
        if side == "decoder" {
            blocks.push("attention/layer_norm");
            linears.extend(["attention/linear_0", "attention/linear_1", "attention/linear_2"]);
        }
        for b in blocks {
            v.push(format!("{s}/{b}/gamma"));
            v.push(format!("{s}/{b}/beta"));
        }
        for l in linears {
            v.push(format!("{s}/{l}/weight"));
            v.push(format!("{s}/{l}/bias"));
        }
    }
    v
}

const DTYPES: [DType; 6] = [DType::F32, DType::I8, DType::I16, DType::I32, DType::F16, DType::BF16];

fn build(u: &mut Unstructured<'_>, names: &[String]) -> Result<Vec<u8>> {
    let mut owned: Vec<(String, Vec<usize>, DType, Vec<u8>)> = Vec::new();
    for name in names {
        // Mostly present, so the planner gets deep.
        if u.ratio(1u8, 16u8)? {
            continue;
        }
        let rank = u.int_in_range(0u8..=3)?;
        let dims: Vec<usize> = (0..rank).map(|_| u.int_in_range(0usize..=7)).collect::<Result<_>>()?;
        let dtype = *u.choose(&DTYPES)?;
        let n = dims.iter().product::<usize>() * dtype.size();
        let mut data = vec![0u8; n];
        u.fill_buffer(&mut data)?;
        owned.push((name.clone(), dims, dtype, data));
    }
    let spec = if u.ratio(1u8, 32u8)? { "TransformerSpec" } else { "WhisperSpec" };
    let vars: Vec<(&str, &[usize], DType, &[u8])> =
        owned.iter().map(|(n, d, t, b)| (n.as_str(), d.as_slice(), *t, b.as_slice())).collect();
    Ok(encode(spec, 3, &vars, &[("decoder/projection/weight", "decoder/embeddings/weight")]))
}

fuzz_target!(|data: &[u8]| {
    thread_local! {
        static NAMES: Vec<String> = names();
    }
    let Ok(bytes) = NAMES.with(|names| build(&mut Unstructured::new(data), names)) else {
        return;
    };
    // An alias to an omitted variable is a parse error, which is fine.
    let Ok(model) = Ct2Model::parse(&bytes) else {
        return;
    };
    if let Ok((hp, tensors)) = plan_tensors(&model) {
        assert!(hp.n_audio_layer > 0 && hp.n_text_layer > 0);
        for t in &tensors {
            let elements: usize = t.ne.iter().product();
            assert_eq!(t.values.len(), elements, "tensor {} has the wrong number of values", t.name);
        }
    }
});
