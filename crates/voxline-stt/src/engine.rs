//! The engine: a loaded whisper model and its reusable decoding state.

use std::path::Path;

use whisper_rs::{
    FullParams, SamplingStrategy, WhisperContext, WhisperContextParameters, WhisperState,
};

use crate::{AudioCtx, SttConfig, SttError, SAMPLE_RATE};

/// whisper.cpp's abort callback: calls the Rust closure behind `data`.
unsafe extern "C" fn poll_abort(data: *mut std::ffi::c_void) -> bool {
    if data.is_null() {
        return false;
    }
    // SAFETY: `data` is the pointer `transcribe_abortable` passed, to a
    // `&(dyn Fn() -> bool + Sync)` that outlives the `full` call polling it.
    let f = unsafe { &*data.cast::<&(dyn Fn() -> bool + Sync)>() };
    f()
}

/// The GPU whisper.cpp offloads to when asked (`use_gpu`): the first
/// GPU among ggml's devices, as `name (description)`, e.g. `CUDA0 (NVIDIA
/// H200)`. `None` in a build without a GPU backend (no `cuda` feature) or on
/// a machine whose driver shows none; whisper then computes on the CPU.
#[must_use]
pub fn gpu_device() -> Option<String> {
    use whisper_rs_sys as sys;
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: ggml returns NUL-terminated strings owned by its device
            // registry, which lives as long as the process.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        }
    };
    // SAFETY: ggml's device registry is built once, on first use, and only
    // read here; device handles stay valid for the life of the process. The
    // binary holds one ggml, so this is the registry whisper.cpp reads.
    unsafe {
        (0..sys::ggml_backend_dev_count()).find_map(|i| {
            let dev = sys::ggml_backend_dev_get(i);
            let kind = sys::ggml_backend_dev_type(dev);
            (kind == sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_GPU
                || kind == sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_IGPU)
                .then(|| {
                    format!(
                        "{} ({})",
                        text(sys::ggml_backend_dev_name(dev)),
                        text(sys::ggml_backend_dev_description(dev))
                    )
                })
        })
    }
}

/// One utterance's transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcription {
    /// The text, trimmed.
    pub text: String,
    /// Text tokens whisper produced (special and timestamp tokens excluded).
    pub n_tokens: u32,
    /// Length of the audio transcribed.
    pub audio_ms: f64,
    /// Encoder positions used (0 = the full 1500).
    pub audio_ctx: u32,
    /// How sure the recogniser was that it heard words (`None` from an
    /// engine that does not say, e.g. a remote server).
    pub confidence: Option<Confidence>,
}

/// The recogniser's own signals of whether it heard words; a transcript of
/// noise (a hum heard as "How far?") has a high [`Confidence::no_speech`],
/// which is what [`crate::not_words`] decides on; the mean log-probability
/// is reported beside it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Confidence {
    /// Probability of whisper's no-speech token at the start of decoding.
    pub no_speech: f32,
    /// Mean log-probability of the text tokens chosen (0 = certain);
    /// `-inf`-free: 0 when there are no text tokens.
    pub avg_logprob: f32,
}

/// A loaded whisper model with a reusable decoding state.
pub struct SttEngine {
    state: WhisperState,
    /// Shared by the engines made with [`SttEngine::share`].
    ctx: std::sync::Arc<WhisperContext>,
    config: SttConfig,
    /// The GPU the model computes on ([`gpu_device`] when `use_gpu`).
    gpu: Option<String>,
}

impl std::fmt::Debug for SttEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SttEngine")
            .field("config", &self.config)
            .field("gpu", &self.gpu)
            .finish_non_exhaustive()
    }
}

impl SttEngine {
    /// Loads the model named in `config` after checking it is a complete whisper model.
    ///
    /// # Errors
    /// [`SttError::Model`] for a missing, foreign or truncated file,
    /// [`SttError::Load`] when whisper.cpp refuses it, [`SttError::Config`] for 0 threads.
    pub fn load(config: SttConfig) -> Result<Self, SttError> {
        if config.threads == 0 {
            return Err(SttError::Config(
                "the speech model needs at least one thread".into(),
            ));
        }
        whisper_rs::install_logging_hooks();
        voxline_models::kind::check_whisper_model(&config.model)?;
        let path = config.model.to_str().ok_or_else(|| SttError::Load {
            path: config.model.clone(),
            source: "the path is not valid UTF-8; rename it".into(),
        })?;
        let mut params = WhisperContextParameters::default();
        params.use_gpu(config.use_gpu);
        params.flash_attn(config.flash_attn);
        let ctx = WhisperContext::new_with_params(path, params).map_err(|e| SttError::Load {
            path: config.model.clone(),
            source: e.into(),
        })?;
        let state = ctx.create_state().map_err(|e| SttError::Load {
            path: config.model.clone(),
            source: e.into(),
        })?;
        let gpu = if config.use_gpu { gpu_device() } else { None };
        if let Some(d) = &gpu {
            tracing::info!(device = %d, "whisper computes on the GPU");
        }
        Ok(Self {
            state,
            ctx: std::sync::Arc::new(ctx),
            config,
            gpu,
        })
    }

