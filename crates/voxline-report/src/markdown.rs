//! The report as Markdown (`report.md`).

use super::schema::Report;
use crate::stats::cell;

/// The report as Markdown: bottlenecks and budget first, then the tables.
#[must_use]
pub fn to_markdown(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let f = |v: Option<f64>| cell(v, 1);
    let _ = writeln!(s, "# voxline report\n");
    let _ = writeln!(
        s,
        "- **Throughput bottleneck:** {}",
        r.summary.bottleneck.throughput.as_deref().unwrap_or("–")
    );
    let _ = writeln!(
        s,
        "- **Latency bottleneck:** {}",
        r.summary.bottleneck.latency.as_deref().unwrap_or("–")
    );
    let _ = writeln!(s, "- **Why:** {}", r.summary.bottleneck.reason);
    if let Some(h) = &r.host {
        let _ = write!(
            s,
            "- **Host:** probe {:.1} ms on {} threads (before {:.1}, after {:.1})",
            h.probe_ms, h.threads, h.before_ms, h.after_ms
        );
        if let Some(b) = &r.summary.budget.host {
            let _ = write!(
                s,
                "; the budget's reference host {:.1} ms, its limits ×{:.2}",
                b.reference_ms, b.factor
            );
        }
        let _ = writeln!(s);
    }
    let verdict = if !r.summary.budget.given {
        "no budget given"
    } else if r.summary.budget.passed {
        "PASS"
    } else {
        "FAIL"
    };
    let _ = writeln!(s, "- **Budget:** {verdict}");
    for c in &r.summary.budget.checks {
        let _ = writeln!(
            s,
            "  - {} {} (measured {})",
            if c.passed { "✓" } else { "✗" },
            c.limit,
            f(c.measured)
        );
    }
    if let Some(b) = &r.baseline {
        let _ = writeln!(
            s,
            "- **Against baseline** `{}`: {}",
            b.path.display(),
            b.verdict
        );
        if let Some(h) = b.host_ratio {
            let _ = writeln!(
                s,
                "  - host probe: ×{h:.2} (the hosts' speeds differ by this)"
            );
        }
        for c in &b.metrics {
            let _ = writeln!(
                s,
                "  - {}: {:.1} → {:.1} (×{:.2}, {})",
                c.metric, c.baseline, c.current, c.ratio, c.verdict
            );
        }
    }
    let _ = writeln!(s, "\nclock: {} · turns: {} (warm-up {}, errors {}) · audio {:.1} s · session {:.1} s · threads {}/{}/{} · audio_ctx {} · max tokens {}\n",
        r.clock, r.summary.turns, r.summary.warmup_turns, r.summary.errors, r.summary.audio_s, r.summary.session_s,
        r.config.threads[0], r.config.threads[1], r.config.threads[2], r.config.audio_ctx, r.config.max_tokens);
    let _ = writeln!(
        s,
        "| metric | p50 | p90 | p95 | p99 | n |\n|---|---|---|---|---|---|"
    );
    for (name, p) in [
        ("response latency ms", r.summary.response_latency_ms),
        ("endpoint delay ms", r.summary.endpoint_delay_ms),
        ("STT ms", r.summary.stt_ms),
        ("STT RTFx", r.summary.stt_rtfx),
        ("LLM TTFT ms", r.summary.llm_ttft_ms),
        ("LLM prefill tok/s", r.summary.llm_prefill_tps),
        ("LLM decode tok/s", r.summary.llm_decode_tps),
        ("voice latency ms", r.summary.voice_latency_ms),
        ("TTS first audio ms", r.summary.tts_first_audio_ms),
        ("TTS RTFx", r.summary.tts_rtfx),
        ("barge-in ms", r.summary.barge_in_ms),
        (
            "end-of-turn model ms per pause",
            r.summary.end_of_turn.as_ref().and_then(|e| e.cost_ms),
        ),
        (
            "LLM server prompt ms",
            r.summary
                .llm_server
                .as_ref()
                .and_then(|e| e.server_prompt_ms),
        ),
        (
            "LLM network + queue ms",
            r.summary
                .llm_server
                .as_ref()
                .and_then(|e| e.network_queue_ms),
        ),
        (
            "LLM server decode tok/s",
            r.summary
                .llm_server
                .as_ref()
                .and_then(|e| e.server_decode_tps),
        ),
    ] {
        if let Some(p) = p {
            let _ = writeln!(
                s,
                "| {name} | {:.1} | {:.1} | {:.1} | {:.1}{} | {} |",
                p.p50,
                p.p90,
                p.p95,
                p.p99,
                if p.p99_meaningful { "" } else { "*" },
                p.n
            );
        }
    }
    let _ = writeln!(
        s,
        "\n\\* p99 of fewer than 100 turns is close to the maximum.\n"
    );
    if let Some(e) = &r.summary.end_of_turn {
        let by: Vec<String> = e.commits.iter().map(|(d, n)| format!("{n} {d}")).collect();
        let _ = writeln!(
            s,
            "end of turn: {} ({} pauses judged)\n",
            by.join(", "),
            e.probes
        );
    }
    thrown_away(&mut s, r);
    let servers: Vec<String> = [
        ("speech to text", &r.config.stt_server),
        ("language model", &r.config.llm_server),
    ]
    .iter()
    .filter_map(|(what, s)| s.as_ref().map(|s| format!("{what} on {s}")))
    .collect();
    if !servers.is_empty() {
        let _ = write!(s, "remote engines: {}", servers.join(", "));
        if let Some(l) = &r.summary.llm_server {
            let _ = write!(
                s,
                "; the language model's token counts from its {}",
                l.tokens_from
            );
            if let Some(c) = l.cached_share {
                let _ = write!(
                    s,
                    ", {:.0}% of its prompt tokens from its prefix cache",
                    c * 100.0
                );
            }
        }
        let _ = writeln!(s, "\n");
    }
    // the response latency, term by term, as the topology declares them
    let terms = r.topology.latency_terms();
    if terms
        .iter()
        .any(|x| r.summary.terms_ms.contains_key(&x.name))
    {
        let _ = writeln!(
            s,
            "| latency term | stage | mean ms | p50 | p95 | share of the mean |\n|---|---|---|---|---|---|"
        );
        let total: f64 = terms
            .iter()
            .filter_map(|x| r.summary.terms_ms.get(&x.name).map(|p| p.mean))
            .sum();
        for x in &terms {
            if let Some(p) = r.summary.terms_ms.get(&x.name) {
                let share = if total > 0.0 {
                    100.0 * p.mean / total
                } else {
                    0.0
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.1} | {:.1} | {:.1} | {share:.0}% |",
                    x.name, x.stage, p.mean, p.p50, p.p95
                );
            }
        }
        s.push('\n');
    }
    let _ = writeln!(s, "| stage | items | busy ms | utilisation | tokens/s | queue wait p95 ms | max queue | dropped |\n|---|---|---|---|---|---|---|---|");
    for st in &r.stages {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.3} | {} | {} | {}/{} | {} |",
            st.name,
            st.items,
            st.busy_ms,
            st.utilization,
            f(st.tokens_per_s),
            f(st.queue_wait_ms.map(|q| q.p95)),
            st.queue_max_depth,
            st.queue_capacity,
            st.dropped
        );
    }
    let _ = write!(s, "\n| turn | transcript | WER | endpoint delay |");
    for x in &terms {
        let _ = write!(s, " {} |", x.name.replace('_', " "));
    }
    let _ = writeln!(
        s,
        " response latency | decode tok/s |\n|---|---|---|---|{}---|---|",
        "---|".repeat(terms.len())
    );
    for t in &r.turns {
        let _ = write!(
            s,
            "| {}{} | {} | {} | {} |",
            t.id,
            if t.warmup { " (warm-up)" } else { "" },
            // what a server or model said: no control character, one line,
            // bounded (the JSON report keeps the exact text)
            voxline_pipeline::shown::one_line(
                t.transcript.as_deref().or(t.error.as_deref()).unwrap_or("")
            )
            .replace('|', "/"),
            f(t.wer),
            f(t.endpoint_delay_ms),
        );
        for x in &terms {
            let _ = write!(s, " {} |", f(t.terms_ms.get(&x.name).copied()));
        }
        let _ = writeln!(
            s,
            " {} | {} |",
            f(t.response_latency_ms),
            f(t.llm_decode_tps)
        );
    }
    s
}

