//! Reader for CTranslate2 `model.bin` files (binary version 6).
//!
//! Layout (little-endian): `u32` binary version; a string spec name; `u32`
//! spec revision; `u32` variable count; per variable: string name, `u8`
//! rank, `rank × u32` dims, `u8` dtype, `u32` byte count, bytes; then `u32`
//! alias count and `(alias, target)` string pairs. Strings are a `u16`
//! length that includes a trailing NUL, then the bytes.

use std::collections::BTreeMap;
use std::path::Path;

use crate::ModelError;

/// The CTranslate2 binary version this reader understands.
pub const SUPPORTED_BINARY_VERSION: u32 = 6;

/// Element type of a CTranslate2 variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 8-bit signed integer (quantised weights).
    I8,
    /// 16-bit signed integer.
    I16,
    /// 32-bit signed integer.
    I32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
}

impl DType {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::F32,
            1 => Self::I8,
            2 => Self::I16,
            3 => Self::I32,
            4 => Self::F16,
            5 => Self::BF16,
            _ => return None,
        })
    }

    /// Size of one element in bytes.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            Self::I8 => 1,
            Self::I16 | Self::F16 | Self::BF16 => 2,
            Self::F32 | Self::I32 => 4,
        }
    }
}

/// One named tensor (or scalar, rank 0) of a CTranslate2 model.
#[derive(Debug, Clone, PartialEq)]
pub struct Variable {
    /// Dimensions, outermost first (row-major, as stored).
    pub dims: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Raw little-endian element bytes.
    pub data: Vec<u8>,
}

impl Variable {
    /// Number of elements (1 for a scalar).
    #[must_use]
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether the variable has no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of an integer scalar (rank 0, i8/i16/i32).
    #[must_use]
    pub fn scalar_int(&self) -> Option<i64> {
        if !self.dims.is_empty() {
            return None;
        }
        match self.dtype {
            DType::I8 => self.data.first().map(|&b| i64::from(b as i8)),
            DType::I16 => Some(i64::from(i16::from_le_bytes(
                self.data.get(..2)?.try_into().ok()?,
            ))),
            DType::I32 => Some(i64::from(i32::from_le_bytes(
                self.data.get(..4)?.try_into().ok()?,
            ))),
            _ => None,
        }
    }

    /// Elements converted to `f32` (from f32, f16 or bf16).
    ///
    /// # Errors
    /// [`ModelError::Convert`] for integer (quantised) variables.
    pub fn to_f32(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        let chunks = self.data.chunks_exact(self.dtype.size());
        Ok(match self.dtype {
            DType::F32 => chunks.map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            DType::F16 => chunks.map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            DType::BF16 => chunks.map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            other => {
                return Err(ModelError::Convert(format!(
                    "variable {name} is {other:?}; quantised CTranslate2 models are not supported — export the model as float16 or float32"
                )))
            }
        })
    }
}

/// A parsed CTranslate2 model: its spec and its variables by name (aliases resolved).
#[derive(Debug, Clone, PartialEq)]
pub struct Ct2Model {
    /// Spec name, e.g. `WhisperSpec`.
    pub spec: String,
    /// Spec revision.
    pub revision: u32,
    /// Variables by name; aliases appear as copies of their target.
    pub variables: BTreeMap<String, Variable>,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ModelError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            ModelError::Format(format!(
                "CTranslate2 model truncated: needed {n} bytes for {what} at offset {}, file has {}",
                self.pos,
                self.buf.len()
            ))
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, ModelError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, ModelError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn string(&mut self, what: &str) -> Result<String, ModelError> {
        let n = usize::from(self.u16(what)?);
        let b = self.take(n, what)?;
        let b = b.strip_suffix(&[0]).unwrap_or(b);
        String::from_utf8(b.to_vec())
            .map_err(|_| ModelError::Format(format!("CTranslate2 model: {what} is not UTF-8")))
    }
}

impl Ct2Model {
    /// Reads and parses a `model.bin` file.
    ///
    /// # Errors
    /// [`ModelError::Io`] if unreadable, [`ModelError::Format`] if malformed.
    pub fn read(path: &Path) -> Result<Self, ModelError> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
        Self::parse(&bytes)
    }

    /// Parses the bytes of a `model.bin` file.
    ///
    /// # Errors
    /// [`ModelError::Format`] on a wrong version, a truncated file, an
    /// unknown dtype, a byte count that disagrees with the dims, a dangling
    /// alias or trailing garbage.
    pub fn parse(bytes: &[u8]) -> Result<Self, ModelError> {
        let mut c = Cursor { buf: bytes, pos: 0 };
        let version = c.u32("binary version")?;
        if version != SUPPORTED_BINARY_VERSION {
            return Err(ModelError::Format(format!(
                "CTranslate2 binary version {version} is not supported (expected {SUPPORTED_BINARY_VERSION}); is this a CTranslate2 model.bin?"
            )));
        }
        let spec = c.string("spec name")?;
        let revision = c.u32("spec revision")?;
        let count = c.u32("variable count")?;
        let mut variables = BTreeMap::new();
        for i in 0..count {
            let name = c.string("variable name")?;
            let rank = c.u8("rank")?;
            let mut dims = Vec::with_capacity(usize::from(rank));
            for _ in 0..rank {
                dims.push(c.u32("dimension")? as usize);
            }
            let code = c.u8("dtype")?;
            let dtype = DType::from_code(code).ok_or_else(|| {
                ModelError::Format(format!(
                    "variable {name} (#{i}) has unknown dtype code {code}"
                ))
            })?;
            let nbytes = c.u32("byte count")? as usize;
            let expected = dims
                .iter()
                .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| {
                    ModelError::Format(format!("variable {name}: dims {dims:?} overflow"))
                })?;
            if nbytes != expected {
                return Err(ModelError::Format(format!(
                    "variable {name}: {nbytes} bytes but dims {dims:?} of {dtype:?} need {expected}"
                )));
            }
            let data = c.take(nbytes, "variable data")?.to_vec();
            if variables
                .insert(name.clone(), Variable { dims, dtype, data })
                .is_some()
            {
                return Err(ModelError::Format(format!("variable {name} appears twice")));
            }
        }
        let aliases = c.u32("alias count")?;
        for _ in 0..aliases {
            let alias = c.string("alias name")?;
            let target = c.string("alias target")?;
            let var = variables.get(&target).cloned().ok_or_else(|| {
                ModelError::Format(format!("alias {alias} points at missing variable {target}"))
            })?;
            variables.insert(alias, var);
        }
        if c.pos != bytes.len() {
            return Err(ModelError::Format(format!(
                "CTranslate2 model has {} unexpected trailing bytes",
                bytes.len() - c.pos
            )));
        }
        Ok(Self {
            spec,
            revision,
            variables,
        })
    }

    /// Looks up a variable.
    ///
    /// # Errors
    /// [`ModelError::Convert`] naming the variable when it is absent.
    pub fn get(&self, name: &str) -> Result<&Variable, ModelError> {
        self.variables
            .get(name)
            .ok_or_else(|| ModelError::Convert(format!("CTranslate2 model lacks variable {name}")))
    }
}

