//! Snapshot faults: a damaged file is found by its size or checksum with an error naming it; a
//! snapshot of another model or setup is refused with every difference listed; an unknown format
//! version is refused; a save that died half-way is ignored and cleaned up; a rank that dies
//! mid-step leaves the last snapshot untouched.

mod common;

use comm::Collective;
use common::{config, gpt2_tiny};
use std::path::{Path, PathBuf};
use train::snapshot::{self, RunState, SaveOptions, Snapshot, SnapshotError};
use train::Trainer;

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("frugal-snapfault-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn run_state() -> RunState {
    RunState {
        loader: data::LoaderPosition {
            epoch: 0,
            batch_in_epoch: 2,
        },
        seed: 1,
        data: None,
    }
}

/// A trainer after `steps` constant-token steps.
fn trained(steps: u64) -> Trainer {
    let mut t = Trainer::new(config(gpt2_tiny(), 2, 8)).unwrap();
    t.init_weights(1);
    for _ in 0..steps {
        t.step(&mut |x, y| {
            x.fill(3);
            y.fill(4);
        })
        .unwrap();
    }
    t
}

/// `out` with committed snapshots after steps 1 and 2.
fn two_snapshots(out: &Path) -> Trainer {
    let mut t = trained(1);
    snapshot::save(&mut t, out, &run_state(), &SaveOptions::default()).unwrap();
    t.step(&mut |x, y| {
        x.fill(5);
        y.fill(6);
    })
    .unwrap();
    snapshot::save(&mut t, out, &run_state(), &SaveOptions::default()).unwrap();
    t
}

fn step_dir(out: &Path, step: u64) -> PathBuf {
    out.join(format!("step-{step:06}"))
}

