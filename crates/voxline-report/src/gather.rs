//! Gathering: one utterance's events and spans, collected by id, made into
//! its turn report (the sidecar's truth, the transcript, the answer and its
//! tokens; the latency terms on the report's clock, see [`super::clocks`]).

use std::collections::BTreeMap;
use std::time::Instant;

use voxline_core::{Clock, PipelineEvent, Span, TimedEvent, Topology, Transcript, UtteranceInfo};
use voxline_llm::{Token, TurnComplete};
use voxline_tts::{VoiceAudio, VoiceDone, VoiceEnded, VoiceInterrupted, VoicePlayed, VoiceResumed};

use super::clocks;
use super::schema::{StageWork, TurnReport};
use super::simulate::SimJob;
use crate::stats::Percentiles;
use voxline_pipeline::pipeline::Pace;

/// `a` → `b` in ms, negative when `b` is earlier.
pub(crate) fn ms(a: Instant, b: Instant) -> f64 {
    if b >= a {
        (b - a).as_secs_f64() * 1000.0
    } else {
        -((a - b).as_secs_f64() * 1000.0)
    }
}

/// One utterance's events and spans, gathered for its turn report.
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    /// The utterance, and when it was sent downstream.
    utt: Option<(UtteranceInfo, Instant)>,
    /// The transcript, and when it was ready.
    pub(super) transcript: Option<(Transcript, Instant)>,
    /// When each token was streamed.
    pub(super) tokens: Vec<Instant>,
    /// The answer.
    done: Option<TurnComplete>,
    /// The first error, as `stage: message`.
    error: Option<String>,
    /// The attempt's commit: (sent at, confirmed at) stream positions, and when.
    pub(super) commit: Option<(u64, u64, Instant)>,
    /// Every stage's calls for the turn, by stage.
    pub(super) calls: BTreeMap<String, Calls>,
    /// When the first block of the spoken answer was sent.
    voice_first: Option<Instant>,
    /// The spoken answer's summary.
    voice_done: Option<VoiceDone>,
    /// When its first sample reached the output device (live).
    voice_played: Option<Instant>,
    /// The user spoke over it (barge-in).
    voice_interrupted: Option<VoiceInterrupted>,
    /// Backchannels over it that it played on after.
    voice_resumed: u32,
    /// It played to its end on the output device.
    voice_ended: bool,
    /// Whether the pipeline speaks: the turn ends with its voice.
    pub(crate) speaks: bool,
    /// How the semantic end of turn ended it.
    end_of_turn: Option<voxline_audio::turn::EndOfTurn>,
    /// What a remote language model's server reported.
    server: Option<voxline_llm::ServerCounts>,
}

/// One stage's calls for one turn, merged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Calls {
    /// The first call's start.
    pub(super) start: Instant,
    /// The first output any of them sent.
    pub(super) first_out: Option<Instant>,
    /// The start of the call that sent it, and when that call's input was
    /// sent to the stage.
    pub(super) first_out_start: Option<(Instant, Instant)>,
    /// The last call's end.
    pub(super) end: Instant,
    /// Time they computed, ms.
    pub(super) busy_ms: f64,
    /// Outputs sent.
    pub(super) outputs: u32,
}

impl Gathered {
    /// Gathers a turn of a pipeline that speaks (`speaks`) or not.
    pub(crate) fn for_pipeline(speaks: bool) -> Self {
        Self {
            speaks,
            ..Self::default()
        }
    }

    /// Takes what `ev` says about this utterance (the caller routes by id).
    pub(crate) fn event(&mut self, ev: &TimedEvent) {
        match &ev.event {
            PipelineEvent::Utterance(u) => self.utt = Some((*u, ev.at)),
            PipelineEvent::Transcript(t) => self.transcript = Some((t.clone(), ev.at)),
            PipelineEvent::Engine(e) => {
                if e.downcast_ref::<Token>().is_some() {
                    self.tokens.push(ev.at);
                } else if let Some(c) = e.downcast_ref::<TurnComplete>() {
                    self.done = Some(c.clone());
                } else if e.downcast_ref::<VoiceAudio>().is_some() {
                    self.voice_first.get_or_insert(ev.at);
                } else if let Some(d) = e.downcast_ref::<VoiceDone>() {
                    self.voice_done = Some(d.clone());
                } else if e.downcast_ref::<VoicePlayed>().is_some() {
                    self.voice_played.get_or_insert(ev.at);
                } else if let Some(i) = e.downcast_ref::<VoiceInterrupted>() {
                    self.voice_interrupted = Some(i.clone());
                } else if e.downcast_ref::<VoiceResumed>().is_some() {
                    self.voice_resumed += 1;
                } else if e.downcast_ref::<VoiceEnded>().is_some() {
                    self.voice_ended = true;
                } else if let Some(t) = e.downcast_ref::<voxline_audio::turn::EndOfTurn>() {
                    self.end_of_turn = Some(*t);
                } else if let Some(s) = e.downcast_ref::<voxline_llm::ServerTurn>() {
                    self.server = Some(s.counts.clone());
                }
            }
            PipelineEvent::TurnError(e) => {
                self.error
                    .get_or_insert(format!("{}: {}", e.stage, e.message));
            }
            PipelineEvent::Commit {
                spec_sample,
                sample,
                ..
            } => self.commit = Some((*spec_sample, *sample, ev.at)),
            _ => {}
        }
    }