/// Writes a CTranslate2 `model.bin` (used to build test inputs and by the fuzz corpus).
#[must_use]
pub fn encode(
    spec: &str,
    revision: u32,
    vars: &[(&str, &[usize], DType, &[u8])],
    aliases: &[(&str, &str)],
) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        let n = u16::try_from(s.len() + 1).unwrap_or(u16::MAX);
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }
    let code = |d: DType| match d {
        DType::F32 => 0u8,
        DType::I8 => 1,
        DType::I16 => 2,
        DType::I32 => 3,
        DType::F16 => 4,
        DType::BF16 => 5,
    };
    let mut out = Vec::new();
    out.extend_from_slice(&SUPPORTED_BINARY_VERSION.to_le_bytes());
    string(&mut out, spec);
    out.extend_from_slice(&revision.to_le_bytes());
    out.extend_from_slice(&(vars.len() as u32).to_le_bytes());
    for (name, dims, dtype, data) in vars {
        string(&mut out, name);
        out.push(dims.len() as u8);
        for d in *dims {
            out.extend_from_slice(&(*d as u32).to_le_bytes());
        }
        out.push(code(*dtype));
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    }
    out.extend_from_slice(&(aliases.len() as u32).to_le_bytes());
    for (a, t) in aliases {
        string(&mut out, a);
        string(&mut out, t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16s(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect()
    }

    #[test]
    fn parses_variables_scalars_and_aliases() {
        let w = f16s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let heads = 6i16.to_le_bytes();
        let bytes = encode(
            "WhisperSpec",
            3,
            &[
                ("a/weight", &[2, 3], DType::F16, &w),
                ("enc/num_heads", &[], DType::I16, &heads),
            ],
            &[("b/weight", "a/weight")],
        );
        let m = Ct2Model::parse(&bytes).unwrap();
        assert_eq!(m.spec, "WhisperSpec");
        assert_eq!(m.revision, 3);
        let a = m.get("a/weight").unwrap();
        assert_eq!(a.dims, vec![2, 3]);
        assert_eq!(a.to_f32("a").unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(m.get("b/weight").unwrap(), a);
        assert_eq!(m.get("enc/num_heads").unwrap().scalar_int(), Some(6));
        assert!(m.get("missing").is_err());
    }

    #[test]
    fn rejects_malformed_inputs() {
        let w = f16s(&[1.0, 2.0]);
        let good = encode("S", 1, &[("x", &[2], DType::F16, &w)], &[]);
        // Every strict prefix is a truncation error, never a panic.
        for n in 0..good.len() {
            assert!(
                matches!(Ct2Model::parse(&good[..n]), Err(ModelError::Format(_))),
                "prefix {n}"
            );
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(Ct2Model::parse(&trailing).is_err());
        let mut bad_version = good.clone();
        bad_version[0] = 5;
        let err = Ct2Model::parse(&bad_version).unwrap_err().to_string();
        assert!(err.contains("binary version 5"), "{err}");
        // byte count disagreeing with dims
        let wrong = encode("S", 1, &[("x", &[3], DType::F16, &w)], &[]);
        assert!(Ct2Model::parse(&wrong)
            .unwrap_err()
            .to_string()
            .contains("need 6"));
        let dangling = encode("S", 1, &[("x", &[2], DType::F16, &w)], &[("y", "z")]);
        assert!(Ct2Model::parse(&dangling)
            .unwrap_err()
            .to_string()
            .contains("missing variable z"));
    }

    #[test]
    fn quantised_variables_are_refused_by_name() {
        let v = Variable {
            dims: vec![2],
            dtype: DType::I8,
            data: vec![1, 2],
        };
        let err = v.to_f32("enc/w").unwrap_err().to_string();
        assert!(err.contains("enc/w") && err.contains("quantised"), "{err}");
    }

    #[test]
    fn converts_f32_and_bf16() {
        let f: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let v = Variable {
            dims: vec![2],
            dtype: DType::F32,
            data: f,
        };
        assert_eq!(v.to_f32("v").unwrap(), vec![1.5, -2.0]);
        let b: Vec<u8> = [0.5f32, 4.0]
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect();
        let v = Variable {
            dims: vec![2],
            dtype: DType::BF16,
            data: b,
        };
        assert_eq!(v.to_f32("v").unwrap(), vec![0.5, 4.0]);
    }
}
