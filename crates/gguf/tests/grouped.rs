//! A `llama` file's quantized q/k projections as the engine's `ggml` weight format takes them:
//! int8 codes with a scale and minimum per group, in Hugging Face's row order. A Q4_K query and
//! a Q6_K key (the mix a Q4_K_M file holds) in groups of 16 give back, as `scale · code + min`,
//! the very floats `tensor` dequantizes, bit for bit (a zero's sign aside).

use gguf::hf::Model;
use gguf::Gguf;
use half::f16;

/// Deterministic bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

/// `rows` Q4_K rows of 256 values: random codes and 6-bit scales, small finite `d` and `dmin`.
fn q4_k(rows: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for r in 0..rows {
        out.extend(f16::from_f32(0.01 + 0.001 * r as f32).to_le_bytes());
        out.extend(f16::from_f32(0.002).to_le_bytes());
        out.extend(bytes(140, r as u64 + 1));
    }
    out
}

/// `rows` Q6_K rows of 256 values: random codes and int8 scales, then a small `d`.
fn q6_k(rows: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for r in 0..rows {
        out.extend(bytes(208, r as u64 + 100));
        out.extend(f16::from_f32(0.003).to_le_bytes());
    }
    out
}

fn file() -> Vec<u8> {
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(2u64.to_le_bytes()); // tensors
    out.extend(3u64.to_le_bytes()); // metadata
    string(&mut out, "general.architecture");
    out.extend(8u32.to_le_bytes());
    string(&mut out, "llama");
    for (key, v) in [
        ("llama.attention.head_count", 2u32),
        ("llama.attention.head_count_kv", 1),
    ] {
        string(&mut out, key);
        out.extend(4u32.to_le_bytes());
        out.extend(v.to_le_bytes());
    }
    // Query: 2 heads of 4 rows; key: 1 head of 4 rows; rows of 256 values.
    let q = q4_k(8);
    for (name, rows, code, offset) in [("blk.0.attn_q.weight", 8u64, 12u32, 0u64)]
        .into_iter()
        .chain([("blk.0.attn_k.weight", 4, 14, q.len() as u64)])
    {
        string(&mut out, name);
        out.extend(2u32.to_le_bytes());
        out.extend(256u64.to_le_bytes());
        out.extend(rows.to_le_bytes());
        out.extend(code.to_le_bytes());
        out.extend(offset.to_le_bytes());
    }
    while out.len() % 32 != 0 {
        out.push(0);
    }
    out.extend(&q);
    out.extend(q6_k(4));
    out
}

#[test]
fn a_q4_k_m_mix_repacks_to_ggmls_values_in_hf_row_order() {
    let dir = std::env::temp_dir().join(format!("frugal-gguf-grouped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mix.gguf");
    std::fs::write(&path, file()).unwrap();
    let g = Gguf::open(&path).unwrap();
    let model = Model::new(&g).unwrap();
    // Q6_K's scales cover 16 values: the whole file runs in groups of 16.
    assert_eq!(model.group(), 16);
    for hf in [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
    ] {
        let (_, want) = model.tensor(hf).unwrap();
        let got = model.tensor_grouped(hf, 16).unwrap().unwrap();
        assert_eq!(got.codes.len(), want.len());
        for (i, w) in want.iter().enumerate() {
            let v = got.scales[i / 16] * f32::from(got.codes[i]) + got.mins[i / 16];
            // Bit for bit, but for the sign of a zero: Q6_K's zero minimum turns −0 into +0.
            assert!(
                v == *w && (v == 0.0 || v.to_bits() == w.to_bits()),
                "{hf}: value {i}"
            );
        }
    }
    // Q6_K in groups of 32 would need two scales a group: refused, naming the tensor.
    let err = model
        .tensor_grouped("model.layers.0.self_attn.k_proj.weight", 32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("attn_k") && err.contains("Q6_K"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
