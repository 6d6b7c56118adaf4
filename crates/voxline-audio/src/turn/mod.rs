//! The semantic end of turn: whether a pause ends what the speaker meant
//! to say, judged from how the last 8 s sounded (words, intonation,
//! rhythm), not from the length of the silence alone.
//!
//! [`TurnModel`] runs Pipecat's smart-turn v3 on ONNX Runtime: the
//! [`TurnFeatures`] of the last 8 s in, the probability that the turn is
//! complete out. [`TurnPolicy`] says what the VAD stage does with it (see
//! [`crate::VadStage::with_turn_model`]): a pause judged complete commits
//! after a short wait, one judged incomplete waits for the speaker.

mod features;
pub(crate) mod judge;
pub mod words;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use features::{TurnFeatures, N_FRAMES, N_MELS, WINDOW_SAMPLES};
use voxline_onnx::ort;
use voxline_onnx::ort::value::Tensor;
pub use words::{
    asks, goes_on, goes_on_over_its_voice, heard_apart, heard_as_one, sentence_end, WordsVerdict,
};

/// The end-of-turn model could not be loaded, or failed on a pause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TurnModelError {
    /// A file the model needs is not there.
    #[error("{what} {} is missing; install it with `voxline models fetch`, or run without --semantic-turn", path.display())]
    Missing {
        /// What the file is.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The runtime could not be loaded, or the file is not the model.
    #[error("{detail}; reinstall it with `voxline models fetch`, or run without --semantic-turn")]
    Unusable {
        /// What is wrong, naming the file.
        detail: String,
    },
    /// Inference failed on one pause.
    #[error("the end-of-turn model failed: {0}")]
    Inference(String),
}

/// Pipecat's smart-turn v3 on ONNX Runtime, loaded twice: on one thread
/// (beside engines that compute) and on all the threads it was given (when
/// the cores are free).
pub struct TurnModel {
    session: ort::session::Session,
    /// On `threads` threads; `None` for one thread.
    wide: Option<ort::session::Session>,
    features: TurnFeatures,
    threads: usize,
}

impl std::fmt::Debug for TurnModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnModel")
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

impl TurnModel {
    /// Loads `model` on the ONNX Runtime library `runtime_lib`, to compute
    /// with one thread or with `threads` (see [`Self::probability_on`]), and
    /// scores one second of silence to prove it runs.
    ///
    /// # Errors
    /// [`TurnModelError::Missing`] for a file that is not there;
    /// [`TurnModelError::Unusable`] when the runtime cannot be loaded or the
    /// model has not smart-turn's input and output, or does not run.
    pub fn load(model: &Path, runtime_lib: &Path, threads: usize) -> Result<Self, TurnModelError> {
        use voxline_onnx::OnnxError;
        if !model.is_file() {
            return Err(TurnModelError::Missing {
                what: "the end-of-turn model",
                path: model.to_owned(),
            });
        }
        let open = |threads| {
            voxline_onnx::session(runtime_lib, model, threads).map_err(|e| match e {
                OnnxError::Missing { path } => TurnModelError::Missing {
                    what: "the ONNX Runtime library",
                    path,
                },
                other => TurnModelError::Unusable {
                    detail: other.to_string(),
                },
            })
        };
        let session = open(1)?;
        let wide = if threads > 1 {
            Some(open(threads)?)
        } else {
            None
        };
        let unusable = |detail: String| TurnModelError::Unusable {
            detail: format!("{}: not smart-turn v3 ({detail})", model.display()),
        };
        let inputs = voxline_onnx::input_names(&session);
        if !inputs.iter().any(|i| i == "input_features") {
            return Err(unusable(format!(
                "it has no input `input_features`; it has {inputs:?}"
            )));
        }
        let mut this = Self {
            session,
            wide,
            features: TurnFeatures::new(),
            threads: threads.max(1),
        };
        for all in [false, true] {
            // (a value that is not a probability is an error)
            this.probability_on(&vec![0.0; voxline_core::SAMPLE_RATE as usize], all)
                .map_err(|e| unusable(e.to_string()))?;
        }
        Ok(this)
    }

