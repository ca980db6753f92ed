//! The model the engine builds: the planner's [`ModelShape`] plus the numeric facts the memory
//! model does not need (norm epsilon, RoPE base), read from and written to HF `config.json`.
//!
//! Only GPT-2 and Llama-style models are built; anything else (an unknown `model_type`, RoPE
//! scaling, a different activation, biases on Llama projections) is refused with
//! [`EngineError::Config`] naming the field, never approximated.
//!
//! Example: `ModelConfig::from_hf_json(text, "config.json")?.shape.n_layers`.

use crate::error::EngineError;
use plan::model::Family;
use plan::ModelShape;
use serde_json::{json, Map, Value};

/// A buildable model: shape plus numerics.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub shape: ModelShape,
    /// RMSNorm epsilon (Llama); GPT-2's LayerNorm uses the kernels' fixed 1e-5.
    pub norm_eps: f32,
    /// RoPE base (Llama).
    pub rope_theta: f32,
}

/// GPT-2's LayerNorm epsilon, which the layernorm kernel fixes.
const GPT2_LN_EPS: f64 = 1e-5;

impl ModelConfig {
    /// A config with HF's defaults for the numerics of `shape`'s family.
    pub fn from_shape(shape: ModelShape) -> Result<ModelConfig, EngineError> {
        plan::frugal::units::check_buildable(&shape).map_err(|e| EngineError::Config {
            source_name: shape.name.clone(),
            reason: e.to_string(),
        })?;
        Ok(ModelConfig {
            shape,
            norm_eps: 1e-5,
            rope_theta: 10_000.0,
        })
    }

    /// Parses an HF `config.json` (GPT-2 or Llama).
    pub fn from_hf_json(text: &str, source_name: &str) -> Result<ModelConfig, EngineError> {
        let fail = |reason: String| EngineError::Config {
            source_name: source_name.into(),
            reason,
        };
        let v: Value = serde_json::from_str(text).map_err(|e| fail(format!("not JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| fail("not a JSON object".into()))?;
        let model_type = obj.get("model_type").and_then(Value::as_str).unwrap_or("");
        let mut config = match model_type {
            "gpt2" => gpt2_from_hf(obj, source_name),
            "llama" | "mistral" => llama_from_hf(obj, source_name),
            other => Err(format!(
                "model_type {other:?} is not built by this engine (gpt2 and llama are)"
            )),
        }
        .map_err(fail)?;
        // The planner's parser is the one source of the shape; ours only adds the numerics.
        config.shape = plan::hf_config::parse(text, source_name)?;
        ModelConfig::from_shape(config.shape.clone())?;
        Ok(config)
    }

    /// The HF `config.json` that makes transformers build this same model.
    pub fn to_hf_json(&self) -> String {
        let s = &self.shape;
        let v = match s.family {
            Family::Gpt2 => json!({
                "architectures": ["GPT2LMHeadModel"],
                "model_type": "gpt2",
                "vocab_size": s.vocab,
                "n_positions": s.max_positions,
                "n_embd": s.d_model,
                "n_layer": s.n_layers,
                "n_head": s.n_heads,
                "n_inner": s.d_ff,
                "activation_function": "gelu_new",
                "layer_norm_epsilon": GPT2_LN_EPS,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "tie_word_embeddings": true,
                "torch_dtype": "float32",
            }),
            _ => json!({
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
                "rms_norm_eps": self.norm_eps,
                "rope_theta": self.rope_theta,
                "hidden_act": "silu",
                "attention_bias": false, "mlp_bias": false,
                "tie_word_embeddings": s.tied_embeddings,
                "torch_dtype": "float32",
            }),
        };
        let mut v = v;
        // GPT-2's <|endoftext|>, only when the vocabulary holds it (tiny test models do not).
        if s.family == Family::Gpt2 && s.vocab > 50256 {
            v["bos_token_id"] = json!(50256);
            v["eos_token_id"] = json!(50256);
        }
        serde_json::to_string_pretty(&v).expect("a JSON value serialises")
    }
}

fn get_u64(obj: &Map<String, Value>, key: &str) -> Result<u64, String> {
    obj.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("missing or non-integer field {key:?}"))
}

fn gpt2_from_hf(obj: &Map<String, Value>, name: &str) -> Result<ModelConfig, String> {
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
        .unwrap_or(GPT2_LN_EPS);
    if (eps - GPT2_LN_EPS).abs() > 1e-12 {
        return Err(format!(
            "layer_norm_epsilon {eps}: the LayerNorm kernel uses 1e-5"
        ));
    }
    let c = get_u64(obj, "n_embd")?;
    let n_heads = get_u64(obj, "n_head")? as u32;
    if n_heads == 0 || c % u64::from(n_heads) != 0 {
        return Err(format!("n_embd {c} is not a multiple of n_head {n_heads}"));
    }
    let d_ff = match obj.get("n_inner") {
        Some(Value::Number(n)) => n.as_u64().ok_or("n_inner is not an integer")?,
        _ => 4 * c,
    };
    let shape = ModelShape {
        name: name.into(),
        family: Family::Gpt2,
        n_layers: get_u64(obj, "n_layer")? as u32,
        d_model: c,
        n_heads,
        n_kv_heads: n_heads,
        d_head: c / u64::from(n_heads),
        d_ff,
        vocab: get_u64(obj, "vocab_size")?,
        max_positions: get_u64(obj, "n_positions")?,
        tied_embeddings: true,
        moe: None,
        mla: None,
    };
    Ok(ModelConfig {
        shape,
        norm_eps: GPT2_LN_EPS as f32,
        rope_theta: 10_000.0,
    })
}

fn llama_from_hf(obj: &Map<String, Value>, name: &str) -> Result<ModelConfig, String> {
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
    for key in ["attention_bias", "mlp_bias"] {
        if obj.get(key).and_then(Value::as_bool) == Some(true) {
            return Err(format!(
                "{key} is true: Llama projections here have no biases"
            ));
        }
    }
    let c = get_u64(obj, "hidden_size")?;
    let n_heads = get_u64(obj, "num_attention_heads")? as u32;
    let n_kv_heads = obj
        .get("num_key_value_heads")
        .and_then(Value::as_u64)
        .map_or(n_heads, |n| n as u32);
    if n_heads == 0 {
        return Err("num_attention_heads is 0".into());
    }
    let d_head = match obj.get("head_dim").and_then(Value::as_u64) {
        Some(d) => d,
        None => c / u64::from(n_heads),
    };
    let shape = ModelShape {
        name: name.into(),
        family: Family::Llama,
        n_layers: get_u64(obj, "num_hidden_layers")? as u32,
        d_model: c,
        n_heads,
        n_kv_heads,
        d_head,
        d_ff: get_u64(obj, "intermediate_size")?,
        vocab: get_u64(obj, "vocab_size")?,
        max_positions: get_u64(obj, "max_position_embeddings")?,
        tied_embeddings: obj
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        moe: None,
        mla: None,
    };
    let f = |key: &str, default: f64| obj.get(key).and_then(Value::as_f64).unwrap_or(default);
    Ok(ModelConfig {
        shape,
        norm_eps: f("rms_norm_eps", 1e-6) as f32,
        rope_theta: f("rope_theta", 10_000.0) as f32,
    })
}
