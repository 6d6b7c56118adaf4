//! `voxline`: the command line. Thin: it validates arguments into settings
//! and calls the library crates (`voxline_pipeline`, `voxline_report`, `voxline_serve`,
//! `voxline_capacity`, `voxline_models`).
//!
//! Exit codes: 0 ok; 1 a budget was broken; 2 bad input or usage; 3 runtime failure.
//!
//! The command tree and its options are in `cli`, one module per subcommand
//! in `cmd`, the signals in `signals`.

use std::process::ExitCode;

use voxline_pipeline::pipeline;
use voxline_pipeline::BadInput;

mod cli;
mod cmd;
mod signals;

use cli::{Cli, Command};
use cmd::bench::bench;
use cmd::live::{devices, live};
use cmd::models::models;
use cmd::replay::replay;
use cmd::serve::serve;
use signals::interrupted_status;

/// The exit status of a run that completed.
pub(crate) enum Outcome {
    /// Everything ran and every limit held (exit 0).
    Ok,
    /// A budget limit was broken (exit 1).
    BudgetBroken,
    /// An input was refused along the way (exit 2).
    BadInputSeen,
    /// The pipeline failed (exit 3).
    Failed,
    /// Stopped by Ctrl-C or SIGTERM before the input was done (exit 130 / 143).
    Interrupted,
}

/// glibc's malloc raises its mmap threshold (up to 32 MiB) each time a
/// large block is freed, and from then on blocks that size come from the
/// heap's arenas, which keep them when they are freed. Each conversation's
/// engine buffers (ggml's, tens of MB, made and freed per session) then
/// grew `serve` by ~30 MB a conversation: 169 -> 706 MB over 16
/// conversations one after another. A fixed 128 KiB threshold (glibc's
/// default, no longer raised) gives large blocks back when they are freed:
/// 303 -> 311 MB over the same 16.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn give_large_blocks_back() {
    // SAFETY: mallopt only sets a parameter of glibc's allocator; it is
    // called before any other thread exists
    let _ = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn give_large_blocks_back() {}

fn main() -> ExitCode {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    give_large_blocks_back();
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VOXLINE_LOG")
                // The engines' own logs are off unless asked for (VOXLINE_LOG=llama-cpp-2=info,...):
                // every failure reaches the user as one voxline line with what to do.
                .unwrap_or_else(|_| {
                    "warn,voxline_core=error,voxline_audio=error,llama-cpp-2=off,whisper_rs=off,symphonia=off"
                        .into()
                }),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .finish()
        // at trace the HTTP library dumps every byte sent, the API key's
        // header included: never, whatever VOXLINE_LOG says
        .with(tracing_subscriber::filter::filter_fn(|m| {
            !(m.target().starts_with("ureq_proto") && *m.level() == tracing::Level::TRACE)
        }))
        .init();
    match run(cli) {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::BudgetBroken) => ExitCode::from(1),
        Ok(Outcome::BadInputSeen) => ExitCode::from(2),
        Ok(Outcome::Failed) => ExitCode::from(3),
        Ok(Outcome::Interrupted) => {
            eprintln!("voxline: interrupted — the input was not played to the end");
            ExitCode::from(interrupted_status())
        }
        Err(e) => {
            let bad = e.chain().any(is_bad_input);
            // what a server or a file said is in the chain: shown, not obeyed
            eprintln!(
                "voxline: {}",
                voxline_pipeline::shown::one_line(&format!("{e:#}"))
            );
            ExitCode::from(if bad { 2 } else { 3 })
        }
    }
}

/// The command line, or the exit code of a help text (0) or of a bad flag
/// (2, after one `voxline:` line naming the flag, its value and what it
/// takes). Negative numbers are values, so that `--vad-threshold -0.5`
/// is refused for its range, not as an unknown option.
fn parse_cli() -> Result<Cli, ExitCode> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::{CommandFactory as _, FromArgMatches as _};
    let command = Cli::command()
        .allow_negative_numbers(true)
        .mut_subcommands(|c| c.allow_negative_numbers(true));
    let e = match command
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => return Ok(cli),
        Err(e) => e,
    };
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return Err(ExitCode::from(u8::from(e.use_stderr()) * 2));
    }
    let context = |k| match e.get(k) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    let reason = std::error::Error::source(&e)
        .map(ToString::to_string)
        .or_else(|| match e.get(ContextKind::ValidValue) {
            Some(ContextValue::Strings(v)) => Some(format!("give one of {}", v.join(", "))),
            _ => None,
        });
    if let (ErrorKind::MissingRequiredArgument, Some(ContextValue::Strings(missing))) =
        (e.kind(), e.get(ContextKind::InvalidArg))
    {
        eprintln!(
            "voxline: missing {}; see `voxline help`",
            missing.join(", ")
        );
        return Err(ExitCode::from(2));
    }
    let line = match (
        context(ContextKind::InvalidArg),
        context(ContextKind::InvalidValue),
        reason,
    ) {
        (Some(arg), Some(value), reason) => {
            let flag = arg.split_whitespace().next().unwrap_or(&arg).to_owned();
            match reason.filter(|r| !r.ends_with("one of ")) {
                _ if value.is_empty() => format!("{flag} needs a value"),
                Some(reason) => format!("{flag} {value}: {reason}"),
                None => format!("{flag} {value}: not a value it takes"),
            }
        }
        _ => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            first.trim_start_matches("error: ").to_owned()
        }
    };
    eprintln!("voxline: {line}; see `voxline help`");
    Err(ExitCode::from(2))
}

/// Errors caused by what the user gave (files, flags, model files): exit
/// code 2. Each library error says whose fault it is.
fn is_bad_input(e: &(dyn std::error::Error + 'static)) -> bool {
    use voxline_core::Fault;
    let fault = if e.downcast_ref::<BadInput>().is_some() {
        Some(Fault::Input)
    } else {
        None
    }
    .or_else(|| {
        e.downcast_ref::<voxline_models::ModelError>()
            .map(voxline_models::ModelError::fault)
    })
    .or_else(|| {
        e.downcast_ref::<voxline_stt::SttError>()
            .map(voxline_stt::SttError::fault)
    })
    .or_else(|| {
        e.downcast_ref::<voxline_llm::LlmError>()
            .map(voxline_llm::LlmError::fault)
    })
    .or_else(|| {
        e.downcast_ref::<voxline_audio::AudioError>()
            .map(voxline_audio::AudioError::fault)
    })
    .or_else(|| {
        e.downcast_ref::<pipeline::RunError>()
            .map(pipeline::RunError::fault)
    });
    fault == Some(Fault::Input)
}

fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Models { command } => models(command),
        Command::Replay(args) => replay(args),
        Command::Bench(args) => bench(args),
        Command::Live(args) => live(args),
        Command::Devices(args) => devices(&args),
        Command::Serve(args) => serve(&args),
    }
}
