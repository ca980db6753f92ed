//! `frugal train --zero S --ranks N` against `frugal plan --runtime frugal --zero S --gpus N`:
//! every rank's planned and measured bytes equal the plan command's, field by field; the report
//! shows 16Ψ/N at stage 3 and the paper's communication volumes; bad stage and rank values exit 2.

mod common;

use common::{frugal, json};
use serde_json::Value;

fn small_text(test: &str) -> String {
    common::small_text("zero-cli", test, 20_000)
}

/// gpt2-tiny in batches of 1 × 16 tokens, recomputing every activation.
fn shape() -> Vec<&'static str> {
    [&common::TINY_1X16[..], &["--recompute", "full"]].concat()
}

fn train(data: &str, zero: &str, ranks: &str) -> Value {
    let mut args = common::short_train("1", data);
    args.extend(shape());
    args.extend(["--attention", "naive", "--json"]);
    args.extend(["--zero", zero, "--ranks", ranks]);
    json(&frugal(&args))
}

fn plan(zero: &str, gpus: &str) -> Value {
    let mut args = common::PLAN_FRUGAL_FP32.to_vec();
    args.extend(shape());
    args.extend([
        "--attention",
        "eager",
        "--json",
        "--zero",
        zero,
        "--gpus",
        gpus,
    ]);
    json(&frugal(&args))
}

#[test]
fn plan_and_train_print_the_same_bytes_for_every_stage_and_rank_count() {
    let data = small_text("same");
    for (zero, ranks) in [("0", "2"), ("1", "2"), ("2", "4"), ("3", "1"), ("3", "4")] {
        let trained = train(&data, zero, ranks);
        let planned = plan(zero, ranks);
        let per_device = planned["per_device"].as_object().unwrap();
        let by_rank = trained["ranks"].as_array().unwrap();
        assert_eq!(by_rank.len(), ranks.parse::<usize>().unwrap());
        for rank in by_rank {
            for side in ["planned", "measured"] {
                for field in [
                    "params_bytes",
                    "grads_bytes",
                    "optimizer_bytes",
                    "activations_bytes",
                    "other_bytes",
                    "peak_bytes",
                    "reserved_bytes",
                ] {
                    assert_eq!(
                        rank[side][field], per_device[field],
                        "--zero {zero} --ranks {ranks}: rank {} {side} {field}",
                        rank["rank"]
                    );
                }
            }
        }
        let z = &trained["zero"];
        assert_eq!(z["stage"], zero.parse::<u64>().unwrap());
        if zero == "3" {
            assert_eq!(
                z["model_state_bytes"], z["sixteen_psi_over_n_bytes"],
                "16Ψ/N"
            );
        }
    }
}

#[test]
fn the_report_shows_16_psi_over_n_and_the_papers_volume() {
    let data = small_text("human");
    let mut args = vec![
        "train",
        "--steps",
        "1",
        "--sample-tokens",
        "4",
        "--val-batches",
        "1",
    ];
    args.extend(shape());
    args.extend(["--data", &data, "--zero", "3", "--ranks", "2"]);
    let out = frugal(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    common::assert_ok(&out);
    assert!(stdout.contains("vs 16Ψ/N"), "{stdout}");
    assert!(stdout.contains("x the paper's 3Ψ(N-1)/N"), "{stdout}");
    assert!(stdout.contains("sample:"), "{stdout}");
}

fn fails_with(args: &[&str], needle: &str) {
    common::fails_with(&frugal(args), needle);
}

#[test]
fn bad_stages_and_rank_counts_exit_2_without_a_downgrade() {
    let base = common::tiny_step(&["--batch", "1", "--seq", "8"]);
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    fails_with(&with(&["--ranks", "0"]), "--ranks 0");
    fails_with(&with(&["--zero", "4"]), "invalid value '4' for '--zero");
    // gpt2-tiny's smallest unit (the final norm) has 128 elements.
    fails_with(
        &with(&["--zero", "1", "--ranks", "129"]),
        "use at most 128 ranks",
    );
    let plan_with = |extra: &[&'static str]| {
        [
            &common::PLAN_FRUGAL_FP32[..],
            &["--model", "gpt2-tiny"],
            extra,
        ]
        .concat()
    };
    fails_with(
        &plan_with(&["--zero", "3", "--gpus", "129"]),
        "use at most 128 ranks",
    );
}
