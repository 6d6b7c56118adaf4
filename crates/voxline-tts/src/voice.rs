//! The speech-synthesis trait, and the voice that is always there: espeak-ng,
//! run as a separate program.
//!
//! espeak-ng is GPL-3; voxline is MIT/Apache-2.0. voxline never links it: it
//! runs the `espeak-ng` program (Debian's package) and reads its output, as
//! it would any other tool, for the espeak voice and for the neural voice's
//! phonemes alike.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::TtsError;

/// A voice: text in, audio out.
pub trait TextToSpeech: Send {
    /// Its name in reports and flags (`"espeak"`, `"piper"`).
    fn name(&self) -> &'static str;

    /// The sample rate of the audio it makes (mono).
    fn sample_rate(&self) -> u32;

    /// Threads it computes with (the pipeline's CPU budget counts them).
    fn threads(&self) -> usize {
        1
    }

    /// The script of `c` when the voice cannot read it (the stage leaves
    /// such characters out of what it speaks, with one warning an answer);
    /// `None` when it can. A voice reads everything unless it says
    /// otherwise; an English one reads neither Chinese characters nor
    /// Ethiopic ([`crate::chunk::unreadable_in_english`]).
    fn cannot_read(&self, c: char) -> Option<&'static str> {
        let _ = c;
        None
    }

    /// Speaks `text` (one chunk): mono samples at [`Self::sample_rate`].
    ///
    /// # Errors
    /// The voice's own failure; the stage makes it a turn error.
    fn synthesize(&mut self, text: &str) -> Result<Vec<f32>, TtsError> {
        self.synthesize_until(text, &Until::never())
    }

    /// As [`Self::synthesize`], giving up as soon as `until` says so: the
    /// chunk's answer was cancelled (the user spoke over it, the run
    /// stops) or the chunk took longer than its limit.
    ///
    /// # Errors
    /// [`TtsError::Cancelled`], [`TtsError::TooSlow`], or the voice's own
    /// failure.
    fn synthesize_until(&mut self, text: &str, until: &Until<'_>) -> Result<Vec<f32>, TtsError>;
}

/// The longest one chunk (at most [`crate::chunk::MAX_CHUNK_CHARS`]
/// characters) may take to synthesise: a few seconds on a busy 2-core CPU,
/// so a voice still at it after this is stuck, and the chunk is a turn
/// error rather than a stalled answer.
pub const CHUNK_LIMIT: Duration = Duration::from_secs(30);

/// When a chunk's synthesis stops early (see
/// [`TextToSpeech::synthesize_until`]).
pub struct Until<'a> {
    /// Read while the voice works, from any thread: true once the chunk's
    /// answer is cancelled.
    pub cancelled: &'a (dyn Fn() -> bool + Sync),
    /// The longest the chunk may take.
    pub limit: Duration,
}

impl Until<'static> {
    /// No cancel, and [`CHUNK_LIMIT`].
    #[must_use]
    pub fn never() -> Self {
        Self {
            cancelled: &|| false,
            limit: CHUNK_LIMIT,
        }
    }
}

impl Until<'_> {
    /// Why the work should stop now, `started` being when it began.
    pub(crate) fn stop_now(&self, started: Instant) -> Option<TtsError> {
        if (self.cancelled)() {
            Some(TtsError::Cancelled)
        } else if started.elapsed() > self.limit {
            Some(TtsError::TooSlow {
                limit_ms: u64::try_from(self.limit.as_millis()).unwrap_or(u64::MAX),
            })
        } else {
            None
        }
    }
}

/// How often a chunk's synthesis looks at its [`Until`].
pub(crate) const POLL: Duration = Duration::from_millis(5);

/// The espeak-ng program's name.
pub const ESPEAK_PROGRAM: &str = "espeak-ng";

/// The espeak-ng voice, speaking as a separate process per chunk.
#[derive(Debug, Clone)]
pub struct Espeak {
    voice: String,
    words_per_minute: u32,
}

/// espeak-ng's output rate.
const ESPEAK_RATE: u32 = 22_050;

