//! Integration tests of edges under concurrency and of the threaded runtime.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use voxline_core::{
    edge, Clock, EdgeSender, Emitter, EngineEvent, FullPolicy, Message, Pipeline, PipelineEvent,
    RunOutcome, SpanKind, Stage, StageError, UtteranceId,
};

/// Generous bound on any single wait; a test that hits it has hung.
const HANG: Duration = Duration::from_secs(20);

/// A test message: one turn's payload.
#[derive(Debug, Clone, PartialEq)]
struct Item {
    id: UtteranceId,
    hops: Vec<&'static str>,
}

impl Message for Item {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
}

/// A test message of an engine's own, published as an event (as the
/// language model's tokens are).
#[derive(Debug, Clone, PartialEq)]
struct Token {
    id: UtteranceId,
    index: u32,
    text: String,
}

impl Message for Token {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn event(&self) -> Option<PipelineEvent> {
        Some(PipelineEvent::engine_event(self.clone()))
    }
}

impl EngineEvent for Token {
    fn kind(&self) -> &'static str {
        "token"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
        serde_json::to_string(&serde_json::json!({ "index": self.index, "text": self.text }))
    }
}

/// What a [`Hop`] does for one id.
#[derive(Clone, Copy)]
enum Fault {
    None,
    TurnError(UtteranceId),
    Fatal(UtteranceId),
    Panic(UtteranceId),
}

/// Appends its name to the item; optionally slow, optionally faulty.
struct Hop {
    name: &'static str,
    delay: Duration,
    fault: Fault,
}

impl Hop {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            delay: Duration::ZERO,
            fault: Fault::None,
        }
    }
}

impl Stage for Hop {
    type In = Item;
    type Out = Item;

    fn name(&self) -> &str {
        self.name
    }

    fn process(&mut self, mut item: Item, out: &mut Emitter<'_, Item>) -> Result<(), StageError> {
        if !self.delay.is_zero() {
            thread::sleep(self.delay);
        }
        match self.fault {
            Fault::TurnError(id) if id == item.id => {
                return Err(StageError::recoverable(format!("cannot handle {id}")));
            }
            Fault::Fatal(id) if id == item.id => return Err(StageError::fatal("engine lost")),
            Fault::Panic(id) if id == item.id => panic!("boom at {id}"),
            _ => {}
        }
        item.hops.push(self.name);
        out.emit(item);
        Ok(())
    }
}

/// Joins on another thread so a hang fails the test instead of stalling it.
fn join_within(pipeline: Pipeline) -> RunOutcome {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(pipeline.join());
    });
    rx.recv_timeout(HANG).expect("pipeline join hung")
}

/// Sends items 0..n until the edge disconnects; returns how many went in.
fn feed(source: EdgeSender<Item>, n: u64) -> u64 {
    let mut sent = 0;
    for id in 0..n {
        if source
            .send(Item {
                id,
                hops: Vec::new(),
            })
            .is_err()
        {
            break;
        }
        sent += 1;
    }
    sent
}

/// Builds source -> a -> b -> c -> sink and returns (pipeline, source, sink
/// results).
fn chain(
    a: Hop,
    b: Hop,
    c: Hop,
    capacity: usize,
) -> (Pipeline, EdgeSender<Item>, mpsc::Receiver<Item>) {
    let mut pipeline = Pipeline::new(Clock::start());
    let (source, a_in) = edge::<Item>("src->a", capacity, FullPolicy::Block);
    let (a_out, b_in) = edge::<Item>("a->b", capacity, FullPolicy::Block);
    let (b_out, c_in) = edge::<Item>("b->c", capacity, FullPolicy::Block);
    let (c_out, sink_in) = edge::<Item>("c->sink", capacity, FullPolicy::Block);
    pipeline.spawn_stage(a, a_in, a_out).unwrap();
    pipeline.spawn_stage(b, b_in, b_out).unwrap();
    pipeline.spawn_stage(c, c_in, c_out).unwrap();
    let (results_tx, results) = mpsc::channel();
    pipeline
        .spawn_sink("sink", sink_in, move |env| {
            results_tx
                .send(env.item)
                .map_err(|_| StageError::fatal("results reader gone"))
        })
        .unwrap();
    (pipeline, source, results)
}