    /// The most threads it computes with.
    #[must_use]
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The probability that the turn whose audio (16 kHz mono) ends with
    /// `audio` is complete, computed on one thread; only the last 8 s are
    /// heard.
    ///
    /// # Errors
    /// [`TurnModelError::Inference`] when the runtime fails.
    pub fn probability(&mut self, audio: &[f32]) -> Result<f32, TurnModelError> {
        self.probability_on(audio, false)
    }

    /// As [`Self::probability`], on all of [`Self::threads`] when `all`
    /// (the same result: only the time differs).
    ///
    /// # Errors
    /// [`TurnModelError::Inference`] when the runtime fails.
    pub fn probability_on(&mut self, audio: &[f32], all: bool) -> Result<f32, TurnModelError> {
        let fail = |e: ort::Error| TurnModelError::Inference(e.to_string());
        let features = self.features.compute(audio);
        let input = Tensor::from_array(([1usize, N_MELS, N_FRAMES], features)).map_err(fail)?;
        let session = match &mut self.wide {
            Some(wide) if all => wide,
            _ => &mut self.session,
        };
        let outputs = session
            .run(ort::inputs!["input_features" => input])
            .map_err(fail)?;
        let (_, p) = outputs[0].try_extract_tensor::<f32>().map_err(fail)?;
        let p = p
            .first()
            .copied()
            .ok_or_else(|| TurnModelError::Inference("it gave no output".into()))?;
        a_probability(p)
    }
}

/// `p` when it is a probability: a model that gives anything else (a
/// foreign model gave 1.9e30 on speech after passing the load check on
/// silence) fails the pause, which the hangover then ends.
fn a_probability(p: f32) -> Result<f32, TurnModelError> {
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(TurnModelError::Inference(format!(
            "it gave {p}, not a probability"
        )))
    }
}

/// One model shared by every conversation of the process; pauses are
/// judged one at a time.
#[derive(Debug, Clone)]
pub struct SharedTurnModel(Arc<Mutex<TurnModel>>, Arc<AtomicU64>, usize);

impl SharedTurnModel {
    /// Shares `model`.
    #[must_use]
    pub fn new(model: TurnModel) -> Self {
        let threads = model.threads();
        Self(Arc::new(Mutex::new(model)), Arc::default(), threads)
    }

    /// Pauses judged so far, by every holder of this model.
    #[must_use]
    pub fn judged(&self) -> u64 {
        self.1.load(Ordering::Relaxed)
    }

    /// See [`TurnModel::probability`].
    ///
    /// # Errors
    /// As [`TurnModel::probability`].
    pub fn probability(&self, audio: &[f32]) -> Result<f32, TurnModelError> {
        self.probability_on(audio, false)
    }

    /// See [`TurnModel::probability_on`].
    ///
    /// # Errors
    /// As [`TurnModel::probability`].
    pub fn probability_on(&self, audio: &[f32], all: bool) -> Result<f32, TurnModelError> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.lock().probability_on(audio, all)
    }

    /// See [`TurnModel::threads`].
    #[must_use]
    pub fn threads(&self) -> usize {
        self.2
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TurnModel> {
        voxline_core::sync::lock(&self.0)
    }
}

