//! The classic worked inference numbers and the KV-cache facts of REFERENCES.md, exactly.

use plan::setup::{Dtype, InferSetup};
use plan::{infer, presets, Category};

fn setup(weights: Dtype, kv_dtype: Dtype, batch: u64, seq: u64) -> InferSetup {
    InferSetup::new(weights, kv_dtype, batch, seq)
}

#[test]
fn seed_weight_table_is_exact() {
    let gb = |d| infer::weights_only_bytes(7_000_000_000, d) as f64 / 1e9;
    assert_eq!(gb(Dtype::F32), 28.0);
    assert_eq!(gb(Dtype::F16), 14.0);
    assert_eq!(gb(Dtype::Int8), 7.0);
    assert_eq!(gb(Dtype::Int4), 3.5);
}

#[test]
fn seed_kv_example_is_exact() {
    // 2 × L × n_h × d_h × seq × batch × 2 bytes with Llama-2-7B's shape.
    let m = presets::by_name("llama2-7b").unwrap();
    let e = infer::inference_estimate(&m, &setup(Dtype::F16, Dtype::Bf16, 1, 2048)).unwrap();
    assert_eq!(e.kv_cache_bytes, 2 * 32 * 32 * 128 * 2048 * 2);
    assert_eq!(e.kv_bytes_per_token, 524_288);
    assert_eq!(e.weights_bytes, 6_738_415_616 * 2);
    let l3 = presets::by_name("llama3-8b").unwrap();
    let e = infer::inference_estimate(&l3, &setup(Dtype::Bf16, Dtype::Bf16, 1, 8)).unwrap();
    assert_eq!(e.kv_bytes_per_token, 131_072);
    let fp8 = infer::inference_estimate(&l3, &setup(Dtype::Bf16, Dtype::Fp8, 1, 8)).unwrap();
    assert_eq!(fp8.kv_bytes_per_token, 65_536);
}

#[test]
fn mla_caches_the_latent() {
    let v3 = presets::by_name("deepseek-v3").unwrap();
    let e = infer::inference_estimate(&v3, &setup(Dtype::Fp8, Dtype::Bf16, 1, 16)).unwrap();
    assert_eq!(e.kv_bytes_per_token, (512 + 64) * 2 * 61);
}

#[test]
fn paged_cache_wastes_only_the_last_block() {
    let m = presets::by_name("llama3-8b").unwrap();
    let mut s = setup(Dtype::Bf16, Dtype::Bf16, 4, 1000);
    s.kv_block = Some(16);
    let e = infer::inference_estimate(&m, &s).unwrap();
    // 1000 tokens in 63 blocks of 16 = 1008 slots: 8 wasted per sequence.
    assert_eq!(e.kv_waste_bytes, 4 * 8 * 131_072);
    assert_eq!(e.kv_cache_bytes, 4 * 1008 * 131_072);
}

#[test]
fn int4_weights_carry_their_scales_and_tp_splits_kv() {
    let m = presets::by_name("llama2-7b").unwrap();
    let mut s = setup(Dtype::Int4, Dtype::Bf16, 1, 4096);
    s.weight_group = Some(128);
    let e = infer::inference_estimate(&m, &s).unwrap();
    // Linear layers at 4 + 16/128 bits, embeddings and head in 16 bits.
    let linear = 32 * 202_375_168u64;
    let expected = linear * 4125 / 8000 + 2 * (2 * 131_072_000) + 2 * (65 * 4096);
    assert_eq!(e.weights_bytes, expected);
    s.tp = 2;
    let half = infer::inference_estimate(&m, &s).unwrap();
    assert_eq!(half.kv_cache_bytes * 2, e.kv_cache_bytes);
    assert!(e.prefill.iter().sum::<u64>() >= e.decode.iter().sum::<u64>());
    assert_eq!(e.at_peak()[Category::KvCache as usize], e.kv_cache_bytes);
}
