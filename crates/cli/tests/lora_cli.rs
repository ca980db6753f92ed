//! `frugal train --lora-*` end to end: a QLoRA run over a base trained here writes PEFT's files,
//! measures exactly what `frugal plan --runtime frugal` plans, and reports the base's validation
//! loss first; bad LoRA flags end with exit code 2 and a message naming the fix.

mod common;

use common::{fails_with, frugal, json, small_text, temp_dir};

fn train(args: &[&str]) -> std::process::Output {
    let mut all = vec!["train", "--sample-tokens", "0", "--val-batches", "1"];
    all.extend_from_slice(args);
    frugal(&all)
}

#[test]
fn qlora_over_a_saved_base_writes_peft_files_and_measures_the_plan() {
    let dir = temp_dir("lora-cli", "qlora");
    let data = small_text("lora-cli", "qlora-data", 40_000);
    let base = dir.join("base");
    let (b, adapters) = (base.to_str().unwrap(), dir.join("adapters"));
    let shape = ["--batch", "2", "--seq", "32", "--data", &data];
    let mut args = vec!["--model", "gpt2-tiny", "--steps", "3", "--out", b];
    args.extend(shape);
    json(&train(&[&args[..], &["--json"]].concat()));
    let lora = [
        "--lora-rank",
        "4",
        "--lora-alpha",
        "8",
        "--lora-base",
        "nf4",
        "--double-quant",
        "--lora-targets",
        "c_attn,c_fc",
    ];
    let mut args = vec![
        "--model",
        b,
        "--steps",
        "4",
        "--val-every",
        "4",
        "--merge",
        "--json",
        "--save-every",
        "4",
    ];
    args.extend(["--out", adapters.to_str().unwrap()]);
    args.extend(shape);
    args.extend(lora);
    let v = json(&train(&args));
    let rank = &v["ranks"][0];
    for field in common::CATEGORY_FIELDS.into_iter().chain(["peak_bytes"]) {
        let planned = rank["planned"][field].as_u64().expect(field);
        assert_eq!(rank["measured"][field].as_u64(), Some(planned), "{field}");
    }
    // The base's validation loss (step 0) comes first, then the fine-tuned one.
    let curve = v["val_curve"].as_array().unwrap();
    assert_eq!(curve[0][0], 0);
    assert_eq!(curve.len(), 2);
    for file in [
        "adapter_model.safetensors",
        "adapter_config.json",
        "merged/model.safetensors",
    ] {
        assert!(adapters.join(file).exists(), "{file}");
    }
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapters.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["r"], 4);
    assert_eq!(
        config["target_modules"],
        serde_json::json!(["c_attn", "c_fc"])
    );
    // `frugal export --merge` of the run's snapshot writes the same merged model, from the
    // base's HF weights and the snapshot's adapters (no arena).
    let (snap, exported) = (adapters.join("step-000004"), dir.join("exported"));
    let export = [
        "export",
        snap.to_str().unwrap(),
        "--merge",
        "--base",
        b,
        "--hf",
        exported.to_str().unwrap(),
    ];
    let out = frugal(&export);
    common::assert_ok(&out);
    let read = |p: std::path::PathBuf| std::fs::read(p).unwrap();
    assert!(
        read(exported.join("model.safetensors")) == read(adapters.join("merged/model.safetensors")),
        "export --merge and train --merge write the same model"
    );
    let plain = [
        "export",
        snap.to_str().unwrap(),
        "--hf",
        exported.to_str().unwrap(),
    ];
    fails_with(&frugal(&plain), "--merge --base");
    // The planner's frugal runtime gives the same peak for the same run.
    let config_json = base.join("config.json");
    let mut plan = vec!["plan", "--model", config_json.to_str().unwrap(), "--train"];
    plan.extend([
        "--runtime",
        "frugal",
        "--precision",
        "fp32",
        "--batch",
        "2",
        "--seq",
        "32",
    ]);
    plan.extend(["--json", "--attention", "flash"]);
    plan.extend(lora.iter().filter(|f| !["--lora-alpha", "8"].contains(f)));
    let p = json(&frugal(&plan));
    assert_eq!(
        p["per_device"]["peak_bytes"],
        rank["measured"]["peak_bytes"]
    );
}

#[test]
fn bad_lora_flags_say_what_to_fix() {
    let data = small_text("lora-cli", "bad", 20_000);
    let run = [&common::TINY_1X16[..], &["--steps", "1", "--data", &data]].concat();
    let with = |extra: &[&str]| train(&[&run[..], extra].concat());
    fails_with(&with(&["--double-quant"]), "needs --lora-rank");
    fails_with(&with(&["--lora-rank", "0"]), "--lora-rank 0");
    fails_with(
        &with(&["--lora-rank", "4", "--double-quant"]),
        "--lora-base nf4",
    );
    fails_with(
        &with(&["--lora-rank", "4", "--lora-targets", "q_proj"]),
        "is not a linear layer",
    );
    let bench = [
        "bench",
        "train",
        "--lora-rank",
        "4",
        "--baseline",
        "pytorch",
    ];
    fails_with(&frugal(&bench), "no PyTorch LoRA baseline");
    fails_with(
        &frugal(&["bench", "comm", "--mib", "100000000"]),
        "use a smaller --mib",
    );
    fails_with(
        &with(&["--lora-rank", "4", "--lora-alpha=-1"]),
        "--lora-alpha",
    );
    fails_with(
        &with(&["--lora-rank", "4", "--merge"]),
        "--merge needs --out",
    );
    fails_with(&with(&["--lora-rank", "4", "--lora-base", "int4"]), "not a");
}

