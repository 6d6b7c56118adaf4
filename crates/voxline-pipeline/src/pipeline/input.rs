//! What a run plays: recordings opened up front (a bad one is reported
//! before any work starts), how they are paced, and where each sits in the
//! stream.

use std::path::{Path, PathBuf};

use voxline_audio::WavSource;
use voxline_core::ShutdownHandle;

use super::LiveOptions;
use crate::sidecar::Sidecar;
use crate::BadInput;

/// How audio is released into the pipeline: recordings at real-time pace
/// or as fast as it takes them (`--pace`), or live, as a device or a
/// client delivers it. One type from the command line to the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pace {
    /// At the rate a microphone would deliver it; latencies are what a live user feels.
    Realtime,
    /// As fast as the pipeline accepts it; latencies are computed on a
    /// virtual clock (what a live user would have felt) from measured service times.
    #[default]
    Fast,
    /// As a device or a client delivers it (`live`, `serve`): measured on
    /// the wall clock, like `Realtime`. Not a `--pace` value.
    Live,
}

impl Pace {
    /// Whether latencies are measured on the wall clock (else on the virtual one).
    #[must_use]
    pub fn on_wall_clock(self) -> bool {
        self != Self::Fast
    }
}

impl std::str::FromStr for Pace {
    type Err = BadInput;
    fn from_str(s: &str) -> Result<Self, BadInput> {
        match s {
            "realtime" => Ok(Self::Realtime),
            "fast" => Ok(Self::Fast),
            _ => Err(BadInput(format!(
                "--pace {s:?}: expected `realtime` or `fast`"
            ))),
        }
    }
}

/// A recording to replay.
pub struct Input {
    /// The file.
    pub path: PathBuf,
    /// Its sidecar, if it has one.
    pub sidecar: Option<Sidecar>,
    pub(super) source: WavSource,
}

impl Input {
    /// Reads the whole recording (16 kHz mono), as the replay plays it.
    ///
    /// # Errors
    /// [`BadInput`] when it cannot be read to its end.
    pub fn read_all(mut self) -> Result<Vec<f32>, BadInput> {
        let mut all = Vec::new();
        while let Some(chunk) = self.source.next_chunk().map_err(BadInput::from_display)? {
            all.extend_from_slice(&chunk);
        }
        Ok(all)
    }
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Where the audio comes from.
#[derive(Debug)]
pub enum Source {
    /// Recorded files, played one after another (nothing is ever dropped).
    Replay(Vec<Input>),
    /// A live input device (a microphone).
    Live(LiveOptions),
    /// Audio pushed by another part of the program (a server's client, a
    /// simulated user): played as it arrives until every sender is gone.
    Pushed(Pushed),
}

/// What a [`Source::Pushed`] receives.
#[derive(Debug)]
pub enum PushedAudio {
    /// 16 kHz mono samples, and when they arrived.
    Samples(Vec<f32>, std::time::Instant),
    /// The speaker is done: an open utterance closes now instead of after
    /// the hangover. More audio may follow as a new stream.
    End,
}

/// A source of pushed audio (see [`Source::Pushed`]).
#[derive(Debug)]
pub struct Pushed {
    /// Where the audio comes from.
    pub audio: crossbeam_channel::Receiver<PushedAudio>,
    /// Samples queued in `audio`: the sender adds what it queues (and
    /// bounds it), the source subtracts what it plays.
    pub queued: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Where a replayed file sits in the pipeline's stream (16 kHz positions).
#[derive(Debug, Clone)]
pub struct InputSpan {
    /// The file.
    pub path: PathBuf,
    /// Its sidecar.
    pub sidecar: Option<Sidecar>,
    /// Stream position of its first sample.
    pub start: u64,
    /// Stream position one past its last sample.
    pub end: u64,
}

/// Opens every recording up front, so a bad file is reported before any work starts.
///
/// The path `-` is standard input (at most once; it has no sidecar).
///
/// # Errors
/// [`BadInput`] naming the first file that cannot be replayed (or whose
/// sidecar is malformed, or does not match its audio: another sample rate, a
/// turn past the end).
pub fn open_inputs(paths: &[PathBuf]) -> Result<Vec<Input>, BadInput> {
    open_inputs_until(paths, None, &|_| {})
}

/// [`open_inputs`] for a caller that can be stopped: with `stop`, a named
/// pipe with no writer is waited for (`waiting` hears its path once it has
/// waited 200 ms) until the writer or the stop comes, and pipes and standard
/// input are read so that a stop ends them even while their writer stalls.
///
/// # Errors
/// As [`open_inputs`]; also when the stop came first (then `stop` is
/// requested, and the caller reports an interrupted run, not bad input).
pub fn open_inputs_until(
    paths: &[PathBuf],
    stop: Option<&ShutdownHandle>,
    waiting: &dyn Fn(&Path),
) -> Result<Vec<Input>, BadInput> {
    if paths.is_empty() {
        return Err(BadInput(
            "no input files: give one or more WAV files".into(),
        ));
    }
    let is_stdin = |p: &Path| p.as_os_str() == "-";
    if paths.iter().filter(|p| is_stdin(p)).count() > 1 {
        return Err(BadInput(
            "`-` (standard input) is given more than once; it can be read only once".into(),
        ));
    }
    paths
        .iter()
        .map(|p| {
            let source = match (is_stdin(p), stop) {
                (true, None) => WavSource::stdin(),
                (true, Some(stop)) => WavSource::stdin_stoppable(stop),
                (false, None) => WavSource::open(p),
                (false, Some(stop)) => WavSource::open_stoppable(p, stop, &|| waiting(p)),
            }
            .map_err(BadInput::from_display)?;
            if source.spec().duration_frames == Some(0) {
                return Err(BadInput(format!(
                    "{}: holds no audio (0 samples); record or export it again",
                    p.display()
                )));
            }
            let sidecar = if is_stdin(p) {
                None
            } else {
                Sidecar::load_for(p)?
            };
            if let Some(sc) = &sidecar {
                let spec = source.spec();
                sc.check_against(spec.sample_rate, spec.duration_frames)
                    .map_err(|e| BadInput(format!("{}: {e}", Sidecar::path_for(p).display())))?;
            }
            Ok(Input {
                path: p.clone(),
                sidecar,
                source,
            })
        })
        .collect()
}