    /// Takes a process span of this utterance.
    pub(crate) fn span(&mut self, s: &Span) {
        // service time: waits for room downstream or for the cores are not work
        let busy = s.busy().as_secs_f64() * 1000.0;
        let c = self.calls.entry(s.stage.clone()).or_insert(Calls {
            start: s.started,
            first_out: None,
            first_out_start: None,
            end: s.finished,
            busy_ms: 0.0,
            outputs: 0,
        });
        c.start = c.start.min(s.started);
        c.end = c.end.max(s.finished);
        c.busy_ms += busy;
        c.outputs += s.emitted;
        if let Some(b) = s.first_emit {
            if c.first_out.is_none_or(|a| b < a) {
                c.first_out = Some(b);
                c.first_out_start = Some((s.started, s.enqueued));
            }
        }
    }

    /// Whether the turn has ended: answered (and spoken, in a pipeline that
    /// speaks), or failed.
    pub(crate) fn ended(&self) -> bool {
        // on a device, the answer is over once it has played (what is
        // heard over it, a pause and a stop, comes after its synthesis)
        let spoken = self.voice_interrupted.is_some()
            || if self.voice_played.is_some() {
                self.voice_ended
            } else {
                self.voice_done.is_some()
            };
        let answered = self.done.is_some() && (!self.speaks || spoken);
        answered || self.error.is_some()
    }

    /// The calls of `stage` for this turn, if it ran on it.
    pub(super) fn calls(&self, stage: &str) -> Option<&Calls> {
        self.calls.get(stage)
    }

    /// Whether the utterance itself was seen (a cancelled attempt's never is).
    pub(crate) fn has_utterance(&self) -> bool {
        self.utt.is_some()
    }
}

/// What a turn's report is made against besides its own events.
pub(crate) struct TurnContext<'a> {
    /// Turns before this index are warm-up.
    pub warmup: usize,
    /// Where each replayed file sits in the stream (none live).
    pub inputs: &'a [voxline_pipeline::pipeline::InputSpan],
    /// The run's failure, if it failed (a turn it cut short says so).
    pub failed: Option<&'a str>,
    /// Pacing.
    pub pace: Pace,
    /// The session clock.
    pub clock: Clock,
    /// The pipeline's shape: the latency terms it declares.
    pub topology: &'a Topology,
}

