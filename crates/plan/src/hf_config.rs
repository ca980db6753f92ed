//! Parse an HF `config.json` (given as a string) into a [`ModelShape`].
//!
//! Knows each family's `model_type`s (`Family::model_types`: gpt2, llama, mistral, qwen2, mixtral,
//! deepseek_v2 and deepseek_v3), with field names exactly as HF writes them (`n_embd` for GPT-2,
//! `hidden_size` elsewhere). A missing required field is an error naming it; optional fields take
//! HF's defaults. Reading the file is the caller's job. Example: `hf_config::parse(text,
//! "llama/config.json")?.param_count()`.

use crate::model::{Family, Mla, ModelShape, Moe, SlidingWindow};
use crate::PlanError;
use serde_json::{Map, Value};

fn invalid(field: &str, reason: impl Into<String>) -> PlanError {
    PlanError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The JSON object with typed getters that name the missing or mistyped field.
fn narrow(key: &str, v: u64) -> Result<u32, PlanError> {
    u32::try_from(v).map_err(|_| {
        invalid(
            key,
            format!(
                "config.json has {v}: more than {} is not a real model",
                u32::MAX
            ),
        )
    })
}

struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn opt_u64(&self, key: &str) -> Result<Option<u64>, PlanError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                invalid(
                    key,
                    format!("config.json has {v}: expected a non-negative integer"),
                )
            }),
        }
    }

    fn u64(&self, key: &str) -> Result<u64, PlanError> {
        self.opt_u64(key)?.ok_or_else(|| {
            invalid(
                key,
                "missing from config.json: add it (see the model's HF config)",
            )
        })
    }

    fn u32(&self, key: &str) -> Result<u32, PlanError> {
        let v = self.u64(key)?;
        narrow(key, v)
    }

    /// An optional count held as `u32`: a value past `u32::MAX` is refused, never truncated.
    fn opt_u32(&self, key: &str) -> Result<Option<u32>, PlanError> {
        self.opt_u64(key)?.map(|v| narrow(key, v)).transpose()
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, PlanError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| {
                invalid(key, format!("config.json has {v}: expected true or false"))
            }),
        }
    }
}

/// The shape described by the HF `config.json` text `json`; `name` labels it (usually the path).
pub fn parse(json: &str, name: &str) -> Result<ModelShape, PlanError> {
    let value: Value = serde_json::from_str(json).map_err(|e| {
        invalid(
            "config.json",
            format!("not valid JSON ({e}): pass the model's HF config.json"),
        )
    })?;
    let obj = value
        .as_object()
        .ok_or_else(|| invalid("config.json", "expected a JSON object at the top level"))?;
    let f = Fields(obj);
    let known = || {
        let types: Vec<&str> = Family::ALL
            .iter()
            .flat_map(|f| f.model_types())
            .copied()
            .collect();
        let (last, rest) = types.split_last().expect("families read some model_type");
        format!("{} or {last}", rest.join(", "))
    };
    let model_type = obj
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            invalid(
                "model_type",
                format!("missing from config.json: add \"model_type\" ({})", known()),
            )
        })?;
    let family = Family::of_model_type(model_type).ok_or_else(|| {
        invalid(
            "model_type",
            format!("'{model_type}' is not supported: use a {} config", known()),
        )
    })?;
    let mut shape = match family {
        Family::Gpt2 => gpt2(&f)?,
        Family::Mixtral => mixtral(&f)?,
        Family::Deepseek => deepseek(&f)?,
        // Llama's blocks under the family's own name (Qwen2's q/k/v biases are its params').
        llama_blocks => llama_like(&f, llama_blocks)?,
    };
    shape.name = name.to_string();
    shape.validate()?;
    Ok(shape)
}

fn gpt2(f: &Fields) -> Result<ModelShape, PlanError> {
    let d_model = f.u64("n_embd")?;
    let n_heads = f.u32("n_head")?;
    if n_heads == 0 || d_model % n_heads as u64 != 0 {
        return Err(invalid(
            "n_head",
            format!("{n_heads} heads do not divide n_embd {d_model}: use a divisor of {d_model}"),
        ));
    }
    Ok(ModelShape {
        name: String::new(),
        family: Family::Gpt2,
        n_layers: f.u32("n_layer")?,
        d_model,
        n_heads,
        n_kv_heads: n_heads,
        d_head: d_model / n_heads as u64,
        d_ff: f.opt_u64("n_inner")?.unwrap_or(4 * d_model),
        vocab: f.u64("vocab_size")?,
        max_positions: f.u64("n_positions")?,
        tied_embeddings: f.bool_or("tie_word_embeddings", true)?,
        moe: None,
        mla: None,
        sliding_window: None,
    })
}

/// Heads and head size: `head_dim` if given, else hidden_size / num_attention_heads, which must
/// then divide evenly (as HF's attention modules require).
fn heads(f: &Fields, d_model: u64) -> Result<(u32, u32, u64), PlanError> {
    let n_heads = f.u32("num_attention_heads")?;
    let n_kv_heads = match f.opt_u32("num_key_value_heads")? {
        Some(v) => v,
        None => n_heads,
    };
    let d_head = match f.opt_u64("head_dim")? {
        Some(d) => d,
        None => {
            if n_heads == 0 || d_model % n_heads as u64 != 0 {
                return Err(invalid(
                    "num_attention_heads",
                    format!(
                        "{n_heads} heads do not divide hidden_size {d_model}: use a divisor of \
                         {d_model} or set head_dim"
                    ),
                ));
            }
            d_model / n_heads as u64
        }
    };
    Ok((n_heads, n_kv_heads, d_head))
}

