//! Every instruction-set level this CPU runs, end to end from the binary (`FRUGAL_ISA`), so the
//! AVX2 and portable kernels are exercised on an AVX-512 machine too and the suite cannot pass
//! only on the CPU it was written on: fp32 and bf16 training, ZeRO-3 over two ranks, LoRA over
//! an NF4 base, int4 / int8 / NF4 generation and a GGUF file's own blocks, each checked by the
//! binary itself (planned == measured, or exit 2) and against the best level's losses. A bad or too-high `FRUGAL_ISA` is
//! refused before any work.

mod common;

use common::{frugal, small_text, temp_dir};
use serde_json::Value;
use std::process::{Command, Output};

/// `frugal args` with the kernels capped at `level`.
fn at(level: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(args)
        .env("FRUGAL_ISA", level)
        .output()
        .expect("run frugal")
}

fn ok_json(level: &str, args: &[&str]) -> Value {
    let out = at(level, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{level} {args:?}: {stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn train_args<'a>(data: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = common::short_train("3", data);
    args.extend(["--batch", "2", "--seq", "32", "--json"]);
    args.extend_from_slice(extra);
    args
}

fn loss_last(v: &Value) -> f64 {
    v["loss_last"].as_f64().expect("loss_last")
}

#[test]
fn every_level_trains_shards_fine_tunes_and_generates() {
    let dir = temp_dir("isa", "levels");
    let data = small_text("isa", "data", 30_000);
    let levels: Vec<&str> = kernels::cpu::supported().iter().map(|l| l.name()).collect();
    let best = *levels.last().unwrap();
    let base = dir.join("base").display().to_string();
    ok_json(
        best,
        &train_args(&data, &["--model", "gpt2-tiny", "--out", &base]),
    );
    let cases: [(&str, Vec<&str>); 4] = [
        ("fp32", vec!["--model", "gpt2-tiny"]),
        ("bf16", vec!["--model", "gpt2-tiny", "--precision", "bf16"]),
        (
            "zero3",
            vec!["--model", "gpt2-tiny", "--ranks", "2", "--zero", "3"],
        ),
        (
            "qlora",
            vec!["--model", &base, "--lora-rank", "4", "--lora-base", "nf4"],
        ),
    ];
    // Losses at the best level; every other level within a budget of them: fp32 paths differ
    // only in summation order (~1e-6 after 3 steps), bf16 ones also in where products round.
    let mut best_loss = std::collections::HashMap::new();
    for level in levels.iter().rev() {
        for (name, extra) in &cases {
            let v = ok_json(level, &train_args(&data, extra));
            let loss = loss_last(&v);
            assert!(loss.is_finite(), "{name} at {level}: loss {loss}");
            let want = *best_loss.entry(*name).or_insert(loss);
            let budget = if *name == "bf16" { 0.02 } else { 1e-3 };
            assert!(
                (loss - want).abs() <= budget,
                "{name} at {level}: loss {loss}, at {best}: {want}"
            );
        }
        for weights in ["int4", "int8", "nf4"] {
            let extra = ["--weights", weights, "--kv-dtype", "int8", "--json"];
            let v = ok_json(level, &common::generate_args(&base, "ROMEO:", "6", &extra));
            let tokens = v["tokens"].as_array().expect("tokens");
            assert_eq!(tokens.len(), 6, "{weights} at {level}: {v}");
        }
    }
}

#[test]
fn bench_reports_the_path_each_kernel_took() {
    let avx2 = kernels::cpu::detected() >= kernels::cpu::Level::Avx2;
    let level = if avx2 { "avx2" } else { "portable" };
    let v = ok_json(
        level,
        &[
            &["bench", "train"][..],
            &common::TINY_1X16,
            &["--steps", "1", "--precision", "bf16", "--json"],
        ]
        .concat(),
    );
    assert_eq!(v["isa"], level);
    assert_eq!(v["gemm_path"], level);
    assert_eq!(v["paths"]["gemm_bf16"], level);
    assert_eq!(v["paths"]["qmatmul"], level);
    // A CPU backend made at AVX2 keeps int4, int8 and nf4 in tiles of eight rows.
    let layout = if avx2 { "tiles" } else { "rows" };
    for key in ["int4_layout", "int8_layout", "nf4_layout"] {
        assert_eq!(v["paths"][key], layout, "{key}");
    }
    // The int4 tiles ask for their weights further ahead, into L2, on AMD's cores.
    let ahead = match (avx2, kernels::cpu::amd()) {
        (false, _) => "none",
        (true, true) => "l2-32k",
        (true, false) => "l1-4k",
    };
    assert_eq!(v["paths"]["int4_prefetch"], ahead);
    let f32_path = if avx2 { "faer-avx2" } else { "portable" };
    assert_eq!(v["paths"]["gemm_f32"], f32_path);
    if kernels::cpu::detected() >= kernels::cpu::Level::Avx512 {
        let args = [
            &["bench", "train"][..],
            &common::TINY_1X16,
            &["--steps", "1", "--json"],
        ];
        let v = ok_json("avx512", &args.concat());
        assert_eq!(v["gemm_path"], "avx512");
        assert_eq!(v["paths"]["gemm_f32"], "avx512");
        // bf16 below AVX-512 BF16 widens in 512 bits too.
        let v = ok_json(
            "avx512",
            &[&args.concat()[..], &["--precision", "bf16"]].concat(),
        );
        assert_eq!(v["gemm_path"], "avx512");
        assert_eq!(v["paths"]["gemm_bf16"], "avx512");
    }
}

#[test]
fn a_bad_or_too_high_level_is_refused_before_any_work() {
    let out = at("sse9", &["formats", "1.5"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("FRUGAL_ISA") && err.contains("sse9") && err.contains("avx512bf16"),
        "{err}"
    );
    if kernels::cpu::detected() < kernels::cpu::Level::Amx {
        let out = at("amx", &["formats", "1.5"]);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        let detected = kernels::cpu::detected().name();
        assert!(err.contains("amx") && err.contains(detected), "{err}");
    }
    // Unset or empty: the CPU's best, no error.
    assert!(at("", &["formats", "1.5"]).status.success());
    assert!(frugal(&["formats", "1.5"]).status.success());
}

/// A GGUF file's own blocks (SmolLM2's Q4_1, codes two a byte) at every level: each level's
/// run measures its plan (the binary exits 2 otherwise) and generates.
#[test]
fn every_level_runs_a_gguf_files_own_blocks() {
    let model = common::smollm2();
    for level in kernels::cpu::supported().iter().map(|l| l.name()) {
        let prompt = "The capital of France is";
        let args = common::generate_args(model.to_str().unwrap(), prompt, "6", &["--json"]);
        let v = ok_json(level, &args);
        assert_eq!(v["weights"], "ggml", "{level}: {v}");
        assert_eq!(v["planned"], v["measured"], "{level}");
        assert!(!v["tokens"].as_array().unwrap().is_empty(), "{level}: {v}");
    }
}
