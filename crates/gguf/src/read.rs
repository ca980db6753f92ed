//! The header, metadata and tensor infos, parsed from the mapped bytes by a cursor that checks
//! every read against the end of the file (no count is trusted before the bytes it needs exist).

use crate::{GgufError, Result, TensorInfo, TensorType, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// ggml's default alignment of the data section and of each tensor's data.
const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions ggml has (GGML_MAX_DIMS).
const MAX_DIMS: u32 = 4;

pub struct Parsed {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub data_start: u64,
}

struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn corrupt(&self, what: impl Into<String>) -> GgufError {
        GgufError::Corrupt {
            path: self.path.to_path_buf(),
            what: what.into(),
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            return Err(self.corrupt(format!(
                "{what} needs {n} bytes at offset {}, {left} remain",
                self.at
            )));
        }
        let out = &self.bytes[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.corrupt(format!("{what} is not UTF-8")))
    }

    fn value(&mut self, kind: u32, key: &str, depth: u32) -> Result<Value> {
        Ok(match kind {
            0 => Value::U8(self.array::<1>(key)?[0]),
            1 => Value::I8(self.array::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.corrupt(format!("{key}: bool byte {b}"))),
            },
            8 => Value::String(self.string(key)?),
            9 if depth == 0 => {
                let inner = self.u32(key)?;
                let count = self.u64(key)?;
                // Every element takes at least one byte: a count past the file is corrupt.
                if count > (self.bytes.len() - self.at) as u64 {
                    return Err(self.corrupt(format!("{key}: an array of {count} elements")));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(inner, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            other => {
                return Err(self.corrupt(format!("{key}: unknown metadata value type {other}")))
            }
        })
    }
}

pub fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed> {
    let mut c = Cursor { path, bytes, at: 0 };
    let magic: [u8; 4] = c.array("the magic")?;
    if &magic != b"GGUF" {
        return Err(GgufError::Magic {
            path: path.to_path_buf(),
            magic,
        });
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version {
            path: path.to_path_buf(),
            version,
        });
    }
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the metadata count")?;
    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let key = c.string("a metadata key")?;
        let kind = c.u32(&key)?;
        let value = c.value(kind, &key, 0)?;
        metadata.insert(key, value);
    }
    // A tensor info takes at least 8 + 4 + 8 + 4 + 8 bytes.
    if n_tensors > (bytes.len() - c.at) as u64 / 32 {
        return Err(c.corrupt(format!("{n_tensors} tensors in a file this size")));
    }
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let name = c.string("a tensor name")?;
        let n_dims = c.u32(&name)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.corrupt(format!("tensor {name}: {n_dims} dimensions")));
        }
        let mut dims = Vec::new();
        for _ in 0..n_dims {
            dims.push(c.u64(&name)?);
        }
        let code = c.u32(&name)?;
        let offset = c.u64(&name)?;
        let bad = |what: String| GgufError::Tensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            what,
        };
        let kind = TensorType::from_code(code).map_err(bad)?;
        let numel = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        if numel.is_none_or(|n| n == 0 || n > 1 << 40) {
            return Err(bad(format!("shape {dims:?}")));
        }
        if dims[0] % kind.block_len() != 0 {
            return Err(bad(format!(
                "rows of {} values do not split into {} blocks of {}",
                dims[0],
                kind.name(),
                kind.block_len()
            )));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            kind,
            offset,
        });
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() => a,
            _ => return Err(c.corrupt(format!("general.alignment {v:?}"))),
        },
    };
    // A file without tensors (a vocabulary alone, as llama.cpp's tokenizer tests ship) may end
    // before the padding that would start its empty data section.
    let data_start = (c.at as u64).div_ceil(alignment) * alignment;
    if data_start > bytes.len() as u64 && !tensors.is_empty() {
        return Err(c.corrupt("the data section starts past the end of the file"));
    }
    let data_start = data_start.min(bytes.len() as u64);
    Ok(Parsed {
        version,
        metadata,
        tensors,
        data_start,
    })
}
