//! The echo canceller: what it costs, what it does to speech, and whether
//! the assistant talks to itself over a loudspeaker.
//!
//! `cargo bench --bench echo` (optimised build; needs `voxline models
//! fetch`, and for the live part PulseAudio as the live tests do). Parts,
//! chosen with `VOXLINE_BENCH_PARTS` (default `cost,noise,live,barge`):
//!
//! - **cost**: the `aec` stage over 60 s of double talk (the fixtures'
//!   espeak-ng story as the loudspeaker through a simulated room, a human
//!   recording over it), in ms of one core per second of audio, with and
//!   without the noise suppressor.
//! - **noise**: every recording in `audio-fixtures/human` (and
//!   `VOXLINE_HUMAN_DIR`) as recorded and with noise added at 10 and 0 dB
//!   SNR (white, a fan, babble made of the other recordings), through the
//!   stage with no far end, the noise suppressor off and on; whisper's word
//!   error rate, pooled (all edits over all the words said).
//! - **live**: `voxline live --voice V` on a private PulseAudio whose
//!   voice sink reaches the microphone through a loopback (40 ms, `D` dB),
//!   and without one. `VOXLINE_BENCH_ANSWERS` (20) questions, the human
//!   recordings in turn, each played once the previous answer has been
//!   silent 1.5 s: nothing but the assistant's own voice sounds while it
//!   speaks. Counts answers cut (the voice stopped with nobody talking),
//!   false interruptions (paused and resumed), phantom turns (made of the
//!   assistant's own words), echo utterances the guard dropped, and the
//!   questions' word error rate (pooled: all edits over all words asked). `VOXLINE_BENCH_VOICES` (`espeak,piper`),
//!   `VOXLINE_BENCH_ECHO_DB` (`none,-12,-6`), `VOXLINE_BENCH_AEC` (`on`;
//!   `off` adds `--no-aec`).
//! - **barge**: the same sessions (`VOXLINE_BENCH_ECHO_DB` default
//!   `-12,-6`), `VOXLINE_BENCH_ANSWERS` (10) times: a story asked for, and
//!   1 s into its spoken answer a human recording's sentence played over
//!   it. Counts the answers stopped, the questions answered, the
//!   conversations that kept what was heard of the story (the language
//!   model's log), and the barge-in latency (the user's speech start → the
//!   voice silent at the device, from the report).

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

#[path = "../tests/integration/pulse.rs"]
#[allow(dead_code)] // the live tests use the rest
mod pulse;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use voxline_audio::{AecMeter, AecOptions, AecStage, EchoReference};
use voxline_core::AudioFrame;
use voxline_stt::{normalise, word_error_rate, SttConfig, SttEngine};

const RATE: f64 = 16_000.0;

