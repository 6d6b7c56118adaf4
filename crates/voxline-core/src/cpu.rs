//! The CPU budget: who computes, with how many threads, and when.
//!
//! ggml's worker threads spin while they wait for each other, so two engines
//! computing at once on the same cores — or one engine with more threads than
//! there are free cores — collapse each other's throughput (by 10× and more).
//! Three pieces keep the pipeline inside its budget:
//!
//! - [`CpuLease`]: one engine computes at a time, and the one on the current
//!   turn's critical path goes first ([`Priority`]). A holder working in
//!   steps (token by token) lets a more urgent waiter in at a step boundary.
//! - [`ThreadMeter`]: counts the engine threads running right now and keeps
//!   the peak, so a test can prove the budget was never exceeded.
//! - [`CpuGovernor`]: notices cores taken by other processes and gives the
//!   engines fewer threads while they are (Linux `/proc`; elsewhere it always
//!   grants the whole budget).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How urgent a piece of engine work is; the lease goes to the highest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Work on a turn whose end is not confirmed (it may be thrown away).
    Speculative,
    /// Decoding an answer that is already streaming.
    Streaming,
    /// A committed turn's prefill and first token.
    FirstToken,
    /// A committed turn's transcription: the user is waiting for it.
    Committed,
}

#[derive(Debug, Default)]
struct LeaseState {
    /// Holders never yield (see [`CpuLease::non_preemptive`]).
    no_preemption: bool,
    /// The holder's ticket and priority.
    holder: Option<(u64, Priority)>,
    /// Waiting tickets and their priorities.
    waiting: Vec<(u64, Priority)>,
    next_ticket: u64,
}

impl LeaseState {
    /// Whether `ticket` is the waiter that should go next: highest priority, then oldest.
    fn is_next(&self, ticket: u64) -> bool {
        self.waiting
            .iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .is_some_and(|(t, _)| *t == ticket)
    }
}

/// A CPU lease shared by the stages whose engines use the same cores: at most
/// one holds it at a time, and when it is released the most urgent waiter
/// ([`Priority`]) gets it, first come first served within a priority.
///
/// The runtime takes the lease for a leased stage after an item is received
/// and before the stage starts on it, so waiting for the cores is recorded as
/// queue wait, not as work.
#[derive(Debug, Clone, Default)]
pub struct CpuLease(Arc<(Mutex<LeaseState>, Condvar)>);

/// A held lease; dropping it lets the next waiter in.
#[derive(Debug)]
pub struct LeaseGuard {
    lease: CpuLease,
    ticket: u64,
    priority: Priority,
}

impl CpuLease {
    /// A new, free lease.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, LeaseState> {
        crate::sync::lock(&self.0 .0)
    }

    /// Waits for the lease at `priority` and takes it.
    #[must_use]
    pub fn acquire(&self, priority: Priority) -> LeaseGuard {
        LeaseGuard {
            lease: self.clone(),
            ticket: self.wait_for(priority),
            priority,
        }
    }

    /// Takes the lease at `priority` if it is free and nobody is waiting
    /// for it; never waits.
    #[must_use]
    pub fn try_acquire(&self, priority: Priority) -> Option<LeaseGuard> {
        let mut st = self.state();
        if st.holder.is_some() || !st.waiting.is_empty() {
            return None;
        }
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.holder = Some((ticket, priority));
        Some(LeaseGuard {
            lease: self.clone(),
            ticket,
            priority,
        })
    }

    /// A lease whose holders never yield to more urgent waiters: the order
    /// of turns still follows priority, but each call runs to its end. For
    /// measuring service times (fast replay), where the waits a yield adds
    /// would be counted into a call and every queued turn is "urgent".
    #[must_use]
    pub fn non_preemptive() -> Self {
        let lease = Self::default();
        lease.state().no_preemption = true;
        lease
    }

    /// Queues at `priority`, waits until it is this ticket's turn, takes the lease.
    fn wait_for(&self, priority: Priority) -> u64 {
        let (_, cv) = &*self.0;
        let mut st = self.state();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.waiting.push((ticket, priority));
        while st.holder.is_some() || !st.is_next(ticket) {
            st = cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        st.waiting.retain(|(t, _)| *t != ticket);
        st.holder = Some((ticket, priority));
        ticket
    }

    /// Whether someone is waiting at a priority above `than`.
    #[must_use]
    pub fn wanted_above(&self, than: Priority) -> bool {
        let st = self.state();
        !st.no_preemption && st.waiting.iter().any(|(_, p)| *p > than)
    }
}

impl LeaseGuard {
    /// The priority the lease is held at.
    #[must_use]
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Changes the priority the lease is held (and, after a yield, asked for) at.
    pub fn set_priority(&mut self, priority: Priority) {
        self.priority = priority;
        if let Some(h) = self.lease.state().holder.as_mut() {
            if h.0 == self.ticket {
                h.1 = priority;
            }
        }
    }

