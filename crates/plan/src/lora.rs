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

/// Refuses a rank above the smaller side of a targeted matrix: an adapter B·A of rank r
/// cannot have rank more than min(d_in, d_out), so the extra width only costs memory.
pub fn check_rank(model: &ModelShape, rank: u32, targets: &[String]) -> Result<(), PlanError> {
    let smallest = [0, model.n_layers.saturating_sub(1)]
        .into_iter()
        .flat_map(|l| model.block_tensors(l))
        .filter(|t| t.kind == TensorKind::Linear && is_target(t, targets))
        .min_by_key(|t| t.d_in.min(t.d_out));
    match smallest {
        Some(t) if u64::from(rank) > t.d_in.min(t.d_out) => Err(PlanError::Invalid {
            field: "--lora-rank".into(),
            reason: format!(
                "{rank} exceeds the smaller side of {} ({} x {}): an adapter's rank cannot \
                 usefully exceed it; use {} or less (8-64 are usual)",
                t.name,
                t.d_in,
                t.d_out,
                t.d_in.min(t.d_out)
            ),
        }),
        _ => Ok(()),
    }
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

/// The layout of a GGUF file's blocks as a frozen base holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GgmlBase {
    /// Values per scale: 32, or 16 when a block matrix is Q6_K.
    pub group: u64,
    /// The matrices whose codes the file holds in 4-bit types, kept two a byte.
    pub nibbles: crate::roles::Roles,
}
