//! The report's two clocks. With `--pace realtime` a turn's latency terms
//! are read off the wall clock: the session clock the runtime stamped every
//! event and span with. With `--pace fast` audio arrives faster than real
//! time, so the wall clock says nothing about a live user's wait: a turn is
//! placed on a virtual clock at its audio time (the utterance closes when
//! its last sample would have been spoken) and its measured service times
//! become a [`SimJob`] that [`simulate`](super::simulate::simulate) replays.

use std::time::Instant;

use voxline_core::{Clock, TermPart, Topology, UtteranceInfo};

use super::gather::{ms, Gathered};
use super::schema::{TurnReport, TurnTimeline};
use super::simulate::{SimJob, SimStep};

/// Fills `t`'s latency terms and timeline from the wall-clock instants of
/// its events and spans (`u`, sent downstream at `utt_at`); `clock` is the
/// session's. The terms are read off one chain of instants — the end of
/// speech, the utterance sent, then each stage on the path taking its input
/// and sending its first output, then the response shown — so they add up
/// to the response latency exactly.
pub(crate) fn on_wall_clock(
    t: &mut TurnReport,
    g: &Gathered,
    u: &UtteranceInfo,
    utt_at: Instant,
    clock: Clock,
    topology: &Topology,
) {
    // The wall time the true end of speech was captured (or due): the
    // VAD's end-of-speech instant, moved by the sidecar's correction.
    let t_end = if t.true_end_sample >= u.end_sample {
        u.end_wall + Clock::samples_to_duration(t.true_end_sample - u.end_sample)
    } else {
        u.end_wall
            .checked_sub(Clock::samples_to_duration(u.end_sample - t.true_end_sample))
            .unwrap_or(u.end_wall)
    };
    let at = |i: Instant| clock.ms_since_origin(i);
    // a speculative turn was sent at `utt_at` and confirmed at its commit
    let closed_at = g.commit.map_or(utt_at, |(_, _, c)| c);
    t.timeline = TurnTimeline {
        end_of_speech_ms: at(t_end),
        closed_ms: at(closed_at),
        stages: topology
            .latency_stages()
            .iter()
            .filter_map(|s| {
                let c = g.calls(s.id.as_str())?;
                Some((s.id.to_string(), [at(c.start), at(c.end)]))
            })
            .collect(),
        first_token_ms: None,
    };
    t.endpoint_delay_ms = Some(ms(t_end, closed_at));
    if g.commit.is_some() {
        t.spec_delay_ms = Some(ms(t_end, utt_at));
    }
    // the chain: each term from the instant the one before it ended
    let mut last = utt_at;
    for term in topology.latency_terms() {
        let calls = g.calls(term.stage.as_str());
        let value = match term.part {
            TermPart::Endpoint => Some(ms(t_end, utt_at)),
            TermPart::Queue => calls.map(|c| ms(last, c.start)),
            TermPart::Service | TermPart::FirstOutput => calls
                .and_then(|c| c.first_out.map(|out| (c.start, out)))
                .map(|(start, out)| {
                    last = out;
                    ms(start, out)
                }),
            TermPart::CommitWait => {
                // shown when computed, or at the commit if it was computed earlier
                let shown = last.max(closed_at);
                t.timeline.first_token_ms = Some(at(shown));
                t.response_latency_ms = Some(ms(t_end, shown));
                t.processing_ms = Some(ms(closed_at, shown));
                if g.commit.is_some() {
                    t.commit_wait_ms = Some(ms(last, shown));
                }
                Some(ms(last, shown))
            }
        };
        let Some(v) = value else { break };
        t.terms_ms.insert(term.name, v);
    }
}

