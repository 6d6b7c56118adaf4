//! The report as Markdown (`report.md`).

use super::schema::Report;

/// The report as Markdown: bottlenecks and budget first, then the tables.
#[must_use]
pub fn to_markdown(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let f = |v: Option<f64>| v.map_or("–".to_string(), |x| format!("{x:.1}"));
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
    let _ = writeln!(s, "\n| turn | transcript | WER | endpoint | stt queue | stt | llm queue | first token | response latency | decode tok/s |\n|---|---|---|---|---|---|---|---|---|---|");
    for t in &r.turns {
        let _ = writeln!(
            s,
            "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            t.id,
            if t.warmup { " (warm-up)" } else { "" },
            t.transcript
                .as_deref()
                .or(t.error.as_deref())
                .unwrap_or("")
                .replace('|', "/"),
            f(t.wer),
            f(t.endpoint_delay_ms),
            f(t.stt_queue_ms),
            f(t.stt_ms),
            f(t.llm_queue_ms),
            f(t.llm_first_token_ms),
            f(t.response_latency_ms),
            f(t.llm_decode_tps)
        );
    }
    s
}