fn env_list(key: &str, default: &str) -> Vec<String> {
    std::env::var(key)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The human recordings: name, samples, what was said in them, and path.
fn human() -> Vec<(String, Vec<f32>, String, PathBuf)> {
    let mut dirs = vec![util::fixture("human")];
    if let Some(d) = std::env::var_os("VOXLINE_HUMAN_DIR") {
        dirs.push(PathBuf::from(d));
    }
    let mut out = Vec::new();
    for dir in dirs {
        for p in util::wavs_in(&dir) {
            let Ok(Some(sc)) = voxline_pipeline::sidecar::Sidecar::load_for(&p) else {
                continue;
            };
            let said: Vec<String> = sc.turns.iter().map(|t| t.text.clone()).collect();
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            out.push((name, util::read_16k(&p), said.join(" "), p));
        }
    }
    out
}

/// `mic` through a fresh canceller, 20 ms frames as the capture sends
/// them, `far` (what the loudspeaker played from the first sample on)
/// known in full beforehand. Returns the output and the time it took
/// (on one thread).
fn cancel(mic: &[f32], far: &[f32], options: AecOptions) -> (Vec<f32>, Duration) {
    let reference = EchoReference::new();
    let t0 = Instant::now();
    for (i, block) in far.chunks(160).enumerate() {
        reference.push(t0 + Duration::from_secs_f64(i as f64 * 0.01), block, 16_000);
    }
    let mut stage = AecStage::new(reference, AecMeter::default(), options);
    let frames = mic.chunks(320).enumerate().map(|(n, c)| AudioFrame {
        start_sample: (n * 320) as u64,
        samples: c.to_vec(),
        captured: t0 + Duration::from_secs_f64((n * 320) as f64 / RATE),
        new_recording: n == 0,
        end_of_stream: false,
    });
    let frames: Vec<AudioFrame> = frames.collect();
    let t = Instant::now();
    let out = voxline_core::drive(&mut stage, frames).expect("the canceller runs");
    let took = t.elapsed();
    (out.into_iter().flat_map(|f| f.samples).collect(), took)
}

/// What a microphone hears of `far` through a room: `gain`, 60 ms late,
/// with a reflection 15 ms after that at 0.4 of it.
fn room(far: &[f32], gain: f32, len: usize) -> Vec<f32> {
    let mut echo = vec![0.0f32; len];
    for (i, x) in far.iter().enumerate() {
        for (d, g) in [(960, gain), (1200, 0.4 * gain)] {
            if let Some(e) = echo.get_mut(i + d) {
                *e += g * x;
            }
        }
    }
    echo
}

fn cost() {
    let story = util::read_16k(&util::fixture("q_story.wav"));
    let person = util::read_16k(&util::fixture("human/arctic-a0024.wav"));
    let secs = 60usize;
    let len = secs * 16_000;
    let far: Vec<f32> = story.iter().cycle().take(len).copied().collect();
    let echo = room(&far, 0.5, len);
    let mut mic = echo.clone();
    for (i, m) in mic.iter_mut().enumerate() {
        *m += person[i % person.len()];
    }
    println!("\n| canceller | CPU ms per s of audio (one core) | real-time factor |");
    println!("|---|---|---|");
    for ns in [false, true] {
        // the best of three, on this shared machine
        let took = (0..3)
            .map(|_| {
                cancel(
                    &mic,
                    &far,
                    AecOptions {
                        noise_suppression: ns,
                    },
                )
                .1
            })
            .min()
            .unwrap();
        let ms = took.as_secs_f64() * 1000.0 / secs as f64;
        println!(
            "| AEC3 + high-pass{} | {ms:.2} | {:.0}× |",
            if ns { " + noise suppression" } else { "" },
            1000.0 / ms
        );
    }
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|s| s * s).sum::<f32>() / x.len().max(1) as f32).sqrt()
}

/// `speech` with `noise` added at `snr` dB (by the speech's RMS over the
/// whole clip).
fn mixed(speech: &[f32], noise: &[f32], snr: f32) -> Vec<f32> {
    let g = rms(speech) / rms(noise).max(1e-9) / 10f32.powf(snr / 20.0);
    speech
        .iter()
        .zip(noise.iter().cycle())
        .map(|(s, n)| s + g * n)
        .collect()
}