    /// Another engine on the same loaded model (weights shared, not
    /// copied) with its own decoding state, so another conversation can
    /// transcribe with it on another thread.
    ///
    /// # Errors
    /// [`SttError::Load`] when whisper.cpp cannot allocate the state.
    pub fn share(&self) -> Result<Self, SttError> {
        let state = self.ctx.create_state().map_err(|e| SttError::Load {
            path: self.config.model.clone(),
            source: e.into(),
        })?;
        Ok(Self {
            state,
            ctx: std::sync::Arc::clone(&self.ctx),
            config: self.config.clone(),
            gpu: self.gpu.clone(),
        })
    }

    /// The settings this engine runs with.
    #[must_use]
    pub fn config(&self) -> &SttConfig {
        &self.config
    }

    /// The GPU the model was offloaded to, if it was: asked for
    /// (`use_gpu`) in a build and on a machine with one. Only the log-mel
    /// spectrogram is then computed on this process's threads.
    #[must_use]
    pub fn gpu(&self) -> Option<&str> {
        self.gpu.as_deref()
    }

    /// Changes the threads used from the next transcription on (at least 1).
    pub fn set_threads(&mut self, threads: usize) {
        self.config.threads = threads.max(1);
    }

    /// Changes the encoder window policy.
    pub fn set_audio_ctx(&mut self, audio_ctx: AudioCtx) {
        self.config.audio_ctx = audio_ctx;
    }

    /// The model file.
    #[must_use]
    pub fn model_path(&self) -> &Path {
        &self.config.model
    }

    /// Transcribes one utterance of 16 kHz mono samples.
    ///
    /// # Errors
    /// [`SttError::Transcribe`] when the engine fails or returns non-text output.
    pub fn transcribe(&mut self, samples: &[f32]) -> Result<Transcription, SttError> {
        self.transcribe_abortable(samples, &|| false)
    }

    /// Like [`SttEngine::transcribe`], but whisper polls `abort` while it
    /// works (between graph nodes and decoding steps) and stops soon after
    /// it returns `true`.
    ///
    /// # Errors
    /// [`SttError::Aborted`] when `abort` stopped it; otherwise as
    /// [`SttEngine::transcribe`].
    pub fn transcribe_abortable(
        &mut self,
        samples: &[f32],
        abort: &(dyn Fn() -> bool + Sync),
    ) -> Result<Transcription, SttError> {
        self.run(samples, abort, false)
    }

    /// Like [`SttEngine::transcribe_abortable`], for a chunk of long speech
    /// (a piece the endpointer cut at its maximum length, or the rest after
    /// such a cut): whisper decodes it with timestamp tokens, as it was
    /// trained to decode long windows. Without them tiny.en sometimes ends a
    /// dense 10–20 s chunk after its first word ("The"): measured on the
    /// long-speech monologue, one 18.9 s chunk came back as "The" without
    /// timestamps and as all its 69 words with them, in about the same time.
    /// Short utterances keep the plain decoding, which transcribes them
    /// slightly better.
    ///
    /// # Errors
    /// As [`SttEngine::transcribe_abortable`].
    pub fn transcribe_chunk_abortable(
        &mut self,
        samples: &[f32],
        abort: &(dyn Fn() -> bool + Sync),
    ) -> Result<Transcription, SttError> {
        self.run(samples, abort, true)
    }

