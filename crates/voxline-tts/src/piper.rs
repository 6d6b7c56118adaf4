//! The neural voice: a Piper (VITS) model run by ONNX Runtime.
//!
//! Piper speaks phonemes, not letters: the text goes through espeak-ng (the
//! program, see [`crate::voice`]) as IPA, one line per clause, and each
//! phoneme becomes the ids the voice's `phoneme_id_map` gives it, with the
//! clause's punctuation put back, between a start and an end mark and
//! padding after each phoneme. The model makes the waveform in one call
//! per piece of at most [`MAX_IDS_PER_RUN`] ids, the pieces' audio joined.
//!
//! ONNX Runtime is loaded at run time from the `libonnxruntime.so` that
//! `voxline models fetch --voice piper` installs (nothing is downloaded or
//! linked at build time); its threads are the ones the pipeline grants, and
//! they do not spin between calls, so they leave the cores to the other
//! engines.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use voxline_onnx::ort;
use voxline_onnx::ort::session::Session;
use voxline_onnx::ort::value::Tensor;

use crate::voice::{check_espeak, run_espeak, unreadable_by, Until, POLL};
use crate::{TextToSpeech, TtsError};

/// The most phoneme ids one run of the model takes (~200 phonemes, a
/// 200-character English sentence).
///
/// The model's working memory grows with its input, and ONNX Runtime keeps
/// what it grew to: one run on a chunk of 220 Chinese characters, which
/// espeak-ng's English reads as "Chinese letter" ~3,300 ids, took the voice
/// from 135 MB to 1.9 GB, and a second such run to 3.1 GB. A chunk's
/// phonemes past this bound are spoken in pieces (cut at a clause, else a
/// word), one run each, the audio joined: that chunk then peaks at 350 MB,
/// an English sentence of 415 ids at 340-360 MB, 200 ids at 233 MB.
pub const MAX_IDS_PER_RUN: usize = 400;

/// The voice's `.onnx.json`: what Piper needs from it.
#[derive(Debug, Clone, Deserialize)]
pub struct PiperConfig {
    /// The audio it makes.
    pub audio: AudioConfig,
    /// The espeak-ng voice of its phonemes.
    pub espeak: EspeakConfig,
    /// The sampling knobs.
    pub inference: InferenceConfig,
    /// Each phoneme's ids.
    pub phoneme_id_map: HashMap<String, Vec<i64>>,
    /// `"espeak"` for a voice voxline can speak with.
    #[serde(default)]
    pub phoneme_type: Option<String>,
}

/// `audio` of a Piper config.
#[derive(Debug, Clone, Deserialize)]
pub struct AudioConfig {
    /// Output sample rate.
    pub sample_rate: u32,
}

/// `espeak` of a Piper config.
#[derive(Debug, Clone, Deserialize)]
pub struct EspeakConfig {
    /// e.g. `en-us`.
    pub voice: String,
}

/// `inference` of a Piper config.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct InferenceConfig {
    /// Noise of the prior.
    pub noise_scale: f32,
    /// Speaking pace (higher is slower).
    pub length_scale: f32,
    /// Noise of the duration predictor.
    pub noise_w: f32,
}

/// A runtime or model failure in the voice's words.
fn voice_error(e: voxline_onnx::OnnxError) -> TtsError {
    use voxline_onnx::OnnxError;
    match e {
        OnnxError::Missing { path } => TtsError::Missing {
            what: "the ONNX Runtime library",
            path,
        },
        OnnxError::Runtime { path, detail } => TtsError::Runtime { path, detail },
        OnnxError::BadModel { path, detail } => TtsError::BadVoice { path, detail },
        other => TtsError::Inference(other.to_string()),
    }
}

/// A Piper voice.
pub struct Piper {
    session: Session,
    config: PiperConfig,
    threads: usize,
}

impl std::fmt::Debug for Piper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Piper")
            .field("sample_rate", &self.config.audio.sample_rate)
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

/// Punctuation Piper's phonemes keep, as espeak-ng's clauses end.
fn clause_mark(c: char) -> bool {
    matches!(c, '.' | ',' | ';' | ':' | '!' | '?')
}

/// `text` cut into clauses, each with the mark that ends it (or none).
fn clauses(text: &str) -> Vec<(String, Option<char>)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let next_blank = chars.get(i + 1).is_none_or(|n| n.is_whitespace());
        if clause_mark(c) && next_blank {
            if cur.chars().any(char::is_alphanumeric) {
                out.push((std::mem::take(&mut cur), Some(c)));
            }
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    if cur.chars().any(char::is_alphanumeric) {
        out.push((cur, None));
    }
    out
}

