//! `voxline replay`: recorded audio through the whole pipeline.

use voxline_pipeline::output::Output;
use voxline_pipeline::pipeline::{self, Source};

use super::session::{finish_report, outcome_of, Run, Session};
use crate::cli::ReplayArgs;
use crate::Outcome;

pub(crate) fn replay(args: ReplayArgs) -> anyhow::Result<Outcome> {
    // Everything the user gave is checked before any model loads.
    let session = Session::new(&args.engine, &args.vad, args.out.budget.as_deref())?;
    let [report_out, events_out] = <[Option<Output>; 2]>::try_from(session.plan_outputs(
        &[
            ("--report-json", args.out.report_json.as_deref()),
            ("--events", args.out.events.as_deref()),
        ],
        &args.files,
        &[],
    )?)
    .map_err(|_| anyhow::anyhow!("internal: two outputs planned"))?;
    let inputs = pipeline::open_inputs(&args.files)?;
    let fault = voxline_pipeline::fault::Fault::from_env()?;
    let quiet = args.out.quiet;
    let Some(ran) = session.run(Run {
        source: Source::Replay(inputs),
        pace: args.pace,
        files: args.files.clone(),
        warmup: args.out.warmup,
        events: events_out,
        console: !quiet,
        on_event: None,
        fault,
        cancel_on_stop: false,
        before_load: &|| {
            if !quiet {
                eprintln!("voxline: loading models");
            }
        },
        after_load: &|| {},
    })?
    else {
        return Ok(Outcome::Interrupted);
    };
    finish_report(&ran.report, report_out.as_ref(), quiet)?;
    Ok(outcome_of(&ran.report))
}