/// What the VAD stage does at a pause, given the model's verdict.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TurnPolicy {
    /// The probability above which a pause is judged complete. Default 0.8.
    /// The unsure band below it no longer guards against cuts: a turn ended
    /// by the hangover is taken back within the same [`Self::merge_ms`] as
    /// one judged complete, so the band only decides whether a pause the
    /// model leans towards calling an end waits 100 ms or the hangover
    /// (`cargo bench --bench hangover`: 0.5 to 0.95 cut the same clips; 0.8
    /// takes back one clip more than 0.9 in 57 real and in 48 Piper ones,
    /// and commits the synthetic fixtures' questions, which the model
    /// scores 0.8–0.9, without the hangover).
    pub threshold: f32,
    /// The probability below which a pause is judged incomplete; between
    /// the two the model is unsure, and the silence-only hangover ends the
    /// turn, as without the model. Default 0.5 (the model's own threshold).
    pub incomplete_below: f32,
    /// Silence after the last speech frame that commits a turn judged
    /// complete, ms. Default 100: with the merge window a pause cut too soon
    /// is taken back, so the wait need not guard against it
    /// (`cargo bench --bench hangover`: 100, 150 and 200 ms cut the same
    /// pauses; the commit comes 100 ms sooner).
    pub complete_ms: u32,
    /// Silence after the last speech frame that commits a turn judged
    /// incomplete (the speaker paused mid-sentence), ms. Default 2 000.
    pub incomplete_ms: u32,
    /// Silence after the last confident speech frame (see
    /// [`crate::VadConfig::spec_threshold`]) at which the pause is judged,
    /// ms; once the detector's decaying tail has run on past what was
    /// judged, after the last speech frame. Default 48, the speculative
    /// attempt's silence: the pause is judged on the same detector frame,
    /// just before the attempt is sent, so the model (67 ms on one idle
    /// thread) does not compute beside whisper on the same cores, and is
    /// done before the short wait after a complete pause is over
    /// (`cargo bench --bench hangover`: judged at 16 ms, the same cuts and
    /// commits for 3.7 judgements a clip instead of 2.9).
    pub probe_ms: u32,
    /// A turn the judge ended (after the short wait when judged complete,
    /// or after the hangover when unsure) is taken back and merged into the
    /// next one when speech starts again within this long of the end of its
    /// speech, ms (0: never). The answer to the taken-back turn stops, the
    /// conversation forgets it, and the merged turn is answered as one.
    /// Default 2 000, as long as the wait after an incomplete pause: a pause
    /// the policy would have waited through had it judged it incomplete
    /// (up to 1.5 s, plus the detector's lag at both ends) is recovered.
    pub merge_ms: u32,
    /// A second opinion from the words (see [`words`]): once the
    /// speculative attempt's transcript exists (the runtime notes it on
    /// the speculation board), a pause the model judged incomplete or was
    /// unsure of ends the turn when the words make a finished sentence, and
    /// a turn already ended whose words make one is final: what the speaker
    /// says next is a new turn, not taken back into it. Whichever comes
    /// first decides: speech that resumes before the words are in takes
    /// the turn back as without them. A turn whose words stop midway stays
    /// revocable for [`Self::merge_ms`]. Default on (`cargo bench --bench
    /// pairs`: two sentences 1–1.5 s apart are two turns instead of one).
    pub words: bool,
}

impl Default for TurnPolicy {
    fn default() -> Self {
        Self {
            threshold: 0.8,
            incomplete_below: 0.5,
            complete_ms: 100,
            incomplete_ms: 2_000,
            probe_ms: 48,
            merge_ms: 2_000,
            words: true,
        }
    }
}

