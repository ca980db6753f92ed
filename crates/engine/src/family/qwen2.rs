//! Qwen2's numerics: Llama's (RMSNorm epsilon, RoPE base, SiLU), with the q/k/v biases its
//! blocks always carry; a sliding window (`use_sliding_window`, from `max_window_layers` on) is
//! the shape's (`plan::hf_config`) and the attention kernels honour it per layer; refused: scaled
//! RoPE. Its config.json is HF's `Qwen2ForCausalLM`.
//!
//! Example: `{"model_type": "qwen2", "rope_scaling": {"type": "yarn"}}` is refused, naming the field.

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
        // Qwen2's q/k/v biases are part of the family, not an option: Llama's bias checks
        // (attention_bias, mlp_bias) do not apply.
        let mut plain = obj.clone();
        plain.remove("attention_bias");
        Llama.numerics(&plain)
    }

    fn to_hf(&self, config: &ModelConfig) -> Value {
        // Llama's config.json with Qwen2's names; its q/k/v biases need no flag.
        let mut v = Llama.to_hf(config);
        let o = v.as_object_mut().expect("a JSON object");
        for key in ["head_dim", "attention_bias", "mlp_bias"] {
            o.remove(key);
        }
        o.insert("architectures".into(), json!(["Qwen2ForCausalLM"]));
        o.insert("model_type".into(), json!("qwen2"));
        o.remove("sliding_window");
        match config.shape.sliding_window {
            Some(w) => {
                o.insert("use_sliding_window".into(), json!(true));
                o.insert("sliding_window".into(), json!(w.window));
                o.insert("max_window_layers".into(), json!(w.first_layer));
            }
            None => {
                o.insert("use_sliding_window".into(), json!(false));
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen2_configs_read_with_their_biases_and_refuse_scaled_rope() {
        let obj = |v: Value| v.as_object().unwrap().clone();
        let ok = obj(json!({"rms_norm_eps": 1e-6, "rope_theta": 1e6, "attention_bias": true}));
        assert_eq!(Qwen2.numerics(&ok).unwrap().rope_theta, 1e6);
        let slide = obj(json!({"use_sliding_window": true, "sliding_window": 4096}));
        assert!(Qwen2.numerics(&slide).is_ok());
        let scaled = obj(json!({"rope_scaling": {"type": "yarn"}}));
        assert!(Qwen2
            .numerics(&scaled)
            .unwrap_err()
            .contains("rope_scaling"));
    }
}
