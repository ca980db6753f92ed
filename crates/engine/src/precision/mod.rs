//! The mixed-precision pieces a backend runs: the fp32-master AdamW step that writes the 2-byte
//! working copy ([`master`]) and the fp16 underflow statistics ([`underflow`]). The loss scaler and
//! gradient checks that drive them are the training crate's (`train::precision`).

pub mod master;
pub mod underflow;

pub use master::{adamw_master_step, Grads, MasterStep, Working};
pub use underflow::UnderflowStats;

/// What can go wrong with mixed precision.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PrecisionError {
    /// DeepSpeed: "Current loss scale already at minimum - cannot decrease scale anymore".
    #[error(
        "loss scale already at minimum ({scale}, {scaler} scaler) and the gradients overflowed \
         again at update {update}: fp16 cannot represent them; lower the learning rate, clip \
         gradients, or train with --precision bf16"
    )]
    ScaleAtMinimum {
        scaler: &'static str,
        scale: f64,
        update: u64,
    },
    #[error("loss scaler setting {field}: {reason}")]
    InvalidScaler { field: &'static str, reason: String },
}
