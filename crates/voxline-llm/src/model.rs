//! The loaded model: weights, chat template and tokenised system prompt,
//! shared by every engine made from it; rendering and tokenising turns.

use std::sync::{Arc, OnceLock};

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{AddBos, LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::{LlamaModelLoadError, TokenToStringError};

use crate::{LlmConfig, LlmError};

/// llama.cpp's backend, initialised once per process.
pub(crate) fn backend() -> Result<&'static LlamaBackend, LlmError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| LlmError::Failed(format!("llama.cpp backend: {e}")))
}

/// A loaded language model: the weights, its chat template, the settings
/// and the tokenised system prompt. [`Send`] and [`Sync`], cheap to clone
/// (shared); a conversation needs an [`LlmEngine`] made from it.
#[derive(Clone)]
pub struct LlmModel(pub(crate) Arc<ModelParts>);

/// What an [`LlmModel`] shares.
pub(crate) struct ModelParts {
    /// The weights.
    pub(crate) model: LlamaModel,
    /// The model's chat template.
    pub(crate) template: LlamaChatTemplate,
    /// The settings it was loaded with.
    pub(crate) config: LlmConfig,
    /// The rendered system prompt, tokenised.
    pub(crate) system_tokens: Vec<LlamaToken>,
    /// The GPU every layer was offloaded to, if all were.
    pub(crate) gpu: Option<String>,
}

/// The GPUs llama.cpp offloads to when asked (`n_gpu_layers` > 0), as
/// `name (description)`, e.g. `CUDA0 (NVIDIA H200)`. Empty in a build
/// without a GPU backend (no `cuda` feature) or on a machine whose driver
/// shows none; the model then computes on the CPU.
#[must_use]
pub fn gpu_devices() -> Vec<String> {
    use llama_cpp_2::LlamaBackendDeviceType as Kind;
    llama_cpp_2::list_llama_ggml_backend_devices()
        .into_iter()
        .filter(|d| matches!(d.device_type, Kind::Gpu | Kind::IntegratedGpu))
        .map(|d| format!("{} ({})", d.name, d.description))
        .collect()
}

impl std::fmt::Debug for LlmModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmModel")
            .field("config", &self.0.config)
            .field("gpu", &self.0.gpu)
            .finish_non_exhaustive()
    }
}

impl LlmModel {
    /// Loads the GGUF model and checks that the system prompt and an
    /// answer fit in the context. Runs on any thread; nothing here is tied
    /// to one.
    ///
    /// # Errors
    /// [`LlmError::Model`] for a missing, foreign or truncated file,
    /// [`LlmError::Load`] when llama.cpp refuses it, [`LlmError::Template`]
    /// without a chat template, [`LlmError::Config`] for 0 threads, a tiny
    /// context or a temperature outside 0..=2,
    /// [`LlmError::SystemPromptTooLong`] when the system prompt and the
    /// answer cannot fit in the context.
    pub fn load(config: LlmConfig) -> Result<Self, LlmError> {
        if config.threads == 0 {
            return Err(LlmError::Config(
                "the language model needs at least one thread".into(),
            ));
        }
        let t = config.sampling.temperature;
        if !(0.0..=2.0).contains(&t) {
            return Err(LlmError::Config(format!(
                "temperature {t} is out of range: give a number from 0 (greedy) to 2"
            )));
        }
        if config.n_ctx < 64 || config.max_tokens == 0 || config.max_tokens >= config.n_ctx {
            return Err(LlmError::Config(format!(
                "context {} tokens with max {} new tokens is not usable: need ctx >= 64 and 0 < max tokens < ctx",
                config.n_ctx, config.max_tokens
            )));
        }
        voxline_models::kind::check_llm_model(&config.model)?;
        let backend = backend()?;
        let load_err = |e: LlamaModelLoadError| LlmError::Load {
            path: config.model.clone(),
            source: e.into(),
        };
        let mparams = LlamaModelParams::default().with_n_gpu_layers(config.n_gpu_layers);
        let model =
            LlamaModel::load_from_file(backend, &config.model, &mparams).map_err(load_err)?;
        let template = model.chat_template(None).map_err(|e| LlmError::Template {
            path: config.model.clone(),
            source: e.into(),
        })?;
        // Tokenise the system prompt before the context (and its KV cache) is
        // made: one that cannot fit is the user's to fix, not a failure later.
        let system = render_chat(&model, &template, &config, &[], None)?;
        let system_tokens = tokenize_with(&model, &system)?;
        let fit = (config.n_ctx as usize).saturating_sub(config.max_tokens as usize + 1);
        if system_tokens.len() > fit {
            return Err(LlmError::SystemPromptTooLong {
                prompt_tokens: system_tokens.len(),
                fit,
                n_ctx: config.n_ctx,
                max_tokens: config.max_tokens,
            });
        }
        // llama.cpp offloads the repeating layers first, then the output
        // layer: all of them when `n_gpu_layers` exceeds the layer count
        let gpu = (config.n_gpu_layers > model.n_layer())
            .then(|| gpu_devices().into_iter().next())
            .flatten();
        if let Some(d) = &gpu {
            tracing::info!(device = %d, layers = model.n_layer(), "the language model computes on the GPU");
        }
        Ok(Self(Arc::new(ModelParts {
            model,
            template,
            config,
            system_tokens,
            gpu,
        })))
    }

    /// The settings the model was loaded with.
    #[must_use]
    pub fn config(&self) -> &LlmConfig {
        &self.0.config
    }

