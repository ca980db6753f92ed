//! Llama (and Mistral without a sliding window): rotary positions, RMSNorm, a SwiGLU MLP, no
//! biases, grouped-query attention, an untied output projection unless the config ties it. The
//! q/k/v and gate/up projections are fused into one view each, as row ranges of several HF
//! tensors.
//!
//! Example: block 0's fused q|k|v view is filled by `model.layers.0.self_attn.{q,k,v}_proj.weight`.

use super::{Arch, BlockDesign, Mlp, Norm, Positions};
use crate::units::{Role, UnitBuilder};
use plan::{ModelShape, PlanError};

pub struct Llama;

impl Arch for Llama {
    fn design(&self) -> BlockDesign {
        BlockDesign {
            norm: Norm::RmsNorm,
            positions: Positions::Rope,
            mlp: Mlp::SwiGlu,
            moe: false,
            mla: false,
        }
    }

    fn check(&self, m: &ModelShape) -> Result<(), PlanError> {
        if m.d_head % 2 != 0 {
            return Err(PlanError::Invalid {
                field: "d_head".into(),
                reason: format!("{} must be positive and even for RoPE", m.d_head),
            });
        }
        Ok(())
    }

    fn embed(&self, m: &ModelShape, u: &mut UnitBuilder) {
        let shape = [m.vocab, m.d_model];
        u.one(
            Role::TokenEmbedding,
            &shape,
            "model.embed_tokens.weight",
            false,
        );
    }

    fn block(&self, m: &ModelShape, layer: u32, u: &mut UnitBuilder) {
        let (c, f) = (m.d_model, m.d_ff);
        let q_rows = u64::from(m.n_heads) * m.d_head;
        let kv_rows = u64::from(m.n_kv_heads) * m.d_head;
        let p = |s: &str| format!("model.layers.{layer}.{s}");
        u.one(Role::Norm1Weight, &[c], &p("input_layernorm.weight"), false);
        let qkv = [
            (p("self_attn.q_proj.weight"), q_rows, false),
            (p("self_attn.k_proj.weight"), kv_rows, false),
            (p("self_attn.v_proj.weight"), kv_rows, false),
        ];
        u.view(Role::QkvWeight, &[q_rows + 2 * kv_rows, c], &qkv);
        let o_proj = p("self_attn.o_proj.weight");
        u.one(Role::AttnProjWeight, &[c, q_rows], &o_proj, false);
        let norm2 = p("post_attention_layernorm.weight");
        u.one(Role::Norm2Weight, &[c], &norm2, false);
        let gate_up = [
            (p("mlp.gate_proj.weight"), f, false),
            (p("mlp.up_proj.weight"), f, false),
        ];
        u.view(Role::FcWeight, &[2 * f, c], &gate_up);
        u.one(
            Role::FcProjWeight,
            &[c, f],
            &p("mlp.down_proj.weight"),
            false,
        );
    }

    fn head(&self, m: &ModelShape, u: &mut UnitBuilder) {
        u.one(
            Role::FinalNormWeight,
            &[m.d_model],
            "model.norm.weight",
            false,
        );
        if !m.tied_embeddings {
            u.one(Role::LmHead, &[m.vocab, m.d_model], "lm_head.weight", false);
        }
    }
}
