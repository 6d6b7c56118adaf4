//! Telling model files apart before an engine sees them.
//!
//! whisper.cpp's loader trusts the sizes in the file it reads, so a
//! truncated or foreign file can crash it. [`check_whisper_model`] walks
//! the whole ggml layout first; [`check_llm_model`] checks the GGUF header
//! (llama.cpp validates the rest itself and fails cleanly).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::whisper_ggml::GGML_MAGIC;
use crate::ModelError;

/// What a model file is, judged by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// whisper.cpp's legacy ggml format (a speech model).
    WhisperGgml,
    /// GGUF (a llama.cpp language model).
    Gguf,
    /// A CTranslate2 `model.bin` (needs conversion).
    Ct2,
    /// Anything else.
    Unknown,
}

impl ModelKind {
    /// A phrase for error messages.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::WhisperGgml => "a whisper.cpp ggml speech model",
            Self::Gguf => "a GGUF language model",
            Self::Ct2 => "a CTranslate2 model (convert it with `voxline models fetch` or bring a whisper.cpp ggml file)",
            Self::Unknown => "not a model file voxline knows",
        }
    }
}

/// Classifies a file by its magic number.
///
/// # Errors
/// [`ModelError::Io`] when the file cannot be opened or read.
pub fn detect(path: &Path) -> Result<ModelKind, ModelError> {
    let mut f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut head = [0u8; 4];
    let mut n = 0;
    while n < 4 {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(ModelError::io(path, e)),
        }
    }
    if n < 4 {
        return Ok(ModelKind::Unknown);
    }
    let magic = u32::from_le_bytes(head);
    Ok(if magic == GGML_MAGIC {
        ModelKind::WhisperGgml
    } else if &head == b"GGUF" {
        ModelKind::Gguf
    } else if magic == crate::ct2::SUPPORTED_BINARY_VERSION {
        ModelKind::Ct2
    } else {
        ModelKind::Unknown
    })
}

fn read_i32(f: &mut impl Read) -> std::io::Result<i32> {
    let mut b = [0u8; 4];
    f.read_exact(&mut b)?;
    Ok(i32::from_le_bytes(b))
}

/// Bytes taken by `n` elements of a ggml type, for the types whisper models use.
fn ggml_type_bytes(ty: i32, n: u64) -> Option<u64> {
    let block = |size: u64, per: u64| n.is_multiple_of(per).then_some(n / per * size);
    match ty {
        0 => Some(n * 4),   // f32
        1 => Some(n * 2),   // f16
        2 => block(18, 32), // q4_0
        3 => block(20, 32), // q4_1
        6 => block(22, 32), // q5_0
        7 => block(24, 32), // q5_1
        8 => block(34, 32), // q8_0
        _ => None,
    }
}

