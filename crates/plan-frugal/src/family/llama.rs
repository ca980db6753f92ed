//! Llama (and Mistral without a sliding window): rotary positions, RMSNorm, a SwiGLU MLP, no
//! biases, grouped-query attention, an untied output projection unless the config ties it. The
//! q/k/v and gate/up projections are fused into one view each, as row ranges of several HF
//! tensors.
//!
//! Example: block 0's fused q|k|v view is filled by `model.layers.0.self_attn.{q,k,v}_proj.weight`.
//!
//! Llama's numerics: RMSNorm epsilon and RoPE base from the config (HF's defaults 1e-6 and
//! 10000); refused: another activation than SiLU, scaled RoPE, biases on the projections. Its
//! config.json is HF's `LlamaForCausalLM`; Mistral configs read as Llama with their sliding
//! window (the shape's, `plan::hf_config`), which the attention kernels honour.
//!
//! Example: `rope_scaling: {"type": "linear"}` is refused, naming the field.

use super::{Arch, BlockDesign, HfConfig, Mlp, Norm, Numerics, Positions};
use crate::units::{Role, UnitBuilder};
use plan::model::Routing;
use plan::{ModelShape, PlanError};
use serde_json::{json, Map, Value};

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

impl HfConfig for Llama {
    fn model_types(&self) -> &'static [&'static str] {
        &["llama", "mistral"]
    }

    fn numerics(&self, obj: &Map<String, Value>) -> Result<Numerics, String> {
        let act = obj
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" {
            return Err(format!("hidden_act {act:?}: only SwiGLU (silu) is built"));
        }
        if obj.get("rope_scaling").is_some_and(|v| !v.is_null()) {
            return Err("rope_scaling is set: scaled RoPE is not built".into());
        }
        // transformers 5 writes the base inside `rope_parameters` (with its type).
        let rope = obj.get("rope_parameters").and_then(Value::as_object);
        if let Some(kind) = rope
            .and_then(|r| r.get("rope_type"))
            .and_then(Value::as_str)
        {
            if kind != "default" {
                return Err(format!(
                    "rope_parameters.rope_type {kind:?}: only default RoPE is built"
                ));
            }
        }
        let nested_theta = rope
            .and_then(|r| r.get("rope_theta"))
            .and_then(Value::as_f64);
        for key in ["attention_bias", "mlp_bias"] {
            if obj.get(key).and_then(Value::as_bool) == Some(true) {
                return Err(format!(
                    "{key} is true: Llama projections here have no biases"
                ));
            }
        }
        let f = |key: &str, default: f64| obj.get(key).and_then(Value::as_f64).unwrap_or(default);
        let theta = obj
            .get("rope_theta")
            .and_then(Value::as_f64)
            .or(nested_theta)
            .unwrap_or(10_000.0);
        let numerics = Numerics {
            norm_eps: f("rms_norm_eps", 1e-6) as f32,
            rope_theta: theta as f32,
            router_aux_coef: 0.0,
            routing: Routing::RENORMALISED,
        };
        // Either would make every loss NaN: refused here, where the config is to blame.
        if !(numerics.norm_eps.is_finite() && numerics.norm_eps > 0.0) {
            return Err(format!(
                "rms_norm_eps {}: use a small positive number such as 1e-5 (0 divides by zero \
                 on an all-zero row)",
                f("rms_norm_eps", 1e-6)
            ));
        }
        if !(numerics.rope_theta.is_finite() && numerics.rope_theta > 1.0) {
            return Err(format!(
                "rope_theta {theta}: use a base above 1 such as 10000 or 500000"
            ));
        }
        Ok(numerics)
    }

    fn to_hf(&self, shape: &ModelShape, numerics: &Numerics) -> Value {
        let s = shape;
        let mut v = json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": s.vocab,
            "hidden_size": s.d_model,
            "intermediate_size": s.d_ff,
            "num_hidden_layers": s.n_layers,
            "num_attention_heads": s.n_heads,
            "num_key_value_heads": s.n_kv_heads,
            "head_dim": s.d_head,
            "max_position_embeddings": s.max_positions,
            "rms_norm_eps": numerics.norm_eps,
            "rope_theta": numerics.rope_theta,
            "hidden_act": "silu",
            "attention_bias": false, "mlp_bias": false,
            "tie_word_embeddings": s.tied_embeddings,
            "torch_dtype": "float32",
        });
        if let Some(w) = s.sliding_window {
            // A windowed Llama block is Mistral's.
            let o = v.as_object_mut().expect("a JSON object");
            o.insert("architectures".into(), json!(["MistralForCausalLM"]));
            o.insert("model_type".into(), json!("mistral"));
            o.insert("sliding_window".into(), json!(w.window));
            for key in ["attention_bias", "mlp_bias"] {
                o.remove(key);
            }
        }
        v
    }
}
