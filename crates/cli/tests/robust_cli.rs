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

/// [`tiny`] for `steps` steps saving every `every` steps into `out`, then `extra`.
fn saving(
    dir: &std::path::Path,
    [steps, every]: [&str; 2],
    out: &str,
    extra: &[&str],
) -> Vec<String> {
    let flags = ["--steps", steps, "--save-every", every, "--out", out];
    tiny(dir, &[&flags[..], extra].concat())
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
    let first = saving(&dir, ["4", "2"], &out_dir, &[]);
    assert!(run(&first).status.success());
    let again = saving(&dir, ["2", "1"], &out_dir, &[]);
    fails_with(
        &run(&again),
        "holds another run's snapshots (newest at step 4)",
    );
    let mut overwrite = again.clone();
    overwrite.push("--overwrite".into());
    let out = run(&overwrite);
    common::assert_ok(&out);
    let steps: Vec<u64> = train::snapshot::files::committed(&dir.join("run"))
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
    common::assert_ok(&out);
    assert!(!lock.exists(), "the lock is removed when the run ends");
}

fn sigterm(child: &std::process::Child) {
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
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
    sigterm(&child);
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
    let saved = train::snapshot::files::committed(&dir.join("run")).unwrap();
    assert_eq!(saved.last().map(|s| s.0), Some(first));
    let mut resumed = args.clone();
    resumed.extend(["--resume".to_string(), out_dir.clone()]);
    let second = interrupted_step(&terminated_after(&resumed, Duration::from_secs(3)));
    assert!(second > first, "resumed at {first}, stopped at {second}");
}

#[test]
fn absurd_sizes_exit_2_never_an_overflowed_number_or_an_abort() {
    let dir = common::temp_dir("robust", "absurd");
    let gpt2 = |field: &str, value: u64| {
        let path = dir.join(format!("{field}.json"));
        let mut c = serde_json::json!({"model_type": "gpt2", "n_layer": 12, "n_embd": 768,
            "n_head": 12, "vocab_size": 50257, "n_positions": 1024});
        c[field] = value.into();
        std::fs::write(&path, c.to_string()).unwrap();
        path.display().to_string()
    };
    let layers = gpt2("n_layer", 4_000_000_000);
    for cmd in ["plan", "fit", "train"] {
        let mut args = vec![cmd, "--model", &layers];
        if cmd == "fit" {
            args.extend(["--device-memory", "80GiB"]);
        }
        fails_with(&frugal(&args), "4000000000 is beyond any real model");
    }
    let huge = [
        "--model",
        "llama3-8b",
        "--train",
        "--batch",
        "1000000000000",
    ];
    let out = frugal(&[&["plan"][..], &huge, &["--seq", "131072"]].concat());
    fails_with(&out, "overflow 64-bit byte counts");
    fails_with(&out, "--batch 1000000000000");
    fails_with(&frugal(&["plan", "--params", "0.5"]), "not a whole number");
    fails_with(
        &frugal(&["plan", "--params", "0"]),
        "at least one parameter",
    );
    fails_with(&frugal(&["plan", "--params", "-7B"]), "negative");
    fails_with(
        &frugal(&["fit", "--model", "gpt2-124m", "--top", "0"]),
        "--top",
    );
    fails_with(&frugal(&["formats", "--random", "102400000000"]), "of RAM");
}

#[test]
fn the_help_example_of_a_negative_value_works() {
    let out = frugal(&["formats", "-6.1e-5"]);
    common::assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("-6.1e-5 in every format"));
}

#[test]
fn resuming_on_other_data_is_refused() {
    let dir = common::temp_dir("robust", "data");
    let out_dir = dir.join("run").display().to_string();
    let first = saving(&dir, ["6", "2"], &out_dir, &[]);
    assert!(run(&first).status.success());
    let step4 = dir.join("run/step-000004").display().to_string();
    let other = dir.join("other.txt");
    let text: String = data::shakespeare_text()
        .chars()
        .skip(100_000)
        .take(40_000)
        .collect();
    std::fs::write(&other, text).unwrap();
    let other = other.display().to_string();
    let resume = ["--steps", "6", "--out", &out_dir, "--resume", &step4];
    fails_with(
        &run(&tiny(&dir, &[&resume[..], &["--data", &other]].concat())),
        "run.data",
    );
    let same = run(&tiny(&dir, &resume));
    common::assert_ok(&same);
}

