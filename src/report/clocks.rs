//! The report's two clocks. With `--pace realtime` a turn's latency terms
//! are read off the wall clock: the session clock the runtime stamped every
//! event and span with. With `--pace fast` audio arrives faster than real
//! time, so the wall clock says nothing about a live user's wait: a turn is
//! placed on a virtual clock at its audio time (the utterance closes when
//! its last sample would have been spoken) and its measured service times
//! become a [`SimJob`] that [`simulate`](super::simulate::simulate) replays.

use std::time::Instant;

use voxline_core::{Clock, UtteranceInfo};

use super::gather::{ms, Gathered};
use super::schema::{TurnReport, TurnTimeline};
use super::simulate::SimJob;

/// Fills `t`'s latency terms and timeline from the wall-clock instants of
/// its events and spans (`u`, closed at `utt_at`); `clock` is the session's.
pub(crate) fn on_wall_clock(
    t: &mut TurnReport,
    g: &Gathered,
    u: &UtteranceInfo,
    utt_at: Instant,
    clock: Clock,
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
        stt_ms: g.stt_span.map(|(a, b, _)| [at(a), at(b)]),
        llm_ms: g.llm_span.map(|(a, _, b, _)| [at(a), at(b)]),
        first_token_ms: g.tokens.first().map(|f| at(*f)),
    };
    t.endpoint_delay_ms = Some(ms(t_end, closed_at));
    if g.commit.is_some() {
        t.spec_delay_ms = Some(ms(t_end, utt_at));
    }
    if let Some((st, _, _)) = g.stt_span {
        t.stt_queue_ms = Some(ms(utt_at, st));
    }
    t.stt_ms = g.stt_service();
    if let (Some((_, tr_at)), Some((st, _, fin, _))) = (&g.transcript, g.llm_span) {
        t.llm_queue_ms = Some(ms(*tr_at, st));
        t.llm_ms = Some(ms(st, fin));
        if let Some(first) = g.tokens.first() {
            t.llm_ttft_ms = Some(ms(*tr_at, *first));
            // shown when computed, or at the commit if it was computed earlier
            let shown = (*first).max(closed_at);
            t.response_latency_ms = Some(ms(t_end, shown));
            t.processing_ms = Some(ms(closed_at, shown));
            if g.commit.is_some() {
                t.commit_wait_ms = Some(ms(*first, shown));
            }
        }
    }
    t.llm_first_token_ms = g.llm_first_token();
}

/// Places `t` on the virtual clock (its end of speech and close at their
/// audio time) and returns the service times the simulator replays for it;
/// the queue waits and latencies are left to the simulator.
pub(crate) fn on_virtual_clock(t: &mut TurnReport, g: &Gathered) -> SimJob {
    let v_end = Clock::samples_to_ms(t.true_end_sample);
    let v_utt = Clock::samples_to_ms(t.closed_sample);
    t.endpoint_delay_ms = Some(v_utt - v_end);
    t.timeline.end_of_speech_ms = v_end;
    t.timeline.closed_ms = v_utt;
    let (stt_service, llm_first) = (g.stt_service(), g.llm_first_token());
    t.llm_first_token_ms = llm_first;
    if let Some((sent, _, _)) = g.commit {
        t.spec_delay_ms = Some(Clock::samples_to_ms(sent) - v_end);
    }
    SimJob {
        turn: 0,
        ready: g
            .commit
            .map_or(v_utt, |(sent, _, _)| Clock::samples_to_ms(sent)),
        commit: v_utt,
        speculative: g.commit.is_some(),
        stt: g.stt_span.map(|(_, _, busy)| (busy, stt_service)),
        llm: g.llm_span.map(|(_, _, _, busy)| (busy, llm_first)),
    }
}

#[cfg(test)]
mod tests {
    use voxline_core::PipelineEvent;