#[test]
fn block_edge_loses_nothing_to_a_slow_consumer() {
    const N: u64 = 400;
    const CAP: usize = 4;
    let (tx, rx) = edge::<u64>("block", CAP, FullPolicy::Block);
    let producer = thread::spawn(move || {
        for i in 0..N {
            tx.send(i).unwrap();
        }
    });
    let mut got = Vec::new();
    for env in rx.iter() {
        assert!(rx.len() <= CAP);
        if env.item % 50 == 0 {
            thread::sleep(Duration::from_millis(2));
        }
        got.push(env.item);
    }
    producer.join().unwrap();
    assert_eq!(got, (0..N).collect::<Vec<_>>());
    let s = rx.stats().snapshot();
    assert_eq!((s.sent, s.received, s.dropped), (N, N, 0));
    assert!(s.max_depth <= CAP && s.max_depth >= 1);
}

#[test]
fn drop_oldest_counts_exactly_under_concurrency() {
    const PRODUCERS: u64 = 4;
    const PER_PRODUCER: u64 = 25_000;
    const CAP: usize = 8;
    let (tx, rx) = edge::<(u64, u64)>("live", CAP, FullPolicy::DropOldest);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let tx = tx.clone();
            thread::spawn(move || {
                for seq in 0..PER_PRODUCER {
                    tx.send((p, seq)).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let consumer = thread::spawn(move || {
        let mut last: Vec<Option<u64>> = vec![None; PRODUCERS as usize];
        let mut received = 0u64;
        for (n, env) in rx.iter().enumerate() {
            let (p, seq) = env.item;
            // Each producer's items arrive in order; dropping never reorders.
            if let Some(prev) = last[p as usize] {
                assert!(seq > prev, "producer {p}: {seq} after {prev}");
            }
            last[p as usize] = Some(seq);
            received += 1;
            if n % 1_000 == 0 {
                thread::yield_now();
            }
        }
        (received, rx.stats())
    });
    for p in producers {
        p.join().unwrap();
    }
    let (received, stats) = consumer.join().unwrap();
    let s = stats.snapshot();
    let sent = PRODUCERS * PER_PRODUCER;
    assert_eq!(s.sent, sent);
    assert_eq!(s.received, received);
    assert_eq!(received + s.dropped, sent, "every item received or counted");
    assert!(s.max_depth <= CAP);
}

#[test]
fn chained_stages_deliver_every_id_and_record_spans() {
    const N: u64 = 25;
    let slow = Hop {
        delay: Duration::from_millis(3),
        ..Hop::new("slow")
    };
    let (pipeline, source, results) = chain(Hop::new("first"), slow, Hop::new("last"), 2);
    assert_eq!(feed(source, N), N);
    let outcome = join_within(pipeline);

    let got: Vec<Item> = results.try_iter().collect();
    assert_eq!(
        got.iter().map(|i| i.id).collect::<Vec<_>>(),
        (0..N).collect::<Vec<_>>()
    );
    assert!(got.iter().all(|i| i.hops == ["first", "slow", "last"]));
    assert_eq!(outcome.failed, None);

    for stage in ["first", "slow", "last"] {
        let spans: Vec<_> = outcome.spans_of(stage).collect();
        let process: Vec<_> = spans
            .iter()
            .filter(|s| s.kind == SpanKind::Process)
            .collect();
        assert_eq!(process.len() as u64, N, "{stage} process spans");
        assert_eq!(
            spans.iter().filter(|s| s.kind == SpanKind::Finish).count(),
            1
        );
        let mut ids: Vec<_> = process.iter().map(|s| s.utterance.unwrap()).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..N).collect::<Vec<_>>());
        for s in &spans {
            assert!(s.started >= s.enqueued, "{stage}: started before enqueued");
            assert!(s.finished >= s.started, "{stage}: finished before started");
        }
        for s in &process {
            assert_eq!(s.emitted, 1);
            let first = s.first_emit.unwrap();
            assert!(first >= s.started && first <= s.finished);
        }
    }
    assert_eq!(outcome.spans_of("sink").count() as u64, N);
    // The slow stage really is the slow one.
    let busy = |name: &str| -> Duration { outcome.spans_of(name).map(|s| s.busy()).sum() };
    assert!(busy("slow") >= Duration::from_millis(3 * N));
    for e in &outcome.edges {
        assert_eq!(
            (e.sent, e.received, e.dropped),
            (N, N, 0),
            "edge {}",
            e.name
        );
        assert!(e.max_depth <= 2);
    }
    assert_eq!(outcome.edges.len(), 4);
}

#[test]
fn a_turn_error_is_reported_and_other_ids_go_on() {
    const N: u64 = 10;
    let faulty = Hop {
        fault: Fault::TurnError(3),
        ..Hop::new("stt")
    };
    let (pipeline, source, results) = chain(Hop::new("vad"), faulty, Hop::new("llm"), 2);
    assert_eq!(feed(source, N), N);
    let outcome = join_within(pipeline);

    let ids: Vec<_> = results.try_iter().map(|i| i.id).collect();
    assert_eq!(ids, (0..N).filter(|&i| i != 3).collect::<Vec<_>>());
    assert_eq!(outcome.failed, None);
    let errors: Vec<_> = outcome
        .events
        .iter()
        .filter_map(|e| match &e.event {
            PipelineEvent::TurnError(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].id, 3);
    assert_eq!(errors[0].stage, "stt");
    assert_eq!(errors[0].message, "cannot handle 3");
    // The failed call is still spanned.
    assert_eq!(
        outcome
            .spans_of("stt")
            .filter(|s| s.kind == SpanKind::Process)
            .count() as u64,
        N
    );
}

fn assert_stage_failed(outcome: &RunOutcome, stage: &str, needle: &str) {
    let failed = outcome.failed.as_deref().expect("run marked failed");
    assert!(
        failed.contains(stage) && failed.contains(needle),
        "{failed}"
    );
    let events: Vec<_> = outcome
        .events
        .iter()
        .filter_map(|e| match &e.event {
            PipelineEvent::StageFailed { stage, message } => Some((stage, message)),
            _ => None,
        })
        .collect();
    assert_eq!(events.len(), 1, "one StageFailed event");
    assert_eq!(events[0].0, stage);
    assert!(events[0].1.contains(needle));
}

#[test]
fn a_panicking_stage_fails_the_run_without_hanging() {
    let panicky = Hop {
        fault: Fault::Panic(5),
        ..Hop::new("stt")
    };
    let (pipeline, source, results) = chain(Hop::new("vad"), panicky, Hop::new("llm"), 2);
    let shutdown = pipeline.shutdown_handle();
    // The source keeps pushing until the failure propagates back to it.
    let sent = feed(source, 10_000);
    assert!(sent < 10_000, "upstream must see the disconnection");
    assert!(shutdown.is_requested());
    let outcome = join_within(pipeline);

    assert_stage_failed(&outcome, "stt", "boom at 5");
    // Downstream drained what it had and finished.
    let ids: Vec<_> = results.try_iter().map(|i| i.id).collect();
    assert_eq!(ids, (0..5).collect::<Vec<_>>());
    assert_eq!(
        outcome
            .spans_of("llm")
            .filter(|s| s.kind == SpanKind::Finish)
            .count(),
        1
    );
    // The panicking call's span was kept.
    assert!(outcome
        .spans_of("stt")
        .any(|s| s.utterance == Some(5) && s.emitted == 0));
}

#[test]
fn a_fatal_error_shuts_the_pipeline_down() {
    let fatal = Hop {
        fault: Fault::Fatal(2),
        ..Hop::new("llm")
    };
    let (pipeline, source, results) = chain(Hop::new("vad"), Hop::new("stt"), fatal, 1);
    let sent = feed(source, 10_000);
    assert!(sent < 10_000);
    let outcome = join_within(pipeline);
    assert_stage_failed(&outcome, "llm", "engine lost");
    let ids: Vec<_> = results.try_iter().map(|i| i.id).collect();
    assert_eq!(ids, [0, 1]);
}

#[test]
fn a_failing_sink_stops_its_upstream() {
    let mut pipeline = Pipeline::new(Clock::start());
    let (source, a_in) = edge::<Item>("src->a", 1, FullPolicy::Block);
    let (a_out, sink_in) = edge::<Item>("a->sink", 1, FullPolicy::Block);
    pipeline.spawn_stage(Hop::new("a"), a_in, a_out).unwrap();
    pipeline
        .spawn_sink("writer", sink_in, |env: voxline_core::Envelope<Item>| {
            if env.item.id == 3 {
                Err(StageError::fatal("disk full"))
            } else {
                Ok(())
            }
        })
        .unwrap();
    let sent = feed(source, 10_000);
    assert!(sent < 10_000);
    let outcome = join_within(pipeline);
    assert_stage_failed(&outcome, "writer", "disk full");
}

#[test]
fn emitted_messages_and_drops_reach_the_event_stream() {
    /// Turns each item into a token.
    struct Speak;
    impl Stage for Speak {
        type In = Item;
        type Out = Token;
        fn name(&self) -> &str {
            "llm"
        }
        fn process(&mut self, item: Item, out: &mut Emitter<'_, Token>) -> Result<(), StageError> {
            out.emit(Token {
                id: item.id,
                index: 0,
                text: format!("t{}", item.id),
            });
            Ok(())
        }
    }

    let clock = Clock::start();
    let mut pipeline = Pipeline::new(clock);
    let events = pipeline.events();
    let reader = thread::spawn(move || {
        let mut seen = Vec::new();
        loop {
            match events.recv_timeout(HANG) {
                Ok(e) => seen.push(e),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return seen,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => panic!("event stream hung"),
            }
        }
    });
    let (source, llm_in) = edge::<Item>("audio", 3, FullPolicy::DropOldest);
    let (llm_out, sink_in) = edge::<Token>("tokens", 16, FullPolicy::Block);
    // Overfill the drop-oldest edge before anyone consumes it.
    assert_eq!(feed(source, 10), 10);
    pipeline.spawn_stage(Speak, llm_in, llm_out).unwrap();
    pipeline.spawn_sink("sink", sink_in, |_| Ok(())).unwrap();
    let outcome = join_within(pipeline);
    assert!(outcome.events.is_empty(), "a reader took the events");
    let seen = reader.join().unwrap();

    let dropped: u64 = seen
        .iter()
        .filter_map(|e| match &e.event {
            PipelineEvent::Dropped { edge, count } if edge == "audio" => Some(*count),
            _ => None,
        })
        .sum();
    assert_eq!(dropped, 7);
    assert_eq!(outcome.edge("audio").unwrap().dropped, 7);
    let token_ids: Vec<_> = seen
        .iter()
        .filter(|e| e.event.engine::<Token>().is_some())
        .map(|e| e.event.utterance_id().unwrap())
        .collect();
    assert_eq!(token_ids, [7, 8, 9]);
    // Each token event is stamped with its emit instant, which the span saw.
    for e in seen.iter().filter(|e| e.event.engine::<Token>().is_some()) {
        let id = e.event.utterance_id();
        let span = outcome
            .spans_of("llm")
            .find(|s| s.utterance == id && s.kind == SpanKind::Process)
            .unwrap();
        assert_eq!(span.first_emit, Some(e.at));
        let line = e.to_json_line(&clock).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["type"], "token");
        assert_eq!(v["id"], id.unwrap());
        assert!(v["t_ms"].as_f64().unwrap() >= 0.0);
    }
}

/// An output's event is on the bus before the next stage can take the
/// output: a stage that re-emits what it was given at once never gets its
/// event ahead of the one it answered (observers read events in causal
/// order).
#[test]
fn events_reach_the_bus_in_causal_order() {
    /// Passes each token on, one index later.
    struct Echo(&'static str);
    impl Stage for Echo {
        type In = Token;
        type Out = Token;
        fn name(&self) -> &str {
            self.0
        }
        fn process(&mut self, t: Token, out: &mut Emitter<'_, Token>) -> Result<(), StageError> {
            out.emit(Token {
                index: t.index + 1,
                ..t
            });
            Ok(())
        }
    }
    const N: u64 = 2000;
    let mut pipeline = Pipeline::new(Clock::start());
    let events = pipeline.events();
    let reader = thread::spawn(move || {
        let mut seen = Vec::new();
        while let Ok(e) = events.recv_timeout(HANG) {
            if let Some(t) = e.event.engine::<Token>() {
                seen.push((t.id, t.index));
            }
        }
        seen
    });
    let (source, a_in) = edge::<Token>("in", 4, FullPolicy::Block);
    let (a_out, b_in) = edge::<Token>("ab", 4, FullPolicy::Block);
    let (b_out, sink_in) = edge::<Token>("out", 4, FullPolicy::Block);
    pipeline.spawn_stage(Echo("a"), a_in, a_out).unwrap();
    pipeline.spawn_stage(Echo("b"), b_in, b_out).unwrap();
    pipeline.spawn_sink("sink", sink_in, |_| Ok(())).unwrap();
    for id in 0..N {
        let t = Token {
            id,
            index: 0,
            text: String::new(),
        };
        source.send(t).unwrap();
    }
    drop(source);
    join_within(pipeline);
    let seen = reader.join().unwrap();
    assert_eq!(seen.len() as u64, 2 * N);
    let mut first = std::collections::HashSet::new();
    for (id, index) in seen {
        if index == 1 {
            first.insert(id);
        } else {
            assert!(first.contains(&id), "b's event for {id} came before a's");
        }
    }
}

/// Two stages sharing a CPU lease never run at the same time, and the wait
/// for the lease is queue wait, not busy time.
#[test]
fn leased_stages_never_overlap() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use voxline_core::{edge, Clock, CpuLease, Emitter, FullPolicy, Pipeline, Stage, StageError};

    struct Busy(&'static str, Arc<AtomicUsize>, Arc<AtomicUsize>);
    impl Stage for Busy {
        type In = Token;
        type Out = Token;
        fn name(&self) -> &str {
            self.0
        }
        fn process(&mut self, t: Token, out: &mut Emitter<'_, Token>) -> Result<(), StageError> {
            let now = self.1.fetch_add(1, Ordering::SeqCst) + 1;
            self.2.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(20));
            self.1.fetch_sub(1, Ordering::SeqCst);
            out.emit(t);
            Ok(())
        }
    }
    let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let lease = CpuLease::new();
    let mut p = Pipeline::new(Clock::start());
    let (tx, a_rx) = edge::<Token>("in", 4, FullPolicy::Block);
    // a one-slot edge between two leased stages: `a` fills it while holding the
    // lease, and `b` needs the lease to drain it (a deadlock if the lease were
    // held while waiting for room)
    let (a_tx, b_rx) = edge::<Token>("mid", 1, FullPolicy::Block);
    let (b_tx, out_rx) = edge::<Token>("out", 64, FullPolicy::Block);
    p.spawn_stage_leased(
        Busy("a", running.clone(), peak.clone()),
        a_rx,
        a_tx,
        lease.clone(),
    )
    .unwrap();
    p.spawn_stage_leased(Busy("b", running.clone(), peak.clone()), b_rx, b_tx, lease)
        .unwrap();
    p.spawn_sink("sink", out_rx, |_| Ok(())).unwrap();
    let n: u64 = 30;
    let t0 = std::time::Instant::now();
    for i in 0..n {
        tx.send(Token {
            id: i,
            index: 0,
            text: String::new(),
        })
        .unwrap();
    }
    drop(tx);
    let outcome = p.join();
    let elapsed = t0.elapsed();
    let done = outcome
        .spans
        .iter()
        .filter(|s| s.stage == "b" && s.kind == voxline_core::SpanKind::Process)
        .count();
    assert_eq!(done as u64, n, "every item went through both stages");
    // serialised: 2 stages × n items × 20 ms, never overlapping
    assert!(
        elapsed >= std::time::Duration::from_millis(2 * 20 * n),
        "{elapsed:?}"
    );
    assert_eq!(
        peak.load(Ordering::SeqCst),
        1,
        "two leased stages ran at once"
    );
    for s in outcome
        .spans
        .iter()
        .filter(|s| s.stage == "a" || s.stage == "b")
    {
        if s.kind == voxline_core::SpanKind::Process {
            assert!(
                s.busy() < std::time::Duration::from_millis(40),
                "lease wait counted as busy: {:?}",
                s.busy()
            );
        }
    }
    // Which of the two waits for the lease depends on the scheduler (after
    // `a` lets go, either may take it next), but one of them must: every
    // item finds the other stage holding the lease at least once, and that
    // wait is queue wait. Over both stages it is at least one item's work.
    let waited: std::time::Duration = outcome
        .spans
        .iter()
        .filter(|s| s.stage == "a" || s.stage == "b")
        .map(|s| s.queue_wait())
        .sum();
    assert!(
        waited > std::time::Duration::from_millis(20),
        "neither stage's lease wait was counted as queue wait: {waited:?}"
    );
}

/// Several leased producers filling one small edge that a leased consumer
/// drains: a producer must never wait for room while holding the lease the
/// consumer needs (a check-then-send would race with the other producer).
#[test]
fn several_leased_producers_never_deadlock_on_a_full_edge() {
    use voxline_core::{edge, Clock, CpuLease, Emitter, FullPolicy, Pipeline, Stage, StageError};

    /// Emits `fan` copies of each input.
    struct Fan(&'static str, u32);
    impl Stage for Fan {
        type In = Token;
        type Out = Token;
        fn name(&self) -> &str {
            self.0
        }
        fn process(&mut self, t: Token, out: &mut Emitter<'_, Token>) -> Result<(), StageError> {
            for i in 0..self.1 {
                out.emit(Token {
                    index: i,
                    ..t.clone()
                });
            }
            Ok(())
        }
    }

    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let lease = CpuLease::new();
        let mut p = Pipeline::new(Clock::start());
        let (a_in, a_rx) = edge::<Token>("a_in", 4, FullPolicy::Block);
        let (b_in, b_rx) = edge::<Token>("b_in", 4, FullPolicy::Block);
        // one slot shared by both producers
        let (mid_tx, mid_rx) = edge::<Token>("mid", 1, FullPolicy::Block);
        let (out_tx, out_rx) = edge::<Token>("out", 1, FullPolicy::Block);
        p.spawn_stage_leased(Fan("a", 8), a_rx, mid_tx.clone(), lease.clone())
            .unwrap();
        p.spawn_stage_leased(Fan("b", 8), b_rx, mid_tx, lease.clone())
            .unwrap();
        p.spawn_stage_leased(Fan("c", 1), mid_rx, out_tx, lease)
            .unwrap();
        let (count_tx, count_rx) = std::sync::mpsc::channel();
        p.spawn_sink("sink", out_rx, move |_| {
            let _ = count_tx.send(());
            Ok(())
        })
        .unwrap();
        for i in 0..200 {
            let t = Token {
                id: i,
                index: 0,
                text: String::new(),
            };
            a_in.send(t.clone()).unwrap();
            b_in.send(t).unwrap();
        }
        drop((a_in, b_in));
        let outcome = p.join();
        let _ = done_tx.send((outcome.failed, count_rx.try_iter().count()));
    });
    let (failed, n) = done_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the pipeline finished (no deadlock)");
    assert!(failed.is_none());
    assert_eq!(n, 2 * 200 * 8);
}

