//! The planner against published references, each under the convention it follows: DeepSpeed's
//! own estimator formulas (`estimate_zero2/3_model_states_mem_needs`, re-derived here from their
//! documented arithmetic), the ZeRO paper's Table 1, and the vLLM / HF KV-cache formula with
//! sliding windows. Where DeepSpeed's estimator and what DeepSpeed allocates differ, the test
//! pins the difference and says why.

use plan::setup::*;
use plan::{formula, presets, Category, Device, Estimate};
use plan_pytorch as pytorch;

const GB: f64 = 1e9;

/// DeepSpeed's ZeRO-2 estimator: (gpu bytes) for `params` on `gpus` GPUs.
fn ds_zero2_gpu(params: u64, gpus: u64, offload: bool) -> u64 {
    if offload {
        2 * params
    } else {
        4 * params + 16 * params / gpus
    }
}

/// DeepSpeed's ZeRO-3 estimator's GPU bytes, without its `4 × largest_layer` term.
fn ds_zero3_gpu_states(params: u64, gpus: u64, offload_opt: bool, offload_params: bool) -> u64 {
    match (offload_opt, offload_params) {
        (true, true) => 0,
        (true, false) => 2 * params / gpus,
        _ => 18 * params / gpus,
    }
}

fn states(n: u64, zero: ZeroStage, dp: u32, offload: Offload, convention: Convention) -> Estimate {
    let s = TrainSetup {
        zero,
        dp,
        offload,
        convention,
        ..TrainSetup::new(1, 2048)
    };
    formula::model_states_estimate(n, &s).unwrap()
}

/// Parameters, gradients and optimizer state on the device at the peak.
fn model_states_at_peak(e: &Estimate) -> u64 {
    let (_, c) = e.at_peak();
    c[Category::Params as usize] + c[Category::Grads as usize] + c[Category::Optimizer as usize]
}

fn within(a: u64, b: u64, rel: f64) -> bool {
    (a as f64 - b as f64).abs() <= rel * b as f64
}

const SIZES: [(&str, u64); 3] = [
    ("llama2-7b", 6_738_415_616),
    ("llama2-13b", 13_015_864_320),
    ("llama2-70b", 68_976_648_192),
];

#[test]
fn deepspeed_offload_cases_match_its_estimator() {
    for (_, n) in SIZES {
        for gpus in [1u32, 8, 64] {
            let g = gpus as u64;
            let z2 = states(
                n,
                ZeroStage::Zero2,
                gpus,
                Offload::Optimizer,
                Convention::Deepspeed,
            );
            assert_eq!(z2.peak_bytes, ds_zero2_gpu(n, g, true), "{n} on {gpus}");
            let z3 = states(
                n,
                ZeroStage::Zero3,
                gpus,
                Offload::Optimizer,
                Convention::Deepspeed,
            );
            assert!(
                within(z3.peak_bytes, ds_zero3_gpu_states(n, g, true, false), 1e-6),
                "{n} on {gpus}: {}",
                z3.peak_bytes
            );
            let z3p = states(
                n,
                ZeroStage::Zero3,
                gpus,
                Offload::Params,
                Convention::Deepspeed,
            );
            assert_eq!(z3p.peak_bytes, ds_zero3_gpu_states(n, g, true, true));
        }
    }
}

#[test]
fn llama2_7b_zero2_with_optimizer_offload_on_one_gpu_is_2_bytes_per_parameter_everywhere() {
    let m = presets::by_name("llama2-7b").unwrap();
    let n = m.param_count();
    let ds = ds_zero2_gpu(n, 1, true);
    let s = TrainSetup {
        zero: ZeroStage::Zero2,
        offload: Offload::Optimizer,
        ..TrainSetup::new(1, 512)
    };
    let f = formula::training_estimate(&m, &s).unwrap();
    let p = pytorch::training_estimate(&m, &s).unwrap();
    for (runtime, e) in [("formula", &f), ("pytorch", &p)] {
        let got = model_states_at_peak(e);
        assert!(within(got, ds, 0.02), "{runtime}: {got} vs DeepSpeed {ds}");
    }
    // The host holds master weights, both moments and the fp32 gradient partition: 16 bytes.
    assert_eq!(f.host_peak_bytes, 16 * n);
}

#[test]
fn pytorch_zero3_optimizer_offload_matches_deepspeeds_estimator() {
    // gpu = 4 × largest_layer + 2Ψ/N: the 16-bit partition, and the largest module (the
    // embedding table) gathered with its gradient, on 1, 8 and 64 GPUs.
    let m = presets::by_name("llama2-7b").unwrap();
    let (n, ll) = (m.param_count(), m.largest_module().1);
    for gpus in [1u32, 8, 64] {
        let s = TrainSetup {
            zero: ZeroStage::Zero3,
            dp: gpus,
            offload: Offload::Optimizer,
            ..TrainSetup::new(1, 512)
        };
        let e = pytorch::training_estimate(&m, &s).unwrap();
        let ds = 4 * ll + 2 * n / gpus as u64;
        let got = model_states_at_peak(&e);
        assert!(
            within(got, ds, 0.02),
            "{gpus} GPUs: {got} vs DeepSpeed {ds}"
        );
    }
}

