//! `frugal train` end to end on a tiny model: exit 0, the JSON contract, planned == measured,
//! weights saved in HF layout, the plot; and every bad input ending with exit code 2 and a message
//! that says what is wrong. Runs use a small slice of the shipped corpus written to a temp file,
//! so no test pays for tokenizing the whole corpus.

mod common;

use common::frugal;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Output;

/// A fresh folder for one test.
fn temp_dir(test: &str) -> PathBuf {
    common::temp_dir("train-cli", test)
}

/// About 40 KB of Shakespeare: enough tokens for tiny batches and a validation split.
fn small_text(dir: &std::path::Path) -> String {
    let text: String = data::shakespeare_text().chars().take(40_000).collect();
    let path = dir.join("small.txt");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A 3-step run of gpt2-tiny on the small text; `extra` flags override the defaults here.
fn tiny_run(dir: &std::path::Path, extra: &[&str]) -> Output {
    let data = small_text(dir);
    let base = [
        ("--model", "gpt2-tiny"),
        ("--steps", "3"),
        ("--batch", "2"),
        ("--seq", "32"),
        ("--val-every", "2"),
        ("--val-batches", "1"),
        ("--sample-tokens", "4"),
        ("--data", &data),
    ];
    let mut args = vec!["train"];
    for (flag, value) in base {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend_from_slice(extra);
    frugal(&args)
}

use common::fails_with;

#[test]
fn tiny_run_prints_the_json_contract_with_planned_equal_to_measured() {
    let dir = temp_dir("json");
    let (out_dir, plot) = (dir.join("model"), dir.join("loss.svg"));
    let out = tiny_run(
        &dir,
        &[
            "--json",
            "--out",
            out_dir.to_str().unwrap(),
            "--plot",
            plot.to_str().unwrap(),
        ],
    );
    common::assert_ok(&out);
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["steps"], 3);
    assert_eq!(v["tokens"], 3 * 2 * 32);
    for key in ["loss_first", "loss_last", "val_loss", "tokens_per_s"] {
        assert!(
            v[key].as_f64().is_some_and(f64::is_finite),
            "{key}: {}",
            v[key]
        );
    }
    let rank = &v["ranks"][0];
    assert_eq!(rank["rank"], 0);
    let totals = [
        "peak_bytes",
        "reserved_bytes",
        "context_bytes",
        "total_bytes",
    ];
    for field in common::CATEGORY_FIELDS.into_iter().chain(totals) {
        let planned = rank["planned"][field].as_u64().expect(field);
        assert_eq!(rank["measured"][field].as_u64(), Some(planned), "{field}");
    }
    assert!(rank["planned"]["params_bytes"].as_u64().unwrap() > 0);
    assert!(out_dir.join("model.safetensors").exists() && out_dir.join("config.json").exists());
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg") || svg.contains("<svg"),
        "the plot is SVG"
    );
    // The saved folder is a model: training continues from its weights.
    let again = tiny_run(&dir, &["--json", "--model", out_dir.to_str().unwrap()]);
    common::assert_ok(&again);
}

#[test]
fn human_output_has_the_memory_table_and_a_sample() {
    let dir = temp_dir("human");
    let out = tiny_run(&dir, &[]);
    common::assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "planned",
        "measured",
        "activations",
        "reserved",
        "sample:",
        "ROMEO:",
    ] {
        assert!(text.contains(needle), "output lacks {needle:?}:\n{text}");
    }
}

#[test]
fn a_sequence_longer_than_the_positions_is_refused() {
    let dir = temp_dir("seq");
    fails_with(
        &tiny_run(&dir, &["--seq", "4096"]),
        "longer than the model's 256 positions",
    );
}

#[test]
fn too_little_memory_is_refused_before_step_one_with_the_breakdown() {
    let dir = temp_dir("mem");
    let out = tiny_run(&dir, &["--device-memory", "1MiB"]);
    fails_with(&out, "the device holds 1.00 MiB (1048576 bytes)");
    fails_with(&out, "activations");
    // Nothing near this setup fits in 1 MiB: the error still says how to get there.
    fails_with(&out, "give more --device-memory");
}