/// A stage that is not `Send` (like an engine context): it must be built on
/// the thread it runs on, by its start-up hook.
struct ThreadBound {
    /// The thread it was built on (an `Rc` makes the stage `!Send`).
    built_on: std::rc::Rc<String>,
}

impl Stage for ThreadBound {
    type In = Item;
    type Out = Item;

    fn name(&self) -> &str {
        "bound"
    }

    fn process(&mut self, mut item: Item, out: &mut Emitter<'_, Item>) -> Result<(), StageError> {
        // a stage runs where it was built
        let here = thread::current().name().unwrap_or_default().to_owned();
        if here != *self.built_on {
            return Err(StageError::fatal(format!(
                "built on {} but run on {here}",
                self.built_on
            )));
        }
        item.hops.push("bound");
        out.emit(item);
        Ok(())
    }
}

#[test]
fn a_stage_that_is_not_send_is_built_on_its_own_thread_before_its_first_input() {
    let mut p = Pipeline::new(Clock::start());
    let (source, rx) = edge::<Item>("in", 4, FullPolicy::Block);
    let (tx, results) = edge::<Item>("out", 4, FullPolicy::Block);
    let (started_tx, started) = mpsc::channel();
    p.spawn_stage(
        voxline_core::on_thread("bound", move || {
            let name = thread::current().name().unwrap_or_default().to_owned();
            let _ = started_tx.send(name.clone());
            Ok(ThreadBound {
                built_on: std::rc::Rc::new(name),
            })
        }),
        rx,
        tx,
    )
    .unwrap();
    // the start-up barrier: the hook has run when spawn_stage returns
    let built_on = started
        .try_recv()
        .expect("the hook ran before spawn_stage returned");
    assert_eq!(built_on, "voxline-bound");
    assert_ne!(thread::current().name(), Some(built_on.as_str()));
    let (got_tx, got) = mpsc::channel();
    p.spawn_sink("sink", results, move |env| {
        let _ = got_tx.send(env.item);
        Ok(())
    })
    .unwrap();
    assert_eq!(feed(source, 3), 3);
    let outcome = join_within(p);
    assert!(outcome.failed.is_none(), "{:?}", outcome.failed);
    let items: Vec<Item> = got.try_iter().collect();
    assert_eq!(items.len(), 3);
    assert!(items.iter().all(|i| i.hops == ["bound"]));
    assert!(outcome.startup > Duration::ZERO);
}

