//! `voxline serve`: the assistant over WebSocket (see `voxline_serve`).

use voxline_pipeline::BadInput;

use crate::cli::ServeArgs;
use crate::Outcome;

pub(crate) fn serve(args: &ServeArgs) -> anyhow::Result<Outcome> {
    use std::time::Duration;
    use voxline_pipeline::sessions::Hub;
    use voxline_serve::{self as serve, ServeOptions};
    let listen: std::net::SocketAddr = args.listen.parse().map_err(|_| {
        BadInput(format!(
            "--listen {}: give an address and port, e.g. 127.0.0.1:8787 or 0.0.0.0:8787",
            args.listen
        ))
    })?;
    if args.max_sessions == 0 || args.max_sessions > 64 {
        return Err(BadInput(format!(
            "--max-sessions {}: give 1 to 64 conversations",
            args.max_sessions
        ))
        .into());
    }
    for (flag, s) in [
        ("--idle-timeout-s", args.idle_timeout_s),
        ("--header-timeout-s", args.header_timeout_s),
    ] {
        if !(1..=86_400).contains(&s) {
            return Err(BadInput(format!("{flag} {s}: give 1 to 86400 seconds")).into());
        }
    }
    let spare = serve::SPARE_CONNECTIONS;
    if args.max_connections < args.max_sessions + spare || args.max_connections > 1_000_000 {
        return Err(BadInput(format!(
            "--max-connections {}: give {} (--max-sessions + {spare}, for /healthz and the page) to 1000000",
            args.max_connections,
            args.max_sessions + spare
        ))
        .into());
    }
    let opts = ServeOptions {
        listen,
        token: args.token.clone(),
        idle_timeout: Duration::from_secs(args.idle_timeout_s),
        hello_timeout: Duration::from_secs(10),
        client_queue: args.client_queue,
        allow_origins: args.allow_origin.clone(),
        limits: serve::Limits {
            max_connections: args.max_connections,
            header_timeout: Duration::from_secs(args.header_timeout_s),
            ..serve::Limits::default()
        },
    };
    opts.check().map_err(BadInput)?;
    let (settings, warnings) = args.engine.settings()?;
    let pipeline = args.vad.pipeline(
        &settings,
        &voxline_models::location::resolve_from_process(args.engine.models_dir.as_deref()),
    )?;
    for w in &warnings {
        eprintln!("voxline: warning: {w}");
    }
    let voice = args.engine.voice_choice(crate::cli::VoiceArg::Off)?;
    let threads = settings.threads.total;
    if let Some(v) = &voice {
        // a voice that cannot load is refused before anything listens
        drop(v.load(threads)?);
    }
    // a remote engine's server is checked before anything listens: one line, exit 2
    voxline_pipeline::engines::connect(&settings)?;
    let hub = Hub::start(&settings, pipeline, args.max_sessions)?;
    let hub = match voice {
        // each conversation speaks with its own voice
        Some(v) => hub
            .with_stages(move || match v.load(threads) {
                Ok(stage) => voxline_pipeline::pipeline::Extras::default().voice(stage),
                Err(e) => {
                    eprintln!("voxline: warning: a session speaks no answers: {e}");
                    voxline_pipeline::pipeline::Extras::default()
                }
            })
            .map_err(|e| BadInput(e.to_string()))?,
        None => hub,
    };
    let token_hint = if opts.token.is_some() {
        "?token=..."
    } else {
        ""
    };
    let summary = serve::serve(hub, opts, |addr| {
        // one line a script can wait for (the port when --listen asked for 0)
        eprintln!("voxline: listening on http://{addr}/{token_hint} (WebSocket at ws://{addr}/ws; Ctrl-C stops)");
    })
    .map_err(|e| match e {
        serve::ServeError::Bind { .. } => anyhow::Error::new(BadInput(e.to_string())),
        other => other.into(),
    })?;
    let dropped = if summary.dropped_audio_s > 0.0 {
        format!(
            "; {:.1} s of audio the clients had sent was not yet transcribed and was dropped",
            summary.dropped_audio_s
        )
    } else {
        String::new()
    };
    eprintln!(
        "voxline: stopped{}{dropped}",
        if summary.cancelled {
            " (answers in flight cancelled)"
        } else {
            ""
        }
    );
    Ok(Outcome::Ok)
}
