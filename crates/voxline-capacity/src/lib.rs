//! `voxline bench --sessions`: how many simultaneous conversations one
//! process holds within the budget, and which stage gives out first.
//!
//! For each session count N, a fresh [`Hub`] serves N simulated users. Each
//! replays the fixtures at real-time pace (one 20 ms block at a time, on
//! the wall clock) with a think time between recordings; user `i` starts
//! `i × stagger` after the first. A turn's response latency is the labelled
//! true end of speech (the sidecar) → the answer's first token, on the wall
//! clock: what that user felt. Each user's first turn is warm-up.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use voxline_audio::WavSource;

use voxline_pipeline::sessions::{Hub, HubError, HubTotals, Session};
use voxline_pipeline::settings::EngineSettings;
use voxline_pipeline::sidecar::Sidecar;
use voxline_pipeline::BadInput;
use voxline_report::budget::Budget;
use voxline_report::stats::Percentiles;
use voxline_serve::metrics::bottleneck;

mod play;
pub mod remote;
mod render;

pub use play::{play, Conversation, Heard, Local, TurnSeen};
pub use render::{plot_svg, to_markdown};

/// What a capacity run measures.
#[derive(Debug, Clone)]
pub struct CapacityOptions {
    /// The session counts to measure, in order.
    pub sessions: Vec<usize>,
    /// Delay between one user's start and the next's.
    pub stagger: Duration,
    /// Silence between one recording and the next (the user thinking).
    pub think: Duration,
    /// What each user's conversation runs with (the command line's).
    pub pipeline: voxline_pipeline::pipeline::PipelineConfig,
}

/// One user's script: the fixtures back to back with think time between.
#[derive(Debug, Clone)]
pub struct Script {
    /// 16 kHz mono audio.
    pub samples: Vec<f32>,
    /// Labelled true ends of speech, in samples from the script's start.
    pub true_ends: Vec<u64>,
}

impl Script {
    /// Reads `files` (each with its sidecar) into one script.
    ///
    /// # Errors
    /// [`BadInput`] for an unreadable WAV or sidecar, or a file without a
    /// sidecar (its turns' true ends are needed).
    pub fn load(files: &[PathBuf], think: Duration) -> Result<Self, BadInput> {
        let gap = usize::try_from(think.as_millis() * 16).unwrap_or(usize::MAX);
        let mut samples = Vec::new();
        let mut true_ends = Vec::new();
        for f in files {
            let sidecar = Sidecar::load_for(f)?.ok_or_else(|| {
                BadInput(format!(
                    "{}: no sidecar ({}); `bench --sessions` needs each fixture's labelled turns",
                    f.display(),
                    Sidecar::path_for(f).display()
                ))
            })?;
            let start = samples.len() as u64;
            read_16k(f, &mut samples)?;
            true_ends.extend(sidecar.turns.iter().map(|t| start + t.end_sample));
            samples.resize(samples.len() + gap, 0.0);
        }
        Ok(Script { samples, true_ends })
    }
}

fn read_16k(path: &Path, out: &mut Vec<f32>) -> Result<(), BadInput> {
    let mut src = WavSource::open(path).map_err(BadInput::from_display)?;
    while let Some(chunk) = src.next_chunk().map_err(BadInput::from_display)? {
        out.extend_from_slice(&chunk);
    }
    Ok(())
}

/// One session count's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SessionsRow {
    /// Simultaneous sessions.
    pub sessions: usize,
    /// Turns answered (warm-up excluded) and turns that failed.
    pub turns: usize,
    /// Failed turns.
    pub errors: usize,
    /// True end of speech → first token, ms.
    pub response_latency_ms: Option<Percentiles>,
    /// Whisper's own time, ms.
    pub stt_ms: Option<Percentiles>,
    /// A transcription's wait for the CPU, ms.
    pub stt_queue_ms: Option<Percentiles>,
    /// The transcript handed to the LLM → first token (queue and prefill), ms.
    pub llm_first_token_ms: Option<Percentiles>,
    /// One answer's decode rate, tokens/s.
    pub session_decode_tps: Option<Percentiles>,
    /// Answer tokens of every session per second of LLM compute.
    pub aggregate_decode_tps: Option<f64>,
    /// Answer tokens of every session per second of the run.
    pub tokens_per_wall_s: f64,
    /// Answer tokens the engines sampled in the run (every turn, warm-up
    /// included; over WebSocket, as the server's `/metrics` counted them).
    pub tokens: u64,
    /// Answer tokens the users received (every turn, warm-up included).
    pub tokens_received: u64,
    /// Prompt tokens per second of the steps that evaluated them (those
    /// steps also decode other sessions' tokens).
    pub prefill_tps: Option<f64>,
    /// Each stage's share of the run (every stage of the pipeline, added
    /// ones included; the LLM's is the batching worker's compute).
    pub utilisation: BTreeMap<String, f64>,
    /// The stage with the largest share of the run.
    pub saturating_stage: String,
    /// Most engine threads that ran at once (never above the budget).
    pub peak_threads: usize,
    /// The run's wall time, s.
    pub wall_s: f64,
    /// Events a session's reader missed and audio blocks a session refused.
    pub dropped: u64,
    /// Whether the latency held the budget (no budget: `None`).
    pub within_budget: Option<bool>,
    /// The distinct errors of failed turns.
    pub error_messages: Vec<String>,
}

