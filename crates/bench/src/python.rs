//! What a baseline's python process said when it failed: its stderr, or, where it printed
//! nothing (killed by a signal), how it ended.

use std::process::Output;

/// The failed process's stderr, or how it ended when that is empty. An illegal instruction
/// (SIGILL) is named with its usual cause: a native extension (llama.cpp, a torch wheel) built
/// for another CPU.
pub(crate) fn failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.trim().is_empty() {
        return stderr.trim().to_string();
    }
    let mut why = format!("it printed nothing and ended with {}", out.status);
    if illegal_instruction(out) {
        why.push_str(
            ": an illegal instruction, so a native extension it loads was built for another CPU \
             (reinstall it on this machine without pip's cache, e.g. CMAKE_ARGS=\"-DGGML_NATIVE=ON\" \
             pip install --no-cache-dir --force-reinstall llama-cpp-python)",
        );
    }
    why
}

#[cfg(unix)]
fn illegal_instruction(out: &Output) -> bool {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal() == Some(4)
}

#[cfg(not(unix))]
fn illegal_instruction(_: &Output) -> bool {
    false
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    fn output(raw: i32, stderr: &str) -> Output {
        Output {
            status: ExitStatus::from_raw(raw),
            stdout: Vec::new(),
            stderr: stderr.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_silent_crash_says_how_it_ended() {
        // A raw wait status of 4: killed by signal 4.
        let why = failure(&output(4, ""));
        assert!(
            why.contains("SIGILL") && why.contains("another CPU"),
            "{why}"
        );
        // Exit code 3 (raw status 3 << 8), nothing printed.
        let why = failure(&output(3 << 8, "  \n"));
        assert!(
            why.contains("exit status: 3") && !why.contains("CPU"),
            "{why}"
        );
    }

    #[test]
    fn a_message_is_passed_on() {
        let why = failure(&output(
            1 << 8,
            "ModuleNotFoundError: No module named 'gguf'\n",
        ));
        assert_eq!(why, "ModuleNotFoundError: No module named 'gguf'");
    }
}
