//! Output into a pipe whose reader has gone (`frugal tokenize ... | head -c 1`): the run stops
//! quietly with status 141, as a tool killed by SIGPIPE does, never with a panic.

use std::io::Read;
use std::process::{Command, Stdio};

#[test]
fn a_closed_pipe_ends_the_run_quietly() {
    // Far more ids than a pipe holds (64 KiB), so the writer meets the closed pipe.
    let text = "the quick brown fox jumps over the lazy dog ".repeat(100);
    let mut child = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(["tokenize", "--model", "gpt2-124m"])
        .args(std::iter::repeat_n(&text, 50))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read one byte, then leave: the rest of the output meets a closed pipe.
    let mut one = [0u8; 1];
    let mut stdout = child.stdout.take().unwrap();
    stdout.read_exact(&mut one).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(141), "{stderr}");
}
