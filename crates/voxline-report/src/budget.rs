//! Budgets: limits a run must meet, as TOML. A broken limit fails the run
//! (exit code 1), so CI can gate on it.
//!
//! ```toml
//! [response_latency_ms]   # end of speech → first token, over counted turns
//! p50 = 2500
//! p95 = 4000
//! [stt_ms]                # any of: response_latency_ms, endpoint_delay_ms,
//! p95 = 1500              # stt_ms, llm_ttft_ms — each with p50/p90/p95/p99
//! [voice_latency_ms]      # end of speech → first audio (a run that speaks)
//! p50 = 1500
//! [terms.llm_queue]       # any latency term the pipeline declares: endpoint,
//! p95 = 300               # stt_queue, stt, llm_queue, llm_first_token,
//!                         # commit_wait, and an added stage's (ms)
//! [min]
//! llm_decode_tps = 20.0   # median per-turn decode tokens/s
//! llm_prefill_tps = 100.0 # median per-turn prefill tokens/s
//! stt_rtfx = 1.0          # median audio seconds per STT second
//! [max]
//! dropped = 0             # audio dropped, 16 kHz frames (16000 = 1 s)
//! errors = 0              # turns that ended in an error
//! wer = 0.1               # mean word error rate against the sidecars
//! [host]                  # the limits were set on a host whose probe took
//! reference_ms = 60       # this long (`report.json` → host.probe_ms)
//! max_scale = 4.0         # at most this much slower is allowed for
//! ```
//!
//! With `[host]`, a run on a slower host than the reference (its probe,
//! [`crate::host`], measured beside the same run) has its time limits
//! multiplied and its rate minimums divided by `probe_ms / reference_ms`,
//! from 1 (a faster host is held to the limits as written) up to
//! `max_scale`. Limits that do not depend on the machine's speed are never
//! scaled: the endpoint delay (the endpointer's hangover, on the virtual
//! clock), the `endpoint` term, dropped audio, errors and WER.

use std::path::Path;

use serde::Deserialize;

use std::collections::BTreeMap;

use voxline_core::Topology;

use crate::stats::Percentiles;
use crate::{BudgetCheck, BudgetResult, Report};
use voxline_pipeline::BadInput;

/// Upper limits on percentiles, in ms.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PercentileLimits {
    /// Limit on the median.
    pub p50: Option<f64>,
    /// Limit on the 90th percentile.
    pub p90: Option<f64>,
    /// Limit on the 95th percentile.
    pub p95: Option<f64>,
    /// Limit on the 99th percentile.
    pub p99: Option<f64>,
}

/// Lower limits.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MinLimits {
    /// Median decode tokens/s.
    pub llm_decode_tps: Option<f64>,
    /// Median prefill tokens/s.
    pub llm_prefill_tps: Option<f64>,
    /// Median STT real-time factor.
    pub stt_rtfx: Option<f64>,
}

/// Upper limits on counts and accuracy.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxLimits {
    /// Audio dropped anywhere, in 16 kHz frames (16 000 = 1 s).
    pub dropped: Option<u64>,
    /// Turns that ended in an error.
    pub errors: Option<u64>,
    /// Mean word error rate.
    pub wer: Option<f64>,
}

/// A budget file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// End of speech → first token.
    pub response_latency_ms: Option<PercentileLimits>,
    /// True end of speech → utterance closed.
    pub endpoint_delay_ms: Option<PercentileLimits>,
    /// STT latency.
    pub stt_ms: Option<PercentileLimits>,
    /// LLM time to first token.
    pub llm_ttft_ms: Option<PercentileLimits>,
    /// End of speech → first audio of the spoken answer (a run with a voice).
    pub voice_latency_ms: Option<PercentileLimits>,
    /// Limits on the response latency's terms, by the names the topology
    /// declares ([`Topology::latency_terms`]), in ms.
    pub terms: Option<BTreeMap<String, PercentileLimits>>,
    /// Lower limits.
    pub min: Option<MinLimits>,
    /// Upper limits.
    pub max: Option<MaxLimits>,
    /// The host the limits were set on, for scaling them on a slower one.
    pub host: Option<HostReference>,
}