    /// The GPU the model computes on, when every layer was offloaded to one
    /// (`n_gpu_layers` above the model's layer count, in a build and on a
    /// machine with a GPU). Only token embedding lookups and sampling then
    /// run on this process's threads, so its contexts take 1 thread and its
    /// calls do not take the pipeline's CPU lease.
    #[must_use]
    pub fn gpu(&self) -> Option<&str> {
        self.0.gpu.as_deref()
    }

    /// The threads a context computes prompt batches and single tokens
    /// with: the configured ones, or 1 when the model is on the GPU.
    pub(crate) fn context_threads(&self) -> (usize, usize) {
        if self.gpu().is_some() {
            (1, 1)
        } else {
            (self.0.config.threads, self.0.config.decode_threads.max(1))
        }
    }

    /// The llama.cpp model.
    pub(crate) fn llama(&self) -> &LlamaModel {
        &self.0.model
    }
}

/// Renders the system prompt, `history` and `user` with the model's chat template.
pub(crate) fn render_chat(
    model: &LlamaModel,
    template: &LlamaChatTemplate,
    config: &LlmConfig,
    history: &[(String, String)],
    user: Option<&str>,
) -> Result<String, LlmError> {
    let msg = |role: &str, content: &str| {
        LlamaChatMessage::new(role.into(), content.into())
            .map_err(|e| LlmError::engine("chat message", e))
    };
    let mut chat = Vec::with_capacity(2 + 2 * history.len());
    if !config.system_prompt.is_empty() {
        chat.push(msg("system", &config.system_prompt)?);
    }
    for (u, a) in history {
        chat.push(msg("user", u)?);
        chat.push(msg("assistant", a)?);
    }
    if let Some(u) = user {
        chat.push(msg("user", u)?);
    }
    if chat.is_empty() {
        return Ok(String::new());
    }
    model
        .apply_chat_template(template, &chat, user.is_some())
        .map_err(|e| LlmError::Template {
            path: config.model.clone(),
            source: e.into(),
        })
}

/// The text of `token` as bytes, however long: a piece that does not fit
/// the first buffer is decoded again in one of the size llama.cpp asks for
/// (whitespace runs in SmolLM2's vocabulary reach 81 bytes). A token with no
/// text (llama.cpp writes nothing, as for a control token) is empty.
///
/// # Errors
/// [`LlmError::Engine`] when llama.cpp cannot decode the token.
pub(crate) fn piece_bytes(model: &LlamaModel, token: LlamaToken) -> Result<Vec<u8>, LlmError> {
    const FIRST_TRY: usize = 64;
    let decode = |size: usize| model.token_to_piece_bytes(token, size, false, None);
    let failed = |e: TokenToStringError| LlmError::engine("turning a token into text", e);
    match decode(FIRST_TRY) {
        Ok(bytes) => Ok(bytes),
        Err(TokenToStringError::InsufficientBufferSpace(needed)) => {
            let size = usize::try_from(needed.unsigned_abs()).unwrap_or(usize::MAX);
            decode(size).map_err(failed)
        }
        Err(TokenToStringError::UnknownTokenType) => Ok(Vec::new()),
        Err(e) => Err(failed(e)),
    }
}

/// Tokenises `text` as it is (no BOS added).
pub(crate) fn tokenize_with(model: &LlamaModel, text: &str) -> Result<Vec<LlamaToken>, LlmError> {
    // Chat templates carry their own BOS where the model wants one.
    model
        .str_to_token(text, AddBos::Never)
        .map_err(|e| LlmError::engine("tokenize", e))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::LlmEngine;

    /// The default language model in the repository's models directory
    /// (`VOXLINE_MODELS_DIR` to look elsewhere).
    fn model_path() -> PathBuf {
        std::env::var_os("VOXLINE_MODELS_DIR")
            .map_or_else(
                || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"),
                PathBuf::from,
            )
            .join(voxline_models::registry::SMOLLM2_135M.file)
    }

    #[test]
    fn every_token_decodes_to_its_whole_text() {
        let model = LlmModel::load(LlmConfig::new(model_path(), 1)).unwrap();
        let model = model.llama();
        let mut longer_than_first_try = 0;
        for id in 0..model.n_vocab() {
            let token = LlamaToken::new(id);
            // the reference: a buffer larger than any piece in the vocabulary
            let want = model
                .token_to_piece_bytes(token, 4096, false, None)
                .unwrap_or_default();
            let got = piece_bytes(model, token).unwrap();
            assert_eq!(got, want, "token {id}");
            longer_than_first_try += usize::from(got.len() > 64);
        }
        // SmolLM2 has whitespace runs of up to 81 bytes, which a fixed
        // 64-byte buffer turned into empty text
        assert!(longer_than_first_try > 0);
    }

    #[test]
    fn bad_configs_are_refused_before_loading() {
        let mut c = LlmConfig::new("/nonexistent.gguf", 0);
        assert!(LlmEngine::load(c.clone())
            .unwrap_err()
            .to_string()
            .contains("at least one thread"));
        c.threads = 1;
        c.max_tokens = 4096;
        assert!(matches!(
            LlmEngine::load(c.clone()),
            Err(LlmError::Config(_))
        ));
        c.max_tokens = 16;
        for t in [-1.0, f32::NAN, 2.5, f32::INFINITY] {
            let mut bad = c.clone();
            bad.sampling.temperature = t;
            assert!(
                matches!(LlmEngine::load(bad), Err(LlmError::Config(ref m)) if m.contains("0 (greedy) to 2")),
                "temperature {t}"
            );
        }
        assert!(matches!(LlmEngine::load(c), Err(LlmError::Model(_))));
    }
}
