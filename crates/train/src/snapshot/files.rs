//! The snapshot on disk: durable file writes (temporary name, fsync, rename, crc32), the manifest
//! that commits a snapshot, and the `--out` folder's bookkeeping (which snapshots are committed,
//! which are partial leftovers of a crash, which are old enough to delete).
//!
//! A snapshot is the folder `step-NNNNNN/` (the step count, zero-padded); it is committed exactly
//! when its `manifest.json` exists. The manifest is written last, under a temporary name, fsynced
//! and renamed into place, then the folder is fsynced, so a crash at any instant leaves either a
//! committed snapshot whose every file matches the manifest, or a folder without a manifest that
//! readers ignore and the next save deletes. Nothing here knows what the files hold.
//!
//! Example: `files::write_file(dir, "train.json", bytes)?` returns its [`FileEntry`].

use super::error::SnapshotError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The snapshot layout this code writes and reads. Bump it when a file's meaning changes.
pub const FORMAT_VERSION: u32 = 1;
pub const MANIFEST: &str = "manifest.json";
/// Suffix of a file being written; never read, deleted with its partial snapshot.
const TMP_SUFFIX: &str = ".tmp";

/// One file of a snapshot as the manifest records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    pub size_bytes: u64,
    pub crc32: u32,
}

/// What commits a snapshot: every file with its size and checksum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub step: u64,
    pub files: Vec<FileEntry>,
}

/// `step-000123`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:06}")
}

pub(crate) fn parse_step(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    (digits.len() >= 6 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Writes `dir/name` durably: a temporary file, fsynced, renamed into place.
pub fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<FileEntry, SnapshotError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let mut file = std::fs::File::create(&tmp)
        .map_err(SnapshotError::io(format!("creating {}", tmp.display())))?;
    if let Err(e) = file.write_all(bytes).and_then(|()| file.sync_all()) {
        // A full disk must not leave a partial file of the snapshot's size behind.
        drop(file);
        let _ = std::fs::remove_file(&tmp);
        return Err(SnapshotError::io(format!("writing {}", tmp.display()))(e));
    }
    drop(file);
    std::fs::rename(&tmp, &path).map_err(SnapshotError::io(format!(
        "renaming into {}",
        path.display()
    )))?;
    Ok(FileEntry {
        name: name.into(),
        size_bytes: bytes.len() as u64,
        crc32: crc32fast::hash(bytes),
    })
}

/// The entry of a file another rank wrote (read back, so the checksum is of what is on disk).
pub fn entry_of(dir: &Path, name: &str) -> Result<FileEntry, SnapshotError> {
    let path = dir.join(name);
    let bytes =
        std::fs::read(&path).map_err(SnapshotError::io(format!("reading {}", path.display())))?;
    Ok(FileEntry {
        name: name.into(),
        size_bytes: bytes.len() as u64,
        crc32: crc32fast::hash(&bytes),
    })
}

/// Makes the folder's entries (renames, creations) durable.
pub fn fsync_dir(dir: &Path) -> Result<(), SnapshotError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(SnapshotError::io(format!(
            "syncing the folder {}",
            dir.display()
        )))
}

/// Commits the snapshot in `dir`: the manifest last, then the folder synced.
pub fn commit(dir: &Path, manifest: &Manifest) -> Result<(), SnapshotError> {
    let json = serde_json::to_string_pretty(manifest).expect("a manifest serialises");
    write_file(dir, MANIFEST, json.as_bytes())?;
    fsync_dir(dir)
}

/// `step-*` folders of `out` with their step, committed or not, in step order.
fn step_dirs(out: &Path) -> Result<Vec<(u64, PathBuf)>, SnapshotError> {
    let entries = match std::fs::read_dir(out) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(SnapshotError::io(format!("listing {}", out.display()))(e)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(SnapshotError::io(format!("listing {}", out.display())))?;
        let name = entry.file_name();
        if let Some(step) = name.to_str().and_then(parse_step) {
            if entry.path().is_dir() {
                dirs.push((step, entry.path()));
            }
        }
    }
    dirs.sort();
    Ok(dirs)
}

pub fn is_committed(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file()
}

