//! One validated run config: `frugal plan --runtime frugal` given `frugal train`'s flags prints
//! exactly what `frugal train` measures (the same defaults, attention included), and the
//! pre-check of `train` plans the run it was asked for, so a bf16 run is refused on its own bf16
//! peak and accepted when that fits.

mod common;

use common::{frugal, json, TINY_2X32 as SHAPE};

fn train(data: &str, extra: &[&str]) -> std::process::Output {
    let mut args = common::short_train("2", data);
    args.push("--json");
    args.extend(SHAPE);
    args.extend(extra);
    frugal(&args)
}

fn plan_peak(extra: &[&str]) -> u64 {
    let mut args = vec!["plan", "--train", "--runtime", "frugal", "--json"];
    if !extra.contains(&"--precision") {
        args.extend(["--precision", "fp32"]);
    }
    args.extend(SHAPE);
    args.extend(extra);
    let v = json(&frugal(&args));
    v["per_device"]["peak_bytes"].as_u64().unwrap()
}

#[test]
fn plan_with_trains_flags_prints_what_train_measures() {
    let data = common::small_text("config-cli", "same", 20_000);
    for flags in [
        &[][..],
        &["--attention", "naive"],
        &["--recompute", "keep-matmuls"],
        &["--recompute", "selective", "--attention", "eager"],
        &["--ranks", "2", "--zero", "3"],
    ] {
        let run = json(&train(&data, flags));
        let measured = run["ranks"][0]["measured"]["peak_bytes"].as_u64().unwrap();
        assert_eq!(plan_peak(flags), measured, "{flags:?}");
    }
    // bf16 is `plan`'s default precision; train's is fp32: name it and they agree again.
    let run = json(&train(&data, &["--precision", "bf16"]));
    let measured = run["ranks"][0]["measured"]["peak_bytes"].as_u64().unwrap();
    assert_eq!(plan_peak(&["--precision", "bf16"]), measured);
}

#[test]
fn a_bf16_run_is_refused_on_its_own_peak_and_accepted_when_it_fits() {
    let data = common::small_text("config-cli", "bf16", 20_000);
    let bf16 = plan_peak(&["--precision", "bf16"]);
    let fp32 = plan_peak(&[]);
    assert!(bf16 != fp32, "the two precisions plan different peaks");
    let short = (bf16 - 1).to_string();
    let out = train(&data, &["--precision", "bf16", "--device-memory", &short]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("({bf16} bytes)")), "{err}");
    let exact = bf16.to_string();
    let run = json(&train(
        &data,
        &["--precision", "bf16", "--device-memory", &exact],
    ));
    assert_eq!(run["ranks"][0]["measured"]["peak_bytes"], bf16);
}
