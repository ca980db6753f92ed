//! Element counts of a block's tensors: [`BlockDims::layer`] for one layer (layers differ when a
//! model mixes dense and mixture-of-experts MLPs, DeepSeek's `first_k_dense_replace`), and
//! [`BlockDims::new`], the largest of every count over the layers, which sizes the scratch every
//! block shares.
//!
//! Example: for DeepSeek-V2-Lite, `BlockDims::layer(m, s, 0).experts` is 0 (a dense layer) and
//! `BlockDims::layer(m, s, 1).experts` is 64.

use super::super::family::{self, Mlp, Norm};
use super::ActShape;
use plan::ModelShape;

/// Multi-head latent attention's sizes (DeepSeek-V2): queries (directly or through a rank-`q_rank`
/// bottleneck) and keys/values expanded from a rank-`kv_rank` latent, each head's q and k
/// `nope + rope` wide, values `v` wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaDims {
    pub heads: u64,
    pub nope: u64,
    pub rope: u64,
    pub v: u64,
    pub kv_rank: u64,
    pub q_rank: Option<u64>,
}

impl MlaDims {
    /// A query's (and key's) width per head: the attention kernels' head size.
    pub fn qk(&self) -> u64 {
        self.nope + self.rope
    }

    /// Width of the key/value expansion `kv_b_proj`: heads × (nope + v).
    pub fn kv(&self) -> u64 {
        self.heads * (self.nope + self.v)
    }

    /// Width of `kv_a_proj_with_mqa`: the latent and the shared RoPE key.
    pub fn ckv(&self) -> u64 {
        self.kv_rank + self.rope
    }
}

/// Element counts of one block's saved tensors and of the backward scratch.
#[derive(Clone, Copy, Debug)]
pub struct BlockDims {
    /// Rows: batch × seq.
    pub n: u64,
    /// Rows of the norms' region on this rank: `n`, or `n / tp` under sequence parallelism.
    pub local: u64,
    pub c: u64,
    /// Width of the fused q|k|v row: (NH + 2 NKV) HD (MLA: 3 NH (nope + rope), values padded).
    pub qkv: u64,
    /// Width of the attention output the projection reads: NH HD (MLA: NH v).
    pub atty: u64,
    /// Width of the MLP's first matmul output: 4C (GPT-2) or 2F (Llama gate|up).
    pub fc: u64,
    /// Width of the MLP's activation output: F.
    pub fc_act: u64,
    /// Elements of the attention probabilities: B NH T T.
    pub att: u64,
    /// Elements of flash attention's log-sum-exp per row: B NH T.
    pub lse: u64,
    /// Whether norms keep a mean (LayerNorm) besides the reciprocal std.
    pub has_mean: bool,
    /// Mixture of experts: routed experts (0 for a dense MLP) and choices per token.
    pub experts: u64,
    pub top_k: u64,
    /// Width of the always-on shared experts' MLP (DeepSeek; 0 for none).
    pub shared: u64,
    pub mla: Option<MlaDims>,
}

impl BlockDims {
    /// The counts of block `layer`.
    pub fn layer(m: &ModelShape, s: ActShape, layer: u32) -> BlockDims {
        let n = s.batch * s.seq;
        let design = family::design(m);
        let mla = m.mla.as_ref().map(|a| MlaDims {
            heads: m.n_heads.into(),
            nope: a.qk_nope_head_dim,
            rope: a.qk_rope_head_dim,
            v: a.v_head_dim,
            kv_rank: a.kv_lora_rank,
            q_rank: a.q_lora_rank,
        });
        let (qkv, atty) = match mla {
            Some(a) => (3 * a.heads * a.qk(), a.heads * a.v),
            None => {
                let atty = u64::from(m.n_heads) * m.d_head;
                (atty + 2 * u64::from(m.n_kv_heads) * m.d_head, atty)
            }
        };
        let moe = m
            .moe
            .as_ref()
            .filter(|e| design.moe && layer >= e.first_dense);
        // An expert's MLP is as wide as its own intermediate size.
        let f = moe.map_or(m.d_ff, |e| e.d_ff_expert);
        BlockDims {
            n,
            local: n,
            c: m.d_model,
            qkv,
            atty,
            fc: match design.mlp {
                Mlp::Gelu => f,
                Mlp::SwiGlu => 2 * f,
            },
            fc_act: f,
            att: s.batch * u64::from(m.n_heads) * s.seq * s.seq,
            lse: s.batch * u64::from(m.n_heads) * s.seq,
            has_mean: design.norm == Norm::LayerNorm,
            experts: moe.map_or(0, |e| e.n_experts.into()),
            top_k: moe.map_or(1, |e| e.n_active.into()),
            shared: moe.map_or(0, |e| u64::from(e.n_shared) * e.d_ff_expert),
            mla,
        }
    }

    /// The largest count of every field over the model's layers (what shared scratch needs).
    pub fn new(m: &ModelShape, s: ActShape) -> BlockDims {
        (1..m.n_layers.max(1)).fold(BlockDims::layer(m, s, 0), |a, l| {
            let b = BlockDims::layer(m, s, l);
            BlockDims {
                fc: a.fc.max(b.fc),
                fc_act: a.fc_act.max(b.fc_act),
                experts: a.experts.max(b.experts),
                top_k: a.top_k.max(b.top_k),
                shared: a.shared.max(b.shared),
                ..a
            }
        })
    }

    /// These counts with the norms' region split over `shards` ranks (sequence parallelism).
    pub fn sequence_parallel(self, shards: u64) -> BlockDims {
        BlockDims {
            local: self.n / shards.max(1),
            ..self
        }
    }

    /// Rows the MLP's matmuls run on: N, or N·k routed rows in expert order.
    pub fn routed(&self) -> u64 {
        self.n * self.top_k
    }

    /// u32 elements of a block's routing tables (`kernels::moe::route_len`).
    pub fn route_len(&self) -> u64 {
        3 * self.routed() + self.experts + 1
    }

    /// The widest output any of the block's linear layers writes per row.
    pub fn widest_out(&self) -> u64 {
        let mla = self.mla.map_or(0, |a| {
            (a.heads * a.qk())
                .max(a.kv())
                .max(a.ckv())
                .max(a.q_rank.unwrap_or(0))
        });
        self.c
            .max(self.qkv)
            .max(self.fc)
            .max(self.experts)
            .max(2 * self.shared)
            .max(mla)
    }

    /// The widest input any of the block's linear layers reads per row.
    pub fn widest_in(&self) -> u64 {
        let mla = self.mla.map_or(0, |a| a.kv_rank.max(a.q_rank.unwrap_or(0)));
        self.c
            .max(self.atty)
            .max(self.fc_act)
            .max(self.shared)
            .max(mla)
    }
}