/// Runs espeak-ng with `args`, `text` on its standard input; its standard
/// output. The program is killed as soon as `until` says so.
pub(crate) fn run_espeak(
    args: &[&str],
    text: &str,
    until: &Until<'_>,
) -> Result<Vec<u8>, TtsError> {
    let started = Instant::now();
    let mut child = Command::new(ESPEAK_PROGRAM)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| TtsError::EspeakMissing(e.to_string()))?;
    let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) = pipes else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(TtsError::Espeak("no pipes to the program".into()));
    };
    let text = text.to_owned();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // each pipe on a thread of its own: espeak-ng writes as it reads, and
    // once both pipes are full (64 KiB each) a writer that waits to read
    // would wait forever (the text goes on stdin: a chunk that starts with
    // "-" is no option)
    let threads = std::thread::scope(|s| -> Result<_, TtsError> {
        let spawn = |name: &str| std::thread::Builder::new().name(name.into());
        let writer = thread_started(
            spawn("voxline-espeak-in").spawn_scoped(s, move || stdin.write_all(text.as_bytes())),
            &mut child,
        )?;
        let errors = spawn("voxline-espeak-err").spawn_scoped(s, move || {
            let mut e = Vec::new();
            let _ = (&mut stderr).take(4096).read_to_end(&mut e);
            // the rest is read past, so the program never blocks on it
            let _ = std::io::copy(&mut stderr, &mut std::io::sink());
            e
        });
        let errors = thread_started(errors, &mut child)?;
        let reader = spawn("voxline-espeak-out").spawn_scoped(s, move || {
            let mut out = Vec::new();
            let r = stdout.read_to_end(&mut out).map(|_| out);
            let _ = done_tx.send(());
            r
        });
        let reader = thread_started(reader, &mut child)?;
        // the output ends when the program does, or when it is killed
        let mut stopped = None;
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(POLL) {
            if let Some(why) = until.stop_now(started) {
                let _ = child.kill();
                stopped = Some(why);
                break;
            }
        }
        let status = child.wait().map_err(|e| TtsError::Espeak(e.to_string()));
        let joined = (writer.join(), reader.join(), errors.join());
        Ok((stopped, status, joined))
    })?;
    let (stopped, status, (written, read, errors)) = threads;
    if let Some(why) = stopped {
        return Err(why);
    }
    let status = status?;
    let panicked = || TtsError::Espeak("a pipe's thread panicked".into());
    let out = read
        .map_err(|_| panicked())?
        .map_err(|e| TtsError::Espeak(format!("reading its output: {e}")))?;
    written
        .map_err(|_| panicked())?
        .map_err(|e| TtsError::Espeak(format!("writing the text: {e}")))?;
    if !status.success() {
        let err = errors.map_err(|_| panicked())?;
        let err = String::from_utf8_lossy(&err);
        return Err(TtsError::Espeak(format!(
            "{} ({status})",
            err.lines().next().unwrap_or("no message"),
        )));
    }
    Ok(out)
}

/// A thread for the program's pipes, started; when it could not be, the
/// program is killed (so the threads already started end) and it is an error.
fn thread_started<T>(
    thread: std::io::Result<T>,
    child: &mut std::process::Child,
) -> Result<T, TtsError> {
    thread.map_err(|e| {
        let _ = child.kill();
        TtsError::Espeak(format!("starting a thread for its pipes: {e}"))
    })
}

/// Whether espeak-ng's voice `voice` (`en-us`, `en`, `gmw/en-GB-x-rp`)
/// speaks English.
pub(crate) fn is_english(voice: &str) -> bool {
    let lang = voice
        .rsplit('/')
        .next()
        .unwrap_or(voice)
        .to_ascii_lowercase();
    lang == "en" || lang.starts_with("en-") || lang.starts_with("en_")
}

/// What `c` is when espeak-ng's voice `voice` cannot read it (see
/// [`TextToSpeech::cannot_read`]): for an English voice, a script other
/// than Latin and Greek; for any other, nothing.
pub(crate) fn unreadable_by(voice: &str, c: char) -> Option<&'static str> {
    if is_english(voice) {
        crate::chunk::unreadable_in_english(c)
    } else {
        None
    }
}

/// Checks that espeak-ng runs and has voice `voice`.
pub(crate) fn check_espeak(voice: &str) -> Result<(), TtsError> {
    let out = run_espeak(&["-q", "-v", voice, "--ipa"], "a", &Until::never())?;
    if out.is_empty() {
        return Err(TtsError::Espeak(format!(
            "voice `{voice}` gave no phonemes; is espeak-ng-data installed?"
        )));
    }
    Ok(())
}

impl Espeak {
    /// US English at 150 words a minute (clearer than espeak-ng's 175, as the fixtures are spoken); checks that the program runs.
    ///
    /// # Errors
    /// [`TtsError::EspeakMissing`] when espeak-ng is not installed.
    pub fn new() -> Result<Self, TtsError> {
        Self::with_voice("en-us", 150)
    }

    /// espeak-ng voice `voice` at `words_per_minute`.
    ///
    /// # Errors
    /// As [`Espeak::new`].
    pub fn with_voice(voice: &str, words_per_minute: u32) -> Result<Self, TtsError> {
        check_espeak(voice)?;
        Ok(Self {
            voice: voice.to_owned(),
            words_per_minute,
        })
    }
}