impl TurnPolicy {
    /// Checks the threshold and the waits.
    ///
    /// # Errors
    /// [`crate::AudioError::InvalidVadConfig`] naming the first bad field:
    /// `threshold` not in `[0, 1]`; a wait above 10 000 ms; `complete_ms`
    /// or `probe_ms` longer than `incomplete_ms`.
    pub fn validate(&self) -> Result<(), crate::AudioError> {
        let bad =
            |field, reason: String| Err(crate::AudioError::InvalidVadConfig { field, reason });
        for (field, p) in [
            ("turn_threshold", self.threshold),
            ("turn_incomplete_below", self.incomplete_below),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return bad(
                    field,
                    format!("{p} is not a probability; use a value in [0, 1], e.g. 0.5"),
                );
            }
        }
        if self.incomplete_below > self.threshold {
            return bad(
                "turn_incomplete_below",
                format!(
                    "{} is above the threshold of a complete pause ({}); use at most that",
                    self.incomplete_below, self.threshold
                ),
            );
        }
        for (field, v) in [
            ("turn_complete_ms", self.complete_ms),
            ("turn_incomplete_ms", self.incomplete_ms),
            ("turn_probe_ms", self.probe_ms),
            ("turn_merge_ms", self.merge_ms),
        ] {
            if v > crate::vad::MAX_PAD_MS {
                return bad(
                    field,
                    format!(
                        "{v} ms is too long; use at most {} ms",
                        crate::vad::MAX_PAD_MS
                    ),
                );
            }
        }
        let frame_ms =
            (crate::vad::FRAME_SAMPLES * 1000 / voxline_core::SAMPLE_RATE as usize) as u32;
        if self.probe_ms < frame_ms {
            return bad(
                "turn_probe_ms",
                format!(
                    "{} ms would judge the pause at every {frame_ms} ms detector frame; use at least {frame_ms} ms",
                    self.probe_ms
                ),
            );
        }
        for (field, v) in [
            ("turn_complete_ms", self.complete_ms),
            ("turn_probe_ms", self.probe_ms),
        ] {
            if v > self.incomplete_ms {
                return bad(
                    field,
                    format!(
                        "{v} ms is longer than the wait after an incomplete pause ({} ms); make it shorter",
                        self.incomplete_ms
                    ),
                );
            }
        }
        Ok(())
    }
}

/// How a turn's end was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnDecision {
    /// The model judged the pause complete: committed after the short wait.
    Complete,
    /// The model judged it incomplete, and the speaker said no more within
    /// the patience: committed after the long wait.
    Incomplete,
    /// The model was unsure (between the two thresholds): the silence-only
    /// hangover ended it.
    Unsure,
    /// Not judged: the stream ended, the utterance was split at its
    /// maximum length, or it closed before the probe point.
    Unjudged,
    /// The model failed on the pause: the silence-only hangover ended it.
    Failed,
    /// The model judged the pause incomplete or was unsure, and the words
    /// of the speculative attempt made a finished sentence: that ended it
    /// (see [`TurnPolicy::words`]).
    Words,
}

impl TurnDecision {
    /// Its name in reports.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Incomplete => "incomplete",
            Self::Unsure => "unsure",
            Self::Unjudged => "unjudged",
            Self::Failed => "failed",
            Self::Words => "words",
        }
    }
}

/// The semantic end of turn's account of one turn, published when the VAD
/// stage sends it (or commits its attempt).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EndOfTurn {
    /// The turn's utterance id.
    pub id: voxline_core::UtteranceId,
    /// How its end was decided.
    pub decision: TurnDecision,
    /// The model's probability at the pause that ended it.
    pub probability: Option<f32>,
    /// Pauses the model judged in this turn.
    pub probes: u32,
    /// Time the model took over them, ms.
    pub cost_ms: f64,
    /// Silence after the last speech frame when the turn was committed, ms.
    pub silence_ms: f64,
}

impl voxline_core::EngineEvent for EndOfTurn {
    fn kind(&self) -> &'static str {
        "end_of_turn"
    }
    fn utterance_id(&self) -> Option<voxline_core::UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, _: &voxline_core::Clock) -> Result<String, serde_json::Error> {
        serde_json::to_string(&serde_json::json!({
            "decision": self.decision,
            "probability": self.probability,
            "probes": self.probes,
            "cost_ms": self.cost_ms,
            "silence_ms": self.silence_ms,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_probability_is_taken_from_the_model() {
        for p in [0.0, 0.42, 1.0] {
            assert_eq!(a_probability(p).unwrap(), p);
        }
        for p in [1.9e30, -0.1, 1.000_001, f32::NAN, f32::INFINITY] {
            let e = a_probability(p).unwrap_err().to_string();
            assert!(e.contains("not a probability"), "{e}");
        }
    }
}
