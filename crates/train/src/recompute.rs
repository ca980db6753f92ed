//! Recompute ("activation checkpointing"): which buffers each block's forward writes and its
//! backward reads under a policy, and the recomputation a block's backward runs first.
//!
//! The plan (`plan_frugal::acts`) decides what is kept and when recomputed tensors are born;
//! this file follows it. A segment policy (`full`, `every:K`, `sqrt`) runs the forward of a whole
//! segment again at the start of the backward of its last block, from the segment's kept input,
//! with the same kernels in the same order, so every recomputed value, and therefore every
//! gradient, is bit-identical to a run without recompute. The segment's last output is kept from
//! the forward pass and not written again. `keep-matmuls` recomputes, in each block's own
//! backward, the norms (from the block input and `res2`), the attention core (from `qkv`) and the
//! MLP activation (from `fch`); `selective` (Megatron's) only the attention probabilities.
//!
//! Megatron's `selective` reruns only the attention core, so the probabilities exist only from the
//! block's own backward on (nothing under flash attention, which keeps no probabilities).
//! Which tensors the forward writes where (kept, or into the forward's scratch) is wired in
//! `Model::new`; what the backward reads, in `TrainState::new`.
//!
//! What it does not do: decide lifetimes or sizes (the plan), or enter phases (the trainer).
//!
//! Example: `backward::block` calls `recompute::before_backward(model, state, arena, layer)` first; with
//! `every:2` on 4 blocks, layer 3 recomputes blocks 2 and 3, layer 2 recomputes nothing.

use crate::TrainState;
use engine::arena::Arena;
use engine::backend::TrainOps;
use engine::forward::{self, BlockPass};
use engine::model::Model;
use plan::recompute::{Kept, RecomputePlan};

/// Rebuilds what block `layer`'s backward reads but the forward did not keep (a no-op without
/// recompute). Runs inside `Backward(layer)`, where the plan makes those buffers live.
pub fn before_backward<B: TrainOps>(
    model: &Model,
    state: &TrainState,
    arena: &Arena<B>,
    layer: usize,
) {
    let n_layers = model.config.shape.n_layers;
    let (b, t) = (model.shape.batch as usize, model.shape.seq as usize);
    let plan = RecomputePlan::of(model.policy.recompute, n_layers);
    match (plan.segment(layer as u32), plan.kept) {
        (None, Kept::Everything) => {}
        (None, Kept::AllButAttentionCore) => {
            let a = &state.blocks[layer];
            if a.att.is_some() {
                forward::Ctx::new(model, arena, layer, b, t).attention_core(a);
            }
        }
        (None, Kept::MatmulOutputs) => {
            forward::recompute_cheap(model, arena, &state.blocks, layer, (b, t))
        }
        (Some((first, last)), _) => {
            if last as usize != layer {
                return;
            }
            for l in first as usize..=layer {
                let pass = BlockPass {
                    inp: forward::block_input(model, &state.blocks, l),
                    acts: state.blocks[l],
                    write_out: l != layer,
                    forward_pass: false,
                };
                forward::block_with(model, arena, l, b, t, &pass);
            }
        }
    }
}