#[test]
fn a_stage_that_cannot_start_is_reported_by_spawn_before_any_input() {
    #[derive(Debug, thiserror::Error)]
    #[error("no context: out of memory")]
    struct NoContext;

    let mut p = Pipeline::new(Clock::start());
    let (source, rx) = edge::<Item>("in", 4, FullPolicy::Block);
    let (tx, _results) = edge::<Item>("out", 4, FullPolicy::Block);
    let err = p
        .spawn_stage(
            voxline_core::on_thread("bound", || -> Result<Hop, _> { Err(NoContext.into()) }),
            rx,
            tx,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "stage `bound` could not start: no context: out of memory"
    );
    // the engine's own error is kept as the source
    let source_err = std::error::Error::source(&err).unwrap();
    assert!(source_err.downcast_ref::<NoContext>().is_some());
    // the stage's thread is gone and took its input with it: nothing was read
    assert!(source
        .send(Item {
            id: 0,
            hops: Vec::new()
        })
        .is_err());

    let mut p = Pipeline::new(Clock::start());
    let (_source, rx) = edge::<Item>("in", 4, FullPolicy::Block);
    let (tx, _results) = edge::<Item>("out", 4, FullPolicy::Block);
    let err = p
        .spawn_stage(
            voxline_core::on_thread("bound", || -> Result<Hop, _> { panic!("hook blew up") }),
            rx,
            tx,
        )
        .unwrap_err();
    assert!(err.to_string().contains("panicked: hook blew up"), "{err}");
}