#[test]
fn an_empty_or_too_short_data_set_is_refused() {
    let dir = temp_dir("short");
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let out = frugal(&[
        "train",
        "--model",
        "gpt2-tiny",
        "--data",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let short = dir.join("short.txt");
    std::fs::write(&short, "To be, or not to be.").unwrap();
    let args = [
        "train",
        "--model",
        "gpt2-tiny",
        "--seq",
        "64",
        "--data",
        short.to_str().unwrap(),
    ];
    fails_with(&frugal(&args), "needs at least");
}

#[test]
fn a_config_the_engine_cannot_build_is_refused() {
    let dir = temp_dir("config");
    let bert = dir.join("config.json");
    std::fs::write(&bert, r#"{"model_type": "bert", "hidden_size": 64}"#).unwrap();
    let out = frugal(&["train", "--model", bert.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let small_vocab = dir.join("small_vocab.json");
    let gpt2 = r#"{"model_type": "gpt2", "vocab_size": 100, "n_positions": 64, "n_embd": 32,
                  "n_layer": 1, "n_head": 2}"#;
    std::fs::write(&small_vocab, gpt2).unwrap();
    fails_with(
        &frugal(&["train", "--model", small_vocab.to_str().unwrap()]),
        "vocabulary (100)",
    );
}

#[test]
fn a_diverging_run_stops_with_the_step_and_a_lower_lr() {
    let dir = temp_dir("nan");
    let out = tiny_run(&dir, &["--lr", "1e30", "--grad-clip", "0", "--warmup", "0"]);
    fails_with(&out, "training stopped");
    fails_with(&out, "lower learning rate");
}

#[test]
fn options_past_what_training_supports_are_refused_not_ignored() {
    let dir = temp_dir("later");
    fails_with(
        &tiny_run(&dir, &["--zero", "4"]),
        "invalid value '4' for '--zero",
    );
    fails_with(
        &tiny_run(&dir, &["--offload", "params"]),
        "invalid value 'params' for '--offload",
    );
    fails_with(&tiny_run(&dir, &["--ranks", "0"]), "--ranks 0");
}

#[test]
fn bench_train_reports_tokens_per_second_and_gflops() {
    let args = [
        "bench",
        "train",
        "--model",
        "llama-tiny",
        "--batch",
        "1",
        "--seq",
        "16",
        "--steps",
        "1",
        "--json",
    ];
    let out = frugal(&args);
    common::assert_ok(&out);
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["gflops"].as_f64().unwrap() > 0.0);
    // The GEMM yardstick of the same run, and the step's share of it.
    let gemm = v["gemm_gflops"].as_f64().unwrap();
    assert!(gemm > 0.0 && gemm.is_finite());
    let share = v["gflops_over_gemm"].as_f64().unwrap();
    assert!((share - v["gflops"].as_f64().unwrap() / gemm).abs() < 1e-9);
    assert!(!v["cpu"].as_str().unwrap().is_empty());
    assert!(v["step_seconds"]["head (classifier fwd+bwd)"]
        .as_f64()
        .is_some());
    let bad = frugal(&[
        "bench",
        "train",
        "--model",
        "gpt2-tiny",
        "--steps",
        "1",
        "--baseline",
        "jax",
    ]);
    fails_with(&bad, "the only baseline is pytorch");
}

#[test]
fn two_ranks_report_each_rank_with_planned_equal_to_measured() {
    let dir = temp_dir("ranks");
    let one = tiny_run(&dir, &["--json", "--batch", "4", "--sample-tokens", "0"]);
    let two = tiny_run(&dir, &["--json", "--ranks", "2", "--sample-tokens", "0"]);
    common::assert_ok(&two);
    let (one, two): (Value, Value) = (
        serde_json::from_slice(&one.stdout).unwrap(),
        serde_json::from_slice(&two.stdout).unwrap(),
    );
    assert_eq!(two["ranks"].as_array().unwrap().len(), 2);
    for rank in two["ranks"].as_array().unwrap() {
        assert_eq!(rank["planned"], rank["measured"], "rank {}", rank["rank"]);
    }
    // 2 ranks of 2 rows see the tokens 1 rank of 4 rows sees.
    assert_eq!(one["tokens"], two["tokens"]);
    let (a, b) = (
        one["loss_last"].as_f64().unwrap(),
        two["loss_last"].as_f64().unwrap(),
    );
    assert!((a - b).abs() < 1e-4, "loss {a} vs {b}");
}

#[test]
fn a_mistral_config_trains_with_its_sliding_window_planned_equal_to_measured() {
    let dir = temp_dir("mistral");
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"model_type": "mistral", "vocab_size": 50257, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false,
            "sliding_window": 8}"#,
    )
    .unwrap();
    for attention in ["flash", "eager"] {
        let out = tiny_run(
            &dir,
            &[
                "--model",
                config.to_str().unwrap(),
                "--steps",
                "30",
                "--lr",
                "3e-3",
                "--attention",
                attention,
                "--json",
            ],
        );
        common::assert_ok(&out);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let (first, last) = (
            v["loss_first"].as_f64().unwrap(),
            v["loss_last"].as_f64().unwrap(),
        );
        assert!(last < first - 0.5, "{attention}: loss {first} -> {last}");
        let rank = &v["ranks"][0];
        for field in common::CATEGORY_FIELDS {
            assert_eq!(rank["measured"][field], rank["planned"][field], "{field}");
        }
    }
}

#[test]
fn mixtral_and_deepseek_train_their_experts_with_the_planners_bytes_on_one_and_two_ranks() {
    let dir = temp_dir("moe");
    let runs: [&[&str]; 2] = [
        &[],
        &[
            "--ranks",
            "2",
            "--zero",
            "3",
            "--precision",
            "bf16",
            "--recompute",
            "full",
        ],
    ];
    for (model, extra) in ["mixtral-tiny", "deepseek-tiny"]
        .into_iter()
        .flat_map(|m| runs.map(|r| (m, r)))
    {
        let mut args = vec!["--model", model, "--steps", "30", "--lr", "3e-3", "--json"];
        args.extend_from_slice(extra);
        let out = tiny_run(&dir, &args);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let (first, last) = (
            v["loss_first"].as_f64().unwrap(),
            v["loss_last"].as_f64().unwrap(),
        );
        assert!(
            last < first - 0.5,
            "{model} {extra:?}: loss {first} -> {last}"
        );
        let rank = &v["ranks"][0];
        for field in common::CATEGORY_FIELDS {
            assert_eq!(rank["measured"][field], rank["planned"][field], "{field}");
        }
        // The planner's frugal runtime prints the measured peak for the same run.
        let mut plan = vec!["plan", "--model", model, "--train", "--runtime", "frugal"];
        plan.extend(["--batch", "2", "--seq", "32", "--json"]);
        let precision = if extra.is_empty() { "fp32" } else { "bf16" };
        plan.extend(["--precision", precision]);
        plan.extend(
            extra
                .iter()
                .filter(|f| !["--precision", "bf16"].contains(f)),
        );
        let p: Value = serde_json::from_slice(&frugal(&plan).stdout).unwrap();
        assert_eq!(
            p["per_device"]["peak_bytes"], rank["measured"]["peak_bytes"],
            "{model} {extra:?}"
        );
    }
}

#[test]
fn a_trained_mixture_reloads_and_a_checkpoint_that_misfits_its_config_names_the_tensor() {
    let dir = temp_dir("moe-reload");
    let out_dir = dir.join("model");
    let out = tiny_run(
        &dir,
        &[
            "--model",
            "deepseek-tiny",
            "--steps",
            "2",
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    common::assert_ok(&out);
    let model = out_dir.to_str().unwrap();
    let generate = [
        "generate",
        "--model",
        model,
        "--kv-cache",
        "off",
        "--max-new-tokens",
        "3",
    ];
    let ok = frugal(&generate);
    common::assert_ok(&ok);
    // The latent cache generates what recomputing every prefix does; int8 latents are refused.
    let tokens = |args: &[&str]| -> Value {
        let out = frugal(&[args, &["--json"]].concat());
        common::assert_ok(&out);
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["tokens"].clone()
    };
    let cached = ["generate", "--model", model, "--max-new-tokens", "3"];
    assert_eq!(tokens(&cached), tokens(&generate));
    fails_with(
        &frugal(&[&cached[..], &["--kv-dtype", "int8"]].concat()),
        "--kv-dtype f32",
    );
    // One routed expert more in the config than in the weights: refused, naming the tensor.
    let config = out_dir.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    let grown = text.replace("\"n_routed_experts\": 4", "\"n_routed_experts\": 5");
    assert_ne!(grown, text, "the exported config names its experts");
    std::fs::write(&config, grown).unwrap();
    fails_with(&frugal(&generate), "model.layers.1.mlp.gate.weight");
}