impl Piper {
    /// Loads the voice `model` (its config beside it, `<model>.json`) on the
    /// ONNX Runtime library `runtime_lib`, computing with `threads` threads.
    ///
    /// # Errors
    /// [`TtsError::Missing`] for a file that is not there,
    /// [`TtsError::Runtime`] when the library cannot be loaded,
    /// [`TtsError::BadVoice`] for a config or model Piper cannot use,
    /// [`TtsError::EspeakMissing`] without espeak-ng (its phonemes).
    pub fn load(model: &Path, runtime_lib: &Path, threads: usize) -> Result<Self, TtsError> {
        let config_path = PathBuf::from(format!("{}.json", model.display()));
        for (what, p) in [
            ("the voice model", model),
            ("the voice's config", &config_path),
        ] {
            if !p.is_file() {
                return Err(TtsError::Missing {
                    what,
                    path: p.to_owned(),
                });
            }
        }
        let bad = |path: &Path, detail: String| TtsError::BadVoice {
            path: path.to_owned(),
            detail,
        };
        let text =
            std::fs::read_to_string(&config_path).map_err(|e| bad(&config_path, e.to_string()))?;
        let config: PiperConfig =
            serde_json::from_str(&text).map_err(|e| bad(&config_path, e.to_string()))?;
        if config
            .phoneme_type
            .as_deref()
            .is_some_and(|t| t != "espeak")
        {
            return Err(bad(&config_path, "its phonemes are not espeak-ng's".into()));
        }
        for mark in ["^", "$", "_"] {
            if !config.phoneme_id_map.contains_key(mark) {
                return Err(bad(
                    &config_path,
                    format!("its phoneme map has no `{mark}`"),
                ));
            }
        }
        check_espeak(&config.espeak.voice)?;
        let threads = threads.max(1);
        let session = voxline_onnx::session(runtime_lib, model, threads).map_err(voice_error)?;
        let inputs: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        for want in ["input", "input_lengths", "scales"] {
            if !inputs.contains(&want) {
                return Err(bad(
                    model,
                    format!("the model has no input `{want}` (it has {inputs:?})"),
                ));
            }
        }
        Ok(Self {
            session,
            config,
            threads,
        })
    }

    /// The voice's config.
    #[must_use]
    pub fn config(&self) -> &PiperConfig {
        &self.config
    }

    /// The phonemes of `text` (IPA, punctuation kept), as espeak-ng gives them.
    ///
    /// # Errors
    /// When espeak-ng fails.
    pub fn phonemes(&self, text: &str) -> Result<String, TtsError> {
        self.phonemes_until(text, &Until::never())
    }

    /// As [`Self::phonemes`], giving up as `until` says.
    fn phonemes_until(&self, text: &str, until: &Until<'_>) -> Result<String, TtsError> {
        let parts = clauses(text);
        if parts.is_empty() {
            return Ok(String::new());
        }
        let joined: Vec<&str> = parts.iter().map(|(c, _)| c.as_str()).collect();
        // one clause per line in, one line of phonemes per clause out
        let out = run_espeak(
            &["-q", "-v", &self.config.espeak.voice, "--ipa", "--stdin"],
            &joined.join(".\n"),
            until,
        )?;
        let text = String::from_utf8_lossy(&out);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let mut s = String::new();
        if lines.len() == parts.len() {
            for (line, (_, mark)) in lines.iter().zip(&parts) {
                if !s.is_empty() {
                    s.push(' ');
                }
                s.push_str(line);
                if let Some(m) = mark {
                    s.push(*m);
                }
            }
        } else {
            // espeak-ng cut the clauses otherwise: keep its phonemes, end as the text ends
            s = lines.join(" ");
            if let Some(m) = parts.last().and_then(|(_, m)| *m) {
                s.push(m);
            }
        }
        Ok(s)
    }