#[test]
fn an_observer_takes_every_span_as_it_happens_and_none_is_kept() {
    const N: u64 = 40;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let mut pipeline = Pipeline::builder(Clock::start())
        .observe_spans(move |s| {
            log.lock()
                .unwrap()
                .push((s.stage.clone(), s.kind, s.utterance))
        })
        .build();
    let (source, a_in) = edge::<Item>("src->a", 4, FullPolicy::Block);
    let (a_out, sink_in) = edge::<Item>("a->sink", 4, FullPolicy::Block);
    pipeline.spawn_stage(Hop::new("a"), a_in, a_out).unwrap();
    pipeline.spawn_sink("sink", sink_in, |_| Ok(())).unwrap();
    assert_eq!(feed(source, N), N);
    let outcome = join_within(pipeline);
    assert!(outcome.spans.is_empty(), "the observer took them all");
    let seen = seen.lock().unwrap();
    for stage in ["a", "sink"] {
        let mut ids: Vec<_> = seen
            .iter()
            .filter(|(s, k, _)| s == stage && *k == SpanKind::Process)
            .map(|(_, _, id)| id.unwrap())
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..N).collect::<Vec<_>>(), "{stage}");
    }
    assert_eq!(
        seen.iter()
            .filter(|(s, k, _)| s == "a" && *k == SpanKind::Finish)
            .count(),
        1
    );
}

