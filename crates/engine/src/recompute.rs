//! Recompute ("activation checkpointing"): which buffers each block's forward writes and its
//! backward reads under a policy, and the recomputation a block's backward runs first.
//!
//! The plan (`plan::frugal::acts`) decides what is kept and when recomputed tensors are born;
//! this file follows it. A segment policy (`full`, `every:K`, `sqrt`) runs the forward of a whole
//! segment again at the start of the backward of its last block, from the segment's kept input,
//! with the same kernels in the same order, so every recomputed value, and therefore every
//! gradient, is bit-identical to a run without recompute. The segment's last output is kept from
//! the forward pass and not written again. `keep-matmuls` recomputes, in each block's own
//! backward, the norms (from the block input and `res2`), the attention core (from `qkv`) and the
//! MLP activation (from `fch`); `selective` (Megatron's) only the attention probabilities.
//!
//! What it does not do: decide lifetimes or sizes (the plan), or enter phases (the trainer).
//!
//! Example: `backward::block` calls `recompute::before_backward(model, arena, layer)` first; with
//! `every:2` on 4 blocks, layer 3 recomputes blocks 2 and 3, layer 2 recomputes nothing.

use crate::arena::{Arena, BufId};
use crate::forward::{self, BlockPass};
use crate::model::{BlockActs, Model};
use plan::frugal::acts::{
    block_out_forward_name, block_out_name, block_tensor_name, forward_scratch_name, ActPolicy,
    BlockTensor,
};
use plan::recompute::{Kept, RecomputePlan};

/// Arena ids of every block's tensors: what the backward reads, and where the forward writes.
pub fn wire(arena: &Arena, n_layers: u32, policy: ActPolicy) -> (Vec<BlockActs>, Vec<BlockActs>) {
    let read = |layer: u32, t: BlockTensor| arena.try_id(&block_tensor_name(layer, t));
    let written = |layer: u32, t: BlockTensor| {
        let name = if policy.recomputes(t) {
            forward_scratch_name(layer, t)
        } else {
            block_tensor_name(layer, t)
        };
        arena.try_id(&name)
    };
    let mut backward = Vec::with_capacity(n_layers as usize);
    let mut forward = Vec::with_capacity(n_layers as usize);
    for layer in 0..n_layers {
        let out = arena.id(&block_out_name(layer));
        let out_fwd = arena.try_id(&block_out_forward_name(layer)).unwrap_or(out);
        backward.push(block_acts(&|t| read(layer, t), out));
        forward.push(block_acts(&|t| written(layer, t), out_fwd));
    }
    (backward, forward)
}

fn block_acts(id: &dyn Fn(BlockTensor) -> Option<BufId>, out: BufId) -> BlockActs {
    let must = |t: BlockTensor| id(t).unwrap_or_else(|| panic!("the plan has no {t:?} buffer"));
    BlockActs {
        ln1: must(BlockTensor::Ln1),
        ln1_mean: id(BlockTensor::Ln1Mean),
        ln1_rstd: must(BlockTensor::Ln1Rstd),
        qkv: must(BlockTensor::Qkv),
        att: id(BlockTensor::Att),
        lse: id(BlockTensor::Lse),
        atty: must(BlockTensor::Atty),
        res2: must(BlockTensor::Res2),
        ln2: must(BlockTensor::Ln2),
        ln2_mean: id(BlockTensor::Ln2Mean),
        ln2_rstd: must(BlockTensor::Ln2Rstd),
        fch: must(BlockTensor::Fch),
        fch_act: must(BlockTensor::FchAct),
        out,
    }
}

/// Rebuilds what block `layer`'s backward reads but the forward did not keep (a no-op without
/// recompute). Runs inside `Backward(layer)`, where the plan makes those buffers live.
pub fn before_backward(model: &Model, arena: &Arena, layer: usize) {
    let n_layers = model.config.shape.n_layers;
    let (b, t) = (model.shape.batch as usize, model.shape.seq as usize);
    let plan = RecomputePlan::of(model.policy.recompute, n_layers);
    match (plan.segment(layer as u32), plan.kept) {
        (None, Kept::Everything) => {}
        (None, Kept::AllButAttentionCore) => {
            forward::recompute_attention_core(model, arena, layer, b, t)
        }
        (None, Kept::MatmulOutputs) => forward::recompute_cheap(model, arena, layer, b, t),
        (Some((first, last)), _) => {
            if last as usize != layer {
                return;
            }
            for l in first as usize..=layer {
                let pass = BlockPass {
                    inp: forward::block_input(model, l),
                    acts: model.blocks[l],
                    write_out: l != layer,
                };
                forward::block_with(model, arena, l, b, t, &pass);
            }
        }
    }
}
