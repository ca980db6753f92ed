//! `frugal train --ranks N --tp T --pp P [--sp]`: tensor-parallel ranks and pipeline stages
//! follow the single rank's losses on the same global batch, each rank measures exactly its own
//! plan, and `frugal plan --runtime frugal --tp T --pp P` prints those peaks; the saved model is
//! the whole model (HF names and shapes); bad splits are refused naming the numbers.

mod common;

use common::{fails_with, frugal, json, PLAN_FRUGAL_FP32 as PLAN, TINY_2X32 as SHAPE};
use serde_json::Value;

fn small_text(test: &str) -> String {
    common::small_text("parallel-cli", test, 20_000)
}

fn train(data: &str, extra: &[&str]) -> Value {
    let mut args = common::short_train("4", data);
    args.extend(SHAPE);
    args.push("--json");
    args.extend(extra);
    json(&frugal(&args))
}

fn close(a: &Value, b: &Value, what: &str) {
    let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
    assert!((a - b).abs() <= 1e-5 * b.abs(), "{what}: {a} vs {b}");
}

#[test]
fn tensor_parallel_training_follows_one_rank_and_measures_its_plan() {
    let data = small_text("follow");
    // The same global batch: one replica of --batch rows, or two.
    let (one, two) = (train(&data, &[]), train(&data, &["--ranks", "2"]));
    let dir = common::temp_dir("parallel-cli", "follow-out");
    let out = dir.join("model");
    let out_arg = out.to_str().unwrap();
    for extra in [
        vec!["--ranks", "2", "--tp", "2", "--out", out_arg],
        vec!["--ranks", "2", "--tp", "2", "--sp"],
        vec!["--ranks", "4", "--tp", "2", "--zero", "1"],
    ] {
        let tp = train(&data, &extra);
        let what = extra.join(" ");
        let one = if extra[1] == "4" { &two } else { &one };
        close(&tp["loss_first"], &one["loss_first"], &what);
        close(&tp["loss_last"], &one["loss_last"], &what);
        close(&tp["val_loss"], &one["val_loss"], &what);
        let ranks = tp["ranks"].as_array().unwrap();
        assert_eq!(ranks.len().to_string(), extra[1], "{what}");
        for r in ranks {
            assert_eq!(r["planned"], r["measured"], "{what}: rank {}", r["rank"]);
        }
        // GPT-2's 50257 ids split 25129 + 25128: rank 1 holds one embedding row less.
        let peak = |i: usize| ranks[i]["measured"]["peak_bytes"].as_u64().unwrap();
        assert!(peak(1) < peak(0), "{what}");
        let mut plan = PLAN.to_vec();
        plan.extend(SHAPE);
        let dp = (ranks.len() / 2).to_string();
        let at = extra.iter().position(|&a| a == "--zero");
        let zero = at.map_or("0", |i| extra[i + 1]);
        plan.extend(["--tp", "2", "--gpus", &dp, "--zero", zero, "--json"]);
        if extra.contains(&"--sp") {
            plan.push("--sp");
        }
        let planned = json(&frugal(&plan));
        assert_eq!(
            planned["per_device"]["peak_bytes"].as_u64(),
            Some(peak(0)),
            "{what}"
        );
    }
    // The saved model is the whole model, as one rank saves it.
    let config = std::fs::read_to_string(out.join("config.json")).unwrap();
    assert!(
        config.contains("\"n_head\": 4") || config.contains("\"n_head\":4"),
        "{config}"
    );
    let weights = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&weights).unwrap();
    let wte = st.tensor("transformer.wte.weight").unwrap();
    assert_eq!(wte.shape(), [50257, 64]);
    let c_attn = st.tensor("transformer.h.0.attn.c_attn.weight").unwrap();
    assert_eq!(c_attn.shape(), [64, 192]);
}

/// The safetensors file's tensors, by name.
fn tensors(path: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<u8>)> = (st.tensors().into_iter())
        .map(|(name, t)| (name, t.data().to_vec()))
        .collect();
    out.sort();
    out
}