#[test]
fn a_drain_drops_the_turns_queued_before_it_and_lets_the_one_in_flight_finish() {
    let drain = voxline_core::DrainHandle::new();
    let mut pipeline = Pipeline::builder(Clock::start())
        .drain_on(drain.clone())
        .build();
    let (source, a_in) = edge::<Item>("src->slow", 16, FullPolicy::Block);
    let (a_out, sink_in) = edge::<Item>("slow->sink", 16, FullPolicy::Block);
    let slow = Hop {
        delay: Duration::from_millis(300),
        ..Hop::new("slow")
    };
    pipeline.spawn_stage(slow, a_in, a_out).unwrap();
    let (results_tx, results) = mpsc::channel();
    pipeline
        .spawn_sink("sink", sink_in, move |env| {
            results_tx
                .send(env.item)
                .map_err(|_| StageError::fatal("results reader gone"))
        })
        .unwrap();
    for id in 0..6 {
        source
            .send(Item {
                id,
                hops: Vec::new(),
            })
            .unwrap();
    }
    // turn 0 is in the slow stage; 1..=5 wait behind it
    thread::sleep(Duration::from_millis(100));
    drain.request();
    // what comes after the drain's moment goes through
    source
        .send(Item {
            id: 9,
            hops: Vec::new(),
        })
        .unwrap();
    drop(source);
    let outcome = join_within(pipeline);
    let ids: Vec<_> = results.try_iter().map(|i| i.id).collect();
    assert_eq!(ids, vec![0, 9]);
    let cancelled: Vec<_> = outcome
        .events
        .iter()
        .filter_map(|e| match &e.event {
            PipelineEvent::TurnError(t) if t.message.starts_with("cancelled") => Some(t.id),
            _ => None,
        })
        .collect();
    assert_eq!(cancelled, vec![1, 2, 3, 4, 5]);
}

