//! The engine: a loaded CTranslate2 whisper model and this user's replica.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;

use voxline_audio::mel::{LogMel, HOP, N_MELS};
use voxline_stt::{Confidence, SpeechToText, SttError, Transcription};

use crate::library::{api, Api};
use crate::vocabulary::Vocabulary;

/// The files of a CTranslate2 whisper model directory.
pub const MODEL_FILES: [&str; 3] = ["model.bin", "config.json", "vocabulary.txt"];

/// Frames of whisper's 30 s window.
const N_FRAMES: usize = 3000;
/// The most tokens one transcription may produce (whisper's text context).
const MAX_LENGTH: usize = 448;
const ERR_LEN: usize = 512;
const SAMPLE_RATE: usize = voxline_core::SAMPLE_RATE as usize;

/// Engine settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ct2Config {
    /// The model directory (`model.bin`, `config.json`, `vocabulary.txt`).
    pub model_dir: PathBuf,
    /// The CTranslate2 library `models fetch` installs.
    pub library: PathBuf,
    /// CPU threads (from the pipeline's budget; never the engine's default).
    pub threads: usize,
    /// Beam size (1: greedy, as the whisper.cpp engine decodes).
    pub beam: usize,
    /// The weights' precision.
    pub compute: Compute,
}

/// The precision CTranslate2 computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compute {
    /// 32-bit floats (the default: whisper.cpp's word error rate on the
    /// fixtures, at ~0.65 of its time).
    #[default]
    Float32,
    /// Weights quantised to int8 as they load (faster-whisper's `int8`):
    /// ~8 % faster than float32 here, and one more word wrong on the fixtures.
    Int8,
}

/// A loaded model: the weights, shared by every replica made on it.
struct Model {
    api: &'static Api,
    ptr: NonNull<c_void>,
}

// SAFETY: the model is read only, by replicas on any thread (CTranslate2's
// own replica pool shares one model between threads the same way); it is
// freed once, by the last owner.
unsafe impl Send for Model {}
// SAFETY: as above: nothing mutates the model after loading.
unsafe impl Sync for Model {}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `vx_ct2_load` and every replica on it
        // holds an `Arc` of this model, so none outlives it.
        unsafe { (self.api.free_model)(self.ptr.as_ptr()) };
    }
}

/// whisper on CTranslate2: the shared model, this user's replica, and the
/// features' transform.
pub struct Ct2Engine {
    replica: NonNull<c_void>,
    model: Arc<Model>,
    vocabulary: Arc<Vocabulary>,
    mel: LogMel,
    config: Ct2Config,
}

// SAFETY: the replica is used by one thread at a time (`&mut self`) and
// holds no thread-local state between calls.
unsafe impl Send for Ct2Engine {}

impl std::fmt::Debug for Ct2Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ct2Engine")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for Ct2Engine {
    fn drop(&mut self) {
        // SAFETY: the replica came from `vx_ct2_replica` and is freed once.
        unsafe { (self.model.api.free_replica)(self.replica.as_ptr()) };
    }
}

fn error_text(buf: &[c_char]) -> String {
    // SAFETY: the shim writes a NUL-terminated string within the buffer
    // (snprintf), and the buffer starts zeroed.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn load_error(path: &std::path::Path, detail: impl Into<String>) -> SttError {
    SttError::EngineLoad {
        path: path.to_owned(),
        detail: detail.into(),
    }
}

/// The shim's abort callback: calls the Rust closure behind `data`.
unsafe extern "C" fn poll_abort(data: *mut c_void) -> c_int {
    if data.is_null() {
        return 0;
    }
    // SAFETY: `data` points to the `&(dyn Fn() -> bool + Sync)` that
    // `transcribe` passes, on its stack, for the duration of the call.
    let f = unsafe { &*data.cast::<&(dyn Fn() -> bool + Sync)>() };
    c_int::from(f())
}

