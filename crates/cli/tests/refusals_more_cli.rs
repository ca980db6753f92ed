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
    let amp = [
        "train",
        "--model",
        "gpt2-tiny",
        "--steps",
        "1",
        "--precision",
        "amp-bf16",
    ];
    fails_with(&frugal(&amp), "precision policies");
}

/// One step of gpt2-tiny saved at every step into `out`, plus `extra`.
fn saved_run(out: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let base = [
        "train",
        "--steps",
        "1",
        "--batch",
        "1",
        "--seq",
        "16",
        "--sample-tokens",
        "0",
        "--val-batches",
        "1",
        "--save-every",
        "1",
        "--out",
    ];
    frugal(&[&base[..], &[out.to_str().unwrap()], extra].concat())
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
    let resume = [
        "train",
        "--model",
        "gpt2-tiny",
        "--steps",
        "1",
        "--resume",
        step.to_str().unwrap(),
    ];
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
    fails_with(&gen(&["--draft-tokens", "3"]), "--draft");
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