#[test]
fn deepspeed_estimator_without_offload_differs_by_what_it_counts_live() {
    for (_, n) in SIZES {
        for gpus in [1u32, 8, 64] {
            let g = gpus as u64;
            let shard = n.div_ceil(g);
            // ZeRO-2: the estimator keeps every 16-bit gradient (4Ψ); DeepSpeed reduces each
            // into the rank's partition as backward leaves it (2Ψ + 2Ψ/N). The fp32 step copy
            // is in both (its 16Ψ/N = 12 + 4).
            let z2 = states(
                n,
                ZeroStage::Zero2,
                gpus,
                Offload::None,
                Convention::Deepspeed,
            );
            assert_eq!(z2.peak_bytes, 2 * n + 2 * shard + 16 * shard);
            let ds = ds_zero2_gpu(n, g, false) as i128;
            let gap = ds - z2.peak_bytes as i128;
            assert!(
                (gap - (2 * n as i128 - 2 * shard as i128)).abs() <= 64,
                "{n} {gpus}"
            );
            if gpus == 1 {
                assert!(within(z2.peak_bytes, ds as u64, 1e-9));
            }
            // ZeRO-3: 2 + 2 + 12 bytes per parameter of the partition, plus the fp32 copy of one
            // 10^9-element sub-group at the step; the estimator says 18 for all of it.
            let z3 = states(
                n,
                ZeroStage::Zero3,
                gpus,
                Offload::None,
                Convention::Deepspeed,
            );
            let sub = shard.min(plan::setup::ZeroBuffers::DEEPSPEED.sub_group);
            assert_eq!(z3.peak_bytes, 16 * shard + 4 * sub);
        }
    }
}

/// Table 1 of Rajbhandari et al. 2020: per-device GB for Ψ = 7.5B / 128B / 1T, K = 12, by DP
/// degree: P_os, P_os+g, P_os+g+p.
const ZERO_TABLE_1: [(u32, [[f64; 3]; 3]); 6] = [
    (
        1,
        [
            [120., 120., 120.],
            [2048., 2048., 2048.],
            [16000., 16000., 16000.],
        ],
    ),
    (
        4,
        [[52.5, 41.3, 30.], [896., 704., 512.], [7000., 5500., 4000.]],
    ),
    (
        16,
        [[35.6, 21.6, 7.5], [608., 368., 128.], [4750., 2875., 1000.]],
    ),
    (
        64,
        [
            [31.4, 16.6, 1.88],
            [536., 284., 32.],
            [4187.5, 2218.75, 250.],
        ],
    ),
    (
        256,
        [
            [30.4, 15.4, 0.47],
            [518., 263., 8.],
            [4046.88, 2054.69, 62.5],
        ],
    ),
    (
        1024,
        [
            [30.1, 15.1, 0.12],
            [513., 257., 2.],
            [4011.72, 2013.67, 15.63],
        ],
    ),
];

#[test]
fn every_row_of_the_zero_papers_table_1() {
    let models = [7_500_000_000u64, 128_000_000_000, 1_000_000_000_000];
    for (dp, rows) in ZERO_TABLE_1 {
        for (n, row) in models.iter().zip(rows) {
            for (stage, want) in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3]
                .into_iter()
                .zip(row)
            {
                let got = states(*n, stage, dp, Offload::None, Convention::Paper).peak_bytes;
                let got_gb = got as f64 / GB;
                // The table rounds to its printed digits (at most 3 significant figures).
                let tol = (want * 0.005).max(0.005);
                assert!(
                    (got_gb - want).abs() <= tol,
                    "Ψ={n} N={dp} {stage:?}: {got_gb} vs {want}"
                );
            }
        }
    }
}

#[test]
fn vllm_kv_formula_and_sliding_windows() {
    // 2 × layers × KV heads × head_dim × bytes per token, contiguous or in blocks of 16.
    let kv = |model: &str, seq: u64, block: Option<u64>| {
        let m = presets::by_name(model).unwrap();
        let s = InferSetup {
            kv_block: block,
            ..InferSetup::new(Dtype::Bf16, Dtype::Bf16, 1, seq)
        };
        plan::infer::inference_estimate(&m, &s)
            .unwrap()
            .kv_cache_bytes
    };
    assert_eq!(kv("llama2-7b", 4096, None), 2 * 32 * 32 * 128 * 2 * 4096);
    assert_eq!(
        kv("llama3.1-8b", 1000, Some(16)),
        2 * 32 * 8 * 128 * 2 * 1008
    );
    // Mistral-7B-v0.1 keeps only its 4096-token window: 0.5 GiB at 32k, not 4 GiB.
    assert_eq!(kv("mistral-7b", 32768, None), 512 << 20);
    assert_eq!(kv("mistral-7b", 2048, None), 256 << 20);
}

