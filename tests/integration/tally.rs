//! A live session's report is tallied as the session runs, in bounded
//! memory (`voxline_report::tally`); it must say what a report gathered from the
//! whole record says.

use crate::util;
use voxline_pipeline::pipeline::Pace;
use voxline_report::tally::Tally;
use voxline_report::{build, RunConfig};

fn json(r: &voxline_report::Report) -> serde_json::Value {
    serde_json::to_value(r).unwrap()
}

#[test]
fn a_tally_reports_what_the_whole_record_does_and_keeps_only_the_last_turns() {
    let _g = util::engine_lock();
    let (mut run, _) = util::replay(&["multi_turn.wav", "q_tea.wav"], 8);
    // the tally measures on the wall clock, as a live session does, and
    // live there are no sidecars
    run.pace = Pace::Realtime;
    run.inputs.clear();
    let config = RunConfig {
        warmup: 1,
        ..RunConfig::default()
    };
    let whole = json(&build(&run, config.clone(), 12.0, None));
    let turns = whole["turns"].as_array().unwrap().len();
    assert!(turns >= 4, "{whole:#}");

    let tallied = |keep: usize| {
        let mut tally = Tally::keeping(run.clock, run.topology.clone(), 1, keep);
        for ev in &run.events {
            tally.event(ev);
        }
        for s in &run.outcome.spans {
            tally.span(s);
        }
        tally.close(run.outcome.failed.as_deref());
        assert_eq!(tally.open_turns(), 0);
        // what a live run leaves: no spans, no events, the tally
        let mut live = clone_run(&run);
        live.events.clear();
        live.outcome.spans.clear();
        json(&tally.report(&live, config.clone(), 12.0, None))
    };
    let all = tallied(usize::MAX);
    assert_eq!(all["summary"], whole["summary"]);
    assert_eq!(all["stages"], whole["stages"]);
    assert_eq!(all["turns"], whole["turns"]);
    assert_eq!(all["cold_start"], whole["cold_start"]);

    // two turns kept: the last two, while the summary still counts them all
    let two = tallied(2);
    assert_eq!(two["summary"], all["summary"]);
    assert_eq!(two["stages"], all["stages"]);
    let kept = two["turns"].as_array().unwrap();
    assert_eq!(
        kept.as_slice(),
        &all["turns"].as_array().unwrap()[turns - 2..]
    );
}

/// A copy of the run's plain fields (`RunResult` holds no handles).
fn clone_run(run: &voxline_pipeline::pipeline::RunResult) -> voxline_pipeline::pipeline::RunResult {
    voxline_pipeline::pipeline::RunResult {
        clock: run.clock,
        pace: run.pace,
        outcome: run.outcome.clone(),
        events: run.events.clone(),
        inputs: run.inputs.clone(),
        input_errors: run.input_errors.clone(),
        input_warnings: run.input_warnings.clone(),
        interrupted: run.interrupted,
        audio_samples: run.audio_samples,
        cpu_share: run.cpu_share,
        engine_threads_peak: run.engine_threads_peak,
        live: run.live.clone(),
        topology: run.topology.clone(),
    }
}