/// Places `t` on the virtual clock (its end of speech and close at their
/// audio time) and returns the service times the simulator replays for it,
/// one step per stage on the path; the queue waits and latencies are left
/// to the simulator.
pub(crate) fn on_virtual_clock(t: &mut TurnReport, g: &Gathered, topology: &Topology) -> SimJob {
    let v_end = Clock::samples_to_ms(t.true_end_sample);
    let v_utt = Clock::samples_to_ms(t.closed_sample);
    t.endpoint_delay_ms = Some(v_utt - v_end);
    t.timeline.end_of_speech_ms = v_end;
    t.timeline.closed_ms = v_utt;
    let ready = g
        .commit
        .map_or(v_utt, |(sent, _, _)| Clock::samples_to_ms(sent));
    if g.commit.is_some() {
        t.spec_delay_ms = Some(ready - v_end);
    }
    if let Some(endpoint) = topology
        .latency_terms()
        .into_iter()
        .find(|x| x.part == TermPart::Endpoint)
    {
        t.terms_ms.insert(endpoint.name, ready - v_end);
    }
    // each stage's busy time and its time to its first output, while the
    // chain holds (a stage that failed or never ran ends it)
    let steps = topology
        .latency_stages()
        .iter()
        .map_while(|s| {
            let c = g.calls(s.id.as_str())?;
            Some(SimStep {
                busy: c.busy_ms,
                to_output: c.first_out.map(|out| ms(c.start, out)),
                outputs: c.outputs,
            })
        })
        .collect();
    SimJob {
        turn: 0,
        ready,
        commit: v_utt,
        speculative: g.commit.is_some(),
        steps,
    }
}

#[cfg(test)]
mod tests {
    use voxline_core::PipelineEvent;

