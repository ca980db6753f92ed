//! The classic worked training numbers (GB = 10^9 bytes, Ψ = 7×10^9) and the formula runtime's
//! behaviour on shaped models: ZeRO, recompute, offload, pipeline, LoRA.

use plan::setup::*;
use plan::{formula, presets, Category, Device, PlanError};

/// The classic table follows the ZeRO paper's accounting (2 + 2 + 12 bytes, nothing else).
fn setup(zero: ZeroStage, dp: u32) -> TrainSetup {
    TrainSetup {
        zero,
        dp,
        convention: Convention::Paper,
        ..TrainSetup::new(4, 2048)
    }
}

fn states_gb(zero: ZeroStage, dp: u32) -> f64 {
    let e = formula::model_states_estimate(7_000_000_000, &setup(zero, dp)).unwrap();
    e.peak_bytes as f64 / 1e9
}

#[test]
fn seed_zero_table_is_exact() {
    assert_eq!(states_gb(ZeroStage::Zero0, 1), 112.0);
    assert_eq!(states_gb(ZeroStage::Zero1, 8), 38.5);
    assert_eq!(states_gb(ZeroStage::Zero2, 8), 26.25);
    assert_eq!(states_gb(ZeroStage::Zero3, 8), 14.0);
    // The classic breakdown: 14 GB params, 14 GB grads, 84 GB optimizer state.
    let e = formula::model_states_estimate(7_000_000_000, &setup(ZeroStage::Zero0, 1)).unwrap();
    let (_, c) = e.plan.at_peak(Device::Gpu);
    assert_eq!(c[Category::Params as usize], 14_000_000_000);
    assert_eq!(c[Category::Grads as usize], 14_000_000_000);
    assert_eq!(c[Category::Optimizer as usize], 84_000_000_000);
}

#[test]
fn sgd_and_offload_follow_the_seed() {
    // SGD: 4 bytes of state per parameter instead of Adam's 12 (the classic factor table).
    let mut s = setup(ZeroStage::Zero0, 1);
    s.precision = Precision::Fp32;
    s.optimizer = Optimizer::Sgd;
    let e = formula::model_states_estimate(1_000_000_000, &s).unwrap();
    assert_eq!(e.peak_bytes, 12_000_000_000);
    let mut off = setup(ZeroStage::Zero2, 8);
    off.offload = Offload::Optimizer;
    let e = formula::model_states_estimate(7_000_000_000, &off).unwrap();
    // ZeRO-2 reduces each gradient straight into the host's fp32 partition: only the 16-bit
    // weights stay on the device (DeepSpeed's estimator: 2Ψ).
    assert_eq!(e.peak_bytes, 14_000_000_000);
    assert_eq!(e.host_peak_bytes, (84_000_000_000 + 28_000_000_000) / 8);
}

#[test]
fn zero_stages_shrink_a_real_model_and_categories_sum_to_peak() {
    let m = presets::by_name("llama2-7b").unwrap();
    let mut last = u64::MAX;
    // With accumulation the gradients persist across micro-batches, so sharding them pays at the
    // activation peak too (with one micro-batch they are born layer by layer in backward).
    for zero in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
        let mut s = setup(zero, 8);
        s.grad_accum = 4;
        let e = formula::training_estimate(&m, &s).unwrap();
        let (_, c) = e.plan.at_peak(Device::Gpu);
        assert_eq!(c.iter().sum::<u64>(), e.peak_bytes);
        assert!(e.peak_bytes < last, "{zero:?} {} !< {last}", e.peak_bytes);
        last = e.peak_bytes;
    }
}

#[test]
fn recompute_trades_activations() {
    let m = presets::by_name("llama2-7b").unwrap();
    let acts = |r| {
        let mut s = setup(ZeroStage::Zero3, 8);
        s.recompute = r;
        let plan = formula::training_plan(&m, &s).unwrap();
        plan.category_peaks(Device::Gpu)[Category::Activations as usize]
    };
    let none = acts(Recompute::None);
    let full = acts(Recompute::Full);
    let sqrt = acts(Recompute::Sqrt);
    let every4 = acts(Recompute::Every(4));
    assert!(full < sqrt && sqrt < none, "{full} {sqrt} {none}");
    assert!(full < every4 && every4 < none);
    // Full recompute: 32 layer inputs (2sbh each) plus one block rematerialized.
    let (s, b, h) = (2048u64, 4u64, 4096u64);
    assert!(full >= 32 * 2 * s * b * h);
}

#[test]
fn eager_attention_adds_the_quadratic_term() {
    let m = presets::by_name("gpt2-124m").unwrap();
    let mut s = setup(ZeroStage::Zero0, 1);
    s.seq = 1024;
    let flash = formula::training_estimate(&m, &s).unwrap().peak_bytes;
    s.attention = Attention::Eager;
    let eager = formula::training_estimate(&m, &s).unwrap().peak_bytes;
    // 12 layers × 5·a·s²·b bytes, minus flash's log-sum-exp.
    let quadratic = 12 * 5 * 12 * 1024 * 1024 * 4;
    let lse = 12 * 4 * 1024 * 4 * 12;
    assert_eq!(eager - flash, quadratic - lse);
}

#[test]
fn qlora_shrinks_states() {
    let m = presets::by_name("llama2-7b").unwrap();
    let mut s = setup(ZeroStage::Zero0, 1);
    s.micro_batch = 1;
    s.lora = Some(Lora {
        rank: 16,
        targets: vec!["q_proj".into(), "v_proj".into()],
        base: Dtype::Nf4,
        double_quant: true,
        dropout: 0.0,
        ggml: None,
    });
    let plan = formula::training_plan(&m, &s).unwrap();
    let peaks = plan.category_peaks(Device::Gpu);
    // 8,388,608 adapter parameters: bf16 weights + grads, fp32 master + Adam.
    assert_eq!(peaks[Category::Optimizer as usize], 8_388_608 * 12);
    let base = peaks[Category::Params as usize];
    assert!((3.5e9..4.2e9).contains(&(base as f64)), "nf4 base {base}");
}

#[test]
fn bad_setups_name_the_flag() {
    let m = presets::by_name("llama2-7b").unwrap();
    let field = |s: &TrainSetup| match formula::training_plan(&m, s).unwrap_err() {
        PlanError::Invalid { field, .. } => field,
        other => panic!("{other:?}"),
    };
    let mut s = setup(ZeroStage::Zero0, 0);
    assert_eq!(field(&s), "--gpus");
    s.dp = 1;
    s.tp = 3;
    assert_eq!(field(&s), "--tp");
    s.tp = 1;
    s.offload = Offload::Params;
    assert_eq!(field(&s), "--offload");
    s.offload = Offload::None;
    s.lora = Some(Lora {
        rank: 8,
        targets: vec!["c_attn".into()],
        base: Dtype::Bf16,
        double_quant: false,
        dropout: 0.0,
        ggml: None,
    });
    assert_eq!(field(&s), "--lora-targets");
}

#[test]
fn pipeline_first_stage_holds_more_micro_batches() {
    let m = presets::by_name("llama2-7b").unwrap();
    let mut s = setup(ZeroStage::Zero1, 2);
    s.pp = 4;
    s.grad_accum = 8;
    let plan = formula::training_plan(&m, &s).unwrap();
    assert_eq!(plan.n_layers, 8);
    let mut one = s.clone();
    one.grad_accum = 1;
    let acts = |p: &plan::MemoryPlan| p.category_peaks(Device::Gpu)[Category::Activations as usize];
    let single = formula::training_plan(&m, &one).unwrap();
    assert!(acts(&plan) > 3 * acts(&single));
}
