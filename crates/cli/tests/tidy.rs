//! Tidy: the code-shape rules STYLE asks for, checked on the whole workspace (rust-analyzer's
//! and TigerBeetle's tidy tests): every Rust file opens with a `//!` header; only the `frugal`
//! binary prints (library code of the other crates never calls `println!` and friends outside
//! its tests); every dependency a crate declares is used by it; library files stay under 500
//! lines; and every code path ARCHITECTURE.md names (`plan::frugal::training_plan`,
//! `crates/engine/src/arena.rs`) exists.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn crates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    dirs.sort();
    dirs
}

/// The code lines of a file before its `#[cfg(test)]` module, comments dropped.
fn library_code(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect()
}

#[test]
fn every_rust_file_opens_with_a_header() {
    let mut missing = Vec::new();
    for krate in crates() {
        for file in rust_files(&krate) {
            let text = std::fs::read_to_string(&file).unwrap();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            if !first.starts_with("//!") {
                missing.push(file.display().to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "files without a //! header: {missing:#?}"
    );
}

#[test]
fn only_the_binary_prints() {
    let mut printing = Vec::new();
    for krate in crates().into_iter().filter(|k| !k.ends_with("cli")) {
        for file in rust_files(&krate.join("src")) {
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            for line in library_code(&text) {
                let prints = ["println!", "print!(", "eprintln!", "eprint!(", "dbg!("];
                if prints.iter().any(|p| line.contains(p)) {
                    printing.push(format!("{}: {}", file.display(), line.trim()));
                }
            }
        }
    }
    assert!(
        printing.is_empty(),
        "library code that prints: {printing:#?}"
    );
}

/// The `[dependencies]` (or `[dev-dependencies]`) names of a Cargo.toml.
fn dependencies(manifest: &str, table: &str) -> Vec<String> {
    let header = format!("[{table}]");
    let mut names = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == header;
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap_or("");
            names.push(name.replace('-', "_"));
        }
    }
    names
}

fn uses(code: &str, dep: &str) -> bool {
    code.contains(&format!("{dep}::")) || code.contains(&format!("use {dep}"))
}

#[test]
fn every_dependency_is_used() {
    let mut unused = Vec::new();
    for krate in crates() {
        let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
        let code_of = |dirs: &[&str]| -> String {
            let files = dirs.iter().flat_map(|d| rust_files(&krate.join(d)));
            let texts: Vec<String> = files.map(|f| std::fs::read_to_string(f).unwrap()).collect();
            let code: Vec<&str> = texts
                .iter()
                .flat_map(|t| t.lines().filter(|l| !l.trim_start().starts_with("//")))
                .collect();
            code.join("\n")
        };
        let lib = code_of(&["src"]);
        let all = code_of(&["src", "tests", "benches", "examples"]);
        for dep in dependencies(&manifest, "dependencies") {
            if !uses(&lib, &dep) {
                unused.push(format!("{}: {dep}", krate.display()));
            }
        }
        for dep in dependencies(&manifest, "dev-dependencies") {
            if !uses(&all, &dep) {
                unused.push(format!("{} (dev): {dep}", krate.display()));
            }
        }
    }
    assert!(unused.is_empty(), "declared but unused: {unused:#?}");
}

#[test]
fn library_files_stay_small() {
    let mut large = Vec::new();
    for krate in crates() {
        for file in rust_files(&krate.join("src")) {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            if lines > 500 {
                large.push(format!("{}: {lines} lines", file.display()));
            }
        }
    }
    assert!(
        large.is_empty(),
        "files over 500 lines (split them): {large:#?}"
    );
}

/// Every `name` defined in the workspace's Rust code (fn, struct, enum, trait, mod, type, const,
/// static, enum variants and fields are not tracked: paths end at items).
fn defined(all_code: &str, name: &str) -> bool {
    [
        "fn", "struct", "enum", "trait", "mod", "type", "const", "static",
    ]
    .iter()
    .any(|kw| {
        all_code.contains(&format!("{kw} {name}(")) || {
            let d = format!("{kw} {name}");
            all_code.match_indices(&d).any(|(i, _)| {
                let next = all_code[i + d.len()..].chars().next().unwrap_or(' ');
                !(next.is_alphanumeric() || next == '_')
            })
        }
    })
}

#[test]
fn names_in_architecture_md_exist() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let files: Vec<PathBuf> = crates().iter().flat_map(|k| rust_files(k)).collect();
    let all_code: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let mut missing = Vec::new();
    for span in doc.split('`').skip(1).step_by(2) {
        let path_like = span.contains('/') && !span.contains(' ') && !span.contains("::");
        if path_like && (span.ends_with(".rs") || span.ends_with(".md") || span.ends_with('/')) {
            if !root().join(span).exists() {
                missing.push(span.to_string());
            }
            continue;
        }
        let is_path = span.contains("::")
            && span
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == ':');
        if is_path {
            let last = span.rsplit("::").next().unwrap();
            if !last.is_empty() && !defined(&all_code, last) {
                missing.push(span.to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what does not exist: {missing:#?}"
    );
}