/// Checks that `path` is a complete whisper.cpp ggml model: right magic,
/// sane hyper-parameters, and every tensor's header and data inside the file.
///
/// # Errors
/// [`ModelError::WrongKind`] for a GGUF or other file, [`ModelError::Format`]
/// for a truncated or inconsistent one, [`ModelError::Io`] if unreadable.
pub fn check_whisper_model(path: &Path) -> Result<(), ModelError> {
    let kind = detect(path)?;
    if kind != ModelKind::WhisperGgml {
        return Err(ModelError::WrongKind {
            path: path.to_path_buf(),
            expected: "a whisper.cpp ggml speech model",
            found: kind.describe().to_string(),
            hint: "pass a whisper model (e.g. models/ggml-tiny.en.bin) to --whisper-model and a GGUF to --llm-model",
        });
    }
    let len = std::fs::metadata(path)
        .map_err(|e| ModelError::io(path, e))?
        .len();
    let f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut f = std::io::BufReader::new(f);
    let bad = |what: String| {
        ModelError::Format(format!(
            "{}: not a complete whisper model: {what} — fetch it again or bring a whole file",
            path.display()
        ))
    };
    let walk = |f: &mut std::io::BufReader<std::fs::File>| -> std::io::Result<Result<(), String>> {
        f.seek(SeekFrom::Start(4))?;
        let mut hp = [0i32; 11];
        for v in &mut hp {
            *v = read_i32(f)?;
        }
        if hp[..10].iter().any(|&v| v <= 0 || v > 1_000_000) {
            return Ok(Err(format!("implausible hyper-parameters {hp:?}")));
        }
        let (n_mel, n_fft) = (read_i32(f)?, read_i32(f)?);
        if !(1..=1024).contains(&n_mel) || !(1..=4096).contains(&n_fft) {
            return Ok(Err(format!(
                "implausible mel filterbank size {n_mel}×{n_fft}"
            )));
        }
        f.seek(SeekFrom::Current(i64::from(n_mel) * i64::from(n_fft) * 4))?;
        let n_vocab = read_i32(f)?;
        if !(0..=1_000_000).contains(&n_vocab) {
            return Ok(Err(format!("implausible vocabulary size {n_vocab}")));
        }
        for _ in 0..n_vocab {
            let l = read_i32(f)?;
            if !(0..=1024).contains(&l) {
                return Ok(Err(format!("implausible token length {l}")));
            }
            f.seek(SeekFrom::Current(i64::from(l)))?;
        }
        let mut tensors = 0;
        loop {
            let pos = f.stream_position()?;
            if pos == len {
                break;
            }
            let (n_dims, name_len, ty) = (read_i32(f)?, read_i32(f)?, read_i32(f)?);
            if !(1..=4).contains(&n_dims) || !(1..=512).contains(&name_len) {
                return Ok(Err(format!("bad tensor header at byte {pos}")));
            }
            let mut n: u64 = 1;
            for _ in 0..n_dims {
                let d = read_i32(f)?;
                if d <= 0 {
                    return Ok(Err(format!("bad tensor dimension {d} at byte {pos}")));
                }
                n = n.saturating_mul(d as u64);
            }
            f.seek(SeekFrom::Current(i64::from(name_len)))?;
            let Some(bytes) = ggml_type_bytes(ty, n) else {
                // A tensor type this check does not size: trust the engine from here.
                return Ok(Ok(()));
            };
            let end = f.stream_position()? + bytes;
            if end > len {
                return Ok(Err(format!(
                    "tensor at byte {pos} needs {bytes} bytes, the file ends {} bytes short",
                    end - len
                )));
            }
            f.seek(SeekFrom::Start(end))?;
            tensors += 1;
        }
        if tensors == 0 {
            return Ok(Err("no tensors".into()));
        }
        Ok(Ok(()))
    };
    match walk(&mut f) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(what)) => Err(bad(what)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(bad("the file ends early".into()))
        }
        Err(e) => Err(ModelError::io(path, e)),
    }
}

/// Checks that `path` is a GGUF file (magic and a known version).
///
/// # Errors
/// [`ModelError::WrongKind`] for a whisper model or other file,
/// [`ModelError::Format`] for an unsupported GGUF version, [`ModelError::Io`] if unreadable.
pub fn check_llm_model(path: &Path) -> Result<(), ModelError> {
    let kind = detect(path)?;
    if kind != ModelKind::Gguf {
        return Err(ModelError::WrongKind {
            path: path.to_path_buf(),
            expected: "a GGUF language model",
            found: kind.describe().to_string(),
            hint: "pass a GGUF file (e.g. models/SmolLM2-135M-Instruct.Q4_1.gguf) to --llm-model and a whisper model to --whisper-model",
        });
    }
    let mut f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut head = [0u8; 24];
    f.read_exact(&mut head).map_err(|_| {
        ModelError::Format(format!(
            "{}: GGUF header is truncated — fetch the file again",
            path.display()
        ))
    })?;
    let version = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if !(2..=3).contains(&version) {
        return Err(ModelError::Format(format!(
            "{}: GGUF version {version} is not supported (2 or 3 are)",
            path.display()
        )));
    }
    Ok(())
}

/// Bytes of one GGUF metadata value of a fixed-size type, `None` for strings and arrays.
fn gguf_fixed_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1), // u8, i8, bool
        2 | 3 => Some(2),     // u16, i16
        4..=6 => Some(4),     // u32, i32, f32
        10..=12 => Some(8),   // u64, i64, f64
        _ => None,
    }
}

/// A small reader over GGUF metadata.
struct Gguf<R> {
    r: R,
}