    /// If a more urgent waiter is queued, lets it go first and waits for the
    /// lease again; returns how long that took (zero when nobody was waiting).
    pub fn yield_to_urgent(&mut self) -> Duration {
        if !self.lease.wanted_above(self.priority) {
            return Duration::ZERO;
        }
        let started = Instant::now();
        release(&self.lease, self.ticket);
        self.ticket = self.lease.wait_for(self.priority);
        started.elapsed()
    }
}

fn release(lease: &CpuLease, ticket: u64) {
    let mut st = lease.state();
    if st.holder.is_some_and(|(t, _)| t == ticket) {
        st.holder = None;
    }
    drop(st);
    lease.0 .1.notify_all();
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        release(&self.lease, self.ticket);
    }
}

/// The engines' cores, held for a stage's work while they were free (see
/// [`Emitter::free_cores`](crate::Emitter::free_cores)); dropping it lets
/// the engines in again.
#[derive(Debug)]
pub struct FreeCores {
    // fields drop in order: the threads stop counting before the lease lets
    // an engine in (the other way round, an engine's threads were counted
    // beside ones already done: a peak of 4 on 2 cores)
    pub(crate) _meter: MeterGuard,
    pub(crate) _lease: LeaseGuard,
}

/// Counts engine threads running right now and the most ever at once.
#[derive(Debug, Clone, Default)]
pub struct ThreadMeter(Arc<(AtomicUsize, AtomicUsize)>);

/// Threads counted by a [`ThreadMeter`] until dropped.
#[derive(Debug)]
pub struct MeterGuard {
    meter: ThreadMeter,
    threads: usize,
}

impl ThreadMeter {
    /// A meter at zero.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts `threads` engine threads as running until the guard drops.
    #[must_use]
    pub fn enter(&self, threads: usize) -> MeterGuard {
        let now = self.0 .0.fetch_add(threads, Ordering::AcqRel) + threads;
        self.0 .1.fetch_max(now, Ordering::AcqRel);
        MeterGuard {
            meter: self.clone(),
            threads,
        }
    }

    /// The most engine threads that ran at once.
    #[must_use]
    pub fn peak(&self) -> usize {
        self.0 .1.load(Ordering::Acquire)
    }

    /// Engine threads running now.
    #[must_use]
    pub fn running(&self) -> usize {
        self.0 .0.load(Ordering::Acquire)
    }
}

impl Drop for MeterGuard {
    fn drop(&mut self) {
        self.meter.0 .0.fetch_sub(self.threads, Ordering::AcqRel);
    }
}

/// Cumulative CPU time, in clock ticks: the machine's busy time that
/// competes with this process, and this process's own.
///
/// Time spent by processes at a lower priority (a positive nice value:
/// the `nice` column of `/proc/stat`) does not compete: the scheduler gives
/// a nice-19 process ~1.5 % of a core against one at 0, so a background
/// job at the lowest priority left the engines one thread where they could
/// have had two (issue 61). It is left out while this process itself runs
/// at nice 0 or below; a niced voxline counts everything, its own time
/// being in that column too.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let own = std::fs::read_to_string("/proc/self/stat").ok()?;
    competing_ticks(&stat, &own)
}

/// [`cpu_ticks`] from the text of `/proc/stat` and `/proc/self/stat`.
fn competing_ticks(stat: &str, own: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // fields after the command name (which may hold spaces) in parentheses
    let rest = own.rsplit_once(')')?.1;
    // state, ppid, pgrp, session, tty_nr, tpgid (-1 without a terminal), flags,
    // minflt, cminflt, majflt, cmajflt, utime, stime, cutime, cstime,
    // priority, nice: fields 3..=19 of the line
    let g: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = g.get(11)?.parse().ok()?;
    let stime: u64 = g.get(12)?.parse().ok()?;
    let nice: i64 = g.get(16)?.parse().ok()?;
    // user nice system idle iowait irq softirq steal …: busy = all − idle − iowait
    let total: u64 = f.iter().take(8).sum();
    let field = |i: usize| f.get(i).copied().unwrap_or(0);
    let lower = if nice <= 0 { field(1) } else { 0 };
    let busy = total.saturating_sub(field(3) + field(4) + lower);
    Some((busy, utime + stime))
}

#[derive(Debug)]
struct GovernorState {
    last: Option<(Instant, u64, u64)>,
    /// Cores other processes kept busy over the last interval.
    external: f64,
}

