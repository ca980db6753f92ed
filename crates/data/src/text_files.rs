//! Loading a corpus from disk: one UTF-8 text file, or a folder of `.txt` files (this folder only,
//! not subfolders, sorted by file name so the token order is the same on every machine).
//!
//! This is one of the two modules of the crate that touch the file system (the other is
//! `token_file.rs`); it does no tokenizing.
//!
//! ```no_run
//! let corpus = data::load_text_path(std::path::Path::new("my_texts/")).unwrap();
//! println!("{} documents", corpus.documents.len());
//! ```

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use crate::corpus::{Corpus, Document};
use crate::error::{DataError, Result};

/// Loads `path`: a UTF-8 text file becomes a one-document corpus; a folder becomes one document per
/// `.txt` file in it, sorted by file name. Errors name the offending path: unreadable, not UTF-8,
/// a folder without `.txt` files, or no text at all.
pub fn load_text_path(path: &Path) -> Result<Corpus> {
    load_text_path_within(path, u64::MAX)
}

/// [`load_text_path`], refusing before reading a byte when the text is over `max_bytes` (the
/// memory it would be read into).
pub fn load_text_path_within(path: &Path, max_bytes: u64) -> Result<Corpus> {
    let meta = std::fs::metadata(path).map_err(|e| DataError::io("cannot read", path, e))?;
    let files = if meta.is_dir() {
        text_files_in(path)?
    } else if meta.is_file() {
        vec![path.to_path_buf()]
    } else {
        // A device or a pipe (/dev/zero) would be read without end.
        return Err(DataError::NotAFile {
            path: path.to_path_buf(),
        });
    };
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    if bytes > max_bytes {
        return Err(DataError::TooLarge {
            path: path.to_path_buf(),
            bytes,
            max: max_bytes,
        });
    }
    let mut documents = Vec::with_capacity(files.len());
    for file in &files {
        documents.push(Document {
            name: file_stem(file),
            text: Cow::Owned(read_utf8(file)?),
        });
    }
    let corpus = Corpus {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string()),
        documents,
    };
    if corpus.text_bytes() == 0 {
        return Err(DataError::EmptyText {
            path: path.to_path_buf(),
        });
    }
    Ok(corpus)
}

/// The `.txt` files directly inside `dir`, sorted by name.
fn text_files_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| DataError::io("cannot list", dir, e))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| DataError::io("cannot list", dir, e))?;
        let path = entry.path();
        let is_txt = path.extension().is_some_and(|ext| ext == "txt");
        if is_txt && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(DataError::NoTextFiles {
            path: dir.to_path_buf(),
        });
    }
    files.sort();
    Ok(files)
}

fn read_utf8(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| DataError::io("cannot read", path, e))?;
    String::from_utf8(bytes).map_err(|e| DataError::NotUtf8 {
        path: path.to_path_buf(),
        valid_up_to: e.utf8_error().valid_up_to(),
    })
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty folder under the system temp dir, unique per test.
    fn scratch_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("frugal-data-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn loads_a_file_and_a_folder_sorted_by_name() {
        let dir = scratch_dir("folder");
        std::fs::write(dir.join("b.txt"), "second").unwrap();
        std::fs::write(dir.join("a.txt"), "first").unwrap();
        std::fs::write(dir.join("notes.md"), "ignored").unwrap();
        let corpus = load_text_path(&dir).unwrap();
        let names: Vec<&str> = corpus.documents.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(corpus.documents[1].text, "second");

        let single = load_text_path(&dir.join("a.txt")).unwrap();
        assert_eq!(single.documents.len(), 1);
        assert_eq!(single.documents[0].text, "first");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_inputs_are_typed_errors_naming_the_path() {
        let dir = scratch_dir("bad");
        let missing = dir.join("missing.txt");
        let err = load_text_path(&missing).unwrap_err();
        assert!(matches!(err, DataError::Io { .. }), "{err}");
        assert!(err.to_string().contains("missing.txt"));

        std::fs::write(dir.join("latin1.txt"), b"caf\xe9").unwrap();
        let err = load_text_path(&dir.join("latin1.txt")).unwrap_err();
        assert!(
            matches!(err, DataError::NotUtf8 { valid_up_to: 3, .. }),
            "{err}"
        );

        std::fs::write(dir.join("empty.txt"), "").unwrap();
        let err = load_text_path(&dir.join("empty.txt")).unwrap_err();
        assert!(matches!(err, DataError::EmptyText { .. }), "{err}");

        let no_txt = dir.join("sub");
        std::fs::create_dir(&no_txt).unwrap();
        let err = load_text_path(&no_txt).unwrap_err();
        assert!(matches!(err, DataError::NoTextFiles { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