    use super::*;
    use crate::pipeline::Pace;
    use crate::report::{fixture, turn_report};

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-6)
    }

    /// The latency terms add up to the response latency exactly.
    fn terms_add_up(t: &TurnReport) {
        let sum = t.spec_delay_ms.or(t.endpoint_delay_ms).unwrap()
            + t.stt_queue_ms.unwrap()
            + t.stt_ms.unwrap()
            + t.llm_queue_ms.unwrap()
            + t.llm_first_token_ms.unwrap()
            + t.commit_wait_ms.unwrap_or(0.0);
        assert!(close(t.response_latency_ms, sum), "{t:?}");
    }

    #[test]
    fn on_the_wall_clock_the_terms_are_read_off_the_instants() {
        let run = fixture::run(Pace::Realtime, crate::settings::CpuShare::Split);
        let cx = fixture::context(&run);
        let (t, _) = turn_report(0, 1, &fixture::gathered(&run, 1), &cx).unwrap();
        // the VAD's end (16 500, at 1031 ms) less the sidecar's 500 samples
        assert!(close(Some(t.timeline.end_of_speech_ms), 999.75));
        assert_eq!(t.timeline.closed_ms, 1700.0);
        assert!(close(t.endpoint_delay_ms, 700.25));
        assert_eq!(t.stt_queue_ms, Some(10.0));
        assert_eq!(t.stt_ms, Some(790.0));
        assert_eq!(t.llm_queue_ms, Some(10.0));
        assert_eq!(t.llm_first_token_ms, Some(190.0));
        assert_eq!(t.llm_ttft_ms, Some(200.0));
        assert_eq!(t.llm_ms, Some(490.0));
        assert_eq!(t.processing_ms, Some(1000.0));
        assert!(close(t.response_latency_ms, 1700.25));
        assert_eq!(t.spec_delay_ms, None);
        assert_eq!(t.commit_wait_ms, None);
        assert_eq!(t.timeline.stt_ms, Some([1710.0, 2500.0]));
        assert_eq!(t.timeline.llm_ms, Some([2510.0, 3000.0]));
        assert_eq!(t.timeline.first_token_ms, Some(2700.0));
        terms_add_up(&t);
    }

    #[test]
    fn on_the_wall_clock_a_speculative_turn_closes_at_its_commit() {
        let run = fixture::run(Pace::Realtime, crate::settings::CpuShare::Split);
        let cx = fixture::context(&run);
        let (t, _) = turn_report(1, 3, &fixture::gathered(&run, 3), &cx).unwrap();
        // sent at 3250 ms, committed at 3700 ms; speech ended at 2999.25 ms
        assert_eq!(t.timeline.closed_ms, 3700.0);
        assert!(close(t.endpoint_delay_ms, 700.75));
        assert!(close(t.spec_delay_ms, 250.75));
        assert_eq!(t.stt_queue_ms, Some(10.0), "from when it was sent");
        // the first token (3900) came after the commit: no wait
        assert_eq!(t.commit_wait_ms, Some(0.0));
        assert_eq!(t.processing_ms, Some(200.0));
        assert!(close(t.response_latency_ms, 900.75));
        terms_add_up(&t);

        // a first token ready before the commit waits for it
        let mut run = run;
        for e in &mut run.events {
            if let PipelineEvent::Commit { .. } = e.event {
                e.at = run.clock.origin() + std::time::Duration::from_millis(4000);
            }
        }
        let (t, _) =
            turn_report(1, 3, &fixture::gathered(&run, 3), &fixture::context(&run)).unwrap();
        assert_eq!(t.commit_wait_ms, Some(100.0));
        assert_eq!(t.processing_ms, Some(0.0));
        assert!(close(t.response_latency_ms, 1000.75));
        terms_add_up(&t);
    }

    #[test]
    fn on_the_virtual_clock_a_turn_is_placed_at_its_audio_time() {
        let run = fixture::run(Pace::Fast, crate::settings::CpuShare::Split);
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
        assert_eq!(job.stt, Some((540.0, Some(540.0))));
        assert_eq!(job.llm, Some((290.0, Some(90.0))));
        assert_eq!(t.llm_first_token_ms, Some(90.0));
        // the simulator fills the rest
        assert_eq!(t.stt_queue_ms, None);
        assert_eq!(t.response_latency_ms, None);

        let (_, job) = turn_report(0, 1, &fixture::gathered(&run, 1), &cx).unwrap();
        let job = job.unwrap();
        assert_eq!(
            (job.ready, job.commit, job.speculative),
            (1700.0, 1700.0, false)
        );
    }
}
