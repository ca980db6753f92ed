//! The training tests' harness: the run config builder, ranks, snapshot resumes and the planned
//! == measured check, beside `train::testkit`'s shapes and tokens, re-exported here.
//!
//! Example:
//! ```
//! use train::testkit::{config, gpt2_tiny, on_ranks};
//! let losses = on_ranks(2, |comm| {
//!     let cfg = train::TrainConfig { ranks: 2, ..config(gpt2_tiny(), 1, 8) };
//!     let mut t = train::Trainer::with_comm(cfg, comm).unwrap();
//!     t.init_weights(1);
//!     let tokens = train::testkit::tokens(8, 96, 3);
//!     t.step(&mut |i, o| { i.copy_from_slice(&tokens); o.copy_from_slice(&tokens) }).unwrap().loss
//! });
//! assert_eq!(losses[0], losses[1]);
//! ```

use crate::{TrainConfig, Trainer};
use comm::Collective;
use engine::ModelConfig;
use plan::buffer::Device;
use plan::setup::Attention;
use plan::ModelShape;
use std::time::Duration;

pub use engine::testkit::*;

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

/// Asserts rank `failing` ended with its own data error and every other rank with a
/// communication error naming it (a dead rank stops the others; it never hangs them).
pub fn assert_rank_failure_named<T: std::fmt::Debug>(
    results: &[Result<T, engine::EngineError>],
    failing: usize,
) {
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(engine::EngineError::Data(_)) if rank == failing => {}
            Err(engine::EngineError::Comm(e)) if rank != failing => {
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

/// Saves `trainer` into `out` the way a run does: at `loader`'s position, from `seed`, with no
/// data identity and the default options (what [`resume_from`] reads back).
pub fn save_snapshot(
    out: &std::path::Path,
    trainer: &mut Trainer,
    loader: &data::Loader,
    seed: u64,
) {
    let run = crate::snapshot::RunState {
        loader: loader.position(),
        seed,
        data: None,
    };
    let options = crate::snapshot::SaveOptions::default();
    crate::snapshot::save(trainer, out, &run, &options).unwrap();
}

/// The losses of `steps` steps of `trainer`, every one on the same batch: `inputs` to predict
/// `targets`.
pub fn losses_on(trainer: &mut Trainer, inputs: &[u32], targets: &[u32], steps: usize) -> Vec<f32> {
    let mut step = || {
        let batch = &mut |i: &mut [u32], o: &mut [u32]| {
            i.copy_from_slice(inputs);
            o.copy_from_slice(targets);
        };
        trainer.step(batch).unwrap().loss
    };
    (0..steps).map(|_| step()).collect()
}

/// One step of `cfg` on the rank `comm` names, weights from seed 1, where rank 1's inputs are
/// all 96 (an id beyond gpt2-tiny's vocabulary) and every other rank's all 3; `target` gives the
/// targets' id from the inputs' one. Rank 1 must fail with a data error, the others must not hang.
pub fn step_with_rank_1_bad(
    cfg: TrainConfig,
    comm: Box<dyn Collective>,
    target: impl Fn(u32) -> u32,
) -> Result<(), engine::EngineError> {
    let rank = comm.rank();
    let mut t = Trainer::with_comm(cfg, comm)?;
    t.init_weights(1);
    let bad = if rank == 1 { 96 } else { 3 };
    t.step(&mut |i, o| {
        i.fill(bad);
        o.fill(target(bad));
    })
    .map(|_| ())
}

/// The snapshot tests' schedule: 3e-3 reached after 2 warm-up steps, decayed to a tenth of it by
/// step 6.
pub const SIX_STEP_SCHEDULE: crate::Schedule = crate::Schedule {
    lr: 3e-3,
    warmup_steps: 2,
    total_steps: 6,
    min_lr_ratio: 0.1,
};

/// Runs `f` on every rank of a world of `ranks` (threads, through `world::launch`) and returns
/// the results in rank order; a rank's panic fails the test with its message.
pub fn on_ranks<T: Send>(ranks: usize, f: impl Fn(Box<dyn Collective>) -> T + Sync) -> Vec<T> {
    let run = engine::world::launch(
        ranks,
        Duration::from_secs(60),
        |c| Ok::<T, engine::EngineError>(f(c)),
        engine::world::comm_failure,
    );
    run.unwrap_or_else(|e| panic!("{e}"))
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
