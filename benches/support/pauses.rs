//! A corpus of real pauses inside sentences, made here: each recording
//! (real people from `audio-fixtures/human` or `VOXLINE_SPEECH_DIR`, and
//! sentences the Piper voice speaks in one breath: digits read in groups,
//! lists, a speech that pauses before its last words) with a silence of
//! 0.6–1.5 s put in at a gap between two words, found from the energy of
//! the speech (the quietest dips of its middle, well below its typical
//! level). The silence is noise at the recording's own background level
//! (digital zeros where the background is digital silence), joined with
//! 5 ms fades.
//!
//! Each clip keeps, beside its audio, where its speech starts and ends and
//! where the inserted pauses lie, so a cut at a pause can be counted; the
//! sidecars written by [`write`] hold them as `pauses`.

use std::path::{Path, PathBuf};

use voxline_audio::turn::{SharedTurnModel, TurnPolicy};
use voxline_audio::{VadConfig, VadStage};
use voxline_core::{AudioFrame, Clock, Emitter, SpecBoard, SpecState, Stage};

/// The pauses put into each sentence, ms.
pub const PAUSE_MS: [u32; 3] = [600, 1_000, 1_500];

/// Sentences the Piper voice speaks, each in one synthesis (so the
/// intonation runs on across the gaps where the pauses go).
pub const PIPER_SENTENCES: [&str; 6] = [
    "My number is four one five, two three eight, nine nine zero one.",
    "I need eggs, milk, bread, and a bag of rice.",
    "And so, my fellow citizens, ask not what your country can do for you.",
    "The meeting is on Tuesday, at three, in the big room upstairs.",
    "Set a timer for twenty minutes, and then remind me to call my sister.",
    "The code for the door is seven, seven, three, one.",
];

const RATE: usize = 16_000;
/// Energy frames: 25 ms windows every 10 ms.
const WIN: usize = 400;
const HOP: usize = 160;

/// A recording to put pauses into.
#[derive(Debug, Clone)]
pub struct Sentence {
    /// A short name.
    pub name: String,
    /// 16 kHz mono audio.
    pub audio: Vec<f32>,
    /// What is said.
    pub text: String,
    /// First and one-past-last speech sample.
    pub speech: (usize, usize),
    /// `human` or `piper`.
    pub kind: &'static str,
}

/// One clip of the corpus.
#[derive(Debug, Clone)]
pub struct PauseClip {
    /// `<sentence>-p<ms>-<k>`, or the sentence's name for the clip as spoken.
    pub name: String,
    /// `human` or `piper`.
    pub kind: &'static str,
    /// 16 kHz mono audio.
    pub audio: Vec<f32>,
    /// What is said.
    pub text: String,
    /// First and one-past-last speech sample.
    pub speech: (usize, usize),
    /// Inserted pauses: (first sample, length in samples).
    pub pauses: Vec<(usize, usize)>,
}