/// A stage without an engine spawned under the lease never takes it for its
/// calls, but gets the cores for a moment's work while nobody holds them:
/// held for it (no engine starts meanwhile) and counted on the meter.
#[test]
fn a_stage_that_is_not_leased_gets_the_cores_only_while_they_are_free() {
    use std::sync::mpsc;
    use voxline_core::{
        edge, Clock, CpuLease, Emitter, FullPolicy, Pipeline, Priority, Stage, StageError,
    };

    struct Judge(mpsc::Sender<(bool, bool)>, CpuLease);
    impl Stage for Judge {
        type In = Token;
        type Out = Token;
        fn name(&self) -> &str {
            "judge"
        }
        fn leased(&self) -> bool {
            false
        }
        fn process(&mut self, t: Token, out: &mut Emitter<'_, Token>) -> Result<(), StageError> {
            let cores = out.free_cores(2);
            // while held, an engine could not take the lease
            let blocks = self.1.try_acquire(Priority::Committed).is_none();
            self.0.send((cores.is_some(), blocks)).unwrap();
            drop(cores);
            out.emit(t);
            Ok(())
        }
    }
    let lease = CpuLease::new();
    let p = Pipeline::builder(Clock::start());
    let mut p = p.build();
    let meter = p.meter();
    let (tx, rx) = edge::<Token>("in", 4, FullPolicy::Block);
    let (out_tx, out_rx) = edge::<Token>("out", 4, FullPolicy::Block);
    let (seen_tx, seen) = mpsc::channel();
    p.spawn_stage_leased(Judge(seen_tx, lease.clone()), rx, out_tx, lease.clone())
        .unwrap();
    p.spawn_sink("sink", out_rx, |_| Ok(())).unwrap();
    let token = |id| Token {
        id,
        index: 0,
        text: String::new(),
    };
    // an engine holds the cores: the stage computes without them
    let engine = lease.acquire(Priority::Streaming);
    tx.send(token(1)).unwrap();
    assert_eq!(seen.recv().unwrap(), (false, true));
    assert_eq!(meter.peak(), 0, "nothing counted beside the engine");
    drop(engine);
    // free: held for the stage, its threads counted
    tx.send(token(2)).unwrap();
    assert_eq!(seen.recv().unwrap(), (true, true));
    assert_eq!(meter.peak(), 2);
    drop(tx);
    let outcome = p.join();
    assert!(outcome.failed.is_none(), "{:?}", outcome.failed);
    assert!(lease.try_acquire(Priority::Speculative).is_some(), "let go");
}

