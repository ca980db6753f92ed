//! The serving plan's bytes against hand counts and the formula profile's KV arithmetic.

use super::*;
use plan::presets;
use plan::setup::Dtype;

fn llama7b() -> ModelShape {
    presets::by_name("llama2-7b").unwrap()
}

#[test]
fn weights_take_their_format_and_vectors_stay_fp32() {
    let m = llama7b();
    let f32_bytes = weight_bytes(&m, WeightFormat::F32).unwrap();
    assert_eq!(f32_bytes, 4 * m.param_count());
    let int4 = weight_bytes(
        &m,
        WeightFormat::Int4 {
            group: 32,
            asym: false,
        },
    )
    .unwrap();
    // Vectors: 2 norms per layer and the final norm, C each.
    let vectors = (2 * u64::from(m.n_layers) + 1) * m.d_model;
    let matrices = m.param_count() - vectors;
    assert_eq!(int4, matrices / 2 + 2 * matrices / 32 + 4 * vectors);
    let asym = weight_bytes(
        &m,
        WeightFormat::Int4 {
            group: 32,
            asym: true,
        },
    )
    .unwrap();
    assert_eq!(asym - int4, matrices / 32, "one zero-point byte per group");
}

#[test]
fn kv_per_token_matches_the_formula_profile() {
    let m = llama7b();
    for (kv, dtype) in [(KvFormat::Bf16, Dtype::Bf16), (KvFormat::F32, Dtype::F32)] {
        let s = ServeSetup::generation(&m, 1, 4096, WeightFormat::Bf16, kv, 16, 1);
        let per_token = s.block_bytes(&m) / s.kv_block;
        let formula = plan::infer::kv_bytes_per_token_layer(&m, dtype, 1) * u64::from(m.n_layers);
        assert_eq!(per_token, formula, "{kv:?}");
    }
    let s = ServeSetup::generation(&m, 1, 4096, WeightFormat::Bf16, KvFormat::Int8, 16, 1);
    // int8: one byte per element plus an fp32 scale per token and head.
    assert_eq!(s.block_bytes(&m) / 16, 2 * 32 * 32 * (128 + 4));
}

#[test]
fn the_plan_peaks_at_weights_plus_pool_plus_the_larger_step() {
    let m = presets::by_name("gpt2-124m").unwrap();
    let s = ServeSetup {
        max_seqs: 8,
        split_k: 4,
        ..ServeSetup::generation(&m, 8, 512, WeightFormat::Int8, KvFormat::Fp8, 16, 4)
    };
    let plan = serve_plan(&m, &s).unwrap();
    let peaks = plan.category_peaks(Device::Gpu);
    assert_eq!(
        peaks[Category::Params as usize],
        weight_bytes(&m, WeightFormat::Int8).unwrap()
    );
    assert_eq!(
        peaks[Category::KvCache as usize],
        s.kv_blocks * s.block_bytes(&m)
    );
    assert_eq!(s.kv_blocks, 8 * 32);
    let timeline = plan.timeline(Device::Gpu);
    let (prefill, decode) = (timeline[0].1, timeline[1].1);
    // The prefill step (256 rows) outweighs a decode step of 8 rows.
    assert!(prefill[Category::Activations as usize] > decode[Category::Activations as usize]);
    assert_eq!(
        prefill[Category::Other as usize],
        0,
        "no split-K partials in a prefill"
    );
    assert_eq!(
        decode[Category::Other as usize],
        4 * 8 * 12 * 4 * (64 + 2),
        "rows × KV heads × splits × group × (HD + 2) floats"
    );
    // The two steps share their bytes: the slab is the peak plus alignment padding.
    let slab = crate::assign_offsets(&plan, Device::Gpu).slab_bytes;
    let peak = plan.peak_bytes(Device::Gpu);
    let padding = crate::layout::ALIGN_BYTES * plan.buffers.len() as u64;
    assert!(
        slab >= peak && slab < peak + padding,
        "slab {slab}, peak {peak}"
    );
}

