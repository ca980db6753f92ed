//! GPT-2's numerics: a fixed LayerNorm epsilon of 1e-5 (the kernel's) and the tanh GELU; the
//! config.json of HF's `GPT2LMHeadModel`, dropout off.
//!
//! Example: `layer_norm_epsilon: 1e-6` is refused, naming the field.

use super::{Family, Numerics};
use crate::config::ModelConfig;
use serde_json::{json, Map, Value};

/// GPT-2's LayerNorm epsilon, which the layernorm kernel fixes.
pub const LN_EPS: f64 = 1e-5;

pub struct Gpt2;

impl Family for Gpt2 {
    fn model_types(&self) -> &'static [&'static str] {
        &["gpt2"]
    }

    fn numerics(&self, obj: &Map<String, Value>) -> Result<Numerics, String> {
        let act = obj
            .get("activation_function")
            .and_then(Value::as_str)
            .unwrap_or("gelu_new");
        if act != "gelu_new" && act != "gelu_pytorch_tanh" {
            return Err(format!(
                "activation_function {act:?}: only the tanh GELU is built"
            ));
        }
        let eps = obj
            .get("layer_norm_epsilon")
            .and_then(Value::as_f64)
            .unwrap_or(LN_EPS);
        if (eps - LN_EPS).abs() > 1e-12 {
            return Err(format!(
                "layer_norm_epsilon {eps}: the LayerNorm kernel uses 1e-5"
            ));
        }
        Ok(Numerics {
            norm_eps: LN_EPS as f32,
            rope_theta: 10_000.0,
            router_aux_coef: 0.0,
            routing: kernels::moe::Routing::RENORMALISED,
        })
    }

    fn to_hf(&self, config: &ModelConfig) -> Value {
        let s = &config.shape;
        let mut v = json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": s.vocab,
            "n_positions": s.max_positions,
            "n_embd": s.d_model,
            "n_layer": s.n_layers,
            "n_head": s.n_heads,
            "n_inner": s.d_ff,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": LN_EPS,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "tie_word_embeddings": true,
            "torch_dtype": "float32",
        });
        // GPT-2's <|endoftext|>, only when the vocabulary holds it (tiny test models do not).
        if s.vocab > 50256 {
            v["bos_token_id"] = json!(50256);
            v["eos_token_id"] = json!(50256);
        }
        v
    }
}
