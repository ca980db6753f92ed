//! Shared helpers of the engine's integration tests: tiny model shapes and a trainer builder.

#![allow(dead_code)]

use engine::{ModelConfig, OptimizerKind, Schedule, TrainConfig, Trainer};
use plan::model::Family;
use plan::ModelShape;

/// A GPT-2 block design at toy size (the golden files use the same shape).
pub fn gpt2_tiny() -> ModelShape {
    ModelShape {
        name: "gpt2-test".into(),
        family: Family::Gpt2,
        n_layers: 2,
        d_model: 32,
        n_heads: 4,
        n_kv_heads: 4,
        d_head: 8,
        d_ff: 128,
        vocab: 96,
        max_positions: 32,
        tied_embeddings: true,
        moe: None,
        mla: None,
    }
}

/// A Llama block design at toy size: GQA (4 query heads over 2 kv heads), untied head.
pub fn llama_tiny() -> ModelShape {
    ModelShape {
        name: "llama-test".into(),
        family: Family::Llama,
        n_layers: 2,
        d_model: 32,
        n_heads: 4,
        n_kv_heads: 2,
        d_head: 8,
        d_ff: 64,
        vocab: 96,
        max_positions: 32,
        tied_embeddings: false,
        moe: None,
        mla: None,
    }
}

pub fn config(shape: ModelShape, batch: u64, seq: u64) -> TrainConfig {
    TrainConfig {
        model: ModelConfig::from_shape(shape).unwrap(),
        batch,
        seq,
        grad_accum: 1,
        optimizer: OptimizerKind::adamw_default(),
        schedule: Schedule::constant(1e-3),
        grad_clip: Some(1.0),
        device_memory_bytes: None,
        ranks: 1,
        recompute: plan::setup::Recompute::None,
        attention: plan::setup::Attention::Eager,
    }
}

pub fn trainer(shape: ModelShape, batch: u64, seq: u64) -> Trainer {
    let mut t = Trainer::new(config(shape, batch, seq)).unwrap();
    t.init_weights(1337);
    t
}

/// Deterministic pseudo-random tokens below `vocab`.
pub fn tokens(n: usize, vocab: u64, seed: u64) -> Vec<u32> {
    let mut rng = data::SplitMix64::new(seed);
    (0..n).map(|_| rng.next_below(vocab) as u32).collect()
}