fn noise_wer() {
    let clips = human();
    let mut stt = SttEngine::load(SttConfig::new(util::whisper_model(), util::threads_each()))
        .expect("the whisper model (voxline models fetch)");
    let longest = clips.iter().map(|c| c.1.len()).max().unwrap_or(0);
    let mut w = util::noise(7);
    let white_noise: Vec<f32> = (0..longest).map(|_| w() as f32).collect();
    let mut w = util::noise(11);
    let mut brown = 0.0f32;
    let fan: Vec<f32> = (0..longest)
        .map(|_| {
            brown = (brown + 0.05 * w() as f32) * 0.995;
            brown
        })
        .collect();
    let noises = [white_noise, fan];
    // babble: the other recordings, three at once
    let babble = |skip: usize| -> Vec<f32> {
        let mut b = vec![0.0f32; longest];
        for (k, c) in clips.iter().enumerate().filter(|(k, _)| *k != skip).take(3) {
            for (i, x) in b.iter_mut().enumerate() {
                *x += c.1[(i + k * 7_919) % c.1.len()];
            }
        }
        b
    };
    let conditions: Vec<(String, Option<(usize, f32)>)> = std::iter::once(("clean".into(), None))
        .chain(
            [10.0f32, 0.0]
                .iter()
                .flat_map(|snr| (0..3).map(move |k| (k, *snr)))
                .map(|(k, snr)| {
                    let name = ["white", "fan", "babble"][k];
                    (format!("{name} at {snr:+} dB SNR"), Some((k, snr)))
                }),
        )
        .collect();
    println!("\n| recording | as heard | canceller | canceller + noise suppression |");
    println!("|---|---|---|---|");
    for (condition, how) in conditions {
        let mut sums = [0.0f64; 3];
        let mut words = 0.0;
        for (ci, (name, speech, said, _)) in clips.iter().enumerate() {
            words += normalise(said).len() as f64;
            let mic = match how {
                None => speech.clone(),
                Some((2, snr)) => mixed(speech, &babble(ci), snr),
                Some((k, snr)) => mixed(speech, &noises[k], snr),
            };
            let outs = [
                mic.clone(),
                cancel(&mic, &[], AecOptions::default()).0,
                cancel(
                    &mic,
                    &[],
                    AecOptions {
                        noise_suppression: true,
                    },
                )
                .0,
            ];
            for (s, out) in sums.iter_mut().zip(&outs) {
                let t = stt.transcribe(out).expect("transcribes");
                let wer = word_error_rate(said, &t.text);
                if std::env::var_os("VOXLINE_BENCH_VERBOSE").is_some() {
                    eprintln!("{condition} {name}: {wer:.3} {:?}", t.text);
                }
                *s += wer * normalise(said).len() as f64;
            }
        }
        let n = words.max(1.0);
        println!(
            "| {condition} | {:.3} | {:.3} | {:.3} |",
            sums[0] / n,
            sums[1] / n,
            sums[2] / n
        );
    }
}

/// One question of a live run: what was said in it, and the turns
/// transcribed from when it was played until the next was (the answer's
/// echo included).
struct Asked {
    said: String,
    turns: Vec<u64>,
}

/// What one live run showed.
#[derive(Default)]
struct Live {
    answers: usize,
    cut: usize,
    phantom: usize,
    extra_turns: usize,
    echoes: u64,
    false_interruptions: u64,
    wer: f64,
    words: f64,
    erle: Option<f64>,
    delay: Option<i64>,
}

/// Called once the question has played: waits until an answer has played
/// to its end or was stopped (the event log's `voice_ended` or
/// `voice_interrupted`, after the question: an answer stopped while it
/// still played was to its first words, "one … two, three"), and every
/// turn transcribed meanwhile has been answered too, then until the
/// voice's sink has been silent for a second;
/// false when no answer ended within 60 s. The ids of the turns
/// transcribed meanwhile go to `turns`.
fn answer_played(
    events: &std::sync::mpsc::Receiver<serde_json::Value>,
    heard: &std::sync::mpsc::Receiver<(Instant, Vec<u8>)>,
    turns: &mut Vec<u64>,
) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    // the turns transcribed whose answer has not ended yet
    let mut open = std::collections::HashSet::new();
    let mut any = false;
    // what came while the question played, then what comes after it
    let mut during: std::collections::VecDeque<_> = events.try_iter().collect();
    let ended = loop {
        if any && open.is_empty() {
            break true;
        }
        let (e, after) = match during.pop_front() {
            Some(e) => (e, false),
            None => match events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(e) => (e, true),
                Err(_) => break false,
            },
        };
        let id = e["id"].as_u64();
        match e["type"].as_str().unwrap_or_default() {
            "voice_ended" | "voice_interrupted" => {
                any |= after;
                open.remove(&id.unwrap_or_default());
            }
            "transcript" => {
                turns.extend(id);
                // an annotation (noise, echo, a backchannel) is answered by nothing
                if !e["text"].as_str().unwrap_or_default().starts_with('[') {
                    open.extend(id);
                }
            }
            // taken back into the next turn, failed, or answered with
            // nothing to say
            "turn_merged" | "turn_error" => {
                open.remove(&id.unwrap_or_default());
            }
            "turn_complete" if e["response"].as_str().is_some_and(str::is_empty) => {
                open.remove(&id.unwrap_or_default());
            }
            _ => {}
        }
    };
    quiet_for(heard, Duration::from_secs(1), deadline);
    ended
}