/// Committed snapshots in `out`, oldest first.
pub fn committed(out: &Path) -> Result<Vec<(u64, PathBuf)>, SnapshotError> {
    Ok(step_dirs(out)?
        .into_iter()
        .filter(|(_, d)| is_committed(d))
        .collect())
}

fn remove_dir(dir: &Path) -> Result<(), SnapshotError> {
    std::fs::remove_dir_all(dir).map_err(SnapshotError::io(format!("removing {}", dir.display())))
}

/// Deletes `step-*` folders without a manifest: leftovers of a save that crashed.
pub fn clean_partial(out: &Path) -> Result<(), SnapshotError> {
    for (_, dir) in step_dirs(out)? {
        if !is_committed(&dir) {
            remove_dir(&dir)?;
        }
    }
    Ok(())
}

/// Makes `dir` an empty folder for a new snapshot. A committed snapshot already there (an older
/// run's, at the same step) is uncommitted first, so a crash never leaves it half-deleted but
/// still marked committed.
pub fn fresh_dir(out: &Path, dir: &Path) -> Result<(), SnapshotError> {
    if dir.exists() {
        let manifest = dir.join(MANIFEST);
        if manifest.exists() {
            std::fs::remove_file(&manifest).map_err(SnapshotError::io(format!(
                "removing {}",
                manifest.display()
            )))?;
            fsync_dir(dir)?;
        }
        remove_dir(dir)?;
    }
    std::fs::create_dir_all(dir)
        .map_err(SnapshotError::io(format!("creating {}", dir.display())))?;
    fsync_dir(out)
}

/// Deletes all but the newest `keep` committed snapshots (`keep` >= 1).
pub fn prune(out: &Path, keep: usize) -> Result<(), SnapshotError> {
    assert!(keep >= 1, "the snapshot just committed is always kept");
    let all = committed(out)?;
    let excess = all.len().saturating_sub(keep);
    for (_, dir) in &all[..excess] {
        // Uncommit first: a crash mid-delete must not leave a damaged "committed" snapshot.
        std::fs::remove_file(dir.join(MANIFEST))
            .map_err(SnapshotError::io(format!("removing {}", dir.display())))?;
        remove_dir(dir)?;
    }
    if excess > 0 {
        fsync_dir(out)?;
    }
    Ok(())
}

/// Reads and checks `dir`'s manifest: a format version this code knows, file names that stay
/// inside the folder.
pub fn read_manifest(dir: &Path) -> Result<Manifest, SnapshotError> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path)
        .map_err(SnapshotError::io(format!("reading {}", path.display())))?;
    let bad = |reason: String| SnapshotError::BadManifest {
        path: path.clone(),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    // The version is read alone first: a future layout may change every other field.
    let found = value
        .get("format_version")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| bad("no format_version".into()))?;
    if found != u64::from(FORMAT_VERSION) {
        return Err(SnapshotError::UnknownVersion {
            path,
            found: found.min(u64::from(u32::MAX)) as u32,
            supported: FORMAT_VERSION,
        });
    }
    let manifest: Manifest =
        serde_json::from_value(value).map_err(|e| bad(format!("unexpected fields: {e}")))?;
    if let Some(f) = manifest
        .files
        .iter()
        .find(|f| f.name.contains(['/', '\\']) || f.name.starts_with('.'))
    {
        return Err(bad(format!("file name {:?} leaves the folder", f.name)));
    }
    Ok(manifest)
}

/// The bytes of `entry`, checked against its size and checksum.
pub fn read_verified(dir: &Path, entry: &FileEntry) -> Result<Vec<u8>, SnapshotError> {
    let path = dir.join(&entry.name);
    let bytes =
        std::fs::read(&path).map_err(SnapshotError::io(format!("reading {}", path.display())))?;
    if bytes.len() as u64 != entry.size_bytes {
        return Err(SnapshotError::SizeMismatch {
            path,
            expected_bytes: entry.size_bytes,
            found_bytes: bytes.len() as u64,
        });
    }
    let found = crc32fast::hash(&bytes);
    if found != entry.crc32 {
        return Err(SnapshotError::ChecksumMismatch {
            path,
            expected: entry.crc32,
            found,
        });
    }
    Ok(bytes)
}