/// Grants engine threads out of a budget, minus the cores other processes
/// are keeping busy: a spinning ggml thread that has to share its core with
/// another process stalls every other thread of its engine at each barrier,
/// so fewer threads on free cores beat more threads on busy ones. Processes
/// at a lower priority than this one do not count: the scheduler gives
/// their core to the engine's thread.
///
/// It samples the machine's and this process's CPU time (at most every
/// 250 ms) and grants `budget − round(external busy cores)` threads, at
/// least one.
#[derive(Debug, Clone)]
pub struct CpuGovernor {
    budget: usize,
    state: Arc<Mutex<GovernorState>>,
    adaptive: bool,
}

impl CpuGovernor {
    /// A governor for `budget` threads; `adaptive` = watch other processes
    /// (off = always grant the whole budget).
    #[must_use]
    pub fn new(budget: usize, adaptive: bool) -> Self {
        let g = Self {
            budget: budget.max(1),
            state: Arc::new(Mutex::new(GovernorState {
                last: None,
                external: 0.0,
            })),
            adaptive,
        };
        g.sample();
        g
    }

    /// The whole budget.
    #[must_use]
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Cores other processes kept busy over the last sampled interval.
    #[must_use]
    pub fn external_load(&self) -> f64 {
        self.sample();
        crate::sync::lock(&self.state).external
    }

    /// Threads to use now.
    #[must_use]
    pub fn threads(&self) -> usize {
        if !self.adaptive {
            return self.budget;
        }
        let busy = self.external_load().round() as usize;
        self.budget.saturating_sub(busy).max(1)
    }

