//! `frugal plan` end to end: the classic worked numbers through the CLI, the JSON contract, the plot, and
//! every bad input ending with exit code 2 and a message naming the field and the fix.

mod common;

use serde_json::Value;
use std::process::{Command, Output};

fn frugal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(args)
        .output()
        .expect("run frugal")
}

fn json(args: &[&str]) -> Value {
    let mut all = vec!["plan", "--json"];
    all.extend_from_slice(args);
    common::json(&frugal(&all))
}

fn peak_gb(v: &Value) -> f64 {
    v["per_device"]["peak_bytes"].as_u64().unwrap() as f64 / 1e9
}

#[test]
fn seed_zero_table_through_the_cli() {
    let z = |stage: &str| {
        peak_gb(&json(&[
            "--params",
            "7B",
            "--train",
            "--zero",
            stage,
            "--gpus",
            "8",
            "--convention",
            "paper",
        ]))
    };
    assert_eq!(
        peak_gb(&json(&[
            "--params",
            "7B",
            "--train",
            "--convention",
            "paper"
        ])),
        112.0
    );
    assert_eq!(z("1"), 38.5);
    assert_eq!(z("2"), 26.25);
    assert_eq!(z("3"), 14.0);
    let w = |fmt: &str| peak_gb(&json(&["--params", "7B", "--infer", "--weights", fmt]));
    assert_eq!(
        (w("fp32"), w("fp16"), w("int8"), w("int4")),
        (28.0, 14.0, 7.0, 3.5)
    );
}

#[test]
fn json_contract_holds() {
    let flags = "--model llama3-8b --train --precision amp-bf16 --zero 3 --gpus 8 --batch 4 \
                 --seq 2048 --recompute full --device-memory 80GiB";
    let v = json(&flags.split_whitespace().collect::<Vec<_>>());
    let d = &v["per_device"];
    let field = |k: &str| d[k].as_u64().unwrap_or_else(|| panic!("per_device.{k}"));
    let sum: u64 = common::CATEGORY_FIELDS.iter().map(|k| field(k)).sum();
    assert_eq!(sum, field("peak_bytes"));
    assert_eq!(
        field("total_bytes"),
        field("reserved_bytes") + field("context_bytes")
    );
    assert_eq!(v["param_count"].as_u64(), Some(8_030_261_248));
    assert_eq!(v["fits"].as_bool(), Some(true));
    assert!(v["timeline"].as_array().unwrap().len() > 60);
    let kv = json(&[
        "--model",
        "llama2-7b",
        "--infer",
        "--batch",
        "1",
        "--seq",
        "2048",
    ]);
    assert_eq!(
        kv["per_device"]["kv_cache_bytes"].as_u64(),
        Some(2 * 32 * 32 * 128 * 2048 * 2)
    );
}

