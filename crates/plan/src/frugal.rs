//! The `frugal` runtime profile: the exact buffer list of this project's engine.
//!
//! Owned by the engine: the engine carves its arena from this list, so the two agree to the byte.

use crate::{MemoryPlan, ModelShape, PlanError, TrainSetup};

/// Every buffer the engine allocates for one training step of `model` under `setup`, per rank.
pub fn training_plan(model: &ModelShape, setup: &TrainSetup) -> Result<MemoryPlan, PlanError> {
    let _ = (model, setup);
    Err(PlanError::Unsupported {
        runtime: "frugal",
        what: "training (not built yet)".into(),
    })
}
