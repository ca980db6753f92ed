//! The model the engine builds: the planner's [`ModelShape`] plus the numeric facts the memory
//! model does not need (norm epsilon, RoPE base), read from and written to HF `config.json`.
//!
//! Only the families in `plan_frugal::family` are built (GPT-2, Llama and Mistral, Qwen2,
//! Mixtral, DeepSeek-V2); anything else (an unknown `model_type`, RoPE scaling, a different
//! activation, biases on Llama projections) is refused with [`EngineError::Config`] naming the
//! field, never approximated.
//!
//! Example: `ModelConfig::from_hf_json(text, "config.json")?.shape.n_layers`.

use crate::error::EngineError;
use plan::ModelShape;
use plan_frugal::family::{self, Numerics};
use serde_json::Value;

/// A buildable model: shape plus numerics.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub shape: ModelShape,
    /// RMSNorm epsilon (Llama); GPT-2's LayerNorm uses the kernels' fixed 1e-5.
    pub norm_eps: f32,
    /// RoPE base (Llama).
    pub rope_theta: f32,
    /// Mixture of experts: the load-balancing loss's weight in the objective (0: none).
    pub router_aux_coef: f32,
    /// Mixture of experts: how the router picks and weighs experts.
    pub routing: plan::model::Routing,
}

pub use plan_frugal::family::PRESET_AUX_COEF;

impl ModelConfig {
    /// A config with HF's defaults for the numerics of `shape`'s family.
    pub fn from_shape(shape: ModelShape) -> Result<ModelConfig, EngineError> {
        plan_frugal::units::check_buildable(&shape).map_err(|e| EngineError::Config {
            source_name: shape.name.clone(),
            reason: e.to_string(),
        })?;
        let router_aux_coef = family::of(shape.family).preset_aux_coef();
        let routing = family::of(shape.family).default_routing();
        Ok(ModelConfig {
            shape,
            norm_eps: 1e-5,
            rope_theta: 10_000.0,
            router_aux_coef,
            routing,
        })
    }

    /// Every field of the model as JSON, for identity checks (a resumed run must build the same
    /// model): the shape's fields at the top level (the family by its Rust name), then the
    /// numerics and the routing. Destructured whole, so a new field cannot be left out.
    pub fn identity(&self) -> Value {
        let ModelConfig {
            shape,
            norm_eps,
            rope_theta,
            router_aux_coef,
            routing,
        } = self;
        let plan::model::Routing { gating, groups } = routing;
        let gating = match gating {
            plan::model::Gating::Renormalise => Value::from("renormalise"),
            plan::model::Gating::Scaled(s) => serde_json::json!({ "scaled": as_written(*s) }),
        };
        let mut v = serde_json::to_value(shape).expect("a shape serialises");
        let m = v.as_object_mut().expect("a shape is an object");
        m.insert("family".into(), format!("{:?}", shape.family).into());
        m.insert("norm_eps".into(), as_written(*norm_eps));
        m.insert("rope_theta".into(), as_written(*rope_theta));
        m.insert("router_aux_coef".into(), as_written(*router_aux_coef));
        m.insert(
            "routing".into(),
            serde_json::json!({ "gating": gating, "groups": groups }),
        );
        v
    }

    /// Parses an HF `config.json` of a family the engine builds.
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
        let family = family::by_model_type(model_type).ok_or_else(|| {
            fail(format!(
                "model_type {model_type:?} is not built by this engine ({} are)",
                family::model_types().join(", ")
            ))
        })?;
        let numerics = family.numerics(obj).map_err(fail)?;
        // The planner's parser is the one source of the shape; the family adds the numerics.
        let shape = plan::hf_config::parse(text, source_name)?;
        ModelConfig::from_shape(shape.clone())?;
        Ok(ModelConfig {
            shape,
            norm_eps: numerics.norm_eps,
            rope_theta: numerics.rope_theta,
            router_aux_coef: numerics.router_aux_coef,
            routing: numerics.routing,
        })
    }

    /// The HF `config.json` that makes transformers build this same model.
    pub fn to_hf_json(&self) -> String {
        let numerics = Numerics {
            norm_eps: self.norm_eps,
            rope_theta: self.rope_theta,
            router_aux_coef: self.router_aux_coef,
            routing: self.routing,
        };
        let v = family::of(self.shape.family).to_hf(&self.shape, &numerics);
        serde_json::to_string_pretty(&v).expect("a JSON value serialises")
    }
}

/// `x` as JSON reads it back from its shortest text (0.002, not 0.0020000000949949026).
fn as_written(x: f32) -> Value {
    let text = serde_json::to_string(&x).expect("a float serialises");
    serde_json::from_str(&text).expect("JSON text parses")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_train_without_a_balance_loss_and_the_kernel_limit_matches_the_plan() {
        let shape = plan::presets::by_name("deepseek-tiny").unwrap();
        let config = ModelConfig::from_shape(shape).unwrap();
        assert_eq!(
            config.router_aux_coef, 0.0,
            "HF 5 adds no auxiliary loss to DeepSeek"
        );
        let mixtral = plan::presets::by_name("mixtral-tiny").unwrap();
        let config = ModelConfig::from_shape(mixtral).unwrap();
        assert_eq!(config.router_aux_coef, PRESET_AUX_COEF);
        let limit = plan_frugal::serve::MAX_LATENT_RANK;
        assert_eq!(kernels::mla::MAX_RANK as u64, limit);
    }
}
