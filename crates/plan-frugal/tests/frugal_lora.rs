//! The `frugal` runtime's LoRA plan: the frozen base has no gradient or optimizer bytes, the
//! adapters have exactly 4 + 8 bytes per parameter (fp32 AdamW), and the QLoRA plan of a
//! Llama-2-7B-shaped model is the peak the engine measured (`frugal bench train --model
//! llama2-7b --batch 1 --seq 512 --recompute full --lora-rank 16 --double-quant`, README).

use plan::buffer::{Category, Device};
use plan::setup::{Dtype, Lora, Precision, Recompute, TrainSetup};

fn qlora_7b(double_quant: bool) -> plan::MemoryPlan {
    let model = plan::presets::by_name("llama2-7b").unwrap();
    let setup = TrainSetup {
        precision: Precision::Fp32,
        recompute: Recompute::Full,
        lora: Some(Lora {
            rank: 16,
            targets: vec!["all-linear".into()],
            base: Dtype::Nf4,
            double_quant,
            dropout: 0.0,
            ggml: None,
        }),
        ..TrainSetup::new(1, 512)
    };
    plan_frugal::training_plan(&model, &setup).unwrap()
}

#[test]
fn qlora_7b_plans_the_measured_peak_with_state_for_the_adapters_only() {
    let plan = qlora_7b(true);
    // r (d_in + d_out) per linear: q, k, v, o (4096 -> 4096), gate, up (4096 -> 11008), down.
    let per_layer = 16 * (4 * 8192 + 2 * 15104 + 15104);
    let adapters = 32 * per_layer;
    assert_eq!(adapters, 39_976_960);
    let peaks = plan.category_peaks(Device::Gpu);
    assert_eq!(peaks[Category::Grads as usize], 4 * adapters);
    assert_eq!(peaks[Category::Optimizer as usize], 8 * adapters);
    assert_eq!(
        plan.peak_bytes(Device::Gpu),
        5_588_288_384,
        "the engine's measured peak"
    );
    // Double quantization saves 4 - 1 bytes per block of 64 and costs a scale per 256 blocks
    // and an offset (and at most 3 bytes of padding) per HF linear: 7 linears in 32 blocks.
    let single = qlora_7b(false);
    let saved = single.peak_bytes(Device::Gpu) - plan.peak_bytes(Device::Gpu);
    let linear = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008_u64);
    let blocks = linear / 64;
    let most = 3 * blocks - blocks / 64;
    assert!(
        saved <= most && saved >= most - 7 * 32 * (4 + 3),
        "{saved} vs {most}"
    );
}

#[test]
fn lora_over_experts_or_latent_attention_is_refused_with_the_alternative() {
    let lora = Lora {
        rank: 8,
        targets: vec!["all-linear".into()],
        base: Dtype::Bf16,
        double_quant: false,
        dropout: 0.0,
        ggml: None,
    };
    for name in ["mixtral-tiny", "deepseek-tiny"] {
        let mut model = plan::presets::by_name(name).unwrap();
        let setup = TrainSetup {
            precision: Precision::Fp32,
            lora: Some(lora.clone()),
            ..TrainSetup::new(1, 64)
        };
        let err = plan_frugal::training_plan(&model, &setup).unwrap_err();
        assert!(
            err.to_string().contains("train the full model"),
            "{name}: {err}"
        );
        // A DeepSeek model without routed experts still has latent attention: refused too.
        model.moe = None;
        if model.mla.is_some() {
            assert!(
                plan_frugal::training_plan(&model, &setup).is_err(),
                "{name} dense"
            );
        }
    }
}
