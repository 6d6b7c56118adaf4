//! voxline's speech-to-text engine: whisper.cpp through whisper-rs.
//!
//! The model is loaded once and one decoding state is reused for every
//! utterance. Parameters are chosen for short, single-speaker utterances:
//! greedy decoding, one segment, no timestamps, no carried context. The
//! thread count always comes from the pipeline's CPU budget.
//!
//! Whisper's encoder normally runs a full 30 s window (1500 positions) even
//! for a 2 s question; [`AudioCtx`] can shrink that window to the utterance,
//! a large speed lever with an accuracy risk that `voxline bench` measures.
#![warn(missing_docs)]

use std::path::{Path, PathBuf};

mod normalise;
pub use normalise::normalise;

use serde::{Deserialize, Serialize};
use whisper_rs::{
    FullParams, SamplingStrategy, WhisperContext, WhisperContextParameters, WhisperState,
};

/// Encoder positions per second of audio (1500 for 30 s).
pub const POSITIONS_PER_SECOND: f64 = 50.0;
/// Encoder positions in whisper's whole 30 s window.
pub const MAX_POSITIONS: u32 = 1500;
/// Sample rate whisper expects.
pub const SAMPLE_RATE: u32 = voxline_core::SAMPLE_RATE;

/// Errors of the speech-to-text engine.
#[derive(Debug, thiserror::Error)]
pub enum SttError {
    /// The model file is missing, of the wrong kind or incomplete.
    #[error(transparent)]
    Model(#[from] voxline_models::ModelError),
    /// whisper.cpp refused to load the model.
    #[error("{path}: whisper.cpp could not load this model ({detail}); run with VOXLINE_LOG=whisper_rs=info for whisper.cpp's reasons")]
    Load {
        /// The model file.
        path: PathBuf,
        /// The engine's error.
        detail: String,
    },
    /// Transcription failed inside the engine.
    #[error("whisper failed to transcribe a {audio_ms:.0} ms utterance: {detail}")]
    Transcribe {
        /// Utterance length.
        audio_ms: f64,
        /// The engine's error.
        detail: String,
    },
    /// The configuration is invalid.
    #[error("{0}")]
    Config(String),
    /// The caller's abort check stopped the transcription.
    #[error("transcription aborted")]
    Aborted,
}

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

/// How much of whisper's 30 s encoder window to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase", tag = "mode", content = "value")]
pub enum AudioCtx {
    /// The full window (1500 positions), whisper's default: slowest, the reference accuracy.
    Full,
    /// Sized to the utterance: its positions plus `pad` more, rounded up to a multiple of 64.
    Auto {
        /// Extra positions beyond the audio (50 per second).
        pad: u32,
    },
    /// A fixed number of positions.
    Fixed(u32),
    /// The default: [`AudioCtx::Full`] (see the README's audio_ctx table for why).
    #[default]
    Default,
}

impl AudioCtx {
    /// Parses `full`, `auto`, `auto+PAD` (PAD at most [`MAX_POSITIONS`]) or a number.
    ///
    /// # Errors
    /// [`SttError::Config`] on anything else, and for a PAD above
    /// [`MAX_POSITIONS`] (the whole window: a larger pad cannot mean anything).
    pub fn parse(s: &str) -> Result<Self, SttError> {
        let bad = || {
            SttError::Config(format!("--audio-ctx {s:?}: expected `full`, `auto`, `auto+PAD` or a number of encoder positions (1..=1500)"))
        };
        match s {
            "full" => Ok(Self::Full),
            "default" => Ok(Self::Default),
            "auto" => Ok(Self::Auto { pad: 64 }),
            _ => {
                if let Some(p) = s.strip_prefix("auto+") {
                    let too_big = || {
                        SttError::Config(format!(
                            "--audio-ctx {s:?}: the pad is at most {MAX_POSITIONS} encoder positions (the whole 30 s window); use `full` for the whole window"
                        ))
                    };
                    // digits only: a pad too large for a number is as wrong as one over the window
                    if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                        return match p.parse::<u32>() {
                            Ok(pad) if pad <= MAX_POSITIONS => Ok(Self::Auto { pad }),
                            _ => Err(too_big()),
                        };
                    }
                    return Err(bad());
                }
                match s.parse::<u32>() {
                    Ok(n) if (1..=MAX_POSITIONS).contains(&n) => Ok(Self::Fixed(n)),
                    _ => Err(bad()),
                }
            }
        }
    }

