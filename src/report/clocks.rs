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
