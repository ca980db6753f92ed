//! `frugal train --save-every/--keep/--resume` and `frugal export` end to end: a resumed run ends
//! with the weights of an uninterrupted one byte for byte; a run killed (SIGKILL) in the middle
//! of a save leaves the previous snapshot whole, and resuming from the folder continues from it;
//! bad flags, damaged files and mismatched runs exit 2 with a message saying what to fix.

mod common;

use common::frugal;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A fresh folder for one test.
fn temp_dir(test: &str) -> PathBuf {
    common::temp_dir("snap-cli", test)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// gpt2-tiny, 6 steps of 2 x 32 tokens on 40 KB of Shakespeare, plus `extra`.
fn train_args(dir: &Path, extra: &[&str]) -> Vec<String> {
    let data = dir.join("small.txt");
    if !data.exists() {
        let text: String = data::shakespeare_text().chars().take(40_000).collect();
        std::fs::write(&data, text).unwrap();
    }
    let data = s(&data);
    let base = [
        ("--model", "gpt2-tiny"),
        ("--steps", "6"),
        ("--batch", "2"),
        ("--seq", "32"),
        ("--val-every", "100"),
        ("--val-batches", "1"),
        ("--sample-tokens", "0"),
        ("--data", data.as_str()),
    ];
    let mut args = vec!["train".to_string(), "--json".to_string()];
    for (flag, value) in base {
        if !extra.contains(&flag) {
            args.extend([flag.to_string(), value.to_string()]);
        }
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

fn train(dir: &Path, extra: &[&str]) -> Output {
    let args = train_args(dir, extra);
    frugal(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn ok(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn fails_with(out: &Output, needles: &[&str]) {
    for needle in needles {
        common::fails_with(out, needle);
    }
}

fn weights(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("model.safetensors")).unwrap()
}

#[test]
fn a_resumed_run_ends_with_the_uninterrupted_runs_weights() {
    let dir = temp_dir("resume");
    let (straight, saved, resumed) = (dir.join("straight"), dir.join("saved"), dir.join("resumed"));
    let a = ok(&train(&dir, &["--out", &s(&straight)]));
    ok(&train(&dir, &["--save-every", "3", "--out", &s(&saved)]));
    // The step-3 snapshot is what a run interrupted after step 3 leaves.
    let from = s(&saved.join("step-000003"));
    let b = ok(&train(&dir, &["--resume", &from, "--out", &s(&resumed)]));
    assert_eq!(b["steps"], 3, "the resumed run takes steps 4..6");
    assert_eq!(a["loss_last"], b["loss_last"]);
    assert!(weights(&straight) == weights(&resumed), "weights differ");
    // On 2 ranks of 1 row (same global batch) the reduction order changes: within 1e-5.
    let c = ok(&train(
        &dir,
        &[
            "--resume",
            &from,
            "--ranks",
            "2",
            "--batch",
            "1",
            "--out",
            &s(&dir.join("r2")),
        ],
    ));
    let (x, y) = (
        a["loss_last"].as_f64().unwrap(),
        c["loss_last"].as_f64().unwrap(),
    );
    assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    // Export rebuilds the model from the shards: the same bytes as the snapshot's weights.
    let hf = dir.join("hf");
    let out = frugal(&["export", &s(&saved), "--hf", &s(&hf)]);
    common::assert_ok(&out);
    assert!(weights(&hf) == weights(&saved.join("step-000006")));
    assert!(hf.join("config.json").exists());
    // A second export into the same folder replaces the model only when asked, and never
    // writes over the run it exports.
    let again = frugal(&["export", &s(&saved), "--hf", &s(&hf)]);
    fails_with(&again, &["already holds a model", "--overwrite"]);
    let own = frugal(&["export", &s(&saved), "--hf", &s(&saved), "--overwrite"]);
    fails_with(&own, &["overwrite its own source"]);
    let v = ok(&frugal(&[
        "export",
        &s(&saved),
        "--hf",
        &s(&hf),
        "--json",
        "--overwrite",
    ]));
    assert_eq!(
        (v["step"].as_u64(), v["hf"].as_str()),
        (Some(6), Some(s(&hf).as_str()))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--save-every 2` over 5 steps: snapshots of steps 2 and 4, and the finished model of step 5.
/// Exporting the folder would give step 4's weights; it is refused, naming the finished model's
/// step and the snapshot to name instead, which exports.
#[test]
fn exporting_a_folder_whose_finished_model_is_newer_than_its_snapshots_is_refused() {
    let dir = temp_dir("finished");
    let out = dir.join("x5");
    ok(&train(
        &dir,
        &["--steps", "5", "--save-every", "2", "--out", &s(&out)],
    ));
    let hf = dir.join("hf");
    fails_with(
        &frugal(&["export", &s(&out), "--hf", &s(&hf)]),
        &["finished model (step 5)", "step-000004, step 4", "load"],
    );
    assert!(!hf.join("model.safetensors").exists());
    common::assert_ok(&frugal(&[
        "export",
        &s(&out.join("step-000004")),
        "--hf",
        &s(&hf),
    ]));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// bf16 (ZeRO-2 on 2 ranks) and fp16 (host-offloaded Adam state): a run resumed from its step-3
/// snapshot ends with the uninterrupted run's loss, loss scale and master weights, byte for byte;
/// resuming with another precision exits 2 naming it.
#[test]
fn bf16_and_fp16_runs_resume_exactly_and_only_with_their_precision() {
    let dir = temp_dir("resume-mixed");
    let cases: [(&str, &[&str]); 2] = [
        (
            "bf16",
            &[
                "--precision",
                "bf16",
                "--ranks",
                "2",
                "--batch",
                "1",
                "--zero",
                "2",
            ],
        ),
        ("fp16", &["--precision", "fp16", "--offload", "optimizer"]),
    ];
    for (name, flags) in cases {
        let out = |what: &str| dir.join(format!("{name}-{what}"));
        let run = |extra: &[&str]| ok(&train(&dir, &[flags, extra].concat()));
        let a = run(&["--out", &s(&out("straight"))]);
        run(&["--save-every", "3", "--out", &s(&out("saved"))]);
        let from = s(&out("saved").join("step-000003"));
        let b = run(&["--resume", &from, "--out", &s(&out("resumed"))]);
        assert_eq!(b["steps"], 3, "{name}: the resumed run takes steps 4..6");
        assert_eq!(a["loss_last"], b["loss_last"], "{name}");
        assert_eq!(a["precision"], b["precision"], "{name}");
        let (x, y) = (weights(&out("straight")), weights(&out("resumed")));
        assert!(x == y, "{name}: weights differ");
        let state = std::fs::read_to_string(out("saved").join("step-000003/train.json")).unwrap();
        assert_eq!(state.contains("growth_tracker"), name == "fp16", "{state}");
    }
    let from = s(&dir.join("fp16-saved"));
    let other = train(&dir, &["--precision", "bf16", "--resume", &from]);
    fails_with(&other, &["run.precision", "\"fp16\" vs this run \"bf16\""]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Waits until `path` exists (the paused save has written its files).
fn wait_for(path: &Path, child: &mut std::process::Child) {
    let started = Instant::now();
    while !path.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "frugal exited ({status}) before {} appeared",
                path.display()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_run_killed_mid_save_leaves_the_previous_snapshot_and_resumes_from_it() {
    let dir = temp_dir("kill");
    let out = dir.join("run");
    let args = train_args(
        &dir,
        &["--save-every", "2", "--keep", "1", "--out", &s(&out)],
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(&args)
        // The save after step 4 pauses once its files are written, before its manifest.
        .env("FRUGAL_TEST_SNAPSHOT_PAUSE", "4,60")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let partial = out.join("step-000004");
    wait_for(&partial.join("train.json"), &mut child);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!partial.join("manifest.json").exists());
    assert!(out.join("step-000002/manifest.json").exists());
    // The previous snapshot is whole (every checksum) and is the one --resume picks.
    let snap = train::snapshot::Snapshot::open(&out).unwrap();
    assert_eq!(snap.state.step, 2);
    let resume = [
        "--resume",
        &s(&out),
        "--save-every",
        "2",
        "--keep",
        "1",
        "--out",
        &s(&out),
    ];
    let resumed = ok(&train(&dir, &resume));
    assert_eq!(resumed["steps"], 4);
    let straight = dir.join("straight");
    let full = ok(&train(&dir, &["--out", &s(&straight)]));
    assert_eq!(resumed["loss_last"], full["loss_last"]);
    assert!(weights(&out) == weights(&straight));
    // The partial folder was cleaned up; --keep 1 left the newest snapshot only.
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("step-"))
        .collect();
    names.sort();
    assert_eq!(names, ["step-000006"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_snapshot_flags_and_files_exit_2_saying_what_to_fix() {
    let dir = temp_dir("bad");
    let out = dir.join("run");
    fails_with(
        &train(&dir, &["--save-every", "2"]),
        &["--save-every needs --out"],
    );
    fails_with(
        &train(&dir, &["--save-every", "0", "--out", &s(&out)]),
        &["--save-every 0"],
    );
    fails_with(
        &train(
            &dir,
            &["--keep", "0", "--save-every", "1", "--out", &s(&out)],
        ),
        &["--keep 0"],
    );
    fails_with(
        &train(&dir, &["--resume", &s(&dir.join("nothing"))]),
        &["does not exist"],
    );
    ok(&train(
        &dir,
        &["--steps", "4", "--save-every", "2", "--out", &s(&out)],
    ));
    fails_with(
        &train(
            &dir,
            &["--steps", "4", "--resume", &s(&out), "--lr", "1e-3"],
        ),
        &["different run", "run.lr: snapshot 0.002 vs this run 0.001"],
    );
    fails_with(
        &train(
            &dir,
            &[
                "--steps",
                "4",
                "--resume",
                &s(&out),
                "--model",
                "llama-tiny",
            ],
        ),
        &["model.family: snapshot \"Gpt2\" vs this run \"Llama\""],
    );
    fails_with(
        &train(&dir, &["--steps", "4", "--resume", &s(&out)]),
        &["at step 4", "nothing is left to train"],
    );
    let shard = out.join("step-000004/optim-rank-00000-of-00001.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let step4 = out.join("step-000004");
    fails_with(
        &train(&dir, &["--steps", "4", "--resume", &s(&step4)]),
        &[
            "optim-rank-00000-of-00001.safetensors",
            "fails its checksum",
        ],
    );
    // From the run's folder the damaged newest snapshot is named and the older one resumed.
    let fallback = train(
        &dir,
        &["--steps", "4", "--out", &s(&out), "--resume", &s(&out)],
    );
    let stderr = String::from_utf8_lossy(&fallback.stderr);
    assert!(fallback.status.success(), "{stderr}");
    assert!(stderr.contains("step-000004 is damaged"), "{stderr}");
    assert!(
        stderr.contains("resuming from the newest intact snapshot"),
        "{stderr}"
    );
    fails_with(
        &frugal(&["export", &s(&step4), "--hf", &s(&dir.join("hf"))]),
        &["fails its checksum"],
    );
    // A snapshot folder renamed for another step is refused, naming its own step.
    let renamed = out.join("step-000007");
    std::fs::rename(out.join("step-000002"), &renamed).unwrap();
    fails_with(
        &frugal(&["export", &s(&renamed), "--hf", &s(&dir.join("hf"))]),
        &["step 2's state", "named for step 7", "step-000002"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `frugal args`, sends it SIGTERM 300 ms after `path` appears, and returns its output
/// and the time it took to end after the signal.
fn signal_once(args: &[String], path: &Path) -> (Output, Duration) {
    let child = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let signalled = Instant::now();
    let out = child.wait_with_output().unwrap();
    (out, signalled.elapsed())
}

/// SIGTERM during the sample that ends a run: the model was saved before it, the sample stops
/// at once (not after hundreds of full forwards), and the run ends normally saying so.
#[test]
fn sigterm_during_the_sample_stops_it_and_keeps_the_saved_model() {
    let dir = temp_dir("sigterm-sample");
    let out_dir = dir.join("out");
    let args = train_args(
        &dir,
        &[
            "--model",
            "gpt2-124m",
            "--steps",
            "1",
            "--batch",
            "1",
            "--seq",
            "256",
            "--sample-tokens",
            "256",
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    let (out, after) = signal_once(&args, &out_dir.join("model.safetensors"));
    assert!(
        after < Duration::from_secs(60),
        "{after:?} after the signal"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("stopped by a signal during the sample"),
        "{stderr}"
    );
    assert!(stderr.contains("the trained model is saved in"), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["sample"].is_string(), "{v}");
    assert!(out_dir.join("config.json").exists());
}

/// SIGTERM during a long validation: it is dropped, and the run ends as after a step, with a
/// snapshot of that step.
#[test]
fn sigterm_during_validation_stops_it_with_a_snapshot() {
    let dir = temp_dir("sigterm-val");
    let out_dir = dir.join("out");
    let data = dir.join("whole.txt");
    std::fs::write(&data, data::shakespeare_text()).unwrap();
    // About a thousand validation batches of one 32-token row: tens of seconds of validation.
    let args = train_args(
        &dir,
        &[
            "--model",
            "gpt2-mini",
            "--steps",
            "3",
            "--batch",
            "1",
            "--seq",
            "32",
            "--val-every",
            "1",
            "--val-batches",
            "100000",
            "--save-every",
            "1",
            "--data",
            data.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    // Step 1's snapshot is written before its validation starts.
    let (out, after) = signal_once(&args, &out_dir.join("step-000001").join("manifest.json"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        after < Duration::from_secs(10),
        "{after:?} after the signal: {stderr}"
    );
    assert!(stderr.contains("interrupted after step 1"), "{stderr}");
    assert!(!out_dir.join("step-000002").exists());
}
