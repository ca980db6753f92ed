//! Inputs refused before any work, naming the flag, and saved models replaced only when asked.

mod common;

use common::frugal;

/// One step of gpt2-tiny in batches of 1 x 16 tokens, no sample, plus `extra`.
fn tiny_train(extra: &[&str]) -> std::process::Output {
    let mut args = common::short_run("1");
    args.extend(common::TINY_1X16);
    args.extend_from_slice(extra);
    frugal(&args)
}

/// Values that used to be clamped or read without end are refused before any work, naming the
/// flag: a KV block of 0 tokens, a draft of 0 tokens, a device as --data, a LoRA rank wider than
/// the model.
#[test]
fn out_of_range_values_and_devices_are_refused_naming_the_flag() {
    let dir = common::temp_dir("robust-cli", "ranges");
    let model = dir.join("no-such-model").display().to_string();
    let gen = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", &model];
        args.extend_from_slice(extra);
        frugal(&args)
    };
    common::fails_with(
        &gen(&["--kv-block", "0"]),
        "--kv-block: 0: tokens per KV block",
    );
    common::fails_with(
        &gen(&["--draft", &model, "--draft-tokens", "0"]),
        "--draft-tokens 0",
    );
    common::fails_with(&tiny_train(&["--data", "/dev/zero"]), "not a regular file");
    common::fails_with(
        &tiny_train(&["--lora-rank", "100000"]),
        "--lora-rank: 100000 exceeds",
    );
    let args = common::tiny_step(&["--sample-tokens", "99999999"]);
    common::fails_with(&frugal(&args), "--sample-tokens 99999999");
}

/// A finished model with no snapshots beside it is not replaced by another run's --out unless
/// --overwrite says so.
#[test]
fn a_saved_model_is_replaced_only_when_asked() {
    let dir = common::temp_dir("robust-cli", "saved-model");
    let out = dir.join("run").display().to_string();
    let run = |extra: &[&str]| tiny_train(&[&["--out", out.as_str()][..], extra].concat());
    common::assert_ok(&run(&[]));
    common::fails_with(&run(&[]), "holds a saved model");
    common::assert_ok(&run(&["--overwrite"]));
}

/// A LoRA rank above the smaller side of a targeted matrix is refused the same way by `plan`,
/// `fit` and `bench train`, naming `--lora-rank` (`train`'s refusal is tested above).
#[test]
fn a_lora_rank_past_its_matrix_is_refused_by_every_command() {
    let huge = ["--lora-rank", "100000"];
    let cases: [Vec<&str>; 3] = [
        [&["plan", "--model", "llama3-8b"][..], &huge[..]].concat(),
        [
            &["fit", "--model", "llama3-8b", "--allow-lora"][..],
            &huge[..],
        ]
        .concat(),
        [&["bench", "train", "--model", "gpt2-124m"][..], &huge[..]].concat(),
    ];
    for args in cases {
        let out = common::frugal(&args);
        common::fails_with(&out, "--lora-rank");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("exceeds the smaller side"),
            "{args:?}: {stderr}"
        );
    }
}

/// A `--data` larger than the memory it would be read into is refused before a byte is read
/// (a sparse 1 TiB file: no disk is used).
#[test]
fn a_corpus_larger_than_memory_is_refused_before_reading() {
    let dir = common::temp_dir("refusals", "huge-data");
    let path = dir.join("huge.txt");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let out = common::frugal(&common::tiny_step(&["--data", path.to_str().unwrap()]));
    common::fails_with(&out, "1099511627776 bytes of text");
    let _ = std::fs::remove_file(&path);
}

/// Paths of the wrong kind and values that would be silently wrong: a weights file that is a
/// folder, a quantized copy saved over its own model, an int4 group that does not divide the
/// linear inputs, a NaN dropout, a corpus too short to split.
#[test]
fn wrong_kinds_of_paths_and_values_are_refused_naming_them() {
    let dir = common::temp_dir("robust-cli", "kinds");
    let run = dir.join("run");
    let out = tiny_train(&["--out", run.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let folder = dir.join("folder-weights");
    std::fs::create_dir_all(folder.join("model.safetensors")).unwrap();
    std::fs::copy(run.join("config.json"), folder.join("config.json")).unwrap();
    let from_folder = ["train", "--model", folder.to_str().unwrap(), "--steps", "1"];
    common::fails_with(
        &frugal(&from_folder),
        "model.safetensors is not a regular file",
    );
    let run_s = run.to_str().unwrap();
    let quantized = [
        "generate",
        "--model",
        run_s,
        "--weights",
        "int8",
        "--save-quantized",
        run_s,
    ];
    common::fails_with(&frugal(&quantized), "holds a model (model.safetensors)");
    assert!(!run.join("weights.frugal").exists());
    let plan = [
        "plan",
        "--model",
        "llama2-7b",
        "--infer",
        "--weights",
        "int4",
        "--weight-group",
        "7",
    ];
    common::fails_with(&frugal(&plan), "--weight-group");
    common::fails_with(&frugal(&plan), "do not divide");
    common::fails_with(
        &tiny_train(&["--lora-rank", "4", "--lora-dropout", "NaN"]),
        "--lora-dropout",
    );
    let hello = dir.join("hello.txt");
    std::fs::write(&hello, "hello").unwrap();
    common::fails_with(
        &tiny_train(&["--data", hello.to_str().unwrap()]),
        "too short: 1 token(s)",
    );
}
