//! Loading CTranslate2's library and the shim, once per process.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The CTranslate2 version the shim was compiled against; the library
/// `models fetch` installs is this version.
pub const HEADERS_VERSION: &str = env!("VOXLINE_CT2_HEADERS_VERSION");

#[cfg(ct2_shim)]
static SHIM: &[u8] = include_bytes!(env!("VOXLINE_CT2_SHIM"));

/// Whether this build carries the engine (the shim compiled: CTranslate2's
/// headers and a C++ compiler were there at build time), and if not, why.
///
/// # Errors
/// Why the build has no CTranslate2 engine.
pub fn built_with_engine() -> Result<(), String> {
    #[cfg(ct2_shim)]
    {
        Ok(())
    }
    #[cfg(not(ct2_shim))]
    {
        Err(format!(
            "this voxline was built without the CTranslate2 engine ({}); rebuild where cargo can fetch the headers' crate, or use --stt-engine whisper",
            env!("VOXLINE_CT2_SHIM_MISSING")
        ))
    }
}

pub(crate) type AbortCallback = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The shim's functions (see `shim.cpp`), valid for the life of the process.
pub(crate) struct Api {
    pub load: unsafe extern "C" fn(*const c_char, usize, c_int, *mut c_char, usize) -> *mut c_void,
    pub free_model: unsafe extern "C" fn(*mut c_void),
    pub replica: unsafe extern "C" fn(*const c_void, *mut c_char, usize) -> *mut c_void,
    pub free_replica: unsafe extern "C" fn(*mut c_void),
    #[allow(clippy::type_complexity)]
    pub transcribe: unsafe extern "C" fn(
        *mut c_void,
        usize,
        *mut f32,
        usize,
        usize,
        usize,
        usize,
        Option<AbortCallback>,
        *mut c_void,
        *const usize,
        usize,
        *mut usize,
        usize,
        *mut usize,
        *mut f32,
        *mut f32,
        *mut c_char,
        usize,
    ) -> c_int,
}

/// The libraries stay mapped for the life of the process: the functions
/// above point into them.
static LOADED: OnceLock<Mutex<Option<(PathBuf, &'static Api)>>> = OnceLock::new();

/// The shim's functions, loading `lib` (CTranslate2) and the shim the first
/// time. One library per process.
pub(crate) fn api(lib: &Path) -> Result<&'static Api, String> {
    built_with_engine()?;
    let cell = LOADED.get_or_init(|| Mutex::new(None));
    let mut held = voxline_core::sync::lock(cell);
    if let Some((path, api)) = held.as_ref() {
        if path != lib {
            return Err(format!(
                "this process already runs the CTranslate2 library at {}",
                path.display()
            ));
        }
        return Ok(api);
    }
    if !lib.is_file() {
        return Err("the CTranslate2 library is missing; run `voxline models fetch`".into());
    }
    // a library cut short would be mapped all the same and kill the process
    // at its first missing page: it is checked first
    voxline_models::kind::check_shared_library(lib).map_err(|e| {
        format!("not a usable CTranslate2 library: {e}; run `voxline models fetch` to repair it")
    })?;
    let api = open(lib)?;
    let api: &'static Api = Box::leak(Box::new(api));
    *held = Some((lib.to_owned(), api));
    Ok(api)
}

#[cfg(not(ct2_shim))]
fn open(_lib: &Path) -> Result<Api, String> {
    Err(built_with_engine().err().unwrap_or_default())
}

#[cfg(ct2_shim)]
fn open(lib: &Path) -> Result<Api, String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: the library is the pinned CTranslate2 (checked above as an
    // ELF shared library of this machine); its initialisers only set up
    // its own state. RTLD_GLOBAL makes its symbols visible to the shim.
    let ct2 = unsafe { Library::open(Some(lib), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|e| format!("the CTranslate2 library could not be loaded ({e})"))?;
    let shim_path = shim_file()?;
    // SAFETY: the shim is this crate's own object, compiled against the
    // headers of the pinned library version, whose symbols are now global.
    let shim = unsafe { Library::open(Some(&shim_path.1), RTLD_NOW) }.map_err(|e| {
        format!("the CTranslate2 shim could not be loaded against it ({e}); is it CTranslate2 {HEADERS_VERSION}?")
    })?;
    drop(shim_path);
    // SAFETY: the symbols have the signatures `shim.cpp` defines.
    let api = unsafe {
        let version: libloading::os::unix::Symbol<unsafe extern "C" fn() -> *const c_char> = shim
            .get(b"vx_ct2_headers_version")
            .map_err(|e| e.to_string())?;
        let v = CStr::from_ptr(version()).to_string_lossy().into_owned();
        if v != HEADERS_VERSION {
            return Err(format!(
                "the CTranslate2 shim was built for {v}, not {HEADERS_VERSION}"
            ));
        }
        Api {
            load: *shim.get(b"vx_ct2_load").map_err(|e| e.to_string())?,
            free_model: *shim.get(b"vx_ct2_free_model").map_err(|e| e.to_string())?,
            replica: *shim.get(b"vx_ct2_replica").map_err(|e| e.to_string())?,
            free_replica: *shim
                .get(b"vx_ct2_free_replica")
                .map_err(|e| e.to_string())?,
            transcribe: *shim.get(b"vx_ct2_transcribe").map_err(|e| e.to_string())?,
        }
    };
    // both stay mapped for the life of the process
    std::mem::forget(shim);
    std::mem::forget(ct2);
    Ok(api)
}

/// The embedded shim as a file the loader can open: an anonymous memory
/// file (nothing is written to disk), closed once loaded.
#[cfg(ct2_shim)]
fn shim_file() -> Result<(std::fs::File, PathBuf), String> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name and valid flags; the descriptor
    // returned is owned by the `File` made from it.
    let fd = unsafe { libc::memfd_create(c"voxline-ct2-shim".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!(
            "no memory file for the CTranslate2 shim ({})",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(SHIM)
        .map_err(|e| format!("the CTranslate2 shim could not be written to memory ({e})"))?;
    Ok((file, PathBuf::from(format!("/proc/self/fd/{fd}"))))
}
