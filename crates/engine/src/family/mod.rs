//! Model families' numerics, each a module behind [`Family`]: which HF `model_type`s it reads,
//! the numeric facts the memory model does not need (norm epsilon, RoPE base) and the options
//! it refuses, and the `config.json` that makes transformers build the same model. The shape,
//! parameter units and block design are the planner's (`plan_frugal::family`); the forward and
//! backward follow the design, so a family needs no code in them.
//!
//! Example: `family::by_model_type("mistral")` is the Llama family (a Mistral block is a Llama
//! block; its sliding window is the shape's, honoured by the attention kernels).

pub mod deepseek;
mod gpt2;
mod llama;
mod mixtral;
mod qwen2;

use crate::config::ModelConfig;
use kernels::moe::Routing;
use serde_json::{Map, Value};

/// A config's numerics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Numerics {
    pub norm_eps: f32,
    pub rope_theta: f32,
    /// The load-balancing loss's weight in the training objective (0: none, or a dense model).
    pub router_aux_coef: f32,
    /// How a mixture of experts routes (Mixtral's for a dense model: unused).
    pub routing: Routing,
}

/// One family's config.json in and out.
pub trait Family: Sync {
    /// The HF `model_type`s it builds.
    fn model_types(&self) -> &'static [&'static str];
    /// The numerics of an HF config, or why the engine cannot build it (naming the field).
    fn numerics(&self, config: &Map<String, Value>) -> Result<Numerics, String>;
    /// The `config.json` of `config`.
    fn to_hf(&self, config: &ModelConfig) -> Value;
    /// The routing of a preset (no config.json) of this family.
    fn default_routing(&self) -> Routing {
        Routing::RENORMALISED
    }
    /// The load-balancing loss's weight for a preset (0: none).
    fn preset_aux_coef(&self) -> f32 {
        0.0
    }
}

const FAMILIES: [&dyn Family; 5] = [
    &gpt2::Gpt2,
    &llama::Llama,
    &qwen2::Qwen2,
    &mixtral::Mixtral,
    &deepseek::Deepseek,
];

/// The family that reads `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static dyn Family> {
    FAMILIES
        .into_iter()
        .find(|f| f.model_types().contains(&model_type))
}

/// The family of a planner shape.
pub fn of(family: plan::model::Family) -> &'static dyn Family {
    match family {
        plan::model::Family::Gpt2 => &gpt2::Gpt2,
        plan::model::Family::Qwen2 => &qwen2::Qwen2,
        plan::model::Family::Mixtral => &mixtral::Mixtral,
        plan::model::Family::Deepseek => &deepseek::Deepseek,
        plan::model::Family::Llama => &llama::Llama,
    }
}

/// Every `model_type` the engine builds, for messages.
pub fn model_types() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.model_types())
        .copied()
        .collect()
}
