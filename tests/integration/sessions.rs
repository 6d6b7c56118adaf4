//! Many conversations on shared engines (`voxline_pipeline::sessions`), with the real
//! models and fixtures.

use std::time::{Duration, Instant};

use voxline_capacity::{play, Conversation, Local, Script};
use voxline_pipeline::pipeline::PipelineConfig;
use voxline_pipeline::sessions::{Hub, HubError, Session};
use voxline_serve::protocol::ServerEvent;

use crate::util;

fn hub(sessions: usize, max_tokens: u32) -> Hub {
    let mut s = util::settings(max_tokens);
    s.llama_mut().expect("llama.cpp settings").n_ctx = 1024;
    s.threads = voxline_pipeline::settings::ThreadBudget::priority(Some(2)).unwrap();
    // the command line's defaults
    Hub::start(&s, PipelineConfig::default(), sessions).unwrap()
}

fn script(names: &[&str]) -> Script {
    let files: Vec<_> = names.iter().map(|n| util::fixture(n)).collect();
    Script::load(&files, Duration::from_millis(800)).unwrap()
}

/// Pushes `script` as fast as the session takes it, then collects every
/// event (as a client hears them) until the stream's turns are all answered.
fn run_fast(session: &Session, script: &Script) -> Vec<ServerEvent> {
    for block in script.samples.chunks(320) {
        assert!(
            session.push(block.to_vec()),
            "the audio queue refused a block"
        );
    }
    session.end_of_stream();
    let mut user = Local::new(session);
    let mut log = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ended = log
            .iter()
            .any(|e| matches!(e, ServerEvent::StreamEnd { .. }));
        let heard = log
            .iter()
            .filter(|e| matches!(e, ServerEvent::Transcript { .. }))
            .count();
        let done = log
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    ServerEvent::TurnComplete { .. } | ServerEvent::TurnError { .. }
                )
            })
            .count();
        if ended && done == heard {
            return log;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no end: {log:?}");
        log.extend(user.wait_event(left).into_iter().map(|(e, _)| e));
    }
}

