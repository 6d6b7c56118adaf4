//! The virtual clock's discrete-event simulator. At fast pace each turn's
//! measured service times ([`SimJob`]) are replayed from its audio time, the
//! engines serving turns as the cores were shared ([`SimCores`]): what a
//! live user would have waited, deterministically.

use super::schema::{StageReport, TurnReport};
use crate::stats::Percentiles;
use crate::topology::{LLM, STT, VAD};

/// One turn's measured service times, for the virtual clock.
pub(crate) struct SimJob {
    /// Index into the turns.
    pub(super) turn: usize,
    /// When the utterance was sent downstream (virtual ms).
    pub(super) ready: f64,
    /// When its end was confirmed (= `ready` unless speculative).
    pub(super) commit: f64,
    /// Sent early, before `commit`.
    pub(super) speculative: bool,
    /// STT busy time and its time to the transcript.
    pub(super) stt: Option<(f64, Option<f64>)>,
    /// LLM busy time and its time to the first token.
    pub(super) llm: Option<(f64, Option<f64>)>,
}

/// How the engines share the cores on the virtual clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SimCores {
    /// Each stage is its own server.
    Split,
    /// One server, jobs in the order they asked.
    Shared,
    /// One server, the most urgent job first (STT > first token > decode),
    /// and a streaming answer yields at every token boundary.
    Priority,
}

impl SimCores {
    /// How a run that shared its cores by `share` is simulated.
    pub(crate) fn of(share: crate::settings::CpuShare) -> Self {
        match share {
            crate::settings::CpuShare::Split => Self::Split,
            crate::settings::CpuShare::Priority => Self::Priority,
            crate::settings::CpuShare::Shared => Self::Shared,
        }
    }
}

/// Replays the measured service times on the virtual clock: utterances
/// close at their audio time; STT and LLM each serve turns in order. With
/// shared cores (one CPU lease) the two stages are one server: in `Shared`
/// it takes whichever waiting job asked first; in `Priority` the most
/// urgent, and an answer's decoding is cut into its tokens, so a turn's STT
/// runs between two tokens of the previous answer, as it does live. Fills
/// each turn's queue waits, TTFT, response latency and timeline; returns
/// when the last job finished.
pub(crate) fn simulate(jobs: &[SimJob], cores: SimCores, turns: &mut [TurnReport]) -> f64 {
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Kind {
        /// The rest of an answer, `left` tokens of `each` ms (lowest priority).
        Decode { left: usize },
        /// Prefill and first token.
        Llm,
        /// Transcription (most urgent).
        Stt,
    }
    // (ready time, job index, kind) waiting to run
    let mut pending: Vec<(f64, usize, Kind)> = jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.stt.is_some())
        .map(|(i, j)| (j.ready, i, Kind::Stt))
        .collect();
    let shared = cores != SimCores::Split;
    let (mut stt_free, mut llm_free, mut end) = (0.0f64, 0.0f64, 0.0f64);
    while !pending.is_empty() {
        let start_of = |(ready, _, kind): &(f64, usize, Kind)| -> f64 {
            let free = if shared {
                stt_free.max(llm_free)
            } else {
                match kind {
                    Kind::Stt => stt_free,
                    Kind::Llm | Kind::Decode { .. } => llm_free,
                }
            };
            ready.max(free)
        };
        // the job that can start first; ties go to the most urgent (priority
        // cores), then to the one that became ready first
        let Some((pos, _)) = pending.iter().enumerate().min_by(|a, b| {
            let urgency = if cores == SimCores::Priority {
                b.1 .2.cmp(&a.1 .2)
            } else {
                std::cmp::Ordering::Equal
            };
            start_of(a.1)
                .total_cmp(&start_of(b.1))
                .then(urgency)
                .then(a.1 .0.total_cmp(&b.1 .0))
                .then(a.1 .1.cmp(&b.1 .1))
        }) else {
            break;
        };
        let job = pending.remove(pos);
        let start = start_of(&job);
        let (ready, i, kind) = job;
        let j = &jobs[i];
        let t = &mut turns[j.turn];
        match kind {
            Kind::Stt => {
                let (busy, service) = j.stt.unwrap_or_default();
                stt_free = start + busy;
                end = end.max(stt_free);
                t.timeline.stt_ms = Some([start, stt_free]);
                t.stt_queue_ms = Some(start - ready);
                if let Some(service) = service {
                    t.stt_ms = Some(service);
                    if j.llm.is_some() {
                        pending.push((start + service, i, Kind::Llm));
                    }
                }
            }
            Kind::Llm => {
                let (busy, first) = j.llm.unwrap_or_default();
                let tokens = t.llm_streamed_tokens;
                // priority cores: after the first token the answer decodes token by token
                let yields = cores == SimCores::Priority && tokens > 1 && first.is_some();
                llm_free = start + if yields { first.unwrap_or(busy) } else { busy };
                end = end.max(llm_free);
                t.timeline.llm_ms = Some([start, llm_free]);
                t.llm_queue_ms = Some(start - ready);
                t.llm_ms = Some(llm_free - start);
                if yields {
                    pending.push((llm_free, i, Kind::Decode { left: tokens - 1 }));
                }
                if let Some(first) = first {
                    let computed = start + first;
                    let shown = computed.max(j.commit);
                    t.timeline.first_token_ms = Some(shown);
                    t.llm_ttft_ms = Some(start - ready + first);
                    t.response_latency_ms = Some(shown - t.timeline.end_of_speech_ms);
                    t.processing_ms = Some(shown - j.commit);
                    if j.speculative {
                        t.commit_wait_ms = Some(shown - computed);
                    }
                }
            }
            Kind::Decode { left } => {
                let (busy, first) = j.llm.unwrap_or_default();
                let tokens = t.llm_streamed_tokens.max(2);
                let each = (busy - first.unwrap_or(0.0)).max(0.0) / (tokens - 1) as f64;
                llm_free = start + each;
                end = end.max(llm_free);
                if let Some(span) = &mut t.timeline.llm_ms {
                    span[1] = llm_free;
                    t.llm_ms = Some(span[1] - span[0]);
                }
                if left > 1 {
                    pending.push((llm_free, i, Kind::Decode { left: left - 1 }));
                }
            }
        }
    }
    end
}

