use super::*;
use crate::ct2::{encode, DType};

/// Reference values of librosa 0.11 `filters.mel(sr=16000, n_fft=400, n_mels=80)`
/// (Slaney scale and norm), as (mel row, fft bin, value).
const LIBROSA_MEL: [(usize, usize, f32); 10] = [
    (0, 1, 0.024_862_595),
    (0, 2, 0.0),
    (1, 1, 0.001_990_822),
    (1, 2, 0.022_871_772),
    (10, 10, 0.019_908_218),
    (10, 11, 0.004_954_375),
    (40, 42, 0.005_411_105),
    (40, 43, 0.014_735_566),
    (79, 186, 0.000_366_741_67),
    (79, 192, 0.003_164_711_9),
];

#[test]
fn mel_filterbank_matches_librosa() {
    let m = mel_filterbank(16_000, 400, 80);
    assert_eq!(m.len(), 80 * 201);
    for (row, bin, want) in LIBROSA_MEL {
        let got = m[row * 201 + bin];
        assert!(
            (got - want).abs() < 1e-6,
            "mel[{row}][{bin}] = {got}, librosa {want}"
        );
    }
    let total: f32 = m.iter().sum();
    assert!((total - 1.999_024_2).abs() < 1e-4, "sum {total}");
    // Slaney normalisation: each triangle has unit area in Hz (bins are 40 Hz apart),
    // checked on the wide upper filters where sampling the triangle is accurate.
    for row in 50..80 {
        let area: f32 = m[row * 201..(row + 1) * 201].iter().sum::<f32>() * 40.0;
        assert!((area - 1.0).abs() < 0.02, "row {row} area {area}");
    }
    assert!(m.iter().all(|v| *v >= 0.0));
    assert_eq!(m[200], 0.0, "Nyquist bin of the first filter");
}

#[test]
fn byte_decoder_is_a_bijection_over_256_bytes() {
    let d = byte_decoder();
    assert_eq!(d.len(), 256);
    let mut bytes: Vec<u8> = d.values().copied().collect();
    bytes.sort_unstable();
    assert_eq!(bytes, (0..=255).collect::<Vec<u8>>());
    // printable ASCII maps to itself; space is 'Ġ' (U+0120), newline 'Ċ' (U+010A)
    assert_eq!(d[&'a'], b'a');
    assert_eq!(d[&'\u{120}'], b' ');
    assert_eq!(d[&'\u{10A}'], b'\n');
    assert_eq!(d[&'\u{100}'], 0);
    assert_eq!(decode_token("Ġhello", &d).unwrap(), b" hello");
    // "é" as UTF-8 is C3 A9, which byte-level BPE writes as "Ã©"
    assert_eq!(decode_token("Ã©", &d).unwrap(), "é".as_bytes());
    assert!(decode_token("日", &d).is_err());
}

#[test]
fn vocabulary_is_ids_below_endoftext_as_bytes() {
    let json = r#"{"model":{"type":"BPE","vocab":{"!":0,"Ġa":1,"Ã©":2,"<|endoftext|>":3,"<|other|>":4}},
                 "added_tokens":[{"id":3,"content":"<|endoftext|>"}]}"#;
    let v = vocabulary(json.as_bytes()).unwrap();
    assert_eq!(
        v,
        vec![b"!".to_vec(), b" a".to_vec(), "é".as_bytes().to_vec()]
    );
    // end-of-text only in added_tokens
    let json =
        r#"{"model":{"vocab":{"x":0,"y":1}},"added_tokens":[{"id":2,"content":"<|endoftext|>"}]}"#;
    assert_eq!(vocabulary(json.as_bytes()).unwrap().len(), 2);
    // a gap in ids is an error, not a silent shift
    let json = r#"{"model":{"vocab":{"x":0,"y":2,"<|endoftext|>":3}}}"#;
    assert!(vocabulary(json.as_bytes())
        .unwrap_err()
        .to_string()
        .contains("id 1"));
    assert!(vocabulary(b"not json").is_err());
    assert!(vocabulary(br#"{"model":{"vocab":{"x":0}}}"#)
        .unwrap_err()
        .to_string()
        .contains("endoftext"));
}

