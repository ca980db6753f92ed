//! Llama's numerics: RMSNorm epsilon and RoPE base from the config (HF's defaults 1e-6 and
//! 10000); refused: another activation than SiLU, scaled RoPE, biases on the projections. Its
//! config.json is HF's `LlamaForCausalLM`; Mistral configs read as Llama with their sliding
//! window (the shape's, `plan::hf_config`), which the attention kernels honour.
//!
//! Example: `rope_scaling: {"type": "linear"}` is refused, naming the field.

use super::{Family, Numerics};
use crate::config::ModelConfig;
use serde_json::{json, Map, Value};

pub struct Llama;

impl Family for Llama {
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
            routing: kernels::moe::Routing::RENORMALISED,
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

    fn to_hf(&self, config: &ModelConfig) -> Value {
        let s = &config.shape;
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
            "rms_norm_eps": config.norm_eps,
            "rope_theta": config.rope_theta,
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