impl<R: Read + Seek> Gguf<R> {
    fn bytes<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b)?;
        Ok(b)
    }
    fn u32(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn bad(what: &str) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
    }
    fn skip(&mut self, n: u64) -> std::io::Result<()> {
        let n = i64::try_from(n).map_err(|_| Self::bad("implausible length"))?;
        self.r.seek(SeekFrom::Current(n)).map(|_| ())
    }
    fn string(&mut self) -> std::io::Result<String> {
        let n = self.u64()?;
        if n > 1 << 20 {
            return Err(Self::bad("implausible string length"));
        }
        let mut b = vec![0u8; n as usize];
        self.r.read_exact(&mut b)?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    /// An unsigned integer value of type `ty`, or `None` (skipped) for any other type.
    fn integer(&mut self, ty: u32) -> std::io::Result<Option<u64>> {
        Ok(match ty {
            0 => Some(u64::from(self.bytes::<1>()?[0])),
            2 => Some(u64::from(u16::from_le_bytes(self.bytes()?))),
            4 => Some(u64::from(self.u32()?)),
            5 => u64::try_from(i32::from_le_bytes(self.bytes()?)).ok(),
            10 => Some(self.u64()?),
            11 => u64::try_from(i64::from_le_bytes(self.bytes()?)).ok(),
            _ => {
                self.skip_value(ty)?;
                None
            }
        })
    }
    fn skip_value(&mut self, ty: u32) -> std::io::Result<()> {
        if let Some(n) = gguf_fixed_size(ty) {
            return self.skip(n);
        }
        match ty {
            8 => {
                let n = self.u64()?;
                self.skip(n)
            }
            9 => {
                let (elem, count) = (self.u32()?, self.u64()?);
                if let Some(n) = gguf_fixed_size(elem) {
                    return self.skip(n.checked_mul(count).ok_or_else(|| Self::bad("overflow"))?);
                }
                if count > 1 << 26 {
                    return Err(Self::bad("implausible array length"));
                }
                for _ in 0..count {
                    self.skip_value(elem)?;
                }
                Ok(())
            }
            _ => Err(Self::bad("unknown metadata value type")),
        }
    }
}

/// The context length a GGUF language model was trained with: its
/// `<general.architecture>.context_length` metadata (llama.cpp's
/// `n_ctx_train`). `Ok(None)` when the file does not record one.
///
/// # Errors
/// As [`check_llm_model`], and [`ModelError::Format`] when the metadata is
/// truncated or malformed.
pub fn gguf_context_length(path: &Path) -> Result<Option<u64>, ModelError> {
    check_llm_model(path)?;
    let f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut g = Gguf {
        r: std::io::BufReader::new(f),
    };
    let read = |g: &mut Gguf<std::io::BufReader<std::fs::File>>| -> std::io::Result<Option<u64>> {
        g.skip(8)?; // magic, version (checked above)
        let _n_tensors = g.u64()?;
        let n_kv = g.u64()?;
        if n_kv > 1 << 20 {
            return Err(Gguf::<std::io::BufReader<std::fs::File>>::bad(
                "implausible metadata count",
            ));
        }
        let mut arch: Option<String> = None;
        let mut lengths: Vec<(String, u64)> = Vec::new();
        for _ in 0..n_kv {
            let key = g.string()?;
            let ty = g.u32()?;
            if key == "general.architecture" && ty == 8 {
                arch = Some(g.string()?);
            } else if key.ends_with(".context_length") {
                if let Some(v) = g.integer(ty)? {
                    lengths.push((key, v));
                }
            } else {
                g.skip_value(ty)?;
            }
            if let Some(a) = &arch {
                let want = format!("{a}.context_length");
                if let Some((_, v)) = lengths.iter().find(|(k, _)| *k == want) {
                    return Ok(Some(*v));
                }
            }
        }
        Ok(None)
    };
    read(&mut g).map_err(|e| {
        ModelError::Format(format!(
            "{}: the GGUF metadata cannot be read ({}) — fetch the file again",
            path.display(),
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "the file ends early".to_owned()
            } else {
                e.to_string()
            }
        ))
    })
}