/// Remembers the barge-ins it hears of; passes items on.
struct Listener {
    heard: std::sync::Arc<std::sync::Mutex<Vec<(UtteranceId, String)>>>,
}

impl Stage for Listener {
    type In = Item;
    type Out = Item;

    fn name(&self) -> &str {
        "llm"
    }

    fn process(&mut self, mut item: Item, out: &mut Emitter<'_, Item>) -> Result<(), StageError> {
        item.hops.push("llm");
        out.emit(item);
        Ok(())
    }

    fn interrupted(&mut self, id: UtteranceId, heard: &str) {
        self.heard.lock().unwrap().push((id, heard.to_owned()));
    }
}

/// The runtime injects a fault around the stage's call, not by wrapping
/// the stage: the faulty call fails as a turn error, and the stage still
/// hears of every barge-in (a wrapper that forgot to forward the hook once
/// kept answers the user never heard in the conversation).
#[test]
fn an_injected_fault_fails_one_call_and_leaves_the_stage_s_hooks_alone() {
    let barge = voxline_core::BargeIn::new();
    barge.interrupt(0, "Sure, the".into());
    let heard = std::sync::Arc::default();
    let mut pipeline = Pipeline::builder(Clock::start())
        .barge_in(barge.clone())
        .inject_fault(Some(voxline_core::InjectedFault {
            panic: false,
            stage: "llm".into(),
            id: 2,
        }))
        .build();
    let (source, a_in) = edge::<Item>("src->llm", 4, FullPolicy::Block);
    let (a_out, sink_in) = edge::<Item>("llm->sink", 4, FullPolicy::Block);
    pipeline
        .spawn_stage(
            Listener {
                heard: std::sync::Arc::clone(&heard),
            },
            a_in,
            a_out,
        )
        .unwrap();
    let (results_tx, results) = mpsc::channel();
    pipeline
        .spawn_sink("sink", sink_in, move |env| {
            results_tx
                .send(env.item.id)
                .map_err(|_| StageError::fatal("results reader gone"))
        })
        .unwrap();
    // turn 0 was interrupted: its queued input is skipped
    assert_eq!(feed(source, 5), 5);
    let outcome = join_within(pipeline);
    let ids: Vec<_> = results.try_iter().collect();
    assert_eq!(ids, [1, 3, 4]);
    let errors: Vec<_> = outcome
        .events
        .iter()
        .filter_map(|e| match &e.event {
            PipelineEvent::TurnError(t) => Some((t.id, t.stage.clone(), t.message.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        errors,
        [(
            2,
            "llm".to_owned(),
            "injected error in llm on utterance 2".to_owned()
        )]
    );
    assert_eq!(*heard.lock().unwrap(), [(0, "Sure, the".to_owned())]);
}