#[test]
fn pipeline_stages_follow_one_rank_and_every_stage_measures_its_plan() {
    let data = small_text("pipeline");
    let dir = common::temp_dir("parallel-cli", "pipeline-out");
    let (one_out, pp_out) = (dir.join("one"), dir.join("pp"));
    // GPT-2 ties its head to the embedding: the last stage holds a copy.
    let micro = ["--grad-accum", "4"];
    let mut one_args = micro.to_vec();
    one_args.extend(["--out", one_out.to_str().unwrap()]);
    let one = train(&data, &one_args);
    let mut pp_args = micro.to_vec();
    pp_args.extend([
        "--ranks",
        "2",
        "--pp",
        "2",
        "--out",
        pp_out.to_str().unwrap(),
    ]);
    let pp = train(&data, &pp_args);
    for field in ["loss_first", "loss_last", "val_loss"] {
        close(&pp[field], &one[field], field);
    }
    // Each stage measured its own plan, and `frugal plan` lists exactly those peaks.
    let mut plan = PLAN.to_vec();
    plan.extend(SHAPE);
    plan.extend(["--pp", "2", "--grad-accum", "4", "--json"]);
    let planned = json(&frugal(&plan));
    let stages = planned["rank_peaks"].as_array().unwrap();
    let ranks = pp["ranks"].as_array().unwrap();
    assert_eq!(stages.len(), 2);
    for (r, s) in ranks.iter().zip(stages) {
        assert_eq!(r["planned"], r["measured"], "rank {}", r["rank"]);
        assert_eq!(
            r["measured"]["peak_bytes"], s["peak_bytes"],
            "stage {}",
            s["stage"]
        );
    }
    // The first stage stashes a micro-batch in flight; the last holds the head instead.
    assert_ne!(stages[0]["peak_bytes"], stages[1]["peak_bytes"]);
    // The saved model is the whole model: the same tensors, names and shapes as one rank's.
    let (a, b) = (
        tensors(&one_out.join("model.safetensors")),
        tensors(&pp_out.join("model.safetensors")),
    );
    assert_eq!(
        a.iter().map(|t| &t.0).collect::<Vec<_>>(),
        b.iter().map(|t| &t.0).collect::<Vec<_>>()
    );
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let f = |v: &[u8]| {
            v.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>()
        };
        let diff = f(x)
            .iter()
            .zip(f(y))
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f32::max);
        assert!(diff < 1e-4, "{name} differs by {diff}");
    }
}

#[test]
fn a_tensor_parallel_snapshot_resumes_on_pipeline_stages_and_one_rank() {
    let data = small_text("snapshot");
    let dir = common::temp_dir("parallel-cli", "snapshot-out");
    let out = dir.join("run");
    let out = out.to_str().unwrap();
    let whole = train(&data, &[]);
    let save = [
        "--ranks",
        "2",
        "--tp",
        "2",
        "--save-every",
        "2",
        "--out",
        out,
    ];
    let saved = train(&data, &save);
    close(&saved["loss_last"], &whole["loss_last"], "tp 2");
    let snap = format!("{out}/step-000002");
    for layout in [
        vec!["--ranks", "2", "--pp", "2"],
        vec![],
        vec!["--ranks", "4", "--tp", "2", "--pp", "2", "--sp"],
    ] {
        let mut args = vec!["--resume", &snap];
        args.extend(layout.iter().copied());
        let resumed = train(&data, &args);
        let what = format!("resumed on {layout:?}");
        close(&resumed["loss_last"], &whole["loss_last"], &what);
        close(&resumed["val_loss"], &whole["val_loss"], &what);
    }
    // The snapshot is the whole model: `frugal export` writes it as a Hugging Face folder.
    let hf = dir.join("hf");
    let export = frugal(&["export", &snap, "--hf", hf.to_str().unwrap()]);
    common::assert_ok(&export);
    assert_eq!(
        tensors(&hf.join("model.safetensors")),
        tensors(&std::path::Path::new(&snap).join("model.safetensors"))
    );
}

