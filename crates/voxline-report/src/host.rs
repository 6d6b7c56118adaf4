//! The host's speed, measured beside a run, so that a budget set on one
//! machine can be held on a slower one and two reports from different
//! machines can be read side by side.
//!
//! The probe is a fixed piece of work shaped like the engines': a single
//! precision matrix product (whisper's encoder and the LLM's prefill are
//! matrix products; `matrixmultiply` picks the AVX2/FMA kernel at run time,
//! as ggml's build does for the machine) and a sweep through a buffer
//! larger than the caches (the LLM's decode streams its weights). It runs
//! on as many threads as the pipeline's CPU budget, each thread on its own
//! data, [`REPS`] times; the probe's figure is the median time of one
//! repetition. None of voxline's code is in it: a regression in the
//! pipeline or its engine settings moves the run's figures and not the
//! probe's, so scaling a budget by the probe hides the machine and not the
//! change.
//!
//! The probe runs before the models load and again after the run; the
//! report keeps both, and [`HostSpeed::probe_ms`] is their mean, so a host
//! that slows down (or speeds up) during the run is seen by half.

use std::time::Instant;

use ndarray::Array2;
use serde::{Deserialize, Serialize};

/// Repetitions per probe; the probe's figure is their median.
pub const REPS: usize = 7;
/// The matrices' side: 256 × 256 × 256 is 33.6 M multiply-adds.
const SIDE: usize = 256;
/// Matrix products per repetition: about three quarters of the probe's time
/// (the engines' latency is mostly whisper's encoder, a compute-bound product).
const PRODUCTS: usize = 24;
/// The buffer swept per repetition and thread: 32 MiB of `f32`, larger than
/// the caches of the machines voxline runs on.
const SWEEP_FLOATS: usize = 8 << 20;
/// Sweeps of the buffer per repetition.
const SWEEPS: usize = 2;

/// The host's speed as the probe measured it beside one run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HostSpeed {
    /// Threads the probe ran on (the pipeline's CPU budget).
    pub threads: usize,
    /// The probe before the models loaded, ms (median of [`REPS`]).
    pub before_ms: f64,
    /// The probe after the run, ms (median of [`REPS`]).
    pub after_ms: f64,
    /// The figure budgets scale by: the mean of `before_ms` and `after_ms`.
    pub probe_ms: f64,
}

/// A probe taken before a run, waiting for the one after it.
#[derive(Debug, Clone, Copy)]
pub struct HostProbe {
    threads: usize,
    before_ms: f64,
}

impl HostProbe {
    /// Probes the host on `threads` threads (at least 1) before the run.
    #[must_use]
    pub fn before(threads: usize) -> Self {
        let threads = threads.max(1);
        Self {
            threads,
            before_ms: probe_ms(threads),
        }
    }

    /// Probes the host again after the run and returns both.
    #[must_use]
    pub fn after(self) -> HostSpeed {
        let after_ms = probe_ms(self.threads);
        HostSpeed {
            threads: self.threads,
            before_ms: self.before_ms,
            after_ms,
            probe_ms: (self.before_ms + after_ms) / 2.0,
        }
    }
}

/// One probe on `threads` threads: the median of [`REPS`] repetitions, in
/// ms, each the wall time until every thread has done its share.
#[must_use]
pub fn probe_ms(threads: usize) -> f64 {
    let threads = threads.max(1);
    let work: Vec<Work> = (0..threads).map(|i| Work::new(i as f32)).collect();
    let mut times: Vec<f64> = (0..REPS)
        .map(|_| {
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for w in &work {
                    s.spawn(move || std::hint::black_box(w.run()));
                }
            });
            t0.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[REPS / 2]
}

/// One thread's data.
struct Work {
    a: Array2<f32>,
    b: Array2<f32>,
    sweep: Vec<f32>,
}

impl Work {
    fn new(seed: f32) -> Self {
        let a = Array2::from_shape_fn((SIDE, SIDE), |(i, j)| {
            ((i * 7 + j * 3) % 11) as f32 * 0.01 + seed
        });
        let b = Array2::from_shape_fn((SIDE, SIDE), |(i, j)| ((i * 5 + j) % 13) as f32 * 0.01);
        let sweep = (0..SWEEP_FLOATS).map(|i| (i % 17) as f32).collect();
        Self { a, b, sweep }
    }

    /// The repetition's work; its result keeps the optimiser from dropping it.
    fn run(&self) -> f32 {
        let mut acc = 0.0;
        for _ in 0..PRODUCTS {
            acc += self.a.dot(&self.b)[(SIDE / 2, SIDE / 3)];
        }
        for _ in 0..SWEEPS {
            // eight lanes so the sum vectorises; every float is read
            let mut lanes = [0.0f32; 8];
            for chunk in self.sweep.chunks_exact(8) {
                for (l, x) in lanes.iter_mut().zip(chunk) {
                    *l += x;
                }
            }
            acc += lanes.iter().sum::<f32>();
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_is_what_it_says_and_the_figure_is_the_mean_of_both_probes() {
        // the product's element, checked against a plain triple loop
        let w = Work::new(0.5);
        let (i, j) = (SIDE / 2, SIDE / 3);
        let by_hand: f32 = (0..SIDE).map(|k| w.a[(i, k)] * w.b[(k, j)]).sum();
        let product = w.a.dot(&w.b)[(i, j)];
        assert!(
            (product - by_hand).abs() < 1e-3 * by_hand.abs(),
            "{product} vs {by_hand}"
        );
        // every float of the sweep is read: 0..16 repeated
        let sum: f64 = w.sweep.iter().map(|&x| f64::from(x)).sum();
        let whole = (SWEEP_FLOATS / 17) as f64 * 136.0
            + (0..SWEEP_FLOATS % 17).map(|x| x as f64).sum::<f64>();
        assert_eq!(sum, whole);

        let probe = HostProbe::before(0);
        let speed = probe.after();
        assert_eq!(speed.threads, 1, "at least one thread");
        assert!(speed.before_ms > 0.0 && speed.after_ms > 0.0, "{speed:?}");
        assert_eq!(speed.probe_ms, (speed.before_ms + speed.after_ms) / 2.0);
    }
}
