//! Soak: replay the fixtures in a loop in one session, watching memory and
//! latency drift. Not a CI test; run it by hand:
//!
//! `VOXLINE_SOAK_SECS=3600 cargo bench --bench soak`
//!
//! Each round replays every fixture once (fast pace) through a fresh
//! pipeline with freshly loaded engines — the whole lifecycle a long-running
//! service repeats — so a leak anywhere (runtime, engines, model load) shows
//! as RSS growth. Prints one line per round (RSS, turns, p50 response
//! latency) and compares the first and last tenth of the rounds.

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

use std::time::{Duration, Instant};

fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let secs: u64 = std::env::var("VOXLINE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3600);
    let mut files: Vec<_> = std::fs::read_dir(util::fixtures_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "wav"))
        .collect();
    files.sort();
    let settings = voxline_pipeline::settings::EngineSettings {
        max_tokens: 32,
        ..voxline_pipeline::settings::EngineSettings::local(
            util::whisper_model(),
            util::llm_model(),
            voxline_pipeline::settings::ThreadBudget::split(None, None).unwrap(),
        )
    };
    let start = Instant::now();
    let rss0 = rss_mb();
    let mut rounds: Vec<(f64, usize, f64)> = Vec::new();
    println!("round  elapsed_s  rss_mb  turns  p50_response_ms  errors");
    while start.elapsed() < Duration::from_secs(secs) {
        let stt = voxline_stt::SttStage::new(
            voxline_stt::SttEngine::load(settings.stt_config().expect("whisper settings")).unwrap(),
        );
        let llm = voxline_llm::LlmStage::new(
            voxline_llm::LlmModel::load(settings.llm_config().expect("llama.cpp settings"))
                .unwrap(),
        );
        let inputs = voxline_pipeline::pipeline::open_inputs(&files).unwrap();
        let run =
            voxline_pipeline::pipeline::run(inputs, stt, llm, &Default::default(), None).unwrap();
        let r = voxline_report::build(&run, voxline_report::RunConfig::default(), 0.0, None);
        let p50 = r.summary.response_latency_ms.map_or(f64::NAN, |p| p.p50);
        let rss = rss_mb();
        println!(
            "{:>5}  {:>9.0}  {:>6.1}  {:>5}  {:>15.0}  {:>6}",
            rounds.len() + 1,
            start.elapsed().as_secs_f64(),
            rss,
            r.summary.turns,
            p50,
            r.summary.errors
        );
        rounds.push((rss, r.summary.turns, p50));
    }
    let tenth = (rounds.len() / 10).max(1);
    let mean = |xs: &[(f64, usize, f64)], f: fn(&(f64, usize, f64)) -> f64| {
        xs.iter().map(f).sum::<f64>() / xs.len() as f64
    };
    let (first, last) = (&rounds[..tenth], &rounds[rounds.len() - tenth..]);
    println!(
        "soak {:.0} s, {} rounds: RSS {:.1} MB at start, {:.1} → {:.1} MB (first → last tenth); p50 response latency {:.0} → {:.0} ms (×{:.2})",
        start.elapsed().as_secs_f64(),
        rounds.len(),
        rss0,
        mean(first, |r| r.0),
        mean(last, |r| r.0),
        mean(first, |r| r.2),
        mean(last, |r| r.2),
        mean(last, |r| r.2) / mean(first, |r| r.2)
    );
}