/// `sliding_window` (Mistral: HF's default 4096 when the key is absent, `null` for none;
/// Mixtral: none unless set; Qwen2 only with `use_sliding_window`, from layer
/// `max_window_layers` on, HF's default 28).
fn sliding_window(f: &Fields, family: Family) -> Result<Option<SlidingWindow>, PlanError> {
    if family == Family::Qwen2 && !f.bool_or("use_sliding_window", false)? {
        return Ok(None);
    }
    let mistral = f.0.get("model_type").and_then(Value::as_str) == Some("mistral");
    let window = match f.0.get("sliding_window") {
        None if mistral => Some(4096),
        _ => f.opt_u64("sliding_window")?,
    };
    let Some(window) = window else {
        return Ok(None);
    };
    if window == 0 {
        return Err(invalid(
            "sliding_window",
            "config.json has 0: a window holds at least one position (use null for none)",
        ));
    }
    let first_layer = if family == Family::Qwen2 {
        f.opt_u32("max_window_layers")?.unwrap_or(28)
    } else {
        0
    };
    Ok(Some(SlidingWindow {
        window,
        first_layer,
    }))
}

/// The context a rotary model's config reaches, as vLLM derives it: `max_position_embeddings`,
/// times a linear or dynamic `rope_scaling` factor, or a YaRN factor times its
/// `original_max_position_embeddings` (Llama 3's and LongRoPE's scaling are already counted in
/// `max_position_embeddings`).
fn rotary_positions(f: &Fields) -> Result<u64, PlanError> {
    let max = f.u64("max_position_embeddings")?;
    let Some(scaling) = f.0.get("rope_scaling").and_then(Value::as_object) else {
        return Ok(max);
    };
    let kind = ["rope_type", "type"]
        .iter()
        .find_map(|k| scaling.get(*k).and_then(Value::as_str))
        .unwrap_or("");
    let factor = scaling.get("factor").and_then(Value::as_f64).unwrap_or(1.0);
    if !(factor.is_finite() && factor >= 1.0) {
        return Ok(max);
    }
    let base = match kind {
        "linear" | "dynamic" => max,
        "yarn" => scaling
            .get("original_max_position_embeddings")
            .and_then(Value::as_u64)
            .unwrap_or(max),
        _ => return Ok(max),
    };
    Ok(max.max((base as f64 * factor) as u64))
}

fn llama_like(f: &Fields, family: Family) -> Result<ModelShape, PlanError> {
    let d_model = f.u64("hidden_size")?;
    let (n_heads, n_kv_heads, d_head) = heads(f, d_model)?;
    Ok(ModelShape {
        name: String::new(),
        family,
        n_layers: f.u32("num_hidden_layers")?,
        d_model,
        n_heads,
        n_kv_heads,
        d_head,
        d_ff: f.u64("intermediate_size")?,
        vocab: f.u64("vocab_size")?,
        max_positions: rotary_positions(f)?,
        tied_embeddings: f.bool_or("tie_word_embeddings", false)?,
        moe: None,
        mla: None,
        sliding_window: sliding_window(f, family)?,
    })
}

fn mixtral(f: &Fields) -> Result<ModelShape, PlanError> {
    let base = llama_like(f, Family::Mixtral)?;
    Ok(ModelShape {
        moe: Some(Moe {
            n_experts: f.u32("num_local_experts")?,
            n_active: f.u32("num_experts_per_tok")?,
            n_shared: 0,
            d_ff_expert: base.d_ff,
            first_dense: 0,
            router_bias: false,
        }),
        ..base
    })
}

fn deepseek(f: &Fields) -> Result<ModelShape, PlanError> {
    let d_model = f.u64("hidden_size")?;
    let n_heads = f.u32("num_attention_heads")?;
    let v_head_dim = f.u64("v_head_dim")?;
    let is_v3 = f.0.get("model_type").and_then(Value::as_str) == Some("deepseek_v3");
    let moe = match f.opt_u64("n_routed_experts")? {
        Some(n) if n > 0 => Some(Moe {
            n_experts: narrow("n_routed_experts", n)?,
            n_active: f.u32("num_experts_per_tok")?,
            n_shared: f.opt_u32("n_shared_experts")?.unwrap_or(0),
            d_ff_expert: f.u64("moe_intermediate_size")?,
            first_dense: f.opt_u32("first_k_dense_replace")?.unwrap_or(0),
            router_bias: is_v3,
        }),
        _ => None,
    };
    Ok(ModelShape {
        name: String::new(),
        family: Family::Deepseek,
        n_layers: f.u32("num_hidden_layers")?,
        d_model,
        n_heads,
        n_kv_heads: f.opt_u32("num_key_value_heads")?.unwrap_or(n_heads),
        d_head: v_head_dim,
        d_ff: f.u64("intermediate_size")?,
        vocab: f.u64("vocab_size")?,
        max_positions: rotary_positions(f)?,
        tied_embeddings: f.bool_or("tie_word_embeddings", false)?,
        moe,
        mla: Some(Mla {
            q_lora_rank: f.opt_u64("q_lora_rank")?,
            kv_lora_rank: f.u64("kv_lora_rank")?,
            qk_rope_head_dim: f.u64("qk_rope_head_dim")?,
            qk_nope_head_dim: f.u64("qk_nope_head_dim")?,
            v_head_dim,
        }),
        sliding_window: None,
    })
}
