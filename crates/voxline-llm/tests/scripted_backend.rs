//! A second chat backend, deterministic and scripted, plugged into the one
//! language-model stage: it gets speculation (its conversation rolled back
//! when an attempt is cancelled mid-answer), cancellation (a stop ends the
//! answer at the next token) and the runtime's metrics (spans, the thread
//! meter), with no stage code of its own.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use voxline_core::{
    edge, Clock, FullPolicy, Pipeline, ShutdownHandle, SpecBoard, ThreadMeter, Transcript,
};
use voxline_llm::{
    ChatBackend, LlmCounters, LlmError, LlmOut, Response, RunningLlmStage, Stop, TurnComplete,
};

/// Answers "you said: WORDS", one word per token, remembering each turn.
struct Scripted {
    history: Vec<String>,
    log: Arc<Mutex<Vec<String>>>,
    /// Time between tokens.
    pace: Duration,
}

impl ChatBackend for Scripted {
    type Checkpoint = Vec<String>;

    fn respond(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Response, LlmError> {
        self.log.lock().unwrap().push(format!("respond {user}"));
        let answer = format!("you said: {user}");
        let mut text = String::new();
        let mut stop = Stop::EndOfGeneration;
        let mut n = 0;
        for word in answer.split_inclusive(' ') {
            std::thread::sleep(self.pace);
            text.push_str(word);
            n += 1;
            if !on_token(word) {
                stop = Stop::Cancelled;
                break;
            }
        }
        self.history.push(user.to_owned());
        Ok(Response {
            text: text.trim().to_owned(),
            n_prompt_tokens: u32::try_from(self.history.len()).unwrap(),
            n_prefill_tokens: 0,
            n_sampled: n,
            n_streamed: n,
            stop,
            dropped_turns: 0,
            engine: LlmCounters::default(),
            server: None,
        })
    }

    fn can_roll_back(&self) -> bool {
        true
    }

    fn checkpoint(&mut self) -> Option<Vec<String>> {
        self.log.lock().unwrap().push("checkpoint".into());
        Some(self.history.clone())
    }

    fn rollback(&mut self, checkpoint: Vec<String>) -> Result<(), LlmError> {
        self.log.lock().unwrap().push("rollback".into());
        self.history = checkpoint;
        Ok(())
    }

    fn adapt_threads(&mut self) -> Result<usize, LlmError> {
        Ok(1)
    }
}

fn transcript(id: u64, text: &str) -> Transcript {
    Transcript {
        id,
        text: text.into(),
        heard: voxline_core::Heard::Words,
        n_tokens: 3,
        audio_ms: 1000.0,
        start_sample: 0,
        end_sample: 16_000,
        end_wall: Instant::now(),
    }
}

#[test]
fn a_scripted_backend_gets_speculation_cancellation_and_metrics_from_the_one_stage() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let backend = Scripted {
        history: Vec::new(),
        log: Arc::clone(&log),
        pace: Duration::from_millis(20),
    };
    let board = SpecBoard::new();
    let stop = ShutdownHandle::new();
    let meter = ThreadMeter::new();
    let mut p = Pipeline::builder(Clock::start())
        .speculation(board.clone())
        .cancel_calls_on(stop.clone())
        .meter(meter.clone())
        .build();
    let (tx, rx) = edge::<Transcript>("transcripts", 4, FullPolicy::Block);
    let (out_tx, out_rx) = edge::<LlmOut>("responses", 1024, FullPolicy::Block);
    p.spawn_stage(RunningLlmStage::new(backend), rx, out_tx)
        .unwrap();
    let (done_tx, done) = std::sync::mpsc::channel::<TurnComplete>();
    let (cancel, halt) = (board.clone(), stop.clone());
    p.spawn_sink("sink", out_rx, move |env| {
        match env.item {
            // attempt 1 is cancelled the moment its first token is out: mid-answer
            LlmOut::Token(t) if t.id == 1 && t.index == 0 => cancel.cancel(1),
            // turn 3 is stopped mid-answer (Ctrl-C)
            LlmOut::Token(t) if t.id == 3 && t.index == 1 => halt.request(),
            LlmOut::Done(d) => done_tx.send(d).unwrap(),
            LlmOut::Token(_) => {}
        }
        Ok(())
    })
    .unwrap();
    board.start(1);
    tx.send(transcript(1, "tell me a short fact")).unwrap();
    tx.send(transcript(2, "what is the capital of France"))
        .unwrap();
    let two = done.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(two.id, 2, "the cancelled attempt is never answered");
    assert_eq!(two.response, "you said: what is the capital of France");
    assert_eq!(two.stop, Stop::EndOfGeneration);
    // the attempt's turn was rolled back before turn 2: only turn 2 is remembered
    assert_eq!(two.n_prompt_tokens, 1, "history after turn 2: one turn");
    tx.send(transcript(3, "count from one to ten slowly"))
        .unwrap();
    let three = done.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((three.id, three.stop), (3, Stop::Cancelled));
    // stopped at the next token after the stop (the sink hears token 1 a
    // little after it is out)
    assert!(
        three.response.starts_with("you said:")
            && three.response.len() < "you said: count from one to ten slowly".len(),
        "{}",
        three.response
    );
    drop(tx);
    let outcome = p.join();
    assert!(outcome.failed.is_none(), "{:?}", outcome.failed);
    let calls: Vec<String> = log.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            "checkpoint",
            "respond tell me a short fact",
            "rollback",
            "respond what is the capital of France",
            "respond count from one to ten slowly",
        ]
    );
    // the runtime timed every call and counted the backend's thread
    let spans: Vec<_> = outcome
        .spans_of("llm")
        .filter(|s| s.utterance.is_some())
        .collect();
    assert_eq!(spans.len(), 3, "{spans:?}");
    assert!(spans.iter().all(|s| s.busy() > Duration::ZERO));
    assert_eq!(spans[1].emitted, 9, "eight words and the turn's end");
    assert_eq!(meter.peak(), 1);
    assert_eq!(meter.running(), 0);
}
