//! The `pytorch` profile on LoRA/QLoRA (PEFT + bitsandbytes), MoE (Mixtral, DeepSeek) and MLA:
//! properties derivable by hand from the libraries' storage and autograd rules.

mod common;

use common::L2_LINEARS;
use plan::presets::by_name;
use plan::setup::{Dtype, InferSetup, Lora, Precision, Recompute, TrainSetup};
use plan_pytorch::{inference_estimate, training_detail, OptimizerImpl};

fn setup(precision: Precision, lora: Option<Lora>) -> TrainSetup {
    TrainSetup {
        precision,
        recompute: Recompute::Full,
        lora,
        ..TrainSetup::new(1, 512)
    }
}

fn lora(rank: u32, targets: &[&str], base: Dtype) -> Option<Lora> {
    Some(Lora {
        rank,
        targets: targets.iter().map(|s| s.to_string()).collect(),
        base,
        double_quant: true,
        dropout: 0.0,
        ggml: None,
    })
}

#[test]
fn lora_rank_adds_adapter_bytes_times_param_grad_and_two_moments() {
    let m = by_name("llama2-7b").unwrap();
    let t = ["q_proj", "v_proj"];
    let run = |r| {
        training_detail(
            &m,
            &setup(Precision::AmpBf16, lora(r, &t, Dtype::Bf16)),
            OptimizerImpl::Fused,
        )
        .unwrap()
    };
    let (r8, r16) = (run(8), run(16));
    // 8 more ranks on two 4096x4096 linears per layer: A and B grow by 8 x (4096 + 4096) each.
    let extra_numel = 32 * 2 * 8 * (4096 + 4096);
    // Steady state: fp32 adapters + two fp32 AdamW moments.
    assert_eq!(r16.steady_bytes - r8.steady_bytes, extra_numel * 12);
    // The peak (here at the loss, before any gradient exists) adds at least that, and at most
    // their fp32 gradients on top, plus rank-sized activations (< 1 MiB here).
    let d = r16.estimate.peak_bytes - r8.estimate.peak_bytes;
    assert!(d >= extra_numel * 12, "{d}");
    assert!(d < extra_numel * 16 + (1 << 20), "{d}");
    // The frozen bf16 base: 2 bytes per parameter, with no gradient or optimizer state.
    let base = 2 * 6_738_415_616u64;
    let adapters_r16 = 32 * 2 * 16 * (4096 + 4096);
    assert_eq!(r16.steady_bytes, base + 12 * adapters_r16);
}

/// bitsandbytes' nf4 storage per linear, each part its own 512-byte-rounded allocation: packed
/// codes, uint8 absmax per 64, fp32 absmax per 256 blocks, an fp32 offset, the nf4 code table.
fn nf4_bytes(numel: u64) -> u64 {
    let r = |b: u64| b.div_ceil(512) * 512;
    let blocks = numel.div_ceil(64);
    r(numel / 2) + r(blocks) + r(4 * blocks.div_ceil(256)) + r(4) + r(64)
}

#[test]
fn qlora_nf4_base_matches_bitsandbytes_storage() {
    let m = by_name("llama2-7b").unwrap();
    let s = setup(
        Precision::AmpBf16,
        lora(16, &["q_proj", "v_proj"], Dtype::Nf4),
    );
    let d = training_detail(&m, &s, OptimizerImpl::Fused).unwrap();
    let linears: u64 = L2_LINEARS.iter().map(|&(i, o)| nf4_bytes(i * o)).sum();
    // prepare_model_for_kbit_training: embeddings, norms and the head upcast to fp32.
    let dense = 4 * (2 * 32000 * 4096 + (2 * 32 + 1) * 4096);
    let adapters = 32 * 2 * 16 * (4096 + 4096) * 12;
    assert_eq!(d.steady_bytes, 32 * linears + dense + adapters);
    // 4.13 bits per base weight: far below the bf16 base.
    let bf16 = training_detail(
        &m,
        &setup(
            Precision::AmpBf16,
            lora(16, &["q_proj", "v_proj"], Dtype::Bf16),
        ),
        OptimizerImpl::Fused,
    )
    .unwrap();
    assert!(d.steady_bytes < bf16.steady_bytes / 2);
    // The forward dequantizes each weight to a bf16 temporary (sm90, many rows), so the peak
    // holds at least the largest one (4096 x 11008 x 2 bytes) on top of the steady state.
    assert!(d.estimate.peak_bytes > d.steady_bytes + 4096 * 11008 * 2);
}