    /// The encoder positions to use for `n_samples` of 16 kHz audio (0 = the
    /// full window). Saturating: any length and pad give a valid answer.
    #[must_use]
    pub fn positions(self, n_samples: usize) -> u32 {
        match self {
            Self::Full | Self::Default => 0,
            Self::Fixed(n) => n.min(MAX_POSITIONS),
            Self::Auto { pad } => {
                // (a float-to-int `as` saturates)
                let audio = (n_samples as f64 / f64::from(SAMPLE_RATE) * POSITIONS_PER_SECOND)
                    .ceil() as u32;
                let rounded = audio.saturating_add(pad).div_ceil(64).saturating_mul(64);
                if rounded >= MAX_POSITIONS {
                    0
                } else {
                    rounded
                }
            }
        }
    }
}

impl std::fmt::Display for AudioCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Full => f.write_str("full"),
            Self::Default => f.write_str("default(full)"),
            Self::Auto { pad } => write!(f, "auto+{pad}"),
            Self::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SttConfig {
    /// The whisper.cpp ggml model file.
    pub model: PathBuf,
    /// CPU threads (from the pipeline's budget; never the engine's default).
    pub threads: usize,
    /// Offload to a GPU (needs the `cuda` feature).
    pub use_gpu: bool,
    /// Encoder window policy.
    pub audio_ctx: AudioCtx,
    /// Spoken language (`en`); ignored by English-only models.
    pub language: String,
    /// Flash attention in the encoder and decoder (whisper.cpp's own CLI
    /// default since 1.8). Off by default here: measured with this build on
    /// the 2-core machine it made tiny.en slower (q_capital, 2 threads:
    /// 1050 ms against 869 ms; 1 thread: 2038 against 1642) and, greedy,
    /// mis-heard the noisy fixture ("What is my capital of France?").
    pub flash_attn: bool,
}

impl SttConfig {
    /// Settings for `model` with `threads` threads and defaults otherwise.
    #[must_use]
    pub fn new(model: impl Into<PathBuf>, threads: usize) -> Self {
        Self {
            model: model.into(),
            threads,
            use_gpu: false,
            audio_ctx: AudioCtx::Default,
            language: "en".into(),
            flash_attn: false,
        }
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
}

/// A loaded whisper model with a reusable decoding state.
pub struct SttEngine {
    state: WhisperState,
    /// Shared by the engines made with [`SttEngine::share`].
    ctx: std::sync::Arc<WhisperContext>,
    config: SttConfig,
}

impl std::fmt::Debug for SttEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SttEngine")
            .field("config", &self.config)
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
            detail: "the path is not valid UTF-8; rename it".into(),
        })?;
        let mut params = WhisperContextParameters::default();
        params.use_gpu(config.use_gpu);
        params.flash_attn(config.flash_attn);
        let ctx = WhisperContext::new_with_params(path, params).map_err(|e| SttError::Load {
            path: config.model.clone(),
            detail: e.to_string(),
        })?;
        let state = ctx.create_state().map_err(|e| SttError::Load {
            path: config.model.clone(),
            detail: e.to_string(),
        })?;
        Ok(Self {
            state,
            ctx: std::sync::Arc::new(ctx),
            config,
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
            detail: e.to_string(),
        })?;
        Ok(Self {
            state,
            ctx: std::sync::Arc::clone(&self.ctx),
            config: self.config.clone(),
        })
    }

    /// The settings this engine runs with.
    #[must_use]
    pub fn config(&self) -> &SttConfig {
        &self.config
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

    fn run(
        &mut self,
        samples: &[f32],
        abort: &(dyn Fn() -> bool + Sync),
        timestamps: bool,
    ) -> Result<Transcription, SttError> {
        let audio_ms = samples.len() as f64 * 1000.0 / f64::from(SAMPLE_RATE);
        let fail = |detail: String| SttError::Transcribe { audio_ms, detail };
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
        let mut p = FullParams::new(SamplingStrategy::Greedy { best_of: 1 });
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
        result.map_err(|e| fail(e.to_string()))?;
        let eot = self.ctx.token_eot();
        let mut text = String::new();
        let mut n_tokens = 0u32;
        for seg in self.state.as_iter() {
            text.push_str(&seg.to_str_lossy().map_err(|e| fail(e.to_string()))?);
            for i in 0..seg.n_tokens() {
                if let Some(tok) = seg.get_token(i) {
                    if tok.token_id() < eot {
                        n_tokens += 1;
                    }
                }
            }
        }
        Ok(Transcription {
            text: text.trim().to_string(),
            n_tokens,
            audio_ms,
            audio_ctx,
        })
    }
}

