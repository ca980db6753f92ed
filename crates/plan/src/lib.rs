//! The memory model: which buffers a training or inference step holds, how big, and when they live.
//!
//! A plan is a list of [`Buffer`]s, each with a category, a device, a size in bytes and the step
//! phases in which it is born and dies ([`buffer`]). The peak is the largest sum of live bytes over
//! the step's timeline. The same list drives the engine's arena, so the engine's measured memory
//! equals the plan's to the byte. This crate never does IO beyond parsing a string.
//!
//! Example: `model::ModelShape` from a preset, a `setup::TrainSetup`, then a runtime profile turns
//! them into a `buffer::MemoryPlan` whose `peak_bytes(Device::Gpu)` answers "does it fit?".

pub mod acts;
pub mod buffer;
pub mod error;
pub mod formula;
pub mod formula_acts;
pub mod hf_config;
pub mod host;
pub mod infer;
pub mod key;
pub mod lora;
pub mod model;
pub mod params;
pub mod policy;
pub mod presets;
pub mod recompute;
pub mod roles;
pub mod runtime;
pub mod setup;
pub mod tensors;
pub mod units;
pub mod validate;

pub use buffer::{Buffer, Category, Device, Lifetime, MemoryPlan, Phase};
pub use error::PlanError;
pub use infer::InferEstimate;
pub use model::ModelShape;
pub use runtime::Estimate;
pub use setup::{InferSetup, TrainSetup};