/// The capacity report.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityReport {
    /// Threads every engine call ran with.
    pub threads: usize,
    /// The server the users talked to over WebSocket (`bench --via`);
    /// absent for engines in this process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// Stagger between users, ms.
    pub stagger_ms: u64,
    /// Think time between recordings, ms.
    pub think_ms: u64,
    /// Fixture files each user plays.
    pub fixtures: Vec<String>,
    /// One row per session count.
    pub rows: Vec<SessionsRow>,
    /// The largest session count whose latency held the budget.
    pub capacity: Option<usize>,
    /// The stage that saturates at the first count past the capacity (or at
    /// the largest count measured).
    pub limiting_stage: Option<String>,
    /// The engine stages that ran on remote servers, with the server
    /// (`host:port`): the capacity is then the front end's, with the
    /// servers as they are.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub remote_engines: BTreeMap<String, String>,
}

/// Why a capacity run failed.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    /// The hub could not start or a session could not join.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The server (`--via`) could not be reached, or refused a user.
    #[error(transparent)]
    Remote(#[from] voxline_serve::client::ClientError),
}

/// Runs every session count in `opts` on `script`; `progress` hears about each.
///
/// # Errors
/// [`CapacityError::Hub`] when the engines cannot load or a session cannot join.
pub fn run(
    engine: &EngineSettings,
    script: &Script,
    fixtures: &[PathBuf],
    opts: &CapacityOptions,
    budget: Option<&Budget>,
    progress: &dyn Fn(&str),
) -> Result<CapacityReport, CapacityError> {
    run_with(engine, script, fixtures, opts, budget, None, progress)
}

/// Makes the stages each session adds to the standard pipeline.
pub type StagesFn = std::sync::Arc<dyn Fn() -> voxline_pipeline::pipeline::Extras + Send + Sync>;

/// [`run`], each session's pipeline with the stages `stages` makes.
///
/// # Errors
/// As [`run`].
#[allow(clippy::too_many_arguments)]
pub fn run_with(
    engine: &EngineSettings,
    script: &Script,
    fixtures: &[PathBuf],
    opts: &CapacityOptions,
    budget: Option<&Budget>,
    stages: Option<StagesFn>,
    progress: &dyn Fn(&str),
) -> Result<CapacityReport, CapacityError> {
    measure(fixtures, opts, budget, None, |n| {
        progress(&format!("{n} session(s): loading"));
        let hub = Hub::start(engine, opts.pipeline.clone(), n)?;
        let hub = match stages.clone() {
            Some(s) => hub.with_stages(move || s())?,
            None => hub,
        };
        let sessions: Vec<Session> = (0..n).map(|_| hub.join()).collect::<Result<_, _>>()?;
        progress(&format!("{n} session(s): playing"));
        let users = sessions.iter().map(Local::new).collect();
        let (seen, wall) = play_all(users, script, opts.stagger);
        let totals = hub.totals();
        Ok(Count {
            seen,
            wall,
            totals,
            threads: hub.threads(),
            remote: hub
                .remote_servers()
                .into_iter()
                .map(|(stage, server)| (stage.to_owned(), server))
                .collect(),
        })
    })
}

/// One session count as measured: each user's turns and losses, the wall
/// time, the engines' totals over the run, their threads.
pub(crate) struct Count {
    pub(crate) seen: Vec<(Vec<TurnSeen>, u64)>,
    pub(crate) wall: Duration,
    pub(crate) totals: HubTotals,
    pub(crate) threads: usize,
    /// The engine stages on remote servers, and the server.
    pub(crate) remote: BTreeMap<String, String>,
}

