//! The advisors read a GGUF file's own tensor types: `fit --infer` weighs the file's `ggml`
//! format first, at exactly the bytes its tensors take in their types, and the `plan` command it
//! prints plans the same total; `plan --infer` of the file plans those bytes by default.

mod common;

use common::{frugal, json, smollm2};

#[test]
fn fit_weighs_the_files_own_tensors_and_its_plan_command_agrees() {
    let model = smollm2();
    let file = gguf::Gguf::open(&model).unwrap();
    let tensor_bytes: u64 = file.tensors.iter().map(|t| t.bytes()).sum();
    let path = model.to_str().unwrap();
    let fit = |extra: &[&str]| {
        let base = ["fit", "--infer", "--model", path, "--device-memory", "1GiB"];
        json(&frugal(&[&base[..], extra, &["--json"]].concat()))
    };
    let v = fit(&[]);
    let best = &v["best"][0];
    assert_eq!(best["serving"]["weights"], "ggml", "{best}");
    assert_eq!(best["weights_bytes"], tensor_bytes, "{best}");
    // The plan command fit prints reads the file's bytes back to the same total.
    let command = best["plan_command"].as_str().unwrap();
    let mut args: Vec<&str> = command.split(' ').skip(1).collect();
    args.push("--json");
    let plan = json(&frugal(&args));
    assert_eq!(plan["per_device"]["params_bytes"], tensor_bytes, "{plan}");
    assert_eq!(plan["per_device"]["total_bytes"], best["total_bytes"]);
    // Pinned to ggml: only the file's format; a model that is not a GGUF file has no ggml.
    let pinned = fit(&["--weights", "ggml"]);
    let weights: Vec<_> = pinned["best"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["serving"]["weights"].clone())
        .collect();
    assert!(weights.iter().all(|w| w == "ggml"), "{weights:?}");
    let other = [
        "fit",
        "--infer",
        "--model",
        "llama2-7b",
        "--weights",
        "ggml",
    ];
    common::fails_with(&frugal(&other), "pass a quantized GGUF file as --model");
}
