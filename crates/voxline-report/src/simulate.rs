//! The virtual clock's discrete-event simulator. At fast pace each turn's
//! measured service times ([`SimJob`]: one [`SimStep`] per stage on the
//! response's path, as the topology declares it) are replayed from its
//! audio time, the stages serving turns as the cores were shared
//! ([`SimCores`]): what a live user would have waited, deterministically.

use voxline_core::{TermPart, Topology};

use super::schema::{StageReport, TurnReport};
use crate::stats::Percentiles;

/// One stage's measured work on one turn, for the virtual clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SimStep {
    /// Time it computed, ms.
    pub(super) busy: f64,
    /// Its input taken → its first output sent, ms (`None`: it sent none,
    /// so the turn goes no further).
    pub(super) to_output: Option<f64>,
    /// Outputs it sent (a streaming stage yields the cores between them).
    pub(super) outputs: u32,
}

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
    /// Each stage on the path, in flow order, while the turn reached it.
    pub(super) steps: Vec<SimStep>,
}

/// How the stages share the cores on the virtual clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SimCores {
    /// Each stage is its own server.
    Split,
    /// One server, jobs in the order they asked.
    Shared,
    /// One server, the most urgent job first (the earlier stage first, a
    /// streaming answer's rest last), and a streaming answer yields at
    /// every output.
    Priority,
}

impl SimCores {
    /// How a run that shared its cores by `share` is simulated.
    pub(crate) fn of(share: voxline_pipeline::settings::CpuShare) -> Self {
        match share {
            voxline_pipeline::settings::CpuShare::Split => Self::Split,
            voxline_pipeline::settings::CpuShare::Priority => Self::Priority,
            voxline_pipeline::settings::CpuShare::Shared => Self::Shared,
        }
    }
}

/// A stage on the response's path: its name and the names of its terms.
struct PathStage {
    name: String,
    queue: String,
    out: String,
    /// Its first output is the response.
    first_output: bool,
}

/// The stages on `topology`'s path, with their terms, and the commit
/// wait's name.
fn path(topology: &Topology) -> (Vec<PathStage>, Option<String>) {
    let terms = topology.latency_terms();
    let name = |stage: &str, part: TermPart| {
        terms
            .iter()
            .find(|t| t.stage == stage && t.part == part)
            .map(|t| t.name.clone())
    };
    let stages = topology
        .latency_stages()
        .iter()
        .map(|s| {
            let id = s.id.as_str();
            let first = name(id, TermPart::FirstOutput);
            PathStage {
                name: id.to_owned(),
                queue: name(id, TermPart::Queue).unwrap_or_default(),
                first_output: first.is_some(),
                out: first
                    .or_else(|| name(id, TermPart::Service))
                    .unwrap_or_default(),
            }
        })
        .collect();
    let commit = terms
        .iter()
        .find(|t| t.part == TermPart::CommitWait)
        .map(|t| t.name.clone());
    (stages, commit)
}

