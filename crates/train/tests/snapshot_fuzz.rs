//! Mutated snapshots: the manifest, the train state and a weights shard, each mutated and (but
//! the manifest) re-listed with its new size and checksum, so the parsers behind the checksum
//! see the damage. Each opens and restores into a trainer or fails with an error; none panics.

mod common;

use common::{config, gpt2_tiny};
use std::path::Path;
use train::snapshot::{self, RunState, SaveOptions, Snapshot};
use train::Trainer;

fn trained() -> Trainer {
    let mut t = Trainer::new(config(gpt2_tiny(), 2, 8)).unwrap();
    t.init_weights(1);
    t.step(&mut |x, y| {
        x.fill(3);
        y.fill(4);
    })
    .unwrap();
    t
}

/// Writes `bytes` as `name` in `dir` and lists its size and checksum in the manifest.
fn relist(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
    let path = dir.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for f in m["files"].as_array_mut().unwrap() {
        if f["name"] == name {
            f["size_bytes"] = bytes.len().into();
            f["crc32"] = crc32fast::hash(bytes).into();
        }
    }
    std::fs::write(path, m.to_string()).unwrap();
}

#[test]
fn mutated_snapshots_open_and_restore_or_fail_clearly() {
    let root = std::env::temp_dir().join(format!("frugal-snapfuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let out = root.join("run");
    let mut t = trained();
    let run = RunState {
        loader: data::LoaderPosition {
            epoch: 0,
            batch_in_epoch: 1,
        },
        seed: 1,
        data: None,
    };
    snapshot::save(&mut t, &out, &run, &SaveOptions::default()).unwrap();
    let good = Snapshot::open(&out).unwrap().dir.clone();
    let names: Vec<String> = std::fs::read_dir(&good)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let originals: Vec<(String, Vec<u8>)> = names
        .iter()
        .map(|n| (n.clone(), std::fs::read(good.join(n)).unwrap()))
        .collect();
    let mut m = rng::mutate::Mutator::new(0x736e_6170);
    let (mut opened, mut refused, mut restored) = (0, 0, 0);
    let mut fresh = trained();
    for i in 0..600 {
        for (n, bytes) in &originals {
            std::fs::write(good.join(n), bytes).unwrap();
        }
        let (name, bytes) = &originals[i % originals.len()];
        let mutated = m.mutate(bytes);
        if name == "manifest.json" {
            std::fs::write(good.join(name), &mutated).unwrap();
        } else {
            relist(&good, name, &mutated);
        }
        match Snapshot::open(&good) {
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
            Ok(snap) => {
                opened += 1;
                let _ = snap.check_compatible(&fresh.config, 1);
                if snap.restore(&mut fresh).is_ok() {
                    restored += 1;
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    eprintln!("{opened} opened ({restored} restored), {refused} refused");
    assert!(refused > 100, "{opened} opened, {refused} refused");
}