#[test]
fn int8_base_is_one_byte_per_weight_plus_row_scales() {
    let m = by_name("tinyllama-1.1b").unwrap();
    let s = setup(Precision::AmpBf16, lora(8, &["q_proj"], Dtype::Int8));
    let d = training_detail(&m, &s, OptimizerImpl::Fused).unwrap();
    let r = |b: u64| b.div_ceil(512) * 512;
    let lin = [
        (2048, 2048),
        (2048, 256),
        (2048, 256),
        (2048, 2048),
        (2048, 5632),
        (2048, 5632),
        (5632, 2048),
    ];
    let per_layer: u64 = lin.iter().map(|&(i, o)| r(i * o) + r(4 * o)).sum();
    let dense = 4 * (2 * 32000 * 2048 + (2 * 22 + 1) * 2048);
    let adapters = 22 * 8 * (2048 + 2048) * 12;
    assert_eq!(d.steady_bytes, 22 * per_layer + dense + adapters);
}

#[test]
fn lora_on_missing_module_is_an_error() {
    let m = by_name("gpt2-124m").unwrap();
    let s = setup(Precision::AmpBf16, lora(8, &["q_proj"], Dtype::Bf16));
    let err = training_detail(&m, &s, OptimizerImpl::Fused).unwrap_err();
    assert!(err.to_string().contains("q_proj"), "{err}");
    let ok = setup(Precision::AmpBf16, lora(8, &["c_attn"], Dtype::Bf16));
    assert!(training_detail(&m, &ok, OptimizerImpl::Fused).is_ok());
}

#[test]
fn mixtral_experts_hold_all_weights_and_state() {
    let m = by_name("mixtral-8x7b").unwrap();
    let mut s = setup(Precision::PureBf16, None);
    s.seq = 256;
    let d = training_detail(&m, &s, OptimizerImpl::Fused).unwrap();
    // bf16 weights and two bf16 AdamW moments: 6 bytes per parameter, every tensor 512-aligned.
    assert_eq!(d.steady_bytes, 6 * m.param_count());
    // Backward holds every expert's bf16 gradient too.
    assert!(d.estimate.peak_bytes > 8 * m.param_count());
}

#[test]
fn moe_activations_grow_with_top_k_not_with_experts() {
    let base = by_name("mixtral-8x7b").unwrap();
    let mut s = setup(Precision::PureBf16, None);
    s.recompute = Recompute::None;
    s.seq = 1024;
    let act = |m: &plan::ModelShape| {
        let d = training_detail(m, &s, OptimizerImpl::Fused).unwrap();
        d.after_forward_bytes - d.steady_bytes
    };
    let mut top1 = base.clone();
    top1.moe.as_mut().unwrap().n_active = 1;
    let (a2, a1) = (act(&base), act(&top1));
    // Each extra routed copy of a token keeps, in bf16, its gathered input (C, saved by the
    // grouped matmul), gate/up output (2F, saved through its halves by silu and the product),
    // the activation (F) and product (F, saved by down_proj) and the down output (C, saved by
    // the fp32 score multiply); plus the fp32 score, int64 top-k index and fp32 top-k value.
    let per_row = 2 * (2 * 4096 + 4 * 14336);
    let rows = 32 * 1024;
    assert!(a2 - a1 >= rows * per_row, "{a2} vs {a1}");
    assert!(
        a2 - a1 <= rows * (per_row + 16) + 32 * 6 * 512,
        "{a2} vs {a1}"
    );
}

#[test]
fn mla_caches_the_latent_and_rope_key() {
    let m = by_name("deepseek-v2-lite").unwrap();
    let mla = m.mla.clone().unwrap();
    let s = InferSetup::new(Dtype::Bf16, Dtype::Bf16, 2, 1024);
    let d = inference_estimate(&m, &s, Some(1)).unwrap();
    let per_token = (mla.kv_lora_rank + mla.qk_rope_head_dim) * 2;
    assert_eq!(d.kv_cache_bytes, m.n_layers as u64 * 2 * 1024 * per_token);
    // Decompressing the cache at decode builds per-head keys over the whole context.
    let heads = m.n_heads as u64;
    let key = 2 * 1025 * heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) * 2;
    assert!(d.decode_peak_bytes > d.weights_bytes + d.kv_cache_bytes + key);
}
