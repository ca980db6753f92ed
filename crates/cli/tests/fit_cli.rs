//! `frugal fit` end to end: the table and the JSON object for the classic cases, and every bad
//! input ending with exit code 2 and a message naming the flag and the fix.

mod common;

use serde_json::Value;
use std::process::{Command, Output};

fn frugal(args: &[&str]) -> Output {
    let mut all = vec!["fit"];
    all.extend_from_slice(args);
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(&all)
        .output()
        .expect("run frugal")
}

fn json(args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    common::json(&frugal(&all))
}

const LLAMA2_8X80: [&str; 12] = [
    "--model",
    "llama2-7b",
    "--gpus",
    "8",
    "--device-memory",
    "80GB",
    "--batch",
    "32",
    "--seq",
    "2048",
    "--tp",
    "1",
];

#[test]
fn table_shows_the_best_and_why_the_rest_miss() {
    let out = frugal(&LLAMA2_8X80);
    common::assert_ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "weighed ",
        "best setups",
        "headroom",
        "tokens/s",
        "bottleneck",
        "remedies of #1, in the usual order (micro-batch, recompute, ZeRO, offload, flash attention): 3. ZeRO stage",
        "plan it: frugal plan --model llama2-7b --train --runtime formula --gpu h100 --precision bf16 --optimizer adamw --gpus 8",
        "why the rest don't fit",
        "no remedy",
        "(largest: optimizer",
    ] {
        assert!(text.contains(want), "missing '{want}' in\n{text}");
    }
}

/// Runs `frugal plan` as fit printed it and returns its JSON report.
fn plan_report(command: &str) -> Value {
    let mut words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(words.remove(0), "frugal");
    words.push("--json");
    let out = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(&words)
        .output()
        .expect("run frugal plan");
    common::json(&out)
}

/// Runs `frugal plan` as fit printed it and returns its total.
fn plan_total(command: &str) -> u64 {
    plan_report(command)["per_device"]["total_bytes"]
        .as_u64()
        .unwrap()
}

#[test]
fn every_printed_plan_command_reproduces_fits_total() {
    let cases: [&[&str]; 4] = [
        &LLAMA2_8X80,
        &[
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
            "--device-memory",
            "80GiB",
            "--batch",
            "32",
        ],
        &[
            "--model",
            "llama2-70b",
            "--gpus",
            "8",
            "--device-memory",
            "80GiB",
            "--batch",
            "8",
        ],
        &[
            "--model",
            "gpt2-124m",
            "--gpus",
            "1",
            "--device-memory",
            "24GiB",
            "--batch",
            "8",
            "--seq",
            "1024",
            "--runtime",
            "pytorch",
            "--precision",
            "amp-bf16",
        ],
    ];
    for case in cases {
        let mut args = case.to_vec();
        args.extend(["--top", "5"]);
        let v = json(&args);
        let best = v["best"].as_array().unwrap();
        assert!(!best.is_empty(), "{case:?}: nothing fits");
        for b in best {
            let fit_total = b["total_bytes"].as_u64().unwrap();
            let command = b["plan_command"].as_str().unwrap();
            let report = plan_report(command);
            let total = report["per_device"]["total_bytes"].as_u64().unwrap();
            let off = (total as f64 - fit_total as f64).abs() / fit_total as f64;
            assert!(off <= 0.01, "{command}: plan {total} vs fit {fit_total}");
            // plan predicts the step time fit ranked by.
            assert_eq!(report["step_time"]["step_s"], b["step_s"], "{command}");
        }
    }
}