/// A miniature but complete Whisper CTranslate2 model: width `d`, one layer
/// each side, values that encode their own position so splits can be checked.
fn tiny_model(d: usize, dtype: DType) -> Vec<u8> {
    let ramp = |n: usize, base: f32| -> Vec<f32> { (0..n).map(|i| base + i as f32).collect() };
    let bytes = |v: &[f32]| -> Vec<u8> {
        match dtype {
            DType::F16 => v
                .iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
            _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    };
    let mut owned: Vec<(String, Vec<usize>, DType, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, dims: &[usize], base: f32| {
        let n = dims.iter().product();
        owned.push((
            name.to_string(),
            dims.to_vec(),
            dtype,
            bytes(&ramp(n, base)),
        ));
    };
    let (n_vocab, n_mels, ctx_a, ctx_t) = (8, 4, 6, 5);
    add("encoder/conv1/weight", &[d, n_mels, 3], 0.0);
    add("encoder/conv1/bias", &[d], 1.0);
    add("encoder/conv2/weight", &[d, d, 3], 0.0);
    add("encoder/conv2/bias", &[d], 2.0);
    add("encoder/position_encodings/encodings", &[ctx_a, d], 0.0);
    add("encoder/layer_norm/gamma", &[d], 1.0);
    add("encoder/layer_norm/beta", &[d], 0.0);
    add("decoder/embeddings/weight", &[n_vocab, d], 0.0);
    add("decoder/position_encodings/encodings", &[ctx_t, d], 0.0);
    add("decoder/layer_norm/gamma", &[d], 1.0);
    add("decoder/layer_norm/beta", &[d], 0.0);
    for side in ["encoder", "decoder"] {
        let l = format!("{side}/layer_0");
        for ln in ["ffn/layer_norm", "self_attention/layer_norm"] {
            add(&format!("{l}/{ln}/gamma"), &[d], 1.0);
            add(&format!("{l}/{ln}/beta"), &[d], 0.0);
        }
        add(&format!("{l}/ffn/linear_0/weight"), &[4 * d, d], 0.0);
        add(&format!("{l}/ffn/linear_0/bias"), &[4 * d], 0.0);
        add(&format!("{l}/ffn/linear_1/weight"), &[d, 4 * d], 0.0);
        add(&format!("{l}/ffn/linear_1/bias"), &[d], 0.0);
        add(
            &format!("{l}/self_attention/linear_0/weight"),
            &[3 * d, d],
            0.0,
        );
        add(
            &format!("{l}/self_attention/linear_0/bias"),
            &[3 * d],
            100.0,
        );
        add(&format!("{l}/self_attention/linear_1/weight"), &[d, d], 0.0);
        add(&format!("{l}/self_attention/linear_1/bias"), &[d], 0.0);
    }
    let l = "decoder/layer_0/attention";
    add(&format!("{l}/layer_norm/gamma"), &[d], 1.0);
    add(&format!("{l}/layer_norm/beta"), &[d], 0.0);
    add(&format!("{l}/linear_0/weight"), &[d, d], 0.0);
    add(&format!("{l}/linear_0/bias"), &[d], 0.0);
    add(&format!("{l}/linear_1/weight"), &[2 * d, d], 0.0);
    add(&format!("{l}/linear_1/bias"), &[2 * d], 200.0);
    add(&format!("{l}/linear_2/weight"), &[d, d], 0.0);
    add(&format!("{l}/linear_2/bias"), &[d], 0.0);
    let heads = 2i16.to_le_bytes();
    let mut vars: Vec<(&str, &[usize], DType, &[u8])> = owned
        .iter()
        .map(|(n, d, t, b)| (n.as_str(), d.as_slice(), *t, b.as_slice()))
        .collect();
    vars.push(("encoder/num_heads", &[], DType::I16, &heads));
    vars.push(("decoder/num_heads", &[], DType::I16, &heads));
    encode(
        "WhisperSpec",
        3,
        &vars,
        &[("decoder/projection/weight", "decoder/embeddings/weight")],
    )
}

fn find<'a>(t: &'a [OutTensor], name: &str) -> &'a OutTensor {
    t.iter()
        .find(|x| x.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"))
}

#[test]
fn plan_maps_names_splits_fused_projections_and_picks_types() {
    let d = 4;
    let m = Ct2Model::parse(&tiny_model(d, DType::F32)).unwrap();
    let (hp, t) = plan_tensors(&m).unwrap();
    assert_eq!(
        hp,
        HParams {
            n_vocab: 8,
            n_audio_ctx: 6,
            n_audio_state: 4,
            n_audio_head: 2,
            n_audio_layer: 1,
            n_text_ctx: 5,
            n_text_state: 4,
            n_text_head: 2,
            n_text_layer: 1,
            n_mels: 4,
            ftype: 1
        }
    );
    // every tensor whisper.cpp loads for one encoder and one decoder layer, and no more
    assert_eq!(t.len(), 7 + 15 + 4 + 24);
    let names: std::collections::HashSet<&str> = t.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names.len(), t.len(), "duplicate names");
    assert!(!names.contains("encoder.blocks.0.attn.key.bias"));
    assert!(!names.contains("decoder.blocks.0.cross_attn.key.bias"));

    // fused q,k,v: rows 0..d, d..2d, 2d..3d of a ramp → each block starts at row*d
    for (part, name) in ["query", "key", "value"].iter().enumerate() {
        let w = find(&t, &format!("encoder.blocks.0.attn.{name}.weight"));
        assert_eq!(w.ne, vec![d, d]);
        assert_eq!(w.values[0], (part * d * d) as f32);
        assert_eq!(w.values.len(), d * d);
        assert_eq!(w.ty, OutType::F16);
    }
    assert_eq!(
        find(&t, "encoder.blocks.0.attn.query.bias").values,
        vec![100.0, 101.0, 102.0, 103.0]
    );
    assert_eq!(
        find(&t, "encoder.blocks.0.attn.value.bias").values,
        vec![108.0, 109.0, 110.0, 111.0]
    );
    // fused cross-attention k,v
    assert_eq!(
        find(&t, "decoder.blocks.0.cross_attn.key.weight").values[0],
        0.0
    );
    assert_eq!(
        find(&t, "decoder.blocks.0.cross_attn.value.weight").values[0],
        (d * d) as f32
    );
    assert_eq!(
        find(&t, "decoder.blocks.0.cross_attn.value.bias").values,
        vec![204.0, 205.0, 206.0, 207.0]
    );
    // dims innermost-first; conv bias reshaped to [n,1] and kept f32
    assert_eq!(find(&t, "encoder.conv1.weight").ne, vec![3, 4, d]);
    let b = find(&t, "encoder.conv1.bias");
    assert_eq!((b.ne.clone(), b.ty), (vec![1, d], OutType::F32));
    // positional embeddings f32 even though 2-D; other matrices f16; vectors f32
    assert_eq!(find(&t, "encoder.positional_embedding").ty, OutType::F32);
    assert_eq!(find(&t, "decoder.positional_embedding").ty, OutType::F32);
    assert_eq!(find(&t, "decoder.token_embedding.weight").ty, OutType::F16);
    assert_eq!(find(&t, "decoder.token_embedding.weight").ne, vec![d, 8]);
    assert_eq!(find(&t, "decoder.ln.weight").ty, OutType::F32);
    assert_eq!(find(&t, "encoder.blocks.0.mlp.0.weight").ne, vec![d, 4 * d]);
    assert_eq!(find(&t, "encoder.blocks.0.mlp.2.weight").ne, vec![4 * d, d]);
}

