//! `frugal train --precision bf16|fp16 [--loss-scaler torch|deepspeed]`: planned == measured
//! per category and equal to `frugal plan --runtime frugal --precision P`, model state 16Ψ, the
//! fp16 report's scale, skipped steps and underflow; bad values and combinations exit 2;
//! `frugal bench train --precision` runs and reports the precision it is given.

mod common;

use common::{frugal, json};
use serde_json::Value;

fn small_text(test: &str) -> String {
    common::small_text("prec-cli", test, 20_000)
}

const SHAPE: [&str; 6] = ["--model", "gpt2-tiny", "--batch", "1", "--seq", "16"];

fn train(data: &str, extra: &[&str]) -> Value {
    let mut args = common::short_train("3", data);
    args.push("--json");
    args.extend(SHAPE);
    args.extend(extra);
    json(&frugal(&args))
}

#[test]
fn bf16_and_fp16_measure_their_plan_and_the_plan_command_agrees() {
    let data = small_text("plan");
    for (precision, scaler) in [("bf16", None), ("fp16", Some("deepspeed"))] {
        let mut extra = vec!["--precision", precision];
        extra.extend(scaler.iter().flat_map(|s| ["--loss-scaler", *s]));
        let run = train(&data, &extra);
        let rank = &run["ranks"][0];
        assert_eq!(rank["planned"], rank["measured"], "{precision}");
        let mut plan_args = vec!["plan", "--train", "--runtime", "frugal", "--json"];
        plan_args.extend(SHAPE);
        plan_args.extend(["--precision", precision]);
        let plan = json(&frugal(&plan_args));
        let fields = [
            "params_bytes",
            "grads_bytes",
            "optimizer_bytes",
            "peak_bytes",
        ];
        for f in fields {
            assert_eq!(plan["per_device"][f], rank["planned"][f], "{precision} {f}");
        }
        let z = &run["zero"];
        assert_eq!(
            z["model_state_bytes"], z["sixteen_psi_over_n_bytes"],
            "16 bytes/param"
        );
        let p = &run["precision"];
        assert_eq!(p["precision"], precision);
        if precision == "fp16" {
            assert_eq!(p["loss_scaler"], "deepspeed");
            assert_eq!(p["loss_scale"], 65536.0);
            assert_eq!(p["skipped_steps"], 0);
            let u = &p["underflow"];
            assert!(u["values"].as_u64().unwrap() > 0, "{u}");
            assert!(
                u["flushed_to_zero_fraction"].as_f64().unwrap() < 0.01,
                "{u}"
            );
        } else {
            assert!(p["loss_scale"].is_null());
        }
    }
}

#[test]
fn offload_moves_the_optimizer_off_the_device_by_the_plans_bytes() {
    let data = small_text("offload");
    let base = train(&data, &["--precision", "bf16"]);
    let device_peak = base["ranks"][0]["measured"]["peak_bytes"].as_u64().unwrap();
    let dir = std::env::temp_dir().join(format!("frugal-prec-off-{}", std::process::id()));
    let out = dir.display().to_string();
    for mode in ["optimizer", "optimizer:disk"] {
        let run = train(
            &data,
            &[
                "--precision",
                "bf16",
                "--offload",
                mode,
                "--out",
                &out,
                "--overwrite",
            ],
        );
        let rank = &run["ranks"][0];
        assert_eq!(rank["planned"], rank["measured"], "{mode}");
        let off = &run["offload"];
        let host = off["planned_host_bytes"].as_u64().unwrap();
        let peak = rank["measured"]["peak_bytes"].as_u64().unwrap();
        assert_eq!(
            device_peak - peak,
            host,
            "{mode}: the device drops the host's bytes"
        );
        assert_eq!(rank["measured"]["optimizer_bytes"], 0);
        assert!(off["host_store_bytes"].as_u64().unwrap() >= host, "{off}");
        assert_eq!(off["path"].is_null(), mode == "optimizer", "{off}");
        assert_eq!(
            run["loss_last"], base["loss_last"],
            "{mode}: same arithmetic"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn fails_with(args: &[&str], needle: &str) {
    common::fails_with(&frugal(args), needle);
}

#[test]
fn bad_precisions_and_scalers_exit_2() {
    let base = common::tiny_step(&["--seq", "8"]);
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    fails_with(
        &with(&["--precision", "fp8"]),
        "invalid value 'fp8' for '--precision",
    );
    let bad_scaler = ["--precision", "fp16", "--loss-scaler", "apex"];
    fails_with(
        &with(&bad_scaler),
        "invalid value 'apex' for '--loss-scaler",
    );
    let bf16_scaler = ["--precision", "bf16", "--loss-scaler", "torch"];
    fails_with(&with(&bf16_scaler), "needs --precision fp16");
    fails_with(&with(&["--loss-scaler", "torch"]), "needs --precision fp16");
    fails_with(&with(&["--offload", "optimizer"]), "needs --precision bf16");
    let empty = ["--precision", "bf16", "--offload", "optimizer:disk="];
    fails_with(
        &with(&empty),
        "invalid value 'optimizer:disk=' for '--offload",
    );
    fails_with(
        &with(&["--offload", "gpu"]),
        "invalid value 'gpu' for '--offload",
    );
    let sgd = ["--precision", "bf16", "--optimizer", "sgd"];
    fails_with(&with(&sgd), "adamw");
}

/// `frugal bench train --precision` times the step `frugal train --precision` runs and says so.
#[test]
fn bench_train_times_the_precision_it_is_given() {
    for precision in ["fp32", "bf16"] {
        let mut args = vec!["bench", "train", "--steps", "1", "--json"];
        args.extend(["--model", "gpt2-tiny", "--batch", "1", "--seq", "16"]);
        args.extend(["--precision", precision]);
        let v = json(&frugal(&args));
        assert_eq!(v["precision"], precision);
        assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0, "{precision}");
    }
    let bad = ["bench", "train", "--model", "gpt2-tiny", "--steps", "1"];
    let bad = [&bad[..], &["--precision", "fp8"]].concat();
    fails_with(&bad, "invalid value 'fp8' for '--precision");
}
