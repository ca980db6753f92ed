//! Tidy: the code-shape rules STYLE asks for, checked on the whole workspace (rust-analyzer's and
//! TigerBeetle's tidy tests): every Rust file opens with a `//!` header; only the commands print
//! (the `frugal` binary, `bench` for `frugal bench`, and `term`, what they print through; library
//! code of the other crates never calls `println!` and friends outside its tests); every dependency
//! a crate declares is used by it; no Rust file is over 500 lines; library code has no blanket
//! `allow(dead_code)`; every code path ARCHITECTURE.md names (`plan_frugal::training_plan`,
//! `crates/engine/src/arena.rs`) exists, whole path, module by module; and what users read speaks
//! of the product, never of how it is made.

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
fn only_the_commands_print() {
    let mut printing = Vec::new();
    let commands = |k: &PathBuf| ["cli", "bench", "term"].iter().any(|c| k.ends_with(c));
    for krate in crates().into_iter().filter(|k| !commands(k)) {
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
fn no_rust_file_is_over_500_lines() {
    let mut large = Vec::new();
    for krate in crates() {
        for file in rust_files(&krate) {
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

/// Library code says which item is unused where, if anywhere (`cfg_attr` for a platform): a
/// module- or crate-wide `allow(dead_code)` hides dead code. (A test's shared `common` module is
/// the exception Cargo forces: each test binary uses part of it.)
#[test]
fn no_blanket_dead_code_allowance() {
    let mut blanket = Vec::new();
    for krate in crates() {
        for file in rust_files(&krate.join("src")) {
            let text = std::fs::read_to_string(&file).unwrap();
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            for (i, line) in lines.iter().enumerate() {
                if !line.contains("allow(dead_code)") {
                    continue;
                }
                let item = lines[i + 1..].iter().find(|l| !l.starts_with("#["));
                let on_module = item.is_some_and(|l| {
                    let l = l
                        .trim_start_matches("pub ")
                        .trim_start_matches("pub(crate) ");
                    l.starts_with("mod ") || l.starts_with("impl")
                });
                if line.starts_with("#![") || on_module {
                    blanket.push(format!("{}:{}: {line}", file.display(), i + 1));
                }
            }
        }
    }
    assert!(
        blanket.is_empty(),
        "blanket allow(dead_code) (remove the dead code, or allow one item): {blanket:#?}"
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

/// The package name of each library crate directory (`crates/engine` is `engine`; the binary's
/// crate has no paths to name, and `frugal::tp` is short for `plan_frugal::tp`).
fn crate_names() -> Vec<(String, PathBuf)> {
    crates()
        .into_iter()
        .filter(|dir| dir.join("src/lib.rs").exists())
        .map(|dir| {
            let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
            let name = manifest
                .lines()
                .find_map(|l| l.trim().strip_prefix("name = "))
                .map(|n| n.trim_matches('"').replace('-', "_"))
                .unwrap();
            (name, dir)
        })
        .collect()
}

/// The file holding module `path` of the crate in `dir` (`[]`: the crate root): `a.rs` or
/// `a/mod.rs` beside its parent, or an inline `mod a {` in the parent's file.
fn module_file(dir: &Path, path: &[&str]) -> Option<PathBuf> {
    let src = dir.join("src");
    let mut file = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|f| f.exists())?;
    let mut here = src;
    for seg in path {
        let (flat, nested) = (
            here.join(format!("{seg}.rs")),
            here.join(seg).join("mod.rs"),
        );
        if flat.exists() {
            file = flat;
        } else if nested.exists() {
            file = nested;
        } else {
            let text = std::fs::read_to_string(&file).unwrap();
            let inline = [format!("mod {seg} {{"), format!("mod {seg};")];
            if !inline.iter().any(|m| text.contains(m.as_str())) {
                return None;
            }
        }
        here = here.join(seg);
    }
    Some(file)
}

/// Whether `crate::a::b::Item::method` resolves: the modules exist as files (or inline), the
/// first item is defined or re-exported in the last module, and what follows it (a method, a
/// variant's type) is defined in the crate.
fn resolves(dir: &Path, segments: &[&str], crate_code: &str) -> Result<(), String> {
    let mut modules = 0;
    while modules < segments.len() && module_file(dir, &segments[..=modules]).is_some() {
        modules += 1;
    }
    if modules == segments.len() {
        return Ok(());
    }
    let file = module_file(dir, &segments[..modules]).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let item = segments[modules];
    let reexported = text
        .lines()
        .filter(|l| l.trim_start().starts_with("pub use"))
        .any(|l| l.contains(item));
    if !defined(&text, item) && !reexported {
        return Err(format!("{item} is not in {}", file.display()));
    }
    match segments[modules + 1..]
        .iter()
        .find(|s| !defined(crate_code, s))
    {
        Some(rest) => Err(format!("{rest} is not defined in the crate")),
        None => Ok(()),
    }
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
    let names = crate_names();
    let mut missing = Vec::new();
    for span in doc.split('`').skip(1).step_by(2) {
        let path_like = span.contains('/') && !span.contains(' ') && !span.contains("::");
        let ours = ["crates/", "dev/", "docs/", ".ci/"]
            .iter()
            .any(|p| span.starts_with(p));
        if path_like && ours && !span.contains(['*', '<', '{']) {
            if !root().join(span).exists() {
                missing.push(span.to_string());
            }
            continue;
        }
        let is_path = span.contains("::")
            && span
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == ':');
        if !is_path {
            continue;
        }
        let segments: Vec<&str> = span.split("::").filter(|s| !s.is_empty()).collect();
        match names.iter().find(|(name, _)| *name == segments[0]) {
            // A path into one of our crates: module by module.
            Some((_, dir)) => {
                let code: String = rust_files(&dir.join("src"))
                    .iter()
                    .map(|f| std::fs::read_to_string(f).unwrap())
                    .collect::<Vec<_>>()
                    .join("\n");
                if let Err(why) = resolves(dir, &segments[1..], &code) {
                    missing.push(format!("{span} ({why})"));
                }
            }
            // `Type::method`: each name is defined somewhere.
            None => {
                if let Some(s) = segments.iter().find(|s| !defined(&all_code, s)) {
                    missing.push(format!("{span} ({s} is not defined)"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what does not exist: {missing:#?}"
    );
}

/// Words that speak of how the product is made, not of the product.
const BANNED: [&str; 8] = [
    "the seed",
    "the spec's",
    "as landed",
    "seed's",
    "issue #",
    "this session",
    "previous binary",
    "the issue's",
];

/// What users read: README.md, docs/, the binary's own strings (help, output, the page) and
/// the messages of the crates it passes on.
#[test]
fn what_users_read_speaks_of_the_product() {
    let mut texts: Vec<PathBuf> = vec![root().join("README.md")];
    if let Ok(entries) = std::fs::read_dir(root().join("docs")) {
        texts.extend(entries.flatten().map(|e| e.path()));
    }
    let cli = root().join("crates/cli/src");
    texts.extend(rust_files(&cli));
    texts.push(cli.join("cmd_web/page.html"));
    // The crates whose messages the binary passes on: the server's answers, the resolver's and
    // the config readers' errors, the planner's reports and refusals, the benchmarks' output.
    for krate in [
        "server",
        "models",
        "configs",
        "fit",
        "bench",
        "term",
        "plan",
        "plan-frugal",
    ] {
        texts.extend(rust_files(&root().join("crates").join(krate).join("src")));
    }
    let mut found = Vec::new();
    for file in texts {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            // Whole words: "the seeded trace" is about a generator, not the making.
            let whole = |w: &&str| {
                lower.match_indices(*w).any(|(i, _)| {
                    let next = lower[i + w.len()..].chars().next().unwrap_or(' ');
                    !next.is_alphanumeric()
                })
            };
            if let Some(word) = BANNED.iter().find(|w| whole(w)) {
                found.push(format!("{}:{}: {word:?}", file.display(), i + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "user-facing text about the making: {found:#?}"
    );
}