#[test]
fn f16_and_f32_sources_convert_to_the_same_bytes() {
    let tok = br#"{"model":{"vocab":{"a":0,"b":1,"<|endoftext|>":2}}}"#;
    let dir = tempfile::tempdir().unwrap();
    let (p16, p32) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
    let m16 = Ct2Model::parse(&tiny_model(4, DType::F16)).unwrap();
    let m32 = Ct2Model::parse(&tiny_model(4, DType::F32)).unwrap();
    convert(&m16, tok, &p16, &mut |_, _| {}).unwrap();
    convert(&m32, tok, &p32, &mut |_, _| {}).unwrap();
    assert_eq!(std::fs::read(&p16).unwrap(), std::fs::read(&p32).unwrap());
}

#[test]
fn written_file_has_the_documented_layout_and_is_deterministic() {
    let tok = r#"{"model":{"vocab":{"a":0,"Ġb":1,"<|endoftext|>":2}}}"#.as_bytes();
    let m = Ct2Model::parse(&tiny_model(4, DType::F16)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (p1, p2) = (dir.path().join("1.bin"), dir.path().join("2.bin"));
    let mut calls = 0;
    let s = convert(&m, tok, &p1, &mut |done, total| {
        calls += 1;
        assert!(done <= total);
    })
    .unwrap();
    convert(&m, tok, &p2, &mut |_, _| {}).unwrap();
    let b = std::fs::read(&p1).unwrap();
    assert_eq!(b, std::fs::read(&p2).unwrap(), "same input, same bytes");
    assert_eq!(s.bytes, b.len() as u64);
    assert_eq!(calls, s.tensors);
    let i32_at = |o: usize| i32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!(i32_at(0) as u32, GGML_MAGIC);
    assert_eq!(
        (1..=11).map(|k| i32_at(4 * k)).collect::<Vec<_>>(),
        vec![8, 6, 4, 2, 1, 5, 4, 2, 1, 4, 1]
    );
    assert_eq!((i32_at(48), i32_at(52)), (4, 201));
    let vocab_at = 56 + 4 * 201 * 4;
    assert_eq!(i32_at(vocab_at), 2);
    assert_eq!(i32_at(vocab_at + 4), 1);
    assert_eq!(&b[vocab_at + 8..vocab_at + 9], b"a");
    assert_eq!(i32_at(vocab_at + 9), 2);
    assert_eq!(&b[vocab_at + 13..vocab_at + 15], b" b");
    // first tensor: encoder.positional_embedding, 2 dims, f32, ne [4, 6]
    let t0 = vocab_at + 15;
    let name = "encoder.positional_embedding";
    assert_eq!(
        (i32_at(t0), i32_at(t0 + 4), i32_at(t0 + 8)),
        (2, name.len() as i32, 0)
    );
    assert_eq!((i32_at(t0 + 12), i32_at(t0 + 16)), (4, 6));
    assert_eq!(&b[t0 + 20..t0 + 20 + name.len()], name.as_bytes());
    // the whole file validates as a whisper model
    crate::kind::check_whisper_model(&p1).unwrap();
}

#[test]
fn refuses_non_whisper_and_incomplete_models() {
    let other = encode("TransformerSpec", 1, &[], &[]);
    let m = Ct2Model::parse(&other).unwrap();
    assert!(plan_tensors(&m)
        .unwrap_err()
        .to_string()
        .contains("not a WhisperSpec"));
    // drop one variable → named in the error
    let full = Ct2Model::parse(&tiny_model(4, DType::F16)).unwrap();
    let mut partial = full.clone();
    partial
        .variables
        .remove("decoder/layer_0/attention/linear_2/bias");
    let err = plan_tensors(&partial).unwrap_err().to_string();
    assert!(
        err.contains("decoder/layer_0/attention/linear_2/bias"),
        "{err}"
    );
    // a fused projection whose rows do not split in three
    let mut odd = full;
    odd.variables
        .get_mut("encoder/layer_0/self_attention/linear_0/weight")
        .unwrap()
        .dims = vec![10, 4];
    assert!(plan_tensors(&odd).is_err());
}

#[test]
fn quantising_a_plan_touches_exactly_the_weight_matrices() {
    use crate::quant::WhisperQuant;
    let t = |name: &str, ne: Vec<usize>, ty: OutType| OutTensor {
        name: name.into(),
        ne: ne.clone(),
        ty,
        values: vec![0.5; ne.iter().product()],
    };
    let mut hp = HParams {
        n_vocab: 1,
        n_audio_ctx: 1,
        n_audio_state: 1,
        n_audio_head: 1,
        n_audio_layer: 1,
        n_text_ctx: 1,
        n_text_state: 1,
        n_text_head: 1,
        n_text_layer: 1,
        n_mels: 1,
        ftype: 1,
    };
    let mut tensors = vec![
        t(
            "encoder.blocks.0.attn.query.weight",
            vec![64, 64],
            OutType::F16,
        ),
        t("encoder.conv1.weight", vec![3, 80, 64], OutType::F16),
        t("encoder.conv1.bias", vec![1, 64], OutType::F32),
        t("encoder.positional_embedding", vec![64, 1500], OutType::F32),
        t("encoder.blocks.0.attn_ln.weight", vec![64], OutType::F32),
        t("odd.rows", vec![48, 2], OutType::F16),
    ];
    quantize_plan(&mut hp, &mut tensors, WhisperQuant::Q8_0);
    assert_eq!(hp.ftype, 2007);
    let types: Vec<OutType> = tensors.iter().map(|t| t.ty).collect();
    assert_eq!(
        types,
        [
            OutType::Quant(WhisperQuant::Q8_0),
            OutType::F16,
            OutType::F32,
            OutType::F32,
            OutType::F32,
            OutType::F16,
        ]
    );
    // written with the ggml type id and the block layout
    let mut buf = Vec::new();
    write_ggml(
        &mut buf,
        &hp,
        &[0.0; 1],
        1,
        &[b"a".to_vec()],
        &tensors[..1],
        &mut |_, _| {},
    )
    .unwrap();
    let blocks = 64 * 64 / crate::quant::QK;
    assert!(buf.ends_with(&WhisperQuant::Q8_0.quantize(&vec![0.5; 64 * 64])));
    assert_eq!(
        WhisperQuant::Q8_0.quantize(&vec![0.5; 64 * 64]).len(),
        blocks * 34
    );
}
