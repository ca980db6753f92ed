//! Operating errors of the engine: each carries the facts a user needs to fix the run.
//!
//! Programmer errors (a buffer used outside its lifetime, mismatched kernel shapes) are panics,
//! not variants here.

use plan::PlanError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    /// The run needs a feature the chosen backend does not have (checked before allocating).
    #[error(
        "the {backend} backend does not run {feature}: run it on the CPU backend (--device cpu), \
         or drop what needs it"
    )]
    Unsupported {
        backend: &'static str,
        feature: crate::backend::Feature,
    },
    /// The planner refused the model or setup (unsupported option, value out of range).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Mixed precision: the loss scale hit its minimum, or a scaler setting is out of range.
    #[error(transparent)]
    Precision(#[from] crate::precision::PrecisionError),
    /// Optimizer offload: the host store could not be created, mapped or flushed.
    #[error(transparent)]
    Offload(#[from] OffloadError),
    /// The run does not fit `--device-memory` or the host's RAM; nothing was allocated.
    #[error("{0}")]
    DoesNotFit(Box<crate::capacity::NoFit>),
    /// The backend could not allocate a slab the plan said fits (the OS refused).
    #[error(
        "could not allocate {bytes} bytes for the {what}: the operating system refused; free \
         memory, use fewer --ranks or a smaller --model, --batch or --seq"
    )]
    OutOfMemory { what: String, bytes: u64 },
    /// A model config (HF `config.json` or preset) the engine cannot build.
    #[error("cannot build the model from {source_name}: {reason}")]
    Config { source_name: String, reason: String },
    /// A weights file that does not match the model.
    #[error("weights {path}: {reason}")]
    Weights { path: String, reason: String },
    /// An inference request the engine cannot serve (a prompt past the context, a full KV pool,
    /// a draft model that does not match).
    #[error("{0}")]
    Infer(String),
    /// Data the engine cannot train on.
    #[error("data: {0}")]
    Data(String),
    /// The loss diverged: NaN, infinite, or past three times a uniform guess's ln(vocab).
    #[error(
        "the loss diverged to {loss} at step {step} (a uniform guess scores ln(vocab)); training \
         stopped. The likely cause is the learning rate: try a lower learning rate (--lr \
         {suggested_lr:e}) or more --warmup"
    )]
    NonFiniteLoss {
        step: u64,
        loss: f32,
        suggested_lr: f32,
    },
    /// The gradients overflowed although the loss was finite.
    #[error(
        "the gradient norm became NaN or infinite at step {step}; training stopped before the \
         update. Try a lower learning rate (--lr {suggested_lr:e}) or gradient clipping"
    )]
    NonFiniteGradient { step: u64, suggested_lr: f32 },
    /// A collective failed (another rank died, stalled or diverged).
    #[error("communication: {0}")]
    Comm(#[from] comm::CommError),
    /// A rank's thread panicked (see `world::launch`).
    #[error(transparent)]
    RankPanicked(#[from] crate::world::RankPanicked),
    /// (The OS error is in the message, not a `source`, so a chain prints it once.)
    #[error("{context}: {cause}")]
    Io {
        context: String,
        cause: std::io::Error,
    },
}

/// What can go wrong setting up offloaded optimizer state.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    #[error(
        "cannot create the optimizer state file {path}: {reason}; pass a path in a writable \
         directory that does not exist yet (--offload optimizer:disk=PATH)"
    )]
    CreateFile {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error(
        "cannot allocate {bytes} bytes for the optimizer state file {path}: {reason}; free disk \
         space or put the file on a larger disk"
    )]
    Allocate {
        path: std::path::PathBuf,
        bytes: u64,
        reason: String,
    },
    #[error("cannot memory-map the optimizer state file {path}: {reason}")]
    Map {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("cannot flush the optimizer state file {path}: {reason}")]
    Flush {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("the model has no parameters to offload")]
    Empty,
}