/// The report of utterance `id` (turn `n`, from 0), and at fast pace the
/// service times the virtual clock replays for it; `None` when its
/// utterance was never seen (a cancelled attempt). At fast pace the queue
/// waits and latencies are left for [`simulate`](super::simulate::simulate); then [`finish_turn`].
pub(crate) fn turn_report(
    n: usize,
    id: u64,
    g: &Gathered,
    cx: &TurnContext<'_>,
) -> Option<(TurnReport, Option<SimJob>)> {
    let (u, utt_at) = g.utt?;
    let mut t = TurnReport {
        id,
        warmup: n < cx.warmup,
        start_sample: u.start_sample,
        end_sample: u.end_sample,
        closed_sample: u.closed_sample,
        spec_sample: g.commit.map(|(sent, _, _)| sent),
        audio_ms: u.duration_ms(),
        work: g
            .calls
            .iter()
            .map(|(stage, c)| {
                let work = StageWork {
                    start_ms: cx.clock.ms_since_origin(c.start),
                    end_ms: cx.clock.ms_since_origin(c.end),
                    busy_ms: c.busy_ms,
                };
                (stage.clone(), work)
            })
            .collect(),
        ..Default::default()
    };
    // Truth from the sidecar: the spoken turn overlapping this utterance most.
    t.true_end_sample = u.end_sample;
    if let Some(input) = cx
        .inputs
        .iter()
        .find(|i| u.end_sample > i.start && u.start_sample < i.end.max(i.start + 1))
    {
        t.file = Some(input.path.clone());
        if let Some(sc) = &input.sidecar {
            let best = sc
                .turns
                .iter()
                .map(|st| {
                    let (s, e) = (
                        input.start + sc.to_16k(st.start_sample),
                        input.start + sc.to_16k(st.end_sample),
                    );
                    let overlap = e.min(u.end_sample).saturating_sub(s.max(u.start_sample));
                    (overlap, st, e)
                })
                .filter(|(o, _, _)| *o > 0)
                .max_by_key(|(o, _, _)| *o);
            if let Some((_, st, e)) = best {
                t.expected = Some(st.text.clone());
                t.true_end_sample = e;
            }
        }
    }
    t.llm_server = g.server.as_ref().map(|s| crate::schema::ServerTurnReport {
        server: s.server.clone(),
        tokens_from: s.tokens_from,
        prompt_tokens: s.prompt_tokens,
        cached_tokens: s.cached_tokens,
        completion_tokens: s.completion_tokens,
        server_prompt_ms: s.prompt_ms,
        server_decode_ms: s.decode_ms,
        // once the first token's term is known (`finish_turn`)
        network_queue_ms: None,
    });
    t.end_of_turn = g.end_of_turn.map(|e| crate::schema::EndOfTurnReport {
        decision: e.decision.as_str().to_owned(),
        probability: e.probability,
        probes: e.probes,
        cost_ms: e.cost_ms,
        silence_ms: e.silence_ms,
    });
    t.error = g.error.clone().or_else(|| {
        // a turn the failure cut short must not vanish silently
        (g.done.is_none())
            .then(|| cx.failed.map(|f| format!("not finished: {f}")))
            .flatten()
    });
    if let Some((tr, _)) = &g.transcript {
        t.transcript = Some(tr.text.clone());
        t.heard = Some(tr.heard.clone());
        t.stt_tokens = Some(tr.n_tokens);
        if let Some(exp) = &t.expected {
            t.wer = Some(voxline_stt::word_error_rate(exp, &tr.text));
        }
    }
    t.non_speech = g
        .transcript
        .as_ref()
        .is_some_and(|(tr, _)| tr.is_non_speech());
    if let Some(d) = g.done.as_ref().filter(|_| !t.non_speech) {
        t.response = Some(d.response.clone());
        t.llm_prompt_tokens = Some(d.n_prompt_tokens);
        t.llm_prefill_tokens = Some(d.engine.n_prefill_tokens);
        t.llm_generated_tokens = Some(d.n_generated);
        t.stop = Some(d.stop);
        t.llm_history_dropped = Some(d.history_dropped);
    }
    t.llm_streamed_tokens = g.tokens.len();
    if g.tokens.len() >= 2 {
        let span = ms(g.tokens[0], *g.tokens.last().unwrap_or(&g.tokens[0]));
        // a server's own count where it sends one (a chunk may hold several tokens)
        let after_first = match &g.server {
            Some(s) if s.tokens_from == voxline_llm::TokenSource::Usage => {
                f64::from(s.completion_tokens.saturating_sub(1))
            }
            _ => (g.tokens.len() - 1) as f64,
        };
        if span > 0.0 {
            t.llm_decode_tps = Some(after_first / (span / 1000.0));
        }
        let gaps: Vec<f64> = g.tokens.windows(2).map(|w| ms(w[0], w[1])).collect();
        t.inter_token_ms = Percentiles::of(&gaps);
    }

    // The voice: what it said, and how long after the response it began.
    if let Some(d) = &g.voice_done {
        t.voice_chunks = Some(d.chunks);
        t.voice_chars = Some(d.chars);
        t.voice_audio_s = Some(d.audio_s());
    }
    if let Some(i) = &g.voice_interrupted {
        t.barge_in_ms = Some(i.barge_in_ms());
        t.voice_heard = Some(i.heard.clone());
    }
    t.false_interruptions = g.voice_resumed;
    let voice_calls = g.calls(voxline_tts::STAGE_NAME);
    if let Some((start, out)) = voice_calls.and_then(|c| c.first_out_start.zip(c.first_out)) {
        t.tts_first_audio_ms = Some(ms(start.0, out));
    }
    if let Some(c) = voice_calls.filter(|c| c.busy_ms > 0.0) {
        t.tts_rtfx = t.voice_audio_s.map(|a| a / (c.busy_ms / 1000.0));
    }
    if let (Some(first_audio), Some(&first_token)) = (g.voice_first, g.tokens.first()) {
        t.voice_after_shown_ms = match cx.pace {
            // the response is shown when its first token is made, or at the commit if later
            // live, the first sample reaching the device, by the output stream's timestamps
            Pace::Realtime | Pace::Live => {
                let shown = g.commit.map_or(first_token, |(_, _, c)| first_token.max(c));
                Some(ms(shown, g.voice_played.unwrap_or(first_audio)))
            }
            // audio faster than real time queues turns up on the wall clock: what
            // the voice adds is the decoding of its first chunk's text (the first
            // token to the token that completed it) and the chunk's synthesis
            Pace::Fast => voice_calls
                .and_then(|c| c.first_out_start)
                .zip(t.tts_first_audio_ms)
                .map(|((_, sent), synth)| ms(first_token, sent).max(0.0) + synth),
        };
    }

    // The latency terms, on the wall clock or the virtual one.
    let job = match cx.pace {
        Pace::Realtime | Pace::Live => {
            clocks::on_wall_clock(&mut t, g, &u, utt_at, cx.clock, cx.topology);
            None
        }
        Pace::Fast => Some(clocks::on_virtual_clock(&mut t, g, cx.topology)),
    };
    Some((t, job))
}

