//! What the engine's tests and benches share instead of copies: toy model shapes, the run config
//! builder, seeded tokens, the rank harness and loud comparisons. Public so integration tests,
//! benches and the CLI's tests reach it; nothing in the engine itself uses it.
//!
//! Example:
//! ```
//! use engine::testkit::{config, gpt2_tiny, on_ranks};
//! let losses = on_ranks(2, |comm| {
//!     let cfg = engine::TrainConfig { ranks: 2, ..config(gpt2_tiny(), 1, 8) };
//!     let mut t = engine::Trainer::with_comm(cfg, comm).unwrap();
//!     t.init_weights(1);
//!     let tokens = engine::testkit::tokens(8, 96, 3);
//!     t.step(&mut |i, o| { i.copy_from_slice(&tokens); o.copy_from_slice(&tokens) }).unwrap().loss
//! });
//! assert_eq!(losses[0], losses[1]);
//! ```

use crate::train::{TrainConfig, Trainer};
use crate::ModelConfig;
use comm::Collective;
use plan::buffer::Device;
use plan::model::Family;
use plan::setup::Attention;
use plan::ModelShape;
use std::time::Duration;

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
        sliding_window: None,
    }
}

/// A Llama block design at toy size: GQA (4 query heads over 2 kv heads), untied head.
pub fn llama_tiny() -> ModelShape {
    ModelShape {
        name: "llama-test".into(),
        family: Family::Llama,
        n_kv_heads: 2,
        d_ff: 64,
        tied_embeddings: false,
        ..gpt2_tiny()
    }
}

/// A Mixtral block design at toy size: Llama attention and 4 SwiGLU experts of 48, top 2,
/// trained with the preset's load-balancing loss.
pub fn mixtral_tiny() -> ModelShape {
    ModelShape {
        name: "mixtral-test".into(),
        family: Family::Mixtral,
        d_ff: 48,
        moe: Some(plan::model::Moe {
            n_experts: 4,
            n_active: 2,
            n_shared: 0,
            d_ff_expert: 48,
            first_dense: 0,
            router_bias: false,
        }),
        ..llama_tiny()
    }
}

/// DeepSeek-V2's design at toy size: latent attention with a query bottleneck (4 heads of
/// 8 + 4, values 8), a dense first layer, then 4 routed experts of 16 (top 2) and 2 shared ones.
pub fn deepseek_tiny() -> ModelShape {
    ModelShape {
        name: "deepseek-test".into(),
        family: Family::Deepseek,
        n_layers: 3,
        d_head: 8,
        d_ff: 64,
        moe: Some(plan::model::Moe {
            n_experts: 4,
            n_active: 2,
            n_shared: 2,
            d_ff_expert: 16,
            first_dense: 1,
            router_bias: false,
        }),
        mla: Some(plan::model::Mla {
            q_lora_rank: Some(24),
            kv_lora_rank: 16,
            qk_rope_head_dim: 4,
            qk_nope_head_dim: 8,
            v_head_dim: 8,
        }),
        ..llama_tiny()
    }
}

/// The tests' run: `TrainConfig::new`'s defaults with materialised attention (the golden files
/// were written with it).
pub fn config(shape: ModelShape, batch: u64, seq: u64) -> TrainConfig {
    TrainConfig {
        attention: Attention::Eager,
        ..TrainConfig::new(ModelConfig::from_shape(shape).unwrap(), batch, seq)
    }
}

/// A one-rank trainer of [`config`], weights from seed 1337.
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

/// `n` values uniform in [-scale/2, scale/2) from `seed` (the project's SplitMix64).
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = data::SplitMix64::new(seed);
    let unit = |x: u64| (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
    (0..n).map(|_| scale * unit(rng.next_u64())).collect()
}

/// Asserts rank `failing` ended with its own data error and every other rank with a
/// communication error naming it (a dead rank stops the others; it never hangs them).
pub fn assert_rank_failure_named<T: std::fmt::Debug>(
    results: &[Result<T, crate::EngineError>],
    failing: usize,
) {
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(crate::EngineError::Data(_)) if rank == failing => {}
            Err(crate::EngineError::Comm(e)) if rank != failing => {
                let name = format!("rank {failing}");
                assert!(e.to_string().contains(&name), "rank {rank}: {e}");
            }
            other => panic!("rank {rank} should fail naming rank {failing}, got {other:?}"),
        }
    }
}

/// Restores `trainer` and `loader` from `snap` the way a resumed run does, after first giving
/// the trainer different weights (so the snapshot must overwrite all of them).
pub fn resume_from(
    snap: &crate::snapshot::Snapshot,
    trainer: &mut Trainer,
    loader: &mut data::Loader,
    seed: u64,
) {
    trainer.init_weights(seed + 1);
    snap.check_compatible(&trainer.config, seed).unwrap();
    let run = snap.restore(trainer).unwrap();
    loader.seek(run.loader).unwrap();
}

/// Runs `f` on every rank of a world of `ranks` (threads, through `world::launch`) and returns
/// the results in rank order; a rank's panic fails the test with its message.
pub fn on_ranks<T: Send>(ranks: usize, f: impl Fn(Box<dyn Collective>) -> T + Sync) -> Vec<T> {
    let run = crate::world::launch(
        ranks,
        Duration::from_secs(60),
        |c| Ok::<T, crate::EngineError>(f(c)),
        crate::world::comm_failure,
    );
    run.unwrap_or_else(|e| panic!("{e}"))
}

/// The largest absolute difference between two lists of equal-length vectors.
pub fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "as many vectors");
    let pairs = a.iter().zip(b).flat_map(|(p, q)| {
        assert_eq!(p.len(), q.len(), "vectors of equal length");
        p.iter().zip(q)
    });
    pairs.map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Fails with `what`, the index and both values unless `|got - want| <= tol · max(1, |want|)`.
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = tol * w.abs().max(1.0);
        assert!(
            (g - w).abs() <= bound,
            "{what}[{i}]: got {g}, want {w} (tolerance {tol}, relative above 1)"
        );
    }
}

/// Asserts the arena measured exactly its plan: the peak, the breakdown at the peak and every
/// category's own peak.
pub fn assert_measured_equals_planned(t: &Trainer, what: &str) {
    let m = t.measured();
    let plan = &t.plan;
    assert_eq!(m.peak_bytes, plan.peak_bytes(Device::Gpu), "{what}: peak");
    assert_eq!(
        m.at_peak_bytes,
        plan.at_peak(Device::Gpu).1,
        "{what}: at peak"
    );
    let peaks = plan.category_peaks(Device::Gpu);
    assert_eq!(m.category_peak_bytes, peaks, "{what}: category peaks");
}

/// The f32 tensor `name` of safetensors `bytes` (golden files; int32 inputs read as bits).
pub fn safetensors_f32s(bytes: &[u8], name: &str) -> Vec<f32> {
    let st = safetensors::SafeTensors::deserialize(bytes).expect("a safetensors file");
    let t = st
        .tensor(name)
        .unwrap_or_else(|_| panic!("golden file lacks {name}"));
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Fails naming `name`, the index and both values unless every `|got - want| <= tol`
/// (absolute: golden tensors of O(1) values).
pub fn assert_max_abs(name: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let (mut max_err, mut at) = (0.0f32, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        if err > max_err || err.is_nan() {
            (max_err, at) = (err, i);
        }
    }
    assert!(
        max_err <= tol,
        "{name}: max error {max_err:e} at {at} (got {}, want {}), tolerance {tol:e}",
        got[at],
        want[at]
    );
}
