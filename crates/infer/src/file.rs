//! The quantized weights file (`weights.frugal`): a model's weights in their storage format, so
//! a quantized model loads without its fp32 original and without quantizing again.
//!
//! Layout: the magic `FRUGALQ1`, the header's length (u64, little-endian) and its crc32 (u32),
//! the header (JSON: format version, weight format and group, the model's HF `config.json`, and
//! every tensor's plan name, byte count and crc32, in plan order), then the tensors' bytes in
//! that order. Reading checks the magic, the header's checksum, that the tensors are exactly
//! those the model's serving plan holds (names and sizes), and each tensor's checksum, naming
//! what is wrong; nothing half-read is used. The file is written to a temporary name, fsynced
//! and renamed.
//!
//! Example: `file::save(&worker, "q/weights.frugal".as_ref())?; let h = file::read_header(p)?;`

use super::Worker;
use engine::backend::DType;
use engine::backend::InferOps;
use engine::config::ModelConfig;
use engine::error::EngineError;
use plan::buffer::Category;
use plan_frugal::WeightFormat;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"FRUGALQ1";
pub const FILE_NAME: &str = "weights.frugal";
const VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub bytes: u64,
    pub crc32: u32,
}

/// The header of a quantized file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Header {
    pub version: u32,
    pub weights: String,
    pub group: Option<u64>,
    /// The model's HF config.json.
    pub config: String,
    pub tensors: Vec<TensorEntry>,
}

impl Header {
    pub fn format(&self) -> Result<WeightFormat, EngineError> {
        Ok(WeightFormat::parse(&self.weights, self.group)?)
    }

    pub fn model_config(&self, path: &Path) -> Result<ModelConfig, EngineError> {
        ModelConfig::from_hf_json(&self.config, &path.display().to_string())
    }
}

fn bad(path: &Path, reason: String) -> EngineError {
    EngineError::Weights {
        path: path.display().to_string(),
        reason,
    }
}

fn io(path: &Path, what: &str) -> impl FnOnce(std::io::Error) -> EngineError {
    let context = format!("{what} {}", path.display());
    move |cause| EngineError::Io { context, cause }
}

/// The weight buffers of a worker's plan, in plan order.
fn weight_buffers<B: InferOps>(worker: &Worker<B>) -> Vec<(String, engine::backend::Tensor)> {
    worker
        .plan
        .buffers
        .iter()
        .filter(|b| b.category == Category::Params)
        .map(|b| {
            let key = b.key.expect("a keyed buffer");
            (b.name.clone(), worker.arena.key_tensor(key, DType::U8))
        })
        .collect()
}

/// Writes `worker`'s weights to `path`.
pub fn save<B: InferOps>(worker: &Worker<B>, path: &Path) -> Result<(), EngineError> {
    let be = worker.arena.backend();
    let mut entries = Vec::new();
    let mut payload = Vec::new();
    for (name, t) in weight_buffers(worker) {
        let start = payload.len();
        payload.resize(start + t.len, 0);
        be.download_bytes(&worker.arena, t, &mut payload[start..]);
        // The file holds the packer's layout, whatever layout the backend keeps.
        for (part, bytes) in worker.packed_parts(t.buf) {
            let at = start + part.offset * part.dtype.size_bytes();
            payload[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        entries.push(TensorEntry {
            name,
            bytes: t.len as u64,
            crc32: crc32fast::hash(&payload[start..]),
        });
    }
    let f = worker.setup.weights;
    let header = Header {
        version: VERSION,
        weights: f.name().into(),
        group: f.group(),
        config: worker.config.to_hf_json(),
        tensors: entries,
    };
    let json = serde_json::to_vec(&header).expect("a header serializes");
    let tmp = path.with_extension("frugal.tmp");
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(MAGIC)?;
        file.write_all(&(json.len() as u64).to_le_bytes())?;
        file.write_all(&crc32fast::hash(&json).to_le_bytes())?;
        file.write_all(&json)?;
        file.write_all(&payload)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(path, "writing")(e)
    })
}