#[test]
fn impossible_setups_name_their_field() {
    let m = presets::by_name("gpt2-124m").unwrap();
    let base = ServeSetup::generation(&m, 1, 64, WeightFormat::F32, KvFormat::F32, 16, 1);
    let long = ServeSetup {
        context: 5000,
        ..base
    };
    let e = serve_plan(&m, &long).unwrap_err().to_string();
    assert!(e.contains("context") && e.contains("1024"), "{e}");
    assert!(WeightFormat::parse("int3", None)
        .unwrap_err()
        .to_string()
        .contains("int4"));
    assert!(WeightFormat::parse("int4", Some(48)).is_err());
    assert!(KvFormat::parse("int2")
        .unwrap_err()
        .to_string()
        .contains("fp8"));
    let zero = ServeSetup {
        kv_blocks: 0,
        ..base
    };
    assert!(serve_plan(&m, &zero)
        .unwrap_err()
        .to_string()
        .contains("kv-blocks"));
    // GPT-2's MLP down projection has 3072 columns: 128 divides it, but a 768-wide model with
    // groups of 128 would too; a custom width that 128 does not divide is refused.
    let mut odd = m.clone();
    odd.d_model = 96;
    odd.n_heads = 3;
    odd.n_kv_heads = 3;
    odd.d_head = 32;
    odd.d_ff = 384;
    let q = ServeSetup {
        weights: WeightFormat::Int4 {
            group: 64,
            asym: false,
        },
        ..base
    };
    let e = serve_plan(&odd, &q).unwrap_err().to_string();
    assert!(e.contains("weight-group") && e.contains("96"), "{e}");
}

#[test]
fn latent_attention_caches_one_latent_row_per_token_and_refuses_what_it_cannot_hold() {
    let m = presets::by_name("deepseek-v2-lite").unwrap();
    let s = ServeSetup::generation(&m, 1, 4096, WeightFormat::Bf16, KvFormat::Bf16, 16, 1);
    // 27 layers × (512 latent + 64 RoPE key) bf16 values per token: no values, no heads.
    assert_eq!(s.block_bytes(&m) / 16, 27 * 576 * 2);
    let plan = serve_plan(&m, &s).unwrap();
    let kv = plan.category_peaks(Device::Gpu)[Category::KvCache as usize];
    assert_eq!(kv, s.kv_blocks * s.block_bytes(&m));
    let int8 = ServeSetup::generation(&m, 1, 4096, WeightFormat::Bf16, KvFormat::Int8, 16, 1);
    let err = serve_plan(&m, &int8).unwrap_err().to_string();
    assert!(err.contains("kv-dtype"), "{err}");
    let mut wide = m.clone();
    wide.mla.as_mut().unwrap().kv_lora_rank = 2048;
    let err = serve_plan(&wide, &s).unwrap_err().to_string();
    assert!(
        err.contains("kv_lora_rank") && err.contains("1024"),
        "{err}"
    );
}

#[test]
fn tensor_parallel_ggml_ranks_hold_whole_blocks_of_32() {
    // A Q6_K file runs in groups of 16, but its codes are still cut in blocks of 32: an MLP of
    // 96 leaves each of 2 ranks 48 columns of the down projection, refused by name.
    let mut m = presets::by_name("gpt2-124m").unwrap();
    (m.d_model, m.n_heads, m.n_kv_heads, m.d_head, m.d_ff) = (128, 4, 4, 32, 96);
    let ggml = WeightFormat::Ggml {
        group: 16,
        nibbles: Roles::NONE,
    };
    let s = ServeSetup::generation(&m, 1, 64, ggml, KvFormat::F32, 16, 1);
    assert!(serve_plan(&m, &s).is_ok());
    let e = serve_plan_rank(&m, &s, 2, 0).unwrap_err().to_string();
    assert!(e.contains("--tp") && e.contains("blocks of 32"), "{e}");
}