/// The figures derived from a turn's latencies, once they are final: the
/// engines' terms under their own names, the rates, and the latencies that
/// came out negative dropped.
pub(crate) fn finish_turn(t: &mut TurnReport, topology: &Topology) {
    use voxline_core::TermPart;
    use voxline_pipeline::topology::{LLM, STT};
    let term = |stage: &voxline_core::StageId, part: TermPart| {
        topology
            .latency_terms()
            .into_iter()
            .find(|x| &x.stage == stage && x.part == part)
            .and_then(|x| t.terms_ms.get(&x.name).copied())
    };
    t.stt_queue_ms = term(&STT, TermPart::Queue);
    t.stt_ms = term(&STT, TermPart::Service);
    t.llm_queue_ms = term(&LLM, TermPart::Queue);
    t.llm_first_token_ms = term(&LLM, TermPart::FirstOutput);
    t.llm_ttft_ms = t.llm_queue_ms.zip(t.llm_first_token_ms).map(|(q, f)| q + f);
    t.llm_ms = t.timeline.stages.get(LLM.as_str()).map(|[a, b]| b - a);
    if let Some(s) = &mut t.llm_server {
        s.network_queue_ms = t
            .llm_first_token_ms
            .zip(s.server_prompt_ms)
            .map(|(first, prompt)| (first - prompt).max(0.0));
    }
    drop_negative_latencies(t);
    // on either clock: the response latency, then what the voice added after it
    t.voice_latency_ms = t
        .response_latency_ms
        .zip(t.voice_after_shown_ms)
        .map(|(r, v)| r + v.max(0.0));
    if let Some(s) = t.stt_ms.filter(|s| *s > 0.0) {
        t.stt_rtfx = Some(t.audio_ms / s);
        t.stt_tps = t.stt_tokens.map(|n| f64::from(n) / (s / 1000.0));
    }
    if let (Some(first), Some(n)) = (
        t.llm_first_token_ms.filter(|f| *f > 0.0),
        t.llm_prefill_tokens,
    ) {
        t.llm_prefill_tps = Some(f64::from(n) / (first / 1000.0));
    }
}

