//! Whole files: a small GGUF written here is read back (metadata of every kind, tensors, the
//! data's alignment), and every kind of bad file is a clear error naming what is wrong.

use gguf::{Gguf, GgufError, TensorType, Value};
use std::path::PathBuf;

/// A GGUF v3 file: `kv` metadata (already encoded), one Q8_0 tensor of 2 × 32 values, one F32
/// tensor of 4.
fn file(kv: &[(&str, u32, Vec<u8>)], alignment: usize) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(2u64.to_le_bytes());
    out.extend((kv.len() as u64).to_le_bytes());
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    for (key, kind, value) in kv {
        string(&mut out, key);
        out.extend(kind.to_le_bytes());
        out.extend(value);
    }
    let tensor = |out: &mut Vec<u8>, name: &str, dims: &[u64], code: u32, offset: u64| {
        string(out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(code.to_le_bytes());
        out.extend(offset.to_le_bytes());
    };
    tensor(&mut out, "q", &[32, 2], 8, 0);
    tensor(&mut out, "f", &[4], 0, 96);
    while out.len() % alignment != 0 {
        out.push(0);
    }
    for row in 0..2u8 {
        out.extend(half::f16::from_f32(0.25).to_le_bytes());
        out.extend((0..32).map(|i| (i as i8 - 16 + row as i8) as u8));
    }
    out.resize(out.len() + (96 - 68), 0);
    for v in [1.0f32, -2.0, 3.5, 0.0] {
        out.extend(v.to_le_bytes());
    }
    out
}

fn string_value(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend(s.as_bytes());
    v
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("frugal-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn good() -> Vec<u8> {
    let mut tokens = 4u32.to_le_bytes().to_vec(); // an array of u32s
    tokens.extend(3u64.to_le_bytes());
    for t in [7u32, 8, 9] {
        tokens.extend(t.to_le_bytes());
    }
    file(
        &[
            ("general.architecture", 8, string_value("llama")),
            ("llama.block_count", 4, 30u32.to_le_bytes().to_vec()),
            ("llama.rope.freq_base", 6, 100000f32.to_le_bytes().to_vec()),
            ("tokenizer.ggml.add_bos_token", 7, vec![0]),
            ("ids", 9, tokens),
            ("general.alignment", 4, 64u32.to_le_bytes().to_vec()),
        ],
        64,
    )
}

#[test]
fn a_file_is_read_back_whole() {
    let path = write("good.gguf", &good());
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.u64("llama.block_count").unwrap(), 30);
    assert_eq!(g.f64("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(
        g.metadata["tokenizer.ggml.add_bos_token"],
        Value::Bool(false)
    );
    let ids = g.metadata["ids"].as_array().unwrap();
    assert_eq!(
        ids.iter().map(|v| v.as_u64().unwrap()).collect::<Vec<_>>(),
        [7, 8, 9]
    );
    let q = g.tensor("q").unwrap();
    assert_eq!((q.kind, q.rows(), q.bytes()), (TensorType::Q8_0, 2, 68));
    let values = g.dequantize(q).unwrap();
    assert_eq!((values[0], values[31], values[32]), (-4.0, 3.75, -3.75));
    assert_eq!(
        g.dequantize(g.tensor("f").unwrap()).unwrap(),
        [1.0, -2.0, 3.5, 0.0]
    );
    let missing = g.tensor("output.weight").unwrap_err().to_string();
    assert!(
        missing.contains("output.weight") && missing.contains("missing"),
        "{missing}"
    );
}

#[test]
fn bad_files_are_clear_errors() {
    let good = good();
    let err = |name: &str, bytes: &[u8]| -> String {
        let path = write(name, bytes);
        let e: GgufError = Gguf::open(&path).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(name), "{text} names the file");
        text
    };
    let mut magic = good.clone();
    magic[..4].copy_from_slice(b"GGML");
    assert!(err("magic.gguf", &magic).contains("not a GGUF file"));
    let mut version = good.clone();
    version[4] = 9;
    assert!(err("version.gguf", &version).contains("version 9"));
    for cut in [3, 20, 100, good.len() - 20] {
        let text = err(&format!("cut{cut}.gguf"), &good[..cut]);
        assert!(
            text.contains("truncated")
                || text.contains("past the end")
                || text.contains("not a GGUF"),
            "cut at {cut}: {text}"
        );
    }
    // The Q8_0 tensor's type code (8) becomes Q2_K's (10).
    let mut kind = good.clone();
    let mut name = 1u64.to_le_bytes().to_vec();
    name.push(b'q');
    let at = good.windows(9).position(|w| w == name).unwrap() + 9 + 4 + 16;
    assert_eq!(good[at], 8);
    kind[at] = 10;
    assert!(err("kind.gguf", &kind).contains("Q2_K"));
    // An array count of 2^60 elements is refused before anything is allocated.
    let mut count = good.clone();
    let mut header = 4u32.to_le_bytes().to_vec();
    header.extend(3u64.to_le_bytes());
    let at = good.windows(12).position(|w| w == header).unwrap() + 4;
    count[at + 7] = 0x10;
    assert!(err("count.gguf", &count).contains("array"));
}

/// Fuzzing: 4,000 seeded mutations of a good file (flipped, inserted, deleted, duplicated and
/// truncated bytes, counts and lengths set to extremes) are opened and every tensor they list
/// dequantized: each is a file or a clear error, never a panic or an allocation the file's size
/// does not bound.
#[test]
fn mutated_files_open_or_fail_clearly() {
    let good = good();
    let mut m = rng::mutate::Mutator::new(0x6775_6675);
    let path = write("fuzz.gguf", &good);
    let (mut opened, mut refused) = (0, 0);
    for _ in 0..4000 {
        let bad = m.mutate(&good);
        std::fs::write(&path, &bad).unwrap();
        match Gguf::open(&path) {
            Ok(g) => {
                opened += 1;
                for t in &g.tensors {
                    let _ = g.dequantize(t);
                }
            }
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    assert_eq!(opened + refused, 4000);
    assert!(refused > 1000, "{refused} of 4000 refused");
}
