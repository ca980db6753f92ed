//! LoRA/QLoRA accounting: which linear layers get adapters, how many adapter parameters, and what
//! the frozen base weights weigh in bf16, int8 or nf4 (scales included).
//!
//! Targets match HF module names the way PEFT does: by suffix (`c_proj` hits both GPT-2
//! projections, `gate_proj` hits experts too); `all-linear` takes every linear layer of the
//! blocks. Not here: activations (the runtime profiles add the rank-sized adapter outputs).
//! Example: llama2-7b with rank 16 on q_proj,v_proj has 8,388,608 adapter parameters.

use crate::params::{Tensor, TensorKind};
use crate::setup::Dtype;
use crate::{ModelShape, PlanError};

/// Whether `tensor` is one of the LoRA `targets`.
pub fn is_target(tensor: &Tensor, targets: &[String]) -> bool {
    tensor.kind == TensorKind::Linear
        && targets.iter().any(|t| {
            t == "all-linear"
                || tensor.name == t
                || (tensor.name.len() > t.len()
                    && tensor.name.ends_with(t.as_str())
                    && tensor.name.as_bytes()[tensor.name.len() - t.len() - 1] == b'.')
        })
}

/// Every target must name a linear layer of `model`'s blocks.
pub fn check_targets(model: &ModelShape, targets: &[String]) -> Result<(), PlanError> {
    let mut linears: Vec<&'static str> = Vec::new();
    for layer_idx in [0, model.n_layers - 1] {
        for t in model.block_tensors(layer_idx) {
            if t.kind == TensorKind::Linear && !linears.contains(&t.name) {
                linears.push(t.name);
            }
        }
    }
    if targets.is_empty() {
        return Err(PlanError::Invalid {
            field: "--lora-targets".into(),
            reason: format!("no targets given: use some of {}", linears.join(",")),
        });
    }
    for target in targets {
        let probe = |name: &'static str| Tensor {
            name,
            kind: TensorKind::Linear,
            d_in: 1,
            d_out: 1,
            count: 1,
            tp_split: false,
        };
        if !linears
            .iter()
            .any(|n| is_target(&probe(n), std::slice::from_ref(target)))
        {
            return Err(PlanError::Invalid {
                field: "--lora-targets".into(),
                reason: format!(
                    "'{target}' is not a linear layer of {}: use some of {} or all-linear",
                    model.name,
                    linears.join(",")
                ),
            });
        }
    }
    Ok(())
}

/// Adapter parameters LoRA adds to `tensor` (A: rank × d_in, B: d_out × rank).
pub fn adapter_numel(tensor: &Tensor, rank: u32) -> u64 {
    rank as u64 * (tensor.d_in + tensor.d_out) * tensor.count
}

/// Bytes of `numel` frozen base weights stored as `base`, with the quantizer's scales:
/// int8 as LLM.int8 (one fp32 scale per output row of `d_in` weights), nf4 as QLoRA (blocks of
/// 64 with an 8-bit absmax, double-quantized in blocks of 256 with fp32 scales).
pub fn base_bytes(numel: u64, d_in: u64, base: Dtype) -> u64 {
    match base {
        Dtype::Int8 => numel + 4 * numel.div_ceil(d_in.max(1)),
        Dtype::Nf4 => {
            let blocks = numel.div_ceil(64);
            numel.div_ceil(2) + blocks + 4 * blocks.div_ceil(256)
        }
        other => numel * other.bits() / 8,
    }
}
