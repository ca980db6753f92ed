//! Checks of training and inference setups against a model: every error names the flag at fault
//! and how to fix it (`--tp 3`: "3 does not divide 32 heads: use 1, 2, 4, 8").
//!
//! Not here: model-shape checks (`ModelShape::validate`). Example: `setup.validate(&shape)?`.

use crate::setup::{Dtype, InferSetup, Offload, Recompute, TrainSetup, ZeroStage};
use crate::{ModelShape, PlanError};

fn invalid(field: &str, reason: String) -> PlanError {
    PlanError::Invalid {
        field: field.into(),
        reason,
    }
}

fn divisors(n: u32) -> String {
    let d: Vec<String> = (1..=n)
        .filter(|d| n % d == 0)
        .map(|d| d.to_string())
        .collect();
    d.join(", ")
}

fn at_least_one(field: &str, value: u64) -> Result<(), PlanError> {
    if value == 0 {
        return Err(invalid(field, "must be at least 1".into()));
    }
    Ok(())
}

/// An int4 group (GPTQ/AWQ's `group_size`) runs along each linear's input: it must divide
/// every input width (a group as wide as the row or wider is one scale per row), for the
/// `formula` and `pytorch` runtimes. The frugal runtime's own check (`frugal::serve`) is
/// stricter: its groups are 32, 64 or 128 and divide every column count.
pub fn check_groups(model: &ModelShape, group: u64) -> Result<(), PlanError> {
    let layers = (0..model.n_layers).flat_map(|l| model.block_tensors(l));
    let widths = layers.chain(model.head_tensors()).filter_map(|t| {
        (t.kind == crate::params::TensorKind::Linear && group < t.d_in && t.d_in % group != 0)
            .then_some(t.d_in)
    });
    match widths.min() {
        Some(width) => Err(invalid(
            "--weight-group",
            format!(
                "groups of {group} do not divide the model's linear inputs ({width} wide): \
                 use a group that divides it (32, 64 and 128 are usual)"
            ),
        )),
        None => Ok(()),
    }
}

/// Tensor parallelism splits heads (and key/value heads) evenly over the ranks.
fn check_tp(model: &ModelShape, tp: u32) -> Result<(), PlanError> {
    at_least_one("--tp", tp as u64)?;
    if model.n_heads % tp != 0 {
        return Err(invalid(
            "--tp",
            format!(
                "{tp} does not divide {} attention heads: use one of {}",
                model.n_heads,
                divisors(model.n_heads)
            ),
        ));
    }
    if model.mla.is_none() && model.n_kv_heads % tp != 0 {
        return Err(invalid(
            "--tp",
            format!(
                "{tp} does not divide {} key/value heads: use one of {}",
                model.n_kv_heads,
                divisors(model.n_kv_heads)
            ),
        ));
    }
    Ok(())
}

