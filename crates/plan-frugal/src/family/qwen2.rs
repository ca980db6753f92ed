//! Qwen2 (and Qwen2.5): Llama blocks with biases on the q, k and v projections (and none
//! elsewhere), tied embeddings at the small sizes. The fused q|k|v bias is one view filled by the
//! three HF bias tensors, as the weight is.
//!
//! Example: block 0's `Role::QkvBias` is `model.layers.0.self_attn.{q,k,v}_proj.bias`.
//!
//! Qwen2's numerics: Llama's (RMSNorm epsilon, RoPE base, SiLU), with the q/k/v biases its
//! blocks always carry; a sliding window (`use_sliding_window`, from `max_window_layers` on) is
//! the shape's (`plan::hf_config`) and the attention kernels honour it per layer; refused: scaled
//! RoPE. Its config.json is HF's `Qwen2ForCausalLM`.
//!
//! Example: `{"model_type": "qwen2", "rope_scaling": {"type": "yarn"}}` is refused, naming the field.

use super::llama::Llama;
use super::{Arch, BlockDesign, HfConfig, Numerics};
use crate::units::{Role, UnitBuilder};
use plan::{ModelShape, PlanError};
use serde_json::{json, Map, Value};

pub struct Qwen2;

impl Arch for Qwen2 {
    fn design(&self) -> BlockDesign {
        Llama.design()
    }

    fn check(&self, m: &ModelShape) -> Result<(), PlanError> {
        Llama.check(m)
    }

    fn embed(&self, m: &ModelShape, u: &mut UnitBuilder) {
        Llama.embed(m, u)
    }

    fn block(&self, m: &ModelShape, layer: u32, u: &mut UnitBuilder) {
        // Llama's views with the q|k|v bias right after the q|k|v weight.
        let mut base = UnitBuilder::scratch();
        Llama.block(m, layer, &mut base);
        let q_rows = u64::from(m.n_heads) * m.d_head;
        let kv_rows = u64::from(m.n_kv_heads) * m.d_head;
        let p = |s: &str| format!("model.layers.{layer}.self_attn.{s}");
        for v in base.into_views() {
            let (role, shape, parts) = v;
            u.view(role, &shape, &parts);
            if role == Role::QkvWeight {
                let bias = [
                    (p("q_proj.bias"), q_rows, false),
                    (p("k_proj.bias"), kv_rows, false),
                    (p("v_proj.bias"), kv_rows, false),
                ];
                u.view(Role::QkvBias, &[q_rows + 2 * kv_rows], &bias);
            }
        }
    }

    fn head(&self, m: &ModelShape, u: &mut UnitBuilder) {
        Llama.head(m, u)
    }
}

impl HfConfig for Qwen2 {
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

    fn to_hf(&self, shape: &ModelShape, numerics: &Numerics) -> Value {
        // Llama's config.json with Qwen2's names; its q/k/v biases need no flag.
        let mut v = Llama.to_hf(shape, numerics);
        let o = v.as_object_mut().expect("a JSON object");
        for key in ["head_dim", "attention_bias", "mlp_bias"] {
            o.remove(key);
        }
        o.insert("architectures".into(), json!(["Qwen2ForCausalLM"]));
        o.insert("model_type".into(), json!("qwen2"));
        o.remove("sliding_window");
        match shape.sliding_window {
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
