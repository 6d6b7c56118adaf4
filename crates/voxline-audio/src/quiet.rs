//! Keeps the audio libraries' own diagnostics off standard error.
//!
//! Listing and opening devices makes alsa-lib print a line for every PCM it
//! probes and cannot open (`ALSA lib pcm_dsnoop.c:…: unable to open slave`,
//! `Unknown PCM cards.pcm.rear`, …): two dozen lines on a machine with ALSA's
//! plugins installed, none of them about the device asked for. voxline says
//! itself what went wrong with that device, so alsa-lib's error handler is
//! replaced by one that passes the messages to `tracing` at debug level
//! (`RUST_LOG=alsa=debug` shows where they came from).
//!
//! ALSA's `jack` PCM (from ALSA's plugins) loads JACK's client library, which
//! prints its own lines when no JACK server runs (`Cannot connect to server
//! socket`, `jack server is not running or cannot be started`, …) through
//! its error and info callbacks, not through alsa-lib. When that library is
//! installed it is loaded first and its callbacks are pointed at `tracing`
//! (target `jack`) the same way; the plugin then finds it already loaded.

use std::sync::Once;

/// Installs the quiet error handlers, once per process; every entry point
/// that probes devices calls it first.
pub(crate) fn silence_audio_libraries() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        #[cfg(target_os = "linux")]
        {
            alsa::install();
            jack::install();
        }
    });
}

#[cfg(target_os = "linux")]
mod alsa {
    use std::borrow::Cow;
    use std::ffi::{c_char, c_int, CStr};

    /// alsa-lib's handler type without its trailing C variadic arguments (the
    /// message's printf arguments), which a Rust function cannot take.
    type FixedArgsHandler =
        unsafe extern "C" fn(*const c_char, c_int, *const c_char, c_int, *const c_char);

    /// A C string alsa-lib passed in, or `?`.
    ///
    /// # Safety
    /// `p` is null or points to a NUL-terminated string alive for the call.
    unsafe fn text<'a>(p: *const c_char) -> Cow<'a, str> {
        if p.is_null() {
            Cow::Borrowed("?")
        } else {
            // SAFETY: non-null, and the caller promises a live C string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy()
        }
    }

    /// Receives alsa-lib's error messages: source file, line, function,
    /// error number and the format string (its arguments are not read).
    unsafe extern "C" fn on_alsa_error(
        file: *const c_char,
        line: c_int,
        function: *const c_char,
        err: c_int,
        fmt: *const c_char,
    ) {
        if tracing::enabled!(target: "alsa", tracing::Level::DEBUG) {
            // SAFETY: alsa-lib passes its own static source file, function
            // name and format strings (or null).
            let (file, function, fmt) = unsafe { (text(file), text(function), text(fmt)) };
            tracing::debug!(target: "alsa", "{file}:{line} ({function}) {} [error {err}]", fmt.trim_end());
        }
    }

    pub(super) fn install() {
        let handler: Option<FixedArgsHandler> = Some(on_alsa_error);
        // SAFETY: `Option<fn pointer>` has the same size and niche on both
        // sides; only the parameter list differs. alsa-lib calls the handler
        // as `handler(file, line, function, err, fmt, ...)`: on the C ABIs of
        // the targets alsa-lib runs on (System V x86-64, AAPCS64 and the other
        // Linux ABIs) the fixed arguments of a variadic call are passed
        // exactly as in a non-variadic call, and the variadic ones are left in
        // registers or on the caller's stack for the callee to read or
        // ignore. `on_alsa_error` ignores them and never forms a `va_list`.
        let handler = unsafe {
            std::mem::transmute::<Option<FixedArgsHandler>, alsa_sys::snd_lib_error_handler_t>(
                handler,
            )
        };
        // SAFETY: `snd_lib_error_set_handler` stores the pointer in a global
        // that alsa-lib reads whenever it reports an error; the function is
        // a `'static` item, so the pointer never dangles.
        let rc = unsafe { alsa_sys::snd_lib_error_set_handler(handler) };
        if rc != 0 {
            tracing::debug!(target: "alsa", "snd_lib_error_set_handler failed: {rc}");
        }
    }
}

#[cfg(target_os = "linux")]
mod jack {
    use std::ffi::{c_char, c_void, CStr};

    /// JACK's message callback: `void (*)(const char *)`.
    type MessageFn = unsafe extern "C" fn(*const c_char);
    /// `jack_set_error_function` and `jack_set_info_function`.
    type SetFn = unsafe extern "C" fn(Option<MessageFn>);

    unsafe extern "C" fn on_jack_message(msg: *const c_char) {
        if !msg.is_null() && tracing::enabled!(target: "jack", tracing::Level::DEBUG) {
            // SAFETY: JACK passes a NUL-terminated message alive for the call.
            let msg = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
            tracing::debug!(target: "jack", "{}", msg.trim_end());
        }
    }

    pub(super) fn install() {
        // SAFETY: a constant NUL-terminated name; dlopen has no other
        // precondition. The handle is never closed, so the library (and the
        // callbacks set in it) stay for the life of the process.
        let lib =
            unsafe { libc::dlopen(c"libjack.so.0".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return; // not installed: nothing will print
        }
        for name in [c"jack_set_error_function", c"jack_set_info_function"] {
            // SAFETY: `lib` is a live handle from dlopen; the name is a constant C string.
            let sym: *mut c_void = unsafe { libc::dlsym(lib, name.as_ptr()) };
            if sym.is_null() {
                continue;
            }
            // SAFETY: both functions are declared in <jack/jack.h> as
            // `void f(void (*func)(const char *))`, which is `SetFn`; a
            // non-null symbol from dlsym is that function's address.
            let set = unsafe { std::mem::transmute::<*mut c_void, SetFn>(sym) };
            // SAFETY: JACK stores the pointer and calls it with a C string;
            // `on_jack_message` is a `'static` item, so it never dangles.
            unsafe { set(Some(on_jack_message)) };
        }
    }
}