#[test]
fn sliding_window_comes_from_config_json() {
    let mistral = r#"{"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336,
        "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096}"#;
    let m = plan::hf_config::parse(mistral, "mistral").unwrap();
    assert_eq!(m.kv_tokens(0, 32768), 4096);
    let v3 = mistral.replace("4096}", "null}");
    let m = plan::hf_config::parse(&v3, "mistral-v0.3").unwrap();
    assert_eq!(m.kv_tokens(0, 32768), 32768);
    // Qwen2 uses its window only with use_sliding_window, from max_window_layers on.
    let qwen = r#"{"model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14,
        "num_key_value_heads": 2, "num_hidden_layers": 24, "intermediate_size": 4864,
        "vocab_size": 151936, "max_position_embeddings": 32768, "sliding_window": 4096,
        "max_window_layers": 21, "use_sliding_window": false}"#;
    let m = plan::hf_config::parse(qwen, "qwen").unwrap();
    assert_eq!(m.kv_tokens_all_layers(32768), 24 * 32768);
    let on = qwen.replace(
        "\"use_sliding_window\": false",
        "\"use_sliding_window\": true",
    );
    let m = plan::hf_config::parse(&on, "qwen-swa").unwrap();
    assert_eq!(m.kv_tokens_all_layers(32768), 21 * 32768 + 3 * 4096);
    let zero = mistral.replace("\"sliding_window\": 4096", "\"sliding_window\": 0");
    let err = plan::hf_config::parse(&zero, "bad")
        .unwrap_err()
        .to_string();
    assert!(err.contains("sliding_window"), "{err}");
}

#[test]
fn zero3_never_holds_the_whole_model_on_one_gpu() {
    // HF builds ZeRO-3 models under zero.Init: 70B on 8 GPUs holds an eighth of the 16-bit
    // weights (plus the gathered block), never all 138 GB.
    let m = presets::by_name("llama2-70b").unwrap();
    let s = TrainSetup {
        zero: ZeroStage::Zero3,
        dp: 8,
        ..TrainSetup::new(1, 512)
    };
    let e = pytorch::training_estimate(&m, &s).unwrap();
    let (_, c) = e.plan.at_peak(Device::Gpu);
    let params = c[Category::Params as usize];
    let shard = 2 * m.param_count() / 8;
    assert!(
        params < shard + (4 << 30),
        "params {params} vs shard {shard}"
    );
    // DeepSpeed's estimator for the model states: 18Ψ/N + 4 × the largest layer (156 GB); the
    // replay adds activations and the buckets, and is no longer 2Ψ (138 GB) above it.
    let ds = 18 * m.param_count() / 8;
    assert!(within(e.peak_bytes, ds, 0.05), "{} vs {ds}", e.peak_bytes);
}

#[test]
fn largest_module_and_unit_as_deepspeed_and_accelerate_define_them() {
    let m = presets::by_name("llama2-7b").unwrap();
    // DeepSpeed's largest_layer_params: a module's own parameters; the 32000 × 4096 tables.
    assert_eq!(m.largest_module(), ("embed_tokens", 32000 * 4096));
    // accelerate's largest layer: a no-split module, one LlamaDecoderLayer:
    // 4 × 4096² + 3 × 4096 × 11008 + 2 × 4096 norm weights.
    assert_eq!(m.largest_unit(), ("block", 202_383_360));
    // accelerate's sizes: total × bytes per dtype, Adam training = 4 × the fp32 total.
    let n = m.param_count();
    let total_fp32 = 4 * n;
    assert_eq!(plan::infer::weights_only_bytes(n, Dtype::F32), total_fp32);
    assert_eq!(
        plan::infer::weights_only_bytes(n, Dtype::Bf16),
        total_fp32 / 2
    );
    assert_eq!(
        plan::infer::weights_only_bytes(n, Dtype::Int8),
        total_fp32 / 4
    );
    assert_eq!(
        plan::infer::weights_only_bytes(n, Dtype::Int4),
        total_fp32 / 8
    );
    let s = TrainSetup {
        precision: Precision::Fp32,
        convention: Convention::Paper,
        ..TrainSetup::new(1, 2048)
    };
    let adam = formula::model_states_estimate(n, &s).unwrap().peak_bytes;
    assert_eq!(adam, 4 * total_fp32);
    // Mixtral: one expert's matrix, not the stacked eight.
    let mx = presets::by_name("mixtral-8x7b").unwrap();
    assert_eq!(mx.largest_module().1, 32000 * 4096);
    let expert = 4096 * 14336;
    assert!(mx.largest_unit().1 > 8 * 3 * expert);
}
