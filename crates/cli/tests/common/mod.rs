//! Helpers the CLI test files share: run the built `frugal` binary, read its one JSON object,
//! and make per-test temp folders and small slices of the shipped corpus.

#![allow(dead_code)]

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

/// The one JSON object a successful `--json` run prints; fails the test with stderr otherwise.
pub fn json(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
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
