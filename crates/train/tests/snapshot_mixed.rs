//! Snapshots of bf16/fp16 runs: the fp32 master weights, AdamW's m and v (in the arena or the
//! host offload store) and the fp16 loss scaler are saved, and an interrupted and resumed run
//! follows the uninterrupted one bit for bit (same ranks and ZeRO stage); a resume with another
//! precision is refused, naming it. fp32 snapshots are `snapshot.rs`.

mod common;

use common::{config, gpt2_tiny, llama_tiny, tokens};
use plan::setup::{Offload, ZeroStage};
use plan::ModelShape;
use std::path::{Path, PathBuf};
use train::precision::{ScalerConfig, TorchScaling};
use train::snapshot::{Snapshot, SnapshotError};
use train::Mixed;
use train::{TrainConfig, Trainer};

const SEQ: usize = 16;
const GLOBAL_ROWS: usize = 4;
const SEED: u64 = 7;

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("frugal-snapmix-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn run_config(shape: &ModelShape, ranks: u32) -> TrainConfig {
    let rows = (GLOBAL_ROWS as u32 / ranks) as u64;
    let mut cfg = config(shape.clone(), rows, SEQ as u64);
    cfg.ranks = ranks;
    cfg.schedule = common::SIX_STEP_SCHEDULE;
    cfg
}

/// fp16 with a scale that grows every 2 clean steps, so the scaler's state crosses the save.
fn fp16() -> Mixed {
    Mixed::fp16(ScalerConfig::Torch(TorchScaling {
        init_scale: 1024.0,
        growth_interval: 2,
        ..TorchScaling::default()
    }))
}

fn offloaded(mut mixed: Mixed, file: Option<PathBuf>) -> Mixed {
    mixed.offload = Offload::Optimizer;
    mixed.offload_path = file;
    mixed
}

struct Plan<'a> {
    zero: ZeroStage,
    mixed: Mixed,
    resume: Option<&'a Snapshot>,
    save_to: Option<&'a Path>,
    until_step: u64,
}

/// One rank's run: its losses, final master weights (as bits) and loss scale.
fn rank_run(mut cfg: TrainConfig, comm: Box<dyn comm::Collective>, plan: &Plan<'_>) -> Outcome {
    let vocab = cfg.model.shape.vocab;
    let ds = data::Dataset::new(tokens(4000, vocab, 3), vocab as u32, 0.1).unwrap();
    let mut shape = data::BatchShape::single(cfg.batch as usize, SEQ);
    (shape.rank, shape.world_size) = (comm.rank(), comm.world_size());
    // Each rank's offload file is the plan's path with its rank in the name (`Mixed::store_path`).
    (cfg.zero, cfg.mixed) = (plan.zero, plan.mixed.clone());
    let mut trainer = Trainer::with_comm(cfg, comm).unwrap();
    let config = data::LoaderConfig::shuffled(shape, SEED);
    let mut loader = ds.train_loader(config).unwrap();
    trainer.init_weights(SEED);
    if let Some(snap) = plan.resume {
        common::resume_from(snap, &mut trainer, &mut loader, SEED);
    }
    let mut losses = Vec::new();
    while trainer.step < plan.until_step {
        let stats = trainer
            .step(&mut |x, y| {
                loader.next_batch(x, y);
            })
            .unwrap();
        losses.push(stats.loss.to_bits());
    }
    if let Some(out) = plan.save_to {
        common::save_snapshot(out, &mut trainer, &loader, SEED);
    }
    let masters = trainer.full_params().unwrap();
    Outcome {
        losses,
        master_bits: masters.iter().flatten().map(|x| x.to_bits()).collect(),
        scale: trainer.scaler.as_ref().map(|s| s.scale()),
    }
}

#[derive(Debug, PartialEq)]
struct Outcome {
    losses: Vec<u32>,
    master_bits: Vec<u32>,
    scale: Option<f32>,
}

fn run(shape: &ModelShape, ranks: u32, plan: &Plan<'_>) -> Outcome {
    let cfg = run_config(shape, ranks);
    let mut out = common::on_ranks(ranks as usize, |c| rank_run(cfg.clone(), c, plan));
    out.swap_remove(0)
}

