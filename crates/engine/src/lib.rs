//! The core every other engine crate stands on: arenas carved from the memory plan on a device
//! backend, the backend traits, the models of the families `plan_frugal::family` describes (GPT-2,
//! Llama, Qwen2, Mistral, Mixtral, DeepSeek-V2) and their forward pass as ops, model configs,
//! capacity checks, the rank launcher, and weights in and out as HF safetensors. Training (`train`)
//! and inference (`infer`) are crates over it; the CPU backend is `cpu`, the CUDA one `cuda`.
//!
//! One source of truth for bytes: the planner (`plan_frugal`) lists every buffer; [`Arena`]
//! allocates exactly those (one slab per device, offsets from the buffers' lifetimes) and measures
//! what is live per category, so planned == measured to the byte. Nothing is allocated inside a
//! step. The engine never prints.
//!
//! Example (a model's logits without training state, on the CPU backend):
//! ```
//! let config = engine::ModelConfig::from_shape(engine::testkit::gpt2_tiny()).unwrap();
//! assert_eq!(config.shape.n_layers, 2);
//! ```

// How the pieces fit (ARCHITECTURE.md has the map):
// - `backend`: the device seam. `Backend` runs every op on arena tensors; the CPU backend (crate
//   `cpu`) is the kernels crate. Nothing above it touches slices.
// - `arena`: one slab per device from the plan, buffers found by `plan_frugal::Key`.
// - `model` (weights + forward wiring); the training state and backward are `train`'s.
// - `forward`, `mla`, `moe`: the forward pass as ops, following the family's block design.
// - `sp`, `tp`, `pp`, `share`: how a model is split over ranks (sequence, tensor, pipeline).
// - `world`: ranks as threads, joined with their errors.

pub mod arena;
pub mod backend;
pub mod capacity;
pub mod config;
pub mod error;
pub mod eval;
pub mod forward;
pub mod init;
pub mod io;
pub mod lora;
pub mod mla;
pub mod model;
pub mod moe;
pub mod pp;
pub mod precision;
pub mod sample;
pub mod share;
pub mod sp;
pub mod testkit;
pub mod tp;
pub mod world;

pub use arena::{Arena, Measured};
pub use backend::Backend;
pub use config::ModelConfig;
pub use error::EngineError;
pub use eval::Sampling;