/// Replays the measured service times on the virtual clock: utterances are
/// sent at their audio time; each stage on `topology`'s path serves turns in
/// order, taking its measured busy time, and hands the turn on after its
/// measured time to its first output. With shared cores (one CPU lease) the
/// stages are one server: in `Shared` it takes whichever waiting job asked
/// first; in `Priority` the most urgent (the earlier stage), and the
/// response's rest is cut at its outputs, so a turn's STT runs between two
/// tokens of the previous answer, as it does live. Fills each turn's terms,
/// queue waits, response latency and timeline; returns when the last job
/// finished.
pub(crate) fn simulate(
    jobs: &[SimJob],
    cores: SimCores,
    turns: &mut [TurnReport],
    topology: &Topology,
) -> f64 {
    /// What a pending job is, most urgent last (as `Ord` sorts).
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Kind {
        /// The rest of a response, `left` more pieces (lowest priority).
        Rest { left: u32 },
        /// Stage `k` of the path, up to its first output: `Reverse` so the
        /// earlier stage is the more urgent.
        Step(std::cmp::Reverse<usize>),
    }
    let (stages, commit_term) = path(topology);
    let step_of = |kind: Kind| match kind {
        Kind::Step(std::cmp::Reverse(k)) => k,
        Kind::Rest { .. } => stages.len().saturating_sub(1),
    };
    // (ready time, job index, kind) waiting to run
    let mut pending: Vec<(f64, usize, Kind)> = jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| !j.steps.is_empty() && !stages.is_empty())
        .map(|(i, j)| (j.ready, i, Kind::Step(std::cmp::Reverse(0))))
        .collect();
    let shared = cores != SimCores::Split;
    // when each server is free (one for all when the cores are shared)
    let mut free = vec![0.0f64; if shared { 1 } else { stages.len() }];
    let server = |k: usize| if shared { 0 } else { k };
    let mut end = 0.0f64;
    while !pending.is_empty() {
        let start_of = |(ready, _, kind): &(f64, usize, Kind)| -> f64 {
            ready.max(free[server(step_of(*kind))])
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
        let k = step_of(kind);
        let (stage, step) = (&stages[k], j.steps[k]);
        let busy_until = match kind {
            Kind::Step(_) => {
                // priority cores: after its first output a response yields at each output
                let rest = if cores == SimCores::Priority && stage.first_output {
                    step.to_output
                        .filter(|_| step.outputs > 1)
                        .map(|first| (first, step.outputs - 1))
                } else {
                    None
                };
                let until = start + rest.map_or(step.busy, |(first, _)| first);
                t.timeline.stages.insert(stage.name.clone(), [start, until]);
                t.terms_ms.insert(stage.queue.clone(), start - ready);
                if let Some((_, left)) = rest {
                    pending.push((until, i, Kind::Rest { left }));
                }
                if let Some(out) = step.to_output {
                    t.terms_ms.insert(stage.out.clone(), out);
                    if stage.first_output {
                        let computed = start + out;
                        let shown = computed.max(j.commit);
                        t.timeline.first_token_ms = Some(shown);
                        t.response_latency_ms = Some(shown - t.timeline.end_of_speech_ms);
                        t.processing_ms = Some(shown - j.commit);
                        if j.speculative {
                            t.commit_wait_ms = Some(shown - computed);
                        }
                        if let Some(name) = &commit_term {
                            t.terms_ms.insert(name.clone(), shown - computed);
                        }
                    } else if k + 1 < j.steps.len() {
                        pending.push((start + out, i, Kind::Step(std::cmp::Reverse(k + 1))));
                    }
                }
                until
            }
            Kind::Rest { left } => {
                let first = step.to_output.unwrap_or(0.0);
                let pieces = step.outputs.saturating_sub(1).max(1);
                let until = start + (step.busy - first).max(0.0) / f64::from(pieces);
                if let Some(span) = t.timeline.stages.get_mut(&stage.name) {
                    span[1] = until;
                }
                if left > 1 {
                    pending.push((until, i, Kind::Rest { left: left - 1 }));
                }
                until
            }
        };
        free[server(k)] = busy_until;
        end = end.max(busy_until);
    }
    end
}

