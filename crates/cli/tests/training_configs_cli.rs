//! DeepSpeed and accelerate configs in (`plan --deepspeed`, `plan --accelerate`) and out
//! (`fit --emit`): each config plans what the same flags plan, an emitted config plans back to
//! the total `fit` chose, and a config with a misspelt key, a flag it contradicts or a batch
//! that does not divide is refused with the fix.

mod common;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn frugal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(args)
        .output()
        .expect("run frugal")
}

/// Llama-2-7B on 8 GPUs at 2048 tokens.
const LLAMA2_8: [&str; 6] = ["--model", "llama2-7b", "--gpus", "8", "--seq", "2048"];

fn data(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../configs/tests/data/configs")
        .join(name);
    p.display().to_string()
}

fn plan(args: &[&str]) -> Value {
    let mut all = vec!["plan", "--json"];
    all.extend_from_slice(args);
    common::json(&frugal(&all))
}

fn total(v: &Value) -> u64 {
    v["per_device"]["total_bytes"].as_u64().unwrap()
}

/// The plan of `common` + `flags`, and of `common` + `option FILE` (a config in tests/data).
fn by_flags_and_by_config(
    common: &[&str],
    flags: &[&str],
    option: &str,
    file: &str,
) -> (Value, Value) {
    let path = data(file);
    let by_flags = [common, flags].concat();
    let by_config = [common, &[option, path.as_str()][..]].concat();
    (plan(&by_flags), plan(&by_config))
}

fn refused(args: &[&str]) -> String {
    let out = frugal(args);
    assert_eq!(out.status.code(), Some(2), "{args:?} should be refused");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Configs with explicit values plan exactly what the same flags plan, under both GPU runtimes.
#[test]
fn a_deepspeed_config_plans_what_its_flags_plan() {
    let cases: [(&str, &[&str]); 3] = [
        (
            "ds_bf16_zero1.json",
            &[
                "--zero",
                "1",
                "--precision",
                "bf16",
                "--batch",
                "2",
                "--grad-accum",
                "4",
            ],
        ),
        (
            "ds_fp16_zero2_offload.json",
            &[
                "--zero",
                "2",
                "--offload",
                "optimizer",
                "--precision",
                "fp16",
                "--batch",
                "2",
                "--grad-accum",
                "2",
            ],
        ),
        (
            "ds_bf16_zero3_offload_nvme.json",
            &[
                "--zero",
                "3",
                "--offload",
                "params",
                "--precision",
                "bf16",
                "--batch",
                "1",
                "--grad-accum",
                "8",
            ],
        ),
    ];
    for (file, flags) in cases {
        for runtime in ["formula", "auto"] {
            let common = [&LLAMA2_8[..], &["--runtime", runtime]].concat();
            let (a, b) = by_flags_and_by_config(&common, flags, "--deepspeed", file);
            assert_eq!(total(&a), total(&b), "{file} under {runtime}");
            assert_eq!(a["per_device"], b["per_device"], "{file} under {runtime}");
            assert_eq!(a["host"], b["host"], "{file} under {runtime}");
            assert!(b["config"]["summary"].as_str().unwrap().contains("ZeRO-"));
        }
    }
    let nvme = plan(&[
        "--model",
        "llama2-7b",
        "--gpus",
        "8",
        "--deepspeed",
        &data("ds_bf16_zero3_offload_nvme.json"),
    ]);
    assert!(nvme["config"]["not_planned"][0]
        .as_str()
        .unwrap()
        .contains("nvme"));
}

/// HF's example configs ("auto" almost everywhere): "auto" takes the flags, and the buckets HF
/// derives from the hidden size (4096² for Llama-2-7B) or the config's own replace DeepSpeed's
/// defaults; the model states and activations equal the flags' plan.
#[test]
fn hf_auto_configs_take_the_flags_and_the_hidden_size() {
    for (file, flags, bucket) in [
        (
            "hf_zero2_offload.json",
            ["--zero", "2", "--offload", "optimizer"],
            200_000_000,
        ),
        (
            "hf_zero3_offload.json",
            ["--zero", "3", "--offload", "params"],
            4096 * 4096,
        ),
    ] {
        let rest = ["--batch", "4", "--grad-accum", "2", "--runtime", "formula"];
        let common = [&LLAMA2_8[..], &rest[..]].concat();
        let (a, b) = by_flags_and_by_config(&common, &flags, "--deepspeed", file);
        for key in [
            "params_bytes",
            "grads_bytes",
            "optimizer_bytes",
            "activations_bytes",
        ] {
            assert_eq!(
                a["per_device"]["categories"][key], b["per_device"]["categories"][key],
                "{file} {key}"
            );
        }
        assert_eq!(b["setup"]["micro_batch"], 4);
        assert_eq!(b["setup"]["grad_accum"], 2);
        assert_eq!(
            b["setup"]["zero_buffers"]["reduce_bucket"], bucket,
            "{file}"
        );
    }
}

#[test]
fn accelerate_configs_plan_what_their_flags_plan() {
    let common = [
        "--model",
        "llama2-7b",
        "--seq",
        "2048",
        "--batch",
        "2",
        "--runtime",
        "formula",
    ];
    let cases: [(&str, &[&str]); 2] = [
        (
            "accelerate_fsdp.yaml",
            &[
                "--gpus",
                "8",
                "--zero",
                "3",
                "--precision",
                "amp-bf16",
                "--recompute",
                "full",
            ],
        ),
        (
            "accelerate_deepspeed.yaml",
            &[
                "--gpus",
                "4",
                "--zero",
                "2",
                "--offload",
                "optimizer",
                "--grad-accum",
                "4",
            ],
        ),
    ];
    for (file, flags) in cases {
        let (a, b) = by_flags_and_by_config(&common, flags, "--accelerate", file);
        assert_eq!(a["per_device"], b["per_device"], "{file}");
        assert_eq!(a["setup"]["dp"], b["setup"]["dp"], "{file}");
    }
}

/// `fit --emit` writes the chosen setup's config; `plan` reads it back to the same total.
#[test]
fn an_emitted_config_plans_back_to_the_total_fit_chose() {
    let dir = common::temp_dir("configs", "emit");
    for (target, precision) in [
        ("deepspeed", "bf16"),
        ("accelerate", "bf16"),
        ("accelerate", "amp-bf16"),
    ] {
        let out = frugal(&[
            "fit",
            "--model",
            "llama2-7b",
            "--gpus",
            "8",
            "--batch",
            "32",
            "--seq",
            "2048",
            "--device-memory",
            "40GiB",
            "--precision",
            precision,
            "--emit",
            target,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let chosen: u64 = stderr
            .split(" bytes")
            .next()
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no total in {stderr}"));
        let back = stderr
            .lines()
            .find_map(|l| l.split("frugal ").nth(1))
            .unwrap();
        let file = if target == "deepspeed" {
            "ds_config.json"
        } else {
            "accelerate.yaml"
        };
        let path = dir.join(file);
        std::fs::write(&path, &out.stdout).unwrap();
        let path = path.display().to_string();
        let args: Vec<&str> = back
            .split(' ')
            .map(|a| if a == file { path.as_str() } else { a })
            .collect();
        let mut all = args.clone();
        all.push("--json");
        let v = common::json(&frugal(&all));
        assert_eq!(total(&v), chosen, "{target} {precision}: {back}");
    }
}

#[test]
fn a_bad_config_is_refused_with_the_fix() {
    let dir = common::temp_dir("configs", "bad");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let model = ["plan", "--model", "gpt2-124m", "--deepspeed"];
    let typo = write(
        "typo.json",
        r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "reduce_bucket_sise": 5e8}}"#,
    );
    let e = refused(&[&model[..], &[typo.as_str()]].concat());
    assert!(
        e.contains("zero_optimization.reduce_bucket_sise (did you mean reduce_bucket_size?)"),
        "{e}"
    );
    let z2 = write(
        "z2.json",
        r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}"#,
    );
    let e = refused(&[&model[..], &[z2.as_str(), "--zero", "3"]].concat());
    assert!(e.contains("stage to 2, but --zero 3"), "{e}");
    let batch = write(
        "batch.json",
        r#"{"train_batch_size": 30, "train_micro_batch_size_per_gpu": 2}"#,
    );
    let e = refused(&[&model[..], &[batch.as_str(), "--gpus", "4"]].concat());
    assert!(e.contains("train_batch_size 30"), "{e}");
    let param = write(
        "param.json",
        r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}"#,
    );
    let e = refused(&[&model[..], &[param.as_str()]].concat());
    assert!(
        e.contains("offload_param needs zero_optimization.stage 3"),
        "{e}"
    );
    let not_json = write("not.json", "[1");
    let e = refused(&[&model[..], &[not_json.as_str()]].concat());
    assert!(e.contains("not valid JSON"), "{e}");
    let yaml = write("acc.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_ofload_params: true\n");
    let e = refused(&["plan", "--model", "gpt2-124m", "--accelerate", &yaml]);
    assert!(
        e.contains("fsdp_config.fsdp_ofload_params (did you mean fsdp_offload_params?)"),
        "{e}"
    );
    let e = refused(&[
        "plan",
        "--model",
        "gpt2-124m",
        "--deepspeed",
        "/no/such/ds_config.json",
    ]);
    assert!(e.contains("cannot read /no/such/ds_config.json"), "{e}");
}

