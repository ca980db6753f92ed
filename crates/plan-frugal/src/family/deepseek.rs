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
//!
//! DeepSeek-V2's numerics: RMSNorm epsilon (the latents' norms use HF's fixed 1e-6), the RoPE
//! base (`rope_parameters`, default RoPE only: the released checkpoints' YaRN scaling is
//! refused), and the router as transformers 5's `DeepseekV2TopkRouter`: softmax in f32, top-k
//! (`topk_method` greedy, or group_limited_greedy over `n_group` groups keeping `topk_group`),
//! gates = the chosen probabilities × `routed_scaling_factor`. transformers 5 adds no
//! load-balancing loss for this family, so none is trained. Refused: `norm_topk_prob` true
//! (transformers 5 ignores it, DeepSeek's own code renormalises: ambiguous), biases, another
//! activation. Its config.json is HF's `DeepseekV2ForCausalLM`.
//!
//! Example: `{"topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3}` routes
//! within the 3 best of 8 groups.

use super::llama::Llama;
use super::{Arch, BlockDesign, HfConfig, Mlp, Norm, Numerics, Positions};
use crate::units::{Role, UnitBuilder};
use plan::model::{Gating, Routing};
use plan::{ModelShape, PlanError};
use serde_json::{json, Map, Value};

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

/// HF's `DeepseekV2RMSNorm` default, used by `q_a_layernorm` and `kv_a_layernorm`.
pub const LATENT_NORM_EPS: f32 = 1e-6;

fn routing(obj: &Map<String, Value>) -> Result<Routing, String> {
    let f = |k: &str| obj.get(k).and_then(Value::as_f64);
    let scale = f("routed_scaling_factor").unwrap_or(1.0);
    if !(scale.is_finite() && scale > 0.0) {
        return Err(format!(
            "routed_scaling_factor {scale}: use a positive factor"
        ));
    }
    if obj.get("norm_topk_prob").and_then(Value::as_bool) == Some(true) {
        return Err(
            "norm_topk_prob is true: transformers 5 ignores it and DeepSeek's code \
                    renormalises; set it to false (as DeepSeek-V2's configs do)"
                .into(),
        );
    }
    let method = obj
        .get("topk_method")
        .and_then(Value::as_str)
        .unwrap_or("greedy");
    let groups = match method {
        "greedy" => None,
        "group_limited_greedy" => {
            let n = |k: &str| obj.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
            let (g, kept) = (n("n_group"), n("topk_group"));
            let experts = n("n_routed_experts");
            let k = n("num_experts_per_tok");
            let fits = g > 0 && g <= 64 && experts % g == 0 && kept >= 1 && kept <= g;
            if !fits || k > kept * (experts / g) {
                return Err(format!(
                    "n_group {g} / topk_group {kept}: need groups dividing the {experts} experts, \
                     at most 64, and top-{k} within the kept groups"
                ));
            }
            Some((g, kept))
        }
        other => {
            return Err(format!(
                "topk_method {other:?}: greedy or group_limited_greedy"
            ))
        }
    };
    Ok(Routing {
        gating: Gating::Scaled(scale as f32),
        groups,
    })
}

impl HfConfig for Deepseek {
    fn model_types(&self) -> &'static [&'static str] {
        &["deepseek_v2"]
    }

    fn numerics(&self, obj: &Map<String, Value>) -> Result<Numerics, String> {
        Ok(Numerics {
            routing: routing(obj)?,
            ..Llama.numerics(obj)?
        })
    }

    fn to_hf(&self, shape: &ModelShape, numerics: &Numerics) -> Value {
        let s = shape;
        let a = s
            .mla
            .as_ref()
            .expect("a DeepSeek shape has latent attention");
        let e = s.moe.as_ref();
        let (gating, groups) = (numerics.routing.gating, numerics.routing.groups);
        let scale = match gating {
            Gating::Scaled(f) => f64::from(f),
            Gating::Renormalise => 1.0,
        };
        json!({
            "architectures": ["DeepseekV2ForCausalLM"],
            "model_type": "deepseek_v2",
            "vocab_size": s.vocab,
            "hidden_size": s.d_model,
            "intermediate_size": s.d_ff,
            "moe_intermediate_size": e.map_or(0, |e| e.d_ff_expert),
            "num_hidden_layers": s.n_layers,
            "num_attention_heads": s.n_heads,
            "num_key_value_heads": s.n_heads,
            "n_routed_experts": e.map_or(0, |e| e.n_experts),
            "n_shared_experts": e.map_or(0, |e| e.n_shared),
            "num_experts_per_tok": e.map_or(0, |e| e.n_active),
            "first_k_dense_replace": e.map_or(s.n_layers, |e| e.first_dense),
            "routed_scaling_factor": scale,
            "topk_method": if groups.is_some() { "group_limited_greedy" } else { "greedy" },
            "n_group": groups.map(|g| g.0),
            "topk_group": groups.map(|g| g.1),
            "norm_topk_prob": false,
            "q_lora_rank": a.q_lora_rank,
            "kv_lora_rank": a.kv_lora_rank,
            "qk_rope_head_dim": a.qk_rope_head_dim,
            "qk_nope_head_dim": a.qk_nope_head_dim,
            "v_head_dim": a.v_head_dim,
            "head_dim": a.qk_rope_head_dim,
            "max_position_embeddings": s.max_positions,
            "rms_norm_eps": numerics.norm_eps,
            "rope_parameters": {"rope_theta": numerics.rope_theta, "rope_type": "default"},
            "hidden_act": "silu",
            "attention_bias": false, "mlp_bias": false,
            "tie_word_embeddings": s.tied_embeddings,
            "torch_dtype": "float32",
        })
    }

    fn default_routing(&self) -> Routing {
        Routing {
            gating: Gating::Scaled(1.0),
            groups: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_reads_the_scaling_and_the_groups_and_refuses_ambiguity() {
        let obj = |v: Value| v.as_object().unwrap().clone();
        let r = routing(&obj(json!({"routed_scaling_factor": 16.0}))).unwrap();
        assert_eq!(r.gating, Gating::Scaled(16.0));
        let grouped = obj(json!({"topk_method": "group_limited_greedy", "n_group": 8,
            "topk_group": 3, "n_routed_experts": 160, "num_experts_per_tok": 6}));
        assert_eq!(routing(&grouped).unwrap().groups, Some((8, 3)));
        let bad = obj(json!({"topk_method": "group_limited_greedy", "n_group": 7,
            "topk_group": 3, "n_routed_experts": 160, "num_experts_per_tok": 6}));
        assert!(routing(&bad).unwrap_err().contains("n_group 7"));
        let norm = obj(json!({"norm_topk_prob": true}));
        assert!(routing(&norm).unwrap_err().contains("norm_topk_prob"));
    }
}
