//! What a recompute policy keeps and how the backward rebuilds the rest: one description that
//! every runtime profile (`formula`, `pytorch`, `frugal`), the advisor's cost model and the engine
//! read, so "full", "every:K" or "selective" mean one thing everywhere.
//!
//! Two families of policy:
//! - **segments** (`full` = `every:1`, `every:K`, `sqrt` = `every:round(√L)`): blocks form segments
//!   of K from block 0; only each segment's input is kept, and the backward of a segment's last
//!   block reruns the whole segment's forward.
//! - **within a block** (no segments): `selective` is Megatron's (Korthikanti et al. 2022): keep
//!   everything but the attention core's T×T tensors, recomputed in each block's own backward
//!   (with flash attention there are none: it keeps what `none` keeps); `keep-matmuls` keeps only
//!   the matmul outputs and the residual stream and recomputes the norms, the attention core and
//!   the MLP activation (PyTorch's selective checkpointing with a save-matmuls policy).
//!
//! Example: `RecomputePlan::of(Recompute::Sqrt, 12).segment(5)` is `Some((3, 5))`.

use crate::setup::Recompute;

/// Inside a block, without segments: what the forward keeps for the block's own backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// Every tensor the backward reads (no recompute, or a segment policy's recomputed blocks).
    Everything,
    /// All but the attention core's T×T scores and probabilities (Megatron's selective).
    AllButAttentionCore,
    /// The matmul outputs and the residual stream only (keep-matmuls).
    MatmulOutputs,
}

/// One recompute policy, resolved for a model of `n_layers` blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecomputePlan {
    pub policy: Recompute,
    /// Blocks per segment whose forward the backward reruns (`None`: no segments).
    pub segment_len: Option<u32>,
    /// What a block keeps for its own backward when there are no segments.
    pub kept: Kept,
    pub n_layers: u32,
}

impl RecomputePlan {
    pub fn of(policy: Recompute, n_layers: u32) -> RecomputePlan {
        let n = n_layers.max(1);
        let (segment_len, kept) = match policy {
            Recompute::None => (None, Kept::Everything),
            Recompute::Selective => (None, Kept::AllButAttentionCore),
            Recompute::KeepMatmuls => (None, Kept::MatmulOutputs),
            Recompute::Full => (Some(1), Kept::Everything),
            Recompute::Every(k) => (Some(k.clamp(1, n)), Kept::Everything),
            Recompute::Sqrt => (
                Some(((n as f64).sqrt().round() as u32).max(1)),
                Kept::Everything,
            ),
        };
        RecomputePlan {
            policy,
            segment_len,
            kept,
            n_layers,
        }
    }

    /// First and last block of the segment holding `layer` (`None` without segments).
    pub fn segment(&self, layer: u32) -> Option<(u32, u32)> {
        self.segment_len.map(|k| {
            let first = layer / k * k;
            (first, (first + k - 1).min(self.n_layers.saturating_sub(1)))
        })
    }

    /// Whether the backward reruns whole block forwards (a segment policy).
    pub fn reruns_blocks(&self) -> bool {
        self.segment_len.is_some()
    }

    /// Whether the attention core (scores, softmax) runs again in the backward.
    pub fn recomputes_attention_core(&self) -> bool {
        self.reruns_blocks() || self.kept != Kept::Everything
    }

    /// Whether the norms and the MLP activation run again in the backward.
    pub fn recomputes_pointwise(&self) -> bool {
        self.reruns_blocks() || self.kept == Kept::MatmulOutputs
    }

    /// Whether any tensor is recomputed at all.
    pub fn recomputes_anything(&self) -> bool {
        self.recomputes_attention_core()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_blocks_from_block_zero() {
        let p = RecomputePlan::of(Recompute::Every(2), 5);
        assert_eq!(p.segment(0), Some((0, 1)));
        assert_eq!(p.segment(4), Some((4, 4)));
        assert_eq!(
            RecomputePlan::of(Recompute::Sqrt, 12).segment(5),
            Some((3, 5))
        );
        assert_eq!(
            RecomputePlan::of(Recompute::Every(9), 4).segment_len,
            Some(4)
        );
        assert_eq!(RecomputePlan::of(Recompute::Selective, 4).segment(1), None);
    }

    #[test]
    fn the_two_selective_policies_recompute_different_things() {
        let megatron = RecomputePlan::of(Recompute::Selective, 4);
        assert!(megatron.recomputes_attention_core() && !megatron.recomputes_pointwise());
        let matmuls = RecomputePlan::of(Recompute::KeepMatmuls, 4);
        assert!(matmuls.recomputes_attention_core() && matmuls.recomputes_pointwise());
        assert!(!RecomputePlan::of(Recompute::None, 4).recomputes_anything());
        assert!(RecomputePlan::of(Recompute::Full, 4).reruns_blocks());
    }
}
