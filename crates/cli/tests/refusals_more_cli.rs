//! More inputs refused naming what fixes them: sizes past what a model or a cache can hold, the
//! wrong kind of base or corpus, a link to nothing, a snapshot whose manifest disagrees with its
//! state, and resumes that say which flag differs.

mod common;

use common::{fails_with, frugal};

/// Sizes and values every planning and benchmarking command bounds the same way.
#[test]
fn sizes_past_the_model_or_the_cache_are_refused_naming_the_flag() {
    let plan_block = [
        "plan",
        "--model",
        "gpt2-124m",
        "--infer",
        "--seq",
        "1000",
        "--kv-block",
        "1000000000",
    ];
    fails_with(&frugal(&plan_block), "--kv-block: 1000000000");
    let bench = |extra: &[&str]| {
        let base = [
            "bench",
            "generate",
            "--model",
            "gpt2-tiny",
            "--weights",
            "f32",
        ];
        frugal(&[&base[..], extra].concat())
    };
    fails_with(&bench(&["--kv-block", "0"]), "--kv-block: 0");
    let long = bench(&["--prompt-len", "250", "--new-tokens", "16"]);
    fails_with(&long, "lower --prompt-len or --new-tokens");
    let seq = ["plan", "--model", "llama2-7b", "--seq", "1099511627776"];
    fails_with(&frugal(&seq), "max_position_embeddings");
    let dropout = [
        "plan",
        "--model",
        "llama2-7b",
        "--train",
        "--lora-rank",
        "8",
        "--lora-dropout",
        "NaN",
    ];
    fails_with(&frugal(&dropout), "--lora-dropout");
    let amp = common::tiny_step(&["--precision", "amp-bf16"]);
    fails_with(&frugal(&amp), "precision policies");
}

/// One step of gpt2-tiny saved at every step into `out`, plus `extra`.
fn saved_run(out: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = common::short_run("1");
    args.extend(["--batch", "1", "--seq", "16", "--save-every", "1"]);
    args.extend(["--out", out.to_str().unwrap()]);
    args.extend_from_slice(extra);
    frugal(&args)
}

/// Paths of the wrong kind, and snapshots that disagree with themselves or with the run.
#[test]
fn wrong_paths_and_disagreeing_snapshots_are_refused_naming_the_fix() {
    let dir = common::temp_dir("robust-cli", "more");
    let run = dir.join("run");
    common::assert_ok(&saved_run(&run, &["--model", "gpt2-tiny"]));
    let run_s = run.to_str().unwrap();
    let missing = dir.join("nothing-here");
    let resume = [
        "train",
        "--model",
        "gpt2-tiny",
        "--resume",
        missing.to_str().unwrap(),
    ];
    fails_with(&frugal(&resume), "does not exist");
    // A resume with another schedule names the flag that sets it.
    let other = saved_run(
        &dir.join("other"),
        &["--model", "gpt2-tiny", "--resume", run_s, "--lr", "0.01"],
    );
    fails_with(&other, "(set by --lr)");
    let ppl = [
        "perplexity",
        "--model",
        run_s,
        "--data",
        "/dev/zero",
        "--ctx",
        "16",
    ];
    fails_with(&frugal(&ppl), "not a regular file");
    // A weights file that is a link to nothing is not "no weights".
    #[cfg(unix)]
    {
        let linked = dir.join("linked");
        std::fs::create_dir_all(&linked).unwrap();
        std::fs::copy(run.join("config.json"), linked.join("config.json")).unwrap();
        std::os::unix::fs::symlink(dir.join("gone"), linked.join("model.safetensors")).unwrap();
        let args = ["train", "--model", linked.to_str().unwrap(), "--steps", "1"];
        fails_with(&frugal(&args), "link to nothing");
    }
    // A LoRA run merged over a config.json: a shape, not the base's weights.
    let lora = dir.join("lora");
    common::assert_ok(&saved_run(&lora, &["--model", run_s, "--lora-rank", "2"]));
    let (config, merged) = (run.join("config.json"), dir.join("merged"));
    let merge = [
        "export",
        lora.to_str().unwrap(),
        "--merge",
        "--base",
        config.to_str().unwrap(),
        "--hf",
        merged.to_str().unwrap(),
    ];
    fails_with(&frugal(&merge), "a shape with no weights");
    // A manifest whose step is not its train state's.
    let step = run.join("step-000001");
    let manifest = step.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["step"] = 0.into();
    std::fs::write(&manifest, v.to_string()).unwrap();
    let resume = common::tiny_step(&["--resume", step.to_str().unwrap()]);
    fails_with(
        &frugal(&resume),
        "it lists step 0 and the train state is step 1",
    );
}