/// The host a budget's limits were set on (`[host]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostReference {
    /// The probe's time on that host, ms ([`crate::host::HostSpeed::probe_ms`]).
    pub reference_ms: f64,
    /// The most the limits are scaled by (default [`DEFAULT_MAX_SCALE`]): a host
    /// slower than that fails on its own slowness, not on the budget.
    pub max_scale: Option<f64>,
}

/// The default `[host] max_scale`.
pub const DEFAULT_MAX_SCALE: f64 = 4.0;

impl HostReference {
    /// The factor for a host whose probe took `probe_ms`: measured ÷ reference,
    /// from 1 up to `max_scale`.
    #[must_use]
    pub fn scale(&self, probe_ms: f64) -> f64 {
        (probe_ms / self.reference_ms).clamp(1.0, self.max_scale.unwrap_or(DEFAULT_MAX_SCALE))
    }
}

impl Budget {
    /// Reads and parses a budget file.
    ///
    /// # Errors
    /// [`BadInput`] naming the file and the problem (unreadable, invalid TOML, unknown key, no limits).
    pub fn load(path: &Path) -> Result<Self, BadInput> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            BadInput(format!(
                "{}: cannot read the budget ({}); check the path given to --budget",
                path.display(),
                voxline_pipeline::io_reason(&e)
            ))
        })?;
        Self::parse(&text).map_err(|e| BadInput(format!("{}: {e}", path.display())))
    }

    /// Parses budget TOML.
    ///
    /// # Errors
    /// A message saying what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let b: Self = toml::from_str(text).map_err(|e| {
            let at = e.span().map_or(String::new(), |span| {
                let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                format!(" (line {line})")
            });
            format!("invalid budget{at}: {}", e.message().replace('\n', " "))
        })?;
        if (Self {
            host: None,
            ..b.clone()
        }) == Self::default()
        {
            return Err("the budget sets no limits; see the README for its keys".into());
        }
        b.check_ranges()?;
        Ok(b)
    }

    /// Checks that every `[terms.NAME]` the budget limits is a term of a
    /// pipeline shaped as `topology` (a misspelt term would never be
    /// measured, and would fail every run).
    ///
    /// # Errors
    /// [`BadInput`] naming the unknown term and the terms there are.
    pub fn check_terms(&self, topology: &Topology) -> Result<(), BadInput> {
        let declared: Vec<String> = topology
            .latency_terms()
            .into_iter()
            .map(|t| t.name)
            .collect();
        for name in self.terms.iter().flat_map(BTreeMap::keys) {
            if !declared.contains(name) {
                return Err(BadInput(format!(
                    "the budget limits [terms.{name}], which this pipeline does not have; its latency terms are: {}",
                    declared.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// The percentile tables: the named ones, then the terms'.
    fn percentile_tables(&self) -> Vec<(String, &PercentileLimits)> {
        let mut tables: Vec<(String, &PercentileLimits)> = [
            ("response_latency_ms", &self.response_latency_ms),
            ("endpoint_delay_ms", &self.endpoint_delay_ms),
            ("stt_ms", &self.stt_ms),
            ("llm_ttft_ms", &self.llm_ttft_ms),
            ("voice_latency_ms", &self.voice_latency_ms),
        ]
        .into_iter()
        .filter_map(|(name, l)| Some((name.to_owned(), l.as_ref()?)))
        .collect();
        for (name, l) in self.terms.iter().flatten() {
            tables.push((format!("terms.{name}"), l));
        }
        tables
    }

    /// Every limit must be a finite number, 0 or more: a negative or NaN
    /// limit would silently fail (or pass) every run.
    fn check_ranges(&self) -> Result<(), String> {
        let mut limits: Vec<(String, f64, &str)> = Vec::new();
        for (table, l) in self.percentile_tables() {
            for (q, v) in [
                ("p50", l.p50),
                ("p90", l.p90),
                ("p95", l.p95),
                ("p99", l.p99),
            ] {
                if let Some(v) = v {
                    limits.push((format!("{table}.{q}"), v, "milliseconds"));
                }
            }
        }
        if let Some(m) = &self.min {
            for (k, v, unit) in [
                ("llm_decode_tps", m.llm_decode_tps, "tokens per second"),
                ("llm_prefill_tps", m.llm_prefill_tps, "tokens per second"),
                ("stt_rtfx", m.stt_rtfx, "a real-time factor"),
            ] {
                if let Some(v) = v {
                    limits.push((format!("min.{k}"), v, unit));
                }
            }
        }
        if let Some(w) = self.max.as_ref().and_then(|m| m.wer) {
            limits.push(("max.wer".into(), w, "a word error rate"));
        }
        for (key, v, unit) in limits {
            if !v.is_finite() || v < 0.0 {
                return Err(format!(
                    "{key} = {v} is out of range: give a finite number from 0 up ({unit})"
                ));
            }
        }
        if let Some(h) = &self.host {
            if !h.reference_ms.is_finite() || h.reference_ms <= 0.0 {
                return Err(format!(
                    "host.reference_ms = {} is out of range: give the probe's time on the reference host, in ms, above 0",
                    h.reference_ms
                ));
            }
            if let Some(m) = h.max_scale.filter(|m| !m.is_finite() || *m < 1.0) {
                return Err(format!(
                    "host.max_scale = {m} is out of range: give a finite factor from 1 up"
                ));
            }
        }
        Ok(())
    }

    /// Checks a report against the budget.
    #[must_use]
    pub fn evaluate(&self, r: &Report) -> BudgetResult {
        let mut checks = Vec::new();
        let s = &r.summary;
        let host = self.host.as_ref().map(|h| HostScale {
            reference_ms: h.reference_ms,
            probe_ms: r.host.map(|m| m.probe_ms),
            factor: r.host.map_or(1.0, |m| h.scale(m.probe_ms)),
        });
        let factor = host.map_or(1.0, |h| h.factor);
        let pct = |checks: &mut Vec<BudgetCheck>,
                   name: &str,
                   l: &PercentileLimits,
                   got: Option<Percentiles>| {
            // the endpointer's delay does not depend on the machine's speed
            let factor = if name == "endpoint_delay_ms" || name == "terms.endpoint" {
                1.0
            } else {
                factor
            };
            for (q, limit, v) in [
                ("p50", l.p50, got.map(|p| p.p50)),
                ("p90", l.p90, got.map(|p| p.p90)),
                ("p95", l.p95, got.map(|p| p.p95)),
                ("p99", l.p99, got.map(|p| p.p99)),
            ] {
                if let Some(limit) = limit {
                    let (scaled, text) = scaled(limit, factor, Bound::Upper);
                    checks.push(BudgetCheck {
                        limit: format!("{name}.{q} {text}"),
                        measured: v,
                        passed: v.is_some_and(|v| v <= scaled),
                    });
                }
            }
        };
        for (table, l) in self.percentile_tables() {
            let got = match table.as_str() {
                "response_latency_ms" => s.response_latency_ms,
                "endpoint_delay_ms" => s.endpoint_delay_ms,
                "stt_ms" => s.stt_ms,
                "llm_ttft_ms" => s.llm_ttft_ms,
                "voice_latency_ms" => s.voice_latency_ms,
                term => term
                    .strip_prefix("terms.")
                    .and_then(|name| s.terms_ms.get(name).copied()),
            };
            pct(&mut checks, &table, l, got);
        }
        if let Some(m) = &self.min {
            for (name, limit, v) in [
                (
                    "llm_decode_tps",
                    m.llm_decode_tps,
                    s.llm_decode_tps.map(|p| p.p50),
                ),
                (
                    "llm_prefill_tps",
                    m.llm_prefill_tps,
                    s.llm_prefill_tps.map(|p| p.p50),
                ),
                ("stt_rtfx", m.stt_rtfx, s.stt_rtfx.map(|p| p.p50)),
            ] {
                if let Some(limit) = limit {
                    let (scaled, text) = scaled(limit, factor, Bound::Lower);
                    checks.push(BudgetCheck {
                        limit: format!("{name}.p50 {text}"),
                        measured: v,
                        passed: v.is_some_and(|v| v >= scaled),
                    });
                }
            }
        }
        if let Some(m) = &self.max {
            if let Some(limit) = m.dropped {
                checks.push(BudgetCheck {
                    limit: format!("dropped <= {limit}"),
                    measured: Some(s.dropped as f64),
                    passed: s.dropped <= limit,
                });
            }
            if let Some(limit) = m.errors {
                let errors =
                    s.errors as u64 + r.input_errors.len() as u64 + u64::from(r.failed.is_some());
                checks.push(BudgetCheck {
                    limit: format!("errors <= {limit}"),
                    measured: Some(errors as f64),
                    passed: errors <= limit,
                });
            }
            if let Some(limit) = m.wer {
                checks.push(BudgetCheck {
                    limit: format!("wer <= {limit}"),
                    measured: s.wer,
                    passed: s.wer.is_some_and(|w| w <= limit),
                });
            }
        }
        let violations: Vec<BudgetCheck> = checks.iter().filter(|c| !c.passed).cloned().collect();
        BudgetResult {
            given: true,
            passed: violations.is_empty(),
            checks,
            violations,
            host,
        }
    }
}

/// Which side of a limit a measure must stay on.
#[derive(Clone, Copy)]
enum Bound {
    /// At most the limit (times, counts): a slower host multiplies it.
    Upper,
    /// At least the limit (rates): a slower host divides it.
    Lower,
}

/// `limit` scaled for a host `factor` times slower (1: as written), and the
/// check's text: `<= 2400`, or `<= 4560 (2400 × 1.9 for the host)`.
fn scaled(limit: f64, factor: f64, bound: Bound) -> (f64, String) {
    let (op, by, value) = match bound {
        Bound::Upper => ("<=", "×", limit * factor),
        Bound::Lower => (">=", "÷", limit / factor),
    };
    if factor <= 1.0 {
        return (limit, format!("{op} {limit}"));
    }
    // whole milliseconds; rates and factors to two decimals
    let round = |v: f64| {
        if v.abs() >= 100.0 {
            v.round()
        } else {
            (v * 100.0).round() / 100.0
        }
    };
    let text = format!(
        "{op} {} ({limit} {by} {} for the host)",
        round(value),
        round(factor)
    );
    (value, text)
}

/// A budget's limits scaled for the host the run was on (`[host]`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct HostScale {
    /// The probe's time on the host the limits were set on, ms.
    pub reference_ms: f64,
    /// The probe's time on this host, ms (`None`: not probed, limits as written).
    pub probe_ms: Option<f64>,
    /// What the time limits were multiplied (and the rate minimums divided) by.
    pub factor: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Summary;

    fn report(latencies: &[f64], dropped: u64) -> Report {
        Report {
            summary: Summary {
                response_latency_ms: Percentiles::of(latencies),
                dropped,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn passes_and_fails_with_the_measured_values() {
        let b =
            Budget::parse("[response_latency_ms]\np50 = 1000\np95 = 2000\n[max]\ndropped = 0\n")
                .unwrap();
        let ok = b.evaluate(&report(&[500.0, 900.0, 1500.0], 0));
        assert!(ok.passed, "{ok:?}");
        assert_eq!(ok.checks.len(), 3);
        let bad = b.evaluate(&report(&[1500.0, 1600.0, 2500.0], 2));
        assert!(!bad.passed);
        let names: Vec<&str> = bad.violations.iter().map(|v| v.limit.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "response_latency_ms.p50 <= 1000",
                "response_latency_ms.p95 <= 2000",
                "dropped <= 0"
            ]
        );
        assert!((bad.violations[0].measured.unwrap() - 1600.0).abs() < 1.0);
        // nothing measured → a limit cannot pass
        let none = b.evaluate(&report(&[], 0));
        assert!(!none.passed);
        assert_eq!(none.violations[0].measured, None);
    }

    #[test]
    fn a_term_is_limited_by_its_declared_name() {
        let b = Budget::parse("[terms.llm_queue]\np95 = 100\n[terms.upper]\np50 = 5\n").unwrap();
        let standard =
            voxline_pipeline::topology::standard(voxline_pipeline::topology::AudioEdge::Replay, 2);
        let e = b.check_terms(&standard).unwrap_err().0;
        assert_eq!(
            e,
            "the budget limits [terms.upper], which this pipeline does not have; its latency terms are: endpoint, stt_queue, stt, llm_queue, llm_first_token, commit_wait"
        );
        let upper = voxline_core::StageId::new("upper");
        let with_upper = standard
            .edge(
                voxline_pipeline::topology::edge_into(&upper),
                2,
                voxline_core::FullPolicy::Block,
            )
            .insert_after(
                &voxline_pipeline::topology::STT,
                upper.clone(),
                voxline_pipeline::topology::edge_into(&upper),
            );
        b.check_terms(&with_upper).unwrap();
        let mut r = report(&[900.0], 0);
        r.summary
            .terms_ms
            .insert("llm_queue".into(), Percentiles::of(&[50.0, 150.0]).unwrap());
        r.summary
            .terms_ms
            .insert("upper".into(), Percentiles::of(&[2.0]).unwrap());
        let got = b.evaluate(&r);
        let verdicts: Vec<(&str, bool)> = (got.checks.iter())
            .map(|c| (c.limit.as_str(), c.passed))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("terms.llm_queue.p95 <= 100", false),
                ("terms.upper.p50 <= 5", true)
            ]
        );
        assert!(Budget::parse("[terms.stt]\np95 = -1")
            .unwrap_err()
            .contains("terms.stt.p95 = -1"));
    }

    #[test]
    fn a_slower_host_scales_the_limits_that_depend_on_speed_and_no_others() {
        let b = Budget::parse(
            "[response_latency_ms]\np50 = 1000\n[endpoint_delay_ms]\np95 = 800\n\
             [terms.endpoint]\np95 = 800\n[terms.stt]\np95 = 500\n\
             [min]\nllm_decode_tps = 30\nstt_rtfx = 0.5\n[max]\nwer = 0.1\n\
             [host]\nreference_ms = 50\nmax_scale = 3\n",
        )
        .unwrap();
        let mut r = report(&[2400.0], 0);
        let s = &mut r.summary;
        s.endpoint_delay_ms = Percentiles::of(&[900.0]);
        s.terms_ms
            .insert("endpoint".into(), Percentiles::of(&[900.0]).unwrap());
        s.terms_ms
            .insert("stt".into(), Percentiles::of(&[1200.0]).unwrap());
        s.llm_decode_tps = Percentiles::of(&[12.0]);
        s.stt_rtfx = Percentiles::of(&[0.2]);
        s.wer = Some(0.2);
        let verdicts = |b: &Budget, r: &Report| -> Vec<(String, bool)> {
            (b.evaluate(r).checks.into_iter())
                .map(|c| (c.limit, c.passed))
                .collect()
        };
        let host = |probe_ms: f64| crate::host::HostSpeed {
            threads: 2,
            before_ms: probe_ms,
            after_ms: probe_ms,
            probe_ms,
        };
        // not probed: the limits as written
        let strict = verdicts(&b, &r);
        assert!(strict.iter().all(|(_, passed)| !passed), "{strict:?}");
        assert_eq!(strict[0].0, "response_latency_ms.p50 <= 1000");
        assert_eq!(b.evaluate(&r).host.unwrap().probe_ms, None);
        // a faster host: the limits as written, never tighter
        r.host = Some(host(20.0));
        assert_eq!(verdicts(&b, &r), strict);
        assert_eq!(b.evaluate(&r).host.unwrap().factor, 1.0);
        // 2.5× slower: speed-bound limits scaled, the endpoint's and WER not
        r.host = Some(host(125.0));
        assert_eq!(
            verdicts(&b, &r),
            [
                (
                    "response_latency_ms.p50 <= 2500 (1000 × 2.5 for the host)",
                    true
                ),
                ("endpoint_delay_ms.p95 <= 800", false),
                ("terms.endpoint.p95 <= 800", false),
                ("terms.stt.p95 <= 1250 (500 × 2.5 for the host)", true),
                ("llm_decode_tps.p50 >= 12 (30 ÷ 2.5 for the host)", true),
                ("stt_rtfx.p50 >= 0.2 (0.5 ÷ 2.5 for the host)", true),
                ("wer <= 0.1", false),
            ]
            .map(|(l, p)| (l.to_owned(), p))
        );
        let got = b.evaluate(&r).host.unwrap();
        assert_eq!(
            (got.reference_ms, got.probe_ms, got.factor),
            (50.0, Some(125.0), 2.5)
        );
        // slower than max_scale: scaled by max_scale only
        r.host = Some(host(500.0));
        assert_eq!(b.evaluate(&r).host.unwrap().factor, 3.0);
        assert_eq!(
            verdicts(&b, &r)[0],
            (
                "response_latency_ms.p50 <= 3000 (1000 × 3 for the host)".into(),
                true
            )
        );
        // without [host], a probe changes nothing
        let plain = Budget::parse("[response_latency_ms]\np50 = 1000\n").unwrap();
        assert_eq!(plain.evaluate(&r).host, None);
        assert!(!plain.evaluate(&r).passed);
        // the default cap
        let h = HostReference {
            reference_ms: 10.0,
            max_scale: None,
        };
        assert_eq!(h.scale(1000.0), DEFAULT_MAX_SCALE);
    }

    #[test]
    fn rejects_typos_and_empty_budgets() {
        assert!(Budget::parse("[response_latency]\np50 = 1")
            .unwrap_err()
            .contains("unknown field"));
        assert!(Budget::parse("[min]\nllm_decode_tps = \"fast\"").is_err());
        assert!(Budget::parse("").unwrap_err().contains("no limits"));
        // a host and nothing to scale is no budget either
        assert!(Budget::parse("[host]\nreference_ms = 50")
            .unwrap_err()
            .contains("no limits"));
        for (text, key) in [
            (
                "[response_latency_ms]\np50 = -5",
                "response_latency_ms.p50 = -5",
            ),
            (
                "[response_latency_ms]\np50 = nan",
                "response_latency_ms.p50 = NaN",
            ),
            ("[stt_ms]\np99 = inf", "stt_ms.p99 = inf"),
            ("[min]\nllm_decode_tps = nan", "min.llm_decode_tps = NaN"),
            ("[max]\nwer = -0.1", "max.wer = -0.1"),
            (
                "[max]\nwer = 0.1\n[host]\nreference_ms = 0",
                "host.reference_ms = 0",
            ),
            (
                "[max]\nwer = 0.1\n[host]\nreference_ms = 50\nmax_scale = 0.5",
                "host.max_scale = 0.5",
            ),
        ] {
            let e = Budget::parse(text).unwrap_err();
            assert!(
                e.contains(key) && e.contains("is out of range"),
                "{text:?}: {e}"
            );
        }
        assert!(Budget::parse("[response_latency_ms]\np50 = 0").is_ok());
        assert!(Budget::parse("[max\n")
            .unwrap_err()
            .starts_with("invalid budget"));
    }
}
