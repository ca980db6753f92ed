//! Mixtral: Llama attention (GQA, RoPE, RMSNorm, optionally Mistral's sliding window) with a
//! sparse mixture-of-experts MLP: a router (E, C) with no bias, then E SwiGLU experts of
//! `intermediate_size`, each token running its top k. The experts' gate|up projections are one
//! view, expert after expert, each expert's rows filled by HF's `w1` (gate) then `w3` (up), and
//! their down projections another, filled by each expert's `w2` — the names transformers writes
//! with `save_pretrained` (it fuses them into 3-D `gate_up_proj`/`down_proj` only in memory).
//!
//! Example: block 0's `Role::ExpertsFcWeight` rows 0..F are
//! `model.layers.0.block_sparse_moe.experts.0.w1.weight`.
//!
//! Mixtral's numerics: Llama's (RMSNorm epsilon, RoPE base, SiLU; transformers 5's
//! `rope_parameters` read too), and the load-balancing loss as HF adds it: weighted by
//! `router_aux_loss_coef` when `output_router_logits` is true, absent otherwise (HF's
//! `MixtralForCausalLM` adds it to the loss only then). Refused: `router_jitter_noise` above 0
//! (HF multiplies the router's input by uniform noise in training; not built). Its config.json
//! is HF's `MixtralForCausalLM`.
//!
//! Example: `{"output_router_logits": true, "router_aux_loss_coef": 0.02}` trains with
//! 0.02 × the balance loss added.

use super::llama::Llama;
use super::{Arch, BlockDesign, HfConfig, Numerics};
use crate::units::{Role, UnitBuilder};
use plan::{ModelShape, PlanError};
use serde_json::{json, Map, Value};

pub struct Mixtral;

impl Arch for Mixtral {
    fn design(&self) -> BlockDesign {
        BlockDesign {
            moe: true,
            ..Llama.design()
        }
    }

    fn check(&self, m: &ModelShape) -> Result<(), PlanError> {
        Llama.check(m)?;
        let moe = m.moe.as_ref().ok_or_else(|| PlanError::Invalid {
            field: "num_local_experts".into(),
            reason: "a Mixtral model needs its experts".into(),
        })?;
        if moe.n_shared != 0 || moe.first_dense != 0 || moe.router_bias {
            return Err(PlanError::Invalid {
                field: "n_shared_experts".into(),
                reason: "Mixtral has no shared experts, dense layers or router bias".into(),
            });
        }
        Ok(())
    }

    fn embed(&self, m: &ModelShape, u: &mut UnitBuilder) {
        Llama.embed(m, u)
    }

    fn block(&self, m: &ModelShape, layer: u32, u: &mut UnitBuilder) {
        let moe = m.moe.as_ref().expect("checked: Mixtral has experts");
        let (c, f, e) = (m.d_model, moe.d_ff_expert, moe.n_experts);
        // Llama's attention half, then the router and the experts instead of its MLP.
        let mut base = UnitBuilder::scratch();
        Llama.block(m, layer, &mut base);
        for (role, shape, parts) in base.into_views() {
            if matches!(role, Role::FcWeight | Role::FcProjWeight) {
                continue;
            }
            u.view(role, &shape, &parts);
        }
        let p = |s: &str| format!("model.layers.{layer}.block_sparse_moe.{s}");
        u.one(Role::RouterWeight, &[e.into(), c], &p("gate.weight"), false);
        let gate_up: Vec<_> = (0..e)
            .flat_map(|x| {
                [
                    (p(&format!("experts.{x}.w1.weight")), f, false),
                    (p(&format!("experts.{x}.w3.weight")), f, false),
                ]
            })
            .collect();
        u.view(Role::ExpertsFcWeight, &[u64::from(e) * 2 * f, c], &gate_up);
        let down: Vec<_> = (0..e)
            .map(|x| (p(&format!("experts.{x}.w2.weight")), c, false))
            .collect();
        u.view(Role::ExpertsProjWeight, &[u64::from(e) * c, f], &down);
    }

    fn head(&self, m: &ModelShape, u: &mut UnitBuilder) {
        Llama.head(m, u)
    }
}

/// HF's `MixtralConfig` default.
const HF_AUX_COEF: f64 = 0.001;

impl HfConfig for Mixtral {
    fn model_types(&self) -> &'static [&'static str] {
        &["mixtral"]
    }

    fn numerics(&self, obj: &Map<String, Value>) -> Result<Numerics, String> {
        let jitter = obj
            .get("router_jitter_noise")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        if jitter != 0.0 {
            return Err(format!(
                "router_jitter_noise {jitter}: router input noise is not built (set it to 0)"
            ));
        }
        let on = obj
            .get("output_router_logits")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let coef = obj
            .get("router_aux_loss_coef")
            .and_then(Value::as_f64)
            .unwrap_or(HF_AUX_COEF);
        if !(coef.is_finite() && coef >= 0.0) {
            return Err(format!(
                "router_aux_loss_coef {coef}: use a small non-negative weight such as 0.02"
            ));
        }
        Ok(Numerics {
            router_aux_coef: if on { coef as f32 } else { 0.0 },
            ..Llama.numerics(obj)?
        })
    }

    fn preset_aux_coef(&self) -> f32 {
        super::PRESET_AUX_COEF
    }

    fn to_hf(&self, shape: &ModelShape, numerics: &Numerics) -> Value {
        let s = shape;
        let moe = s.moe.as_ref().expect("a Mixtral shape has experts");
        let mut v = Llama.to_hf(shape, numerics);
        let o = v.as_object_mut().expect("a JSON object");
        for key in ["attention_bias", "mlp_bias"] {
            o.remove(key);
        }
        o.insert("architectures".into(), json!(["MixtralForCausalLM"]));
        o.insert("model_type".into(), json!("mixtral"));
        o.insert("intermediate_size".into(), json!(moe.d_ff_expert));
        o.insert("num_local_experts".into(), json!(moe.n_experts));
        o.insert("num_experts_per_tok".into(), json!(moe.n_active));
        o.insert("router_jitter_noise".into(), json!(0.0));
        let on = numerics.router_aux_coef > 0.0;
        o.insert("output_router_logits".into(), json!(on));
        let coef = if on {
            f64::from(numerics.router_aux_coef)
        } else {
            HF_AUX_COEF
        };
        o.insert("router_aux_loss_coef".into(), json!(coef));
        if s.sliding_window.is_none() {
            o.insert("sliding_window".into(), Value::Null);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_balance_loss_follows_output_router_logits_and_jitter_is_refused() {
        let obj = |v: Value| v.as_object().unwrap().clone();
        let off = obj(json!({"router_aux_loss_coef": 0.02}));
        assert_eq!(Mixtral.numerics(&off).unwrap().router_aux_coef, 0.0);
        let on = obj(
            json!({"router_aux_loss_coef": 0.02, "output_router_logits": true,
            "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}),
        );
        let n = Mixtral.numerics(&on).unwrap();
        assert_eq!((n.router_aux_coef, n.rope_theta), (0.02, 1e6));
        let jitter = obj(json!({"router_jitter_noise": 0.01}));
        let err = Mixtral.numerics(&jitter).unwrap_err();
        assert!(err.contains("router_jitter_noise"), "{err}");
    }
}
