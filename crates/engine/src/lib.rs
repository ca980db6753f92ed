//! The training engine: arenas carved from the memory plan on a device backend, GPT-2 and
//! Llama-style models built from explicit forward/backward ops, optimizers, ranks, and weights in
//! and out as HF safetensors.
//!
//! One source of truth for bytes: `plan::frugal::training_plan` lists every buffer; [`Arena`]
//! allocates exactly those (one slab per device, offsets from the buffers' lifetimes) and measures
//! what is live per category, so planned == measured to the byte. Nothing is allocated inside a
//! step. The engine never prints; `io` is its only file access.
//!
//! Example:
//! ```no_run
//! use engine::{ModelConfig, TrainConfig, Trainer};
//! # fn shape() -> plan::ModelShape { unimplemented!() }
//! // fp32 on one rank, flash attention, AdamW: `TrainConfig::new`'s defaults; set any field.
//! let config = TrainConfig {
//!     recompute: plan::setup::Recompute::Full,
//!     ..TrainConfig::new(ModelConfig::from_shape(shape()).unwrap(), 4, 64)
//! };
//! let mut trainer = Trainer::new(config).unwrap();
//! trainer.init_weights(1337);
//! let (x, y) = (vec![0u32; 256], vec![1u32; 256]);
//! let stats = trainer.step(&mut |i, t| { i.copy_from_slice(&x); t.copy_from_slice(&y) }).unwrap();
//! assert!(stats.loss.is_finite());
//! ```

// How the pieces fit (ARCHITECTURE.md has the map):
// - `backend`: the device seam. `Backend` runs every op on arena tensors; `backend::cpu::Cpu` is
//   the kernels crate. Nothing above it touches slices.
// - `arena`: one slab per device from the plan, buffers found by `plan::frugal::Key`.
// - `model` (weights + forward wiring) and `train::TrainState` (gradients, backward wiring,
//   optimizer state) apart; `runner::Runner` is a model with no training state.
// - `forward`, `backward`, `recompute`: the passes as ops, following the family's block design.
// - ZeRO (`zero`): one `Trainer` per rank (`Trainer::with_comm`, ranks from `world::launch`),
//   obeying the plan's `StateRule` for what each stage shards and gathers.
// - bf16/fp16 (`train::mixed`, `precision`): 2-byte weights and gradients, fp32 master weights
//   and Adam state; bf16 matmul inputs and outputs through planned f32 scratch.
// - Offload (`offload`): master, m and v in host memory or a memory-mapped file.
// - Snapshots (`snapshot`): whole HF weights plus each rank's optimizer shard, the loader position
//   and the loss scaler, committed by a manifest.

pub mod arena;
pub mod backend;
pub mod backward;
pub mod capacity;
pub mod config;
pub mod error;
pub mod eval;
pub mod family;
pub mod forward;
pub mod infer;
pub mod init;
pub mod io;
pub mod lora;
pub mod mla;
pub mod model;
pub mod moe;
pub mod offload;
pub mod optim;
pub mod pp;
pub mod precision;
pub mod recompute;
pub mod runner;
pub mod share;
pub mod snapshot;
pub mod sp;
pub mod testkit;
pub mod tp;
pub mod train;
pub mod world;
pub mod zero;

pub use arena::{Arena, Measured};
pub use backend::cpu::Cpu;
pub use backend::Backend;
pub use config::ModelConfig;
pub use error::EngineError;
pub use eval::Sampling;
pub use optim::{OptimizerKind, Schedule};
pub use runner::Runner;
pub use train::{LoraConfig, StepStats, Timings, TrainConfig, TrainState, Trainer};
