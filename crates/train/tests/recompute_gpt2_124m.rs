//! The loss never holds a B×T×V fp32 logits tensor, at GPT-2 124M's real
//! vocabulary: the fused classifier works through `CLASSIFIER_CHUNK_ROWS` rows of logits at a
//! time in `work.classifier`, the only V-wide buffer of the plan.
//!
//! The B=8, T=1024 plan is checked under every recompute policy and attention kernel; one real
//! step runs at B=2, T=128 (flash, full recompute: a few seconds on 2 cores) and the arena
//! measures exactly the plan's peak, classifier chunk included. `frugal train --model gpt2-124m
//! --batch 8 --seq 1024 --recompute full --attention flash --steps 1` measures the big one.

use engine::ModelConfig;

use plan::buffer::{Category, Device, MemoryPlan};
use plan::setup::{Attention, Recompute};
use plan_frugal::CLASSIFIER_CHUNK_ROWS;
use train::{Schedule, TrainConfig, Trainer};

fn config(batch: u64, seq: u64, recompute: Recompute, attention: Attention) -> TrainConfig {
    let shape = plan::presets::by_name("gpt2-124m").unwrap();
    TrainConfig {
        schedule: Schedule::constant(1e-4),
        recompute,
        attention,
        ..TrainConfig::new(ModelConfig::from_shape(shape).unwrap(), batch, seq)
    }
}

/// Asserts no activation or workspace buffer reaches B·T·V·4 bytes (weights may: the V×C token
/// table outgrows a small batch's logits) and the chunk is `CLASSIFIER_CHUNK_ROWS` × V.
fn check_no_full_logits(plan: &MemoryPlan, batch: u64, seq: u64, vocab: u64, what: &str) {
    let logits_bytes = batch * seq * vocab * 4;
    let step = [Category::Activations, Category::Other];
    for b in plan.buffers.iter().filter(|b| step.contains(&b.category)) {
        assert!(
            b.bytes < logits_bytes,
            "{what}: {} holds {} bytes",
            b.name,
            b.bytes
        );
    }
    let chunk = plan.buffers.iter().find(|b| b.name == "work.classifier");
    let chunk = chunk.expect("the plan lists the classifier's chunk");
    // 64 rows, or widened to 128/256 where the step's peak leaves room for it.
    let rows = chunk.bytes / (vocab * 4);
    assert!(
        [CLASSIFIER_CHUNK_ROWS, 128, 256].contains(&rows) && chunk.bytes == rows * vocab * 4,
        "{what}: {rows} rows"
    );
    assert_eq!(chunk.category, Category::Other, "{what}");
}

#[test]
fn no_plan_of_gpt2_124m_at_8x1024_holds_full_logits() {
    let policies = [
        Recompute::None,
        Recompute::Full,
        Recompute::Sqrt,
        Recompute::Selective,
    ];
    for recompute in policies {
        for attention in [Attention::Eager, Attention::Flash] {
            let cfg = config(8, 1024, recompute, attention);
            let plan = plan_frugal::training_plan(&cfg.model.shape, &cfg.setup()).unwrap();
            let what = format!("{recompute:?} {attention:?}");
            check_no_full_logits(&plan, 8, 1024, cfg.model.shape.vocab, &what);
            // At this size no buffer at all comes near: the largest, the token table, is under 10%.
            let largest = plan.buffers.iter().map(|b| b.bytes).max().unwrap();
            assert!(largest < 8 * 1024 * cfg.model.shape.vocab * 4, "{what}");
        }
    }
}

#[test]
fn a_gpt2_124m_step_measures_the_planned_peak_with_the_chunked_loss() {
    let (batch, seq) = (2, 128);
    let cfg = config(batch, seq, Recompute::Full, Attention::Flash);
    let vocab = cfg.model.shape.vocab;
    let mut t = Trainer::new(cfg).unwrap();
    check_no_full_logits(&t.plan, batch, seq, vocab, "2x128");
    t.init_weights(1);
    let n = (batch * seq) as usize;
    let x: Vec<u32> = (0..n as u32).map(|i| i * 7919 % 50257).collect();
    let y: Vec<u32> = (0..n as u32).map(|i| i * 104_729 % 50257).collect();
    let loss = t.forward_backward(&x, &y, 1.0 / n as f32).unwrap() / n as f32;
    // A fresh model predicts about uniformly: ln(50257) = 10.8.
    assert!((loss - 10.8).abs() < 0.5, "loss {loss}");
    let measured = t.measured();
    let planned = t.plan.category_peaks(Device::Gpu);
    assert_eq!(measured.category_peak_bytes, planned);
    assert_eq!(measured.peak_bytes, t.plan.peak_bytes(Device::Gpu));
    let other = measured.category_peak_bytes[Category::Other as usize];
    let chunk = t.plan.buffers.iter().find(|b| b.name == "work.classifier");
    assert_eq!(other, chunk.unwrap().bytes);
}