fn rms(x: &[f32]) -> f32 {
    if x.is_empty() {
        return 0.0;
    }
    (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt()
}

/// RMS of each energy frame of `audio`.
fn energy(audio: &[f32]) -> Vec<f32> {
    (0..audio.len().saturating_sub(WIN) / HOP)
        .map(|i| rms(&audio[i * HOP..i * HOP + WIN]))
        .collect()
}

/// Where the speech of `audio` starts and ends: the first and last energy
/// frame above 5 % of the loudest.
pub fn speech_span(audio: &[f32]) -> (usize, usize) {
    let e = energy(audio);
    let top = e.iter().copied().fold(0.0, f32::max);
    let loud = |v: &&f32| **v > 0.05 * top;
    let first = e.iter().position(|v| loud(&v)).unwrap_or(0);
    let last = e.iter().rposition(|v| loud(&v)).unwrap_or(e.len());
    (first * HOP, (last * HOP + WIN).min(audio.len()))
}

/// Gaps between words inside the middle of the speech (from 20 % to 85 %
/// of it): the centres of the quietest dips of the smoothed energy, below a
/// quarter of the speech's median level, at least 400 ms apart, deepest
/// first, at most `max`.
pub fn word_gaps(audio: &[f32], speech: (usize, usize), max: usize) -> Vec<usize> {
    let e = energy(audio);
    let smooth: Vec<f32> = (0..e.len())
        .map(|i| {
            let w = &e[i.saturating_sub(2)..(i + 3).min(e.len())];
            w.iter().sum::<f32>() / w.len() as f32
        })
        .collect();
    let (s, t) = (speech.0 / HOP, (speech.1 / HOP).min(smooth.len()));
    if t <= s + 10 {
        return Vec::new();
    }
    let mut levels: Vec<f32> = smooth[s..t].to_vec();
    levels.sort_by(f32::total_cmp);
    let median = levels[levels.len() / 2];
    let (from, to) = (s + (t - s) / 5, s + (t - s) * 17 / 20);
    let mut dips: Vec<(usize, f32)> = (from.max(1)..to.min(smooth.len() - 1))
        .filter(|&i| smooth[i] <= smooth[i - 1] && smooth[i] <= smooth[i + 1])
        .filter(|&i| smooth[i] < 0.25 * median)
        .map(|i| (i, smooth[i]))
        .collect();
    dips.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut chosen: Vec<usize> = Vec::new();
    for (i, _) in dips {
        let at = i * HOP + WIN / 2;
        if chosen.iter().all(|&c| c.abs_diff(at) >= RATE * 2 / 5) {
            chosen.push(at);
        }
        if chosen.len() == max {
            break;
        }
    }
    chosen
}

/// `len` samples of silence at the level of `audio`'s quietest 100 ms
/// (seeded noise; zeros for digital silence).
fn background(audio: &[f32], len: usize, seed: u32) -> Vec<f32> {
    let level = audio
        .chunks(RATE / 10)
        .filter(|c| c.len() == RATE / 10)
        .map(rms)
        .fold(f32::MAX, f32::min);
    let level = if level.is_finite() { level } else { 0.0 };
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut uniform = move || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    // a sum of four uniforms: near-Gaussian, variance 1/3
    (0..len)
        .map(|_| level * 3f32.sqrt() * (uniform() + uniform() + uniform() + uniform()))
        .collect()
}

/// `s` with a pause of `len` samples put in at `at`.
fn insert(audio: &[f32], at: usize, len: usize, seed: u32) -> Vec<f32> {
    let fade = RATE / 200;
    let mut out = audio[..at].to_vec();
    let n = out.len();
    for k in 0..fade.min(n) {
        out[n - 1 - k] *= k as f32 / fade as f32;
    }
    out.extend(background(audio, len, seed));
    let mut rest = audio[at..].to_vec();
    for (k, v) in rest.iter_mut().take(fade).enumerate() {
        *v *= k as f32 / fade as f32;
    }
    out.extend(rest);
    out
}

/// The corpus of `sentences`: each as spoken, then with one pause of each
/// length of [`PAUSE_MS`] at each of its (up to two) word gaps, and with
/// pauses at both gaps at once (1 s each).
pub fn corpus(sentences: &[Sentence]) -> Vec<PauseClip> {
    let mut out = Vec::new();
    for (n, s) in sentences.iter().enumerate() {
        out.push(PauseClip {
            name: s.name.clone(),
            kind: s.kind,
            audio: s.audio.clone(),
            text: s.text.clone(),
            speech: s.speech,
            pauses: Vec::new(),
        });
        let gaps = word_gaps(&s.audio, s.speech, 2);
        for (k, &at) in gaps.iter().enumerate() {
            for ms in PAUSE_MS {
                let len = ms as usize * RATE / 1000;
                out.push(PauseClip {
                    name: format!("{}-p{ms}-{k}", s.name),
                    kind: s.kind,
                    audio: insert(&s.audio, at, len, (n * 7 + k) as u32),
                    text: s.text.clone(),
                    speech: (s.speech.0, s.speech.1 + len),
                    pauses: vec![(at, len)],
                });
            }
        }
        if let [a, b] = gaps[..] {
            let (a, b) = (a.min(b), a.max(b));
            let len = RATE;
            let once = insert(&s.audio, b, len, n as u32);
            out.push(PauseClip {
                name: format!("{}-p1000-both", s.name),
                kind: s.kind,
                audio: insert(&once, a, len, n as u32 + 1),
                text: s.text.clone(),
                speech: (s.speech.0, s.speech.1 + 2 * len),
                pauses: vec![(a, len), (b + len, len)],
            });
        }
    }
    out
}

/// The human recordings of `dir` with sidecars (one turn each).
pub fn human_sentences(dir: &Path) -> Vec<Sentence> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "wav"))
                .collect()
        })
        .unwrap_or_default();
    paths.sort();
    paths
        .into_iter()
        .filter_map(|p| {
            let side: serde_json::Value =
                serde_json::from_slice(&std::fs::read(p.with_extension("json")).ok()?).ok()?;
            let turn = side["turns"].as_array()?.first()?.clone();
            let rate = side["sample_rate"].as_u64()? as usize;
            let scale = |v: u64| v as usize * RATE / rate;
            Some(Sentence {
                name: p.file_stem()?.to_string_lossy().into_owned(),
                audio: super::util::read_16k(&p),
                text: turn["text"].as_str()?.to_owned(),
                speech: (
                    scale(turn["start_sample"].as_u64()?),
                    scale(turn["end_sample"].as_u64()?),
                ),
                kind: "human",
            })
        })
        .collect()
}

