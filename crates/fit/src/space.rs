//! The candidate setups `fit` weighs: every layout of the GPUs into data × tensor × pipeline
//! parallel groups, and within each every ZeRO stage, offload, recompute policy, micro-batch
//! (dividing the rank's share of the global batch, the rest accumulated), attention kernel and,
//! when allowed, LoRA/QLoRA base format.
//!
//! Only valid combinations are produced: TP stays inside a node and divides the heads (and the
//! key/value heads), PP is at most the layer count, the data-parallel degree divides the global
//! batch, optimizer offload needs ZeRO ≥ 1 and parameter offload ZeRO-3 (as DeepSpeed requires).
//! Sequence parallelism is always on with TP: it moves the same bytes as TP's all-reduces and
//! keeps less. Not here: estimating or ranking. Example: `candidates(&model, &request)`.

use super::{Bounds, LoraChoice};
use plan::setup::{
    Attention, Lora, Offload, Optimizer, Precision, Recompute, TrainSetup, ZeroStage,
};
use plan::ModelShape;

/// A data × tensor × pipeline split of the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub dp: u32,
    pub tp: u32,
    pub pp: u32,
}

fn divisors(n: u64) -> Vec<u64> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// Layouts of `gpus` GPUs that `model` allows, ignoring the batch.
pub fn layouts(model: &ModelShape, gpus: u32, gpus_per_node: u32, b: &Bounds) -> Vec<Layout> {
    let mut out = Vec::new();
    for tp in divisors(gpus as u64).into_iter().map(|d| d as u32) {
        let heads_ok =
            model.n_heads % tp == 0 && (model.mla.is_some() || model.n_kv_heads % tp == 0);
        if tp > gpus_per_node || !heads_ok || b.tp.is_some_and(|t| t != tp) {
            continue;
        }
        for pp in divisors((gpus / tp) as u64).into_iter().map(|d| d as u32) {
            if pp > model.n_layers || b.pp.is_some_and(|p| p != pp) {
                continue;
            }
            out.push(Layout {
                dp: gpus / (tp * pp),
                tp,
                pp,
            });
        }
    }
    out
}

/// The recompute policies tried for `n_layers` blocks per stage: none, selective, keep-matmuls,
/// full, sqrt,
/// and every:2 / every:4 where they differ from those.
pub fn recompute_policies(n_layers: u32) -> Vec<Recompute> {
    let mut out = vec![
        Recompute::None,
        Recompute::Selective,
        Recompute::KeepMatmuls,
        Recompute::Full,
        Recompute::Sqrt,
    ];
    let sqrt_k = plan::recompute::RecomputePlan::of(Recompute::Sqrt, n_layers)
        .segment_len
        .unwrap_or(1);
    for k in [2, 4] {
        if k < n_layers && k != sqrt_k {
            out.push(Recompute::Every(k));
        }
    }
    if sqrt_k <= 1 || sqrt_k >= n_layers {
        out.retain(|r| *r != Recompute::Sqrt);
    }
    out
}

/// ZeRO stage and offload pairs DeepSpeed accepts.
pub const ZERO_OFFLOAD: [(ZeroStage, Offload); 8] = [
    (ZeroStage::Zero0, Offload::None),
    (ZeroStage::Zero1, Offload::None),
    (ZeroStage::Zero1, Offload::Optimizer),
    (ZeroStage::Zero2, Offload::None),
    (ZeroStage::Zero2, Offload::Optimizer),
    (ZeroStage::Zero3, Offload::None),
    (ZeroStage::Zero3, Offload::Optimizer),
    (ZeroStage::Zero3, Offload::Params),
];

/// What stays fixed across the candidates: the user's training choices.
pub struct Fixed<'a> {
    pub template: &'a TrainSetup,
    /// Sequences per optimizer step over all data-parallel ranks.
    pub global_batch: u64,
    pub gpus: u32,
    pub gpus_per_node: u32,
    pub bounds: &'a Bounds,
    /// LoRA variants to try (`[None]` unless LoRA is allowed, or the setup's own LoRA).
    pub lora: &'a [Option<Lora>],
    /// Precision and optimizer pairs to try (the user's first).
    pub states: &'a [(Precision, Optimizer)],
}

/// The user's precision and optimizer, then the leaner ones a search may propose: pure bf16
/// (no fp32 master copy) and 8-bit AdamW.
pub fn state_variants(precision: Precision, optimizer: Optimizer) -> Vec<(Precision, Optimizer)> {
    let mut out = vec![(precision, optimizer)];
    let adam8 = optimizer == Optimizer::AdamW;
    if adam8 {
        out.push((precision, Optimizer::AdamW8bit));
    }
    if precision != Precision::PureBf16 {
        out.push((Precision::PureBf16, optimizer));
        if adam8 {
            out.push((Precision::PureBf16, Optimizer::AdamW8bit));
        }
    }
    out
}

/// Every candidate setup, layouts in order, calling `visit` on each.
pub fn for_each_candidate(model: &ModelShape, f: &Fixed, mut visit: impl FnMut(&TrainSetup)) {
    let mut s = f.template.clone();
    for layout in layouts(model, f.gpus, f.gpus_per_node, f.bounds) {
        if f.global_batch % layout.dp as u64 != 0 {
            continue;
        }
        let per_rank = f.global_batch / layout.dp as u64;
        (s.dp, s.tp, s.pp, s.sp) = (layout.dp, layout.tp, layout.pp, layout.tp > 1);
        let layers = model.n_layers.div_ceil(layout.pp);
        // On one data-parallel rank a ZeRO stage shards nothing: it only carries offload.
        let pairs = ZERO_OFFLOAD.iter().filter(|(z, o)| {
            f.bounds.allows(*z, *o)
                && (layout.dp > 1 || *z == ZeroStage::Zero0 || *o != Offload::None)
        });
        for &(zero, offload) in pairs {
            (s.zero, s.offload) = (zero, offload);
            for recompute in recompute_policies(layers) {
                if !f.bounds.allows_recompute(recompute) {
                    continue;
                }
                s.recompute = recompute;
                for &attention in &[Attention::Flash, Attention::Eager] {
                    if !f.bounds.allows_attention(attention) {
                        continue;
                    }
                    s.attention = attention;
                    for micro in divisors(per_rank) {
                        (s.micro_batch, s.grad_accum) = (micro, (per_rank / micro) as u32);
                        for lora in f.lora {
                            s.lora.clone_from(lora);
                            for &(precision, optimizer) in f.states {
                                (s.precision, s.optimizer) = (precision, optimizer);
                                visit(&s);
                            }
                        }
                    }
                }
            }
        }
    }
}

impl LoraChoice {
    /// The LoRA variants a search tries: none, then the adapters on each base format.
    pub fn variants(&self) -> Vec<Option<Lora>> {
        let mut out = vec![None];
        for base in [
            plan::setup::Dtype::Bf16,
            plan::setup::Dtype::Int8,
            plan::setup::Dtype::Nf4,
        ] {
            out.push(Some(Lora {
                rank: self.rank,
                targets: self.targets.clone(),
                base,
                double_quant: base == plan::setup::Dtype::Nf4,
                dropout: 0.0,
                ggml: None,
            }));
        }
        out
    }
}
