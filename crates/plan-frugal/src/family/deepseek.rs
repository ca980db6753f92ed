//! DeepSeek-V2: multi-head latent attention (queries directly or through a `q_lora_rank`
//! bottleneck with its RMSNorm; keys and values expanded from a `kv_lora_rank` latent with its
//! RMSNorm; a decoupled RoPE key of `qk_rope_head_dim` shared by every head), RMSNorm blocks, and
//! from `first_k_dense_replace` on a mixture-of-experts MLP: a router, routed SwiGLU experts of
//! `moe_intermediate_size` and `n_shared_experts` always-on experts run as one SwiGLU MLP of
//! n_shared × that width. The first layers have a dense SwiGLU MLP of `intermediate_size`. Names
//! are those `save_pretrained` writes (`mlp.experts.{e}.gate_proj`, ...; transformers 5 holds
//! routed experts as 3-D tensors in memory only).
//!
//! Refused: the DeepSeek-V3 router's score-correction bias, values wider than the query/key
//! heads (the attention kernels pad each value to the head size), an odd RoPE dimension.
//!
//! Example: block 1's `Role::MlaKva` is `model.layers.1.self_attn.kv_a_proj_with_mqa.weight`.

use super::llama::Llama;
use super::{Arch, BlockDesign, Mlp, Norm, Positions};
use crate::units::{Role, UnitBuilder};
use plan::{ModelShape, PlanError};

pub struct Deepseek;

fn invalid(field: &str, reason: String) -> Result<(), PlanError> {
    Err(PlanError::Invalid {
        field: field.into(),
        reason,
    })
}

impl Arch for Deepseek {
    fn design(&self) -> BlockDesign {
        BlockDesign {
            norm: Norm::RmsNorm,
            positions: Positions::Rope,
            mlp: Mlp::SwiGlu,
            moe: true,
            mla: true,
        }
    }

    fn check(&self, m: &ModelShape) -> Result<(), PlanError> {
        let Some(a) = &m.mla else {
            return invalid(
                "kv_lora_rank",
                "a DeepSeek-V2 model has latent attention".into(),
            );
        };
        if a.qk_rope_head_dim % 2 != 0 || a.qk_rope_head_dim == 0 {
            return invalid(
                "qk_rope_head_dim",
                format!("{} must be positive and even for RoPE", a.qk_rope_head_dim),
            );
        }
        if a.v_head_dim > a.qk_nope_head_dim + a.qk_rope_head_dim || a.v_head_dim == 0 {
            return invalid(
                "v_head_dim",
                format!(
                    "{} must be positive and at most qk_nope_head_dim + qk_rope_head_dim = {}",
                    a.v_head_dim,
                    a.qk_nope_head_dim + a.qk_rope_head_dim
                ),
            );
        }
        if a.kv_lora_rank == 0 || a.q_lora_rank == Some(0) {
            return invalid("kv_lora_rank", "latent ranks must be positive".into());
        }
        if m.moe.as_ref().is_some_and(|e| e.router_bias) {
            return invalid(
                "model_type",
                "DeepSeek-V3's router bias (noaux_tc routing) is not built".into(),
            );
        }
        Ok(())
    }

    fn embed(&self, m: &ModelShape, u: &mut UnitBuilder) {
        Llama.embed(m, u)
    }

    fn block(&self, m: &ModelShape, layer: u32, u: &mut UnitBuilder) {
        let a = m.mla.as_ref().expect("checked: latent attention");
        let c = m.d_model;
        let h = u64::from(m.n_heads);
        let qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
        let p = |s: &str| format!("model.layers.{layer}.{s}");
        u.one(Role::Norm1Weight, &[c], &p("input_layernorm.weight"), false);
        match a.q_lora_rank {
            Some(rq) => {
                u.one(
                    Role::MlaQa,
                    &[rq, c],
                    &p("self_attn.q_a_proj.weight"),
                    false,
                );
                let norm = p("self_attn.q_a_layernorm.weight");
                u.one(Role::MlaQaNorm, &[rq], &norm, false);
                u.one(
                    Role::MlaQb,
                    &[h * qk, rq],
                    &p("self_attn.q_b_proj.weight"),
                    false,
                );
            }
            None => u.one(
                Role::MlaQ,
                &[h * qk, c],
                &p("self_attn.q_proj.weight"),
                false,
            ),
        }
        let ckv = a.kv_lora_rank + a.qk_rope_head_dim;
        let kva = p("self_attn.kv_a_proj_with_mqa.weight");
        u.one(Role::MlaKva, &[ckv, c], &kva, false);
        let kv_norm = p("self_attn.kv_a_layernorm.weight");
        u.one(Role::MlaKvNorm, &[a.kv_lora_rank], &kv_norm, false);
        let kv = h * (a.qk_nope_head_dim + a.v_head_dim);
        let kvb = p("self_attn.kv_b_proj.weight");
        u.one(Role::MlaKvb, &[kv, a.kv_lora_rank], &kvb, false);
        let o = p("self_attn.o_proj.weight");
        u.one(Role::AttnProjWeight, &[c, h * a.v_head_dim], &o, false);
        let norm2 = p("post_attention_layernorm.weight");
        u.one(Role::Norm2Weight, &[c], &norm2, false);
        let swiglu = |u: &mut UnitBuilder, prefix: &str, f: u64, roles: (Role, Role)| {
            let gate_up = [
                (p(&format!("{prefix}.gate_proj.weight")), f, false),
                (p(&format!("{prefix}.up_proj.weight")), f, false),
            ];
            u.view(roles.0, &[2 * f, c], &gate_up);
            let down = p(&format!("{prefix}.down_proj.weight"));
            u.one(roles.1, &[c, f], &down, false);
        };
        let moe = m.moe.as_ref().filter(|e| layer >= e.first_dense);
        let Some(e) = moe else {
            return swiglu(u, "mlp", m.d_ff, (Role::FcWeight, Role::FcProjWeight));
        };
        let (f, n) = (e.d_ff_expert, u64::from(e.n_experts));
        u.one(Role::RouterWeight, &[n, c], &p("mlp.gate.weight"), false);
        let gate_up: Vec<_> = (0..n)
            .flat_map(|x| {
                [
                    (p(&format!("mlp.experts.{x}.gate_proj.weight")), f, false),
                    (p(&format!("mlp.experts.{x}.up_proj.weight")), f, false),
                ]
            })
            .collect();
        u.view(Role::ExpertsFcWeight, &[n * 2 * f, c], &gate_up);
        let down: Vec<_> = (0..n)
            .map(|x| (p(&format!("mlp.experts.{x}.down_proj.weight")), c, false))
            .collect();
        u.view(Role::ExpertsProjWeight, &[n * c, f], &down);
        if e.n_shared > 0 {
            let s = u64::from(e.n_shared) * f;
            let roles = (Role::SharedFcWeight, Role::SharedProjWeight);
            swiglu(u, "mlp.shared_experts", s, roles);
        }
    }

    fn head(&self, m: &ModelShape, u: &mut UnitBuilder) {
        Llama.head(m, u)
    }
}