/// [`PIPER_SENTENCES`] spoken by the Piper voice of `models` (16 kHz, with
/// 0.3 s of silence before and 1 s after); empty when the voice is not
/// installed.
pub fn piper_sentences(models: &Path) -> Vec<Sentence> {
    use voxline_tts::TextToSpeech as _;
    let mut voice = None;
    PIPER_SENTENCES
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let speech = match cached_speech(text) {
                Some(s) => s,
                None => {
                    if voice.is_none() {
                        voice = Some(
                            voxline_tts::Piper::load(
                                &models.join("en_US-joe-medium.onnx"),
                                &models.join("libonnxruntime.so.1.31.1"),
                                2,
                            )
                            .ok()?,
                        );
                    }
                    let voice = voice.as_mut()?;
                    let raw = voice.synthesize(text).ok()?;
                    let mut r = voxline_audio::StreamResampler::new(voice.sample_rate(), 1).ok()?;
                    let mut speech = Vec::new();
                    r.process(&raw, &mut speech).ok()?;
                    r.flush(&mut speech).ok()?;
                    keep_speech(text, &speech);
                    speech
                }
            };
            let mut audio = vec![0.0; RATE * 3 / 10];
            audio.extend(&speech);
            audio.extend(std::iter::repeat_n(0.0, RATE));
            let span = speech_span(&audio);
            Some(Sentence {
                name: format!("piper-{i}"),
                audio,
                text: (*text).to_owned(),
                speech: span,
                kind: "piper",
            })
        })
        .collect()
}

/// Where Piper's speech of `text` (16 kHz) is kept between runs: Piper
/// draws fresh noise at every synthesis (its pauses and words move from
/// one run to the next), so two runs compare on the same audio only when
/// it is made once.
fn speech_cache(text: &str) -> PathBuf {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("piper-sentences")
        .join(format!("{:016x}.wav", h.finish()))
}

/// The speech of `text` made by an earlier run, if kept.
fn cached_speech(text: &str) -> Option<Vec<f32>> {
    let r = hound::WavReader::open(speech_cache(text)).ok()?;
    r.into_samples::<f32>().collect::<Result<_, _>>().ok()
}

/// Keeps the speech of `text` for the next run (best effort).
fn keep_speech(text: &str, speech: &[f32]) {
    let path = speech_cache(text);
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let _ = std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")));
    if let Ok(mut w) = hound::WavWriter::create(&path, spec) {
        for &v in speech {
            let _ = w.write_sample(v);
        }
        let _ = w.finalize();
    }
}

/// Writes each clip as `<name>.wav` (16 kHz s16) with its sidecar (the
/// turn, and `pauses`: each inserted pause's first sample and length).
///
/// # Panics
/// When the folder cannot be written.
pub fn write(dir: &Path, clips: &[PauseClip]) {
    std::fs::create_dir_all(dir).expect("the corpus folder");
    for c in clips {
        let wav = dir.join(format!("{}.wav", c.name));
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: RATE as u32,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(&wav, spec).expect("a corpus WAV");
        for &v in &c.audio {
            w.write_sample((v.clamp(-1.0, 1.0) * 32_767.0) as i16)
                .expect("a corpus WAV");
        }
        w.finalize().expect("a corpus WAV");
        let side = serde_json::json!({
            "file": format!("{}.wav", c.name),
            "sample_rate": RATE,
            "channels": 1,
            "format": "s16",
            "duration_samples": c.audio.len(),
            "turns": [{"text": c.text, "start_sample": c.speech.0, "end_sample": c.speech.1}],
            "pauses": c.pauses.iter().map(|&(at, len)| serde_json::json!({"start_sample": at, "samples": len})).collect::<Vec<_>>(),
            "kind": c.kind,
        });
        std::fs::write(
            wav.with_extension("json"),
            serde_json::to_vec_pretty(&side).expect("a sidecar"),
        )
        .expect("a corpus sidecar");
    }
}

