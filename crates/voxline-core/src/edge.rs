//! Bounded edges between stages, each with a declared full-queue policy.
//!
//! An edge is a bounded `crossbeam-channel` plus counters. Items travel in an
//! [`Envelope`] stamped with the instant they were enqueued, so the consumer
//! can measure queue wait. When the queue is full, the edge's [`FullPolicy`]
//! decides: [`FullPolicy::Block`] makes the sender wait (nothing is lost);
//! [`FullPolicy::DropOldest`] never blocks the sender, discards the oldest
//! queued item and counts it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel as cb;
use serde::Serialize;

/// What an edge does when a sender finds its queue full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FullPolicy {
    /// The sender waits for room; nothing is lost (replay).
    Block,
    /// The sender never waits: the oldest queued item is discarded and
    /// counted (live capture, whose callback must not block).
    DropOldest,
}

/// An item on an edge, with the instant it was enqueued.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<T> {
    /// The item.
    pub item: T,
    /// When the sender handed the item to the edge.
    pub enqueued: Instant,
}

/// Why [`EdgeSender::try_send_stamped`] did not send.
#[derive(Debug, PartialEq, Eq)]
pub enum TrySend<T> {
    /// The queue is full; here is the item back.
    Full(T),
    /// Every receiver is gone.
    Disconnected,
}

/// The other side of the edge has gone away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the other side of the edge has gone away")]
pub struct Disconnected;

/// Why [`EdgeReceiver::recv_timeout`] returned no item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvTimeoutError {
    /// Nothing arrived in time.
    #[error("no item arrived before the timeout")]
    Timeout,
    /// Every sender is gone and the queue is empty.
    #[error("every sender has gone away and the queue is empty")]
    Disconnected,
}

/// Why [`EdgeReceiver::try_recv`] returned no item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TryRecvError {
    /// The queue is empty.
    #[error("the queue is empty")]
    Empty,
    /// Every sender is gone and the queue is empty.
    #[error("every sender has gone away and the queue is empty")]
    Disconnected,
}

/// An edge could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EdgeError {
    /// A capacity of 0 makes a rendezvous channel, which neither policy
    /// supports.
    #[error("edge `{name}` has capacity 0; give it a capacity of at least 1")]
    ZeroCapacity {
        /// The edge's name.
        name: String,
    },
}

/// Live counters of one edge, shared by its senders and receivers.
#[derive(Debug)]
pub struct EdgeStats {
    name: String,
    capacity: usize,
    policy: FullPolicy,
    sent: AtomicU64,
    received: AtomicU64,
    dropped: AtomicU64,
    dropped_units: AtomicU64,
    reported_dropped: AtomicU64,
    max_depth: AtomicUsize,
}

impl EdgeStats {
    fn new(name: &str, capacity: usize, policy: FullPolicy) -> Self {
        Self {
            name: name.to_owned(),
            capacity,
            policy,
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            dropped_units: AtomicU64::new(0),
            reported_dropped: AtomicU64::new(0),
            max_depth: AtomicUsize::new(0),
        }
    }

    /// The edge's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue's capacity.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The full-queue policy.
    #[must_use]
    pub fn policy(&self) -> FullPolicy {
        self.policy
    }