/// Word error rate of `hypothesis` against `reference` (after [`normalise`],
/// so `10` and `ten`, `Mr.` and `mister` are the same word):
/// word-level edit distance / reference words. An empty reference gives 0
/// for an empty hypothesis and 1 otherwise.
#[must_use]
pub fn word_error_rate(reference: &str, hypothesis: &str) -> f64 {
    let (r, h) = (normalise(reference), normalise(hypothesis));
    if r.is_empty() {
        return if h.is_empty() { 0.0 } else { 1.0 };
    }
    let mut prev: Vec<usize> = (0..=h.len()).collect();
    for (i, rw) in r.iter().enumerate() {
        let mut cur = vec![i + 1; h.len() + 1];
        for (j, hw) in h.iter().enumerate() {
            let sub = prev[j] + usize::from(rw != hw);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[h.len()] as f64 / r.len() as f64
}

/// Most words of the previous chunk's transcript [`join_continuation`]
/// compares with the start of the next one.
pub const MAX_OVERLAP_WORDS: usize = 16;

/// Words at either edge of an overlap that may differ (a word the cut or the
/// lead-in's start clipped) and still be dropped with it.
pub const OVERLAP_SLACK_WORDS: usize = 2;

/// The text of a continuation (a chunk whose audio starts with a lead-in that
/// repeats the end of the previous chunk) without the words it repeats: the
/// longest run of [`normalise`]d words that ends the previous transcript
/// (`previous`, already normalised) and starts `text`, dropped from `text`
/// with everything before it. Up to [`OVERLAP_SLACK_WORDS`] words may
/// separate the run from either edge (clipped words the two transcripts hear
/// differently); a run so placed must be at least two words long. The run is
/// at most [`MAX_OVERLAP_WORDS`] long; the longest wins, then the one closest
/// to the edges. Without such a run nothing is dropped (a repeated word is
/// better than a lost one).
///
/// Returns the remaining text (whitespace-separated pieces of `text`, as
/// whisper wrote them) and how many normalised words were dropped.
#[must_use]
pub fn join_continuation(previous: &[String], text: &str) -> (String, usize) {
    let pieces: Vec<(&str, usize)> = text
        .split_whitespace()
        .map(|p| (p, normalise(p).len()))
        .collect();
    let words = normalise(text);
    let prev = &previous[previous
        .len()
        .saturating_sub(MAX_OVERLAP_WORDS + OVERLAP_SLACK_WORDS)..];
    // (run length, slack used, words to drop)
    let mut best: Option<(usize, usize, usize)> = None;
    for skip_new in 0..=OVERLAP_SLACK_WORDS.min(words.len()) {
        for skip_prev in 0..=OVERLAP_SLACK_WORDS.min(prev.len()) {
            let room = MAX_OVERLAP_WORDS
                .min(words.len() - skip_new)
                .min(prev.len() - skip_prev);
            let min_run = if skip_new + skip_prev > 0 { 2 } else { 1 };
            let end = prev.len() - skip_prev;
            let Some(run) = (min_run..=room)
                .rev()
                .find(|&k| prev[end - k..end] == words[skip_new..skip_new + k])
            else {
                continue;
            };
            let slack = skip_new + skip_prev;
            if best.is_none_or(|(k, s, _)| run > k || (run == k && slack < s)) {
                best = Some((run, slack, skip_new + run));
            }
        }
    }
    let Some((_, _, drop)) = best else {
        return (text.trim().to_string(), 0);
    };
    let mut dropped = 0;
    let rest: Vec<&str> = pieces
        .into_iter()
        .filter(|&(_, n)| {
            let keep = dropped >= drop;
            dropped += n;
            keep
        })
        .map(|(p, _)| p)
        .collect();
    (rest.join(" "), drop)
}

/// A transcript with fewer words per second of audio than this, for an
/// utterance longer than [`CHECKED_AFTER_S`], is taken for a failed
/// transcription (whisper heard "The" in 20 s of speech) and reported as
/// the turn's error, not passed on as success.
pub const MIN_WORDS_PER_S: f64 = 0.5;

/// Utterances at most this long (seconds) are not held to [`MIN_WORDS_PER_S`]:
/// a short one may be a single word.
pub const CHECKED_AFTER_S: f64 = 5.0;

/// Why a transcript is implausibly short for its audio, if it is: fewer
/// than [`MIN_WORDS_PER_S`] words per second over more than
/// [`CHECKED_AFTER_S`] seconds.
#[must_use]
pub fn implausibly_short(text: &str, audio_s: f64) -> Option<String> {
    let words = normalise(text).len();
    let rate = words as f64 / audio_s;
    (audio_s > CHECKED_AFTER_S && rate < MIN_WORDS_PER_S).then(|| {
        format!(
            "whisper heard only {words} word{} ({text:?}) in {audio_s:.1} s of speech \
             ({rate:.2} words/s, under the floor of {MIN_WORDS_PER_S}): the audio was \
             probably not transcribed; a shorter --max-utterance-ms cuts long speech \
             into smaller pieces",
            if words == 1 { "" } else { "s" }
        )
    })
}

/// The speech-to-text stage: one [`Utterance`](voxline_core::Utterance) in,
/// one [`Transcript`](voxline_core::Transcript) out. An engine failure on one
/// utterance becomes a turn error for that id; the stage goes on.
///
/// Long speech arrives in chunks the endpointer cut at its maximum length:
/// each continuation's transcript leaves out the words its lead-in repeats
/// from the chunk it continues ([`join_continuation`]), so the chunks'
/// transcripts read one after another as the whole. A transcript
/// [`implausibly_short`] for its audio is a turn error.
pub struct SttStage {
    engine: SttEngine,
    board: Option<voxline_core::SpecBoard>,
    governor: Option<voxline_core::CpuGovernor>,
    meter: Option<voxline_core::ThreadMeter>,
    /// The latest forced-split chunk and its transcript's normalised words
    /// (`None` when it failed: its continuation is then kept whole).
    carry: Option<(voxline_core::UtteranceId, Vec<String>)>,
}

impl SttStage {
    /// Wraps a loaded engine.
    #[must_use]
    pub fn new(engine: SttEngine) -> Self {
        Self {
            engine,
            board: None,
            governor: None,
            meter: None,
            carry: None,
        }
    }

    /// Each transcription runs with the threads `governor` grants (the cores
    /// other processes leave free), counted on `meter`.
    #[must_use]
    pub fn with_cpu(
        mut self,
        governor: Option<voxline_core::CpuGovernor>,
        meter: voxline_core::ThreadMeter,
    ) -> Self {
        self.governor = governor;
        self.meter = Some(meter);
        self
    }

    /// Speculative attempts cancelled on `board` are skipped, or aborted
    /// mid-transcription, and produce nothing.
    #[must_use]
    pub fn with_speculation(mut self, board: voxline_core::SpecBoard) -> Self {
        self.board = Some(board);
        self
    }
}

/// The stage's name in the pipeline.
pub const STAGE_NAME: &str = "stt";

/// The stage's identity in the pipeline's topology.
pub const STAGE: voxline_core::StageId = voxline_core::StageId::new(STAGE_NAME);

impl voxline_core::Stage for SttStage {
    type In = voxline_core::Utterance;
    type Out = voxline_core::Transcript;

    fn name(&self) -> &str {
        STAGE_NAME
    }

    fn priority(&self, u: &Self::In) -> voxline_core::Priority {
        match self.board.as_ref().map(|b| b.state(u.id)) {
            Some(voxline_core::SpecState::Pending) => voxline_core::Priority::Speculative,
            _ => voxline_core::Priority::Committed,
        }
    }

    fn process(
        &mut self,
        u: Self::In,
        out: &mut voxline_core::Emitter<'_, Self::Out>,
    ) -> Result<(), voxline_core::StageError> {
        let board = self.board.clone();
        let cancelled = || board.as_ref().is_some_and(|b| b.is_cancelled(u.id));
        if cancelled() {
            return Ok(());
        }
        if let Some(g) = &self.governor {
            self.engine.set_threads(g.threads());
        }
        let running = self
            .meter
            .as_ref()
            .map(|m| m.enter(self.engine.config().threads));
        let result = if u.forced_split || u.continues.is_some() {
            self.engine
                .transcribe_chunk_abortable(&u.samples, &cancelled)
        } else {
            self.engine.transcribe_abortable(&u.samples, &cancelled)
        };
        // computing is over (a send that waits for room downstream is not)
        drop(running);
        let t = match result {
            Ok(t) => t,
            Err(SttError::Aborted) => return Ok(()),
            Err(e) => {
                if u.forced_split {
                    self.carry = None;
                }
                return Err(voxline_core::StageError::turn(u.id, e.to_string()));
            }
        };
        if let Some(why) = implausibly_short(&t.text, t.audio_ms / 1000.0) {
            if u.forced_split {
                self.carry = None;
            }
            return Err(voxline_core::StageError::turn(u.id, why));
        }
        let text = match (&self.carry, u.continues) {
            (Some((id, previous)), Some(continues)) if *id == continues => {
                join_continuation(previous, &t.text).0
            }
            _ => t.text.clone(),
        };
        // A speculative attempt is never a forced split: only real chunks are carried.
        if u.forced_split {
            self.carry = Some((u.id, normalise(&t.text)));
        }
        out.emit(voxline_core::Transcript {
            id: u.id,
            text,
            n_tokens: t.n_tokens,
            audio_ms: t.audio_ms,
            start_sample: u.start_sample,
            end_sample: u.end_sample,
            end_wall: u.end_wall,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wer_counts_edits_over_reference_words() {
        assert_eq!(
            word_error_rate(
                "What is the capital of France?",
                "what is the capital of france"
            ),
            0.0
        );
        assert!((word_error_rate("a b c d", "a x c d") - 0.25).abs() < 1e-9);
        assert!((word_error_rate("a b c d", "a c d") - 0.25).abs() < 1e-9);
        assert!((word_error_rate("a b", "a b c d") - 1.0).abs() < 1e-9);
        assert_eq!(word_error_rate("", ""), 0.0);
        assert_eq!(word_error_rate("", "x"), 1.0);
        assert_eq!(normalise("Two-plus two's"), vec!["2", "plus", "two's"]);
        // numbers and abbreviations as whisper writes them are not errors
        assert_eq!(
            word_error_rate(
                "Mr. Smith walked ten miles",
                "Mister Smith walked 10 miles."
            ),
            0.0
        );
        assert!((word_error_rate("twenty five apples", "25 5 apples") - 0.5).abs() < 1e-9);
    }

    fn words(s: &str) -> Vec<String> {
        normalise(s)
    }

    #[test]
    fn continuation_drops_the_words_its_lead_in_repeats() {
        let prev = words("Every morning the old man walked slowly along the river");
        // an exact overlap
        assert_eq!(
            join_continuation(&prev, "along the river with his small brown dog."),
            ("with his small brown dog.".to_string(), 3)
        );
        // case and punctuation do not matter; whisper's spelling of the rest is kept
        assert_eq!(
            join_continuation(&prev, "Along the River, with his dog."),
            ("with his dog.".to_string(), 3)
        );
        // the lead-in's first word clipped into another word: dropped with the overlap
        assert_eq!(
            join_continuation(&prev, "song the river with his dog"),
            ("with his dog".to_string(), 3)
        );
        // the previous chunk's last word clipped by the cut
        let clipped = words("the old man walked slowly along the riv");
        assert_eq!(
            join_continuation(&clipped, "slowly along the river with his dog"),
            ("river with his dog".to_string(), 3)
        );
        // the longest overlap wins over a shorter one ("the")
        let prev2 = words("x the capital of the");
        assert_eq!(
            join_continuation(&prev2, "the capital of the moon"),
            ("moon".to_string(), 4)
        );
    }

    #[test]
    fn continuation_without_an_overlap_is_kept_whole() {
        let prev = words("the old man walked slowly");
        // nothing in common: nothing dropped
        assert_eq!(
            join_continuation(&prev, "tell me a story"),
            ("tell me a story".to_string(), 0)
        );
        // one word shared away from the edges is not enough
        assert_eq!(
            join_continuation(&words("a b man c"), "x man y z"),
            ("x man y z".to_string(), 0)
        );
        // but one word shared exactly at the edges is an overlap
        assert_eq!(
            join_continuation(&prev, "slowly along"),
            ("along".to_string(), 1)
        );
        // empty sides
        assert_eq!(join_continuation(&[], "a b"), ("a b".to_string(), 0));
        assert_eq!(join_continuation(&prev, ""), (String::new(), 0));
        // the whole continuation repeated: nothing left
        assert_eq!(
            join_continuation(&prev, "walked slowly."),
            (String::new(), 2)
        );
        // a piece holding several words is dropped whole once one of them overlaps
        assert_eq!(
            join_continuation(&words("it is two"), "two-plus three"),
            ("three".to_string(), 1)
        );
    }

    #[test]
    fn a_transcript_too_short_for_its_audio_is_flagged() {
        let why = implausibly_short("The", 20.0).expect("1 word in 20 s");
        assert!(why.contains("1 word") && why.contains("20.0 s"), "{why}");
        assert!(implausibly_short("", 6.0).is_some());
        // at the floor or above: fine
        assert!(implausibly_short("one two three", 6.0).is_none());
        // short utterances may be a single word
        assert!(implausibly_short("Yes.", 5.0).is_none());
        assert!(implausibly_short("", 1.0).is_none());
    }

    #[test]
    fn audio_ctx_parses_and_sizes() {
        assert_eq!(AudioCtx::parse("full").unwrap(), AudioCtx::Full);
        assert_eq!(AudioCtx::parse("auto").unwrap(), AudioCtx::Auto { pad: 64 });
        assert_eq!(
            AudioCtx::parse("auto+32").unwrap(),
            AudioCtx::Auto { pad: 32 }
        );
        assert_eq!(AudioCtx::parse("768").unwrap(), AudioCtx::Fixed(768));
        for bad in [
            "0", "1501", "auto+x", "fast", "", "auto+", "auto+-1", "auto+ 5",
        ] {
            assert!(AudioCtx::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            AudioCtx::parse("auto+1500").unwrap(),
            AudioCtx::Auto { pad: 1500 }
        );
        // 2.2 s → 110 positions + 64 pad = 174 → 192
        assert_eq!(AudioCtx::Auto { pad: 64 }.positions(35_200), 192);
        assert_eq!(AudioCtx::Full.positions(35_200), 0);
        assert_eq!(AudioCtx::Fixed(128).positions(1), 128);
        // long audio falls back to the full window
        assert_eq!(AudioCtx::Auto { pad: 64 }.positions(16_000 * 29), 0);
    }

    #[test]
    fn a_huge_audio_ctx_pad_is_bad_input_not_an_overflow() {
        for huge in [
            "auto+1501",
            "auto+4294967295",
            "auto+4294967296",
            "auto+99999999999999999999",
        ] {
            let err = AudioCtx::parse(huge).unwrap_err().to_string();
            assert!(
                err.contains("at most 1500") && err.contains("use `full`"),
                "{huge}: {err}"
            );
        }
        // however the value was made, sizing saturates to the full window
        for pad in [1500, 1501, u32::MAX - 63, u32::MAX] {
            assert_eq!(AudioCtx::Auto { pad }.positions(35_200), 0, "pad {pad}");
            assert_eq!(AudioCtx::Auto { pad }.positions(usize::MAX), 0, "pad {pad}");
        }
        assert_eq!(AudioCtx::Auto { pad: 0 }.positions(usize::MAX), 0);
        assert_eq!(AudioCtx::Fixed(u32::MAX).positions(1), 1500);
    }

    #[test]
    fn zero_threads_and_wrong_models_are_refused() {
        let err = SttEngine::load(SttConfig::new("/nonexistent/model.bin", 0)).unwrap_err();
        assert!(err.to_string().contains("at least one thread"));
        let err = SttEngine::load(SttConfig::new("/nonexistent/model.bin", 1)).unwrap_err();
        assert!(matches!(err, SttError::Model(_)), "{err}");
    }
}