fn transcripts(log: &[ServerEvent]) -> Vec<String> {
    log.iter()
        .filter_map(|e| match e {
            ServerEvent::Transcript { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

fn answers(log: &[ServerEvent]) -> Vec<(u32, String)> {
    log.iter()
        .filter_map(|e| match e {
            ServerEvent::TurnComplete { id, response, .. } => Some((*id, response.clone())),
            _ => None,
        })
        .collect()
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn two_interleaved_sessions_get_exactly_their_own_transcripts_and_answers() {
    let _g = util::engine_lock();
    let hub = hub(2, 24);
    let (a, b) = (hub.join().unwrap(), hub.join().unwrap());
    assert_ne!(a.slot(), b.slot());
    let (sa, sb) = (script(&["q_capital.wav"]), script(&["multi_turn.wav"]));
    let (la, lb) = std::thread::scope(|s| {
        let ta = s.spawn(|| run_fast(&a, &sa));
        let tb = s.spawn(|| run_fast(&b, &sb));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    let wer = |heard: &[String], said: &[&str]| {
        assert_eq!(heard.len(), said.len(), "{heard:?} against {said:?}");
        heard
            .iter()
            .zip(said)
            .map(|(h, r)| voxline_stt::word_error_rate(r, h))
            .fold(0.0, f64::max)
    };
    assert_eq!(
        wer(&transcripts(&la), &["What is the capital of France?"]),
        0.0
    );
    assert_eq!(
        wer(
            &transcripts(&lb),
            &[
                "What time is it now?",
                "How many legs does a spider have?",
                "Why is the sky blue?"
            ]
        ),
        0.0
    );
    // every turn answered once, in order, nothing of the other conversation
    let (aa, ab) = (answers(&la), answers(&lb));
    assert_eq!(aa.iter().map(|x| x.0).collect::<Vec<_>>(), [1]);
    assert_eq!(ab.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(aa[0].1.contains("Paris"), "{:?}", aa[0].1);
    assert!(
        ab.iter()
            .all(|(_, t)| !t.is_empty() && !t.contains("Paris")),
        "{ab:?}"
    );
    // tokens belong to their own turn and add up to its answer
    for log in [&la, &lb] {
        for (turn, text) in answers(log) {
            let streamed: String = log
                .iter()
                .filter_map(|e| match e {
                    ServerEvent::Token { id, text, .. } if *id == turn => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(streamed.trim(), text);
        }
    }
    let totals = hub.totals();
    assert!(
        totals.peak_threads <= hub.threads(),
        "{} engine threads ran at once, budget {}",
        totals.peak_threads,
        hub.threads()
    );
    assert!(totals.llm.tokens > 0 && totals.llm.steps > 0);
    // every stage of the sessions' pipelines was observed
    for stage in ["vad", "stt", "llm"] {
        assert!(totals.stage(stage).calls > 0, "{stage}: {totals:?}");
    }
}

#[test]
fn a_session_leaving_mid_answer_frees_its_slot_and_the_other_finishes() {
    let _g = util::engine_lock();
    let hub = hub(2, 64);
    let a = hub.join().unwrap();
    let b = hub.join().unwrap();
    assert!(matches!(hub.join(), Err(HubError::Full { max: 2 })));
    let sa = script(&["q_capital.wav"]);
    let sb = script(&["multi_turn.wav"]);
    std::thread::scope(|s| {
        let tb = s.spawn(|| run_fast(&b, &sb));
        // A speaks; it leaves as soon as its answer starts streaming.
        for block in sa.samples.chunks(320) {
            a.push(block.to_vec());
        }
        a.end_of_stream();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut user = Local::new(&a);
        'answer: loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "A's answer never started");
            for (ev, _) in user.wait_event(left) {
                if matches!(ev, ServerEvent::Token { .. }) {
                    break 'answer;
                }
            }
        }
        drop(user);
        drop(a);
        let lb = tb.join().unwrap();
        assert_eq!(answers(&lb).len(), 3, "B finished every turn: {lb:?}");
        assert!(!lb
            .iter()
            .any(|e| matches!(e, ServerEvent::TurnError { .. })));
    });
    // A's slot is free again, and a newcomer gets a fresh conversation in it
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        match hub.join() {
            Ok(c) => break c,
            Err(HubError::Full { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    };
    let lc = run_fast(&c, &script(&["q_capital.wav"]));
    let ac = answers(&lc);
    assert_eq!(ac.len(), 1);
    assert!(ac[0].1.contains("Paris"), "{:?}", ac[0].1);
}

#[test]
fn a_hundred_joins_and_leaves_keep_memory_flat() {
    let _g = util::engine_lock();
    let hub = hub(2, 8);
    let speech = script(&["q_capital.wav"]);
    let cycle = |i: usize| {
        let s = hub.join().unwrap();
        if i.is_multiple_of(10) {
            // every tenth one asks a question and leaves at once (its
            // transcription, if it started, is aborted)
            for block in speech.samples.chunks(320) {
                s.push(block.to_vec());
            }
            s.end_of_stream();
        } else {
            s.push(vec![0.0; 8_000]);
        }
    };
    for i in 0..10 {
        cycle(i);
    }
    // RSS is the whole test process's, and tests without the engine lock
    // run beside this one: a leak grows it in both halves of the run, what
    // another test allocated (and the allocator kept) in one of them
    let after_ten = rss_kb();
    for i in 10..55 {
        cycle(i);
    }
    let halfway = rss_kb();
    for i in 55..100 {
        cycle(i);
    }
    let after_hundred = rss_kb();
    let mb = |from: u64, to: u64| (to as f64 - from as f64) / 1024.0;
    let (first, second) = (mb(after_ten, halfway), mb(halfway, after_hundred));
    assert!(
        first.min(second) < 8.0,
        "RSS grew {first:.1} then {second:.1} MB over two runs of 45 joins and leaves"
    );
    assert_eq!(hub.sessions(), 0);
    // the hub still serves after all that
    let s = hub.join().unwrap();
    let log = run_fast(&s, &speech);
    assert_eq!(answers(&log).len(), 1);
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn real_time_play_measures_latency_from_the_labelled_end_of_speech() {
    let _g = util::engine_lock();
    let hub = hub(1, 8);
    let s = hub.join().unwrap();
    let sc = script(&["q_capital.wav"]);
    let turns = play(Local::new(&s), &sc, Instant::now(), Duration::from_secs(60));
    assert_eq!(turns.len(), 1, "{turns:?}");
    let t = &turns[0];
    assert!(t.error.is_none(), "{t:?}");
    let r = t.response_ms.expect("a first token");
    // at least whisper's own time; well under the hangover plus a few seconds
    assert!(r >= t.stt_ms, "{r} ms < STT {} ms", t.stt_ms);
    assert!(r < 10_000.0, "{r} ms");
    assert!(t.tokens > 0);
}