/// Turns as (end of speech, committed or released at), in stream samples.
pub type Turns = Vec<(u64, u64)>;

/// The turns (end of speech, committed at) the VAD stage makes of `audio`
/// followed by 3 s of silence, with speculation as the command line has it,
/// by a hangover of `hangover_ms` alone (`semantic` `None`) or with the
/// semantic end of turn; turns taken back and merged into the next are not
/// among them (see [`turns_and_merged`]).
///
/// # Panics
/// When the policy is out of range.
pub fn committed_turns(
    audio: &[f32],
    hangover_ms: u32,
    semantic: Option<(&SharedTurnModel, TurnPolicy)>,
) -> Vec<(u64, u64)> {
    turns_and_merged(audio, hangover_ms, semantic).0
}

/// Chunk `i` (of `chunk` samples each) of one recording replayed from its
/// start, as the VAD stage receives it, due on `clock`.
pub fn replay_frame(i: usize, chunk: usize, samples: &[f32], clock: &Clock) -> AudioFrame {
    let start = (i * chunk) as u64;
    AudioFrame {
        start_sample: start,
        samples: samples.to_vec(),
        captured: clock.sample_due(start),
        new_recording: i == 0,
        end_of_stream: false,
    }
}

/// As [`committed_turns`], and the turns that were shown (released) and
/// then taken back because the speaker went on, each as (end of speech,
/// released at).
///
/// # Panics
/// When the policy is out of range.
pub fn turns_and_merged(
    audio: &[f32],
    hangover_ms: u32,
    semantic: Option<(&SharedTurnModel, TurnPolicy)>,
) -> (Turns, Turns) {
    let (turns, merged) = turns_heard(audio, hangover_ms, semantic, None);
    (turns.iter().map(|t| (t.end, t.closed)).collect(), merged)
}

/// A committed turn, in stream samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Turn {
    /// The end of its speech.
    pub end: u64,
    /// When it was committed (or released, if it was then made final).
    pub closed: u64,
    /// Its first sample.
    pub start: u64,
}

/// What the recogniser hears in an attempt's audio, and how long after the
/// attempt is sent its transcript exists (samples of stream time): the
/// words the semantic end of turn takes a second opinion from.
pub struct Hearing<'a> {
    /// The transcript of an attempt's audio.
    pub hear: &'a mut (dyn FnMut(&[f32]) -> String + Send),
    /// Stream time from an attempt's sending to its transcript.
    pub delay: u64,
    /// With a voice that barge-in hears over: stream time from a turn's
    /// transcript to its answer beginning to play (the language model's
    /// first token and the voice's first block). The voice takes a turn
    /// released or committed, and waits while it is held. The microphone
    /// hears none of it (headphones, or a canceller that has converged).
    pub voice: Option<u64>,
    /// With a voice: where each answer began to play (stream position) is
    /// noted here, in order.
    pub played: Option<&'a std::sync::Mutex<Vec<u64>>>,
}

/// `VOXLINE_BENCH_SPEC_THRESHOLD`: a `--spec-threshold` other than the
/// default, to compare the two on the same corpus. One line and exit code 2
/// when it is not a probability.
fn bench_spec_threshold() -> f32 {
    let Ok(v) = std::env::var("VOXLINE_BENCH_SPEC_THRESHOLD") else {
        return VadConfig::default().spec_threshold;
    };
    match v.trim().parse::<f32>() {
        Ok(p) if (0.0..=1.0).contains(&p) => p,
        _ => {
            eprintln!("VOXLINE_BENCH_SPEC_THRESHOLD={v:?}: use a probability from 0 to 1");
            std::process::exit(2)
        }
    }
}