#[test]
fn offload_reports_host_memory_and_plot_is_written() {
    let svg = std::env::temp_dir().join(format!("frugal-plan-{}.svg", std::process::id()));
    let v = json(&[
        "--model",
        "gpt2-124m",
        "--train",
        "--zero",
        "2",
        "--gpus",
        "2",
        "--offload",
        "optimizer",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(v["host"]["optimizer_bytes"].as_u64().unwrap() > 0);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg") && text.contains("activations"));
    std::fs::remove_file(svg).ok();
}

fn fails_with(args: &[&str], needles: &[&str]) {
    let mut all = vec!["plan"];
    all.extend_from_slice(args);
    let out = frugal(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: '{n}' not in: {err}");
    }
}

fn temp_config(name: &str, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("frugal-{}-{name}.json", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn bad_input_names_the_field_and_the_fix() {
    fails_with(
        &["--model", "llama9-1t", "--train"],
        &["model", "llama2-7b", "config.json"],
    );
    fails_with(
        &["--model", "llama2-7b", "--train", "--gpus", "0"],
        &["--gpus", "at least 1"],
    );
    fails_with(
        &["--model", "llama2-7b", "--train", "--zero", "4"],
        &["--zero", "--zero 3"],
    );
    fails_with(
        &["--model", "llama2-7b", "--train", "--tp", "3"],
        &["--tp", "1, 2, 4, 8"],
    );
    fails_with(
        &["--model", "llama2-7b", "--recompute", "often"],
        &["--recompute", "every:K"],
    );
    fails_with(
        &["--model", "gpt2-124m", "--train", "--seq", "4096"],
        &["--seq", "1024"],
    );
    let malformed = temp_config("malformed", "{\"model_type\": \"llama\", ");
    fails_with(
        &["--model", &malformed, "--train"],
        &["config.json", "JSON"],
    );
    let incomplete = temp_config(
        "incomplete",
        r#"{"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
            "num_hidden_layers": 32, "vocab_size": 32000, "max_position_embeddings": 4096}"#,
    );
    fails_with(
        &["--model", &incomplete, "--train"],
        &["intermediate_size", "add it"],
    );
    let odd = temp_config(
        "odd-heads",
        r#"{"model_type": "gpt2", "n_embd": 768, "n_head": 10, "n_layer": 12,
            "n_positions": 1024, "vocab_size": 50257}"#,
    );
    fails_with(&["--model", &odd, "--train"], &["n_head", "divide"]);
    fails_with(
        &["--model", "/nonexistent/config.json"],
        &["--model", "no such file or folder"],
    );
    for p in [malformed, incomplete, odd] {
        std::fs::remove_file(p).ok();
    }
}

#[test]
fn human_output_writes_gib_and_gb() {
    let out = frugal(&[
        "plan",
        "--model",
        "qwen2.5-0.5b",
        "--train",
        "--batch",
        "2",
        "--seq",
        "512",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("GiB") && text.contains(" GB") && text.contains("494,032,768"),
        "{text}"
    );
}

#[test]
fn auto_runtime_says_when_it_falls_back_and_explicit_runtimes_do_not() {
    let tp2 = [
        "--model",
        "llama2-7b",
        "--train",
        "--zero",
        "3",
        "--gpus",
        "8",
        "--tp",
        "2",
    ];
    let v = json(&tp2);
    assert_eq!(v["runtime"].as_str(), Some("formula"));
    assert!(v["runtime_note"].as_str().unwrap().contains("pytorch"));
    let p = json(&[
        "--model",
        "gpt2-124m",
        "--train",
        "--precision",
        "amp-bf16",
        "--seq",
        "512",
    ]);
    assert_eq!(p["runtime"].as_str(), Some("pytorch"));
    assert!(p["runtime_note"].is_null());
    let out = frugal(&[&["plan"][..], &tp2, &["--runtime", "pytorch"]].concat());
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn conventions_are_named_and_deepspeed_is_the_default() {
    let z2 = |extra: &[&str]| {
        let mut args = vec!["--params", "7B", "--train", "--zero", "2", "--gpus", "8"];
        args.extend_from_slice(extra);
        json(&args)
    };
    // DeepSpeed adds the step's fp32 copy of the gradient partition: 4Ψ/8 = 3.5 GB.
    assert_eq!(peak_gb(&z2(&[])), 29.75);
    assert_eq!(z2(&[])["setup"]["convention"], "deepspeed");
    assert_eq!(peak_gb(&z2(&["--convention", "paper"])), 26.25);
    // ZeRO-2 with the optimizer offloaded: only the 16-bit weights stay on the device.
    assert_eq!(peak_gb(&z2(&["--offload", "optimizer"])), 14.0);
    let out = frugal(&["plan", "--params", "7B", "--train", "--convention", "paper"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("runtime formula (convention paper)"));
    let bad = frugal(&[
        "plan",
        "--model",
        "gpt2-124m",
        "--train",
        "--runtime",
        "pytorch",
        "--convention",
        "paper",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--runtime formula"));
}

#[test]
fn sliding_window_caches_only_the_window_and_the_engine_keeps_a_ring() {
    let kv = |runtime: &str| {
        json(&[
            "--model",
            "mistral-7b",
            "--infer",
            "--seq",
            "32768",
            "--runtime",
            runtime,
        ])["per_device"]["kv_cache_bytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(kv("formula"), 512u64 << 20);
    // The engine's pool: the window, one prefill chunk and two blocks of slack per sequence,
    // 274 blocks of 16 tokens at 128 KiB per token, not 32768 tokens (4 GiB).
    assert_eq!(kv("frugal"), 274 * 16 * 131_072);
}

#[test]
fn plan_reports_step_time_host_memory_and_the_largest_pieces() {
    let v = json(&[
        "--model",
        "llama2-7b",
        "--train",
        "--zero",
        "2",
        "--gpus",
        "8",
        "--offload",
        "optimizer",
        "--gpu",
        "h200",
    ]);
    assert_eq!(v["gpu"], "h200");
    assert!(v["step_time"]["step_s"].as_f64().unwrap() > 0.0);
    let host = &v["host_node"];
    assert_eq!(host["ranks"], 8);
    let per_rank = host["per_rank_bytes"].as_u64().unwrap();
    assert_eq!(host["offload_bytes"].as_u64().unwrap(), 8 * per_rank);
    assert_eq!(v["largest"]["module"], "embed_tokens");
    assert_eq!(v["largest"]["unit_params"], 202_383_360u64);
    // The plotted timeline peaks where the table does.
    let top = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["live_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(top, v["per_device"]["peak_bytes"].as_u64().unwrap());
}

/// The subcommand's summary in `frugal --help` must not replace its own long help.
#[test]
fn help_explains_the_plan_and_shows_examples() {
    let out = common::frugal(&["plan", "--help"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("The plan is a list of buffers"), "{text}");
    assert!(
        text.contains("Examples:") && text.contains("--plot memory.svg"),
        "{text}"
    );
}
