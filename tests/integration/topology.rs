//! A stage added through the public API, in about 40 lines: its row shows
//! in the report, the timeline and the CSV with no change to their code.

use voxline_core::{Emitter, Stage, StageError, Transcript};
use voxline_llm::TurnComplete;

use crate::util;

/// Upper-cases transcripts on their way to the LLM.
struct Upper;

impl Stage for Upper {
    type In = Transcript;
    type Out = Transcript;
    fn name(&self) -> &str {
        "upper"
    }
    fn process(
        &mut self,
        t: Transcript,
        out: &mut Emitter<'_, Transcript>,
    ) -> Result<(), StageError> {
        let text = t.text.to_uppercase();
        out.emit(Transcript { text, ..t });
        Ok(())
    }
}

#[test]
fn an_added_stage_has_its_row_in_the_report_the_timeline_and_the_csv() {
    let _g = util::engine_lock();
    let (stt, llm) = util::stages(&util::settings(8));
    let inputs = voxline::pipeline::open_inputs(&[util::fixture("q_capital.wav")]).unwrap();
    let extras = voxline::pipeline::Extras::default().after_stt(Upper);
    let run =
        voxline::pipeline::run_with(inputs, stt, llm, extras, &Default::default(), None).unwrap();
    assert!(run.outcome.failed.is_none(), "{:?}", run.outcome.failed);
    let report = voxline::report::build(&run, Default::default(), 0.0, None);
    // the LLM answered what the added stage made of the transcript
    let heard: Vec<&str> = (run.events.iter())
        .filter_map(|e| e.event.engine::<TurnComplete>())
        .map(|c| c.transcript.as_str())
        .collect();
    assert!(
        !heard.is_empty()
            && heard
                .iter()
                .all(|t| *t == t.to_uppercase() && !t.is_empty())
    );
    let names: Vec<&str> = report.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["vad", "stt", "upper", "llm", "sink"]);
    let row = &report.stages[2];
    assert_eq!(row.items, heard.len());
    assert!(row.busy_ms > 0.0 && row.queue_capacity > 0, "{row:?}");
    let csv = voxline::bench::to_csv(&report);
    assert!(csv.lines().next().unwrap().ends_with(",upper_busy_ms"));
    for line in csv.lines().skip(1) {
        let busy: f64 = line.rsplit(',').next().unwrap().parse().unwrap();
        assert!(busy >= 0.0, "{line}");
    }
    let svg = voxline::bench::timeline_svg(&report).unwrap();
    let labelled = svg.lines().any(|l| l.trim() == "upper");
    assert!(labelled, "no timeline row for the added stage");
}