/// 6 steps straight vs 3, save, a fresh trainer restored, 3 more: every loss bit, every master
/// weight bit and the final loss scale equal.
fn interrupted_equals_straight(shape: &ModelShape, (ranks, zero): (u32, ZeroStage), mixed: Mixed) {
    let what = format!("{} {mixed:?} on {ranks} ranks at {zero:?}", shape.name);
    let plan = |resume, save_to, until_step| Plan {
        zero,
        mixed: mixed.clone(),
        resume,
        save_to,
        until_step,
    };
    let straight = run(shape, ranks, &plan(None, None, 6));
    let name = format!("{}-{ranks}-{zero:?}-{:?}", shape.name, mixed.precision);
    let out = temp_dir(&format!("{name}-{:?}", mixed.offload));
    let first = run(shape, ranks, &plan(None, Some(&out), 3));
    let snap = Snapshot::open(&out).unwrap();
    assert_eq!(snap.state.step, 3, "{what}");
    let saved_scaler = snap.state.loss_scaler.map(|s| s.state.scale as f32);
    assert_eq!(
        saved_scaler, first.scale,
        "{what}: train.json's loss scaler"
    );
    let second = run(shape, ranks, &plan(Some(&snap), None, 6));
    let mut losses = first.losses;
    losses.extend(second.losses);
    assert_eq!(losses, straight.losses, "{what}: losses");
    assert_eq!(
        second.master_bits, straight.master_bits,
        "{what}: master weights"
    );
    assert_eq!(second.scale, straight.scale, "{what}: loss scale");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn bf16_and_fp16_runs_resume_bit_identically_at_zero_0_and_sharded() {
    interrupted_equals_straight(&gpt2_tiny(), (1, ZeroStage::Zero0), Mixed::bf16());
    interrupted_equals_straight(&gpt2_tiny(), (1, ZeroStage::Zero0), fp16());
    interrupted_equals_straight(&llama_tiny(), (2, ZeroStage::Zero2), Mixed::bf16());
    interrupted_equals_straight(&gpt2_tiny(), (2, ZeroStage::Zero3), fp16());
}

#[test]
fn offloaded_runs_resume_bit_identically_from_ram_and_from_a_file() {
    let bf16 = offloaded(Mixed::bf16(), None);
    interrupted_equals_straight(&gpt2_tiny(), (1, ZeroStage::Zero0), bf16);
    let file = temp_dir("offload-file").with_extension("bin");
    let fp16 = offloaded(fp16(), Some(file));
    interrupted_equals_straight(&llama_tiny(), (2, ZeroStage::Zero1), fp16);
}

#[test]
fn a_snapshot_resumes_only_with_its_precision() {
    let out = temp_dir("mismatch");
    let plan = Plan {
        zero: ZeroStage::Zero0,
        mixed: fp16(),
        resume: None,
        save_to: Some(&out),
        until_step: 1,
    };
    run(&gpt2_tiny(), 1, &plan);
    let snap = Snapshot::open(&out).unwrap();
    let text = std::fs::read_to_string(snap.dir.join("train.json")).unwrap();
    assert!(text.contains("\"growth_tracker\""), "{text}");
    let cfg = run_config(&gpt2_tiny(), 1);
    for other in [Mixed::bf16(), Mixed::fp32()] {
        let other_cfg = TrainConfig {
            mixed: other,
            ..cfg.clone()
        };
        let err = snap.check_compatible(&other_cfg, SEED).unwrap_err();
        let SnapshotError::Mismatch { differences, .. } = &err else {
            panic!("expected a mismatch, got {err}");
        };
        let fields: Vec<_> = differences.iter().map(|d| d.field.as_str()).collect();
        assert_eq!(fields, ["run.loss_scaler", "run.precision"], "{err}");
        // Skipping the check, restore refuses the scaler mismatch and writes nothing.
        let mut trainer = Trainer::new(other_cfg).unwrap();
        assert!(snap.restore(&mut trainer).is_err());
        assert_eq!(trainer.step, 0);
    }
    let fp16_cfg = TrainConfig {
        mixed: fp16(),
        ..cfg
    };
    snap.check_compatible(&fp16_cfg, SEED).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
}