    /// `phonemes` cut into the pieces the model runs on one at a time,
    /// each at most [`MAX_IDS_PER_RUN`] ids with its marks.
    fn pieces<'p>(&self, phonemes: &'p str) -> Vec<&'p str> {
        let map = &self.config.phoneme_id_map;
        let len = |k: &str| map.get(k).map_or(0, Vec::len);
        let pad = len("_");
        // a piece's own marks: its start, the padding after it, its end
        let marks = len("^") + pad + len("$");
        let mut buf = [0u8; 4];
        pieces(
            phonemes,
            MAX_IDS_PER_RUN.saturating_sub(marks).max(1),
            |c| {
                map.get(&*c.encode_utf8(&mut buf))
                    .map_or(0, |ids| ids.len() + pad)
            },
        )
    }

    /// The model's input ids for `phonemes`.
    #[must_use]
    pub fn ids(&self, phonemes: &str) -> Vec<i64> {
        let map = &self.config.phoneme_id_map;
        let get = |k: &str| map.get(k).cloned().unwrap_or_default();
        let pad = get("_");
        let mut ids = get("^");
        ids.extend(&pad);
        let mut buf = [0u8; 4];
        for c in phonemes.chars() {
            if let Some(id) = map.get(&*c.encode_utf8(&mut buf)) {
                ids.extend(id);
                ids.extend(&pad);
            }
        }
        ids.extend(get("$"));
        ids
    }
}

impl TextToSpeech for Piper {
    fn name(&self) -> &'static str {
        "piper"
    }

    fn sample_rate(&self) -> u32 {
        self.config.audio.sample_rate
    }

    fn cannot_read(&self, c: char) -> Option<&'static str> {
        unreadable_by(&self.config.espeak.voice, c)
    }

    fn threads(&self) -> usize {
        self.threads
    }

    fn synthesize_until(&mut self, text: &str, until: &Until<'_>) -> Result<Vec<f32>, TtsError> {
        let started = std::time::Instant::now();
        let phonemes = self.phonemes_until(text, until)?;
        let runs: Vec<Vec<i64>> = self
            .pieces(&phonemes)
            .into_iter()
            .map(|p| self.ids(p))
            .filter(|ids| ids.len() > 4)
            .collect();
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let fail = |e: ort::Error| TtsError::Inference(e.to_string());
        let inf = self.config.inference;
        let scales = [inf.noise_scale, inf.length_scale, inf.noise_w];
        let options = ort::session::RunOptions::new().map_err(fail)?;
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let (session, opts) = (&mut self.session, &options);
        // a watcher ends the run at its next step once the answer is
        // cancelled or the chunk is over its limit (a run it ended fails,
        // and so does any later one: the options stay terminated)
        let (run, stopped) = std::thread::scope(|s| {
            let watcher = std::thread::Builder::new()
                .name("voxline-piper-watch".into())
                .spawn_scoped(s, move || loop {
                    match finished.recv_timeout(POLL) {
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return None,
                    }
                    if let Some(why) = until.stop_now(started) {
                        let _ = opts.terminate();
                        return Some(why);
                    }
                });
            // one run per piece, the audio joined: what the model holds
            // at once is bounded by the piece, not the chunk
            let mut audio = Vec::new();
            let mut run = Ok(());
            for ids in runs {
                match run_model(session, ids, scales, opts) {
                    Ok(a) => audio.extend(a),
                    Err(e) => {
                        run = Err(e);
                        break;
                    }
                }
            }
            drop(done);
            let stopped = watcher.ok().and_then(|w| w.join().ok().flatten());
            (run.map(|()| audio), stopped)
        });
        match (run, stopped) {
            (_, Some(why)) => Err(why),
            (run, None) => run.map_err(fail),
        }
    }
}

/// One run of the model on `ids`: its audio, clamped to ±1.
fn run_model(
    session: &mut Session,
    ids: Vec<i64>,
    scales: [f32; 3],
    options: &ort::session::RunOptions,
) -> Result<Vec<f32>, ort::Error> {
    let n = ids.len();
    let input = Tensor::from_array(([1usize, n], ids))?;
    let lengths = Tensor::from_array(([1usize], vec![n as i64]))?;
    let scales = Tensor::from_array(([3usize], scales.to_vec()))?;
    let outputs = session.run_with_options(
        ort::inputs![
            "input" => input,
            "input_lengths" => lengths,
            "scales" => scales,
        ],
        options,
    )?;
    let (_, audio) = outputs[0].try_extract_tensor::<f32>()?;
    Ok(audio.iter().map(|s| s.clamp(-1.0, 1.0)).collect())
}