impl Ct2Engine {
    /// Loads the library (once per process) and the model.
    ///
    /// # Errors
    /// [`SttError::Config`] for 0 threads or a beam of 0;
    /// [`SttError::EngineLoad`] when this build has no CTranslate2 engine,
    /// the library or the model is missing or broken.
    pub fn load(config: Ct2Config) -> Result<Self, SttError> {
        if config.threads == 0 {
            return Err(SttError::Config(
                "the speech model needs at least one thread".into(),
            ));
        }
        if config.beam == 0 {
            return Err(SttError::Config("the beam size is at least 1".into()));
        }
        let api = api(&config.library).map_err(|e| load_error(&config.library, e))?;
        let dir = &config.model_dir;
        for file in MODEL_FILES {
            if !dir.join(file).is_file() {
                return Err(load_error(
                    dir,
                    format!("not a CTranslate2 whisper model: it has no {file}; run `voxline models fetch`"),
                ));
            }
        }
        let vocabulary = Vocabulary::load(dir).map_err(|e| load_error(dir, e))?;
        let cdir = CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|_| load_error(dir, "the path holds a NUL byte; rename it"))?;
        let mut err = vec![0 as c_char; ERR_LEN];
        // SAFETY: a NUL-terminated path and an error buffer of ERR_LEN bytes.
        let int8 = c_int::from(config.compute == Compute::Int8);
        let ptr = unsafe {
            (api.load)(
                cdir.as_ptr(),
                config.threads,
                int8,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            load_error(
                dir,
                format!("CTranslate2 could not load it ({})", error_text(&err)),
            )
        })?;
        let model = Arc::new(Model { api, ptr });
        Self::on(model, Arc::new(vocabulary), config)
    }

    /// A replica on `model`.
    fn on(
        model: Arc<Model>,
        vocabulary: Arc<Vocabulary>,
        config: Ct2Config,
    ) -> Result<Self, SttError> {
        let mut err = vec![0 as c_char; ERR_LEN];
        // SAFETY: the model is loaded and outlives the replica (`Arc`).
        let replica = unsafe { (model.api.replica)(model.ptr.as_ptr(), err.as_mut_ptr(), ERR_LEN) };
        let replica = NonNull::new(replica).ok_or_else(|| {
            load_error(
                &config.model_dir,
                format!(
                    "CTranslate2 could not make a replica ({})",
                    error_text(&err)
                ),
            )
        })?;
        Ok(Self {
            replica,
            model,
            vocabulary,
            mel: LogMel::new(),
            config,
        })
    }

    /// Another engine on the same loaded weights (shared, not copied), so
    /// another conversation can transcribe with it on another thread.
    ///
    /// # Errors
    /// [`SttError::EngineLoad`] when CTranslate2 cannot make the replica.
    pub fn share(&self) -> Result<Self, SttError> {
        Self::on(
            Arc::clone(&self.model),
            Arc::clone(&self.vocabulary),
            self.config.clone(),
        )
    }

    /// The settings this engine runs with.
    #[must_use]
    pub fn config(&self) -> &Ct2Config {
        &self.config
    }

    fn run(
        &mut self,
        samples: &[f32],
        timestamps: bool,
        abort: &(dyn Fn() -> bool + Sync),
    ) -> Result<Transcription, SttError> {
        let audio_ms = samples.len() as f64 * 1000.0 / SAMPLE_RATE as f64;
        // whisper's window is 30 s: a longer piece is cut (the stage's
        // pieces are shorter)
        let take = samples.len().min(N_FRAMES * HOP);
        // in silence to the end of the window, as whisper was trained (and
        // as whisper.cpp pads); faster-whisper pads its features with 0
        // instead, which mis-heard short pieces of long speech here
        let mut features = self.mel.compute_in_silence(&samples[..take], N_FRAMES);
        let prompt = self.vocabulary.prompt(timestamps);
        let mut ids = vec![0usize; MAX_LENGTH];
        let (mut n_ids, mut no_speech, mut score) = (0usize, 0f32, 0f32);
        let mut err = vec![0 as c_char; ERR_LEN];
        let abort_ref: &(dyn Fn() -> bool + Sync) = abort;
        // SAFETY: every buffer is as long as the length passed with it;
        // `features` is N_MELS × N_FRAMES; the abort data points to
        // `abort_ref` on this frame, which outlives the call; the replica is
        // this engine's own and used by this thread only.
        let rc = unsafe {
            (self.model.api.transcribe)(
                self.replica.as_ptr(),
                self.config.threads,
                features.as_mut_ptr(),
                N_MELS,
                N_FRAMES,
                self.config.beam,
                MAX_LENGTH,
                Some(poll_abort),
                std::ptr::from_ref(&abort_ref).cast_mut().cast::<c_void>(),
                prompt.as_ptr(),
                prompt.len(),
                ids.as_mut_ptr(),
                ids.len(),
                &mut n_ids,
                &mut no_speech,
                &mut score,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        if rc == 1 || abort() {
            return Err(SttError::Aborted);
        }
        if rc != 0 {
            return Err(SttError::Engine {
                engine: "CTranslate2",
                audio_ms,
                detail: error_text(&err),
            });
        }
        let (text, n_tokens) = self.vocabulary.text(&ids[..n_ids.min(ids.len())]);
        Ok(Transcription {
            text,
            n_tokens,
            audio_ms,
            audio_ctx: 0,
            confidence: Some(Confidence {
                no_speech,
                // CTranslate2's score: the hypothesis' log-probability over
                // its length (length penalty 1), i.e. the mean per token
                avg_logprob: if n_tokens == 0 { 0.0 } else { score },
            }),
        })
    }
}

impl SpeechToText for Ct2Engine {
    /// A chunk of long speech is decoded with timestamp tokens, as the
    /// whisper.cpp engine decodes it (see its `transcribe_chunk_abortable`).
    fn transcribe(
        &mut self,
        samples: &[f32],
        chunk: bool,
        abort: &(dyn Fn() -> bool + Sync),
    ) -> Result<Transcription, SttError> {
        self.run(samples, chunk, abort)
    }

    fn threads(&self) -> usize {
        self.config.threads
    }

    fn set_threads(&mut self, threads: usize) {
        self.config.threads = threads.max(1);
    }
}
