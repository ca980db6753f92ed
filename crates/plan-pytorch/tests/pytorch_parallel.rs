//! The `pytorch` profile with DeepSpeed ZeRO 0-3, master weights, 8-bit Adam, optimizer offload
//! and segment recompute: model-state sizes derivable by hand from DeepSpeed's and
//! bitsandbytes' layouts.

use plan::presets::by_name;
use plan::setup::{Offload, Optimizer, Precision, Recompute, TrainSetup, ZeroStage};
use plan_pytorch::{training_detail, OptimizerImpl, TrainDetail};

const P: u64 = 6_738_415_616; // Llama-2-7B

fn setup(zero: ZeroStage, dp: u32) -> TrainSetup {
    TrainSetup {
        zero,
        dp,
        recompute: Recompute::Full,
        ..TrainSetup::new(1, 1024)
    }
}

fn run(s: &TrainSetup) -> TrainDetail {
    training_detail(&by_name("llama2-7b").unwrap(), s, OptimizerImpl::Fused).unwrap()
}

fn close(a: u64, b: u64, tol: f64) -> bool {
    (a as f64 - b as f64).abs() <= tol * b as f64
}

#[test]
fn zero_stages_shard_the_model_states_as_deepspeed_does() {
    // Steady state per rank: 16-bit weights (2P, or 2P/N at stage 3) + fp32 master and two
    // moments (12P/N from stage 1).
    let s1 = run(&setup(ZeroStage::Zero1, 8));
    assert!(close(s1.steady_bytes, 2 * P + 12 * P / 8, 1e-4));
    let s3 = run(&setup(ZeroStage::Zero3, 8));
    assert!(
        close(s3.steady_bytes, 14 * P / 8, 1e-3),
        "{}",
        s3.steady_bytes
    );
    let s2 = run(&setup(ZeroStage::Zero2, 8));
    let (p1, p2, p3) = (
        s1.estimate.peak_bytes,
        s2.estimate.peak_bytes,
        s3.estimate.peak_bytes,
    );
    assert!(p1 > p2 && p2 > p3, "{p1} {p2} {p3}");
    // Stage 1 still holds every bf16 gradient (2P); stage 2 only its partition and the reduce
    // bucket, so the step saves about 2P·7/8 minus the 1 GB bucket.
    let saved = p1 - p2;
    assert!(close(saved, 2 * P * 7 / 8 - 1_000_000_000, 0.05), "{saved}");
}

#[test]
fn zero3_on_eight_ranks_is_near_deepspeeds_estimator() {
    // DeepSpeed's `estimate_zero3_model_states_mem_needs`: largest layer's 4 bytes per param
    // + 18P/N. Our peak adds activations (checkpointed, 1024 tokens) and the 1 GB reduce bucket.
    let d = run(&setup(ZeroStage::Zero3, 8));
    let largest_layer = 4 * 32000 * 4096;
    let estimator = 4 * largest_layer + 18 * P / 8;
    let peak = d.estimate.peak_bytes;
    assert!(peak > 18 * P / 8, "{peak}");
    assert!(peak < estimator + 3_000_000_000, "{peak} vs {estimator}");
}

#[test]
fn optimizer_offload_moves_master_moments_and_fp32_grads_to_host() {
    let mut s = setup(ZeroStage::Zero2, 8);
    s.offload = Offload::Optimizer;
    let d = run(&s);
    assert!(close(d.estimate.host_peak_bytes, 16 * P / 8, 1e-4));
    assert!(close(d.steady_bytes, 2 * P, 1e-4));
}

#[test]
fn ddp_keeps_bucket_buffers_as_large_as_the_gradients() {
    let mut one = setup(ZeroStage::Zero0, 1);
    one.precision = Precision::AmpBf16;
    let mut ddp = one.clone();
    ddp.dp = 8;
    let (a, b) = (run(&one), run(&ddp));
    // fp32 gradients under AMP: the reducer's buckets add 4P.
    assert_eq!(b.estimate.peak_bytes - a.estimate.peak_bytes, 4 * P);
}

#[test]
fn adamw_8bit_keeps_one_byte_per_moment_plus_block_absmax() {
    let mut s = setup(ZeroStage::Zero0, 1);
    s.precision = Precision::PureBf16;
    s.optimizer = Optimizer::AdamW8bit;
    let d = run(&s);
    // bf16 weights (2P) + two uint8 moments (2P) + two fp32 absmax per 256 (8P/256).
    assert!(
        close(d.steady_bytes, 4 * P + 8 * P / 256, 1e-3),
        "{}",
        d.steady_bytes
    );
}

#[test]
fn every_k_recompute_keeps_one_input_per_segment() {
    let mut full = setup(ZeroStage::Zero0, 1);
    full.precision = Precision::AmpBf16;
    let mut every4 = full.clone();
    every4.recompute = Recompute::Every(4);
    let mut sqrt = full.clone();
    sqrt.recompute = Recompute::Sqrt;
    let (a, b, c) = (run(&full), run(&every4), run(&sqrt));
    // Under AMP the residual stream between blocks is fp32: 1024 x 4096 x 4 bytes per kept input.
    let input = 1024 * 4096 * 4;
    assert_eq!(
        a.after_forward_bytes - b.after_forward_bytes,
        (32 - 8) * input
    );
    // sqrt: K = round(sqrt(32)) = 6, so 6 segments.
    assert_eq!(
        a.after_forward_bytes - c.after_forward_bytes,
        (32 - 6) * input
    );
}