/// Reads the voice's sink until it has been silent for `quiet` (or until
/// `deadline`), leaving nothing older unread.
fn quiet_for(
    heard: &std::sync::mpsc::Receiver<(Instant, Vec<u8>)>,
    quiet: Duration,
    deadline: Instant,
) {
    let mut last_loud = Instant::now();
    loop {
        for (at, bytes) in heard.try_iter() {
            if pulse::is_loud(&bytes) {
                last_loud = at;
            }
        }
        if last_loud.elapsed() >= quiet || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The words of `text` found among `among`, as a fraction of its words.
fn words_from(text: &str, among: &[String]) -> f64 {
    let said: std::collections::HashSet<String> = among.iter().flat_map(|a| normalise(a)).collect();
    let words = normalise(text);
    if words.is_empty() {
        return 0.0;
    }
    words.iter().filter(|w| said.contains(*w)).count() as f64 / words.len() as f64
}

/// `voxline live --voice V` on a private PulseAudio with an echo path at
/// `db` (none: no path), its event log read as it is written, and an
/// outside recorder on the voice's sink.
struct Session {
    pulse: pulse::Pulse,
    report: PathBuf,
    vox: std::process::Child,
    err_thread: std::thread::JoinHandle<String>,
    events: std::sync::mpsc::Receiver<serde_json::Value>,
    log: std::thread::JoinHandle<Vec<String>>,
    rec: std::process::Child,
    heard: std::sync::mpsc::Receiver<(Instant, Vec<u8>)>,
}

impl Session {
    fn start(voice: &str, db: Option<f64>, aec: bool, max_tokens: &str) -> Session {
        let pulse = match db {
            Some(db) => pulse::with_an_echo_path(db),
            None => pulse::Pulse::start_with_output(),
        };
        let dir = pulse.dir.path().to_path_buf();
        let report = dir.join("report.json");
        // the event log, read as it is written
        let fifo = dir.join("events.fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
        let (event_tx, events) = std::sync::mpsc::channel::<serde_json::Value>();
        let log = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut all = Vec::new();
                let f = std::fs::File::open(&fifo).expect("the event log opens");
                for line in
                    std::io::BufRead::lines(std::io::BufReader::new(f)).map_while(Result::ok)
                {
                    if let Ok(e) = serde_json::from_str::<serde_json::Value>(&line) {
                        let _ = event_tx.send(e);
                    }
                    all.push(line);
                }
                all
            })
        };
        let mut args = vec![
            "--voice",
            voice,
            "--max-duration",
            "30m",
            "--max-tokens",
            max_tokens,
        ];
        if !aec {
            args.push("--no-aec");
        }
        let (vox, err_thread) = pulse::speaking_live(&pulse, &args, &report, Some(&fifo));
        let mut rec = pulse::recorder(&pulse, "voxout.monitor");
        let heard = pulse::live_reader(rec.stdout.take().unwrap());
        std::thread::sleep(Duration::from_millis(800));
        Session {
            pulse,
            report,
            vox,
            err_thread,
            events,
            log,
            rec,
            heard,
        }
    }

    /// Ends the session (Ctrl-C): its report, the event log's lines, its
    /// stderr, and the events not read yet.
    fn end(
        mut self,
    ) -> (
        serde_json::Value,
        Vec<String>,
        String,
        Vec<serde_json::Value>,
    ) {
        std::thread::sleep(Duration::from_secs(2));
        let _ = std::process::Command::new("kill")
            .args(["-INT", &self.vox.id().to_string()])
            .status();
        let out = self.vox.wait_with_output().unwrap();
        let err = self.err_thread.join().unwrap();
        if std::env::var_os("VOXLINE_BENCH_VERBOSE").is_some()
            && std::env::var_os("VOXLINE_LOG").is_some()
        {
            eprintln!("{err}");
        }
        let _ = self.rec.kill();
        let _ = self.rec.wait();
        assert_eq!(out.status.code(), Some(0), "{err}");
        let log = self.log.join().unwrap();
        let rest = self.events.try_iter().collect();
        if std::env::var_os("VOXLINE_BENCH_VERBOSE").is_some() {
            for l in log.iter().filter(|l| {
                ["\"transcript\"", "\"voice_", "\"echo", "\"turn_merged\""]
                    .iter()
                    .any(|k| l.contains(k))
            }) {
                eprintln!("{l}");
            }
        }
        (util::read_json(&self.report), log, err, rest)
    }
}