#[test]
fn a_diverging_run_stops_naming_the_learning_rate_and_a_bad_config_is_blamed() {
    let dir = common::temp_dir("robust", "diverge");
    let out = run(&tiny(&dir, &["--steps", "200", "--lr", "1e6"]));
    fails_with(&out, "the loss diverged");
    fails_with(&out, "--lr");
    for (field, value) in [("rope_theta", -1.0), ("rms_norm_eps", 0.0)] {
        let path = dir.join(format!("{field}.json"));
        let mut c = serde_json::json!({"model_type": "llama", "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
            "num_key_value_heads": 2, "vocab_size": 50304, "max_position_embeddings": 256});
        c[field] = value.into();
        std::fs::write(&path, c.to_string()).unwrap();
        let out = run(&tiny(
            &dir,
            &["--steps", "2", "--model", path.to_str().unwrap()],
        ));
        fails_with(&out, field);
    }
}

#[test]
fn without_a_terminal_train_prints_plain_progress_lines() {
    let dir = common::temp_dir("robust", "plain");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(tiny(&dir, &["--steps", "20"]))
        .env("FRUGAL_PROGRESS_EVERY_S", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("train: step 20/20 | loss "), "{stderr}");
}

#[test]
fn a_missing_pytorch_baseline_is_reported_before_the_benchmark() {
    let started = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(["bench", "train", "--model", "gpt2-124m", "--steps", "50"])
        .args(["--baseline", "pytorch"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    fails_with(&out, "--baseline pytorch: running python3");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the benchmark ran first"
    );
}

#[test]
fn an_inference_plot_labels_each_phase_once_and_groups_the_count() {
    let dir = common::temp_dir("robust", "plot");
    let svg = dir.join("p.svg");
    let out = frugal(&[
        "plan",
        "--params",
        "7B",
        "--infer",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    common::assert_ok(&out);
    let text = std::fs::read_to_string(&svg).unwrap();
    for label in ["\nprefill\n", "\ndecode\n"] {
        assert_eq!(text.matches(label).count(), 1, "{label} in {text}");
    }
    assert!(text.contains("7,000,000,000 parameters"));
    // Only the categories that hold bytes are in the legend.
    assert!(!text.contains("\ngradients\n"));
    assert!(text.contains("\nparameters\n"));
}

#[test]
fn a_snapshot_write_that_fails_leaves_no_temporary_file() {
    use std::os::unix::process::CommandExt;
    let dir = common::temp_dir("robust", "diskfull");
    let out_dir = dir.join("run");
    let args = saving(&dir, ["2", "1"], out_dir.to_str().unwrap(), &[]);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"));
    cmd.args(&args);
    // SAFETY: only async-signal-safe calls between fork and exec. Files may grow to 1 MiB (as on
    // a full disk, writes past it fail with EFBIG instead of killing the process).
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &limit);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    fails_with(&out, "writing");
    let leftovers: Vec<_> = walk(&out_dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            all.extend(walk(&path));
        }
        all.push(path);
    }
    all
}

#[test]
fn an_os_error_is_printed_once() {
    let out = frugal(&["train", "--data", "/nonexistent/corpus.txt"]);
    fails_with(&out, "/nonexistent/corpus.txt");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn a_second_sigterm_exits_at_once_leaving_the_last_snapshot_whole() {
    let dir = common::temp_dir("robust", "second-signal");
    let out_dir = dir.join("run");
    let args = saving(&dir, ["100", "1"], out_dir.to_str().unwrap(), &[]);
    // The save after step 2 pauses for a minute before its manifest: the first SIGTERM finds the
    // run busy saving, the second must not wait for it.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(&args)
        .env("FRUGAL_TEST_SNAPSHOT_PAUSE", "2,60")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let written = out_dir.join("step-000002/train.json");
    let started = Instant::now();
    while !written.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the save never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let signalled = Instant::now();
    for _ in 0..2 {
        sigterm(&child);
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.wait().unwrap();
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "waited for the save"
    );
    assert_eq!(status.code(), Some(130));
    let committed = train::snapshot::files::committed(&out_dir).unwrap();
    assert_eq!(
        committed.last().map(|c| c.0),
        Some(1),
        "step 1 stays the newest whole one"
    );
}

#[test]
fn resuming_another_folder_into_an_out_with_snapshots_is_refused() {
    let dir = common::temp_dir("robust", "resume-elsewhere");
    let (a, b) = (
        dir.join("a").display().to_string(),
        dir.join("b").display().to_string(),
    );
    for out in [&a, &b] {
        let first = saving(&dir, ["4", "2"], out, &[]);
        assert!(run(&first).status.success());
    }
    let a2 = format!("{a}/step-000002");
    let into_b = saving(&dir, ["4", "1"], &b, &["--resume", &a2]);
    fails_with(&run(&into_b), "holds another run's snapshots");
    let into_a = saving(&dir, ["4", "1"], &a, &["--resume", &a2]);
    let out = run(&into_a);
    common::assert_ok(&out);
}