    /// Items accepted by senders (including any later dropped).
    #[must_use]
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Acquire)
    }

    /// Items taken by receivers.
    #[must_use]
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Acquire)
    }

    /// Items discarded by the drop-oldest policy.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Acquire)
    }

    /// What the dropped items carried, in the unit the sender measures
    /// them in ([`EdgeSender::measure_drops`]; audio: 16 kHz frames); one
    /// per item when it measures nothing.
    #[must_use]
    pub fn dropped_units(&self) -> u64 {
        self.dropped_units.load(Ordering::Acquire)
    }

    /// The largest queue depth seen just after an enqueue.
    #[must_use]
    pub fn max_depth(&self) -> usize {
        self.max_depth.load(Ordering::Acquire)
    }

    /// Drops not yet claimed by an earlier call: each dropped item is
    /// returned by exactly one call, even with concurrent callers. The
    /// runtime uses it to publish `Dropped` events.
    pub fn take_unreported_drops(&self) -> u64 {
        let dropped = self.dropped.load(Ordering::Acquire);
        let before = self.reported_dropped.fetch_max(dropped, Ordering::AcqRel);
        dropped.saturating_sub(before)
    }

    /// A copy of the counters.
    #[must_use]
    pub fn snapshot(&self) -> EdgeStatsSnapshot {
        EdgeStatsSnapshot {
            name: self.name.clone(),
            capacity: self.capacity,
            policy: self.policy,
            sent: self.sent(),
            received: self.received(),
            dropped: self.dropped(),
            dropped_units: self.dropped_units(),
            max_depth: self.max_depth(),
        }
    }
}

/// A point-in-time copy of an edge's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EdgeStatsSnapshot {
    /// The edge's name.
    pub name: String,
    /// The queue's capacity.
    pub capacity: usize,
    /// The full-queue policy.
    pub policy: FullPolicy,
    /// Items accepted by senders.
    pub sent: u64,
    /// Items taken by receivers.
    pub received: u64,
    /// Items discarded by the drop-oldest policy.
    pub dropped: u64,
    /// What they carried ([`EdgeStats::dropped_units`]); not in the report's
    /// `edges[]`, which count items.
    #[serde(skip)]
    pub dropped_units: u64,
    /// The largest queue depth seen just after an enqueue.
    pub max_depth: usize,
}

/// The sending side of an edge. Clone it for several producers.
#[derive(Debug)]
pub struct EdgeSender<T> {
    tx: cb::Sender<Envelope<T>>,
    /// For [`FullPolicy::DropOldest`]: a receiver used only to evict the
    /// oldest item when full.
    evict: Option<cb::Receiver<Envelope<T>>>,
    /// Alive while any [`EdgeReceiver`] is; the evicting receiver would
    /// otherwise hide the consumer's disconnection.
    consumers: Weak<()>,
    stats: Arc<EdgeStats>,
    /// What a dropped item carried ([`EdgeSender::measure_drops`]).
    measure: Option<fn(&T) -> u64>,
}

impl<T> Clone for EdgeSender<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            evict: self.evict.clone(),
            consumers: self.consumers.clone(),
            stats: Arc::clone(&self.stats),
            measure: self.measure,
        }
    }
}

/// The receiving side of an edge.
#[derive(Debug)]
pub struct EdgeReceiver<T> {
    rx: cb::Receiver<Envelope<T>>,
    alive: Arc<()>,
    stats: Arc<EdgeStats>,
}

impl<T> Clone for EdgeReceiver<T> {
    fn clone(&self) -> Self {
        Self {
            rx: self.rx.clone(),
            alive: Arc::clone(&self.alive),
            stats: Arc::clone(&self.stats),
        }
    }
}

/// Builds a bounded edge named `name` holding at most `capacity` items.
///
/// # Errors
///
/// [`EdgeError::ZeroCapacity`] when `capacity` is 0.
pub fn try_edge<T: Send>(
    name: &str,
    capacity: usize,
    policy: FullPolicy,
) -> Result<(EdgeSender<T>, EdgeReceiver<T>), EdgeError> {
    if capacity == 0 {
        return Err(EdgeError::ZeroCapacity {
            name: name.to_owned(),
        });
    }
    let (tx, rx) = cb::bounded(capacity);
    let stats = Arc::new(EdgeStats::new(name, capacity, policy));
    let alive = Arc::new(());
    let sender = EdgeSender {
        tx,
        evict: match policy {
            FullPolicy::Block => None,
            FullPolicy::DropOldest => Some(rx.clone()),
        },
        consumers: Arc::downgrade(&alive),
        stats: Arc::clone(&stats),
        measure: None,
    };
    let receiver = EdgeReceiver { rx, alive, stats };
    Ok((sender, receiver))
}