/// Measures every session count in `opts` with `one_count` (in this process
/// or over the network, `via`) into the report.
pub(crate) fn measure(
    fixtures: &[PathBuf],
    opts: &CapacityOptions,
    budget: Option<&Budget>,
    via: Option<String>,
    mut one_count: impl FnMut(usize) -> Result<Count, CapacityError>,
) -> Result<CapacityReport, CapacityError> {
    let mut rows = Vec::new();
    let mut threads = 0;
    let mut remote = BTreeMap::new();
    for &n in &opts.sessions {
        let c = one_count(n)?;
        threads = c.threads;
        remote = c.remote;
        rows.push(row(n, &c.seen, &c.totals, c.wall, budget));
    }
    let mut r = report(rows, threads, fixtures, opts, via);
    r.remote_engines = remote;
    Ok(r)
}

/// Plays `script` into every conversation at once, user `i` starting
/// `i × stagger` after the first; each user's turns and losses, and the
/// wall time of the whole.
pub(crate) fn play_all<C: Conversation + Send>(
    conversations: Vec<C>,
    script: &Script,
    stagger: Duration,
) -> (Vec<(Vec<TurnSeen>, u64)>, Duration) {
    let began = Instant::now();
    let settle = Duration::from_secs(60);
    let seen = std::thread::scope(|s| {
        let handles: Vec<_> = conversations
            .into_iter()
            .enumerate()
            .map(|(i, mut c)| {
                let stagger = stagger * u32::try_from(i).unwrap_or(u32::MAX);
                s.spawn(move || {
                    std::thread::sleep(stagger);
                    let turns = play(&mut c, script, Instant::now(), settle);
                    (turns, c.lost())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    (seen, began.elapsed())
}

/// The report of `rows`: the capacity and the limiting stage.
fn report(
    rows: Vec<SessionsRow>,
    threads: usize,
    fixtures: &[PathBuf],
    opts: &CapacityOptions,
    via: Option<String>,
) -> CapacityReport {
    let capacity = rows
        .iter()
        .filter(|r| r.within_budget == Some(true))
        .map(|r| r.sessions)
        .max();
    let limiting_stage = rows
        .iter()
        .find(|r| r.within_budget == Some(false))
        .or(rows.last())
        .map(|r| r.saturating_stage.clone());
    CapacityReport {
        threads,
        via,
        stagger_ms: u64::try_from(opts.stagger.as_millis()).unwrap_or(u64::MAX),
        think_ms: u64::try_from(opts.think.as_millis()).unwrap_or(u64::MAX),
        fixtures: fixtures.iter().map(|f| f.display().to_string()).collect(),
        rows,
        capacity,
        limiting_stage,
        remote_engines: BTreeMap::new(),
    }
}

fn row(
    n: usize,
    seen: &[(Vec<TurnSeen>, u64)],
    totals: &HubTotals,
    wall: Duration,
    budget: Option<&Budget>,
) -> SessionsRow {
    // each user's first turn is warm-up
    let turns: Vec<&TurnSeen> = seen.iter().flat_map(|(t, _)| t.iter().skip(1)).collect();
    let errors = turns.iter().filter(|t| t.error.is_some()).count();
    let good: Vec<&&TurnSeen> = turns.iter().filter(|t| t.error.is_none()).collect();
    let of = |f: &dyn Fn(&TurnSeen) -> Option<f64>| {
        Percentiles::of(&good.iter().filter_map(|t| f(t)).collect::<Vec<_>>())
    };
    let response = of(&|t| t.response_ms);
    let wall_s = wall.as_secs_f64();
    let utilisation: BTreeMap<String, f64> = totals
        .stages
        .iter()
        .map(|st| (st.stage.clone(), st.busy.as_secs_f64() / wall_s))
        .collect();
    let llm = &totals.llm;
    let within_budget = budget.map(|b| {
        let limits = b.response_latency_ms.as_ref();
        let ok = |limit: Option<f64>, value: Option<f64>| match (limit, value) {
            (Some(l), Some(v)) => v <= l,
            (Some(_), None) => false,
            (None, _) => true,
        };
        errors == 0
            && ok(limits.and_then(|l| l.p50), response.as_ref().map(|p| p.p50))
            && ok(limits.and_then(|l| l.p95), response.as_ref().map(|p| p.p95))
    });
    SessionsRow {
        sessions: n,
        turns: good.len(),
        errors,
        response_latency_ms: response,
        stt_ms: of(&|t| Some(t.stt_ms)),
        stt_queue_ms: of(&|t| Some(t.stt_wait_ms)),
        llm_first_token_ms: of(&|t| t.first_token_ms),
        session_decode_tps: of(&|t| t.decode_tps),
        aggregate_decode_tps: (!llm.busy.is_zero())
            .then(|| llm.tokens as f64 / llm.busy.as_secs_f64()),
        tokens_per_wall_s: llm.tokens as f64 / wall_s,
        tokens: llm.tokens,
        tokens_received: seen
            .iter()
            .flat_map(|(t, _)| t.iter())
            .map(|t| u64::from(t.received))
            .sum(),
        prefill_tps: (!llm.prefill_busy.is_zero())
            .then(|| llm.prefill_tokens as f64 / llm.prefill_busy.as_secs_f64()),
        saturating_stage: bottleneck(&utilisation).unwrap_or("idle").to_owned(),
        utilisation,
        peak_threads: totals.peak_threads,
        wall_s,
        dropped: seen.iter().map(|s| s.1).sum(),
        within_budget,
        error_messages: {
            let mut m: Vec<String> = turns.iter().filter_map(|t| t.error.clone()).collect();
            m.sort();
            m.dedup();
            m
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(response: &[f64]) -> Vec<TurnSeen> {
        response
            .iter()
            .enumerate()
            .map(|(i, &r)| TurnSeen {
                turn: u32::try_from(i + 1).unwrap(),
                transcript: String::new(),
                answer: "a".into(),
                response_ms: Some(r),
                stt_ms: 900.0,
                stt_wait_ms: 0.0,
                first_token_ms: Some(100.0),
                decode_tps: Some(50.0),
                tokens: 10,
                received: 10,
                error: None,
            })
            .collect()
    }

    #[test]
    fn rows_skip_each_users_first_turn_and_judge_the_budget() {
        let budget = Budget::parse("[response_latency_ms]\np50 = 1500\np95 = 2500\n").unwrap();
        let totals = HubTotals {
            stages: vec![
                voxline_pipeline::sessions::StageBusy {
                    stage: "stt".into(),
                    busy: Duration::from_secs(6),
                    calls: 5,
                },
                voxline_pipeline::sessions::StageBusy {
                    stage: "llm".into(),
                    busy: Duration::from_secs(2),
                    calls: 5,
                },
            ],
            llm: voxline_llm::serving::ServingTotals {
                busy: Duration::from_secs(2),
                tokens: 100,
                ..Default::default()
            },
            peak_threads: 2,
        };
        // warm-up turns of 9 s are not counted
        let users = vec![
            (seen(&[9_000.0, 1_000.0, 1_200.0]), 0),
            (seen(&[9_000.0, 1_400.0]), 2),
        ];
        let r = row(2, &users, &totals, Duration::from_secs(10), Some(&budget));
        assert_eq!((r.turns, r.errors, r.dropped), (3, 0, 2));
        assert!(r.response_latency_ms.unwrap().max < 1_500.0);
        assert_eq!(r.within_budget, Some(true));
        assert_eq!(r.saturating_stage, "stt");
        assert!((r.utilisation["stt"] - 0.6).abs() < 1e-9);
        assert!((r.aggregate_decode_tps.unwrap() - 50.0).abs() < 1e-9);
        let slow = vec![(seen(&[0.0, 3_000.0, 3_000.0]), 0)];
        let r2 = row(4, &slow, &totals, Duration::from_secs(10), Some(&budget));
        assert_eq!(r2.within_budget, Some(false));
        assert_eq!(
            row(1, &slow, &totals, Duration::from_secs(10), None).within_budget,
            None
        );
        let report = CapacityReport {
            threads: 2,
            via: None,
            stagger_ms: 700,
            think_ms: 1500,
            fixtures: vec!["q.wav".into()],
            rows: vec![r, r2],
            capacity: Some(2),
            limiting_stage: Some("stt".into()),
            remote_engines: BTreeMap::new(),
        };
        let md = to_markdown(&report);
        assert!(md.contains("| 2 | 3 | 0 |"), "{md}");
        assert!(
            md.contains("capacity: 2 session(s) · limiting stage: stt\n"),
            "{md}"
        );
        // an engine on a remote server is named with it
        let remote = CapacityReport {
            remote_engines: [("stt".to_owned(), "gpu1:8001".to_owned())].into(),
            ..report.clone()
        };
        assert!(
            to_markdown(&remote).contains("limiting stage: stt (remote, gpu1:8001)"),
            "{}",
            to_markdown(&remote)
        );
        let svg = plot_svg(&report).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("aggregate decode tokens/s"));
    }

    #[test]
    fn a_fixture_without_a_sidecar_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let wav = dir.path().join("x.wav");
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../audio-fixtures")
            .join("q_capital.wav");
        std::fs::copy(fixture, &wav).unwrap();
        let e = Script::load(&[wav], Duration::ZERO).unwrap_err();
        assert!(e.0.contains("no sidecar"), "{e}");
    }
}
