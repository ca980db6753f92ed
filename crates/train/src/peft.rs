//! The adapters as PEFT saves them, and the merged model.
//!
//! `adapter_model.safetensors` holds every `lora_A`/`lora_B` under PEFT's names
//! (`base_model.model.<module>.lora_A.weight`, A (r, in), B (out, r)) and `adapter_config.json`
//! PEFT's `LoraConfig` (r, lora_alpha, the adapted module names, no dropout, no bias), so
//! `peft.PeftModel.from_pretrained(base, DIR)` loads them over the HF base (`dev/check_peft.py`
//! compares the logits). A merged model is W + (α/r)·B·A in every adapted part, over the base
//! as it is stored (for a quantized base, dequant(quant(W)): PEFT's recommended merge recipe),
//! written as a plain HF folder.
//!
//! Example: `peft::save_adapter(&trainer, Path::new("out"))?` after training.

use crate::Trainer;
use engine::error::EngineError;
use engine::io::HfTensor;
use engine::model::view_range;
use plan_frugal::adapters::{BaseFormat, Matrix};
use plan_frugal::units::{Role, Unit, UnitKind};
use std::path::Path;

/// The file names PEFT reads.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

fn write(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    engine::io::write_file(path, bytes)
}

/// PEFT's `adapter_config.json` for this run.
pub fn adapter_config(trainer: &Trainer) -> serde_json::Value {
    let lora = trainer.model.lora.as_ref().expect("a LoRA model");
    let mut modules: Vec<String> = lora.matrices[0]
        .iter()
        .flat_map(|m| {
            m.matrix
                .targeted()
                .map(|p| p.module.rsplit('.').next().unwrap_or("").to_string())
        })
        .collect();
    modules.sort();
    modules.dedup();
    serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": null,
        "r": lora.setup.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.setup.dropout,
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": trainer.config.model.shape.family == plan::model::Family::Gpt2,
        "inference_mode": true,
        "init_lora_weights": true,
        "modules_to_save": null,
        "use_rslora": false,
        "use_dora": false,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": null
    })
}

/// What the adapters were trained over, for the weight file's metadata: the base's whole
/// config and, for a saved base, its weight files' fingerprint (the one a snapshot records and
/// `export --merge --base` checks).
pub fn provenance(trainer: &Trainer) -> Vec<(&'static str, String)> {
    let mut out = vec![("frugal.base_config", trainer.config.model.to_hf_json())];
    let lora = trainer.config.lora.as_ref().and_then(|l| l.base_weights);
    if let Some(fingerprint) = lora {
        out.push(("frugal.base_weights", format!("{fingerprint:016x}")));
    }
    out
}

/// The adapters' whole fp32 values: `gathered` (`Trainer::full_params`, which ZeRO-3 and 2-byte
/// runs need every rank for), or read from the arena.
fn adapter_values(trainer: &Trainer, gathered: Option<&[Vec<f32>]>) -> Vec<Vec<f32>> {
    match gathered {
        Some(units) => units.to_vec(),
        None => engine::io::unit_values(&trainer.model, &trainer.arena),
    }
}

/// Writes `dir/adapter_model.safetensors` and `dir/adapter_config.json`, from `gathered` (see
/// `adapter_values`) or rank 0's arena.
pub fn save_adapter(
    trainer: &Trainer,
    gathered: Option<&[Vec<f32>]>,
    dir: &Path,
) -> Result<(), EngineError> {
    engine::io::create_dir(dir)?;
    let values = adapter_values(trainer, gathered);
    let slices: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
    let tensors = engine::io::export_units(&trainer.model, &slices);
    let bytes = engine::io::tensors_with_metadata(tensors, &provenance(trainer));
    write(&dir.join(ADAPTER_WEIGHTS), &bytes)?;
    let config = serde_json::to_string_pretty(&adapter_config(trainer)).expect("JSON");
    write(&dir.join(ADAPTER_CONFIG), config.as_bytes())
}

