//! Weights in and out as safetensors with Hugging Face names, so a model trained here loads in
//! transformers (and HF checkpoints load here). The model's files are read and written here (`capacity` reads /proc and cgroup limits; `testkit` its golden files).
//!
//! Tensors map to unit views through `plan_frugal::units` (`HfPart`): GPT-2's `Conv1D` weights are
//! transposed, Llama's q/k/v and gate/up fill row ranges of the fused views. Loading checks every
//! tensor (present, shape, dtype) before writing any weight, so a bad file changes nothing.
//! Saving writes `model.safetensors` and `config.json` under temporary names and renames them
//! into place, so a crash never leaves a half-written file under the final name.
//!
//! Example: `io::save_pretrained(&trainer.model, &trainer.arena, Path::new("out"))?`.

use crate::arena::{Arena, BufId};
use crate::backend::{Backend, DType};
use crate::error::EngineError;
use crate::model::{view_range, Model};
use plan_frugal::units::{HfPart, ParamView, Unit};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::path::Path;

/// The HF file names a saved model folder holds.
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const CONFIG_FILE: &str = "config.json";

/// Which of a unit's buffers to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Params,
    Grads,
}

/// One tensor in HF layout.
#[derive(Clone, Debug, PartialEq)]
pub struct HfTensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub data: Vec<f32>,
}

fn cols(view: &ParamView) -> usize {
    if view.shape.len() == 2 {
        view.shape[1] as usize
    } else {
        1
    }
}

/// The rows of `view_data` that `part` covers, in HF layout.
fn part_to_hf(view_data: &[f32], view: &ParamView, part: &HfPart) -> Vec<f32> {
    let c = cols(view);
    let rows = part.hf_shape.iter().product::<u64>() as usize / c;
    let start = part.row_offset as usize * c;
    let src = &view_data[start..start + rows * c];
    if !part.transposed {
        return src.to_vec();
    }
    let mut out = vec![0.0; rows * c];
    for r in 0..rows {
        for j in 0..c {
            out[j * rows + r] = src[r * c + j];
        }
    }
    out
}

/// Writes an HF-layout tensor into the rows of `view_data` that `part` covers.
fn hf_to_part(view_data: &mut [f32], view: &ParamView, part: &HfPart, hf: &[f32]) {
    let c = cols(view);
    let rows = hf.len() / c;
    let dst = &mut view_data[part.row_offset as usize * c..][..rows * c];
    if !part.transposed {
        dst.copy_from_slice(hf);
        return;
    }
    for r in 0..rows {
        for j in 0..c {
            dst[r * c + j] = hf[j * rows + r];
        }
    }
}

/// A whole fp32 buffer, copied to the host.
fn download<B: Backend>(arena: &Arena<B>, id: BufId) -> Vec<f32> {
    let t = arena.tensor(id, DType::F32);
    let mut host = vec![0.0f32; t.len];
    arena.backend().download(arena, t, &mut host);
    host
}

/// Every tensor under its HF name, in HF layout, from the whole fp32 unit buffers `ids` (one
/// per unit: a model's weights, or a trainer's gradients).
pub fn export_ids<B: Backend>(model: &Model, arena: &Arena<B>, ids: &[BufId]) -> Vec<HfTensor> {
    let bufs: Vec<Vec<f32>> = ids.iter().map(|&id| download(arena, id)).collect();
    let units: Vec<&[f32]> = bufs.iter().map(|b| &b[..]).collect();
    export_units(model, &units)
}

/// Every tensor under its HF name from whole units held outside the arena (ZeRO stage 3's
/// gathered weights, `Trainer::full_params`), one slice per unit in unit order.
pub fn export_units(model: &Model, units: &[&[f32]]) -> Vec<HfTensor> {
    export_views(&model.units, units)
}

/// [`export_units`] for the layout `layout` (a LoRA model's full units, for a merged export).
pub fn export_views(layout: &[Unit], units: &[&[f32]]) -> Vec<HfTensor> {
    let mut out = Vec::new();
    for (unit, buf) in layout.iter().zip(units) {
        for view in &unit.views {
            let data = &buf[view_range(view)];
            for part in &view.parts {
                out.push(HfTensor {
                    name: part.name.clone(),
                    shape: part.hf_shape.clone(),
                    data: part_to_hf(data, view, part),
                });
            }
        }
    }
    out
}

/// Every unit's weights (`model.params`), downloaded whole.
pub fn unit_values<B: Backend>(model: &Model, arena: &Arena<B>) -> Vec<Vec<f32>> {
    model.params.iter().map(|&id| download(arena, id)).collect()
}

/// Creates `dir` (and its parents), naming it in the error.
pub fn create_dir(dir: &Path) -> Result<(), EngineError> {
    std::fs::create_dir_all(dir).map_err(|cause| EngineError::Io {
        context: format!("creating {}", dir.display()),
        cause,
    })
}

