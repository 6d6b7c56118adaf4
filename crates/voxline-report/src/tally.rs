//! A live session's report, kept in bounded memory.
//!
//! A replay ends, so its report is gathered from every span and event at
//! the end ([`crate::build`]). A live session may run for weeks:
//! there is a span per audio frame and a handful of events per turn, so
//! keeping them grows without bound (~150 bytes per VAD frame, ~15 MB per
//! hour of listening). [`Tally`] takes them as they happen instead and
//! keeps only
//!
//! - per-stage totals (items, busy time, a histogram of queue waits),
//! - per-metric histograms of the turns' figures ([`Series`]: the same
//!   percentiles as over the values themselves, in constant memory),
//! - the turns still in flight, and the last [`TURNS_KEPT`] turns' detail.
//!
//! A turn is reported when its last event (its answer or its error) has been
//! seen and [`GRACE`] has passed, so the spans its stages record just after
//! their last message are in; what is still open at the end is reported
//! then. The report has the replay report's schema; its `turns[]` holds the
//! last [`TURNS_KEPT`] turns, while the summary and the stages count them
//! all.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use voxline_core::{Clock, PipelineEvent, Span, SpanKind, TimedEvent, Topology, UtteranceId};

use crate::stats::Series;
use crate::{
    finish_turn, turn_report, ColdStart, Gathered, Report, RunConfig, SpecSummary, StageTotals,
    Summary, TermTotals, Thrown, TokenTotals, TurnContext, TurnReport,
};
use voxline_pipeline::pipeline::{Observer, Pace, RunResult};

/// Turns whose detail a live report keeps (the latest ones).
pub const TURNS_KEPT: usize = 1000;

/// How long after a turn's last event its spans may still arrive.
pub const GRACE: Duration = Duration::from_secs(5);

/// Turns in flight at most (a queue holds 16 of each kind); beyond this the
/// oldest open ones are reported as they stand, so a turn that never ends
/// cannot hold memory.
const OPEN_MAX: usize = 256;

/// How many cancelled or reported ids are remembered, for spans that come
/// late.
const REMEMBERED: usize = 1024;

/// A bounded set of recent ids.
#[derive(Debug, Default)]
struct Recent {
    set: HashSet<UtteranceId>,
    order: VecDeque<UtteranceId>,
}

