//! GGUF, the file format of llama.cpp, Ollama and LM Studio: a header, typed metadata (the
//! architecture's hyperparameters, the tokenizer's vocabulary and merges, the chat template),
//! tensor infos, then the tensor data, aligned, which this reader memory-maps.
//!
//! Versions 2 and 3 (little-endian) are read. Every count, length and offset is checked against
//! the file before it is used, so a truncated or corrupt file is a [`GgufError`] naming what is
//! wrong, never a panic or an allocation the size of a bad count. Tensor values come out as f32
//! through [`quant::dequantize`], which follows ggml's reference dequantizers bit for bit.
//!
//! Example:
//! ```no_run
//! let file = gguf::Gguf::open(std::path::Path::new("model.gguf")).unwrap();
//! println!("{}", file.architecture().unwrap());
//! let embed = file.tensor("token_embd.weight").unwrap();
//! let values = file.dequantize(embed).unwrap();
//! assert_eq!(values.len() as u64, embed.numel());
//! ```

pub mod hf;
pub mod quant;
mod read;

pub use quant::TensorType;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What can be wrong with a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file (it starts with {magic:?}, not \"GGUF\")")]
    Magic { path: PathBuf, magic: [u8; 4] },
    #[error("{path}: GGUF version {version} is not read (versions 2 and 3 are)")]
    Version { path: PathBuf, version: u32 },
    #[error("{path}: truncated or corrupt: {what}")]
    Corrupt { path: PathBuf, what: String },
    #[error("{path}: tensor {tensor}: {what}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        what: String,
    },
    #[error("{path}: metadata {key}: {what}")]
    Metadata {
        path: PathBuf,
        key: String,
        what: String,
    },
}

pub type Result<T> = std::result::Result<T, GgufError>;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// An integer value of any width, if it is one and not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A float value (either width), or an integer as a float.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's name, shape and place in the data section.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml's order: `dims[0]` is the contiguous (innermost) dimension, the row length.
    pub dims: Vec<u64>,
    pub kind: TensorType,
    /// Bytes from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Rows of `dims[0]` values (the product of the other dimensions).
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes of its data in the file.
    pub fn bytes(&self) -> u64 {
        self.kind.row_bytes(self.dims[0]) * self.rows()
    }
}

/// An open GGUF file: metadata and tensor infos parsed, the data memory-mapped.
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    map: memmap2::Mmap,
    /// Where the data section starts in the file.
    data_start: u64,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl Gguf {
    /// Opens and checks `path`: header, metadata, tensor infos, and that every tensor's data lies
    /// inside the file.
    pub fn open(path: &Path) -> Result<Gguf> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; a file truncated by another
        // process while mapped is the one hazard, as for every mmap-based model loader.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let parsed = read::parse(path, &map)?;
        let data_len = map.len() as u64 - parsed.data_start;
        for t in &parsed.tensors {
            let end = t.offset.checked_add(t.bytes());
            if end.is_none_or(|e| e > data_len) {
                return Err(GgufError::Tensor {
                    path: path.to_path_buf(),
                    tensor: t.name.clone(),
                    what: format!(
                        "its {} bytes at offset {} run past the end of the file ({} data bytes)",
                        t.bytes(),
                        t.offset,
                        data_len
                    ),
                });
            }
        }
        Ok(Gguf {
            path: path.to_path_buf(),
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            map,
            data_start: parsed.data_start,
        })
    }

    /// `general.architecture` (llama, qwen2, gpt2, ...).
    pub fn architecture(&self) -> Result<&str> {
        self.get("general.architecture")?
            .as_str()
            .ok_or_else(|| self.bad_meta("general.architecture", "not a string"))
    }

    /// The value under `key`, or an error naming the missing key.
    pub fn get(&self, key: &str) -> Result<&Value> {
        self.metadata
            .get(key)
            .ok_or_else(|| self.bad_meta(key, "missing"))
    }

    /// An integer under `key`.
    pub fn u64(&self, key: &str) -> Result<u64> {
        self.get(key)?
            .as_u64()
            .ok_or_else(|| self.bad_meta(key, "not an integer"))
    }

    /// A float under `key`.
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.get(key)?
            .as_f64()
            .ok_or_else(|| self.bad_meta(key, "not a number"))
    }

    /// The strings of an array under `key`.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        let array = self
            .get(key)?
            .as_array()
            .ok_or_else(|| self.bad_meta(key, "not an array"))?;
        array
            .iter()
            .map(|v| v.as_str().ok_or_else(|| self.bad_meta(key, "not strings")))
            .collect()
    }

    /// The tensor named `name`, or an error naming it.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| GgufError::Tensor {
                path: self.path.clone(),
                tensor: name.into(),
                what: "missing from the file".into(),
            })
    }

    /// The tensor's bytes as stored.
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_start + t.offset) as usize;
        &self.map[start..start + t.bytes() as usize]
    }

    /// The tensor's values as f32, row after row (ggml's reference dequantization).
    pub fn dequantize(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; t.numel() as usize];
        quant::dequantize(t.kind, self.data(t), &mut out).map_err(|what| GgufError::Tensor {
            path: self.path.clone(),
            tensor: t.name.clone(),
            what,
        })?;
        Ok(out)
    }

    fn bad_meta(&self, key: &str, what: &str) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.into(),
            what: what.into(),
        }
    }
}