#[test]
fn json_holds_the_contract() {
    let mut args = LLAMA2_8X80.to_vec();
    args.extend(["--top", "3"]);
    let v = json(&args);
    let weighed = v["candidates_weighed"].as_u64().unwrap();
    let fitting = v["fitting_count"].as_u64().unwrap();
    let too_big = v["too_big_count"].as_u64().unwrap();
    assert_eq!(
        weighed,
        fitting + too_big + v["unsupported_count"].as_u64().unwrap()
    );
    let best = v["best"].as_array().unwrap();
    assert_eq!(best.len(), 3);
    let cap = v["device_memory_bytes"].as_u64().unwrap();
    assert_eq!(cap, 80_000_000_000);
    for b in best {
        let pd = &b["per_device"];
        let total = pd["total_bytes"].as_u64().unwrap();
        assert!(total <= cap);
        assert_eq!(b["headroom_bytes"].as_u64().unwrap(), cap - total);
        let sum: u64 = common::CATEGORY_FIELDS
            .iter()
            .map(|k| pd[k].as_u64().unwrap())
            .sum();
        assert_eq!(sum, pd["peak_bytes"].as_u64().unwrap());
        let s = &b["setup"];
        let batch = s["dp"].as_u64().unwrap()
            * s["micro_batch"].as_u64().unwrap()
            * s["grad_accum"].as_u64().unwrap();
        assert_eq!(batch, 32);
        assert!(b["step_s"].as_f64().unwrap() > 0.0);
        assert!(b["tokens_per_s"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(best[0]["setup"]["zero"], "zero1");
    assert_eq!(best[0]["flags"], "--zero 1");
    let groups = v["rejections"]["groups"].as_array().unwrap();
    assert_eq!(groups[0]["remedies"].as_array().unwrap().len(), 0);
    assert!(groups[0]["closest_total_bytes"].as_u64().unwrap() > cap);
    assert_eq!(groups[0]["largest_category"], "optimizer_bytes");
}

#[test]
fn lora_only_when_allowed_and_tokens_as_batch() {
    let base = [
        "--model",
        "llama2-7b",
        "--gpu",
        "rtx4090",
        "--batch-tokens",
        "8192",
        "--seq",
        "1024",
    ];
    let v = json(&base);
    assert_eq!(v["global_batch"], 8);
    assert!(v["best"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b["setup"]["lora"].is_null()));
    let mut with = base.to_vec();
    with.push("--allow-lora");
    let v = json(&with);
    assert!(!v["best"][0]["setup"]["lora"].is_null());
    assert!(v["best"][0]["remedies"]
        .as_array()
        .unwrap()
        .contains(&"lora".into()));
}

#[test]
fn pytorch_runtime_reports_what_it_cannot_model() {
    let v = json(&[
        "--model",
        "gpt2-124m",
        "--device-memory",
        "8GiB",
        "--batch",
        "16",
        "--seq",
        "1024",
        "--runtime",
        "pytorch",
    ]);
    assert_eq!(v["runtime"], "pytorch");
    assert!(v["unsupported_count"].as_u64().unwrap() > 0);
    assert!(v["rejections"]["unsupported"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("pytorch"));
    assert!(v["fitting_count"].as_u64().unwrap() > 0);
}

#[test]
fn help_has_examples() {
    let out = frugal(&["--help"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Examples:") && text.contains("frugal fit --model llama3-8b"));
    assert!(text.contains("2Ψ") && text.contains("--allow-lora"));
}

#[test]
fn bad_input_exits_2_with_the_fix() {
    let cases: [(&[&str], &str); 10] = [
        (
            &["--model", "llama2-7b", "--gpus", "0"],
            "invalid --gpus: must be at least 1",
        ),
        (
            &["--model", "llama2-7b", "--device-memory", "0"],
            "invalid --device-memory: must be more than 0",
        ),
        (
            &["--model", "llama2-7b", "--device-memory", "lots"],
            "invalid --device-memory: 'lots' is not a size: write e.g. 80GiB",
        ),
        (
            &["--model", "llama9-1b"],
            "unknown model 'llama9-1b': use one of",
        ),
        (
            &[
                "--model",
                "llama2-7b",
                "--gpus",
                "8",
                "--batch",
                "30",
                "--tp",
                "1",
                "--pp",
                "1",
            ],
            "invalid --batch: 30 sequences do not split evenly",
        ),
        (
            &["--model", "llama2-7b", "--gpus", "8", "--tp", "3"],
            "invalid --tp",
        ),
        (
            &["--model", "llama2-7b", "--gpu", "v99"],
            "unknown GPU 'v99': use one of h100",
        ),
        (
            &["--model", "llama2-7b", "--runtime", "tensorflow"],
            "invalid --runtime: 'tensorflow' is not a runtime",
        ),
        (
            &[
                "--model",
                "llama2-7b",
                "--batch-tokens",
                "1000",
                "--seq",
                "2048",
            ],
            "invalid --batch-tokens",
        ),
        (
            &["--model", "llama2-7b", "--mfu", "1.5"],
            "invalid --mfu: must be in (0, 1]",
        ),
    ];
    for (args, want) in cases {
        let out = frugal(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: wanted '{want}' in {err}");
    }
}

/// Under the engine's own runtime, the setup `fit` picks trains within the cap
/// and the one it rejects is refused by `frugal train` before step one.
#[test]
fn engine_trains_what_fit_picks_and_refuses_what_it_rejects() {
    let cap = "76000000";
    let v = json(&[
        "--runtime",
        "frugal",
        "--model",
        "gpt2-tiny",
        "--precision",
        "fp32",
        "--attention",
        "eager",
        "--batch",
        "8",
        "--seq",
        "128",
        "--device-memory",
        cap,
    ]);
    let best = &v["best"][0]["setup"];
    let plain = &v["rejections"]["groups"][0];
    assert_eq!(plain["remedies"].as_array().unwrap().len(), 0);
    let rejected = &plain["closest_setup"];
    let train = |s: &Value| {
        let (mb, accum) = (s["micro_batch"].to_string(), s["grad_accum"].to_string());
        // The engine runs recompute and flash attention: the picked setup may use them.
        let recompute = match &s["recompute"] {
            Value::String(r) => r.clone(),
            every => format!("every:{}", every["every"]),
        };
        let attention = s["attention"].as_str().unwrap().to_string();
        Command::new(env!("CARGO_BIN_EXE_frugal"))
            .args([
                "train",
                "--model",
                "gpt2-tiny",
                "--seq",
                "128",
                "--steps",
                "1",
            ])
            .args(["--val-every", "1000", "--sample-tokens", "0", "--json"])
            .args([
                "--batch",
                &mb,
                "--grad-accum",
                &accum,
                "--device-memory",
                cap,
            ])
            .args(["--recompute", &recompute, "--attention", &attention])
            .output()
            .expect("run frugal train")
    };
    let ok = train(best);
    common::assert_ok(&ok);
    let run: Value = serde_json::from_slice(&ok.stdout).expect("train --json");
    let measured = run["ranks"][0]["measured"]["total_bytes"].as_u64().unwrap();
    assert!(measured <= 76_000_000, "{measured}");
    assert_eq!(
        measured,
        v["best"][0]["per_device"]["total_bytes"].as_u64().unwrap()
    );
    let refused = train(rejected);
    assert_eq!(refused.status.code(), Some(2));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("76000000"), "{err}");
}

#[test]
fn infer_advisor_answers_70b_on_one_24gib_card() {
    let v = json(&[
        "--infer",
        "--model",
        "llama2-70b",
        "--device-memory",
        "24GiB",
        "--gpus",
        "1",
    ]);
    let best = v["best"].as_array().unwrap();
    assert!(!best.is_empty());
    // 70B does not fit one 24 GiB card in any format: only offloaded weights do, and the
    // advisor says two GPUs with int4 and --tp 2 serve it on the devices.
    assert!(best.iter().all(|b| b["serving"]["offload"] == true));
    let more = &v["more_gpus"];
    assert_eq!(more["serving"]["tp"], 2);
    assert_eq!(more["serving"]["weights"], "int4");
    assert!(more["total_bytes"].as_u64().unwrap() <= v["usable_bytes"].as_u64().unwrap());
    let decode = best[0]["speed"]["decode_tokens_per_s"].as_f64().unwrap();
    assert!(decode > 0.0 && decode < more["speed"]["decode_tokens_per_s"].as_f64().unwrap());
    // The text names the remedy.
    let out = frugal(&[
        "--infer",
        "--model",
        "llama2-70b",
        "--device-memory",
        "24GiB",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("--tp 2 fits without offload"), "{text}");
}

#[test]
fn infer_advisor_plan_commands_reproduce_its_totals() {
    let v = json(&[
        "--infer",
        "--model",
        "llama3-8b",
        "--gpu",
        "rtx4090",
        "--batch",
        "8",
        "--seq",
        "8192",
        "--top",
        "6",
    ]);
    let best = v["best"].as_array().unwrap();
    assert!(best.len() >= 3);
    for b in best.iter().filter(|b| b["serving"]["offload"] == false) {
        let total = plan_total(b["plan_command"].as_str().unwrap());
        assert_eq!(total, b["total_bytes"].as_u64().unwrap(), "{b}");
        // The largest batch and context are where the next one stops fitting.
        let max_batch = b["max_batch"].as_u64().unwrap();
        assert!(max_batch >= 8 && b["max_seq"].as_u64().unwrap() >= 8192);
        let command = b["plan_command"].as_str().unwrap();
        let at =
            |batch: u64| plan_total(&command.replace("--batch 8", &format!("--batch {batch}")));
        let usable = v["usable_bytes"].as_u64().unwrap();
        assert!(
            at(max_batch) <= usable && at(max_batch + 1) > usable,
            "{command}"
        );
    }
    let bad = frugal(&["--infer", "--model", "llama3-8b", "--kv-dtype", "int4"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--kv-dtype"));
}

/// Without `--gpu`, `fit --infer` says whose bandwidth its speeds assume, and names the GPU of
/// the device size given.
#[test]
fn fit_infer_names_the_gpu_its_speeds_assume() {
    let base = [
        "--infer",
        "--model",
        "llama3-8b",
        "--device-memory",
        "24GiB",
    ];
    let v = json(&base);
    let note = v["gpu_note"].as_str().unwrap();
    assert!(
        note.contains("assume an h100") && note.contains("--gpu rtx4090"),
        "{note}"
    );
    let mut with_gpu = base.to_vec();
    with_gpu.extend(["--gpu", "rtx4090"]);
    assert!(json(&with_gpu)["gpu_note"].is_null());
}