/// Writes `path` durably (temporary file, fsync, rename).
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    write_atomically(path, bytes)
}

/// The safetensors bytes of the model's weights.
pub fn to_safetensors<B: Backend>(model: &Model, arena: &Arena<B>) -> Vec<u8> {
    tensors_to_safetensors(export_ids(model, arena, &model.params))
}

/// The safetensors bytes of `tensors` (f32, HF layout).
pub fn tensors_to_safetensors(tensors: Vec<HfTensor>) -> Vec<u8> {
    tensors_with_metadata(tensors, &[])
}

/// [`tensors_to_safetensors`] with `extra` string pairs in the header's `__metadata__` beside
/// `format: pt` (readers such as PEFT and transformers ignore keys they do not know).
pub fn tensors_with_metadata(tensors: Vec<HfTensor>, extra: &[(&str, String)]) -> Vec<u8> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|t| {
            let shape = t.shape.iter().map(|&d| d as usize).collect();
            let data = t.data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (t.name, shape, data)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(name, shape, data)| {
            let view = TensorView::new(Dtype::F32, shape.clone(), data).expect("sizes agree");
            (name.clone(), view)
        })
        .collect();
    let mut metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    metadata.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    safetensors::serialize(views, Some(metadata)).expect("in-memory serialisation succeeds")
}

fn to_f32(view: &TensorView<'_>) -> Option<Vec<f32>> {
    let bytes = view.data();
    Some(match view.dtype() {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

/// Loads HF-named weights from safetensors `bytes` (`path` names the file in errors). Every
/// tensor is checked before any weight changes.
pub fn load_safetensors<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    bytes: &[u8],
    path: &str,
) -> Result<(), EngineError> {
    load_prefixed(model, arena, bytes, path, "")
}

/// As [`load_safetensors`], for files that store each HF name behind `prefix` (golden files keep
/// `weights.<name>` beside `grad.<name>`).
pub fn load_prefixed<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    bytes: &[u8],
    path: &str,
    prefix: &str,
) -> Result<(), EngineError> {
    load_files(model, arena, &[(path.to_string(), bytes)], prefix)
}

/// Loads HF-named weights from several safetensors files (the shards of a checkpoint), each
/// tensor from whichever file holds it. Every tensor is checked before any weight changes.
pub fn load_files<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    files: &[(String, &[u8])],
    prefix: &str,
) -> Result<(), EngineError> {
    let values = read_units(&model.units, files, prefix)?;
    for (u, v) in values.into_iter().enumerate() {
        let t = arena.tensor(model.params[u], DType::F32);
        let mut full = vec![0.0f32; t.len];
        full[..v.len()].copy_from_slice(&v);
        arena.backend().upload(arena, t, &full);
    }
    Ok(())
}

/// Every unit's values (`numel` each, unpadded) from HF-named safetensors files, each tensor
/// checked (present, shape, dtype) before any is returned.
pub fn read_units(
    units: &[Unit],
    files: &[(String, &[u8])],
    prefix: &str,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let path = files
        .iter()
        .map(|(p, _)| p.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let mut shards = Vec::with_capacity(files.len());
    for (p, bytes) in files {
        let st = SafeTensors::deserialize(bytes).map_err(|e| EngineError::Weights {
            path: p.clone(),
            reason: format!("not safetensors: {e}"),
        })?;
        shards.push(st);
    }
    let st = Shards(&shards);
    read_units_by(units, &path, &mut |name| {
        // The original gpt2 checkpoints name tensors without the `transformer.` prefix.
        let short = name.strip_prefix("transformer.").unwrap_or(name);
        let t = st
            .tensor(&format!("{prefix}{name}"))
            .or_else(|_| st.tensor(&format!("{prefix}{short}")))
            .map_err(|_| format!("missing tensor {name}"))?;
        let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
        let data = to_f32(&t)
            .ok_or_else(|| format!("{name} has dtype {:?} (f32, bf16, f16 load)", t.dtype()))?;
        Ok((shape, data))
    })
}

/// An HF-named tensor's shape and f32 values, or why it cannot be had.
pub type TensorSource<'a> = dyn FnMut(&str) -> Result<(Vec<u64>, Vec<f32>), String> + 'a;

/// Every unit's values (`numel` each, unpadded), each HF-named tensor taken from `tensor`
/// (its shape and f32 values, or why it cannot be had) and its shape checked; `path` names the
/// source in errors. A checkpoint in another format (GGUF) comes in this way.
pub fn read_units_by(
    units: &[Unit],
    path: &str,
    tensor: &mut TensorSource<'_>,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let fail = |reason: String| EngineError::Weights {
        path: path.to_string(),
        reason,
    };
    let mut out: Vec<Vec<f32>> = units.iter().map(|u| vec![0.0; u.numel as usize]).collect();
    for (unit, values) in units.iter().zip(out.iter_mut()) {
        for view in &unit.views {
            for part in &view.parts {
                let (shape, data) = tensor(&part.name).map_err(fail)?;
                if let Some(i) = data.iter().position(|v| !v.is_finite()) {
                    return Err(fail(format!(
                        "{} holds {} at element {i}: the weights are damaged or come from a run \
                         that diverged; use a snapshot from before the loss went to NaN",
                        part.name, data[i]
                    )));
                }
                if shape != part.hf_shape {
                    let want = &part.hf_shape;
                    return Err(fail(format!(
                        "{} has shape {shape:?}, the model needs {want:?}",
                        part.name
                    )));
                }
                hf_to_part(&mut values[view_range(view)], view, part, &data);
            }
        }
    }
    Ok(out)
}