/// Reads a 16-bit mono WAV (what espeak-ng writes) into samples.
fn wav_samples(bytes: &[u8]) -> Result<(u32, Vec<f32>), TtsError> {
    // espeak-ng writing to a pipe leaves the RIFF and data lengths unset
    // (0x7fffffff or 0): read the samples after the header ourselves.
    let reader = hound::WavReader::new(std::io::Cursor::new(bytes))
        .map_err(|e| TtsError::Espeak(format!("its output is not WAV ({e})")))?;
    let spec = reader.spec();
    if spec.channels != 1 || spec.bits_per_sample != 16 {
        return Err(TtsError::Espeak(format!(
            "unexpected audio: {} channels, {} bits",
            spec.channels, spec.bits_per_sample
        )));
    }
    let data_at = find_data(bytes).ok_or_else(|| TtsError::Espeak("no data chunk".into()))?;
    let samples = bytes[data_at..]
        .chunks_exact(2)
        .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0)
        .collect();
    Ok((spec.sample_rate, samples))
}

/// The offset of the first sample after the `data` chunk's header.
fn find_data(bytes: &[u8]) -> Option<usize> {
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 4];
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().ok()?) as usize;
        if id == b"data" {
            return Some(at + 8);
        }
        at = at.checked_add(8 + len + (len & 1))?;
    }
    None
}

impl TextToSpeech for Espeak {
    fn name(&self) -> &'static str {
        "espeak"
    }

    fn sample_rate(&self) -> u32 {
        ESPEAK_RATE
    }

    fn cannot_read(&self, c: char) -> Option<&'static str> {
        unreadable_by(&self.voice, c)
    }

    fn synthesize_until(&mut self, text: &str, until: &Until<'_>) -> Result<Vec<f32>, TtsError> {
        let wpm = self.words_per_minute.to_string();
        let wav = run_espeak(&["-v", &self.voice, "-s", &wpm, "--stdout"], text, until)?;
        let (rate, samples) = wav_samples(&wav)?;
        if rate != ESPEAK_RATE {
            return Err(TtsError::Espeak(format!(
                "audio at {rate} Hz, not {ESPEAK_RATE}"
            )));
        }
        Ok(samples)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn espeak_speaks_a_sentence_as_audio_of_plausible_length() {
        let mut v = Espeak::new().expect("espeak-ng is installed here");
        let a = v.synthesize("The capital of France is Paris.").unwrap();
        let secs = a.len() as f64 / f64::from(v.sample_rate());
        assert!((1.0..4.0).contains(&secs), "{secs} s");
        let peak = a.iter().fold(0f32, |m, s| m.max(s.abs()));
        assert!(peak > 0.1, "audible: peak {peak}");
        // a chunk that looks like an option is spoken, not parsed
        assert!(!v.synthesize("-v nothing").unwrap().is_empty());
    }

    #[test]
    fn text_and_output_past_the_pipes_buffers_do_not_deadlock_espeak() {
        // ~120 KB in, more than 64 KiB of phonemes out
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let text = "hello world ".repeat(10_000);
            let _ = tx.send(run_espeak(
                &["-q", "-v", "en-us", "--ipa"],
                &text,
                &Until::never(),
            ));
        });
        let out = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("espeak-ng and its writer deadlocked")
            .unwrap();
        assert!(out.len() > 65_536, "{} bytes", out.len());
    }

    #[test]
    fn an_english_voice_cannot_read_chinese_another_voice_may() {
        for v in ["en", "en-us", "en-GB-x-rp", "gmw/en-US"] {
            assert!(is_english(v), "{v}");
            assert_eq!(unreadable_by(v, '中'), Some("Chinese characters"));
            assert_eq!(unreadable_by(v, 'é'), None);
        }
        for v in ["cmn", "de", "eng-x", "sit/yue"] {
            assert!(!is_english(v), "{v}");
            assert_eq!(unreadable_by(v, '中'), None);
        }
    }

    #[test]
    fn a_wav_is_read_past_its_chunks_whatever_its_lengths_say() {
        let mut w = Vec::new();
        w.extend_from_slice(b"RIFF\xff\xff\xff\x7fWAVEfmt ");
        w.extend_from_slice(&16u32.to_le_bytes());
        w.extend_from_slice(&[1, 0, 1, 0]);
        w.extend_from_slice(&22_050u32.to_le_bytes());
        w.extend_from_slice(&44_100u32.to_le_bytes());
        w.extend_from_slice(&[2, 0, 16, 0]);
        w.extend_from_slice(b"data\x00\xf0\xff\x7f");
        w.extend_from_slice(&16_384i16.to_le_bytes());
        w.extend_from_slice(&(-32_768i16).to_le_bytes());
        let (rate, s) = wav_samples(&w).unwrap();
        assert_eq!((rate, s), (22_050, vec![0.5, -1.0]));
        assert!(find_data(b"RIFF....WAVE").is_none());
    }
}
