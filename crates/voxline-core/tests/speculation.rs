//! The runtime's handling of speculative attempts: cancelled inputs are
//! skipped, what a stage did for an attempt is rolled back or committed
//! once it is decided, and a stage that takes committed input only never
//! sees a pending attempt's input.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use voxline_core::{
    edge, Clock, Emitter, FullPolicy, Message, Pipeline, SpecBoard, Stage, StageError, ThreadMeter,
    UtteranceId,
};

#[derive(Debug, Clone, PartialEq)]
struct Item(UtteranceId);

impl Message for Item {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.0)
    }
}

/// Records what the runtime asked of it.
struct Recorder {
    log: Arc<Mutex<Vec<String>>>,
    committed_only: bool,
    /// Cancels this attempt while handling it (as speech resuming would).
    cancel_while_running: Option<(UtteranceId, SpecBoard)>,
}

impl Recorder {
    fn push(&self, s: String) {
        self.log.lock().unwrap().push(s);
    }
}

impl Stage for Recorder {
    type In = Item;
    type Out = Item;
    fn name(&self) -> &str {
        if self.committed_only {
            "speaker"
        } else {
            "thinker"
        }
    }
    fn threads(&mut self) -> usize {
        2
    }
    fn process(&mut self, i: Item, out: &mut Emitter<'_, Item>) -> Result<(), StageError> {
        if let Some((id, board)) = &self.cancel_while_running {
            if *id == i.0 {
                assert!(!out.input_cancelled());
                board.cancel(*id);
                assert!(out.input_cancelled(), "the call sees its input cancelled");
                assert!(out.cancel_probe().is_cancelled());
            }
        }
        self.push(format!("process {}", i.0));
        out.emit(i);
        Ok(())
    }
    fn speculate(&mut self, id: UtteranceId) {
        self.push(format!("speculate {id}"));
    }
    fn rollback(&mut self, id: UtteranceId) -> Result<(), StageError> {
        self.push(format!("rollback {id}"));
        Ok(())
    }
    fn commit(&mut self, id: UtteranceId) {
        self.push(format!("commit {id}"));
    }
    fn committed_only(&self) -> bool {
        self.committed_only
    }
}

fn run(
    stage: Recorder,
    board: &SpecBoard,
    script: impl FnOnce(&voxline_core::EdgeSender<Item>),
) -> Vec<UtteranceId> {
    let meter = ThreadMeter::new();
    let mut p = Pipeline::builder(Clock::start())
        .speculation(board.clone())
        .meter(meter.clone())
        .build();
    let (tx, rx) = edge::<Item>("in", 8, FullPolicy::Block);
    let (otx, orx) = edge::<Item>("out", 8, FullPolicy::Block);
    p.spawn_stage(stage, rx, otx).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    p.spawn_sink("sink", orx, move |e| {
        s.lock().unwrap().push(e.item.0);
        Ok(())
    })
    .unwrap();
    script(&tx);
    drop(tx);
    let outcome = p.join();
    assert!(outcome.failed.is_none());
    assert_eq!(meter.peak(), 2, "the runtime counted the stage's threads");
    assert_eq!(meter.running(), 0);
    let seen = seen.lock().unwrap().clone();
    seen
}

#[test]
fn cancelled_attempts_are_skipped_and_rolled_back_and_committed_ones_kept() {
    let board = SpecBoard::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let stage = Recorder {
        log: Arc::clone(&log),
        committed_only: false,
        cancel_while_running: Some((2, board.clone())),
    };
    let b = board.clone();
    let seen = run(stage, &board, move |tx| {
        b.start(1);
        tx.send(Item(1)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        b.commit(1);
        b.start(2); // cancelled while it runs
        tx.send(Item(2)).unwrap();
        b.start(3);
        b.cancel(3); // cancelled before it runs: skipped
        tx.send(Item(3)).unwrap();
        tx.send(Item(4)).unwrap(); // an ordinary turn
    });
    assert_eq!(
        seen,
        [1, 2, 4],
        "what a stage emitted still flows; the gate in front of sinks hides it"
    );
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            "speculate 1",
            "process 1",
            "commit 1",
            "speculate 2",
            "process 2",
            "rollback 2",
            "process 4"
        ]
    );
}

#[test]
fn a_committed_only_stage_never_sees_a_pending_or_cancelled_attempt() {
    let board = SpecBoard::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let stage = Recorder {
        log: Arc::clone(&log),
        committed_only: true,
        cancel_while_running: None,
    };
    let b = board.clone();
    let watched = Arc::clone(&log);
    let seen = run(stage, &board, move |tx| {
        b.start(1);
        tx.send(Item(1)).unwrap();
        tx.send(Item(1)).unwrap();
        std::thread::sleep(Duration::from_millis(60));
        assert!(watched.lock().unwrap().is_empty(), "held while pending");
        b.cancel(1);
        b.start(2);
        tx.send(Item(2)).unwrap();
        tx.send(Item(7)).unwrap(); // behind the pending attempt: waits for it, in order
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            watched.lock().unwrap().is_empty(),
            "order is kept behind a held attempt"
        );
        b.commit(2);
        b.start(3); // never decided before the stream ends: not a turn
        tx.send(Item(3)).unwrap();
    });
    assert_eq!(seen, [2, 7]);
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        ["process 2", "process 7"],
        "a committed input needs no rollback"
    );
}

#[test]
fn a_released_turn_is_computed_at_once_and_undone_when_it_is_taken_back() {
    let board = SpecBoard::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let stage = Recorder {
        log: Arc::clone(&log),
        committed_only: true,
        cancel_while_running: None,
    };
    let b = board.clone();
    let seen = run(stage, &board, move |tx| {
        b.start(1);
        b.release(1); // shown, still revocable: a committed-only stage takes it
        tx.send(Item(1)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        b.cancel(1); // the speaker went on: taken back
        b.start(2);
        b.release(2);
        tx.send(Item(2)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        b.commit(2); // the moment passed
        tx.send(Item(3)).unwrap();
    });
    assert_eq!(seen, [1, 2, 3]);
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            "speculate 1",
            "process 1",
            "rollback 1",
            "speculate 2",
            "process 2",
            "commit 2",
            "process 3",
        ],
        "the stage kept what undoes each released turn until it was decided"
    );
}