/// Every tensor of the merged model under its HF name: the base as stored (dequantized) plus
/// (α/r)·B·A in every adapted part.
pub fn merged_tensors(trainer: &Trainer, gathered: Option<&[Vec<f32>]>) -> Vec<HfTensor> {
    let model = &trainer.model;
    let lora = model.lora.as_ref().expect("a LoRA model");
    let units = plan_frugal::param_units(&model.config.shape, 1).expect("the plan built it");
    let adapters = adapter_values(trainer, gathered);
    let matrices: Vec<Vec<Matrix>> = (lora.matrices.iter())
        .map(|ms| ms.iter().map(|m| m.matrix.clone()).collect())
        .collect();
    let mut values: Vec<Vec<f32>> = (units.iter().enumerate())
        .map(|(u, unit)| engine::lora::base::dequantized_unit(model, &trainer.arena, u, unit))
        .collect();
    let merge = Merge {
        units: &units,
        adapter_units: &model.units,
        matrices: &matrices,
        rank: lora.setup.rank as usize,
        scale: lora.scale,
    };
    merge.add_adapters(&mut values, &adapters);
    let slices: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
    engine::io::export_views(&units, &slices)
}

/// The merged model on the host, from the base's HF weights (`base`: the full model's units,
/// `io::read_units`) and the adapters' units (a LoRA snapshot's weights): each block matrix
/// rounded through the base format (dequant(quant(W)), what training saw), plus (α/r)·B·A. A
/// `ggml` base's values are a GGUF file's own, which `base` holds already.
pub fn merge_host(
    shape: &plan::ModelShape,
    lora: &plan::setup::Lora,
    alpha: f32,
    mut base: Vec<Vec<f32>>,
    adapters: &[Vec<f32>],
) -> Result<Vec<HfTensor>, EngineError> {
    let units = plan_frugal::param_units(shape, 1)?;
    let adapter_units = plan_frugal::adapters::adapter_units(shape, lora, 1)?;
    let format = BaseFormat::of(lora)?;
    let matrices = engine::lora::all_matrices(shape, lora);
    let rounded = !matches!(format, BaseFormat::Ggml(_));
    for (unit, values) in units.iter().zip(base.iter_mut()).filter(|_| rounded) {
        let UnitKind::Block(layer) = unit.kind else {
            continue;
        };
        for m in &matrices[layer as usize] {
            let view = view_range(unit.view(m.role));
            let cols = m.cols as usize;
            for p in &m.parts {
                let start = view.start + p.row_offset as usize * cols;
                let rows = &mut values[start..start + p.rows as usize * cols];
                let (base, n) = (engine::lora::base::pack_part, p.rows as usize);
                let bytes = base(rows, m.role, n, cols, format);
                engine::lora::base::decode_part(rows, &bytes, n, format, m.role);
            }
        }
    }
    let merge = Merge {
        units: &units,
        adapter_units: &adapter_units,
        matrices: &matrices,
        rank: lora.rank as usize,
        scale: alpha / lora.rank as f32,
    };
    merge.add_adapters(&mut base, adapters);
    let slices: Vec<&[f32]> = base.iter().map(Vec::as_slice).collect();
    Ok(engine::io::export_views(&units, &slices))
}

/// Adds (α/r)·B·A into the adapted parts of full model units.
struct Merge<'a> {
    units: &'a [Unit],
    adapter_units: &'a [Unit],
    matrices: &'a [Vec<Matrix>],
    rank: usize,
    scale: f32,
}

impl Merge<'_> {
    fn add_adapters(&self, values: &mut [Vec<f32>], adapters: &[Vec<f32>]) {
        let r = self.rank;
        for (unit, v) in self.units.iter().zip(values.iter_mut()) {
            let UnitKind::Block(layer) = unit.kind else {
                continue;
            };
            let (a_unit, params) = (
                &self.adapter_units[layer as usize],
                &adapters[layer as usize],
            );
            for m in &self.matrices[layer as usize] {
                let cols = m.cols as usize;
                let view = view_range(unit.view(m.role));
                for p in m.targeted() {
                    let i = p.adapter.expect("targeted");
                    let a = &params[view_range(a_unit.view(Role::LoraA(i)))];
                    let b = &params[view_range(a_unit.view(Role::LoraB(i)))];
                    for row in 0..p.rows as usize {
                        let w = &mut v[view.start + (p.row_offset as usize + row) * cols..][..cols];
                        for k in 0..r {
                            let s = self.scale * b[row * r + k];
                            for (x, &ak) in w.iter_mut().zip(&a[k * cols..(k + 1) * cols]) {
                                *x += s * ak;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Writes the merged model as a Hugging Face folder (`config.json`, `model.safetensors`).
pub fn save_merged(
    trainer: &Trainer,
    gathered: Option<&[Vec<f32>]>,
    dir: &Path,
) -> Result<(), EngineError> {
    let tensors = merged_tensors(trainer, gathered);
    engine::io::save_pretrained_tensors(&trainer.model, tensors, dir)
}
