//! The `pytorch` profile's inference with quantized weights (bitsandbytes int8/nf4, GPTQ-style
//! int4), a paged KV cache and tensor parallelism: sizes derivable by hand.

mod common;

use common::L2_LINEARS;
use plan::presets::by_name;
use plan::setup::{Attention, Dtype, InferSetup};
use plan_pytorch::{inference_estimate, InferDetail};

fn setup(weights: Dtype) -> InferSetup {
    InferSetup::new(weights, Dtype::Bf16, 2, 1000)
}

fn run(model: &str, s: &InferSetup) -> InferDetail {
    inference_estimate(&by_name(model).unwrap(), s, Some(1)).unwrap()
}

fn r512(b: u64) -> u64 {
    b.div_ceil(512) * 512
}

/// Llama-2-7B's embeddings, head and norms in bf16.
const L2_DENSE: u64 = 2 * (2 * 32000 * 4096 + 65 * 4096);

#[test]
fn int4_weights_are_packed_codes_plus_fp16_scales_and_packed_zeros_per_group_of_128() {
    let d = run("llama2-7b", &setup(Dtype::Int4));
    let per_layer: u64 = L2_LINEARS
        .iter()
        .map(|&(i, o)| {
            let groups = i.div_ceil(128) * o;
            r512(i * o / 2) + r512(2 * groups) + r512(groups / 2)
        })
        .sum();
    assert_eq!(d.weights_bytes, 32 * per_layer + L2_DENSE);
}

#[test]
fn nf4_and_int8_weights_follow_bitsandbytes_storage() {
    let mut double = setup(Dtype::Nf4);
    double.double_quant = true;
    let nf4 = run("llama2-7b", &double);
    let per_layer: u64 = L2_LINEARS
        .iter()
        .map(|&(i, o)| {
            let n = i * o;
            let blocks = n.div_ceil(64);
            r512(n / 2) + r512(blocks) + r512(4 * blocks.div_ceil(256)) + 512 + 512
        })
        .sum();
    assert_eq!(nf4.weights_bytes, 32 * per_layer + L2_DENSE);
    // HF's default: an fp32 absmax per block of 64.
    let single = run("llama2-7b", &setup(Dtype::Nf4));
    let per_layer: u64 = L2_LINEARS
        .iter()
        .map(|&(i, o)| r512(i * o / 2) + r512(4 * (i * o).div_ceil(64)) + 512)
        .sum();
    assert_eq!(single.weights_bytes, 32 * per_layer + L2_DENSE);
    // The formula runtime follows the same flag: the two agree within the allocator's rounding.
    for s in [double.clone(), setup(Dtype::Nf4)] {
        let f = plan::infer::inference_estimate(&by_name("llama2-7b").unwrap(), &s)
            .unwrap()
            .weights_bytes;
        let p = run("llama2-7b", &s).weights_bytes;
        assert!(
            (f as f64 - p as f64).abs() / (p as f64) < 0.002,
            "{f} vs {p}"
        );
    }
    let int8 = run("llama2-7b", &setup(Dtype::Int8));
    let per_layer: u64 = L2_LINEARS.iter().map(|&(i, o)| i * o + 4 * o).sum();
    assert_eq!(int8.weights_bytes, 32 * per_layer + L2_DENSE);
    // The cache is the same whatever the weights' format.
    assert_eq!(nf4.kv_cache_bytes, int8.kv_cache_bytes);
}

#[test]
fn paged_cache_holds_whole_blocks_of_sixteen() {
    let mut s = setup(Dtype::Bf16);
    s.kv_block = Some(16);
    let d = run("llama2-7b", &s);
    // Prefill of 1000 tokens plus one decode token: ceil(1001 / 16) = 63 blocks per sequence;
    // K and V, 32 layers, 32 heads x 128, bf16.
    assert_eq!(d.kv_cache_bytes, 32 * 2 * 2 * 63 * 16 * 4096 * 2);
    let contiguous = run("llama2-7b", &setup(Dtype::Bf16));
    assert_eq!(contiguous.kv_cache_bytes, 32 * 2 * 2 * 1000 * 4096 * 2);
}

#[test]
fn tensor_parallel_rank_holds_its_share_of_heads_and_weights() {
    let one = run("llama3.1-8b", &setup(Dtype::Bf16));
    let mut s = setup(Dtype::Bf16);
    s.tp = 2;
    let two = run("llama3.1-8b", &s);
    assert_eq!(two.kv_cache_bytes * 2, one.kv_cache_bytes);
    // Everything but the norms splits: a little over half.
    let half = one.weights_bytes / 2;
    assert!(two.weights_bytes > half && two.weights_bytes < half + (1 << 20));
    s.tp = 3;
    let err = inference_estimate(&by_name("llama3.1-8b").unwrap(), &s, Some(1)).unwrap_err();
    assert!(err.to_string().contains("--tp"), "{err}");
}

#[test]
fn kv_formats_hf_does_not_cache_are_typed_errors() {
    let mut s = setup(Dtype::Bf16);
    s.kv_dtype = Dtype::Fp8;
    let err = inference_estimate(&by_name("llama2-7b").unwrap(), &s, Some(1)).unwrap_err();
    assert!(err.to_string().contains("KV cache"), "{err}");
}

/// Eager attention's prefill peak, derived by hand: at the last layer's softmax the weights, the
/// whole KV cache and the additive mask (B·T² in bf16) are live with the scaled, masked scores
/// (bf16), the fp32 copy softmax reads (ATen converts bf16 to fp32 before `_softmax`; CUDA reads
/// fp16 inside the kernel) and softmax's fp32 output: 10 bytes per score. The rest is one
/// layer's per-token tensors and the cuBLAS workspace.
#[test]
fn eager_prefill_peak_is_ten_bytes_per_score_over_weights_and_cache() {
    let (b, t, heads) = (1u64, 4096u64, 32u64);
    let eager = |weights: Dtype| InferSetup {
        attention: Attention::Eager,
        ..InferSetup::new(weights, weights, b, t)
    };
    let d = run("llama2-7b", &eager(Dtype::Bf16));
    let scores = b * heads * t * t;
    let floor = d.weights_bytes + d.kv_cache_bytes + b * t * t * 2 + 10 * scores;
    assert!(d.prefill_peak_bytes >= floor, "{d:?}");
    let per_token = 8 * b * t * 4096 * 2;
    assert!(
        d.prefill_peak_bytes - floor <= d.workspace_bytes + per_token,
        "{} over the derived floor",
        d.prefill_peak_bytes - floor
    );
    let h = run("llama2-7b", &eager(Dtype::F16));
    assert_eq!(d.prefill_peak_bytes - h.prefill_peak_bytes, 4 * scores);
}
