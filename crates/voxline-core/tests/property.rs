//! Backpressure accounting, as properties over random stage delays and queue sizes.

use std::time::Duration;

use proptest::prelude::*;
use voxline_core::{
    edge, Clock, Emitter, FullPolicy, Message, Pipeline, PipelineEvent, Stage, StageError,
    UtteranceId,
};

/// A test message: one turn's payload.
struct Item {
    id: UtteranceId,
}

impl Message for Item {
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
}

/// Sleeps a per-item delay from a fixed schedule, fails the ids it is told to.
struct Jittery {
    name: &'static str,
    delays_us: Vec<u64>,
    fail_every: Option<u64>,
    n: usize,
}

impl Stage for Jittery {
    type In = Item;
    type Out = Item;
    fn name(&self) -> &str {
        self.name
    }
    fn process(&mut self, t: Item, out: &mut Emitter<'_, Item>) -> Result<(), StageError> {
        let d = self.delays_us[self.n % self.delays_us.len()];
        self.n += 1;
        std::thread::sleep(Duration::from_micros(d));
        if self.fail_every.is_some_and(|k| t.id.is_multiple_of(k)) {
            return Err(StageError::turn(t.id, "injected"));
        }
        out.emit(t);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// With blocking edges nothing is lost: every id reaches the sink or
    /// ends in a turn error, and no queue ever holds more than its capacity.
    #[test]
    fn blocking_pipelines_lose_nothing(
        n in 1u64..60,
        caps in proptest::collection::vec(1usize..5, 3),
        d1 in proptest::collection::vec(0u64..400, 1..6),
        d2 in proptest::collection::vec(0u64..400, 1..6),
        fail_every in proptest::option::of(2u64..7),
    ) {
        let mut p = Pipeline::builder(Clock::start()).publish_messages(false).build();
        let (tx, a) = edge::<Item>("in", caps[0], FullPolicy::Block);
        let (a_out, b) = edge::<Item>("mid", caps[1], FullPolicy::Block);
        let (b_out, sink_in) = edge::<Item>("out", caps[2], FullPolicy::Block);
        p.spawn_stage(Jittery { name: "a", delays_us: d1, fail_every: None, n: 0 }, a, a_out).unwrap();
        p.spawn_stage(Jittery { name: "b", delays_us: d2, fail_every, n: 0 }, b, b_out).unwrap();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        p.spawn_sink("sink", sink_in, move |e| { let _ = seen_tx.send(e.item.id); Ok(()) }).unwrap();
        let events = p.events();
        for id in 0..n {
            tx.send(Item { id }).unwrap();
        }
        drop(tx);
        let outcome = p.join();
        prop_assert!(outcome.failed.is_none());
        let mut ended: Vec<u64> = seen_rx.try_iter().collect();
        ended.extend(events.try_iter().filter_map(|e| match e.event { PipelineEvent::TurnError(t) => Some(t.id), _ => None }));
        ended.sort_unstable();
        prop_assert_eq!(ended, (0..n).collect::<Vec<_>>());
        for e in &outcome.edges {
            prop_assert!(e.max_depth <= e.capacity, "{} depth {} > {}", e.name, e.max_depth, e.capacity);
            prop_assert_eq!(e.dropped, 0);
        }
    }

    /// Drop-oldest edges (live capture) count exactly what they drop:
    /// received + dropped == sent, whatever the speeds.
    #[test]
    fn drop_oldest_counts_every_drop(
        n in 1u64..400,
        cap in 1usize..8,
        consumer_us in proptest::collection::vec(0u64..300, 1..5),
        burst in 1u64..50,
    ) {
        let (tx, rx) = edge::<u64>("audio", cap, FullPolicy::DropOldest);
        let consumer = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut i = 0;
            while let Ok(env) = rx.recv() {
                got.push(env.item);
                std::thread::sleep(Duration::from_micros(consumer_us[i % consumer_us.len()]));
                i += 1;
            }
            got
        });
        for i in 0..n {
            tx.send(i).unwrap();
            if i % burst == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        let stats = tx.stats();
        drop(tx);
        let got = consumer.join().unwrap();
        prop_assert_eq!(got.len() as u64 + stats.dropped(), n);
        prop_assert_eq!(stats.received(), got.len() as u64);
        prop_assert!(stats.max_depth() <= cap);
        // what arrives is in order (drops remove the oldest, never reorder)
        prop_assert!(got.windows(2).all(|w| w[0] < w[1]));
        // the newest item is never the one dropped
        prop_assert_eq!(got.last().copied(), Some(n - 1));
    }
}
