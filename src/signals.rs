//! Ctrl-C and SIGTERM: an orderly stop first, then the documented exit
//! status (128 + the signal's number).

use voxline_core::ShutdownHandle;

/// The signal that asked for a stop (2 = SIGINT, 15 = SIGTERM; 0 = none).
static SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The exit status of a run stopped by a signal: 128 + its number (130 for
/// Ctrl-C, 143 for SIGTERM), as shells report it.
pub(crate) fn interrupted_status() -> u8 {
    u8::try_from(128 + SIGNAL.load(std::sync::atomic::Ordering::Relaxed).max(2)).unwrap_or(130)
}

/// Ctrl-C and SIGTERM request an orderly stop (tokio, at the edge).
pub(crate) fn install_signal_handler(handle: ShutdownHandle) {
    // The signal streams are registered here, before this returns, so a
    // signal that arrives at any later moment (model load included) is ours.
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    #[cfg(unix)]
    let streams = {
        use tokio::signal::unix::{signal, SignalKind};
        let _entered = rt.enter();
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(int), Ok(term)) => (int, term),
            _ => return,
        }
    };
    let _ = std::thread::Builder::new().name("signals".into()).spawn(move || {
        rt.block_on(async move {
            #[cfg(unix)]
            {
                let (mut int, mut term) = streams;
                tokio::select! {
                    _ = int.recv() => SIGNAL.store(2, std::sync::atomic::Ordering::Relaxed),
                    _ = term.recv() => SIGNAL.store(15, std::sync::atomic::Ordering::Relaxed),
                }
                eprintln!("voxline: stopping — finishing the turn in flight (press Ctrl-C again to abort)");
                handle.request();
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            #[cfg(not(unix))]
            {
                let _ = tokio::signal::ctrl_c().await;
                SIGNAL.store(2, std::sync::atomic::Ordering::Relaxed);
                eprintln!("voxline: stopping — finishing the turn in flight (press Ctrl-C again to abort)");
                handle.request();
                let _ = tokio::signal::ctrl_c().await;
            }
            voxline_pipeline::output::remove_partials();
            let code = 128 + SIGNAL.load(std::sync::atomic::Ordering::Relaxed).max(2);
            // SAFETY: `_exit` ends the process at once. Unlike `exit` it runs no
            // atexit handlers or C++ static destructors, which would tear down
            // whisper.cpp and llama.cpp state while their threads still compute
            // (seen as a crash instead of the documented status). Everything
            // that must happen first (partial files removed) has happened.
            unsafe { libc::_exit(code) }
        });
    });
}