/// `phonemes` cut into pieces of at most `max` ids each, `cost` being a
/// phoneme's ids (its padding included): at a clause's end (the mark and a
/// space) when that keeps at least half of the piece, else at the last
/// space (a word's end), else, for one word longer than a piece, at its
/// last phoneme that fits. Nothing is left out; the spaces cut at are.
fn pieces(phonemes: &str, max: usize, mut cost: impl FnMut(char) -> usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = phonemes.trim();
    while !rest.is_empty() {
        let (mut used, mut end) = (0usize, rest.len());
        // the last clause's end (and the ids before it), the last space
        let (mut clause, mut space): (Option<(usize, usize)>, Option<usize>) = (None, None);
        let mut prev = ' ';
        for (i, c) in rest.char_indices() {
            let n = cost(c);
            if used + n > max && i > 0 {
                end = match (clause, space) {
                    (Some((at, ids)), _) if 2 * ids >= max => at,
                    (_, Some(at)) => at,
                    _ => i,
                };
                break;
            }
            if c == ' ' {
                space = Some(i);
                if clause_mark(prev) {
                    clause = Some((i, used));
                }
            }
            used += n;
            prev = c;
        }
        let (piece, next) = rest.split_at(end);
        let piece = piece.trim_end();
        if !piece.is_empty() {
            out.push(piece);
        }
        rest = next.trim_start();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clauses_keep_their_marks_and_numbers_stay_whole() {
        let c = clauses("Hello there, how are you? It is 3.5 degrees.");
        let marks: Vec<Option<char>> = c.iter().map(|(_, m)| *m).collect();
        assert_eq!(marks, [Some(','), Some('?'), Some('.')]);
        assert_eq!(c[2].0.trim(), "It is 3.5 degrees");
        assert!(clauses("...").is_empty());
        assert_eq!(clauses("no mark")[0], ("no mark".into(), None));
    }

    #[test]
    fn phonemes_past_a_run_are_cut_at_a_clause_else_a_word_else_anywhere() {
        // every phoneme one id, a space too; `#` none (not in the map)
        let cost = |c: char| usize::from(c != '#');
        let cut = |s, max| pieces(s, max, cost);
        assert_eq!(cut("  hello wɜːld  ", 100), ["hello wɜːld"]);
        assert!(cut("   ", 10).is_empty());
        // at the last word that fits
        assert_eq!(cut("aaa bbb ccc ddd", 9), ["aaa bbb", "ccc ddd"]);
        // at a clause's end that keeps half the piece, not a later word
        assert_eq!(
            cut("aaaa bbb, cc dd ee ff", 14),
            ["aaaa bbb,", "cc dd ee ff"]
        );
        // a clause that would leave a short piece is not waited for
        assert_eq!(cut("a, bbbbbb cccc dd", 12), ["a, bbbbbb", "cccc dd"]);
        // one word longer than a run: cut where it is full
        assert_eq!(cut("xxxxxxxxxx yy", 4), ["xxxx", "xxxx", "xx", "yy"]);
        // what has no ids costs nothing
        assert_eq!(cut("##a##b## c", 3), ["##a##b##", "c"]);
        // whatever the text, no piece is over its run and nothing is lost
        let long = "tʃˈaɪniːz lˌɛɾɚ, ".repeat(300);
        let p = cut(&long, 200);
        assert!(p.iter().all(|p| p.chars().count() <= 200), "{p:?}");
        assert_eq!(p.join(" "), long.trim());
        assert!(p.iter().all(|p| p.ends_with(',')), "cut at clauses");
    }

    #[test]
    fn a_missing_model_or_runtime_says_which_and_how_to_install_it() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("voice.onnx");
        let e = Piper::load(&model, &dir.path().join("lib.so"), 1).unwrap_err();
        assert!(e.to_string().contains("the voice model"), "{e}");
        assert!(e.to_string().contains("models fetch --voice piper"), "{e}");
        std::fs::write(&model, b"not onnx").unwrap();
        let e = Piper::load(&model, &dir.path().join("lib.so"), 1).unwrap_err();
        assert!(e.to_string().contains("config"), "{e}");
        std::fs::write(dir.path().join("voice.onnx.json"), b"{").unwrap();
        let e = Piper::load(&model, &dir.path().join("lib.so"), 1).unwrap_err();
        assert!(matches!(e, TtsError::BadVoice { .. }), "{e}");
        let e = voice_error(voxline_onnx::environment(&dir.path().join("lib.so")).unwrap_err());
        assert!(matches!(e, TtsError::Missing { .. }), "{e}");
    }
}
