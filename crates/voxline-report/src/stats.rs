//! Percentiles over a run's measurements (hdrhistogram, microsecond resolution).

use serde::Serialize;

/// p50/p90/p95/p99 of a set of millisecond values, with their count.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
    /// Mean.
    pub mean: f64,
    /// Number of values.
    pub n: usize,
    /// False when n < 100: a p99 from so few values is really the maximum.
    pub p99_meaningful: bool,
}

impl Percentiles {
    /// Percentiles of `values_ms` (negative values are clamped to 0). `None` for an empty set.
    #[must_use]
    pub fn of(values_ms: &[f64]) -> Option<Self> {
        let mut s = Series::new();
        for v in values_ms {
            s.record(*v);
        }
        s.percentiles()
    }
}

/// A table cell in the Markdown reports: `v` with `decimals` decimals, or
/// `–` when there is no value.
#[must_use]
pub fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |x| format!("{x:.decimals$}"))
}

/// A stream of millisecond values summarised in constant memory: an
/// hdrhistogram (1 µs to 1 hour, 3 significant digits), their exact sum and
/// count. [`Series::percentiles`] equals [`Percentiles::of`] over the same
/// values in the same order, so a long session need not keep the values.
#[derive(Debug, Clone)]
pub struct Series {
    h: Option<hdrhistogram::Histogram<u64>>,
    sum: f64,
    n: usize,
}

impl Default for Series {
    fn default() -> Self {
        Self::new()
    }
}

impl Series {
    /// An empty series.
    #[must_use]
    pub fn new() -> Self {
        Self {
            h: hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).ok(),
            sum: 0.0,
            n: 0,
        }
    }

    /// Adds one value (negative values count as 0 in the percentiles; the
    /// mean takes them as they are).
    pub fn record(&mut self, value_ms: f64) {
        if let Some(h) = &mut self.h {
            let us = (value_ms.max(0.0) * 1000.0).round() as u64;
            h.saturating_record(us.max(1));
        }
        self.sum += value_ms;
        self.n += 1;
    }

    /// Values recorded.
    #[must_use]
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether nothing was recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The percentiles so far; `None` before the first value.
    #[must_use]
    pub fn percentiles(&self) -> Option<Percentiles> {
        let h = self.h.as_ref().filter(|_| self.n > 0)?;
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
        Some(Percentiles {
            p50: q(0.50),
            p90: q(0.90),
            p95: q(0.95),
            p99: q(0.99),
            max: h.max() as f64 / 1000.0,
            mean: self.sum / self.n as f64,
            n: self.n,
            p99_meaningful: self.n >= 100,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_data() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&v).unwrap();
        assert_eq!(p.n, 100);
        assert!((p.p50 - 50.0).abs() < 0.1, "{p:?}");
        assert!((p.p90 - 90.0).abs() < 0.1, "{p:?}");
        assert!((p.p95 - 95.0).abs() < 0.1, "{p:?}");
        assert!((p.p99 - 99.0).abs() < 0.1, "{p:?}");
        assert!((p.max - 100.0).abs() < 0.1);
        assert!((p.mean - 50.5).abs() < 1e-9);
        assert!(p.p99_meaningful);
        let one = Percentiles::of(&[1234.5]).unwrap();
        assert!((one.p50 - 1234.5).abs() < 1.0 && (one.p99 - 1234.5).abs() < 1.0);
        assert!(!one.p99_meaningful);
        assert!(Percentiles::of(&[]).is_none());
        // sub-millisecond values keep their resolution
        let small = Percentiles::of(&[0.25, 0.25, 0.75]).unwrap();
        assert!((small.p50 - 0.25).abs() < 0.01, "{small:?}");
    }

    #[test]
    fn a_series_summarises_like_the_values_it_saw() {
        let v: Vec<f64> = (0..5000)
            .map(|i| f64::from((i * 7919) % 3001) * 0.37)
            .collect();
        let mut s = Series::new();
        assert!(s.percentiles().is_none() && s.is_empty());
        for x in &v {
            s.record(*x);
        }
        assert_eq!(s.len(), 5000);
        assert_eq!(s.percentiles(), Percentiles::of(&v));
    }
}