/// As [`turns_and_merged`], with each turn's start, and, with `hearing`,
/// each attempt's transcript noted on the board (as the runtime does) once
/// `hearing.delay` of stream time has passed after it was sent.
///
/// # Panics
/// When the policy is out of range (a bad `VOXLINE_BENCH_SPEC_THRESHOLD`
/// exits with code 2 instead).
pub fn turns_heard(
    audio: &[f32],
    hangover_ms: u32,
    semantic: Option<(&SharedTurnModel, TurnPolicy)>,
    hearing: Option<Hearing<'_>>,
) -> (Vec<Turn>, Turns) {
    let board = SpecBoard::new();
    let mut stage = VadStage::new(VadConfig {
        hangover_ms,
        spec_threshold: bench_spec_threshold(),
        ..VadConfig::default()
    })
    .unwrap_or_else(|e| {
        eprintln!("the VAD settings: {e}");
        std::process::exit(2)
    })
    .with_speculation(
        board.clone(),
        voxline_pipeline::settings::DEFAULT_SPEC_SILENCE_MS,
    );
    if let Some((m, p)) = semantic {
        stage = stage.with_turn_model(m.clone(), p).unwrap();
    }
    let barge = voxline_core::BargeIn::new();
    if hearing.as_ref().is_some_and(|h| h.voice.is_some()) {
        barge.set_echo_cancelled(true);
        stage = stage.with_barge_in(barge.clone(), voxline_audio::BargeInOptions::default());
    }
    let clock = Clock::start();
    // transcripts on their way: (due at, id, words)
    let heard: std::sync::Mutex<Vec<(u64, u64, String)>> = std::sync::Mutex::new(Vec::new());
    let delay = hearing.as_ref().map(|h| h.delay);
    let voice = hearing.as_ref().and_then(|h| h.voice);
    let played = hearing.as_ref().and_then(|h| h.played);
    let hear = std::sync::Mutex::new(hearing.map(|h| h.hear));
    let (tx, rx) = voxline_core::edge::<voxline_core::Utterance>(
        "utterances",
        1_024,
        voxline_core::FullPolicy::Block,
    );
    // what the stage sent, heard, and not yet followed by the loop
    let inbox: std::sync::Mutex<Vec<voxline_core::Utterance>> = std::sync::Mutex::new(Vec::new());
    let receive = || {
        let mut got = Vec::new();
        while let Ok(e) = rx.try_recv() {
            let u = e.item;
            if board.state(u.id) != SpecState::Final {
                if let (Some(hear), Some(delay)) = (lock(&hear).as_mut(), delay) {
                    let words = hear(&u.samples);
                    lock(&heard).push((u.closed_sample + delay, u.id, words));
                }
            }
            got.push(u);
        }
        lock(&inbox).extend(got);
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // The recogniser's words are noted when the stream reaches their
        // time; a stage that blocks for an attempt's words (the stream
        // cannot move on meanwhile) has them at once, or none without
        // `hearing`: an attempt it sent in the same call is heard here.
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(id) = board.awaited() {
                    receive();
                    let mut h = lock(&heard);
                    if let Some(i) = h.iter().position(|e| e.1 == id) {
                        let (_, id, words) = h.remove(i);
                        board.note_words(id, &words);
                    } else {
                        // nothing is heard (no recogniser): done without words
                        board.note_done(id);
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        let r = stage_turns(
            audio,
            &mut stage,
            (&board, &barge),
            &clock,
            (&tx, &|| {
                receive();
                std::mem::take(&mut *lock(&inbox))
            }),
            &heard,
            voice.map(|v| (v, played)),
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    })
}

/// The loop of [`turns_heard`]: the audio through `stage`, and what it
/// sent followed on `board`.
fn stage_turns(
    audio: &[f32],
    stage: &mut VadStage,
    (board, barge): (&SpecBoard, &voxline_core::BargeIn),
    clock: &Clock,
    (tx, received): (
        &voxline_core::EdgeSender<voxline_core::Utterance>,
        &dyn Fn() -> Vec<voxline_core::Utterance>,
    ),
    heard: &std::sync::Mutex<Vec<(u64, u64, String)>>,
    voice: Option<(u64, Option<&std::sync::Mutex<Vec<u64>>>)>,
) -> (Vec<Turn>, Turns) {
    // answers due to begin playing: (stream position, turn)
    let mut answers: Vec<(u64, u64)> = Vec::new();
    let mut padded = audio.to_vec();
    padded.extend(std::iter::repeat_n(0.0, 48_000));
    let (mut out, mut pending) = (Vec::new(), Vec::new());
    // released turns, by id: (end, released at)
    let mut shown = std::collections::BTreeMap::new();
    let mut merged = Vec::new();
    let mut decide = |pending: &mut Vec<(u64, u64, u64)>, pos: u64, out: &mut Vec<Turn>| {
        pending.retain(|&(id, start, end)| match board.state(id) {
            SpecState::Committed => {
                let (end, closed) = shown.remove(&id).unwrap_or((end, pos));
                out.push(Turn { end, closed, start });
                false
            }
            SpecState::Released => {
                shown.entry(id).or_insert((end, pos));
                true
            }
            SpecState::Cancelled => {
                merged.extend(shown.remove(&id));
                false
            }
            _ => true,
        });
    };
    let mut take = |pending: &mut Vec<(u64, u64, u64)>, out: &mut Vec<Turn>, pos: u64| {
        for u in received() {
            match board.state(u.id) {
                SpecState::Final => out.push(Turn {
                    end: u.end_sample,
                    closed: u.closed_sample,
                    start: u.start_sample,
                }),
                _ => pending.push((u.id, u.start_sample, u.end_sample)),
            }
        }
        lock(heard).retain(|(due, id, words)| {
            if *due <= pos {
                board.note_words(*id, words);
                if let Some((v, _)) = voice {
                    answers.push((due + v, *id));
                }
            }
            *due > pos
        });
        // the voice begins an answer once it is due and the turn is not
        // held (a cancelled one never plays)
        answers.retain(|&(due, id)| match board.state(id) {
            SpecState::Cancelled => false,
            SpecState::Released | SpecState::Committed if due <= pos => {
                barge.set_playing(Some(id));
                if let Some(played) = voice.and_then(|v| v.1) {
                    lock(played).push(pos);
                }
                false
            }
            _ => true,
        });
    };
    for (i, c) in padded.chunks(320).enumerate() {
        let start = (i * 320) as u64;
        let frame = replay_frame(i, 320, c, clock);
        stage
            .process(frame, &mut Emitter::to_edge(tx, None))
            .unwrap();
        let pos = start + c.len() as u64;
        take(&mut pending, &mut out, pos);
        decide(&mut pending, pos, &mut out);
    }
    stage.finish(&mut Emitter::to_edge(tx, None)).unwrap();
    let end = padded.len() as u64;
    take(&mut pending, &mut out, end);
    decide(&mut pending, end, &mut out);
    out.sort_unstable();
    (out, merged)
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The gaps between the two sentences of a pair, ms.
pub const PAIR_GAPS_MS: [u32; 3] = [1_000, 1_200, 1_500];

/// Two complete sentences said one after the other.
#[derive(Debug, Clone)]
pub struct PairClip {
    /// `<first>+<second>-g<ms>`.
    pub name: String,
    /// `human` or `piper`.
    pub kind: &'static str,
    /// 16 kHz mono audio.
    pub audio: Vec<f32>,
    /// Each sentence's first and one-past-last speech sample.
    pub speech: [(usize, usize); 2],
}

/// Pairs of `sentences` of the same kind (each with the next, the last
/// with the first), joined at each gap of [`PAIR_GAPS_MS`]: the first
/// sentence up to the end of its speech, a silence of the gap at the
/// background level, the second from the start of its speech.
pub fn pairs(sentences: &[Sentence]) -> Vec<PairClip> {
    let mut out = Vec::new();
    for kind in ["human", "piper"] {
        let same: Vec<&Sentence> = sentences.iter().filter(|s| s.kind == kind).collect();
        if same.len() < 2 {
            continue;
        }
        for (i, a) in same.iter().enumerate() {
            let b = same[(i + 1) % same.len()];
            let mut joined = a.audio[..a.speech.1].to_vec();
            joined.extend_from_slice(&b.audio[b.speech.0..]);
            for (k, gap) in PAIR_GAPS_MS.into_iter().enumerate() {
                let len = gap as usize * RATE / 1000;
                let second = a.speech.1 + len;
                out.push(PairClip {
                    name: format!("{}+{}-g{gap}", a.name, b.name),
                    kind,
                    audio: insert(&joined, a.speech.1, len, (i * 3 + k) as u32),
                    speech: [a.speech, (second, second + b.speech.1 - b.speech.0)],
                });
            }
        }
    }
    out
}