    /// The probability of whisper's no-speech token right after the
    /// start-of-transcript token, as whisper was trained to predict it, for
    /// the audio the last transcription encoded: one decoder step on the
    /// encoder's output that is still in the state (a few ms on tiny.en).
    /// whisper.cpp's own per-segment figure is read after the
    /// no-timestamps token when timestamps are off, where it is always ~0
    /// (measured: 0.000 on hums, tones, noise and speech alike).
    fn no_speech_probability(&mut self) -> Result<f32, whisper_rs::WhisperError> {
        let sot = self.ctx.token_sot();
        let nosp = usize::try_from(self.ctx.token_nosp()).unwrap_or(usize::MAX);
        self.state.decode(&[sot], 0, self.config.threads.max(1))?;
        let logits = self.state.get_logits()?;
        let Some(&target) = logits.get(nosp) else {
            return Ok(0.0);
        };
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        Ok((f64::from(target - max).exp() / sum) as f32)
    }

    fn run(
        &mut self,
        samples: &[f32],
        abort: &(dyn Fn() -> bool + Sync),
        timestamps: bool,
    ) -> Result<Transcription, SttError> {
        let audio_ms = samples.len() as f64 * 1000.0 / f64::from(SAMPLE_RATE);
        let fail = |source: whisper_rs::WhisperError| SttError::Transcribe { audio_ms, source };
        // whisper needs at least ~1 s of input; pad short utterances with silence.
        let min = SAMPLE_RATE as usize + SAMPLE_RATE as usize / 10;
        let padded;
        let input = if samples.len() < min {
            let mut v = samples.to_vec();
            v.resize(min, 0.0);
            padded = v;
            &padded[..]
        } else {
            samples
        };
        let audio_ctx = self.config.audio_ctx.positions(input.len());
        let mut p = FullParams::new(if self.config.beam > 1 {
            SamplingStrategy::BeamSearch {
                beam_size: i32::try_from(self.config.beam).unwrap_or(1),
                patience: -1.0,
            }
        } else {
            SamplingStrategy::Greedy { best_of: 1 }
        });
        p.set_n_threads(i32::try_from(self.config.threads).unwrap_or(1));
        p.set_language(Some(&self.config.language));
        p.set_translate(false);
        p.set_no_context(true);
        p.set_single_segment(true);
        p.set_no_timestamps(!timestamps);

        p.set_suppress_blank(true);
        p.set_print_progress(false);
        p.set_print_realtime(false);
        p.set_print_special(false);
        p.set_print_timestamps(false);
        p.set_audio_ctx(i32::try_from(audio_ctx).unwrap_or(0));
        let abort_ref: &(dyn Fn() -> bool + Sync) = abort;
        // SAFETY: whisper.cpp calls `poll_abort` with the user data given here
        // only during `full` below, which returns before `abort_ref` (on this
        // stack frame) goes out of scope; the pointer is to a shared
        // reference, only read, and the closure behind it is `Sync`, so it may
        // be called from whichever ggml thread polls it.
        unsafe {
            p.set_abort_callback(Some(poll_abort));
            p.set_abort_callback_user_data(
                std::ptr::from_ref(&abort_ref)
                    .cast_mut()
                    .cast::<std::ffi::c_void>(),
            );
        }
        let result = self.state.full(p, input);
        if abort() {
            return Err(SttError::Aborted);
        }
        result.map_err(fail)?;
        let eot = self.ctx.token_eot();
        let mut text = String::new();
        let mut n_tokens = 0u32;
        let mut logprob = 0.0f64;
        for seg in self.state.as_iter() {
            text.push_str(&seg.to_str_lossy().map_err(fail)?);
            for i in 0..seg.n_tokens() {
                if let Some(tok) = seg.get_token(i) {
                    if tok.token_id() < eot {
                        n_tokens += 1;
                        logprob += f64::from(tok.token_data().plog);
                    }
                }
            }
        }
        let no_speech = self.no_speech_probability().map_err(fail)?;
        let avg_logprob = if n_tokens == 0 {
            0.0
        } else {
            (logprob / f64::from(n_tokens)) as f32
        };
        Ok(Transcription {
            text: text.trim().to_string(),
            n_tokens,
            audio_ms,
            audio_ctx,
            confidence: Some(Confidence {
                no_speech,
                avg_logprob,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_threads_and_wrong_models_are_refused() {
        let err = SttEngine::load(SttConfig::new("/nonexistent/model.bin", 0)).unwrap_err();
        assert!(err.to_string().contains("at least one thread"));
        let err = SttEngine::load(SttConfig::new("/nonexistent/model.bin", 1)).unwrap_err();
        assert!(matches!(err, SttError::Model(_)), "{err}");
    }
}
