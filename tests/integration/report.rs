//! The report: schema, budgets and exit codes, bottleneck detection on synthetic stages.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::util;
use voxline_core::{Emitter, Stage, StageError, Transcript, Utterance};
use voxline_llm::{LlmCounters, LlmOut, Stop, Token, TurnComplete};

/// Every key path in a JSON value, arrays written as `[]`.
fn paths(v: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                paths(v, &p, out);
            }
        }
        serde_json::Value::Array(a) => {
            for v in a {
                paths(v, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn report_json_matches_the_golden_schema_and_budgets_set_the_exit_code() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let pass = dir.path().join("pass.toml");
    std::fs::write(
        &pass,
        // a reference host far faster than any: the time limits are scaled by max_scale
        "[response_latency_ms]\np50 = 60000\n[terms.stt]\np95 = 60000\n[terms.endpoint]\np95 = 60000\n\
         [max]\nerrors = 0\ndropped = 0\n[host]\nreference_ms = 0.001\nmax_scale = 1.5\n",
    )
    .unwrap();
    let out = util::voxline_bin()
        .args([
            "replay",
            util::fixture("q_capital.wav").to_str().unwrap(),
            "--pace",
            "fast",
            "--quiet",
            "--max-tokens",
            "8",
        ])
        .arg("--report-json")
        .arg(&report)
        .arg("--budget")
        .arg(&pass)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = util::read_json(&report);
    let mut got = BTreeSet::new();
    paths(&v, "", &mut got);
    let golden_path = util::root().join("tests/golden/report_schema.txt");
    if std::env::var_os("VOXLINE_BLESS").is_some() {
        std::fs::write(
            &golden_path,
            got.iter().cloned().collect::<Vec<_>>().join("\n") + "\n",
        )
        .unwrap();
    }
    let golden: BTreeSet<String> = std::fs::read_to_string(&golden_path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let missing: Vec<_> = golden.difference(&got).collect();
    let extra: Vec<_> = got.difference(&golden).collect();
    assert!(missing.is_empty() && extra.is_empty(), "report schema changed (bump SCHEMA_VERSION if a field changed meaning, then VOXLINE_BLESS=1): missing {missing:?}, new {extra:?}");
    // the fields the issue names are there, with values
    assert_eq!(v["schema_version"], 3);
    // a replay's silence between recordings, the pipeline's default
    assert_eq!(v["config"]["gap_ms"], 1000);
    let t = &v["turns"][0];
    // the decomposition: every declared term, adding up to the response latency
    let terms = t["terms_ms"].as_object().unwrap();
    let names: Vec<&str> = terms.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "commit_wait",
            "endpoint",
            "llm_first_token",
            "llm_queue",
            "stt",
            "stt_queue"
        ]
    );
    let sum: f64 = terms.values().map(|v| v.as_f64().unwrap()).sum();
    assert!(
        (sum - t["response_latency_ms"].as_f64().unwrap()).abs() < 0.01,
        "{t}"
    );
    assert_eq!(terms["stt"], t["stt_ms"]);
    assert!(v["summary"]["terms_ms"]["llm_first_token"]["p50"].is_number());
    let checks = v["summary"]["budget"]["checks"].as_array().unwrap();
    let limits: Vec<&str> = checks.iter().filter_map(|c| c["limit"].as_str()).collect();
    assert_eq!(
        limits[..3],
        [
            "response_latency_ms.p50 <= 90000 (60000 × 1.5 for the host)",
            // the endpointer's delay does not depend on the host's speed
            "terms.endpoint.p95 <= 60000",
            "terms.stt.p95 <= 90000 (60000 × 1.5 for the host)",
        ],
        "{checks:?}"
    );
    // the host was probed before and after the run, on the pipeline's threads
    let host = &v["host"];
    let (before, after) = (
        host["before_ms"].as_f64().unwrap(),
        host["after_ms"].as_f64().unwrap(),
    );
    assert!(before > 0.0 && after > 0.0, "{host}");
    let probe = host["probe_ms"].as_f64().unwrap();
    assert!((probe - (before + after) / 2.0).abs() < 1e-9, "{host}");
    assert_eq!(host["threads"], v["config"]["threads"][0], "{host}");
    let scale = &v["summary"]["budget"]["host"];
    assert_eq!(
        (scale["factor"].as_f64(), scale["reference_ms"].as_f64()),
        (Some(1.5), Some(0.001))
    );
    assert_eq!(scale["probe_ms"], host["probe_ms"]);
    for k in [
        "id",
        "transcript",
        "response",
        "endpoint_delay_ms",
        "stt_ms",
        "stt_rtfx",
        "llm_ttft_ms",
        "llm_prefill_tps",
        "llm_decode_tps",
        "response_latency_ms",
    ] {
        assert!(!t[k].is_null(), "turns[0].{k} is null: {t}");
    }
    for k in ["p50", "p90", "p95", "p99", "n"] {
        assert!(v["summary"]["response_latency_ms"][k].is_number(), "{k}");
    }
    assert!(
        v["summary"]["bottleneck"]["throughput"].is_string()
            && v["summary"]["bottleneck"]["latency"].is_string()
    );
    assert!(!v["summary"]["bottleneck"]["reason"]
        .as_str()
        .unwrap()
        .is_empty());
    assert_eq!(v["summary"]["budget"]["passed"], true);
    assert_eq!(
        v["summary"]["budget"]["violations"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    for s in v["stages"].as_array().unwrap() {
        for k in ["name", "utilization", "busy_ms", "items", "dropped"] {
            assert!(!s[k].is_null(), "stage {k}");
        }
    }

    // a budget on a term the pipeline does not have: one line, exit 2, before any model loads
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "[terms.sst]\np95 = 100\n").unwrap();
    let out = util::voxline_bin()
        .args([
            "replay",
            util::fixture("q_capital.wav").to_str().unwrap(),
            "--quiet",
        ])
        .arg("--budget")
        .arg(&typo)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("[terms.sst], which this pipeline does not have; its latency terms are: endpoint, stt_queue, stt, llm_queue, llm_first_token, commit_wait"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // an impossible budget: exit 1, the report lists the violation with its measured value
    let fail = dir.path().join("fail.toml");
    std::fs::write(
        &fail,
        "[response_latency_ms]\np50 = 1\n[min]\nllm_decode_tps = 1000000\n",
    )
    .unwrap();
    let out = util::voxline_bin()
        .args([
            "replay",
            util::fixture("q_capital.wav").to_str().unwrap(),
            "--pace",
            "fast",
            "--quiet",
            "--max-tokens",
            "8",
        ])
        .arg("--report-json")
        .arg(&report)
        .arg("--budget")
        .arg(&fail)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("budget broken: response_latency_ms.p50 <= 1"),
        "{err}"
    );
    let v = util::read_json(&report);
    let violations = v["summary"]["budget"]["violations"].as_array().unwrap();
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(violations[0]["measured"].as_f64().unwrap() > 1.0);

    // an invalid budget: exit 2 before anything runs, no report written
    std::fs::remove_file(&report).unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[response_latency]\np50 = 1\n").unwrap();
    let out = util::voxline_bin()
        .args([
            "replay",
            util::fixture("q_capital.wav").to_str().unwrap(),
            "--quiet",
        ])
        .arg("--report-json")
        .arg(&report)
        .arg("--budget")
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bad.toml") && err.contains("unknown field"),
        "{err}"
    );
    assert!(!report.exists());
}

/// A speech-to-text stand-in with a known cost.
struct FixedStt(Duration);

impl Stage for FixedStt {
    type In = Utterance;
    type Out = Transcript;
    fn name(&self) -> &str {
        "stt"
    }
    fn process(
        &mut self,
        u: Utterance,
        out: &mut Emitter<'_, Transcript>,
    ) -> Result<(), StageError> {
        std::thread::sleep(self.0);
        out.emit(Transcript {
            id: u.id,
            text: "hello".into(),
            heard: voxline_core::Heard::Words,
            n_tokens: 1,
            audio_ms: u.duration_ms(),
            start_sample: u.start_sample,
            end_sample: u.end_sample,
            end_wall: u.end_wall,
        });
        Ok(())
    }
}

/// An LLM stand-in with a known first-token time and per-token cost.
struct FixedLlm {
    first: Duration,
    per_token: Duration,
    tokens: u32,
}

impl Stage for FixedLlm {
    type In = Transcript;
    type Out = LlmOut;
    fn name(&self) -> &str {
        "llm"
    }
    fn process(&mut self, t: Transcript, out: &mut Emitter<'_, LlmOut>) -> Result<(), StageError> {
        std::thread::sleep(self.first);
        for index in 0..self.tokens {
            if index > 0 {
                std::thread::sleep(self.per_token);
            }
            out.emit(LlmOut::Token(Token {
                id: t.id,
                index,
                text: "x".into(),
            }));
        }
        out.emit(LlmOut::Done(TurnComplete {
            id: t.id,
            transcript: t.text,
            response: "x".repeat(self.tokens as usize),
            n_prompt_tokens: 10,
            n_generated: self.tokens,
            engine: LlmCounters {
                n_prefill_tokens: 10,
                n_decode_tokens: self.tokens - 1,
            },
            stop: Stop::MaxTokens,
            history_dropped: 0,
        }));
        Ok(())
    }
}

fn synthetic(
    stt: Duration,
    first: Duration,
    per_token: Duration,
    tokens: u32,
) -> voxline_report::Report {
    let files: Vec<_> = ["multi_turn.wav", "q_tea.wav"]
        .iter()
        .map(|f| util::fixture(f))
        .collect();
    let inputs = voxline_pipeline::pipeline::open_inputs(&files).unwrap();
    let run = voxline_pipeline::pipeline::run(
        inputs,
        FixedStt(stt),
        FixedLlm {
            first,
            per_token,
            tokens,
        },
        &Default::default(),
        None,
    )
    .unwrap();
    voxline_report::build(&run, voxline_report::RunConfig::default(), 0.0, None)
}

#[test]
fn the_slow_stage_is_named_the_bottleneck() {
    // STT slow: it is both the busiest stage and the largest latency term.
    let r = synthetic(
        Duration::from_millis(900),
        Duration::from_millis(20),
        Duration::from_millis(2),
        11,
    );
    assert_eq!(r.turns.len(), 4);
    assert_eq!(
        r.summary.bottleneck.throughput.as_deref(),
        Some("stt"),
        "{}",
        r.summary.bottleneck.reason
    );
    assert_eq!(
        r.summary.bottleneck.latency.as_deref(),
        Some("stt"),
        "{}",
        r.summary.bottleneck.reason
    );
    // the measured STT time is the known cost (sleep granularity aside)
    let stt = r.summary.stt_ms.unwrap();
    // (sleeps only overshoot; a loaded machine overshoots more)
    assert!((900.0..1400.0).contains(&stt.p50), "{stt:?}");

    // LLM slow: a 1.5 s first token, then 5 more at 300 ms each → llm busiest,
    // and its first token (or the queue behind it) dominates latency.
    let r = synthetic(
        Duration::from_millis(50),
        Duration::from_millis(1500),
        Duration::from_millis(300),
        6,
    );
    assert_eq!(
        r.summary.bottleneck.throughput.as_deref(),
        Some("llm"),
        "{}",
        r.summary.bottleneck.reason
    );
    let latency = r.summary.bottleneck.latency.clone().unwrap();
    assert!(
        latency == "llm_queue" || latency == "llm_first_token",
        "{}",
        r.summary.bottleneck.reason
    );
    // decode tokens/s is (n − 1) / (t_last − t_first): 5 gaps of ~300 ms
    let tps = r.summary.llm_decode_tps.unwrap().p50;
    assert!((2.4..3.4).contains(&tps), "{tps}");
    for t in &r.turns {
        let parts: f64 = t.terms_ms.values().sum();
        assert!(
            (parts - t.response_latency_ms.unwrap()).abs() < 0.01,
            "{parts} vs {:?}: {:?}",
            t.response_latency_ms,
            t.terms_ms
        );
    }
}

#[test]
fn history_dropped_to_fit_the_context_is_reported() {
    let _g = util::engine_lock();
    // 80 tokens less 32 for the answer: the system prompt and one question
    // fit, a question with an earlier exchange before it does not
    let mut s = util::settings(32);
    s.llama_mut().expect("llama.cpp settings").n_ctx = 80;
    let (stt, llm) = util::stages(&s);
    let inputs =
        voxline_pipeline::pipeline::open_inputs(&[util::fixture("multi_turn.wav")]).unwrap();
    let run = voxline_pipeline::pipeline::run(inputs, stt, llm, &Default::default(), None).unwrap();
    let r = voxline_report::build(&run, voxline_report::RunConfig::default(), 0.0, None);
    assert_eq!(r.turns.len(), 3, "{:?}", r.turns);
    let dropped: Vec<u32> = r
        .turns
        .iter()
        .map(|t| t.llm_history_dropped.unwrap())
        .collect();
    assert_eq!(dropped[0], 0, "nothing to drop before the first turn");
    assert!(dropped[1..].iter().all(|&d| d >= 1), "{dropped:?}");
    for t in &r.turns {
        assert!(t.llm_prompt_tokens.unwrap() <= 80 - 32, "{t:?}");
    }
}

#[test]
fn the_llm_stage_rate_is_the_decode_rate_of_its_turns() {
    let _g = util::engine_lock();
    let stage =
        |r: &voxline_report::Report| r.stages.iter().find(|s| s.name == "llm").cloned().unwrap();
    // one turn: the stage's tokens/s is that turn's decode tokens/s
    let (_, r) = util::replay(&["q_capital.wav"], 24);
    let t = &r.turns[0];
    let llm = stage(&r);
    let tps = t.llm_decode_tps.unwrap();
    let stage_tps = llm.tokens_per_s.unwrap();
    assert!(
        (stage_tps - tps).abs() <= 1e-9 * tps,
        "stage {stage_tps} vs turn {tps}"
    );
    // generated tokens, the end-of-generation token not among them
    assert_eq!(llm.tokens, Some(t.llm_streamed_tokens as u64));
    if t.stop == Some(Stop::EndOfGeneration) {
        assert_eq!(
            t.llm_streamed_tokens as u32 + 1,
            t.llm_generated_tokens.unwrap()
        );
    }
    // several turns: their gaps over their decode time, so between the
    // slowest and the fastest turn
    let (_, r) = util::replay(&["multi_turn.wav"], 16);
    let rates: Vec<f64> = r.turns.iter().filter_map(|t| t.llm_decode_tps).collect();
    assert_eq!(rates.len(), 3);
    let stage_tps = stage(&r).tokens_per_s.unwrap();
    let (lo, hi) = rates
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    assert!(
        stage_tps >= lo * (1.0 - 1e-9) && stage_tps <= hi * (1.0 + 1e-9),
        "stage {stage_tps} outside the turns' {rates:?}"
    );
}
