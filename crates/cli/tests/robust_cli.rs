//! Robustness: what the machine can't hold is refused before anything is allocated, bad values
//! are refused naming the flag, work survives signals and a shared `--out`, and absurd sizes give
//! an error or correct numbers, never an overflow or an abort.

mod common;

use common::{fails_with, frugal};
use std::time::{Duration, Instant};

#[test]
fn a_model_larger_than_host_ram_is_refused_at_once_with_the_breakdown() {
    for cmd in [&["train"][..], &["bench", "train"][..]] {
        let started = Instant::now();
        let out = frugal(&[cmd, &["--model", "llama3-8b"]].concat());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
        fails_with(&out, "of host RAM but this machine has");
        fails_with(&out, "GiB");
        fails_with(
            &out,
            "params 29.92 GiB + grads 29.92 GiB + optimizer 59.83 GiB",
        );
    }
}

/// gpt2-tiny on 40 KB of Shakespeare, 2 x 32 tokens a step, no sample, plus `extra`.
fn tiny(dir: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let data = dir.join("small.txt");
    if !data.exists() {
        let text: String = data::shakespeare_text().chars().take(40_000).collect();
        std::fs::write(&data, text).unwrap();
    }
    let data = data.display().to_string();
    let base = [
        ("--model", "gpt2-tiny"),
        ("--batch", "2"),
        ("--seq", "32"),
        ("--val-batches", "1"),
        ("--sample-tokens", "0"),
        ("--data", data.as_str()),
    ];
    let mut args = vec!["train".to_string()];
    for (flag, value) in base.iter().filter(|(f, _)| !extra.contains(f)) {
        args.extend([flag.to_string(), value.to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run(args: &[String]) -> std::process::Output {
    frugal(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn bad_training_values_are_refused_naming_the_flag() {
    let dir = common::temp_dir("robust", "flags");
    for (flag, value, needle) in [
        ("--grad-clip", "NaN", "--grad-clip NaN"),
        ("--val-every", "0", "--val-every 0"),
        ("--val-batches", "0", "--val-batches 0"),
        ("--batch", "0", "--batch 0"),
        ("--seq", "0", "--seq 0"),
        ("--ranks", "100000", "--ranks 100000"),
    ] {
        let out = run(&tiny(&dir, &["--steps", "1", flag, value]));
        fails_with(&out, needle);
    }
}

#[test]
fn an_unwritable_out_or_plot_is_refused_before_step_one() {
    let dir = common::temp_dir("robust", "unwritable");
    let file = dir.join("a-file");
    std::fs::write(&file, "not a folder").unwrap();
    let out_in_file = file.join("run").display().to_string();
    let started = Instant::now();
    let out = run(&tiny(&dir, &["--steps", "100000", "--out", &out_in_file]));
    fails_with(&out, "--out");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused only after training"
    );
    let plot_in_file = file.join("loss.svg").display().to_string();
    let out = run(&tiny(&dir, &["--steps", "100000", "--plot", &plot_in_file]));
    fails_with(&out, "--plot");
}

#[test]
fn an_out_with_another_runs_snapshots_is_refused_unless_resumed_or_overwritten() {
    let dir = common::temp_dir("robust", "foreign");
    let out_dir = dir.join("run").display().to_string();
    let first = tiny(
        &dir,
        &["--steps", "4", "--save-every", "2", "--out", &out_dir],
    );
    assert!(run(&first).status.success());
    let again = tiny(
        &dir,
        &["--steps", "2", "--save-every", "1", "--out", &out_dir],
    );
    fails_with(
        &run(&again),
        "holds another run's snapshots (newest at step 4)",
    );
    let mut overwrite = again.clone();
    overwrite.push("--overwrite".into());
    let out = run(&overwrite);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps: Vec<u64> = engine::snapshot::files::committed(&dir.join("run"))
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(
        steps,
        [1, 2],
        "the new run's snapshots, none of the old run's"
    );
}

#[test]
fn a_second_run_into_one_out_is_refused_naming_the_holder_and_a_stale_lock_is_taken() {
    let dir = common::temp_dir("robust", "lock");
    let out_dir = dir.join("run");
    std::fs::create_dir_all(&out_dir).unwrap();
    let lock = out_dir.join("frugal.lock");
    // This test process is alive: its pid holds the lock.
    std::fs::write(&lock, format!("{}\n", std::process::id())).unwrap();
    let args = tiny(
        &dir,
        &["--steps", "1", "--out", &out_dir.display().to_string()],
    );
    fails_with(&run(&args), &format!("pid {}", std::process::id()));
    // A pid that is not running (beyond the kernel's pid range) is a stale lock.
    std::fs::write(&lock, "4294967295\n").unwrap();
    let out = run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!lock.exists(), "the lock is removed when the run ends");
}

/// Starts `args`, waits, sends SIGTERM, and returns what the run printed.
fn terminated_after(args: &[String], wait: Duration) -> std::process::Output {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(wait);
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait_with_output().unwrap()
}

fn interrupted_step(out: &std::process::Output) -> u64 {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let rest = stderr
        .split("interrupted after step ")
        .nth(1)
        .unwrap_or_else(|| panic!("not interrupted: {stderr}"));
    assert!(stderr.contains("snapshot saved to"), "{stderr}");
    rest.split(';').next().unwrap().parse().unwrap()
}

#[test]
fn sigterm_saves_a_snapshot_that_resume_continues() {
    let dir = common::temp_dir("robust", "sigterm");
    let out_dir = dir.join("run").display().to_string();
    let args = tiny(&dir, &["--steps", "1000000", "--out", &out_dir]);
    let first = interrupted_step(&terminated_after(&args, Duration::from_secs(3)));
    assert!(first >= 1);
    let saved = engine::snapshot::files::committed(&dir.join("run")).unwrap();
    assert_eq!(saved.last().map(|s| s.0), Some(first));
    let mut resumed = args.clone();
    resumed.extend(["--resume".to_string(), out_dir.clone()]);
    let second = interrupted_step(&terminated_after(&resumed, Duration::from_secs(3)));
    assert!(second > first, "resumed at {first}, stopped at {second}");
}
