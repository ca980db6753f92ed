//! The training engine: arenas carved from the memory plan, GPT-2 and Llama-style models built
//! from explicit forward/backward kernels, optimizers, and weights in and out as HF safetensors.
//!
//! One source of truth for bytes: `plan::frugal::training_plan` lists every buffer; [`Arena`]
//! allocates exactly those (one slab per device, offsets from the buffers' lifetimes) and measures
//! what is live per category, so planned == measured to the byte. Nothing is allocated inside a
//! step. The engine never prints; `io` is its only file access.
//!
//! Example:
//! ```no_run
//! use engine::{ModelConfig, OptimizerKind, Schedule, TrainConfig, Trainer};
//! # fn shape() -> plan::ModelShape { unimplemented!() }
//! let config = TrainConfig {
//!     model: ModelConfig::from_shape(shape()).unwrap(),
//!     batch: 4, seq: 64, grad_accum: 1,
//!     optimizer: OptimizerKind::adamw_default(),
//!     schedule: Schedule::constant(3e-4),
//!     grad_clip: Some(1.0),
//!     device_memory_bytes: None,
//! };
//! let mut trainer = Trainer::new(config).unwrap();
//! trainer.init_weights(1337);
//! let (x, y) = (vec![0u32; 256], vec![1u32; 256]);
//! let stats = trainer.step(&mut |i, t| { i.copy_from_slice(&x); t.copy_from_slice(&y) }).unwrap();
//! assert!(stats.loss.is_finite());
//! ```

pub mod arena;
pub mod backward;
pub mod config;
pub mod error;
pub mod eval;
pub mod forward;
pub mod init;
pub mod io;
pub mod model;
pub mod optim;
pub mod train;

pub use arena::{Arena, Measured};
pub use config::ModelConfig;
pub use error::EngineError;
pub use eval::Sampling;
pub use optim::{OptimizerKind, Schedule};
pub use train::{StepStats, Timings, TrainConfig, Trainer};