/// At fast pace audio arrives faster than real time, so the measured queue
/// waits of the engine stages say nothing about a live session; report the
/// virtual-clock waits instead (the VAD's input is never queued in real time).
pub(crate) fn with_virtual_waits(
    mut stages: Vec<StageReport>,
    turns: &[TurnReport],
) -> Vec<StageReport> {
    for s in &mut stages {
        // (arrival, start) of every item on the virtual clock
        let items: Vec<(f64, f64)> = if s.name == STT {
            // a speculative turn reached STT when its attempt was sent, not at its commit
            let arrived = |t: &TurnReport| {
                t.spec_delay_ms
                    .map_or(t.timeline.closed_ms, |d| t.timeline.end_of_speech_ms + d)
            };
            turns
                .iter()
                .filter_map(|t| Some((arrived(t), t.timeline.stt_ms?[0])))
                .collect()
        } else if s.name == LLM {
            turns
                .iter()
                .filter_map(|t| {
                    Some((
                        t.timeline.llm_ms?[0] - t.llm_queue_ms?,
                        t.timeline.llm_ms?[0],
                    ))
                })
                .collect()
        } else if s.name == VAD {
            s.queue_wait_ms = Percentiles::of(&vec![0.0; s.items]);
            s.queue_max_depth = 0;
            continue;
        } else {
            continue;
        };
        s.queue_wait_ms = Percentiles::of(&items.iter().map(|(a, b)| b - a).collect::<Vec<_>>());
        // deepest queue: items arrived and not yet started, at each arrival
        s.queue_max_depth = items
            .iter()
            .map(|(t, _)| items.iter().filter(|(a, b)| a <= t && b > t).count())
            .max()
            .unwrap_or(0);
    }
    stages
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A turn whose speech ended at `eos` ms and that streams `tokens`.
    fn turn(eos: f64, tokens: usize) -> TurnReport {
        let mut t = TurnReport {
            llm_streamed_tokens: tokens,
            ..TurnReport::default()
        };
        t.timeline.end_of_speech_ms = eos;
        t
    }

    /// A job sent at `ready` ms: STT (busy, to transcript), LLM (busy, to first token).
    fn job(turn: usize, ready: f64, stt: (f64, f64), llm: (f64, f64)) -> SimJob {
        SimJob {
            turn,
            ready,
            commit: ready,
            speculative: false,
            stt: Some((stt.0, Some(stt.1))),
            llm: Some((llm.0, Some(llm.1))),
        }
    }

    /// Two turns whose STTs overlap: turn 1 is sent while turn 0 transcribes.
    fn two_turns() -> (Vec<SimJob>, Vec<TurnReport>) {
        let jobs = vec![
            job(0, 1000.0, (500.0, 500.0), (400.0, 100.0)),
            job(1, 1200.0, (300.0, 300.0), (200.0, 50.0)),
        ];
        (jobs, vec![turn(300.0, 4), turn(500.0, 3)])
    }

    #[test]
    fn split_cores_serve_each_stage_in_order_on_its_own() {
        let (jobs, mut turns) = two_turns();
        let end = simulate(&jobs, SimCores::Split, &mut turns);
        assert_eq!(end, 2100.0);
        let (a, b) = (&turns[0], &turns[1]);
        assert_eq!(a.timeline.stt_ms, Some([1000.0, 1500.0]));
        assert_eq!(a.timeline.llm_ms, Some([1500.0, 1900.0]));
        assert_eq!(a.timeline.first_token_ms, Some(1600.0));
        assert_eq!(a.stt_queue_ms, Some(0.0));
        assert_eq!(a.llm_queue_ms, Some(0.0));
        assert_eq!(a.llm_ttft_ms, Some(100.0));
        assert_eq!(a.response_latency_ms, Some(1300.0));
        assert_eq!(a.processing_ms, Some(600.0));
        assert_eq!(a.commit_wait_ms, None, "not speculative");
        // turn 1 waits for the STT, then for the LLM still answering turn 0
        assert_eq!(b.timeline.stt_ms, Some([1500.0, 1800.0]));
        assert_eq!(b.stt_queue_ms, Some(300.0));
        assert_eq!(b.stt_ms, Some(300.0));
        assert_eq!(b.timeline.llm_ms, Some([1900.0, 2100.0]));
        assert_eq!(b.llm_queue_ms, Some(100.0));
        assert_eq!(b.llm_ms, Some(200.0));
        assert_eq!(b.llm_ttft_ms, Some(150.0));
        assert_eq!(b.response_latency_ms, Some(1450.0));
    }

    #[test]
    fn shared_cores_are_one_server_taking_the_job_that_asked_first() {
        let (jobs, mut turns) = two_turns();
        let end = simulate(&jobs, SimCores::Shared, &mut turns);
        assert_eq!(end, 2400.0);
        // turn 1's STT asked (1200) before turn 0's LLM (1500): it goes first
        assert_eq!(turns[1].timeline.stt_ms, Some([1500.0, 1800.0]));
        assert_eq!(turns[0].timeline.llm_ms, Some([1800.0, 2200.0]));
        assert_eq!(turns[0].llm_queue_ms, Some(300.0));
        assert_eq!(turns[0].response_latency_ms, Some(1600.0));
        assert_eq!(turns[1].timeline.llm_ms, Some([2200.0, 2400.0]));
        assert_eq!(turns[1].llm_queue_ms, Some(400.0));
        assert_eq!(turns[1].response_latency_ms, Some(1750.0));
    }

    /// Turn 0 answers in 5 tokens (first after 200 ms, then 200 ms each);
    /// turn 1 is sent while it decodes.
    fn long_answer() -> (Vec<SimJob>, Vec<TurnReport>) {
        let jobs = vec![
            job(0, 1000.0, (500.0, 500.0), (1000.0, 200.0)),
            job(1, 1900.0, (300.0, 300.0), (100.0, 50.0)),
        ];
        (jobs, vec![turn(300.0, 5), turn(1200.0, 1)])
    }

    #[test]
    fn priority_cores_run_the_next_stt_between_two_tokens_of_an_answer() {
        let (jobs, mut turns) = long_answer();
        let end = simulate(&jobs, SimCores::Priority, &mut turns);
        // turn 0: first token at 1700, a token at 1900, then turn 1's STT
        // (1900–2200) and its LLM (2200–2300), then the last 3 tokens
        assert_eq!(turns[0].timeline.first_token_ms, Some(1700.0));
        assert_eq!(turns[1].timeline.stt_ms, Some([1900.0, 2200.0]));
        assert_eq!(turns[1].stt_queue_ms, Some(0.0));
        assert_eq!(turns[1].timeline.llm_ms, Some([2200.0, 2300.0]));
        assert_eq!(turns[1].response_latency_ms, Some(2250.0 - 1200.0));
        assert_eq!(turns[0].timeline.llm_ms, Some([1500.0, 2900.0]));
        assert_eq!(turns[0].llm_ms, Some(1400.0));
        assert_eq!(end, 2900.0);

        // shared cores: turn 1's STT waits for the whole answer
        let (jobs, mut turns) = long_answer();
        let end = simulate(&jobs, SimCores::Shared, &mut turns);
        assert_eq!(turns[0].timeline.llm_ms, Some([1500.0, 2500.0]));
        assert_eq!(turns[1].timeline.stt_ms, Some([2500.0, 2800.0]));
        assert_eq!(turns[1].stt_queue_ms, Some(600.0));
        assert_eq!(end, 2900.0);
    }

    #[test]
    fn a_speculative_answer_is_shown_at_its_commit() {
        let mut j = job(0, 1000.0, (300.0, 300.0), (200.0, 100.0));
        j.commit = 2000.0;
        j.speculative = true;
        let mut turns = vec![turn(900.0, 3)];
        let end = simulate(&[j], SimCores::Split, &mut turns);
        assert_eq!(end, 1500.0);
        let t = &turns[0];
        // computed at 1400, held until the commit at 2000
        assert_eq!(t.timeline.first_token_ms, Some(2000.0));
        assert_eq!(t.commit_wait_ms, Some(600.0));
        assert_eq!(t.processing_ms, Some(0.0));
        assert_eq!(t.response_latency_ms, Some(1100.0));
    }

    #[test]
    fn a_turn_without_a_transcript_never_reaches_the_llm() {
        let mut j = job(0, 1000.0, (40.0, 0.0), (0.0, 0.0));
        j.stt = Some((40.0, None));
        let mut turns = vec![turn(900.0, 0)];
        let end = simulate(&[j], SimCores::Split, &mut turns);
        assert_eq!(end, 1040.0);
        assert_eq!(turns[0].timeline.stt_ms, Some([1000.0, 1040.0]));
        assert_eq!(turns[0].stt_ms, None);
        assert_eq!(turns[0].timeline.llm_ms, None);
        assert_eq!(turns[0].response_latency_ms, None);
    }

    #[test]
    fn cores_follow_the_lease_and_the_policy() {
        use crate::settings::CpuShare;
        assert_eq!(SimCores::of(CpuShare::Split), SimCores::Split);
        assert_eq!(SimCores::of(CpuShare::Priority), SimCores::Priority);
        assert_eq!(SimCores::of(CpuShare::Shared), SimCores::Shared);
    }

    fn stage(name: &str, items: usize) -> StageReport {
        StageReport {
            name: name.to_string(),
            items,
            busy_ms: 0.0,
            utilization: 0.0,
            tokens: None,
            tokens_per_s: None,
            queue_wait_ms: Percentiles::of(&[5.0]),
            queue_max_depth: 7,
            queue_capacity: 8,
            dropped: 0,
        }
    }

    #[test]
    fn virtual_waits_replace_the_measured_ones() {
        let (jobs, mut turns) = two_turns();
        simulate(&jobs, SimCores::Split, &mut turns);
        turns[0].timeline.closed_ms = 1000.0;
        turns[1].timeline.closed_ms = 1200.0;
        let stages = vec![
            stage("vad", 3),
            stage("stt", 2),
            stage("upper", 2),
            stage("llm", 2),
        ];
        let stages = with_virtual_waits(stages, &turns);
        let vad = &stages[0];
        assert_eq!(vad.queue_max_depth, 0);
        assert_eq!(vad.queue_wait_ms.map(|q| (q.n, q.mean)), Some((3, 0.0)));
        // STT: waits 0 and 300 ms; only turn 1 ever waited in the queue
        let stt = &stages[1];
        assert_eq!(stt.queue_wait_ms.map(|q| (q.n, q.mean)), Some((2, 150.0)));
        assert_eq!(stt.queue_max_depth, 1);
        // an added stage keeps what was measured
        assert_eq!(stages[2].queue_max_depth, 7);
        assert_eq!(stages[2].queue_wait_ms.map(|q| q.mean), Some(5.0));
        // LLM: waits 0 and 100 ms
        let llm = &stages[3];
        assert_eq!(llm.queue_wait_ms.map(|q| (q.n, q.mean)), Some((2, 50.0)));
        assert_eq!(llm.queue_max_depth, 1);
    }

    #[test]
    fn a_speculative_turn_waits_for_stt_from_its_attempt_not_its_commit() {
        let (jobs, mut turns) = two_turns();
        simulate(&jobs, SimCores::Split, &mut turns);
        let stt_start = turns[0].timeline.stt_ms.unwrap()[0];
        // sent 40 ms after the true end, committed long after STT started
        turns[0].timeline.end_of_speech_ms = stt_start - 100.0;
        turns[0].spec_delay_ms = Some(40.0);
        turns[0].timeline.closed_ms = stt_start + 500.0;
        turns[1].timeline.closed_ms = turns[1].timeline.stt_ms.unwrap()[0];
        let stages = with_virtual_waits(vec![stage("stt", 2)], &turns);
        let q = stages[0].queue_wait_ms.unwrap();
        // 60 ms and 0 ms: never negative
        assert!((q.max - 60.0).abs() < 0.1, "{q:?}");
        assert!((q.mean - 30.0).abs() < 0.1, "{q:?}");
    }
}
