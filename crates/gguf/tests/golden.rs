//! Dequantization against the `gguf` Python package (llama.cpp's gguf-py) on random blocks of
//! every type the reader takes, bit for bit (`dev/golden_gguf.py` wrote the golden file).

use gguf::quant::{dequantize, grouped, TensorType};

fn kind(name: &str) -> TensorType {
    match name {
        "F16" => TensorType::F16,
        "BF16" => TensorType::BF16,
        "Q4_0" => TensorType::Q4_0,
        "Q4_1" => TensorType::Q4_1,
        "Q5_0" => TensorType::Q5_0,
        "Q5_1" => TensorType::Q5_1,
        "Q8_0" => TensorType::Q8_0,
        "Q4_K" => TensorType::Q4K,
        "Q5_K" => TensorType::Q5K,
        "Q6_K" => TensorType::Q6K,
        other => panic!("golden type {other}"),
    }
}

#[test]
fn every_type_dequantizes_bit_for_bit_as_ggml_does() {
    let text = include_str!("data/golden.json");
    let cases: serde_json::Value = serde_json::from_str(text).unwrap();
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 10, "one case per type");
    for case in cases {
        let name = case["type"].as_str().unwrap();
        let hex = case["bytes"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let want: Vec<u32> = case["f32_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let mut got = vec![0.0f32; want.len()];
        dequantize(kind(name), &bytes, &mut got).unwrap();
        let differ = got.iter().zip(&want).position(|(g, w)| g.to_bits() != *w);
        assert_eq!(differ, None, "{name}: value {differ:?} differs");
        // Repacked as int8 codes in groups (the `ggml` weight format): scale · code + min is
        // the same float, in groups of the type's own size and, where that is 32, of 16.
        let Some(own) = kind(name).scale_group() else {
            continue;
        };
        for group in [own, 16] {
            let g = grouped(kind(name), &bytes, want.len(), group).unwrap();
            for (i, w) in want.iter().enumerate() {
                let v = g.scales[i / group] * f32::from(g.codes[i]);
                let v = if kind(name).has_min() {
                    v + g.mins[i / group]
                } else {
                    v
                };
                assert_eq!(v.to_bits(), *w, "{name} in groups of {group}: value {i}");
            }
        }
        if own == 16 {
            assert!(grouped(kind(name), &bytes, want.len(), 32).is_err());
        }
    }
}