#[test]
fn a_truncated_file_is_found_and_named() {
    let out = temp_dir("truncated");
    two_snapshots(&out);
    let shard = step_dir(&out, 2).join("optim-rank-00000-of-00001.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    match Snapshot::open(&step_dir(&out, 2)) {
        Err(e @ SnapshotError::SizeMismatch { .. }) => {
            assert!(e.to_string().contains("optim-rank-00000-of-00001"), "{e}")
        }
        other => panic!("expected a size mismatch, got {:?}", other.err()),
    }
    // The older snapshot is whole and still opens; from the run's folder it is the one taken,
    // naming the damaged newer one.
    assert_eq!(Snapshot::open(&step_dir(&out, 1)).unwrap().state.step, 1);
    let fallback = Snapshot::open(&out).unwrap();
    assert_eq!(fallback.state.step, 1);
    assert_eq!(fallback.skipped.len(), 1);
    assert_eq!(fallback.skipped[0].0, step_dir(&out, 2));
    assert!(fallback.skipped[0].1.contains("optim-rank-00000-of-00001"));
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_flipped_bit_is_found_by_the_checksum_and_named() {
    let out = temp_dir("bitflip");
    two_snapshots(&out);
    for name in [
        "model.safetensors",
        "optim-rank-00000-of-00001.safetensors",
        "train.json",
    ] {
        let path = step_dir(&out, 2).join(name);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() - 3;
        bytes[at] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        match Snapshot::open(&step_dir(&out, 2)) {
            Err(e @ SnapshotError::ChecksumMismatch { .. }) => {
                assert!(e.to_string().contains(name), "{e}")
            }
            other => panic!("{name}: expected a checksum error, got {:?}", other.err()),
        }
        bytes[at] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        Snapshot::open(&out).unwrap();
    }
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_snapshot_of_another_model_or_setup_is_refused_listing_the_differences() {
    let out = temp_dir("mismatch");
    two_snapshots(&out);
    let snap = Snapshot::open(&out).unwrap();
    let mut shape = gpt2_tiny();
    shape.d_ff = 64;
    let mut cfg = config(shape, 2, 8);
    cfg.schedule.lr = 5e-4;
    let other = Trainer::new(cfg).unwrap();
    let err = snap.check_compatible(&other.config, 1).unwrap_err();
    let SnapshotError::Mismatch { differences, .. } = &err else {
        panic!("expected a mismatch, got {err}");
    };
    let fields: Vec<&str> = differences.iter().map(|d| d.field.as_str()).collect();
    assert_eq!(fields, ["model.d_ff", "run.lr"], "{err}");
    let text = err.to_string();
    assert!(
        text.contains("model.d_ff: snapshot 128 vs this run 64"),
        "{text}"
    );
    assert!(
        text.contains("run.lr: snapshot 0.001 vs this run 0.0005"),
        "{text}"
    );
    // Another seed is another data order: refused too. The same model and setup is accepted.
    let same = trained(0);
    assert!(snap.check_compatible(&same.config, 2).is_err());
    snap.check_compatible(&same.config, 1).unwrap();
    // Restoring the other model (skipping the check) is refused by the shard layouts, and
    // changes nothing.
    let mut other = other;
    let before = engine::io::to_safetensors(&other.model, &other.arena);
    assert!(matches!(
        snap.restore(&mut other),
        Err(SnapshotError::BadContents { .. })
    ));
    assert_eq!(
        engine::io::to_safetensors(&other.model, &other.arena),
        before
    );
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn an_unknown_format_version_is_refused() {
    let out = temp_dir("version");
    two_snapshots(&out);
    let manifest = step_dir(&out, 2).join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let future = text.replace("\"format_version\": 1", "\"format_version\": 99");
    assert_ne!(text, future);
    std::fs::write(&manifest, future).unwrap();
    match Snapshot::open(&step_dir(&out, 2)) {
        Err(e @ SnapshotError::UnknownVersion { found: 99, .. }) => {
            assert!(e.to_string().contains("version 99"), "{e}")
        }
        other => panic!("expected an unknown version, got {:?}", other.err()),
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// What a save killed before its manifest leaves behind: a step folder with some files and a
/// temporary file. Readers ignore it; the next save deletes it.
#[test]
fn a_save_that_died_half_way_is_ignored_then_cleaned_up() {
    let out = temp_dir("partial");
    let mut t = two_snapshots(&out);
    let partial = step_dir(&out, 3);
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("model.safetensors"), b"half of a file").unwrap();
    std::fs::write(partial.join("train.json.tmp"), b"{").unwrap();
    let snap = Snapshot::open(&out).unwrap();
    assert_eq!((snap.state.step, snap.dir.clone()), (2, step_dir(&out, 2)));
    assert!(matches!(
        Snapshot::open(&partial),
        Err(SnapshotError::NotFound { .. })
    ));
    t.step = 4;
    snapshot::save(&mut t, &out, &run_state(), &SaveOptions::default()).unwrap();
    assert!(!partial.exists(), "the partial snapshot is deleted");
    assert_eq!(Snapshot::open(&out).unwrap().state.step, 4);
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_folder_without_snapshots_is_refused() {
    let out = temp_dir("empty");
    std::fs::create_dir_all(&out).unwrap();
    let err = Snapshot::open(&out).err().unwrap();
    assert!(matches!(err, SnapshotError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("holds no committed snapshot"));
    std::fs::remove_dir_all(&out).unwrap();
}

/// Every file of a folder with its bytes.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = walk(dir);
    files.sort();
    files
}

fn walk(dir: &Path) -> Vec<(String, Vec<u8>)> {
    std::fs::read_dir(dir)
        .unwrap()
        .flat_map(|e| {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p)
            } else {
                vec![(p.display().to_string(), std::fs::read(&p).unwrap())]
            }
        })
        .collect()
}

/// Two ranks save after step 1; in step 2 rank 1 fails (a token beyond the vocabulary). Both
/// ranks end with an error (rank 0's names rank 1) and the snapshot folder is byte for byte as
/// it was.
#[test]
fn a_rank_that_dies_mid_step_leaves_the_last_snapshot_untouched() {
    let out = temp_dir("rankdies");
    let mut cfg = config(gpt2_tiny(), 1, 8);
    cfg.ranks = 2;
    let results = common::on_ranks(2, |c| {
        let rank = c.rank();
        let mut t = Trainer::with_comm(cfg.clone(), c).unwrap();
        t.init_weights(1);
        let good = |x: &mut [u32], y: &mut [u32]| {
            x.fill(3);
            y.fill(4);
        };
        t.step(&mut { good }).unwrap();
        snapshot::save(&mut t, &out, &run_state(), &SaveOptions::default()).unwrap();
        t.barrier().unwrap();
        let snapshot_files = (rank == 0).then(|| contents(&out));
        let bad = if rank == 1 { 96 } else { 3 };
        let result = t.step(&mut |x, y| {
            x.fill(bad);
            y.fill(4);
        });
        (result.map(|_| ()), snapshot_files)
    });
    let before = results[0].1.clone().unwrap();
    let outcomes: Vec<_> = results.into_iter().map(|r| r.0).collect();
    common::assert_rank_failure_named(&outcomes, 1);
    assert_eq!(contents(&out), before, "the snapshot folder changed");
    let snap = Snapshot::open(&out).unwrap();
    assert_eq!((snap.state.step, snap.shard_count()), (1, 2));
    std::fs::remove_dir_all(&out).unwrap();
}
