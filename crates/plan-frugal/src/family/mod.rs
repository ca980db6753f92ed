//! Model families the engine builds, each a module behind [`Arch`]: the block design (norm,
//! positions, MLP) the engine's forward and backward follow, the parameter units with their
//! Hugging Face names, and the family's own shape checks. Adding a family is one module here,
//! its numerics module in `engine::family`, and a line in [`arch`] and in the engine's registry.
//!
//! Example: `arch(&gpt2_124m)?.design().mlp` is `Mlp::Gelu`.

mod deepseek;
mod gpt2;
mod llama;
mod mixtral;
mod qwen2;

use super::units::UnitBuilder;
use plan::model::Family;
use plan::{ModelShape, PlanError};

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

/// One family: its block design, shape checks and parameter units.
pub trait Arch: Sync {
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
    match model.family {
        Family::Gpt2 => Ok(&gpt2::Gpt2),
        Family::Llama => Ok(&llama::Llama),
        Family::Qwen2 => Ok(&qwen2::Qwen2),
        Family::Mixtral => Ok(&mixtral::Mixtral),
        Family::Deepseek => Ok(&deepseek::Deepseek),
    }
}

/// The block design of a model the engine builds (checked before: a programmer error else).
pub fn design(model: &ModelShape) -> BlockDesign {
    arch(model)
        .unwrap_or_else(|e| panic!("{e}: check_buildable first"))
        .design()
}
