//! No message names a flag or subcommand that does not exist: every `--flag` inside a string
//! literal of the library and CLI sources, and every `frugal <command>` they mention, is one the
//! CLI's `--help` lists. Flags of other programs (the browser, NVRTC, pip) are named in
//! `OTHER_PROGRAMS` with where they are used.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Flags that belong to other programs, not to `frugal`.
const OTHER_PROGRAMS: &[&str] = &[
    // NVRTC's compile options (crates/cuda/src/ptx.rs).
    "fmad",
    "prec-div",
    "prec-sqrt",
    "ftz",
    // cargo, in the messages that say how to build a feature.
    "features",
    "release",
];

/// Flags `--help` hides (developer hooks), which messages may still name.
const HIDDEN: &[&str] = &["save-val-logits"];

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run frugal --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommands a `--help` lists under "Commands:".
fn subcommands(text: &str) -> Vec<String> {
    text.split("Commands:")
        .nth(1)
        .map(|rest| {
            rest.lines()
                .skip(1)
                .take_while(|l| l.starts_with("  "))
                .filter_map(|l| l.split_whitespace().next())
                .filter(|c| *c != "help")
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// `--name` tokens of `text`.
fn flags_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at + 2;
        let before_ok =
            i + at == 0 || !b[i + at - 1].is_ascii_alphanumeric() && b[i + at - 1] != b'-';
        let mut end = start;
        while end < b.len()
            && (b[end].is_ascii_lowercase()
                || b[end].is_ascii_digit()
                || b[end] == b'-'
                || b[end] == b'_')
        {
            end += 1;
        }
        let name = text[start..end].trim_end_matches('-');
        if before_ok && name.len() > 1 && b[start].is_ascii_lowercase() {
            out.push(name.to_string());
        }
        i = end.max(start);
    }
    out
}

/// The string literals of one source line (plain `"..."` strings, escapes kept).
fn literals(line: &str) -> Vec<&str> {
    let code = match line.find("//") {
        Some(c) if !line[..c].contains('"') => &line[..c],
        _ => line,
    };
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(open) = rest.find('"') {
        let after = &rest[open + 1..];
        let mut close = None;
        let mut escaped = false;
        for (k, ch) in after.char_indices() {
            match ch {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    close = Some(k);
                    break;
                }
                _ => escaped = false,
            }
        }
        match close {
            Some(k) => {
                out.push(&after[..k]);
                rest = &after[k + 1..];
            }
            // A string continued on the next line: what is on this one.
            None => {
                out.push(after);
                break;
            }
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            if p.file_name()
                .is_some_and(|n| n != "tests" && n != "benches")
            {
                sources(&p, out);
            }
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_flag_and_command_a_message_names_exists() {
    let top = help(&[]);
    let mut known: BTreeSet<String> = flags_in(&top).into_iter().collect();
    let commands = subcommands(&top);
    for c in &commands {
        let text = help(&[c]);
        known.extend(flags_in(&text));
        for sub in subcommands(&text) {
            known.extend(flags_in(&help(&[c, &sub])));
        }
    }
    assert!(
        known.contains("zero") && known.contains("max-new-tokens"),
        "{known:?}"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut unknown = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        // Arguments handed to another program (`.arg(..)`, `.args([..])`) are its flags.
        let mut in_args = false;
        for (n, line) in text.lines().enumerate() {
            let argv = in_args || line.contains(".arg(") || line.contains(".args(");
            if line.contains(".args([") && !line.contains("])") {
                in_args = true;
            } else if in_args && line.contains("])") {
                in_args = false;
            }
            if argv || line.trim_start().starts_with("//") || line.trim_start().starts_with("#[") {
                continue;
            }
            for lit in literals(line) {
                for flag in flags_in(lit) {
                    let other =
                        OTHER_PROGRAMS.contains(&flag.as_str()) || HIDDEN.contains(&flag.as_str());
                    if !known.contains(&flag) && !other {
                        unknown.push(format!("{}:{}: --{flag}", file.display(), n + 1));
                    }
                }
                for (i, _) in lit.match_indices("frugal ") {
                    let word: String = lit[i + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase())
                        .collect();
                    let rest = &lit[i + 7 + word.len()..];
                    // `frugal word ...` in backquotes is a command line, as is `frugal word
                    // --flag` written plainly.
                    let quoted = lit[..i].ends_with('`') && !word.is_empty();
                    let command_like =
                        quoted || rest.starts_with(' ') && rest.trim_start().starts_with("--");
                    if command_like && !commands.contains(&word) {
                        unknown.push(format!("{}:{}: frugal {word}", file.display(), n + 1));
                    }
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "messages name flags or commands the CLI does not have:\n{}",
        unknown.join("\n")
    );
}
