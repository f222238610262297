//! One GGUF file, memory-mapped: its metadata (typed getters whose errors name the file and
//! key) and its tensors' bytes, every range checked against the file's length when opened.
//!
//! The header is parsed by candle's reader (`candle_core::quantized::gguf_file`), which reverses
//! GGUF's dimension order: shapes here are row-major, `(rows, cols)` for a matrix.

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use glance_core::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A tensor as stored in a GGUF file.
#[derive(Debug, Clone)]
pub struct StoredTensor {
    pub dtype: GgmlDType,
    /// Row-major dims (`(rows, cols)` for a matrix).
    pub shape: Vec<usize>,
    /// Byte range in the file.
    pub start: usize,
    pub len: usize,
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    pub metadata: HashMap<String, Value>,
    pub tensors: HashMap<String, StoredTensor>,
    pub map: Arc<memmap2::Mmap>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

/// Bytes one tensor of `dtype` with `elems` values takes, if whole blocks.
pub fn byte_len(dtype: GgmlDType, elems: usize) -> Option<usize> {
    let block = dtype.block_size();
    elems
        .is_multiple_of(block)
        .then(|| (elems / block).checked_mul(dtype.type_size()))
        .flatten()
}

impl GgufFile {
    /// Opens and checks `path`: a GGUF header candle's reader parses, and every tensor's bytes
    /// inside the file (a truncated download is named with the first tensor it cuts).
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::Config(format!("{}: {reason}", path.display()));
        if !path.is_file() {
            return Err(Error::MissingFile {
                dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
                what: format!(
                    "GGUF file {} (no such file)",
                    path.file_name().unwrap_or_default().to_string_lossy()
                ),
            });
        }
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: a read-only map of a file glance never writes while it is open.
        let map =
            unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| Error::io(path, e))?;
        let mut cursor = std::io::Cursor::new(&map[..]);
        let content = Content::read(&mut cursor)
            .map_err(|e| bad(format!("not a readable GGUF file ({e})")))?;
        let data = usize::try_from(content.tensor_data_offset)
            .map_err(|_| bad("tensor data offset out of range".into()))?;
        let mut tensors = HashMap::new();
        for (name, info) in content.tensor_infos {
            let shape = info.shape.dims().to_vec();
            let elems = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| bad(format!("tensor `{name}` has an absurd shape {shape:?}")))?;
            let len = byte_len(info.ggml_dtype, elems).ok_or_else(|| {
                bad(format!(
                    "tensor `{name}` ({:?}, {shape:?}) is not whole blocks of {}",
                    info.ggml_dtype,
                    info.ggml_dtype.block_size()
                ))
            })?;
            let start = usize::try_from(info.offset)
                .ok()
                .and_then(|o| o.checked_add(data))
                .filter(|s| s.checked_add(len).is_some_and(|end| end <= map.len()))
                .ok_or_else(|| {
                    bad(format!(
                        "truncated: tensor `{name}` needs {len} bytes at offset {} but the file \
                         has {} bytes",
                        data as u64 + info.offset,
                        map.len()
                    ))
                })?;
            tensors.insert(
                name,
                StoredTensor {
                    dtype: info.ggml_dtype,
                    shape,
                    start,
                    len,
                },
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            metadata: content.metadata,
            tensors,
            map: Arc::new(map),
        })
    }

    fn bad(&self, key: &str, what: &str) -> Error {
        Error::Config(format!("{}: metadata `{key}` {what}", self.path.display()))
    }

    pub fn has(&self, key: &str) -> bool {
        self.metadata.contains_key(key)
    }

    /// The string `key`, if present.
    pub fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.bad(key, "must be a string")),
        }
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.str_opt(key)?
            .ok_or_else(|| self.bad(key, "is missing"))
    }

    /// An unsigned integer of any width, if present.
    pub fn uint_opt(&self, key: &str) -> Result<Option<u64>> {
        let v = match self.metadata.get(key) {
            None => return Ok(None),
            Some(v) => v,
        };
        int_of(v)
            .and_then(|i| u64::try_from(i).ok())
            .map(Some)
            .ok_or_else(|| self.bad(key, "must be a non-negative integer"))
    }

    /// A size (`usize`), if present.
    pub fn size_opt(&self, key: &str) -> Result<Option<usize>> {
        self.uint_opt(key)?
            .map(|v| usize::try_from(v).map_err(|_| self.bad(key, "is out of range")))
            .transpose()
    }

    pub fn size(&self, key: &str) -> Result<usize> {
        self.size_opt(key)?
            .ok_or_else(|| self.bad(key, "is missing"))
    }

    /// A float (f32 or f64), if present.
    pub fn float_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(widen(*x))),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(_) => Err(self.bad(key, "must be a number")),
        }
    }

    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.bad(key, "must be a boolean")),
        }
    }

    /// An array, if present.
    pub fn array_opt(&self, key: &str) -> Result<Option<&[Value]>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(_) => Err(self.bad(key, "must be an array")),
        }
    }

    /// An array of strings, if present.
    pub fn strings_opt(&self, key: &str) -> Result<Option<Vec<&str>>> {
        self.array_opt(key)?
            .map(|a| {
                a.iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s.as_str()),
                        _ => Err(self.bad(key, "must hold strings")),
                    })
                    .collect()
            })
            .transpose()
    }

    /// An array of numbers as f64, if present.
    pub fn floats_opt(&self, key: &str) -> Result<Option<Vec<f64>>> {
        self.array_opt(key)?
            .map(|a| {
                a.iter()
                    .map(|v| match v {
                        Value::F32(x) => Ok(widen(*x)),
                        Value::F64(x) => Ok(*x),
                        other => int_of(other)
                            .map(|i| i as f64)
                            .ok_or_else(|| self.bad(key, "must hold numbers")),
                    })
                    .collect()
            })
            .transpose()
    }

    /// An array of integers, if present.
    pub fn ints_opt(&self, key: &str) -> Result<Option<Vec<i64>>> {
        self.array_opt(key)?
            .map(|a| {
                a.iter()
                    .map(|v| int_of(v).ok_or_else(|| self.bad(key, "must hold integers")))
                    .collect()
            })
            .transpose()
    }

    /// The bytes of a stored tensor.
    pub fn bytes(&self, t: &StoredTensor) -> &[u8] {
        &self.map[t.start..t.start + t.len]
    }
}

/// An integer value of any width (`None` for other types, or a u64 beyond i64).
fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::U8(x) => Some(i64::from(*x)),
        Value::U16(x) => Some(i64::from(*x)),
        Value::U32(x) => Some(i64::from(*x)),
        Value::U64(x) => i64::try_from(*x).ok(),
        Value::I8(x) => Some(i64::from(*x)),
        Value::I16(x) => Some(i64::from(*x)),
        Value::I32(x) => Some(i64::from(*x)),
        Value::I64(x) => Some(*x),
        _ => None,
    }
}

/// An f32 from the file as the decimal it was written from: the shortest decimal that rounds to
/// it, read as f64 (`1e-5` stays `1e-5`, as in the `config.json` it came from, rather than
/// becoming 0.0000099999997).
fn widen(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}