/// A speculative run that proposes nothing says so, not "0 of 0 accepted (0%)"; flags that
/// would do nothing in a run are refused, naming them.
#[test]
fn a_speculative_run_without_proposals_says_so() {
    let dir = common::temp_dir("robust-cli", "spec0");
    let run = dir.join("run");
    common::assert_ok(&saved_run(&run, &["--model", "gpt2-tiny"]));
    let run_s = run.to_str().unwrap();
    let args = [
        "generate",
        "--model",
        run_s,
        "--draft",
        run_s,
        "--prompt",
        "ROMEO:",
        "--max-new-tokens",
        "0",
    ];
    let out = frugal(&args);
    common::assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no draft tokens proposed"), "{err}");
    let gen = |extra: &[&str]| {
        frugal(&[&["generate", "--model", run_s, "--prompt", "hi"][..], extra].concat())
    };
    fails_with(
        &gen(&["--weights", "f32", "--weight-group", "64"]),
        "--weight-group 64: groups are int4's",
    );
    fails_with(
        &gen(&["--kv-cache", "off", "--kv-dtype", "int8"]),
        "--kv-cache off",
    );
    fails_with(&gen(&["--draft-tokens", "3"]), "--draft <DRAFT>");
    fails_with(
        &gen(&["--kv-block", "1000000000"]),
        "--kv-block: 1000000000",
    );
    // With decode steps, and without --json, the speculative run measures its plan and exits 0.
    let spec = gen(&[
        "--draft",
        run_s,
        "--draft-tokens",
        "2",
        "--max-new-tokens",
        "6",
    ]);
    common::assert_ok(&spec);
    let err = String::from_utf8_lossy(&spec.stderr);
    assert!(err.contains("draft tokens accepted"), "{err}");
    let warmup = [
        "train",
        "--model",
        "gpt2-tiny",
        "--steps",
        "2",
        "--warmup",
        "5",
    ];
    fails_with(
        &frugal(&warmup),
        "--warmup 5 is longer than the run's --steps 2",
    );
}

/// A weights file that is not frugal's names the command that writes one, never a command that
/// does not exist.
#[test]
fn a_damaged_quantized_file_names_the_command_that_writes_one() {
    let dir = common::temp_dir("robust-cli", "magic");
    let run = dir.join("run");
    common::assert_ok(&saved_run(&run, &["--model", "gpt2-tiny"]));
    let quantized = dir.join("q");
    let save = [
        "generate",
        "--model",
        run.to_str().unwrap(),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "1",
        "--weights",
        "int8",
        "--save-quantized",
        quantized.to_str().unwrap(),
    ];
    common::assert_ok(&frugal(&save));
    let file = quantized.join("weights.frugal");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[..8].copy_from_slice(b"NOTMAGIC");
    std::fs::write(&file, bytes).unwrap();
    let out = frugal(&[
        "generate",
        "--model",
        quantized.to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    fails_with(&out, "frugal generate --save-quantized DIR");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("`frugal quantize"), "{err}");
}

/// A NaN in a saved model's weights is refused on load by `generate` and `train`, naming the
/// tensor that holds it (it printed "!!!!" and blamed the learning rate).
#[test]
fn non_finite_weights_are_refused_by_generate_and_train_naming_the_tensor() {
    let dir = common::temp_dir("robust-cli", "nan");
    let run = dir.join("run");
    common::assert_ok(&saved_run(&run, &["--model", "gpt2-tiny"]));
    // The tensor whose data ends the file: its last element becomes a NaN.
    let file = run.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let last = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .max_by_key(|(_, t)| t["data_offsets"][1].as_u64().unwrap())
        .map(|(name, _)| name.clone())
        .unwrap();
    let end = bytes.len();
    bytes[end - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let model = run.to_str().unwrap();
    let generate = [
        "generate",
        "--model",
        model,
        "--prompt",
        "hi",
        "--weights",
        "f32",
    ];
    fails_with(&frugal(&generate), &last);
    let train = [
        "train",
        "--model",
        model,
        "--steps",
        "1",
        "--sample-tokens",
        "0",
    ];
    fails_with(&frugal(&train), &last);
}

/// `bench quality` over a model whose matrices no group size divides skips the grouped formats
/// once each, saying why, and scores the rest (it said "use a group size that divides it", and
/// has no group flag).
#[test]
fn bench_quality_skips_the_groups_a_model_cannot_take_saying_why() {
    let dir = common::temp_dir("robust-cli", "quality");
    let run = dir.join("run");
    common::assert_ok(&saved_run(&run, &["--model", "llama-tiny"]));
    let args = [
        "bench",
        "quality",
        "--model",
        run.to_str().unwrap(),
        "--windows",
        "2",
        "--seq",
        "32",
    ];
    let out = frugal(&args);
    common::assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    let skip = "skipped int4 in groups of 32: the group does not divide every matrix's columns \
                (no group size does)";
    assert_eq!(err.matches(skip).count(), 1, "{err}");
    assert!(!err.contains("--weight-group"), "{err}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.lines().any(|l| l.starts_with("int8 ")), "{table}");
}

/// What `train` refuses, `plan --runtime frugal` (the engine's own plan) refuses too, and for the
/// same reason: the plan never promises a setup the engine cannot run.
#[test]
fn the_engines_plan_refuses_what_train_refuses() {
    // (flags, plan's reason, train's reason)
    let cases: [(&[&str], &str, &str); 6] = [
        (
            &["--precision", "pure-bf16"],
            "precision policy",
            "precision policies",
        ),
        (
            &["--optimizer", "sgd", "--precision", "bf16"],
            "optimizer other than adamw",
            "optimizer other than adamw",
        ),
        (
            &["--offload", "params"],
            "parameter offload",
            "use none, optimizer",
        ),
        (
            &["--offload", "optimizer", "--precision", "fp32"],
            "use --precision bf16 or fp16",
            "needs --precision bf16 or fp16",
        ),
        (
            &["--seq", "4096"],
            "use --seq 256 or less",
            "use --seq 256 or less",
        ),
        (
            &["--optimizer", "adamw8bit"],
            "optimizer other than adamw",
            "trains with adamw or sgd",
        ),
    ];
    for (flags, plan_why, train_why) in cases {
        let plan = [
            &[
                "plan",
                "--model",
                "gpt2-tiny",
                "--train",
                "--runtime",
                "frugal",
            ],
            flags,
        ]
        .concat();
        fails_with(&frugal(&plan), plan_why);
        let train = [&common::tiny_step(&["--sample-tokens", "0"])[..], flags].concat();
        fails_with(&frugal(&train), train_why);
    }
}