/// Reads and checks the header of `path`; returns it and the payload's offset.
pub fn read_header(path: &Path) -> Result<(Header, u64), EngineError> {
    let mut file = std::fs::File::open(path).map_err(io(path, "opening"))?;
    let mut fixed = [0u8; 20];
    file.read_exact(&mut fixed)
        .map_err(|_| bad(path, "too short to be a frugal quantized file".into()))?;
    if &fixed[..8] != MAGIC {
        return Err(bad(
            path,
            "not a frugal quantized file (wrong magic); write one with `frugal generate \
             --save-quantized DIR`"
                .into(),
        ));
    }
    let len = u64::from_le_bytes(fixed[8..16].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(fixed[16..20].try_into().expect("4 bytes"));
    let size = file.metadata().map_err(io(path, "reading"))?.len();
    if len > size.saturating_sub(20) {
        return Err(bad(
            path,
            format!("the header claims {len} bytes; the file is truncated"),
        ));
    }
    let mut json = vec![0u8; len as usize];
    file.read_exact(&mut json).map_err(io(path, "reading"))?;
    if crc32fast::hash(&json) != crc {
        return Err(bad(
            path,
            "the header's checksum does not match: the file is damaged".into(),
        ));
    }
    let header: Header = serde_json::from_slice(&json)
        .map_err(|e| bad(path, format!("the header is not valid: {e}")))?;
    if header.version != VERSION {
        return Err(bad(
            path,
            format!(
                "format version {} (this build reads {VERSION})",
                header.version
            ),
        ));
    }
    let total = header
        .tensors
        .iter()
        .try_fold(0u64, |acc, t| acc.checked_add(t.bytes))
        .and_then(|t| t.checked_add(20 + len))
        .ok_or_else(|| {
            bad(
                path,
                "the header's tensor sizes overflow: the file is damaged".into(),
            )
        })?;
    if total != size {
        return Err(bad(
            path,
            format!(
                "{} bytes of tensors after the header, {} expected: the file is truncated or padded",
                size - 20 - len,
                total - 20 - len
            ),
        ));
    }
    Ok((header, 20 + len))
}

/// Loads `path`'s weights into `worker` (built from the file's config and format).
pub fn load<B: InferOps>(worker: &mut Worker<B>, path: &Path) -> Result<(), EngineError> {
    let (header, offset) = read_header(path)?;
    if header.format()? != worker.setup.weights {
        return Err(bad(
            path,
            format!(
                "holds {} weights and the engine was planned for {}",
                header.weights,
                worker.setup.weights.name()
            ),
        ));
    }
    let expect = weight_buffers(worker);
    if expect.len() != header.tensors.len() {
        return Err(bad(
            path,
            format!(
                "{} tensors, the model needs {}",
                header.tensors.len(),
                expect.len()
            ),
        ));
    }
    // Two passes: every name, size and checksum first, so a damaged file changes no weight.
    for pass in [false, true] {
        read_tensors(worker, path, offset, &expect, &header, pass)?;
    }
    worker.relayout();
    Ok(())
}

fn read_tensors<B: InferOps>(
    worker: &Worker<B>,
    path: &Path,
    offset: u64,
    expect: &[(String, engine::backend::Tensor)],
    header: &Header,
    upload: bool,
) -> Result<(), EngineError> {
    let mut file = std::fs::File::open(path).map_err(io(path, "opening"))?;
    let mut skip = vec![0u8; offset as usize];
    file.read_exact(&mut skip).map_err(io(path, "reading"))?;
    let mut buf = Vec::new();
    for ((name, t), entry) in expect.iter().zip(&header.tensors) {
        if *name != entry.name || t.len as u64 != entry.bytes {
            return Err(bad(
                path,
                format!(
                    "tensor {} of {} bytes where the model has {name} of {} bytes: the file is \
                     for another model or format",
                    entry.name, entry.bytes, t.len
                ),
            ));
        }
        buf.resize(t.len, 0);
        file.read_exact(&mut buf).map_err(io(path, "reading"))?;
        if crc32fast::hash(&buf) != entry.crc32 {
            return Err(bad(
                path,
                format!("tensor {name}'s checksum does not match: the file is damaged"),
            ));
        }
        if upload {
            worker.arena.backend().upload_bytes(&worker.arena, *t, &buf);
        }
    }
    Ok(())
}

/// The fp32 units (each unit's flat elements, in view order) of a file that stores f32 weights:
/// what a worker quantizes to another format.
pub fn read_f32_units(
    path: &Path,
    units: &[plan_frugal::Unit],
) -> Result<Vec<Vec<f32>>, EngineError> {
    let (header, offset) = read_header(path)?;
    if header.format()? != WeightFormat::F32 {
        return Err(bad(
            path,
            format!("holds {} weights, not f32", header.weights),
        ));
    }
    let bytes = std::fs::read(path).map_err(io(path, "reading"))?;
    let mut at = offset as usize;
    let mut tensors = std::collections::HashMap::new();
    for t in &header.tensors {
        let data = &bytes[at..at + t.bytes as usize];
        if crc32fast::hash(data) != t.crc32 {
            return Err(bad(
                path,
                format!(
                    "tensor {}'s checksum does not match: the file is damaged",
                    t.name
                ),
            ));
        }
        tensors.insert(t.name.clone(), data);
        at += t.bytes as usize;
    }
    let floats = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let mut out = Vec::with_capacity(units.len());
    for unit in units {
        let mut values = Vec::with_capacity(unit.numel as usize);
        let vectors_key = plan_frugal::Key::Vectors(unit.kind).to_string();
        let vectors = tensors
            .get(&vectors_key)
            .map(|b| floats(b))
            .unwrap_or_default();
        let mut vec_at = 0;
        for v in &unit.views {
            let n = v.numel() as usize;
            if plan_frugal::serve::is_matrix(v.role) {
                let key = plan_frugal::Key::QWeight(unit.kind, v.role).to_string();
                let b = tensors
                    .get(&key)
                    .filter(|b| b.len() == 4 * n)
                    .ok_or_else(|| bad(path, format!("no f32 tensor {key} of {n} values")))?;
                values.extend(floats(b));
            } else {
                if vec_at + n > vectors.len() {
                    return Err(bad(path, format!("{vectors_key} is too short")));
                }
                values.extend_from_slice(&vectors[vec_at..vec_at + n]);
                vec_at += n;
            }
        }
        if let Some(i) = values.iter().position(|x| !x.is_finite()) {
            return Err(bad(
                path,
                format!(
                    "the weights of {} hold {} at element {i}: the file comes from a run that \
                     diverged; export a snapshot from before the loss went to NaN",
                    unit.kind, values[i]
                ),
            ));
        }
        out.push(values);
    }
    Ok(out)
}