/// Checks that `lib` is a whole shared library for this machine before it
/// is mapped: an ELF file of this architecture whose every loadable
/// segment, and its section headers, lie within the file. A copy or download cut short passes the
/// dynamic loader's own checks and is mapped anyway; the first page
/// touched past its end then kills the process with SIGBUS.
///
/// # Errors
/// What is wrong with it, in words.
pub fn check_shared_library(lib: &Path) -> Result<(), String> {
    use object::elf::{FileHeader64, ET_DYN, PT_LOAD};
    use object::read::elf::{FileHeader, ProgramHeader};
    let data = std::fs::read(lib).map_err(|e| format!("it cannot be read: {e}"))?;
    let data = data.as_slice();
    let len = data.len() as u64;
    let header = FileHeader64::<object::Endianness>::parse(data)
        .map_err(|e| format!("it is not a 64-bit ELF library ({e})"))?;
    let endian = header
        .endian()
        .map_err(|e| format!("it is not a 64-bit ELF library ({e})"))?;
    if header.e_type(endian) != ET_DYN {
        return Err("it is not a shared library".into());
    }
    let host = if cfg!(target_arch = "x86_64") {
        Some(object::elf::EM_X86_64)
    } else if cfg!(target_arch = "aarch64") {
        Some(object::elf::EM_AARCH64)
    } else {
        None
    };
    let machine = header.e_machine(endian);
    if host.is_some_and(|h| h != machine) {
        return Err(format!(
            "it is built for another machine (ELF machine {machine})"
        ));
    }
    let cut = |end: u64| format!("it is cut short: it has {len} bytes, its headers say {end}");
    let headers = header.program_headers(endian, data).map_err(|_| {
        cut(header.e_phoff(endian).saturating_add(
            u64::from(header.e_phnum(endian)) * u64::from(header.e_phentsize(endian)),
        ))
    })?;
    for ph in headers.iter().filter(|ph| ph.p_type(endian) == PT_LOAD) {
        let end = ph.p_offset(endian).saturating_add(ph.p_filesz(endian));
        if end > len {
            return Err(cut(end));
        }
    }
    let sections = header
        .e_shoff(endian)
        .saturating_add(u64::from(header.e_shnum(endian)) * u64::from(header.e_shentsize(endian)));
    if sections > len {
        return Err(cut(sections));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 file with the given metadata, written by hand.
    fn gguf(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in kvs {
            b.extend_from_slice(&(k.len() as u64).to_le_bytes());
            b.extend_from_slice(k.as_bytes());
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(v);
        }
        b
    }

    fn string(s: &str) -> Vec<u8> {
        let mut b = (s.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(s.as_bytes());
        b
    }

    #[test]
    fn reads_the_architectures_context_length_past_other_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let mut tokens = 8u32.to_le_bytes().to_vec(); // array of strings
        tokens.extend_from_slice(&3u64.to_le_bytes());
        for t in ["a", "bb", "<s>"] {
            tokens.extend(string(t));
        }
        let mut floats = 6u32.to_le_bytes().to_vec(); // array of f32
        floats.extend_from_slice(&2u64.to_le_bytes());
        floats.extend_from_slice(&[0u8; 8]);
        let file = dir.path().join("m.gguf");
        std::fs::write(
            &file,
            gguf(&[
                ("other.context_length", 4, 99u32.to_le_bytes().to_vec()),
                ("tokenizer.ggml.tokens", 9, tokens),
                ("tokenizer.ggml.scores", 9, floats),
                ("general.name", 8, string("tiny")),
                ("general.architecture", 8, string("llama")),
                ("llama.context_length", 4, 8192u32.to_le_bytes().to_vec()),
            ]),
        )
        .unwrap();
        assert_eq!(gguf_context_length(&file).unwrap(), Some(8192));
        // without the key: unknown
        std::fs::write(&file, gguf(&[("general.architecture", 8, string("llama"))])).unwrap();
        assert_eq!(gguf_context_length(&file).unwrap(), None);
        // cut inside the metadata: a format error naming the file
        let full = gguf(&[("general.architecture", 8, string("llama"))]);
        std::fs::write(&file, &full[..full.len() - 2]).unwrap();
        let e = gguf_context_length(&file).unwrap_err().to_string();
        assert!(e.contains("m.gguf") && e.contains("ends early"), "{e}");
    }
}