fn live_run(voice: &str, db: Option<f64>, aec: bool, n: usize) -> Live {
    let clips = human();
    let session = Session::start(voice, db, aec, "40");
    let mut asked = Vec::new();
    for (name, _, said, path) in clips.iter().cycle().take(n) {
        let mut turns = Vec::new();
        session.pulse.play(path);
        if !answer_played(&session.events, &session.heard, &mut turns) {
            eprintln!("{voice}: no answer ended within 60 s of {name}");
        }
        std::thread::sleep(Duration::from_millis(300));
        asked.push(Asked {
            said: said.clone(),
            turns,
        });
    }
    let (r, _, _, rest) = session.end();
    // what came after the last answer ended
    if let Some(last) = asked.last_mut() {
        last.turns.extend(
            rest.iter()
                .filter(|e| e["type"] == "transcript")
                .filter_map(|e| e["id"].as_u64()),
        );
    }
    let turns = r["turns"].as_array().cloned().unwrap_or_default();
    let mut live = Live {
        echoes: r["summary"]["echoes"].as_u64().unwrap_or(0),
        false_interruptions: r["summary"]["false_interruptions"].as_u64().unwrap_or(0),
        erle: r["live"]["voice_output"]["echo_cancellation"]["erle_db"].as_f64(),
        delay: r["live"]["voice_output"]["echo_cancellation"]["delay_ms"].as_i64(),
        ..Live::default()
    };
    let mut responses: Vec<String> = Vec::new();
    for q in &asked {
        let mine: Vec<&serde_json::Value> = turns
            .iter()
            .filter(|t| !t["non_speech"].as_bool().unwrap_or(false))
            .filter(|t| t["id"].as_u64().is_some_and(|id| q.turns.contains(&id)))
            .collect();
        let mut text = Vec::new();
        for t in &mine {
            let transcript = t["transcript"].as_str().unwrap_or("");
            // made of what the assistant said before, and not of the question
            if words_from(transcript, &responses) >= 0.6
                && words_from(transcript, std::slice::from_ref(&q.said)) < 0.5
            {
                live.phantom += 1;
                eprintln!("{voice} {db:?}: phantom turn {transcript:?}");
                continue;
            }
            if !text.is_empty() {
                live.extra_turns += 1;
            }
            text.push(transcript.to_owned());
            if t["response"].is_string() {
                live.answers += 1;
            }
            if !t["voice_heard"].is_null() {
                live.cut += 1;
                eprintln!("{voice} {db:?}: answer cut: {}", t["voice_heard"]);
            }
            responses.extend(t["response"].as_str().map(str::to_owned));
        }
        let wer = word_error_rate(&q.said, &text.join(" "));
        if std::env::var_os("VOXLINE_BENCH_VERBOSE").is_some() {
            eprintln!("asked {:?}; heard {text:?} (WER {wer:.2})", q.said);
        }
        // pooled: every edit over every word asked
        let words = normalise(&q.said).len() as f64;
        live.wer += wer * words;
        live.words += words;
    }
    live.wer /= live.words.max(1.0);
    live
}

/// What talking over the voice showed, over one session.
#[derive(Default)]
struct Barge {
    /// Stories that had ended 1 s into them: no question played over them.
    not_over: usize,
    stopped: usize,
    answered: usize,
    kept: usize,
    latencies: Vec<f64>,
    echoes: u64,
    false_interruptions: u64,
    erle: Option<f64>,
}

