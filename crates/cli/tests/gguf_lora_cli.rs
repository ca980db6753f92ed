//! LoRA over a GGUF file kept in its own quantized blocks (`--lora-base ggml`): SmolLM2's Q4_1
//! matrices as codes two a byte with their scales and minima, dequantized tile by tile into the
//! GEMMs that read them.

mod common;

use common::{fails_with, frugal, json, smollm2};
use std::path::Path;

/// SmolLM2's 30 layers' block matrices: 106,168,320 weights, 4 bytes each in fp32, 0.75 (codes
/// two a byte, an fp32 scale and minimum per 32) in the file's blocks.
const MATRIX_WEIGHTS: u64 = 106_168_320;

/// Rank-4 adapters on every linear layer over the file's own blocks.
const LORA_OVER_GGML: [&str; 6] = [
    "--lora-rank",
    "4",
    "--lora-targets",
    "all-linear",
    "--lora-base",
    "ggml",
];

fn train(gguf: &str, base: &str, out: &Path) -> serde_json::Value {
    let mut args = common::short_run("2");
    args.extend(["--model", gguf, "--lora-rank", "4", "--lora-base", base]);
    args.extend(["--batch", "1", "--seq", "32", "--merge"]);
    args.extend(["--out", out.to_str().unwrap(), "--json"]);
    json(&frugal(&args))
}

#[test]
fn the_files_blocks_train_as_their_fp32_values_in_a_fifth_of_the_bytes() {
    let model = smollm2();
    let gguf = model.to_str().unwrap();
    let dir = common::temp_dir("gguf-lora-cli", "blocks");
    let (in_blocks, in_fp32) = (dir.join("ggml"), dir.join("fp32"));
    let (g, f) = (
        train(gguf, "ggml", &in_blocks),
        train(gguf, "fp32", &in_fp32),
    );
    // The blocks dequantize to the file's values exactly: the same run, to the bit.
    for key in ["loss_first", "loss_last", "val_loss"] {
        assert_eq!(g[key], f[key], "{key}");
    }
    let (gr, fr) = (&g["ranks"][0], &f["ranks"][0]);
    assert_eq!(gr["planned"], gr["measured"], "planned == measured");
    assert_eq!(fr["planned"], fr["measured"], "planned == measured");
    let params = |r: &serde_json::Value| r["measured"]["params_bytes"].as_u64().unwrap();
    assert_eq!(params(fr) - params(gr), MATRIX_WEIGHTS * 13 / 4);
    // The merged models (base as stored + B·A) are the same bytes.
    let merged = |d: &Path| std::fs::read(d.join("merged/model.safetensors")).unwrap();
    assert!(
        merged(&in_blocks) == merged(&in_fp32),
        "merged models differ"
    );
    // `plan` counts the run's bytes before it starts.
    let mut args = common::PLAN_FRUGAL_FP32.to_vec();
    args.extend(["--model", gguf]);
    args.extend(LORA_OVER_GGML);
    args.extend(["--batch", "1", "--seq", "32", "--json"]);
    let plan = json(&frugal(&args));
    for key in ["params_bytes", "peak_bytes"] {
        assert_eq!(plan["per_device"][key], gr["planned"][key], "{key}");
    }
}

#[test]
fn a_ggml_base_needs_a_quantized_gguf_file() {
    fails_with(
        &frugal(&[
            "train",
            "--model",
            "gpt2-mini",
            "--lora-rank",
            "4",
            "--lora-base",
            "ggml",
            "--steps",
            "1",
        ]),
        "a ggml base keeps a GGUF file's own quantized blocks: give a .gguf file as --model",
    );
    fails_with(
        &frugal(
            &[
                &[
                    "plan",
                    "--model",
                    "llama-tiny",
                    "--train",
                    "--runtime",
                    "frugal",
                ][..],
                &LORA_OVER_GGML,
            ]
            .concat(),
        ),
        "ggml keeps a GGUF file's own blocks: give a quantized .gguf file as the model",
    );
    fails_with(
        &frugal(&[
            "bench",
            "train",
            "--model",
            "llama-tiny",
            "--lora-rank",
            "4",
            "--lora-base",
            "ggml",
        ]),
        "--lora-base ggml: bench train runs random weights",
    );
}