/// Builds a bounded edge; for capacities fixed in code.
///
/// # Panics
///
/// When `capacity` is 0 — a programming error. Use [`try_edge`] for
/// capacities that come from configuration.
#[must_use]
pub fn edge<T: Send>(
    name: &str,
    capacity: usize,
    policy: FullPolicy,
) -> (EdgeSender<T>, EdgeReceiver<T>) {
    match try_edge(name, capacity, policy) {
        Ok(pair) => pair,
        Err(e) => panic!("{e}"),
    }
}

impl<T> EdgeSender<T> {
    /// Counts what each dropped item carried as `measure` says (e.g. the
    /// audio frames of an audio block), so drops on different edges can be
    /// added in one unit ([`EdgeStats::dropped_units`]). Set it before
    /// cloning the sender; clones measure alike.
    #[must_use]
    pub fn measure_drops(mut self, measure: fn(&T) -> u64) -> Self {
        self.measure = Some(measure);
        self
    }

    /// Sends `item`, stamped with the current instant.
    ///
    /// With [`FullPolicy::Block`] this waits while the queue is full. With
    /// [`FullPolicy::DropOldest`] it never waits: while the queue is full it
    /// removes the oldest item and counts it as dropped, then enqueues.
    ///
    /// # Errors
    ///
    /// [`Disconnected`] when every receiver is gone; the item is discarded
    /// and not counted as sent.
    pub fn send(&self, item: T) -> Result<(), Disconnected> {
        self.send_stamped(item, Instant::now())
    }

    /// Sends `item` stamped as enqueued at `enqueued` (the runtime stamps the
    /// emit instant it records). Behaves as [`EdgeSender::send`].
    ///
    /// # Errors
    ///
    /// As [`EdgeSender::send`].
    pub fn send_stamped(&self, item: T, enqueued: Instant) -> Result<(), Disconnected> {
        let mut envelope = Envelope { item, enqueued };
        match &self.evict {
            None => {
                if self.tx.send(envelope).is_err() {
                    return Err(Disconnected);
                }
            }
            Some(evict) => {
                if self.consumers.strong_count() == 0 {
                    return Err(Disconnected);
                }
                loop {
                    match self.tx.try_send(envelope) {
                        Ok(()) => break,
                        Err(cb::TrySendError::Disconnected(_)) => return Err(Disconnected),
                        Err(cb::TrySendError::Full(back)) => {
                            envelope = back;
                            // A consumer may empty a slot between the failed
                            // send and this pop: then nothing is evicted and
                            // the send is simply retried. Only an item
                            // actually removed here is counted.
                            if let Ok(old) = evict.try_recv() {
                                let units = self.measure.map_or(1, |m| m(&old.item));
                                self.stats.dropped_units.fetch_add(units, Ordering::AcqRel);
                                self.stats.dropped.fetch_add(1, Ordering::AcqRel);
                            }
                        }
                    }
                }
            }
        }
        self.stats.sent.fetch_add(1, Ordering::AcqRel);
        self.stats
            .max_depth
            .fetch_max(self.tx.len(), Ordering::AcqRel);
        Ok(())
    }

    /// Sends `item` only if that does not wait: on a full [`FullPolicy::Block`]
    /// edge it is handed back. A [`FullPolicy::DropOldest`] edge never waits,
    /// so this is [`EdgeSender::send_stamped`] there.
    ///
    /// # Errors
    ///
    /// [`TrySend::Full`] with the item, or [`TrySend::Disconnected`] when
    /// every receiver is gone.
    pub fn try_send_stamped(&self, item: T, enqueued: Instant) -> Result<(), TrySend<T>> {
        if self.evict.is_some() {
            return self
                .send_stamped(item, enqueued)
                .map_err(|Disconnected| TrySend::Disconnected);
        }
        match self.tx.try_send(Envelope { item, enqueued }) {
            Ok(()) => {
                self.stats.sent.fetch_add(1, Ordering::AcqRel);
                self.stats
                    .max_depth
                    .fetch_max(self.tx.len(), Ordering::AcqRel);
                Ok(())
            }
            Err(cb::TrySendError::Full(e)) => Err(TrySend::Full(e.item)),
            Err(cb::TrySendError::Disconnected(_)) => Err(TrySend::Disconnected),
        }
    }