/// `n` times: ask for a story, and 1 s into its spoken answer ask one of
/// the human recordings' sentences over it; then wait for that answer.
fn barge_run(voice: &str, db: Option<f64>, aec: bool, n: usize) -> Barge {
    let clips = human();
    let session = Session::start(voice, db, aec, "120");
    let mut b = Barge::default();
    // the voice's events, to tell what a slow barge-in did
    let mut voiced: Vec<serde_json::Value> = Vec::new();
    for (name, _, _, path) in clips.iter().cycle().take(n) {
        session.pulse.play(&util::fixture("q_story.wav"));
        // what sounded before the story's answer is not its first sound
        let _ = session.heard.try_iter().count();
        let deadline = Instant::now() + Duration::from_secs(30);
        let answer_from = loop {
            match session.heard.recv_timeout(Duration::from_millis(200)) {
                Ok((at, bytes)) if pulse::is_loud(&bytes) => break Some(at),
                _ if Instant::now() > deadline => break None,
                _ => {}
            }
        };
        let Some(answer_from) = answer_from else {
            eprintln!("{voice}: the story was never told");
            continue;
        };
        std::thread::sleep(Duration::from_secs(1).saturating_sub(answer_from.elapsed()));
        // the story still sounds: something loud within the last 300 ms
        let sounding = session
            .heard
            .try_iter()
            .any(|(at, bytes)| at.elapsed() < Duration::from_millis(300) && pulse::is_loud(&bytes));
        if !sounding {
            eprintln!("{voice}: the story had ended 1 s into it; {name} not played over it");
            b.not_over += 1;
            let _ = answer_played(&session.events, &session.heard, &mut Vec::new());
            continue;
        }
        session.pulse.play(path);
        // the question's answer played to its end: a `voice_ended` of a
        // turn whose answer was not stopped
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut stopped = Vec::new();
        loop {
            match session
                .events
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(e) if e["type"] == "voice_interrupted" => {
                    stopped.extend(e["id"].as_u64());
                    voiced.push(e);
                }
                Ok(e) if e["type"] == "voice_resumed" => voiced.push(e),
                Ok(e)
                    if e["type"] == "voice_ended"
                        && e["id"].as_u64().is_some_and(|id| !stopped.contains(&id)) =>
                {
                    break
                }
                Ok(_) => {}
                Err(_) => {
                    eprintln!("{voice}: no answer ended within 60 s of {name} over the story");
                    break;
                }
            }
        }
        quiet_for(
            &session.heard,
            Duration::from_secs(1),
            Instant::now() + Duration::from_secs(60),
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let (r, _, err, _) = session.end();
    let turns = r["turns"].as_array().cloned().unwrap_or_default();
    b.echoes = r["summary"]["echoes"].as_u64().unwrap_or(0);
    if std::env::var_os("VOXLINE_BENCH_VERBOSE").is_some() {
        for t in &turns {
            let answer: String = t["response"]
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(40)
                .collect();
            eprintln!(
                "{voice}: turn {}: {:?} -> {answer:?} (heard {})",
                t["id"], t["transcript"], t["voice_heard"]
            );
        }
    }
    // what was dropped as the assistant's own voice, to tell it from a
    // question asked over the story
    for l in err.lines().filter(|l| l.contains("own voice (echo)")) {
        eprintln!("{voice}: dropped as echo: {l}");
    }
    b.false_interruptions = r["summary"]["false_interruptions"].as_u64().unwrap_or(0);
    b.erle = r["live"]["voice_output"]["echo_cancellation"]["erle_db"].as_f64();
    for (i, t) in turns.iter().enumerate() {
        let story = t["transcript"]
            .as_str()
            .is_some_and(|s| s.to_lowercase().contains("story"));
        if !story {
            continue;
        }
        if t["voice_heard"].is_null() {
            eprintln!("{voice}: not stopped: {t}");
        }
        if let Some(heard) = t["voice_heard"].as_str() {
            b.stopped += 1;
            b.latencies.extend(t["barge_in_ms"].as_f64());
            if t["barge_in_ms"].as_f64().is_some_and(|ms| ms > 600.0) {
                eprintln!(
                    "{voice}: turn {}: barge-in {} ms, false interruptions {}, heard {heard:?}; its voice: {:?}",
                    t["id"],
                    t["barge_in_ms"],
                    t["false_interruptions"],
                    voiced.iter().filter(|e| e["id"] == t["id"]).collect::<Vec<_>>()
                );
            }
            // the conversation keeps what was heard, marked interrupted
            let kept = err.lines().any(|l| {
                l.contains("the conversation keeps what was heard")
                    && l.contains(&format!("turn={}", t["id"]))
                    && l.contains(&format!("{heard} [interrupted]"))
            });
            b.kept += usize::from(kept);
            if !kept {
                let logged: Vec<&str> = err
                    .lines()
                    .filter(|l| l.contains("keeps what was heard"))
                    .collect();
                eprintln!(
                    "{voice}: turn {}: {heard:?} not found kept; logged: {logged:?}",
                    t["id"]
                );
            }
        }
        // the question asked over it: the next turn, answered
        let next = turns[i + 1..]
            .iter()
            .find(|n| !n["non_speech"].as_bool().unwrap_or(false));
        if next.is_some_and(|n| n["response"].as_str().is_some_and(|r| !r.is_empty())) {
            b.answered += 1;
        }
    }
    b
}

fn barge() {
    let n: usize = std::env::var("VOXLINE_BENCH_ANSWERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let aec = env_list("VOXLINE_BENCH_AEC", "on") != ["off"];
    println!(
        "\n| voice | echo | canceller | stories asked over | stopped | the question answered | history kept what was heard | barge-in p50 / max ms | echo utterances dropped | false interruptions | ERLE dB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for voice in env_list("VOXLINE_BENCH_VOICES", "espeak,piper") {
        for echo in env_list("VOXLINE_BENCH_ECHO_DB", "-12,-6") {
            let db: Option<f64> = echo.parse().ok();
            let mut b = barge_run(&voice, db, aec, n);
            b.latencies.sort_by(f64::total_cmp);
            let p50 = b.latencies.get(b.latencies.len() / 2).copied();
            println!(
                "| {voice} | {} | {} | {} of {n} | {} | {} | {} | {} / {} | {} | {} | {} |",
                db.map_or("none".into(), |d| format!("{d} dB")),
                if aec { "on" } else { "off" },
                n - b.not_over,
                b.stopped,
                b.answered,
                b.kept,
                p50.map_or("-".into(), |v| format!("{v:.0}")),
                b.latencies.last().map_or("-".into(), |v| format!("{v:.0}")),
                b.echoes,
                b.false_interruptions,
                b.erle.map_or("-".into(), |e| format!("{e:.1}")),
            );
        }
    }
}

fn live() {
    let n: usize = std::env::var("VOXLINE_BENCH_ANSWERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let aec = env_list("VOXLINE_BENCH_AEC", "on") != ["off"];
    println!(
        "\n| voice | echo | canceller | answers | cut by its own voice | false interruptions | phantom turns | echo utterances dropped | extra turns | questions' WER | ERLE dB | AEC3 delay ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for voice in env_list("VOXLINE_BENCH_VOICES", "espeak,piper") {
        for echo in env_list("VOXLINE_BENCH_ECHO_DB", "none,-12,-6") {
            let db: Option<f64> = echo.parse().ok();
            let l = live_run(&voice, db, aec, n);
            println!(
                "| {voice} | {} | {} | {} of {n} | {} | {} | {} | {} | {} | {:.3} | {} | {} |",
                db.map_or("none".into(), |d| format!("{d} dB")),
                if aec { "on" } else { "off" },
                l.answers,
                l.cut,
                l.false_interruptions,
                l.phantom,
                l.echoes,
                l.extra_turns,
                l.wer,
                l.erle.map_or("-".into(), |e| format!("{e:.1}")),
                l.delay.map_or("-".into(), |d| d.to_string()),
            );
        }
    }
}

fn main() {
    let parts = env_list("VOXLINE_BENCH_PARTS", "cost,noise,live,barge");
    for part in &parts {
        match part.as_str() {
            "cost" => cost(),
            "noise" => noise_wer(),
            "live" => live(),
            "barge" => barge(),
            other => {
                panic!("VOXLINE_BENCH_PARTS: {other:?} is not cost, noise, live or barge")
            }
        }
    }
}
