//! Model families the engine builds, each a module behind [`Arch`]: the block design (norm,
//! positions, MLP) the engine's forward and backward follow, the parameter units with their
//! Hugging Face names, the family's own shape checks, and (through [`HfConfig`]) its config.json
//! in and out: which HF `model_type`s it reads, the numeric facts the memory model does not need
//! (norm epsilon, RoPE base, routing) and the options it refuses. Adding a family is a variant
//! of `plan::model::Family` with its `model_type`s, one module here, and its line in
//! [`FAMILIES`].
//!
//! Example: `arch(&gpt2_124m)?.design().mlp` is `Mlp::Gelu`; `by_model_type("mistral")` is the
//! Llama family (a Mistral block is a Llama block; its sliding window is the shape's).

mod deepseek;
mod gpt2;
mod llama;
mod mixtral;
mod qwen2;

use super::units::UnitBuilder;
use plan::model::{Family, Routing};
use plan::{ModelShape, PlanError};
use serde_json::{Map, Value};

pub use deepseek::LATENT_NORM_EPS;

/// The balance loss's weight for a Mixtral preset (Mixtral-8x7B's `router_aux_loss_coef`): a
/// model trained from scratch needs it, or its router collapses.
pub const PRESET_AUX_COEF: f32 = 0.02;

/// The block's normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// LayerNorm with weight and bias (keeps a mean besides the reciprocal std).
    LayerNorm,
    /// RMSNorm with a weight.
    RmsNorm,
}

/// How positions enter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Positions {
    /// A learned table added to the token embedding.
    Learned,
    /// Rotary embeddings on q and k inside attention.
    Rope,
}

/// The MLP's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mlp {
    /// tanh GELU between the up and down projections (up is 4C wide).
    Gelu,
    /// SiLU(gate) · up, with gate|up fused into one 2F-wide projection.
    SwiGlu,
}

/// What a transformer block of a family is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockDesign {
    pub norm: Norm,
    pub positions: Positions,
    pub mlp: Mlp,
    /// The MLP is a mixture of `ModelShape::moe`'s experts, each an `mlp`, behind a router
    /// (from `first_dense` on).
    pub moe: bool,
    /// Attention is multi-head latent attention (`ModelShape::mla`).
    pub mla: bool,
}

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
pub trait HfConfig {
    /// The HF `model_type`s it builds.
    fn model_types(&self) -> &'static [&'static str];
    /// The numerics of an HF config, or why the engine cannot build it (naming the field).
    fn numerics(&self, config: &Map<String, Value>) -> Result<Numerics, String>;
    /// The `config.json` of a model of this shape and numerics.
    fn to_hf(&self, shape: &ModelShape, numerics: &Numerics) -> Value;
    /// The routing of a preset (no config.json) of this family.
    fn default_routing(&self) -> Routing {
        Routing::RENORMALISED
    }
    /// The load-balancing loss's weight for a preset (0: none).
    fn preset_aux_coef(&self) -> f32 {
        0.0
    }
}

/// Every family, by the planner's name for it.
pub const FAMILIES: [(Family, &dyn Arch); 5] = [
    (Family::Gpt2, &gpt2::Gpt2),
    (Family::Llama, &llama::Llama),
    (Family::Qwen2, &qwen2::Qwen2),
    (Family::Mixtral, &mixtral::Mixtral),
    (Family::Deepseek, &deepseek::Deepseek),
];

/// One family: its block design, shape checks and parameter units.
pub trait Arch: HfConfig + Sync {
    fn design(&self) -> BlockDesign;
    /// Checks beyond the common ones (every family's `check_buildable`).
    fn check(&self, model: &ModelShape) -> Result<(), PlanError>;
    /// The embedding unit's views (token table, positions).
    fn embed(&self, model: &ModelShape, unit: &mut UnitBuilder);
    /// Block `layer`'s views, in the order the unit stores them.
    fn block(&self, model: &ModelShape, layer: u32, unit: &mut UnitBuilder);
    /// The head unit's views (final norm; the output projection when untied).
    fn head(&self, model: &ModelShape, unit: &mut UnitBuilder);
}

/// The family module of `model`, or why the engine does not build it.
pub fn arch(model: &ModelShape) -> Result<&'static dyn Arch, PlanError> {
    Ok(of(model.family))
}

/// The module of a planner family.
pub fn of(family: Family) -> &'static dyn Arch {
    FAMILIES
        .into_iter()
        .find_map(|(f, arch)| (f == family).then_some(arch))
        .expect("every planner family has a module")
}

/// The family that reads `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static dyn Arch> {
    FAMILIES
        .into_iter()
        .map(|(_, arch)| arch)
        .find(|a| a.model_types().contains(&model_type))
}

/// Every `model_type` the engine builds, for messages.
pub fn model_types() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|(_, a)| a.model_types())
        .copied()
        .collect()
}

/// The block design of a model the engine builds (checked before: a programmer error else).
pub fn design(model: &ModelShape) -> BlockDesign {
    arch(model)
        .unwrap_or_else(|e| panic!("{e}: check_buildable first"))
        .design()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each planner family has one module, and a module builds only `model_type`s the planner
    /// reads as its family (DeepSeek-V3 is planned but not built).
    #[test]
    fn every_family_has_one_module_that_builds_what_the_planner_reads_as_it() {
        assert_eq!(FAMILIES.len(), Family::ALL.len());
        for f in Family::ALL {
            let modules = FAMILIES.iter().filter(|(g, _)| *g == f).count();
            assert_eq!(modules, 1, "{f:?}");
            for t in of(f).model_types() {
                assert_eq!(Family::of_model_type(t), Some(f), "{t}");
            }
        }
        assert!(by_model_type("deepseek_v3").is_none());
    }

    /// `Family::ALL` holds every variant: a new one fails to compile in this match until it is
    /// given a place, and then fails here until it is in `ALL`.
    #[test]
    fn the_family_list_is_complete() {
        let place = |f: Family| match f {
            Family::Gpt2 => 0,
            Family::Llama => 1,
            Family::Qwen2 => 2,
            Family::Mixtral => 3,
            Family::Deepseek => 4,
        };
        let places: Vec<usize> = Family::ALL.into_iter().map(place).collect();
        assert_eq!(
            places,
            (0..5).collect::<Vec<_>>(),
            "one place per match arm, in order"
        );
    }
}
