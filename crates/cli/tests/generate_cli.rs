//! `frugal generate` and the inference benchmarks from the command line: a model trained here
//! generates with a KV cache exactly what the recompute-everything reference generates, a
//! quantized folder reloads to the same tokens, planned bytes equal measured ones, and bad input
//! (formats, a prompt past the context, a draft with another vocabulary, a damaged quantized file,
//! a KV budget too small) is refused naming what is wrong.

mod common;

use common::{fails_with, frugal, generate_args, json, small_text, temp_dir};
use std::path::Path;

fn train_tiny(dir: &Path, group: &str) -> String {
    train(dir, group, "gpt2-tiny")
}

/// Trains `model` 3 steps of 2 × 32 tokens on a small text into `dir/run`.
fn train(dir: &Path, group: &str, model: &str) -> String {
    let data = small_text(group, "data", 30_000);
    let out = dir.join("run");
    let out_s = out.display().to_string();
    let mut args = common::short_train("3", &data);
    args.extend([
        "--model", model, "--batch", "2", "--seq", "32", "--out", &out_s,
    ]);
    let r = frugal(&args);
    common::assert_ok(&r);
    out_s
}

/// `bench generate` of one token after two on `model` in `weights`, saving the quantized model
/// into `save`.
fn bench_generate_saving<'a>(model: &'a str, weights: &'a str, save: &'a str) -> Vec<&'a str> {
    let mut args = vec!["bench", "generate", "--model", model, "--weights", weights];
    args.extend(["--prompt-len", "2", "--new-tokens", "1", "--save", save]);
    args
}

/// `frugal plan --infer --runtime frugal --json` for the f32 server `generate` ran on `model`
/// (its prompt and `new` tokens, KV blocks of 16).
fn planned_serve(model: &str, generated: &serde_json::Value, new: u64) -> serde_json::Value {
    let config = Path::new(model).join("config.json").display().to_string();
    let seq = (generated["prompt_tokens"].as_u64().unwrap() + new).to_string();
    json(&frugal(&[
        "plan",
        "--model",
        &config,
        "--infer",
        "--runtime",
        "frugal",
        "--weights",
        "f32",
        "--kv-dtype",
        "f32",
        "--batch",
        "1",
        "--seq",
        &seq,
        "--kv-block",
        "16",
        "--json",
    ]))
}