/// At fast pace audio arrives faster than real time, so the measured queue
/// waits of the stages on the path say nothing about a live session; report
/// the virtual-clock waits instead (the endpointer's input is never queued
/// in real time).
pub(crate) fn with_virtual_waits(
    mut stages: Vec<StageReport>,
    turns: &[TurnReport],
    topology: &Topology,
) -> Vec<StageReport> {
    let (path, _) = path(topology);
    let endpointer = topology
        .latency_terms()
        .into_iter()
        .find(|t| t.part == TermPart::Endpoint)
        .map(|t| t.stage);
    for s in &mut stages {
        if endpointer.as_ref().is_some_and(|e| *e == s.name) {
            s.queue_wait_ms = Percentiles::of(&vec![0.0; s.items]);
            s.queue_max_depth = 0;
            continue;
        }
        let Some(p) = path.iter().find(|p| p.name == s.name) else {
            continue;
        };
        // (arrival, start) of every item on the virtual clock
        let items: Vec<(f64, f64)> = turns
            .iter()
            .filter_map(|t| {
                let start = t.timeline.stages.get(&p.name)?[0];
                Some((start - t.terms_ms.get(&p.queue)?, start))
            })
            .collect();
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
    use voxline_pipeline::topology::{self, AudioEdge};

    fn standard() -> Topology {
        topology::standard(AudioEdge::Replay, 4)
    }

    /// Simulates on the standard pipeline, the LLM streaming each turn's
    /// tokens, and finishes the turns (the engines' named terms).
    fn run(jobs: &mut [SimJob], cores: SimCores, turns: &mut [TurnReport]) -> f64 {
        for j in jobs.iter_mut() {
            if let (Some(llm), Some(t)) = (j.steps.get_mut(1), turns.get(j.turn)) {
                llm.outputs = t.llm_streamed_tokens as u32;
            }
        }
        let end = simulate(jobs, cores, turns, &standard());
        for t in turns.iter_mut() {
            crate::finish_turn(t, &standard());
        }
        end
    }

    /// Where `stage` ran for turn `t`, on the virtual clock.
    fn span_of(t: &TurnReport, stage: &str) -> Option<[f64; 2]> {
        t.timeline.stages.get(stage).copied()
    }

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
            steps: vec![
                SimStep {
                    busy: stt.0,
                    to_output: Some(stt.1),
                    outputs: 1,
                },
                SimStep {
                    busy: llm.0,
                    to_output: Some(llm.1),
                    outputs: 1,
                },
            ],
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
        let (mut jobs, mut turns) = two_turns();
        let end = run(&mut jobs, SimCores::Split, &mut turns);
        assert_eq!(end, 2100.0);
        let (a, b) = (&turns[0], &turns[1]);
        assert_eq!(span_of(a, "stt"), Some([1000.0, 1500.0]));
        assert_eq!(span_of(a, "llm"), Some([1500.0, 1900.0]));
        assert_eq!(a.timeline.first_token_ms, Some(1600.0));
        assert_eq!(a.stt_queue_ms, Some(0.0));
        assert_eq!(a.llm_queue_ms, Some(0.0));
        assert_eq!(a.llm_ttft_ms, Some(100.0));
        assert_eq!(a.response_latency_ms, Some(1300.0));
        assert_eq!(a.processing_ms, Some(600.0));
        assert_eq!(a.commit_wait_ms, None, "not speculative");
        // turn 1 waits for the STT, then for the LLM still answering turn 0
        assert_eq!(span_of(b, "stt"), Some([1500.0, 1800.0]));
        assert_eq!(b.stt_queue_ms, Some(300.0));
        assert_eq!(b.stt_ms, Some(300.0));
        assert_eq!(span_of(b, "llm"), Some([1900.0, 2100.0]));
        assert_eq!(b.llm_queue_ms, Some(100.0));
        assert_eq!(b.llm_ms, Some(200.0));
        assert_eq!(b.llm_ttft_ms, Some(150.0));
        assert_eq!(b.response_latency_ms, Some(1450.0));
    }

    #[test]
    fn shared_cores_are_one_server_taking_the_job_that_asked_first() {
        let (mut jobs, mut turns) = two_turns();
        let end = run(&mut jobs, SimCores::Shared, &mut turns);
        assert_eq!(end, 2400.0);
        // turn 1's STT asked (1200) before turn 0's LLM (1500): it goes first
        assert_eq!(span_of(&turns[1], "stt"), Some([1500.0, 1800.0]));
        assert_eq!(span_of(&turns[0], "llm"), Some([1800.0, 2200.0]));
        assert_eq!(turns[0].llm_queue_ms, Some(300.0));
        assert_eq!(turns[0].response_latency_ms, Some(1600.0));
        assert_eq!(span_of(&turns[1], "llm"), Some([2200.0, 2400.0]));
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
        let (mut jobs, mut turns) = long_answer();
        let end = run(&mut jobs, SimCores::Priority, &mut turns);
        // turn 0: first token at 1700, a token at 1900, then turn 1's STT
        // (1900–2200) and its LLM (2200–2300), then the last 3 tokens
        assert_eq!(turns[0].timeline.first_token_ms, Some(1700.0));
        assert_eq!(span_of(&turns[1], "stt"), Some([1900.0, 2200.0]));
        assert_eq!(turns[1].stt_queue_ms, Some(0.0));
        assert_eq!(span_of(&turns[1], "llm"), Some([2200.0, 2300.0]));
        assert_eq!(turns[1].response_latency_ms, Some(2250.0 - 1200.0));
        assert_eq!(span_of(&turns[0], "llm"), Some([1500.0, 2900.0]));
        assert_eq!(turns[0].llm_ms, Some(1400.0));
        assert_eq!(end, 2900.0);

        // shared cores: turn 1's STT waits for the whole answer
        let (mut jobs, mut turns) = long_answer();
        let end = run(&mut jobs, SimCores::Shared, &mut turns);
        assert_eq!(span_of(&turns[0], "llm"), Some([1500.0, 2500.0]));
        assert_eq!(span_of(&turns[1], "stt"), Some([2500.0, 2800.0]));
        assert_eq!(turns[1].stt_queue_ms, Some(600.0));
        assert_eq!(end, 2900.0);
    }

    #[test]
    fn a_speculative_answer_is_shown_at_its_commit() {
        let mut j = job(0, 1000.0, (300.0, 300.0), (200.0, 100.0));
        j.commit = 2000.0;
        j.speculative = true;
        let mut turns = vec![turn(900.0, 3)];
        let end = run(&mut [j], SimCores::Split, &mut turns);
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
        j.steps[0].to_output = None;
        let mut turns = vec![turn(900.0, 0)];
        let end = run(&mut [j], SimCores::Split, &mut turns);
        assert_eq!(end, 1040.0);
        assert_eq!(span_of(&turns[0], "stt"), Some([1000.0, 1040.0]));
        assert_eq!(turns[0].stt_ms, None);
        assert_eq!(span_of(&turns[0], "llm"), None);
        assert_eq!(turns[0].response_latency_ms, None);
    }

    #[test]
    fn cores_follow_the_lease_and_the_policy() {
        use voxline_pipeline::settings::CpuShare;
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
        let (mut jobs, mut turns) = two_turns();
        run(&mut jobs, SimCores::Split, &mut turns);
        turns[0].timeline.closed_ms = 1000.0;
        turns[1].timeline.closed_ms = 1200.0;
        let stages = vec![
            stage("vad", 3),
            stage("stt", 2),
            stage("upper", 2),
            stage("llm", 2),
        ];
        let stages = with_virtual_waits(stages, &turns, &standard());
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
        // sent at 1000 ms, committed at 1500 ms, long after its STT started
        let mut j = job(0, 1000.0, (300.0, 300.0), (200.0, 100.0));
        j.commit = 1500.0;
        j.speculative = true;
        let mut turns = vec![turn(900.0, 3)];
        turns[0].timeline.closed_ms = 1500.0;
        run(&mut [j], SimCores::Split, &mut turns);
        let stages = with_virtual_waits(vec![stage("stt", 1)], &turns, &standard());
        let q = stages[0].queue_wait_ms.unwrap();
        // no wait, and never negative
        assert!(q.n == 1 && q.max < 0.01, "{q:?}");
        assert_eq!(turns[0].stt_queue_ms, Some(0.0));
    }

    #[test]
    fn an_added_stage_is_one_more_server_on_the_path() {
        let upper = voxline_core::StageId::new("upper");
        let with_upper = standard()
            .edge(
                topology::edge_into(&upper),
                4,
                voxline_core::FullPolicy::Block,
            )
            .insert_after(&topology::STT, upper.clone(), topology::edge_into(&upper));
        let step = |busy: f64, out: f64| SimStep {
            busy,
            to_output: Some(out),
            outputs: 1,
        };
        let jobs = |ready: f64, turn: usize| SimJob {
            turn,
            ready,
            commit: ready,
            speculative: false,
            steps: vec![step(300.0, 300.0), step(50.0, 50.0), step(200.0, 100.0)],
        };
        let mut turns = vec![turn(900.0, 1), turn(1000.0, 1)];
        let end = simulate(
            &[jobs(1000.0, 0), jobs(1100.0, 1)],
            SimCores::Split,
            &mut turns,
            &with_upper,
        );
        let t = &turns[1];
        // turn 1 waits 200 ms for the STT, then for `upper` (free at 1350)
        assert_eq!(span_of(t, "stt"), Some([1300.0, 1600.0]));
        assert_eq!(span_of(t, "upper"), Some([1600.0, 1650.0]));
        assert_eq!(span_of(t, "llm"), Some([1650.0, 1850.0]));
        let declared = with_upper.latency_terms();
        let terms: Vec<(&str, f64)> = declared
            .iter()
            .filter_map(|x| Some((x.name.as_str(), *t.terms_ms.get(&x.name)?)))
            .collect();
        assert_eq!(
            terms,
            [
                ("stt_queue", 200.0),
                ("stt", 300.0),
                ("upper_queue", 0.0),
                ("upper", 50.0),
                ("llm_queue", 0.0),
                ("llm_first_token", 100.0),
                ("commit_wait", 0.0)
            ]
        );
        // the terms from the utterance sent add up to the response
        let sum: f64 = terms.iter().map(|(_, v)| v).sum();
        assert_eq!(t.response_latency_ms, Some(1100.0 - 1000.0 + sum));
        assert_eq!(end, 1850.0);
        // shared cores: one server for all three
        let mut turns = vec![turn(900.0, 1), turn(1000.0, 1)];
        let end = simulate(
            &[jobs(1000.0, 0), jobs(1100.0, 1)],
            SimCores::Shared,
            &mut turns,
            &with_upper,
        );
        assert_eq!(end, 1000.0 + 2.0 * (300.0 + 50.0 + 200.0));
    }
}