/// One line: the work whose result was thrown away (cancelled attempts,
/// turns taken back, pauses judged that ended no turn), where there was any.
fn thrown_away(s: &mut String, r: &Report) {
    use std::fmt::Write;
    let mut parts: Vec<String> = (r.summary.speculation.thrown.iter())
        .filter(|(_, t)| t.calls > 0 && t.busy_ms >= 0.5)
        .map(|(stage, t)| {
            format!(
                "{stage} {} call{} ({:.1} s busy, {:.1} core-s)",
                t.calls,
                if t.calls == 1 { "" } else { "s" },
                t.busy_ms / 1000.0,
                t.core_ms / 1000.0
            )
        })
        .collect();
    if let Some(e) = r
        .summary
        .end_of_turn
        .as_ref()
        .filter(|e| e.unused_probes > 0)
    {
        parts.push(format!(
            "the end-of-turn model on {} of {} pauses ({:.1} s)",
            e.unused_probes,
            e.probes,
            e.unused_ms / 1000.0
        ));
    }
    if !parts.is_empty() {
        let _ = writeln!(s, "thrown away: {}\n", parts.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Comparison;
    use crate::stats::Percentiles;
    use crate::{BaselineResult, BudgetCheck, ReportClock, StageReport, TurnReport};

    fn report() -> Report {
        let mut r = Report {
            clock: ReportClock::Virtual,
            ..Report::default()
        };
        r.config.threads = [2, 1, 1];
        r.config.audio_ctx = "full".into();
        r.config.max_tokens = 32;
        let s = &mut r.summary;
        s.turns = 2;
        s.warmup_turns = 1;
        s.errors = 1;
        s.audio_s = 4.0;
        s.session_s = 4.3;
        s.bottleneck.throughput = Some("stt".into());
        s.bottleneck.reason = "because".into();
        s.response_latency_ms = Some(Percentiles {
            p50: 800.0,
            p90: 900.0,
            p95: 950.0,
            p99: 990.0,
            max: 1000.0,
            mean: 850.0,
            n: 2,
            p99_meaningful: false,
        });
        r.stages.push(StageReport {
            name: "stt".into(),
            items: 2,
            busy_ms: 1234.4,
            utilization: 0.29,
            tokens: Some(8),
            tokens_per_s: Some(6.48),
            queue_wait_ms: None,
            queue_max_depth: 1,
            queue_capacity: 4,
            dropped: 0,
        });
        r.topology =
            voxline_pipeline::topology::standard(voxline_pipeline::topology::AudioEdge::Replay, 4);
        s.terms_ms
            .insert("stt".into(), Percentiles::of(&[300.0, 500.0]).unwrap());
        s.terms_ms
            .insert("llm_first_token".into(), Percentiles::of(&[100.0]).unwrap());
        r.turns.push(TurnReport {
            id: 1,
            warmup: true,
            transcript: Some("either | or\u{1b}[2J\n".into()),
            wer: Some(0.0),
            endpoint_delay_ms: Some(700.0),
            terms_ms: [("stt".to_string(), 540.0)].into(),
            response_latency_ms: Some(1680.26),
            ..TurnReport::default()
        });
        r.turns.push(TurnReport {
            id: 2,
            error: Some("stt: whisper failed".into()),
            ..TurnReport::default()
        });
        r
    }

    #[test]
    fn the_bottlenecks_and_the_tables() {
        let md = to_markdown(&report());
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines[0], "# voxline report");
        assert_eq!(lines[2], "- **Throughput bottleneck:** stt");
        assert_eq!(lines[3], "- **Latency bottleneck:** –");
        assert_eq!(lines[4], "- **Why:** because");
        assert_eq!(lines[5], "- **Budget:** no budget given");
        assert!(lines.contains(&"clock: virtual · turns: 2 (warm-up 1, errors 1) · audio 4.0 s · session 4.3 s · threads 2/1/1 · audio_ctx full · max tokens 32"), "{md}");
        // only the metrics measured have a row; p99 of few turns is starred
        assert!(lines.contains(&"| response latency ms | 800.0 | 900.0 | 950.0 | 990.0* | 2 |"));
        assert!(!md.contains("| STT ms |"));
        assert!(lines.contains(&"| stt | 2 | 1234 | 0.290 | 6.5 | – | 1/4 | 0 |"));
        // a '|' in a transcript would split the row; an error stands in for a transcript
        // the decomposition: the terms measured, in critical-path order
        let at = lines
            .iter()
            .position(|l| l.starts_with("| latency term |"))
            .unwrap();
        assert!(
            lines[at + 2].starts_with("| stt | stt | 400.0 | 300.0 | 50")
                && lines[at + 2].ends_with(" | 80% |"),
            "{md}"
        );
        assert_eq!(
            lines[at + 3],
            "| llm_first_token | llm | 100.0 | 100.0 | 100.0 | 20% |"
        );
        assert_eq!(lines[at + 4], "");
        // a column per term in the turns' table
        assert!(lines.contains(&"| turn | transcript | WER | endpoint delay | endpoint | stt queue | stt | llm queue | llm first token | commit wait | response latency | decode tok/s |"), "{md}");
        assert!(
            lines.contains(
                &"| 1 (warm-up) | either / or\\u{1b}[2J\\u{a} | 0.0 | 700.0 | – | – | 540.0 | – | – | – | 1680.3 | – |"
            ),
            "{md}"
        );
        assert!(
            lines.contains(&"| 2 | stt: whisper failed | – | – | – | – | – | – | – | – | – | – |")
        );
    }

    #[test]
    fn the_budget_and_the_baseline() {
        let mut r = report();
        r.summary.budget.given = true;
        r.summary.budget.passed = false;
        r.summary.budget.checks = vec![
            BudgetCheck {
                limit: "response_latency_ms.p95 <= 3000".into(),
                measured: Some(950.0),
                passed: true,
            },
            BudgetCheck {
                limit: "errors <= 0".into(),
                measured: None,
                passed: false,
            },
        ];
        r.baseline = Some(BaselineResult {
            path: "old.json".into(),
            verdict: crate::bench::Overall::Regressed,
            metrics: vec![Comparison {
                metric: "summary.stt_ms.p50".into(),
                baseline: 400.0,
                current: 500.0,
                ratio: 1.25,
                verdict: crate::bench::Verdict::Worse,
            }],
            host_ratio: Some(1.5),
        });
        let md = to_markdown(&r);
        let expected = "- **Budget:** FAIL\n  - ✓ response_latency_ms.p95 <= 3000 (measured 950.0)\n  - ✗ errors <= 0 (measured –)\n- **Against baseline** `old.json`: regressed\n  - host probe: ×1.50 (the hosts' speeds differ by this)\n  - summary.stt_ms.p50: 400.0 → 500.0 (×1.25, worse)\n";
        assert!(md.contains(expected), "{md}");
        assert!(!md.contains("**Host:**"), "not probed: no host line");
        r.host = Some(crate::host::HostSpeed {
            threads: 2,
            before_ms: 100.0,
            after_ms: 140.0,
            probe_ms: 120.0,
        });
        r.summary.budget.host = Some(crate::HostScale {
            reference_ms: 60.0,
            probe_ms: Some(120.0),
            factor: 2.0,
        });
        assert!(to_markdown(&r).contains("- **Why:** because\n- **Host:** probe 120.0 ms on 2 threads (before 100.0, after 140.0); the budget's reference host 60.0 ms, its limits ×2.00\n- **Budget:** FAIL\n"), "{}", to_markdown(&r));
        r.summary.budget.passed = true;
        assert!(to_markdown(&r).contains("- **Budget:** PASS\n"));
    }
}