#[test]
fn every_layout_starts_from_a_saved_model_folder() {
    let data = small_text("from-folder");
    let dir = common::temp_dir("parallel-cli", "from-folder-out");
    let saved = dir.join("saved");
    let saved = saved.to_str().unwrap();
    train(&data, &["--out", saved]);
    // --model DIR names the folder; the other flags as `train` gives them (SHAPE's model last
    // would win, so these runs spell their own).
    let from = |extra: &[&str]| {
        let mut args = common::short_train("2", &data);
        args.extend(["--model", saved, "--batch", "2", "--seq", "32", "--json"]);
        args.extend(extra);
        json(&frugal(&args))
    };
    let one = from(&[]);
    let fresh = train(&data, &[]);
    assert_ne!(
        one["loss_first"], fresh["loss_first"],
        "the folder's weights are loaded"
    );
    for extra in [
        vec!["--ranks", "2", "--tp", "2", "--sp"],
        vec!["--ranks", "2", "--pp", "2"],
    ] {
        let run = from(&extra);
        close(&run["loss_first"], &one["loss_first"], &extra.join(" "));
    }
    // ZeRO-3 holds only shards of the weights: it starts where ZeRO-0 on as many ranks does.
    let (z0, z3) = (
        from(&["--ranks", "2"]),
        from(&["--ranks", "2", "--zero", "3"]),
    );
    assert_eq!(z3["loss_first"], z0["loss_first"]);
    assert_eq!(z3["loss_last"], z0["loss_last"]);
    // bf16 with the optimizer state offloaded to a file per rank (the two tensor-parallel
    // ranks share a data-parallel rank, not a file) trains as with it in the arena.
    let two = ["--ranks", "2", "--tp", "2", "--precision", "bf16"];
    let (arena, disk) = (
        from(&two),
        from(&[&two[..], &["--offload", "optimizer:disk"]].concat()),
    );
    assert_eq!(arena["loss_last"], disk["loss_last"]);
    // bf16 starts from the same weights, rounded: its first loss within bf16's error.
    let bf16 = from(&["--precision", "bf16"]);
    let (a, b) = (
        bf16["loss_first"].as_f64().unwrap(),
        one["loss_first"].as_f64().unwrap(),
    );
    assert!((a - b).abs() < 2e-2 * b, "bf16 {a} vs {b}");
}

#[test]
fn splits_that_do_not_divide_are_refused_naming_the_numbers() {
    let data = small_text("refuse");
    let run = |extra: &[&str]| {
        let mut args = vec!["train", "--steps", "1", "--data", &data];
        args.extend(SHAPE);
        args.extend(extra);
        frugal(&args)
    };
    fails_with(
        &run(&["--ranks", "3", "--tp", "2"]),
        "--ranks 3 is not a multiple of --tp 2",
    );
    fails_with(
        &run(&["--ranks", "3", "--tp", "3"]),
        "4 attention heads do not split over --tp 3",
    );
    fails_with(
        &run(&["--ranks", "2", "--tp", "2", "--lora-rank", "4"]),
        "--lora-rank with --tp 2 --pp 1",
    );
    let mut plan = PLAN.to_vec();
    plan.extend(["--model", "llama-tiny"]);
    // 2 key/value heads over 4 ranks replicate (each on 2); over 8 the query heads do not split.
    plan.extend(["--json", "--tp"]);
    let four = frugal(&[&plan[..], &["4"]].concat());
    common::assert_ok(&four);
    fails_with(
        &frugal(&[&plan[..], &["8"]].concat()),
        "4 attention heads do not split over --tp 8",
    );
    fails_with(
        &run(&["--ranks", "2", "--sp"]),
        "use it with --tp 2 or more",
    );
    let mut odd = PLAN.to_vec();
    odd.extend(["--model", "gpt2-tiny"]);
    odd.extend(["--tp", "4", "--sp", "--seq", "30"]);
    fails_with(&frugal(&odd), "--seq 30 must be a multiple of --tp 4");
    fails_with(
        &run(&["--ranks", "3", "--pp", "3"]),
        "--pp 3 stages over 2 layers",
    );
    let tied = ["--ranks", "2", "--pp", "2", "--precision", "bf16"];
    fails_with(&run(&tied), "a tied embedding (GPT-2) over pipeline stages");
    fails_with(
        &run(&["--ranks", "3", "--tp", "2", "--pp", "2"]),
        "--tp 2 x --pp 2 = 4",
    );
}