/// A latency is a duration: one that comes out negative measures a wrong
/// marker (a recorded end of speech after the utterance closed or the answer
/// began — e.g. a turn the VAD split), not the pipeline. Such a turn keeps
/// its other figures; its endpoint delay and response latency are left out
/// (so they count in no percentile and no budget) and a note says why.
fn drop_negative_latencies(t: &mut TurnReport) {
    let negative = [
        ("endpoint delay", t.endpoint_delay_ms),
        ("response latency", t.response_latency_ms),
    ]
    .into_iter()
    .filter_map(|(name, v)| v.filter(|v| *v < 0.0).map(|v| format!("{name} {v:.0} ms")))
    .collect::<Vec<_>>();
    if negative.is_empty() {
        return;
    }
    t.endpoint_delay_ms = None;
    t.response_latency_ms = None;
    t.note = Some(format!(
        "endpoint delay and response latency left out: {} came out negative, so the end of speech recorded for this turn (sample {}) is after the utterance closed (sample {})",
        negative.join(" and "),
        t.true_end_sample,
        t.closed_sample
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture;

    fn standard() -> Topology {
        voxline_pipeline::topology::standard(voxline_pipeline::topology::AudioEdge::Replay, 4)
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-6)
    }

    #[test]
    fn a_turn_takes_its_truth_from_the_sidecar_turn_it_overlaps_most() {
        let run = fixture::run(Pace::Realtime, voxline_pipeline::settings::CpuShare::Split);
        let cx = fixture::context(&run);
        let (t, job) = turn_report(0, 1, &fixture::gathered(&run, 1), &cx).unwrap();
        assert!(job.is_none(), "the wall clock needs no simulation");
        assert!(t.warmup, "turn 0 of 1 warm-up turn");
        assert_eq!(t.file.as_deref(), Some(std::path::Path::new("two.wav")));
        assert_eq!(t.expected.as_deref(), Some("hello there"));
        assert_eq!(t.transcript.as_deref(), Some("hello there"));
        assert_eq!(t.wer, Some(0.0));
        // the VAD ended it at 16 500, the sidecar at 16 000
        assert_eq!((t.end_sample, t.true_end_sample), (16_500, 16_000));
        assert_eq!(t.response.as_deref(), Some("Hi! How are you?"));
        assert_eq!(t.llm_streamed_tokens, 4);
        assert_eq!(t.llm_generated_tokens, Some(5));
        assert_eq!(t.llm_prefill_tokens, Some(20));
        assert_eq!(t.stt_tokens, Some(3));
        // 3 gaps of 50 ms
        assert!(close(t.llm_decode_tps, 20.0));
        let gaps = t.inter_token_ms.unwrap();
        assert_eq!((gaps.n, gaps.mean), (3, 50.0));

        let (t, _) = turn_report(1, 3, &fixture::gathered(&run, 3), &cx).unwrap();
        assert!(!t.warmup);
        assert_eq!(t.expected.as_deref(), Some("what time is it"));
        assert_eq!(t.spec_sample, Some(52_000));
        assert_eq!(t.true_end_sample, 48_000);
    }

    #[test]
    fn a_turn_no_sidecar_turn_overlaps_keeps_the_vads_end_and_its_error() {
        let run = fixture::run(Pace::Realtime, voxline_pipeline::settings::CpuShare::Split);
        let cx = fixture::context(&run);
        let (t, _) = turn_report(2, 4, &fixture::gathered(&run, 4), &cx).unwrap();
        assert_eq!(t.expected, None);
        assert_eq!(t.wer, None);
        assert_eq!(t.true_end_sample, t.end_sample);
        assert_eq!(t.error.as_deref(), Some("stt: whisper failed"));
        assert_eq!(t.response, None);
        assert_eq!(t.stt_ms, None, "no transcript, no STT latency");
    }

    #[test]
    fn a_turn_a_failure_cut_short_says_so_and_a_cancelled_attempt_is_no_turn() {
        let mut run = fixture::run(Pace::Realtime, voxline_pipeline::settings::CpuShare::Split);
        run.outcome.failed = Some("llm: panicked".into());
        // turn 3's answer never came
        run.events
            .retain(|e| e.event.engine::<TurnComplete>().is_none_or(|c| c.id != 3));
        let cx = fixture::context(&run);
        let (t, _) = turn_report(1, 3, &fixture::gathered(&run, 3), &cx).unwrap();
        assert_eq!(t.error.as_deref(), Some("not finished: llm: panicked"));
        let (t, _) = turn_report(0, 1, &fixture::gathered(&run, 1), &cx).unwrap();
        assert_eq!(t.error, None, "an answered turn is not cut short");

        let cancelled = fixture::gathered(&run, 2);
        assert!(!cancelled.has_utterance());
        assert!(turn_report(1, 2, &cancelled, &cx).is_none());
    }

    #[test]
    fn a_stage_s_work_on_a_turn_spans_its_calls() {
        let run = fixture::run(Pace::Realtime, voxline_pipeline::settings::CpuShare::Split);
        let o = run.clock.origin();
        let mut g = fixture::gathered(&run, 1);
        assert!(g.ended());
        g.span(&fixture::span(
            o,
            fixture::UPPER,
            Some(1),
            [2600, 2600, 2603],
            None,
        ));
        let (t, _) = turn_report(0, 1, &g, &fixture::context(&run)).unwrap();
        let upper = t.work[fixture::UPPER];
        assert_eq!((upper.start_ms, upper.busy_ms), (2500.0, 8.0));
        assert!((upper.end_ms - 2603.0).abs() < 1e-6, "{upper:?}");
        assert_eq!(t.work.get("stt").map(|w| w.busy_ms), Some(790.0));
        // the first output of either call
        let c = g.calls(fixture::UPPER).unwrap();
        assert_eq!((c.outputs, c.first_out), (2, Some(fixture::at(o, 2505))));
    }

    #[test]
    fn finishing_a_turn_derives_its_rates() {
        let mut t = TurnReport {
            audio_ms: 1000.0,
            terms_ms: [
                ("stt", 500.0),
                ("llm_queue", 5.0),
                ("llm_first_token", 200.0),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            stt_tokens: Some(5),
            llm_prefill_tokens: Some(20),
            endpoint_delay_ms: Some(700.0),
            response_latency_ms: Some(1500.0),
            ..TurnReport::default()
        };
        t.timeline.stages.insert("llm".into(), [100.0, 600.0]);
        finish_turn(&mut t, &standard());
        // the engines' terms under their own names
        assert_eq!(
            (
                t.stt_queue_ms,
                t.stt_ms,
                t.llm_queue_ms,
                t.llm_first_token_ms
            ),
            (None, Some(500.0), Some(5.0), Some(200.0))
        );
        assert_eq!((t.llm_ttft_ms, t.llm_ms), (Some(205.0), Some(500.0)));
        assert_eq!(t.stt_rtfx, Some(2.0));
        assert_eq!(t.stt_tps, Some(10.0));
        assert_eq!(t.llm_prefill_tps, Some(100.0));
        assert_eq!(t.note, None);
        assert_eq!(t.response_latency_ms, Some(1500.0));
    }

    #[test]
    fn a_negative_latency_is_left_out_with_a_note() {
        let mut t = TurnReport {
            endpoint_delay_ms: Some(-50.0),
            response_latency_ms: Some(400.0),
            true_end_sample: 20_000,
            closed_sample: 19_200,
            terms_ms: [("stt".to_string(), 0.0)].into(),
            ..TurnReport::default()
        };
        finish_turn(&mut t, &standard());
        assert_eq!(t.endpoint_delay_ms, None);
        assert_eq!(t.response_latency_ms, None);
        assert_eq!(
            t.note.as_deref(),
            Some("endpoint delay and response latency left out: endpoint delay -50 ms came out negative, so the end of speech recorded for this turn (sample 20000) is after the utterance closed (sample 19200)")
        );
        assert_eq!(t.stt_rtfx, None, "no rate from a zero time");
    }

    #[test]
    fn what_was_heard_is_read_from_its_type_not_its_text() {
        let run = fixture::run(
            voxline_pipeline::pipeline::Pace::Fast,
            voxline_pipeline::settings::CpuShare::Split,
        );
        let cx = fixture::context(&run);
        let mut g = fixture::gathered(&run, 1);
        let (words, _) = turn_report(1, 1, &g, &cx).unwrap();
        assert_eq!(words.heard, Some(voxline_core::Heard::Words));
        assert!(!words.is_echo() && !words.non_speech);
        // the same words judged the voice's echo: no turn, counted as echo
        let heard = voxline_core::Heard::Echo {
            likeness: Some(0.91),
            by_words: false,
        };
        g.transcript.as_mut().unwrap().0.heard = heard.clone();
        let (echo, _) = turn_report(1, 1, &g, &cx).unwrap();
        assert!(echo.is_echo() && echo.non_speech, "{echo:?}");
        let v = serde_json::to_value(&echo).unwrap();
        assert_eq!(v["heard"]["kind"], "echo");
        assert_eq!(v["heard"]["by_words"], false);
        // an annotation in the words alone is not what decides
        g.transcript.as_mut().unwrap().0.heard = voxline_core::Heard::Backchannel;
        g.transcript.as_mut().unwrap().0.text = "[echo: uh-huh]".into();
        let (back, _) = turn_report(1, 1, &g, &cx).unwrap();
        assert!(!back.is_echo() && back.non_speech);
    }
}
