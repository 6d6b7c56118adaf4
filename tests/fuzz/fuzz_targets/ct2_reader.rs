//! Parses arbitrary bytes as a CTranslate2 `model.bin` and, when that
//! succeeds, plans the whisper.cpp tensors from it.
//!
//! Beyond "never panics", a parsed model must be self-consistent: every
//! variable holds exactly `elements × dtype size` bytes, and every planned
//! tensor holds as many values as its dimensions describe.
#![no_main]

use libfuzzer_sys::fuzz_target;
use voxline_models::ct2::Ct2Model;
use voxline_models::whisper_ggml::plan_tensors;

fuzz_target!(|data: &[u8]| {
    let Ok(model) = Ct2Model::parse(data) else {
        return;
    };
    for (name, var) in &model.variables {
        assert_eq!(
            var.data.len(),
            var.len() * var.dtype.size(),
            "variable {name} holds a byte count that disagrees with its dims"
        );
    }
    if let Ok((hp, tensors)) = plan_tensors(&model) {
        assert!(hp.n_audio_layer > 0 && hp.n_text_layer > 0);
        for t in &tensors {
            let elements: usize = t.ne.iter().product();
            assert_eq!(t.values.len(), elements, "tensor {} has the wrong number of values", t.name);
        }
    }
});
