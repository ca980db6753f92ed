//! GPT-2: learned positions, LayerNorm with bias, a tanh-GELU MLP, biases on every projection,
//! the output projection tied to the token embedding. HF stores its projections as `Conv1D`,
//! (in, out): the views record them as transposed so IO turns them into (out, in).
//!
//! Example: block 0's fused q|k|v view is `transformer.h.0.attn.c_attn.weight`, (3C, C) here.
//!
//! GPT-2's numerics: a fixed LayerNorm epsilon of 1e-5 (the kernel's) and the tanh GELU; the
//! config.json of HF's `GPT2LMHeadModel`, dropout off.
//!
//! Example: `layer_norm_epsilon: 1e-6` is refused, naming the field.

use super::{Arch, BlockDesign, HfConfig, Mlp, Norm, Numerics, Positions};
use crate::units::{Role, UnitBuilder};
use plan::model::Routing;
use plan::{ModelShape, PlanError};
use serde_json::{json, Map, Value};

pub struct Gpt2;

impl Arch for Gpt2 {
    fn design(&self) -> BlockDesign {
        BlockDesign {
            norm: Norm::LayerNorm,
            positions: Positions::Learned,
            mlp: Mlp::Gelu,
            moe: false,
            mla: false,
        }
    }

    fn check(&self, m: &ModelShape) -> Result<(), PlanError> {
        let invalid = |field: &str, reason: &str| {
            Err(PlanError::Invalid {
                field: field.into(),
                reason: reason.into(),
            })
        };
        if u64::from(m.n_heads) * m.d_head != m.d_model {
            return invalid("d_head", "GPT-2 needs n_heads * d_head == d_model");
        }
        if m.n_kv_heads != m.n_heads || !m.tied_embeddings {
            return invalid("model", "GPT-2 has no GQA and ties its embeddings");
        }
        Ok(())
    }

    fn embed(&self, m: &ModelShape, u: &mut UnitBuilder) {
        let (v, c) = (m.vocab, m.d_model);
        u.one(
            Role::TokenEmbedding,
            &[v, c],
            "transformer.wte.weight",
            false,
        );
        let wpe = "transformer.wpe.weight";
        u.one(Role::PositionEmbedding, &[m.max_positions, c], wpe, false);
    }

    fn block(&self, m: &ModelShape, layer: u32, u: &mut UnitBuilder) {
        // Head counts, not C: a tensor-parallel rank holds n_heads / tp heads of width d_head.
        let (c, f, a) = (m.d_model, m.d_ff, u64::from(m.n_heads) * m.d_head);
        let p = |s: &str| format!("transformer.h.{layer}.{s}");
        u.one(Role::Norm1Weight, &[c], &p("ln_1.weight"), false);
        u.one(Role::Norm1Bias, &[c], &p("ln_1.bias"), false);
        u.one(Role::QkvWeight, &[3 * a, c], &p("attn.c_attn.weight"), true);
        u.one(Role::QkvBias, &[3 * a], &p("attn.c_attn.bias"), false);
        u.one(
            Role::AttnProjWeight,
            &[c, a],
            &p("attn.c_proj.weight"),
            true,
        );
        u.one(Role::AttnProjBias, &[c], &p("attn.c_proj.bias"), false);
        u.one(Role::Norm2Weight, &[c], &p("ln_2.weight"), false);
        u.one(Role::Norm2Bias, &[c], &p("ln_2.bias"), false);
        u.one(Role::FcWeight, &[f, c], &p("mlp.c_fc.weight"), true);
        u.one(Role::FcBias, &[f], &p("mlp.c_fc.bias"), false);
        u.one(Role::FcProjWeight, &[c, f], &p("mlp.c_proj.weight"), true);
        u.one(Role::FcProjBias, &[c], &p("mlp.c_proj.bias"), false);
    }

    fn head(&self, m: &ModelShape, u: &mut UnitBuilder) {
        let c = m.d_model;
        u.one(
            Role::FinalNormWeight,
            &[c],
            "transformer.ln_f.weight",
            false,
        );
        u.one(Role::FinalNormBias, &[c], "transformer.ln_f.bias", false);
    }
}

/// GPT-2's LayerNorm epsilon, which the layernorm kernel fixes.
pub const LN_EPS: f64 = 1e-5;

impl HfConfig for Gpt2 {
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
            routing: Routing::RENORMALISED,
        })
    }

    fn to_hf(&self, shape: &ModelShape, _: &Numerics) -> Value {
        let s = shape;
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