fn tokens(v: &serde_json::Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn a_trained_model_generates_with_its_cache_what_the_reference_recomputes() {
    let dir = temp_dir("generate", "trained");
    let model = train_tiny(&dir, "generate");
    let gen = |extra: &[&str]| {
        let mut a = generate_args(&model, "ROMEO:", "12", &["--json"]);
        a.extend_from_slice(extra);
        json(&frugal(&a))
    };
    let cached = gen(&[]);
    let reference = gen(&["--kv-cache", "off"]);
    assert_eq!(
        tokens(&cached),
        tokens(&reference),
        "greedy with and without the KV cache"
    );
    assert_eq!(tokens(&cached).len(), 12);
    // Sampled (top-k, then the nucleus), one sampler and one seed on both paths: the same draws
    // (the cached path stops at an end-of-text token, the reference does not).
    let drawn = [
        "--top-k",
        "40",
        "--top-p",
        "0.9",
        "--temperature",
        "0.8",
        "--seed",
        "3",
    ];
    let sampled = tokens(&gen(&drawn));
    let recomputed = tokens(&gen(&[&drawn[..], &["--kv-cache", "off"]].concat()));
    assert_eq!(
        sampled[..],
        recomputed[..sampled.len()],
        "sampled with and without the cache"
    );
    assert_ne!(sampled, tokens(&cached), "a draw, not the greedy tokens");
    assert_eq!(
        cached["planned"], cached["measured"],
        "measured == planned per category"
    );
    assert!(cached["measured"]["kv_cache_bytes"].as_u64().unwrap() > 0);
    // int4, saved and reloaded: the same tokens as int4 quantized on load.
    let q = dir.join("q");
    let q_s = q.display().to_string();
    let int4 = gen(&["--weights", "int4", "--save-quantized", &q_s]);
    let reloaded = json(&frugal(&generate_args(&q_s, "ROMEO:", "12", &["--json"])));
    assert_eq!(tokens(&int4), tokens(&reloaded));
    assert_eq!(reloaded["weights"], "int4");
    assert!(
        int4["measured"]["params_bytes"].as_u64().unwrap()
            < cached["measured"]["params_bytes"].as_u64().unwrap() / 6,
        "int4 weights are under a sixth of fp32's"
    );
    // A draft identical to the target is always accepted, and changes no token.
    let spec = gen(&["--draft", &model, "--draft-tokens", "3"]);
    assert_eq!(tokens(&spec), tokens(&cached));
    assert_eq!(spec["acceptance_rate"], 1.0);
    // plan --infer --runtime frugal prints the peak generate measures.
    let plan = planned_serve(&model, &cached, 12);
    assert_eq!(
        plan["per_device"]["peak_bytes"],
        cached["measured"]["peak_bytes"]
    );
}

#[test]
fn bad_inference_input_is_refused_naming_what_is_wrong() {
    let dir = temp_dir("generate", "bad");
    let target = dir.join("target").display().to_string();
    let mut save_int8 = bench_generate_saving("gpt2-tiny", "int8", &target);
    save_int8.push("--json");
    let saved = json(&frugal(&save_int8));
    assert_eq!(saved["planned_peak_bytes"], saved["measured_peak_bytes"]);
    let gen = |extra: &[&str]| {
        let mut a = vec!["generate", "--model", &target, "--max-new-tokens", "4"];
        a.extend_from_slice(extra);
        frugal(&a)
    };
    fails_with(&gen(&["--kv-dtype", "int2"]), "not a KV format");
    // fp32 weights saved in the quantized file are values: any format packs from them, and a
    // quantized copy may draft for its own model.
    let f32_dir = dir.join("f32").display().to_string();
    let r = frugal(&bench_generate_saving("gpt2-tiny", "f32", &f32_dir));
    common::assert_ok(&r);
    let plain = json(&frugal(&[
        "generate",
        "--model",
        &f32_dir,
        "--max-new-tokens",
        "6",
        "--json",
    ]));
    let spec = json(&frugal(&[
        "generate",
        "--model",
        &f32_dir,
        "--max-new-tokens",
        "6",
        "--draft",
        &f32_dir,
        "--draft-weights",
        "int8",
        "--json",
    ]));
    assert_eq!(
        plain["tokens"], spec["tokens"],
        "greedy speculative = plain"
    );
    assert_eq!(spec["weights"], "f32");
    fails_with(&gen(&["--weights", "int4"]), "stored as int8");
    let long: String = "to be or not to be ".repeat(60);
    fails_with(
        &gen(&["--prompt", &long]),
        "longer than the model's context of 256",
    );
    fails_with(&gen(&["--kv-cache", "off"]), "runs the fp32 model");
    // A draft with another vocabulary.
    let config = std::fs::read_to_string(Path::new(&target).join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&config).unwrap();
    v["vocab_size"] = serde_json::json!(1000);
    let small = dir.join("small.json");
    std::fs::write(&small, v.to_string()).unwrap();
    let draft = dir.join("draft").display().to_string();
    let small = small.display().to_string();
    let r = frugal(&bench_generate_saving(&small, "int8", &draft));
    common::assert_ok(&r);
    fails_with(&gen(&["--draft", &draft]), "vocabulary");
    // A damaged quantized file: a flipped byte, then a wrong magic.
    let file = Path::new(&target).join("weights.frugal");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    std::fs::write(&file, &bytes).unwrap();
    fails_with(&gen(&[]), "checksum does not match");
    bytes[0] = b'X';
    std::fs::write(&file, &bytes).unwrap();
    fails_with(&gen(&[]), "wrong magic");
    // A KV budget that holds no block.
    let r = frugal(&[
        "bench",
        "serve",
        "--model",
        "gpt2-tiny",
        "--kv-budget",
        "1KiB",
        "--requests",
        "2",
    ]);
    fails_with(&r, "holds no KV block");
    let r = frugal(&[
        "bench",
        "generate",
        "--model",
        "gpt2-tiny",
        "--weights",
        "int4",
        "--weight-group",
        "48",
    ]);
    fails_with(&r, "weight-group");
}

#[test]
fn the_serving_benchmark_follows_its_plan() {
    let v = json(&frugal(&[
        "bench",
        "serve",
        "--model",
        "gpt2-tiny",
        "--requests",
        "12",
        "--max-seqs",
        "4",
        "--prompt-mean",
        "24",
        "--output-mean",
        "16",
        "--context",
        "128",
        "--json",
    ]));
    assert_eq!(v["max_concurrent"], v["planned_max_concurrent"]);
    assert_eq!(v["preemptions"], v["planned_preemptions"]);
    assert_eq!(v["planned_peak_bytes"], v["measured_peak_bytes"]);
    let waste = v["kv_waste_fraction"].as_f64().unwrap();
    let contiguous = v["contiguous_waste_fraction"].as_f64().unwrap();
    assert!(
        waste < contiguous,
        "paged {waste} vs contiguous {contiguous}"
    );
}

#[test]
fn a_sharded_checkpoint_loads_as_its_single_file_does() {
    use safetensors::tensor::TensorView;
    let dir = temp_dir("generate", "sharded");
    let model = train_tiny(&dir, "generate-sharded");
    let bytes = std::fs::read(Path::new(&model).join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(|s| s.to_string()).collect();
    names.sort();
    let shards = dir.join("sharded");
    std::fs::create_dir_all(&shards).unwrap();
    std::fs::copy(
        Path::new(&model).join("config.json"),
        shards.join("config.json"),
    )
    .unwrap();
    let mut map = serde_json::Map::new();
    for (k, part) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", k + 1);
        let views: Vec<(String, TensorView)> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        let out = safetensors::serialize(views, None).unwrap();
        std::fs::write(shards.join(&file), out).unwrap();
        for n in part {
            map.insert(n.clone(), serde_json::json!(file));
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(
        shards.join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let run = |m: &str| {
        json(&frugal(&[
            "generate",
            "--model",
            m,
            "--max-new-tokens",
            "8",
            "--json",
        ]))["tokens"]
            .clone()
    };
    // The training folder (a snapshot's weights) and the two shards give the same tokens.
    let sharded = shards.display().to_string();
    assert_eq!(run(&model), run(&sharded));
    // And training starts from either with the same first loss.
    let data = small_text("generate-sharded", "data2", 30_000);
    let first = |m: &str| {
        let mut args = common::short_train("1", &data);
        args.extend(["--model", m, "--batch", "2", "--seq", "32", "--json"]);
        let v = json(&frugal(&args));
        v["loss_first"].as_f64().unwrap()
    };
    assert_eq!(first(&model), first(&sharded));
}

#[test]
fn mixtures_of_experts_and_latent_attention_generate_with_their_caches_as_planned() {
    for family in ["mixtral-tiny", "deepseek-tiny"] {
        let dir = temp_dir("generate", family);
        let out = train(&dir, "generate-moe", family);
        let gen = |model: &str, extra: &[&str]| {
            let mut a = vec!["generate", "--model", model, "--prompt", "ROMEO:"];
            a.extend(["--max-new-tokens", "12", "--json"]);
            a.extend_from_slice(extra);
            json(&frugal(&a))
        };
        let cached = gen(&out, &[]);
        assert_eq!(
            tokens(&cached),
            tokens(&gen(&out, &["--kv-cache", "off"])),
            "{family}"
        );
        assert_eq!(cached["planned"], cached["measured"], "{family}");
        // Experts and latent projections quantized, saved and reloaded: the same tokens.
        let q = dir.join("q").display().to_string();
        let int8 = gen(&out, &["--weights", "int8", "--save-quantized", &q]);
        assert_eq!(
            tokens(&int8),
            tokens(&gen(&q, &[])),
            "{family} int8 reloaded"
        );
        let plan = planned_serve(&out, &cached, 12);
        assert_eq!(
            plan["per_device"]["peak_bytes"], cached["measured"]["peak_bytes"],
            "{family}"
        );
    }
}

/// Runs that never reach a decode step (speculative decoding verifies drafts in multi-row steps;
/// no new token, or one) measure the plan of the phases they ran, and succeed.
#[test]
fn runs_without_a_decode_step_measure_the_prefill_plan() {
    let dir = common::temp_dir("generate-cli", "no-decode");
    let model = train_tiny(&dir, "generate-cli-no-decode");
    let cases: [&[&str]; 5] = [
        &[
            "--draft",
            &model,
            "--draft-tokens",
            "2",
            "--max-new-tokens",
            "6",
        ],
        &["--max-new-tokens", "0"],
        &["--max-new-tokens", "1"],
        // No token to draft, from a prompt of one token: the prompt is still read.
        &[
            "--draft",
            &model,
            "--max-new-tokens",
            "0",
            "--prompt",
            "hello",
        ],
        &["--max-new-tokens", "0", "--prompt", "hello"],
    ];
    for extra in cases {
        let mut args = vec!["generate", "--model", &model, "--json"];
        args.extend_from_slice(extra);
        let v = json(&frugal(&args));
        assert_eq!(v["planned"], v["measured"], "{extra:?}");
    }
    // With decode steps, the whole plan, its decode scratch included.
    let v = json(&frugal(&[
        "generate",
        "--model",
        &model,
        "--max-new-tokens",
        "4",
        "--json",
    ]));
    assert_eq!(v["planned"], v["measured"]);
    assert!(v["planned"]["other_bytes"].as_u64().unwrap() > 0, "{v}");
}
