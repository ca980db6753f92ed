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

use crate::error::EngineError;
use crate::io::HfTensor;
use crate::model::view_range;
use crate::train::Trainer;
use plan::frugal::adapters::MATRICES;
use plan::frugal::units::{Role, UnitKind};
use std::path::Path;

/// The file names PEFT reads.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

fn write(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    crate::io::write_file(path, bytes)
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
        "lora_dropout": 0.0,
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

/// Writes `dir/adapter_model.safetensors` and `dir/adapter_config.json` (rank 0's adapters:
/// whole at ZeRO 0-2).
pub fn save_adapter(trainer: &Trainer, dir: &Path) -> Result<(), EngineError> {
    std::fs::create_dir_all(dir).map_err(|cause| EngineError::Io {
        context: format!("creating {}", dir.display()),
        cause,
    })?;
    let bytes = crate::io::to_safetensors(&trainer.model, &trainer.arena);
    write(&dir.join(ADAPTER_WEIGHTS), &bytes)?;
    let config = serde_json::to_string_pretty(&adapter_config(trainer)).expect("JSON");
    write(&dir.join(ADAPTER_CONFIG), config.as_bytes())
}

/// Every tensor of the merged model under its HF name: the base as stored (dequantized) plus
/// (α/r)·B·A in every adapted part.
pub fn merged_tensors(trainer: &Trainer) -> Vec<HfTensor> {
    let model = &trainer.model;
    let lora = model.lora.as_ref().expect("a LoRA model");
    let units = plan::frugal::param_units(&model.config.shape, 1).expect("the plan built it");
    let adapters = crate::io::unit_values(model, &trainer.arena);
    let r = lora.setup.rank as usize;
    let mut values: Vec<Vec<f32>> = Vec::with_capacity(units.len());
    for (u, unit) in units.iter().enumerate() {
        let mut v = super::base::dequantized_unit(model, &trainer.arena, u, unit);
        if let UnitKind::Block(layer) = unit.kind {
            let a_unit = &model.units[layer as usize];
            let params = &adapters[layer as usize];
            for role in MATRICES {
                let fm = &lora.matrices[layer as usize][super::matrix_index(role)];
                let cols = fm.matrix.cols as usize;
                let view = view_range(unit.view(role));
                for p in fm.matrix.targeted() {
                    let i = p.adapter.expect("targeted");
                    let a = &params[view_range(a_unit.view(Role::LoraA(i)))];
                    let b = &params[view_range(a_unit.view(Role::LoraB(i)))];
                    for row in 0..p.rows as usize {
                        let w = &mut v[view.start + (p.row_offset as usize + row) * cols..][..cols];
                        for k in 0..r {
                            let s = lora.scale * b[row * r + k];
                            for (x, &ak) in w.iter_mut().zip(&a[k * cols..(k + 1) * cols]) {
                                *x += s * ak;
                            }
                        }
                    }
                }
            }
        }
        values.push(v);
    }
    let slices: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
    crate::io::export_views(&units, &slices)
}

/// Writes the merged model as a Hugging Face folder (`config.json`, `model.safetensors`).
pub fn save_merged(trainer: &Trainer, dir: &Path) -> Result<(), EngineError> {
    let tensors = merged_tensors(trainer);
    crate::io::save_pretrained_tensors(&trainer.model, tensors, dir)
}