/// Tensors looked up across the shards of a checkpoint.
struct Shards<'a, 'b>(&'a [SafeTensors<'b>]);

impl<'b> Shards<'_, 'b> {
    fn tensor(&self, name: &str) -> Result<TensorView<'b>, ()> {
        self.0.iter().find_map(|s| s.tensor(name).ok()).ok_or(())
    }
}

/// Loads a Hugging Face folder's weights: `model.safetensors`, or every shard that
/// `model.safetensors.index.json` names (f32, bf16 or f16 on disk).
pub fn load_hf_folder<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    dir: &Path,
) -> Result<(), EngineError> {
    let data = read_hf_folder(dir)?;
    load_files(model, arena, &file_slices(&data), "")
}

/// `read_hf_folder`'s files as the `(path, bytes)` slices the loaders take.
pub fn file_slices(data: &[(String, Vec<u8>)]) -> Vec<(String, &[u8])> {
    data.iter()
        .map(|(p, b)| (p.clone(), b.as_slice()))
        .collect()
}

/// The bytes of a Hugging Face folder's weight files, with their paths.
pub fn read_hf_folder(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, EngineError> {
    let names = hf_weight_files(dir)?;
    let mut data = Vec::with_capacity(names.len());
    for p in &names {
        data.push((
            p.display().to_string(),
            std::fs::read(p).map_err(read_error(p))?,
        ));
    }
    Ok(data)
}

fn read_error(p: &Path) -> impl FnOnce(std::io::Error) -> EngineError {
    let context = format!("reading {}", p.display());
    move |cause| EngineError::Io { context, cause }
}

/// The weight files of a Hugging Face folder, in order: `model.safetensors`, or every shard
/// `model.safetensors.index.json` names.
pub fn hf_weight_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, EngineError> {
    let io = read_error;
    let single = dir.join(WEIGHTS_FILE);
    let names: Vec<std::path::PathBuf> = if single.is_file() {
        vec![single]
    } else {
        let index = dir.join("model.safetensors.index.json");
        let text = std::fs::read_to_string(&index).map_err(io(&index))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| EngineError::Weights {
                path: index.display().to_string(),
                reason: format!("not JSON: {e}"),
            })?;
        let map = v["weight_map"]
            .as_object()
            .ok_or_else(|| EngineError::Weights {
                path: index.display().to_string(),
                reason: "no weight_map object".into(),
            })?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect();
        files.sort();
        files.dedup();
        files.into_iter().map(|f| dir.join(f)).collect()
    };
    Ok(names)
}

/// Writes `path` durably: a temporary file, fsynced, renamed into place, the folder synced; a
/// failed write leaves no temporary file behind.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let io = |context: String| move |cause| EngineError::Io { context, cause };
    let tmp = path.with_extension("tmp");
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        use std::io::Write;
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(format!("writing {}", tmp.display()))(e));
    }
    std::fs::rename(&tmp, path).map_err(io(format!("renaming into {}", path.display())))?;
    // The rename durable too, as the snapshots' is.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(format!("syncing the folder {}", dir.display())))?;
    }
    Ok(())
}

/// Writes `dir/model.safetensors` and `dir/config.json` (transformers' `from_pretrained` layout).
pub fn save_pretrained<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    dir: &Path,
) -> Result<(), EngineError> {
    save_pretrained_tensors(model, export_ids(model, arena, &model.params), dir)
}

/// [`save_pretrained`] from tensors already exported (e.g. with [`export_units`]).
pub fn save_pretrained_tensors(
    model: &Model,
    tensors: Vec<HfTensor>,
    dir: &Path,
) -> Result<(), EngineError> {
    save_hf(&model.config, tensors, dir)
}

/// [`save_pretrained_tensors`] for a model config alone (no arena: a host-side merge).
pub fn save_hf(
    config: &crate::ModelConfig,
    tensors: Vec<HfTensor>,
    dir: &Path,
) -> Result<(), EngineError> {
    create_dir(dir)?;
    write_atomically(
        &dir.join("model.safetensors"),
        &tensors_to_safetensors(tensors),
    )?;
    write_atomically(&dir.join("config.json"), config.to_hf_json().as_bytes())
}

#[cfg(test)]
mod tests;