    fn sample(&self) {
        if !self.adaptive {
            return;
        }
        let Some((busy, own)) = cpu_ticks() else {
            return;
        };
        let now = Instant::now();
        let mut st = crate::sync::lock(&self.state);
        match st.last {
            Some((at, _, _)) if now.duration_since(at) < Duration::from_millis(250) => {}
            Some((at, b0, o0)) => {
                let secs = now.duration_since(at).as_secs_f64();
                // clock ticks are 1/100 s on Linux
                let external =
                    (busy.saturating_sub(b0) as f64 - own.saturating_sub(o0) as f64) / 100.0 / secs;
                st.external = external.max(0.0);
                st.last = Some((now, busy, own));
            }
            None => st.last = Some((now, busy, own)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_urgent_waiter_goes_next() {
        let lease = CpuLease::new();
        let held = lease.acquire(Priority::Streaming);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for (i, p) in [
            Priority::Speculative,
            Priority::Committed,
            Priority::FirstToken,
        ]
        .into_iter()
        .enumerate()
        {
            let (l, order) = (lease.clone(), order.clone());
            threads.push(std::thread::spawn(move || {
                let _g = l.acquire(p);
                order.lock().unwrap().push(p);
            }));
            // each is queued before the next arrives
            while lease.state().waiting.len() < i + 1 {
                std::thread::yield_now();
            }
        }
        assert!(lease.wanted_above(Priority::Streaming));
        assert!(!lease.wanted_above(Priority::Committed));
        drop(held);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            [
                Priority::Committed,
                Priority::FirstToken,
                Priority::Speculative
            ]
        );
    }

    #[test]
    fn a_streaming_holder_yields_to_urgent_work_only() {
        let lease = CpuLease::new();
        let mut g = lease.acquire(Priority::Streaming);
        assert_eq!(g.yield_to_urgent(), Duration::ZERO, "nobody waiting");
        let spec = {
            let lease = lease.clone();
            std::thread::spawn(move || drop(lease.acquire(Priority::Speculative)))
        };
        while lease.state().waiting.is_empty() {
            std::thread::yield_now();
        }
        assert_eq!(
            g.yield_to_urgent(),
            Duration::ZERO,
            "speculative work waits"
        );
        let ran = Arc::new(AtomicUsize::new(0));
        let urgent = {
            let (lease, ran) = (lease.clone(), ran.clone());
            std::thread::spawn(move || {
                let _g = lease.acquire(Priority::Committed);
                ran.fetch_add(1, Ordering::SeqCst);
            })
        };
        while lease.state().waiting.len() < 2 {
            std::thread::yield_now();
        }
        let _ = g.yield_to_urgent();
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "the committed work ran during the yield"
        );
        assert_eq!(lease.state().holder.map(|h| h.1), Some(Priority::Streaming));
        drop(g);
        urgent.join().unwrap();
        spec.join().unwrap();
        assert!(lease.state().holder.is_none());
        let calm = CpuLease::non_preemptive();
        let _g = calm.acquire(Priority::Streaming);
        calm.state().waiting.push((99, Priority::Committed));
        assert!(!calm.wanted_above(Priority::Streaming), "never yields");
    }

    #[test]
    fn try_acquire_takes_only_a_free_lease_nobody_waits_for() {
        let lease = CpuLease::new();
        let g = lease.try_acquire(Priority::Committed).expect("free");
        assert_eq!(lease.state().holder.map(|h| h.1), Some(Priority::Committed));
        assert!(lease.try_acquire(Priority::Committed).is_none(), "held");
        // a waiter queued for it gets it first, though it is free for an instant
        let waiter = {
            let lease = lease.clone();
            std::thread::spawn(move || lease.acquire(Priority::Speculative))
        };
        while lease.state().waiting.is_empty() {
            std::thread::yield_now();
        }
        lease.state().holder = None;
        assert!(lease.try_acquire(Priority::Committed).is_none(), "queued");
        lease.state().holder = Some((g.ticket, g.priority));
        drop(g);
        drop(waiter.join().unwrap());
        assert!(lease.state().holder.is_none() && lease.state().waiting.is_empty());
        assert!(
            lease.try_acquire(Priority::Speculative).is_some(),
            "free again"
        );
    }

    #[test]
    fn the_meter_keeps_the_peak() {
        let m = ThreadMeter::new();
        {
            let _a = m.enter(2);
            let _b = m.enter(1);
            assert_eq!(m.running(), 3);
        }
        let _c = m.enter(1);
        assert_eq!((m.running(), m.peak()), (1, 3));
    }

    #[test]
    fn the_governor_grants_at_least_one_thread() {
        let g = CpuGovernor::new(4, false);
        assert_eq!(g.threads(), 4);
        let g = CpuGovernor::new(2, true);
        std::thread::sleep(Duration::from_millis(300));
        let n = g.threads();
        assert!((1..=2).contains(&n), "{n}");
        assert!(g.external_load() >= 0.0);
    }

    #[test]
    fn own_cpu_time_is_not_counted_as_external_load() {
        if cpu_ticks().is_none() {
            return; // no /proc here
        }
        let g = CpuGovernor::new(2, true);
        let (_, own0) = cpu_ticks().unwrap();
        // keep one core busy in this process for a while
        let until = Instant::now() + Duration::from_millis(600);
        let mut x = 0u64;
        while Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let (_, own1) = cpu_ticks().unwrap();
        assert!(own1 > own0, "this process's own CPU time is read");
        let load = g.external_load();
        // what else runs on the machine is not ours to know, but our own busy core is not in it
        assert!(load < 2.0, "{load}");
    }

    #[test]
    fn time_at_a_lower_priority_does_not_compete_unless_voxline_is_niced_too() {
        // cpu user nice system idle iowait irq softirq steal
        let stat = "cpu  1000 500 200 3000 100 10 20 0 0 0\ncpu0 1 2 3 4\n";
        // pid (comm with spaces) state … utime 40 stime 10 … priority 20 nice 0
        let own = |nice: i32| {
            format!("42 (vox line) S 1 42 42 0 -1 4194560 10 0 0 0 40 10 0 0 20 {nice} 9 0 100")
        };
        assert_eq!(competing_ticks(stat, &own(0)), Some((1230, 50)));
        assert_eq!(competing_ticks(stat, &own(-5)), Some((1230, 50)));
        assert_eq!(competing_ticks(stat, &own(10)), Some((1730, 50)));
        assert_eq!(competing_ticks("", &own(0)), None);
        assert_eq!(competing_ticks(stat, "42 (x) S 1"), None);
    }

    #[test]
    fn the_governor_sees_another_process_keep_a_core_busy() {
        if cpu_ticks().is_none() {
            return; // no /proc here
        }
        let g = CpuGovernor::new(2, true);
        // the load the governor reads while `command` loops
        let load_beside = |command: &[&str]| {
            let mut child = std::process::Command::new(command[0])
                .args(&command[1..])
                .args(["sh", "-c", "while :; do :; done"])
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(300));
            let _ = g.external_load();
            std::thread::sleep(Duration::from_millis(600));
            let load = g.external_load();
            child.kill().unwrap();
            let _ = child.wait();
            load
        };
        let load = load_beside(&["env"]);
        assert!(
            load >= 0.6,
            "a busy-looping process is at least ~one core: {load}"
        );
        // the same loop at the lowest priority leaves the engines its core
        let niced = load_beside(&["nice", "-n", "19"]);
        assert!(
            niced <= load - 0.5,
            "a loop at nice 19 is no competitor: {niced} against {load} at nice 0"
        );
    }

    #[test]
    fn free_cores_stop_counting_before_the_lease_lets_an_engine_in() {
        let (lease, meter) = (CpuLease::new(), ThreadMeter::new());
        let cores = FreeCores {
            _meter: meter.enter(2),
            _lease: lease.try_acquire(Priority::Committed).expect("free"),
        };
        let (l, m) = (lease.clone(), meter.clone());
        let engine = std::thread::spawn(move || {
            let _g = l.acquire(Priority::Committed);
            m.running()
        });
        while lease.state().waiting.is_empty() {
            std::thread::yield_now();
        }
        drop(cores);
        assert_eq!(
            engine.join().expect("no panic"),
            0,
            "counted past their end"
        );
        assert_eq!(meter.peak(), 2);
    }
}