impl TrainSetup {
    /// Checks the setup alone (no model): degrees, sizes, ZeRO/offload combinations.
    pub fn validate_alone(&self) -> Result<(), PlanError> {
        at_least_one("--gpus", self.dp as u64)?;
        at_least_one("--tp", self.tp as u64)?;
        at_least_one("--pp", self.pp as u64)?;
        at_least_one("--batch", self.micro_batch)?;
        at_least_one("--seq", self.seq)?;
        at_least_one("--grad-accum", self.grad_accum as u64)?;
        if let Recompute::Every(0) = self.recompute {
            return Err(invalid(
                "--recompute",
                "every:0 keeps no block: use every:K with K >= 1, or none".into(),
            ));
        }
        match (self.offload, self.zero) {
            (Offload::Params, z) if z != ZeroStage::Zero3 => Err(invalid(
                "--offload",
                "params offload needs sharded parameters: add --zero 3, or use --offload optimizer"
                    .into(),
            )),
            (Offload::Optimizer, ZeroStage::Zero0) => Err(invalid(
                "--offload",
                "optimizer offload works on ZeRO's optimizer partitions: add --zero 1 (or 2, 3)"
                    .into(),
            )),
            _ => Ok(()),
        }?;
        if let Some(lora) = &self.lora {
            at_least_one("--lora-rank", lora.rank as u64)?;
            check_dropout(lora.dropout)?;
            if !matches!(
                lora.base,
                Dtype::F32 | Dtype::Bf16 | Dtype::F16 | Dtype::Int8 | Dtype::Nf4
            ) {
                return Err(invalid(
                    "--lora-base",
                    format!(
                        "{:?} is not a LoRA base format: use fp32, bf16, int8 or nf4",
                        lora.base
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks the setup against `model`.
    pub fn validate(&self, model: &ModelShape) -> Result<(), PlanError> {
        model.validate()?;
        self.validate_alone()?;
        check_tp(model, self.tp)?;
        if self.pp > model.n_layers {
            return Err(invalid(
                "--pp",
                format!(
                    "{} pipeline stages for {} layers: use at most {}",
                    self.pp, model.n_layers, model.n_layers
                ),
            ));
        }
        if self.sp && self.tp == 1 {
            return Err(invalid(
                "--sp",
                "sequence parallelism splits along the tensor-parallel group: add --tp 2 or more"
                    .into(),
            ));
        }
        check_positions(model, self.seq)?;
        if let Some(lora) = &self.lora {
            crate::lora::check_targets(model, &lora.targets)?;
            crate::lora::check_rank(model, lora.rank, &lora.targets)?;
        }
        Ok(())
    }
}

/// A sequence longer than the model reaches: GPT-2's learned table has no more rows, and a
/// rotary model's config says how far it goes (`max_position_embeddings`, times its
/// `rope_scaling` factor where that extends it: vLLM's derived context).
pub fn check_positions(model: &ModelShape, seq: u64) -> Result<(), PlanError> {
    if seq <= model.max_positions {
        return Ok(());
    }
    let how = if model.family == crate::model::Family::Gpt2 {
        format!(
            "the {} learned positions of {}",
            model.max_positions, model.name
        )
    } else {
        format!(
            "the {} positions {} reaches (max_position_embeddings, times a rope_scaling factor \
             where its config.json sets one)",
            model.max_positions, model.name
        )
    };
    Err(invalid(
        "--seq",
        format!(
            "{seq} tokens exceed {how}: use --seq {} or less",
            model.max_positions
        ),
    ))
}

/// LoRA dropout: a probability in [0, 1).
pub fn check_dropout(p: f32) -> Result<(), PlanError> {
    if !(0.0..1.0).contains(&p) {
        return Err(invalid(
            "--lora-dropout",
            format!("{p} is not a probability below 1 (0.05-0.1 are usual)"),
        ));
    }
    Ok(())
}

/// Tokens per KV block, in every command: 1 to this (vLLM's blocks are 16 or 32 tokens; a block
/// of more than 4096 is a contiguous cache by another name).
pub const KV_BLOCK_MAX: u64 = 4096;

/// Refuses a KV block size outside 1..=[`KV_BLOCK_MAX`], naming `--kv-block`.
pub fn check_kv_block(block: u64) -> Result<(), PlanError> {
    if block == 0 || block > KV_BLOCK_MAX {
        return Err(invalid(
            "--kv-block",
            format!("{block}: tokens per KV block must be 1 to {KV_BLOCK_MAX} (16 is usual)"),
        ));
    }
    Ok(())
}

impl InferSetup {
    /// Checks the setup against `model`.
    pub fn validate(&self, model: &ModelShape) -> Result<(), PlanError> {
        model.validate()?;
        at_least_one("--batch", self.batch)?;
        at_least_one("--seq", self.seq)?;
        check_tp(model, self.tp)?;
        check_positions(model, self.seq)?;
        if let Some(g) = self.weight_group {
            at_least_one("--weight-group", g)?;
            check_groups(model, g)?;
        }
        if let Some(b) = self.kv_block {
            check_kv_block(b)?;
        }
        if matches!(self.kv_dtype, Dtype::Int4 | Dtype::Nf4 | Dtype::Ggml) {
            return Err(invalid(
                "--kv-dtype",
                format!(
                    "{} KV caches are not modelled: use bf16, fp16, fp8 or int8",
                    crate::setup::dtype_name(self.kv_dtype)
                ),
            ));
        }
        Ok(())
    }
}