    /// Items queued now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tx.len()
    }

    /// Whether the queue is empty now.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tx.is_empty()
    }

    /// Whether every receiver is gone.
    #[must_use]
    pub fn is_disconnected(&self) -> bool {
        self.consumers.strong_count() == 0
    }

    /// The edge's shared counters.
    #[must_use]
    pub fn stats(&self) -> Arc<EdgeStats> {
        Arc::clone(&self.stats)
    }

    /// The edge's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.stats.name()
    }
}

impl<T> EdgeReceiver<T> {
    fn count(&self, envelope: Envelope<T>) -> Envelope<T> {
        self.stats.received.fetch_add(1, Ordering::AcqRel);
        envelope
    }

    /// Waits for the next item.
    ///
    /// # Errors
    ///
    /// [`Disconnected`] once every sender is gone and the queue is empty.
    pub fn recv(&self) -> Result<Envelope<T>, Disconnected> {
        self.rx
            .recv()
            .map(|e| self.count(e))
            .map_err(|_| Disconnected)
    }

    /// Waits at most `timeout` for the next item.
    ///
    /// # Errors
    ///
    /// [`RecvTimeoutError::Timeout`] when nothing arrived in time;
    /// [`RecvTimeoutError::Disconnected`] once every sender is gone and the
    /// queue is empty.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Envelope<T>, RecvTimeoutError> {
        self.rx
            .recv_timeout(timeout)
            .map(|e| self.count(e))
            .map_err(|e| match e {
                cb::RecvTimeoutError::Timeout => RecvTimeoutError::Timeout,
                cb::RecvTimeoutError::Disconnected => RecvTimeoutError::Disconnected,
            })
    }

    /// Takes the next item if one is queued.
    ///
    /// # Errors
    ///
    /// [`TryRecvError::Empty`] when the queue is empty;
    /// [`TryRecvError::Disconnected`] once every sender is gone and the queue
    /// is empty.
    pub fn try_recv(&self) -> Result<Envelope<T>, TryRecvError> {
        self.rx
            .try_recv()
            .map(|e| self.count(e))
            .map_err(|e| match e {
                cb::TryRecvError::Empty => TryRecvError::Empty,
                cb::TryRecvError::Disconnected => TryRecvError::Disconnected,
            })
    }

    /// Takes every item queued now, without waiting.
    pub fn try_iter(&self) -> impl Iterator<Item = Envelope<T>> + '_ {
        self.rx.try_iter().map(|e| self.count(e))
    }

    /// Iterates, waiting for each item, until every sender is gone and the
    /// queue is empty.
    pub fn iter(&self) -> impl Iterator<Item = Envelope<T>> + '_ {
        self.rx.iter().map(|e| self.count(e))
    }

    /// Items queued now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether the queue is empty now.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    /// The edge's shared counters.
    #[must_use]
    pub fn stats(&self) -> Arc<EdgeStats> {
        Arc::clone(&self.stats)
    }

    /// The edge's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.stats.name()
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;

    #[test]
    fn zero_capacity_is_a_typed_error() {
        let err = try_edge::<u32>("audio", 0, FullPolicy::Block).unwrap_err();
        assert_eq!(
            err,
            EdgeError::ZeroCapacity {
                name: "audio".into()
            }
        );
        assert!(err.to_string().contains("audio"));
    }

    #[test]
    fn envelopes_carry_the_enqueue_instant() {
        let (tx, rx) = edge::<u32>("e", 4, FullPolicy::Block);
        let before = Instant::now();
        tx.send(1).unwrap();
        let after = Instant::now();
        let env = rx.recv().unwrap();
        assert_eq!(env.item, 1);
        assert!(env.enqueued >= before && env.enqueued <= after);
        let at = Instant::now();
        tx.send_stamped(2, at).unwrap();
        assert_eq!(rx.recv().unwrap().enqueued, at);
    }

    #[test]
    fn drop_oldest_discards_exactly_the_oldest() {
        let (tx, rx) = edge::<u32>("audio", 3, FullPolicy::DropOldest);
        for i in 0..10 {
            tx.send(i).unwrap();
        }
        let got: Vec<u32> = rx.try_iter().map(|e| e.item).collect();
        assert_eq!(got, vec![7, 8, 9]);
        let s = rx.stats().snapshot();
        assert_eq!(s.sent, 10);
        assert_eq!(s.dropped, 7);
        assert_eq!(s.received, 3);
        assert_eq!(s.max_depth, 3);
        assert_eq!(s.policy, FullPolicy::DropOldest);
    }

    #[test]
    fn drops_are_measured_in_what_the_items_carried() {
        // blocks of audio of different lengths: 100 + 200 + 300 frames evicted
        let (tx, rx) = edge::<Vec<f32>>("audio", 1, FullPolicy::DropOldest);
        let tx = tx.measure_drops(|b| b.len() as u64);
        let tx2 = tx.clone();
        for n in [100, 200, 300] {
            tx.send(vec![0.0; n]).unwrap();
        }
        tx2.send(vec![0.0; 50]).unwrap();
        assert_eq!(rx.recv().unwrap().item.len(), 50);
        let s = rx.stats().snapshot();
        assert_eq!((s.dropped, s.dropped_units), (3, 600));
        // unmeasured: one unit per item
        let (tx, rx) = edge::<u32>("e", 1, FullPolicy::DropOldest);
        for i in 0..3 {
            tx.send(i).unwrap();
        }
        assert_eq!(rx.stats().dropped_units(), 2);
    }

    #[test]
    fn unreported_drops_are_claimed_once() {
        let (tx, _rx) = edge::<u32>("audio", 1, FullPolicy::DropOldest);
        for i in 0..4 {
            tx.send(i).unwrap();
        }
        let stats = tx.stats();
        assert_eq!(stats.take_unreported_drops(), 3);
        assert_eq!(stats.take_unreported_drops(), 0);
        tx.send(9).unwrap();
        assert_eq!(stats.take_unreported_drops(), 1);
    }

    #[test]
    fn send_fails_once_the_receiver_is_gone() {
        for policy in [FullPolicy::Block, FullPolicy::DropOldest] {
            let (tx, rx) = edge::<u32>("e", 2, policy);
            assert!(!tx.is_disconnected());
            drop(rx);
            assert!(tx.is_disconnected());
            assert_eq!(tx.send(1), Err(Disconnected));
            assert_eq!(tx.stats().sent(), 0);
        }
    }

    #[test]
    fn a_blocked_sender_wakes_when_the_receiver_goes() {
        let (tx, rx) = edge::<u32>("e", 1, FullPolicy::Block);
        tx.send(0).unwrap();
        let producer = thread::spawn(move || tx.send(1));
        // Let the producer block on the full queue (if it gets there first,
        // it still must observe the disconnection).
        thread::sleep(Duration::from_millis(20));
        drop(rx);
        assert_eq!(producer.join().unwrap(), Err(Disconnected));
    }

    #[test]
    fn recv_reports_disconnection_after_draining() {
        let (tx, rx) = edge::<u32>("e", 2, FullPolicy::Block);
        tx.send(5).unwrap();
        drop(tx);
        assert_eq!(rx.recv().unwrap().item, 5);
        assert_eq!(rx.recv(), Err(Disconnected));
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(1)),
            Err(RecvTimeoutError::Disconnected)
        );
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    #[test]
    fn recv_timeout_and_try_recv_on_an_empty_live_edge() {
        let (_tx, rx) = edge::<u32>("e", 2, FullPolicy::Block);
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(1)),
            Err(RecvTimeoutError::Timeout)
        );
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }
}
