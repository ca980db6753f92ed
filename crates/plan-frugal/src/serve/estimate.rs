//! The serving plan in the report's shape (`frugal plan --infer --runtime frugal`), and every
//! tensor-parallel rank's peak.

use super::{serve_plan_rank, KvFormat, ServeSetup, WeightFormat, DEFAULT_KV_BLOCK};
use crate::tp;
use plan::buffer::{Category, Device, Phase};
use plan::runtime::RankPeak;
use plan::setup::{Dtype, InferSetup};
use plan::{ModelShape, PlanError};

/// `frugal plan --infer --runtime frugal`: the serving plan of `setup` (the flags `frugal
/// generate` takes: batch sequences of `seq` tokens, `kv_block` tokens per block or one block per
/// sequence) in the report's shape; under tensor parallelism, rank 0's (the busiest: the first
/// ranks hold one vocabulary row more). Weight formats the engine does not run (fp16, fp8) are
/// refused.
pub fn inference_estimate(
    model: &ModelShape,
    setup: &InferSetup,
    split_k: u64,
) -> Result<plan::InferEstimate, PlanError> {
    let serve = serve_setup(model, setup, split_k)?;
    let tp = setup.tp.max(1);
    let plan = serve_plan_rank(model, &serve, tp, 0)?;
    let mine = tp::rank_shape(model, tp, 0);
    let timeline = plan.timeline(Device::Gpu);
    let at = |phase: Phase| {
        timeline
            .iter()
            .find(|(p, _)| *p == phase)
            .map(|(_, c)| *c)
            .unwrap_or_default()
    };
    let (prefill, decode) = (at(Phase::Prefill), at(Phase::Decode));
    let peak = plan.peak_bytes(Device::Gpu);
    let kv_bytes = prefill[Category::KvCache as usize];
    let per_token = serve.block_bytes(&mine) / serve.kv_block;
    let held = serve.kv_blocks * serve.kv_block;
    Ok(plan::InferEstimate {
        weights_bytes: prefill[Category::Params as usize],
        kv_cache_bytes: kv_bytes,
        // A ring (sliding window) holds fewer slots than the context: no partly filled page.
        kv_waste_bytes: held.saturating_sub(setup.batch * setup.seq) * per_token,
        kv_bytes_per_token: per_token,
        prefill,
        decode,
        peak_bytes: peak,
        // One slab, carved at start: nothing cached beyond it, no CUDA context on the CPU.
        reserved_bytes: crate::assign_offsets(&plan, Device::Gpu).slab_bytes,
        context_bytes: 0,
    })
}

/// Every tensor-parallel rank's serving peak (empty without tensor parallelism).
pub fn rank_peaks(
    model: &ModelShape,
    setup: &InferSetup,
    split_k: u64,
) -> Result<Vec<RankPeak>, PlanError> {
    if setup.tp <= 1 {
        return Ok(Vec::new());
    }
    let serve = serve_setup(model, setup, split_k)?;
    (0..setup.tp)
        .map(|r| {
            Ok(RankPeak {
                stage: 0,
                first_layer: 0,
                layers: model.n_layers,
                tp_rank: r,
                peak_bytes: serve_plan_rank(model, &serve, setup.tp, r)?.peak_bytes(Device::Gpu),
            })
        })
        .collect()
}

/// The engine's setup for the flags of `setup`.
fn serve_setup(
    model: &ModelShape,
    setup: &InferSetup,
    split_k: u64,
) -> Result<ServeSetup, PlanError> {
    let group = setup.weight_group;
    let weights = match setup.weights {
        Dtype::F32 => WeightFormat::F32,
        Dtype::Bf16 => WeightFormat::Bf16,
        Dtype::Int8 => WeightFormat::Int8,
        Dtype::Int4 => WeightFormat::parse("int4", group)?,
        Dtype::Nf4 => WeightFormat::parse("nf4", group)?,
        Dtype::Ggml => match WeightFormat::parse("ggml", group)? {
            WeightFormat::Ggml { group, .. } => WeightFormat::Ggml {
                group,
                nibbles: setup.ggml_nibbles,
            },
            f => f,
        },
        Dtype::F16 | Dtype::Fp8 => {
            return Err(PlanError::Unsupported {
                runtime: "frugal",
                what: "fp16 or fp8 weights (the engine stores f32, bf16, int8, int4 or nf4)".into(),
            })
        }
    };
    let kv = match setup.kv_dtype {
        Dtype::F32 => KvFormat::F32,
        Dtype::Bf16 => KvFormat::Bf16,
        Dtype::Int8 => KvFormat::Int8,
        Dtype::Fp8 => KvFormat::Fp8,
        _ => {
            return Err(PlanError::Unsupported {
                runtime: "frugal",
                what: "this KV format (the engine caches f32, bf16, int8 or fp8)".into(),
            })
        }
    };
    // Without --kv-block, the engine's own default (`frugal generate --kv-block 16`).
    let block = setup.kv_block.unwrap_or(DEFAULT_KV_BLOCK);
    Ok(ServeSetup::generation(
        model,
        setup.batch,
        setup.seq,
        weights,
        kv,
        block,
        split_k,
    ))
}
