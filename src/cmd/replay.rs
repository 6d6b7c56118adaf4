//! `voxline replay`: recorded audio through the whole pipeline.

use voxline_pipeline::output::Output;
use voxline_pipeline::pipeline::{self, Source};

use super::session::{finish_report, outcome_of, Run, Session};
use crate::cli::ReplayArgs;
use crate::Outcome;

pub(crate) fn replay(args: ReplayArgs) -> anyhow::Result<Outcome> {
    // Everything the user gave is checked before any model loads.
    // nobody hears a replay: it speaks when its voice is asked for
    let voice = if args.voice_out.is_some() {
        crate::cli::VoiceArg::Auto
    } else {
        crate::cli::VoiceArg::Off
    };
    let session = Session::new(&args.engine, &args.vad, args.out.budget.as_deref(), voice)?;
    let [report_out, events_out, voice_out] =
        <[Option<Output>; 3]>::try_from(session.plan_outputs(
            &[
                ("--report-json", args.out.report_json.as_deref()),
                ("--events", args.out.events.as_deref()),
                ("--voice-out", args.voice_out.as_deref()),
            ],
            &args.files,
            &[],
        )?)
        .map_err(|_| anyhow::anyhow!("internal: three outputs planned"))?;
    if voice_out.is_some() && session.voice.is_none() {
        return Err(voxline_pipeline::BadInput(
            "--voice-out with --voice off: there is no voice to write; drop one of them".into(),
        )
        .into());
    }
    let stop = session.stop();
    let inputs = match pipeline::open_inputs_until(&args.files, Some(stop), &|p| {
        eprintln!(
            "voxline: {}: a named pipe with no writer yet; waiting for one (Ctrl-C stops)",
            p.display()
        );
    }) {
        // Ctrl-C or SIGTERM while waiting for an input's writer
        Err(_) if stop.is_requested() => return Ok(Outcome::Interrupted),
        r => r?,
    };
    let fault = voxline_pipeline::fault::from_env()?;
    let quiet = args.out.quiet;
    let Some(ran) = session.run(Run {
        source: Source::Replay(inputs),
        pace: args.pace,
        files: args.files.clone(),
        warmup: args.out.warmup,
        gap_ms: None,
        events: events_out,
        // the conversation's WAV on standard output must not be interleaved with the console
        console: !quiet && !voice_out.as_ref().is_some_and(Output::is_stdout),
        on_event: None,
        fault,
        cancel_on_stop: false,
        barge_in: None,
        echo_cancellation: None,
        probe_host: false,
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
    // the report first: a voice output that fails (a full disk) loses no figure
    finish_report(&ran.report, report_out.as_ref(), quiet)?;
    if let Some(out) = &voice_out {
        write_conversation(out, &ran, &args.files)?;
        if !quiet {
            eprintln!(
                "voxline: the conversation as heard: {}",
                out.given.display()
            );
        }
    }
    Ok(outcome_of(&ran.report))
}

/// Writes the conversation as it was heard (`--voice-out`): the recordings
/// read again onto the stream's timeline (left), the voice (right).
fn write_conversation(
    out: &Output,
    ran: &super::session::Ran,
    files: &[std::path::PathBuf],
) -> anyhow::Result<()> {
    let mut user: Vec<f32> = Vec::new();
    let stdin = files.iter().any(|f| f.as_os_str() == "-");
    if stdin {
        eprintln!("voxline: warning: a recording read from standard input cannot be read again; --voice-out holds the assistant's side only");
    } else {
        for span in &ran.result.inputs {
            let mut opened = pipeline::open_inputs(std::slice::from_ref(&span.path))?;
            let samples = opened.remove(0).read_all()?;
            let at = span.start as usize;
            if user.len() < at + samples.len() {
                user.resize(at + samples.len(), 0.0);
            }
            user[at..at + samples.len()].copy_from_slice(&samples);
        }
    }
    let assistant = voxline_report::conversation::assistant_track(&ran.result, &ran.report)
        .map_err(|e| anyhow::anyhow!("the voice could not be placed on the timeline: {e}"))?;
    let wav = voxline_report::conversation::stereo_wav(&user, &assistant)?;
    let mut w = out
        .open()
        .map_err(|e| voxline_pipeline::BadInput(out.describe(&e)))?;
    std::io::Write::write_all(&mut w, &wav)
        .map_err(|e| voxline_pipeline::BadInput(out.describe(&e)))?;
    w.finish()
        .map_err(|e| voxline_pipeline::BadInput(out.describe(&e)))?;
    Ok(())
}