#[test]
fn a_lora_run_resumes_from_its_snapshot_on_the_same_trajectory() {
    let dir = temp_dir("lora-cli", "resume");
    let data = small_text("lora-cli", "resume-data", 40_000);
    let (a, b) = (dir.join("a"), dir.join("b"));
    let run = [
        "--model",
        "gpt2-tiny",
        "--steps",
        "4",
        "--batch",
        "2",
        "--seq",
        "32",
        "--data",
        &data,
        "--lora-rank",
        "4",
        "--lora-base",
        "int8",
        "--val-every",
        "4",
        "--json",
    ];
    let whole = json(&train(
        &[
            &run[..],
            &["--save-every", "2", "--out", a.to_str().unwrap()],
        ]
        .concat(),
    ));
    let snap = a.join("step-000002");
    let resumed = [
        &run[..],
        &[
            "--out",
            b.to_str().unwrap(),
            "--resume",
            snap.to_str().unwrap(),
        ],
    ]
    .concat();
    let resumed = json(&train(&resumed));
    assert_eq!(resumed["loss_last"], whole["loss_last"]);
    assert_eq!(resumed["val_loss"], whole["val_loss"]);
    // Another rank is another run: refused, naming the difference.
    let mut other: Vec<&str> = run
        .iter()
        .map(|f| if *f == "4" { "2" } else { f })
        .collect();
    other[3] = "4"; // keep --steps 4: only the rank changes
    other.extend([
        "--out",
        b.to_str().unwrap(),
        "--overwrite",
        "--resume",
        snap.to_str().unwrap(),
    ]);
    fails_with(&train(&other), "run.lora");
}

/// A LoRA snapshot records a fingerprint of its base's weights: resuming it on another saved
/// model of the same shape is refused naming `run.lora.base_weights`; on its own base it runs.
#[test]
fn a_lora_resume_or_merge_on_another_base_is_refused_naming_the_base_weights() {
    let dir = temp_dir("lora-cli", "base-identity");
    let data = small_text("lora-cli", "base-identity-data", 40_000);
    let short = [
        "--steps", "1", "--batch", "2", "--seq", "32", "--data", &data,
    ];
    let mut bases = Vec::new();
    for seed in ["1", "2"] {
        let out = dir.join(format!("base{seed}"));
        let args = [
            &["--model", "gpt2-tiny", "--seed", seed][..],
            &short[..],
            &["--out", out.to_str().unwrap()][..],
        ]
        .concat();
        json(&train(&[&args[..], &["--json"][..]].concat()));
        bases.push(out);
    }
    let snaps = dir.join("lora");
    let lora = |base: &std::path::Path, extra: &[&str]| {
        let args = [
            &["--model", base.to_str().unwrap(), "--lora-rank", "4"][..],
            &[
                "--steps", "2", "--batch", "2", "--seq", "32", "--data", &data,
            ][..],
            extra,
        ]
        .concat();
        train(&args)
    };
    json(&lora(
        &bases[0],
        &[
            "--save-every",
            "1",
            "--out",
            snaps.to_str().unwrap(),
            "--json",
        ],
    ));
    let snap = snaps.join("step-000001");
    let resumed = dir.join("resumed");
    let other = lora(
        &bases[1],
        &[
            "--resume",
            snap.to_str().unwrap(),
            "--out",
            resumed.to_str().unwrap(),
        ],
    );
    fails_with(&other, "run.lora.base_weights");
    // Merging the adapters onto another base of the same shape is refused the same way.
    let merged = dir.join("merged");
    let merge = |base: &std::path::Path| {
        frugal(&[
            "export",
            snap.to_str().unwrap(),
            "--merge",
            "--base",
            base.to_str().unwrap(),
            "--hf",
            merged.to_str().unwrap(),
        ])
    };
    fails_with(&merge(&bases[1]), "trained its adapters over");
    common::assert_ok(&merge(&bases[0]));
    let same = lora(
        &bases[0],
        &[
            "--resume",
            snap.to_str().unwrap(),
            "--out",
            resumed.to_str().unwrap(),
            "--json",
        ],
    );
    json(&same);
    // The adapter file records the same fingerprint and the base's config in its metadata.
    let bytes = std::fs::read(resumed.join("adapter_model.safetensors")).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let meta = &header["__metadata__"];
    let state = std::fs::read_to_string(snap.join("train.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert!(meta["frugal.base_weights"].is_string(), "{meta}");
    assert_eq!(
        meta["frugal.base_weights"],
        state["run"]["lora"]["base_weights"]
    );
    assert!(meta["frugal.base_config"]
        .as_str()
        .unwrap()
        .contains("\"n_layer\""));
    assert_eq!(meta["format"], "pt");
}