/// accelerate's DeepSpeed section may name a `deepspeed_config_file` beside the YAML: that file
/// is read, and accelerate's `mixed_precision` and accumulation fill its `"auto"` values.
#[test]
fn an_accelerate_config_reads_its_deepspeed_config_file() {
    let dir = common::temp_dir("configs", "ds-file");
    std::fs::copy(data("hf_zero3_offload.json"), dir.join("ds.json")).unwrap();
    let yaml = dir.join("accelerate.yaml");
    std::fs::write(
        &yaml,
        "distributed_type: DEEPSPEED\nnum_processes: 8\n\
         deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero3_init_flag: true\n",
    )
    .unwrap();
    // accelerate refuses mixed precision (and the other file keys) beside the file.
    let clash = dir.join("clash.yaml");
    std::fs::write(
        &clash,
        "distributed_type: DEEPSPEED\nmixed_precision: bf16\nnum_processes: 8\n\
         deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero_stage: 2\n",
    )
    .unwrap();
    let e = refused(&[
        "plan",
        "--model",
        "llama2-7b",
        "--accelerate",
        clash.to_str().unwrap(),
    ]);
    assert!(
        e.contains("zero_stage, mixed_precision beside deepspeed_config_file"),
        "{e}"
    );
    let common = [&LLAMA2_8[..], &["--batch", "4", "--runtime", "formula"]].concat();
    let by_yaml = plan(&[&common[..], &["--accelerate", yaml.to_str().unwrap()]].concat());
    let by_ds = plan(
        &[
            &common[..],
            &["--deepspeed", &data("hf_zero3_offload.json")],
        ]
        .concat(),
    );
    assert_eq!(by_yaml["per_device"], by_ds["per_device"]);
    assert!(by_yaml["config"]["summary"]
        .as_str()
        .unwrap()
        .contains("DeepSpeed from ds.json"));
}