    use super::*;
    use crate::simulate::SimStep;
    use crate::{fixture, turn_report};
    use voxline_pipeline::pipeline::Pace;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-6)
    }

    /// The latency terms are those the topology declares, and add up to
    /// the response latency exactly.
    fn terms_add_up(t: &TurnReport, run: &voxline_pipeline::pipeline::RunResult) {
        let names: Vec<String> = run
            .topology
            .latency_terms()
            .into_iter()
            .map(|x| x.name)
            .collect();
        let mut got: Vec<String> = t.terms_ms.keys().cloned().collect();
        let mut want = names.clone();
        got.sort();
        want.sort();
        assert_eq!(got, want);
        let sum: f64 = t.terms_ms.values().sum();
        assert!(close(t.response_latency_ms, sum), "{t:?}");
    }

    /// Turn `n`'s report (utterance `id`), finished.
    fn report(run: &voxline_pipeline::pipeline::RunResult, n: usize, id: u64) -> TurnReport {
        let (mut t, _) =
            turn_report(n, id, &fixture::gathered(run, id), &fixture::context(run)).unwrap();
        crate::finish_turn(&mut t, &run.topology);
        t
    }

    #[test]
    fn on_the_wall_clock_the_terms_are_read_off_the_instants() {
        let run = fixture::run(Pace::Realtime, voxline_pipeline::settings::CpuShare::Split);
        let t = report(&run, 0, 1);
        // the VAD's end (16 500, at 1031 ms) less the sidecar's 500 samples
        assert!(close(Some(t.timeline.end_of_speech_ms), 999.75));
        assert_eq!(t.timeline.closed_ms, 1700.0);
        assert!(close(t.endpoint_delay_ms, 700.25));
        assert_eq!(t.stt_queue_ms, Some(10.0));
        assert_eq!(t.stt_ms, Some(790.0));
        // `upper` took the transcript at once and passed it on 5 ms later
        assert_eq!(t.terms_ms.get("upper_queue"), Some(&0.0));
        assert_eq!(t.terms_ms.get("upper"), Some(&5.0));
        assert_eq!(t.llm_queue_ms, Some(5.0));
        assert_eq!(t.llm_first_token_ms, Some(190.0));
        assert_eq!(t.llm_ttft_ms, Some(195.0));
        assert_eq!(t.llm_ms, Some(490.0));
        assert_eq!(t.processing_ms, Some(1000.0));
        assert!(close(t.response_latency_ms, 1700.25));
        assert_eq!(t.spec_delay_ms, None);
        assert_eq!(t.commit_wait_ms, None);
        assert_eq!(t.terms_ms.get("commit_wait"), Some(&0.0));
        assert_eq!(t.timeline.stages.get("stt"), Some(&[1710.0, 2500.0]));
        assert_eq!(t.timeline.stages.get("upper"), Some(&[2500.0, 2505.0]));
        assert_eq!(t.timeline.stages.get("llm"), Some(&[2510.0, 3000.0]));
        assert_eq!(t.timeline.first_token_ms, Some(2700.0));
        terms_add_up(&t, &run);
    }

    #[test]
    fn on_the_wall_clock_a_speculative_turn_closes_at_its_commit() {
        let run = fixture::run(Pace::Realtime, voxline_pipeline::settings::CpuShare::Split);
        let t = report(&run, 1, 3);
        // sent at 3250 ms, committed at 3700 ms; speech ended at 2999.25 ms
        assert_eq!(t.timeline.closed_ms, 3700.0);
        assert!(close(t.endpoint_delay_ms, 700.75));
        assert!(close(t.spec_delay_ms, 250.75));
        assert_eq!(t.stt_queue_ms, Some(10.0), "from when it was sent");
        // the first token (3900) came after the commit: no wait
        assert_eq!(t.commit_wait_ms, Some(0.0));
        assert_eq!(t.processing_ms, Some(200.0));
        assert!(close(t.response_latency_ms, 900.75));
        assert!(close(t.terms_ms.get("endpoint").copied(), 250.75));
        terms_add_up(&t, &run);

        // a first token ready before the commit waits for it
        let mut run = run;
        for e in &mut run.events {
            if let PipelineEvent::Commit { .. } = e.event {
                e.at = run.clock.origin() + std::time::Duration::from_millis(4000);
            }
        }
        let t = report(&run, 1, 3);
        assert_eq!(t.commit_wait_ms, Some(100.0));
        assert_eq!(t.terms_ms.get("commit_wait"), Some(&100.0));
        assert_eq!(t.processing_ms, Some(0.0));
        assert!(close(t.response_latency_ms, 1000.75));
        terms_add_up(&t, &run);
    }

    #[test]
    fn on_the_virtual_clock_a_turn_is_placed_at_its_audio_time() {
        let run = fixture::run(Pace::Fast, voxline_pipeline::settings::CpuShare::Split);
        let cx = fixture::context(&run);
        let (t, job) = turn_report(1, 3, &fixture::gathered(&run, 3), &cx).unwrap();
        let job = job.unwrap();
        // the sidecar's end 48 000 = 3000 ms; committed at 59 200 = 3700 ms
        assert_eq!(t.timeline.end_of_speech_ms, 3000.0);
        assert_eq!(t.timeline.closed_ms, 3700.0);
        assert_eq!(t.endpoint_delay_ms, Some(700.0));
        // sent at 52 000 = 3250 ms
        assert_eq!(t.spec_delay_ms, Some(250.0));
        assert_eq!(
            (job.ready, job.commit, job.speculative),
            (3250.0, 3700.0, true)
        );
        // a step per stage on the path: STT, `upper`, LLM
        let step = |busy: f64, out: f64| SimStep {
            busy,
            to_output: Some(out),
            outputs: 1,
        };
        assert_eq!(
            job.steps,
            [step(540.0, 540.0), step(2.0, 2.0), step(290.0, 90.0)]
        );
        assert_eq!(t.terms_ms.get("endpoint"), Some(&250.0));
        // the simulator fills the rest
        assert_eq!(t.terms_ms.len(), 1);
        assert_eq!(t.response_latency_ms, None);

        let (_, job) = turn_report(0, 1, &fixture::gathered(&run, 1), &cx).unwrap();
        let job = job.unwrap();
        assert_eq!(
            (job.ready, job.commit, job.speculative),
            (1700.0, 1700.0, false)
        );
    }
}
