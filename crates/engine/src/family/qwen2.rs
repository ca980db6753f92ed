//! Qwen2's numerics: Llama's (RMSNorm epsilon, RoPE base, SiLU), with the q/k/v biases its
//! blocks always carry; refused: a sliding window in use (`use_sliding_window`), scaled RoPE.
//! Its config.json is HF's `Qwen2ForCausalLM`.
//!
//! Example: `{"model_type": "qwen2", "use_sliding_window": true}` is refused, naming the field.

use super::llama::Llama;
use super::{Family, Numerics};
use crate::config::ModelConfig;
use serde_json::{json, Map, Value};

pub struct Qwen2;

impl Family for Qwen2 {
    fn model_types(&self) -> &'static [&'static str] {
        &["qwen2"]
    }

    fn numerics(&self, obj: &Map<String, Value>) -> Result<Numerics, String> {
        if obj.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            return Err("use_sliding_window is true: sliding-window attention is not built".into());
        }
        // Qwen2's q/k/v biases are part of the family, not an option: Llama's bias checks
        // (attention_bias, mlp_bias) do not apply.
        let mut plain = obj.clone();
        plain.remove("attention_bias");
        Llama.numerics(&plain)
    }

    fn to_hf(&self, config: &ModelConfig) -> Value {
        let s = &config.shape;
        json!({
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": s.vocab,
            "hidden_size": s.d_model,
            "intermediate_size": s.d_ff,
            "num_hidden_layers": s.n_layers,
            "num_attention_heads": s.n_heads,
            "num_key_value_heads": s.n_kv_heads,
            "max_position_embeddings": s.max_positions,
            "rms_norm_eps": config.norm_eps,
            "rope_theta": config.rope_theta,
            "hidden_act": "silu",
            "use_sliding_window": false,
            "tie_word_embeddings": s.tied_embeddings,
            "torch_dtype": "float32",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen2_configs_read_with_their_biases_and_refuse_a_sliding_window() {
        let obj = |v: Value| v.as_object().unwrap().clone();
        let ok = obj(json!({"rms_norm_eps": 1e-6, "rope_theta": 1e6, "attention_bias": true}));
        assert_eq!(Qwen2.numerics(&ok).unwrap().rope_theta, 1e6);
        let slide = obj(json!({"use_sliding_window": true, "sliding_window": 4096}));
        assert!(Qwen2
            .numerics(&slide)
            .unwrap_err()
            .contains("use_sliding_window"));
    }
}
