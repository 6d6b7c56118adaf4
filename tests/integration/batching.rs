//! Many conversations on one context (continuous batching), on the real model.

use voxline_llm::batch::{BatchEngine, StepEvent};
use voxline_llm::{LlmModel, Stop};

use crate::util;

const QUESTIONS: &[&str] = util::QUESTIONS;

fn config() -> voxline_llm::LlmConfig {
    let mut c = util::settings(24).llm_config().expect("llama.cpp settings");
    c.n_ctx = 512;
    c
}

/// A finished answer: its text, tokens sampled, why it stopped.
type Answer = (String, u32, Stop);

/// Steps until no session is busy; the answers by session, and the steps taken.
fn run_to_end(engine: &mut BatchEngine<'_>) -> (Vec<Option<Answer>>, usize) {
    let mut done = vec![None; engine.sessions()];
    let mut steps = 0;
    while engine.busy() > 0 {
        for ev in engine.step().unwrap() {
            if let StepEvent::Done {
                session,
                text,
                n_sampled,
                stop,
            } = ev
            {
                assert!(done[session].is_none(), "session {session} finished twice");
                done[session] = Some((text, n_sampled, stop));
            }
        }
        steps += 1;
        assert!(steps < 1000, "no end");
    }
    (done, steps)
}

#[test]
fn eight_sessions_are_answered_at_once_each_its_own_question() {
    let _g = util::engine_lock();
    let config = config();
    let model = LlmModel::load(config).unwrap();
    let mut engine = BatchEngine::new(&model, 8).unwrap();
    for (i, q) in QUESTIONS.iter().take(8).enumerate() {
        engine.start(i, q).unwrap();
    }
    assert!(
        engine.start(0, "again?").is_err(),
        "one turn at a time per session"
    );
    let (done, steps) = run_to_end(&mut engine);
    let sampled: u32 = done.iter().flatten().map(|d| d.1).sum();
    for (i, d) in done.iter().enumerate() {
        let (text, _, _) = d
            .as_ref()
            .unwrap_or_else(|| panic!("session {i} never finished"));
        assert!(!text.is_empty(), "session {i}: empty answer");
        assert_eq!(engine.history_len(i), 1);
    }
    assert!(
        done[0].as_ref().unwrap().0.contains("Paris"),
        "{:?}",
        done[0]
    );
    // one decode advanced every session: steps follow the longest answer, not the sum
    let longest = done.iter().flatten().map(|d| d.1).max().unwrap() as usize;
    assert!(
        steps <= longest + 1,
        "{steps} steps for answers of at most {longest} tokens"
    );
    assert!(
        steps * 3 < sampled as usize,
        "{steps} steps for {sampled} tokens"
    );
}

#[test]
fn a_turn_joins_the_running_batch_and_a_cancelled_one_leaves_it_untouched() {
    let _g = util::engine_lock();
    let config = config();
    let model = LlmModel::load(config).unwrap();
    let mut engine = BatchEngine::new(&model, 3).unwrap();
    engine
        .start(0, "Tell me a long story about a dragon.")
        .unwrap();
    engine.start(1, "Name a planet.").unwrap();
    for _ in 0..3 {
        engine.step().unwrap();
    }
    // a new turn joins while the others generate
    engine.start(2, QUESTIONS[0]).unwrap();
    let events = engine.step().unwrap();
    assert!(engine.is_busy(2));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, StepEvent::Token { session: 2, .. }))
            || engine.is_busy(2)
    );
    // the story is cancelled mid-answer: it leaves, the others go on
    engine.cancel(0).unwrap();
    assert!(!engine.is_busy(0));
    let (done, _) = run_to_end(&mut engine);
    assert!(done[0].is_none(), "a cancelled turn does not finish");
    assert_eq!(engine.history_len(0), 0, "nor is it remembered");
    assert!(
        done[2].as_ref().unwrap().0.contains("Paris"),
        "{:?}",
        done[2]
    );
    // the cancelled session is usable again, from its state before the turn
    engine.start(0, QUESTIONS[0]).unwrap();
    let (done, _) = run_to_end(&mut engine);
    assert!(
        done[0].as_ref().unwrap().0.contains("Paris"),
        "{:?}",
        done[0]
    );
    assert_eq!(engine.history_len(0), 1);
    assert!(engine.start(7, "no such session").is_err());
}
