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
use super::{Family, Numerics};
use crate::config::ModelConfig;
use kernels::moe::{Gating, Routing};
use serde_json::{json, Map, Value};

pub struct Deepseek;

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

impl Family for Deepseek {
    fn model_types(&self) -> &'static [&'static str] {
        &["deepseek_v2"]
    }

    fn numerics(&self, obj: &Map<String, Value>) -> Result<Numerics, String> {
        Ok(Numerics {
            routing: routing(obj)?,
            ..Llama.numerics(obj)?
        })
    }

    fn to_hf(&self, config: &ModelConfig) -> Value {
        let s = &config.shape;
        let a = s
            .mla
            .as_ref()
            .expect("a DeepSeek shape has latent attention");
        let e = s.moe.as_ref();
        let (gating, groups) = (config.routing.gating, config.routing.groups);
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
            "rms_norm_eps": config.norm_eps,
            "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
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
    fn presets_train_without_a_balance_loss_and_the_kernel_limit_matches_the_plan() {
        let shape = plan::presets::by_name("deepseek-tiny").unwrap();
        let config = ModelConfig::from_shape(shape).unwrap();
        assert_eq!(
            config.router_aux_coef, 0.0,
            "HF 5 adds no auxiliary loss to DeepSeek"
        );
        let mixtral = plan::presets::by_name("mixtral-tiny").unwrap();
        let config = ModelConfig::from_shape(mixtral).unwrap();
        assert_eq!(config.router_aux_coef, crate::config::PRESET_AUX_COEF);
        let limit = plan_frugal::serve::MAX_LATENT_RANK;
        assert_eq!(kernels::mla::MAX_RANK as u64, limit);
    }

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