impl Recent {
    fn insert(&mut self, id: UtteranceId) {
        if self.set.insert(id) {
            self.order.push_back(id);
            while self.order.len() > REMEMBERED {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    fn contains(&self, id: UtteranceId) -> bool {
        self.set.contains(&id)
    }
}

/// The summary's per-turn figures, as histograms.
#[derive(Debug, Default)]
struct TurnSeries {
    response: Series,
    processing: Series,
    endpoint: Series,
    terms: BTreeMap<String, Series>,
    stt: Series,
    stt_rtfx: Series,
    ttft: Series,
    decode_tps: Series,
    prefill_tps: Series,
    voice: Series,
    tts_first_audio: Series,
    tts_rtfx: Series,
    barge_in: Series,
    /// The end-of-turn model's time per pause judged (each turn's mean).
    turn_model: Series,
}

/// A live session's measurements, taken as they happen; see the module
/// documentation.
#[derive(Debug)]
pub struct Tally {
    clock: Clock,
    topology: Topology,
    /// The stages on the response's path: the only spans a turn keeps
    /// (not the VAD's per frame, nor the sink's per token).
    path: Vec<String>,
    /// Whether the pipeline speaks (a turn ends with its voice).
    speaks: bool,
    warmup: usize,
    keep: usize,
    open: BTreeMap<UtteranceId, Gathered>,
    /// Work of open turns per stage, for the case they are cancelled.
    open_busy: BTreeMap<UtteranceId, BTreeMap<String, Thrown>>,
    /// Turns whose last event was seen, and when.
    ended: VecDeque<(UtteranceId, Instant)>,
    cancelled: Recent,
    reported: Recent,
    /// Turns reported so far (the warm-up counts the first ones).
    reported_n: usize,
    turns: VecDeque<TurnReport>,
    summary: Summary,
    series: TurnSeries,
    wer: (f64, usize),
    first_latency: Option<Option<f64>>,
    terms: TermTotals,
    tokens: TokenTotals,
    stages: Vec<StageTotals>,
    spec: SpecSummary,
}

impl Tally {
    /// An empty tally on `clock` of a pipeline shaped as `topology`; the
    /// first `warmup` turns are left out of the summary's figures.
    #[must_use]
    pub fn new(clock: Clock, topology: Topology, warmup: usize) -> Self {
        Self::keeping(clock, topology, warmup, TURNS_KEPT)
    }

    /// A tally for a live session about to run: the run gives it its clock
    /// and topology when it starts ([`Observer::start`]).
    #[must_use]
    pub fn for_session(warmup: usize) -> Self {
        Self::new(Clock::start(), Topology::new(), warmup)
    }

    /// As [`Tally::new`], keeping the detail of the last `keep` turns.
    #[must_use]
    pub fn keeping(clock: Clock, topology: Topology, warmup: usize, keep: usize) -> Self {
        Self {
            clock,
            path: on_path(&topology),
            topology,
            warmup,
            keep,
            open: BTreeMap::new(),
            open_busy: BTreeMap::new(),
            ended: VecDeque::new(),
            cancelled: Recent::default(),
            reported: Recent::default(),
            reported_n: 0,
            turns: VecDeque::new(),
            summary: Summary::default(),
            series: TurnSeries::default(),
            speaks: false,
            wer: (0.0, 0),
            first_latency: None,
            terms: TermTotals::default(),
            tokens: TokenTotals::default(),
            stages: Vec::new(),
            spec: SpecSummary::default(),
        }
    }

    /// Takes one span (from a stage thread).
    pub fn span(&mut self, s: &Span) {
        StageTotals::add_to(&mut self.stages, s);
        let Some(id) = s.utterance else { return };
        let mut thrown = Thrown::default();
        thrown.add(s);
        if self.cancelled.contains(id) {
            self.spec.throw_away(&s.stage, thrown);
            return;
        }
        if self.reported.contains(id) {
            return;
        }
        (self.open_busy.entry(id).or_default())
            .entry(s.stage.clone())
            .or_default()
            .merge(thrown);
        // a turn keeps one merged record per stage on the path
        if s.kind == SpanKind::Process && self.path.contains(&s.stage) {
            let speaks = self.speaks;
            (self.open.entry(id))
                .or_insert_with(|| Gathered::for_pipeline(speaks))
                .span(s);
        }
        self.bound_open();
    }

    /// Takes one event, as the sinks see it (after the speculation gate).
    pub fn event(&mut self, ev: &TimedEvent) {
        let now = Instant::now();
        match &ev.event {
            PipelineEvent::SpecStart { .. } => self.spec.started += 1,
            PipelineEvent::SpecCancel { id, .. } | PipelineEvent::Merged { id, .. } => {
                if let PipelineEvent::Merged { .. } = ev.event {
                    // taken back: no turn, its work thrown away as a cancel's
                    let acc = self
                        .summary
                        .end_of_turn
                        .get_or_insert_with(Default::default);
                    acc.merged += 1;
                } else {
                    self.spec.cancelled += 1;
                }
                self.cancelled.insert(*id);
                self.open.remove(id);
                for (stage, thrown) in self.open_busy.remove(id).unwrap_or_default() {
                    self.spec.throw_away(&stage, thrown);
                }
            }
            PipelineEvent::Commit { id, .. } => {
                self.spec.committed += 1;
                self.turn_event(*id, ev, now);
            }
            PipelineEvent::Utterance(_)
            | PipelineEvent::Transcript(_)
            | PipelineEvent::Engine(_)
            | PipelineEvent::TurnError(_) => {
                if let Some(id) = ev.event.utterance_id() {
                    self.turn_event(id, ev, now);
                }
            }
            _ => {}
        }
        while let Some(&(id, at)) = self.ended.front() {
            if now.saturating_duration_since(at) < GRACE {
                break;
            }
            self.ended.pop_front();
            self.report_turn(id, None);
        }
        self.bound_open();
    }

    fn turn_event(&mut self, id: UtteranceId, ev: &TimedEvent, now: Instant) {
        if self.reported.contains(id) {
            self.late_voice_event(id, ev);
            return;
        }
        if self.cancelled.contains(id) {
            return;
        }
        let speaks = self.speaks;
        let g = self
            .open
            .entry(id)
            .or_insert_with(|| Gathered::for_pipeline(speaks));
        let was_ended = g.ended();
        g.event(ev);
        if !was_ended && g.ended() {
            self.ended.push_back((id, now));
        }
    }

    /// Reports the oldest open turns while too many are open.
    fn bound_open(&mut self) {
        while self.open.len() > OPEN_MAX {
            let Some(&id) = self.open.keys().next() else {
                break;
            };
            self.report_turn(id, None);
        }
        // busy time of ids only spans have named (no event yet)
        while self.open_busy.len() > OPEN_MAX {
            let Some(&id) = self.open_busy.keys().next() else {
                break;
            };
            self.open_busy.remove(&id);
        }
    }

    /// What is heard over an answer can come after its turn was reported
    /// (its voice still playing, with no event to say when it ends): a
    /// barge-in or a false interruption still counts, in the totals and the
    /// kept detail.
    fn late_voice_event(&mut self, id: UtteranceId, ev: &TimedEvent) {
        let PipelineEvent::Engine(e) = &ev.event else {
            return;
        };
        let kept = self.turns.iter_mut().find(|t| t.id == id);
        if let Some(i) = e.downcast_ref::<voxline_tts::VoiceInterrupted>() {
            if !kept.as_ref().is_some_and(|t| t.warmup) {
                self.series.barge_in.record(i.barge_in_ms());
            }
            if let Some(t) = kept {
                t.barge_in_ms = Some(i.barge_in_ms());
                t.voice_heard = Some(i.heard.clone());
            }
        } else if e.downcast_ref::<voxline_tts::VoiceResumed>().is_some() {
            self.summary.false_interruptions += 1;
            if let Some(t) = kept {
                t.false_interruptions += 1;
            }
        }
    }

    /// Moves turn `id` from the open ones into the totals and the kept detail.
    fn report_turn(&mut self, id: UtteranceId, failed: Option<&str>) {
        self.open_busy.remove(&id);
        let Some(g) = self.open.remove(&id) else {
            return;
        };
        self.reported.insert(id);
        if !g.has_utterance() {
            return;
        }
        let cx = TurnContext {
            warmup: self.warmup,
            inputs: &[],
            failed,
            pace: Pace::Realtime,
            clock: self.clock,
            topology: &self.topology,
        };
        let Some((mut t, _)) = turn_report(self.reported_n, id, &g, &cx) else {
            return;
        };
        self.reported_n += 1;
        finish_turn(&mut t, &self.topology);
        self.count(t);
    }

    /// Adds a reported turn to the summary and keeps its detail.
    fn count(&mut self, t: TurnReport) {
        let s = &mut self.summary;
        s.false_interruptions += t.false_interruptions;
        // a turn of no words (a sound, a backchannel over the voice) is
        // kept in the detail but, as in a whole-run report, not counted
        s.non_speech += usize::from(t.non_speech);
        s.echoes += usize::from(t.is_echo());
        s.turns += usize::from(!t.non_speech);
        s.completed += usize::from(t.response.is_some());
        s.errors += usize::from(t.error.is_some());
        s.warmup_turns += usize::from(t.warmup);
        if !t.non_speech {
            self.first_latency.get_or_insert(t.response_latency_ms);
            self.tokens.add(&t);
        }
        if !t.warmup && !t.non_speech {
            let v = &mut self.series;
            for (series, value) in [
                (&mut v.response, t.response_latency_ms),
                (&mut v.processing, t.processing_ms),
                (&mut v.endpoint, t.endpoint_delay_ms),
                (&mut v.stt, t.stt_ms),
                (&mut v.stt_rtfx, t.stt_rtfx),
                (&mut v.ttft, t.llm_ttft_ms),
                (&mut v.decode_tps, t.llm_decode_tps),
                (&mut v.prefill_tps, t.llm_prefill_tps),
                (&mut v.voice, t.voice_latency_ms),
                (&mut v.tts_first_audio, t.tts_first_audio_ms),
                (&mut v.tts_rtfx, t.tts_rtfx),
                (&mut v.barge_in, t.barge_in_ms),
            ] {
                if let Some(x) = value {
                    series.record(x);
                }
            }
            for (name, ms) in &t.terms_ms {
                v.terms.entry(name.clone()).or_default().record(*ms);
            }
            if let Some(e) = &t.end_of_turn {
                let acc = s.end_of_turn.get_or_insert_with(Default::default);
                if let Some(per_probe) = acc.add(e) {
                    v.turn_model.record(per_probe);
                }
            }
            if let Some(w) = t.wer {
                self.wer.0 += w;
                self.wer.1 += 1;
            }
            self.terms.add(&t, &self.topology);
        }
        self.turns.push_back(t);
        while self.turns.len() > self.keep {
            self.turns.pop_front();
        }
    }

    /// Reports every turn still open (at the end of the session, once every
    /// stage has finished); a turn the failure cut short says so.
    pub fn close(&mut self, failed: Option<&str>) {
        self.ended.clear();
        while let Some(&id) = self.open.keys().next() {
            self.report_turn(id, failed);
        }
    }

    /// Turns in flight, not reported yet.
    #[must_use]
    pub fn open_turns(&self) -> usize {
        self.open.len()
    }

    /// The report of the session `run` (whose tally this is, closed), in
    /// the replay report's schema.
    #[must_use]
    pub fn report(
        &self,
        run: &RunResult,
        config: RunConfig,
        model_load_ms: f64,
        budget: Option<&crate::budget::Budget>,
    ) -> Report {
        let session_ms = self.clock.ms_since_origin(run.outcome.finished);
        let audio_ms = Clock::samples_to_ms(run.audio_samples);
        let mut totals = self.stages.clone();
        crate::in_flow_order(&mut totals, &run.topology);
        let stages: Vec<_> = totals
            .iter()
            .map(|st| {
                crate::stage_report(
                    st,
                    &self.tokens,
                    &run.outcome.edges,
                    &run.topology,
                    session_ms,
                )
            })
            .collect();
        let v = &self.series;
        let mut summary = Summary {
            audio_s: audio_ms / 1000.0,
            session_s: session_ms / 1000.0,
            response_latency_ms: v.response.percentiles(),
            processing_ms: v.processing.percentiles(),
            speculation: self.spec.clone(),
            end_of_turn: self.summary.end_of_turn.clone().map(|mut e| {
                e.cost_ms = v.turn_model.percentiles();
                e
            }),
            endpoint_delay_ms: v.endpoint.percentiles(),
            terms_ms: (v.terms.iter())
                .filter_map(|(name, series)| Some((name.clone(), series.percentiles()?)))
                .collect(),
            stt_ms: v.stt.percentiles(),
            stt_rtfx: v.stt_rtfx.percentiles(),
            llm_ttft_ms: v.ttft.percentiles(),
            llm_decode_tps: v.decode_tps.percentiles(),
            llm_prefill_tps: v.prefill_tps.percentiles(),
            voice_latency_ms: v.voice.percentiles(),
            tts_first_audio_ms: v.tts_first_audio.percentiles(),
            tts_rtfx: v.tts_rtfx.percentiles(),
            barge_in_ms: v.barge_in.percentiles(),
            wer: (self.wer.1 > 0).then(|| self.wer.0 / self.wer.1 as f64),
            engine_threads_peak: run.engine_threads_peak,
            dropped: crate::dropped_total(run),
            ..self.summary.clone()
        };
        summary.bottleneck = crate::bottleneck(&stages, &self.terms, &run.topology, &config);
        summary.budget.passed = true;
        let cold_start = ColdStart {
            model_load_ms,
            first_turn_response_latency_ms: self.first_latency.flatten(),
        };
        crate::assemble(
            run,
            crate::ReportClock::Wall,
            config,
            summary,
            cold_start,
            self.turns.iter().cloned().collect(),
            stages,
            budget,
        )
    }
}

/// The names of `topology`'s stages on the response's path.
fn on_path(topology: &Topology) -> Vec<String> {
    let mut path: Vec<String> = (topology.latency_stages().iter())
        .map(|s| s.id.to_string())
        .collect();
    // the voice's calls give its first audio and its synthesis time
    if topology.stage_spec(voxline_tts::STAGE_NAME).is_some() {
        path.push(voxline_tts::STAGE_NAME.to_owned());
    }
    path
}

impl Observer for Tally {
    fn start(&mut self, clock: Clock, topology: &Topology) {
        self.clock = clock;
        self.path = on_path(topology);
        self.speaks = topology.stage_spec(voxline_tts::STAGE_NAME).is_some();
        self.topology = topology.clone();
    }

    fn span(&mut self, span: &Span) {
        Tally::span(self, span);
    }

    fn event(&mut self, event: &TimedEvent) {
        Tally::event(self, event);
    }
}
