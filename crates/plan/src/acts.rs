//! Activation bytes per transformer block, after Korthikanti et al. 2022 ("Reducing Activation
//! Recomputation in Large Transformer Models"), generalised to GQA, SwiGLU, MoE and MLA.
//!
//! For GPT-2 with 16-bit activations and 1-byte dropout masks this is exactly the paper's
//! `sbh(34 + 5as/h)` per layer; with tensor parallelism `t`: `sbh(10 + 24/t + 5as/(ht))`; with
//! sequence parallelism everything is divided by `t`. Flash attention drops the `5as/h` term
//! (scores, softmax, dropout of the T×T matrix) and keeps the log-sum-exp instead. Not here: how
//! long each buffer lives (the `formula` runtime's timeline) or what PyTorch really saves (the
//! `pytorch` profile). Example: `LayerActs::of(&shape, &setup, 0).saved_bytes`.

use crate::model::Family;
use crate::setup::{Attention, Precision, TrainSetup};
use crate::ModelShape;

/// Bytes one block keeps for backward for one micro-batch on one tensor-parallel rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerActs {
    /// Everything the block saves without recomputation.
    pub saved_bytes: u64,
    /// Saved with selective recomputation (the attention core's T×T tensors recomputed).
    pub selective_bytes: u64,
    /// Saved under keep-matmuls: the block's input, q|k|v, the attention block's output (the
    /// residual stream after it) and the MLP's first matmul output.
    pub keep_matmuls_bytes: u64,
    /// The block's input, which full recomputation keeps.
    pub input_bytes: u64,
    /// Largest activation gradient inside the block (backward workspace).
    pub widest_grad_bytes: u64,
}

/// Bytes per activation element under `precision`.
pub fn act_bytes(precision: Precision) -> u64 {
    if precision == Precision::Fp32 {
        4
    } else {
        2
    }
}

impl LayerActs {
    /// Activations of block `layer_idx` of `model` under `setup`.
    pub fn of(model: &ModelShape, setup: &TrainSetup, layer_idx: u32) -> LayerActs {
        let a = act_bytes(setup.precision);
        let (s, b, h) = (setup.seq, setup.micro_batch, model.d_model);
        let t = setup.tp as u64;
        let sb = s * b;
        let heads = model.n_heads as u64;
        let dropout = model.family == Family::Gpt2;
        // Replicated across TP ranks (divided by t only under sequence parallelism): the two
        // norms' inputs, the attention and MLP inputs, the two dropout masks after them.
        let mut replicated = 4 * a * sb * h;
        if dropout {
            replicated += 2 * sb * h;
        }
        let (q_dim, k_dim, v_dim) = match &model.mla {
            Some(m) => {
                let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
                // The latent path: kv_a output and its norm's output (and the q latent's).
                let latent = m.kv_lora_rank + m.qk_rope_head_dim + m.q_lora_rank.unwrap_or(0);
                replicated += 2 * a * sb * latent;
                (heads * qk, heads * qk, heads * m.v_head_dim)
            }
            None => {
                let kv = model.n_kv_heads as u64 * model.d_head;
                (heads * model.d_head, kv, kv)
            }
        };
        // Split over TP ranks: q, k, v, the attention output, the MLP's inner activations.
        let mut split = a * sb * (q_dim + k_dim + v_dim);
        split += a * sb * (heads * v_head(model));
        let mlp = mlp_bytes(model, layer_idx, a, sb);
        split += mlp;
        let core = match setup.attention {
            // Flash keeps the fp32 log-sum-exp per row instead of the T×T matrices.
            Attention::Flash => 4 * sb * heads,
            Attention::Eager => {
                let scores = b * heads * s * s;
                if dropout {
                    (2 * a + 1) * scores
                } else {
                    a * scores
                }
            }
        };
        let router = match &model.moe {
            Some(m) if model.is_moe_layer(layer_idx) => 4 * sb * m.n_experts as u64,
            _ => 0,
        };
        let sp_div = if setup.sp { t } else { 1 };
        let base = replicated / sp_div + split / t + router;
        let flash_core = if setup.attention == Attention::Flash {
            core / t
        } else {
            0
        };
        let mlp_in = match (&model.moe, model.family) {
            (Some(m), _) if model.is_moe_layer(layer_idx) => {
                m.n_active as u64 * 2 * m.d_ff_expert + 2 * m.d_ff_expert * m.n_shared as u64
            }
            (_, Family::Gpt2) => model.d_ff,
            _ => 2 * model.d_ff,
        };
        let matmul_outputs = a * sb * (q_dim + k_dim + v_dim + mlp_in) / t;
        LayerActs {
            keep_matmuls_bytes: 2 * a * sb * h / sp_div + matmul_outputs + router,
            saved_bytes: base + core / t,
            selective_bytes: base + flash_core,
            input_bytes: a * sb * h / sp_div,
            widest_grad_bytes: a * sb * (q_dim + k_dim + v_dim).max(2 * model.d_ff) / t,
        }
    }
}

fn v_head(model: &ModelShape) -> u64 {
    model.mla.as_ref().map_or(model.d_head, |m| m.v_head_dim)
}

/// Saved MLP activations: GELU keeps its input and the second linear's input (2 × d_ff);
/// SwiGLU keeps gate, up, silu(gate) and their product (4 × d_ff); an MoE layer does that for
/// each of its top-k experts per token (plus the routed copy of the input) and its shared experts.
fn mlp_bytes(model: &ModelShape, layer_idx: u32, a: u64, sb: u64) -> u64 {
    if model.family == Family::Gpt2 {
        return 2 * a * sb * model.d_ff;
    }
    match &model.moe {
        Some(m) if model.is_moe_layer(layer_idx) => {
            let k = m.n_active as u64;
            let routed = k * (a * sb * model.d_model + 4 * a * sb * m.d_ff_expert);
            routed + 4 * a * sb * m.d_ff_expert * m.n_shared as u64
        }
        _ => 4 * a * sb * model.d_ff,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    fn setup(tp: u32, sp: bool, attention: Attention) -> TrainSetup {
        TrainSetup {
            tp,
            sp,
            attention,
            ..TrainSetup::new(2, 1024)
        }
    }

    #[test]
    fn gpt2_matches_korthikanti() {
        let m = presets::by_name("gpt2-124m").unwrap();
        let (s, b, h, a) = (1024u64, 2u64, 768u64, 12u64);
        let acts = LayerActs::of(&m, &setup(1, false, Attention::Eager), 0);
        assert_eq!(acts.saved_bytes, s * b * h * 34 + 5 * a * s * s * b);
        assert_eq!(acts.selective_bytes, s * b * h * 34);
        // Tensor parallel t = 4: sbh(10 + 24/t + 5as/(ht)).
        let tp = LayerActs::of(&m, &setup(4, false, Attention::Eager), 0);
        assert_eq!(tp.saved_bytes, s * b * h * (10 + 6) + 5 * a * s * s * b / 4);
        // Plus sequence parallel: sbh(34 + 5as/h)/t.
        let sp = LayerActs::of(&m, &setup(4, true, Attention::Eager), 0);
        assert_eq!(sp.saved_bytes, (s * b * h * 34 + 5 * a * s * s * b) / 4);
        assert_eq!(sp.input_bytes, 2 * s * b * h / 4);
    }
}
