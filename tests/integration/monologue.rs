//! A long monologue made of the audio fixtures' sentences joined with no
//! pause, transcribed through the library's VAD and STT stages, and the same
//! sentences transcribed one by one. Shared by the `long_speech` integration
//! test and the `long_speech` bench (which includes this file by path), so it
//! uses nothing of the test binary's own helpers.

use std::path::Path;

use voxline_audio::{VadConfig, VadStage, WavSource};
use voxline_core::{AudioFrame, Clock, Emitter, Stage, StageError, Transcript};
use voxline_stt::{implausibly_short, word_error_rate, SttEngine, SttStage};

/// The fixtures whose speech makes up the monologue (every turn of each).
const FILES: [&str; 7] = [
    "q_capital.wav",
    "q_weather.wav",
    "q_tea.wav",
    "q_story.wav",
    "q_moon.wav",
    "long_10s.wav",
    "multi_turn.wav",
];

/// One spoken turn of a fixture: its text and its speech, trimmed to the
/// sidecar's true boundaries (no silence before or after).
pub struct Sentence {
    /// What was said.
    pub text: String,
    /// The speech, 16 kHz mono.
    pub samples: Vec<f32>,
}

/// Every turn of the fixtures in [`FILES`], read from `fixtures`.
pub fn sentences(fixtures: &Path) -> Vec<Sentence> {
    let mut out = Vec::new();
    for file in FILES {
        let path = fixtures.join(file);
        let mut src = WavSource::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let mut audio = Vec::new();
        while let Some(chunk) = src.next_chunk().unwrap_or_else(|e| panic!("{e}")) {
            audio.extend_from_slice(&chunk);
        }
        let sidecar: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path.with_extension("json")).unwrap()).unwrap();
        assert_eq!(sidecar["sample_rate"], 16_000, "{file}");
        for turn in sidecar["turns"].as_array().unwrap() {
            let at = |k: &str| usize::try_from(turn[k].as_u64().unwrap()).unwrap();
            out.push(Sentence {
                text: turn["text"].as_str().unwrap().to_string(),
                samples: audio[at("start_sample")..at("end_sample")].to_vec(),
            });
        }
    }
    out
}

/// The order of sentences (indices into `sentences`) for a monologue at
/// least `secs` long: rounds of every sentence, each round in a different
/// seeded order, so the forced splits fall at different places in them.
pub fn order(sentences: &[Sentence], secs: f64) -> Vec<usize> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move || {
        // xorshift64*: a fixed, portable sequence
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let want = (secs * 16_000.0) as usize;
    let (mut order, mut len) = (Vec::new(), 0);
    while len < want {
        let mut round: Vec<usize> = (0..sentences.len()).collect();
        for i in (1..round.len()).rev() {
            round.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        for i in round {
            if len >= want {
                break;
            }
            len += sentences[i].samples.len();
            order.push(i);
        }
    }
    order
}

/// The sentences in `order`, end to end with no pause, then 1 s of silence.
pub fn join(sentences: &[Sentence], order: &[usize]) -> Vec<f32> {
    let mut audio: Vec<f32> = order
        .iter()
        .flat_map(|&i| sentences[i].samples.iter().copied())
        .collect();
    audio.extend(std::iter::repeat_n(0.0, 16_000));
    audio
}

/// What was said, in `order`.
pub fn expected(sentences: &[Sentence], order: &[usize]) -> String {
    order
        .iter()
        .map(|&i| sentences[i].text.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Each sentence transcribed on its own, by index, with `pad` samples of
/// silence on either side (8 000, half a second, as in the fixture files:
/// the sentences as people say them, with a pause around each; 0: the
/// monologue cut exactly at its sentence boundaries).
pub fn transcribe_each(engine: &mut SttEngine, sentences: &[Sentence], pad: usize) -> Vec<String> {
    sentences
        .iter()
        .map(|s| {
            let mut audio = vec![0.0; pad];
            audio.extend_from_slice(&s.samples);
            audio.extend(std::iter::repeat_n(0.0, pad));
            engine.transcribe(&audio).unwrap().text
        })
        .collect()
}

/// The monologue as the pipeline's VAD and STT stages hear it.
pub struct LongRun {
    /// Utterances the VAD sent.
    pub utterances: usize,
    /// Of those, cut at the maximum length.
    pub forced_splits: usize,
    /// The transcripts, in order.
    pub transcripts: Vec<Transcript>,
    /// The turns that failed, with why.
    pub errors: Vec<StageError>,
    /// Transcripts passed on although [`implausibly_short`] for their
    /// whole audio (the stage reads such audio again in pieces, so on
    /// dense speech this stays 0).
    pub short: usize,
}

impl LongRun {
    /// The transcripts joined: the text the user read.
    pub fn text(&self) -> String {
        self.transcripts
            .iter()
            .map(|t| t.text.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Runs `audio` through a VAD stage with `vad` and then `stt`, one utterance
/// at a time, keeping every transcript and every turn error.
pub fn transcribe_stream(stt: &mut SttStage, vad: VadConfig, audio: &[f32]) -> LongRun {
    let clock = Clock::start();
    let mut stage = VadStage::new(vad).unwrap();
    let frames = audio.chunks(320).enumerate().map(|(i, c)| AudioFrame {
        start_sample: (i * 320) as u64,
        samples: c.to_vec(),
        captured: clock.sample_due((i * 320) as u64),
        new_recording: i == 0,
        end_of_stream: false,
    });
    let utterances = voxline_core::drive(&mut stage, frames).unwrap();
    let mut run = LongRun {
        utterances: utterances.len(),
        forced_splits: utterances.iter().filter(|u| u.forced_split).count(),
        transcripts: Vec::new(),
        errors: Vec::new(),
        short: 0,
    };
    for u in utterances {
        let mut out = Vec::new();
        match stt.process(u, &mut Emitter::to_vec(&mut out)) {
            Ok(()) => run.transcripts.extend(out),
            Err(e) => run.errors.push(e),
        }
    }
    run.short = run
        .transcripts
        .iter()
        .filter(|t| implausibly_short(&t.text, t.audio_ms / 1000.0).is_some())
        .count();
    run
}

/// The monologue's word error rates: as the stream's transcripts read
/// joined, and as the sentences transcribed one by one read joined.
pub fn wers(sentences: &[Sentence], order: &[usize], each: &[String], run: &LongRun) -> (f64, f64) {
    let truth = expected(sentences, order);
    let natural = order
        .iter()
        .map(|&i| each[i].as_str())
        .collect::<Vec<_>>()
        .join(" ");
    (
        word_error_rate(&truth, &run.text()),
        word_error_rate(&truth, &natural),
    )
}
