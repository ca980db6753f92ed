//! Offloaded optimizer state: the host step (in memory, in a memory-mapped file, and on a host
//! `Arena` carved from a plan) equals `kernels::adamw::update` bit for bit, the file has the
//! right size and holds the values, and a file that cannot be created is a typed error.

use cpu::Views;
use engine::Arena;
use half::bf16;
use kernels::adamw::{self, AdamW};
use plan::buffer::{Buffer, Category, Device, Lifetime, MemoryPlan};
use plan_frugal::{Key, UnitKind};
use std::path::PathBuf;
use train::offload::{OffloadError, OffloadStore};
use train::precision::{Grads, MasterStep, Working};

const OPT: AdamW = AdamW::new(1e-3, (0.9, 0.999), 1e-8, 0.1);

fn values(n: usize, seed: u32) -> Vec<f32> {
    train::testkit::values(n, u64::from(seed), 1.0)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Unique scratch path under the system temp dir.
fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("frugal-offload-{}-{name}", std::process::id()))
}

/// Runs three steps on `store` and on plain vectors with the kernel; compares every bit.
fn check_store_against_kernel(store: &mut OffloadStore, numels: &[u64]) {
    let mut reference: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = Vec::new();
    for (i, &n) in numels.iter().enumerate() {
        let init = values(n as usize, i as u32 + 1);
        store.unit(i).master.copy_from_slice(&init);
        reference.push((init, vec![0.0; n as usize], vec![0.0; n as usize]));
    }
    for step in 1..=3u32 {
        for (i, (p, m, v)) in reference.iter_mut().enumerate() {
            let g = values(p.len(), 100 * step + i as u32);
            adamw::update(p, &g, m, v, OPT, step);
            let mut working = vec![bf16::ZERO; p.len()];
            let s = MasterStep {
                opt: OPT,
                step,
                grad_multiplier: 1.0,
            };
            store.step_unit(i, Grads::F32(&g), Some(Working::Bf16(&mut working)), s);
            let got = store.unit(i);
            assert_eq!(bits(got.master), bits(p), "unit {i} step {step}: master");
            assert_eq!(bits(got.m), bits(m), "unit {i} step {step}: m");
            assert_eq!(bits(got.v), bits(v), "unit {i} step {step}: v");
            let narrowed: Vec<u16> = p.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
            let working: Vec<u16> = working.iter().map(|w| w.to_bits()).collect();
            assert_eq!(working, narrowed, "unit {i}: working copy");
        }
    }
}

const NUMELS: [u64; 3] = [40_000, 7, 70_001];

#[test]
fn in_memory_step_equals_the_kernel_bit_for_bit() {
    let mut store = OffloadStore::in_memory(&NUMELS);
    assert_eq!(store.n_units(), 3);
    check_store_against_kernel(&mut store, &NUMELS);
}

#[test]
fn disk_step_equals_the_kernel_and_the_file_holds_the_state() {
    let path = scratch("state.bin");
    let mut store = OffloadStore::on_disk(&path, &NUMELS).unwrap();
    // 3 arrays per unit, each unit's region rounded up to 16 f32.
    let want_elems: u64 = NUMELS.iter().map(|n| (3 * n).div_ceil(16) * 16).sum();
    assert_eq!(store.bytes(), 4 * want_elems);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), store.bytes());
    assert_eq!(store.path(), Some(path.as_path()));
    assert!(store.unit(2).v.iter().all(|&x| x == 0.0), "starts zeroed");
    check_store_against_kernel(&mut store, &NUMELS);
    store.flush().unwrap();
    // Unit 1 starts at the rounded end of unit 0: its master weights are in the file there.
    let file = std::fs::read(&path).unwrap();
    let offset = 4 * (3 * NUMELS[0] as usize).div_ceil(16) * 16;
    let first = f32::from_le_bytes(file[offset..offset + 4].try_into().unwrap());
    assert_eq!(first.to_bits(), store.unit(1).master[0].to_bits());
    drop(store);
    assert!(!path.exists(), "the scratch file is removed with the store");
}

#[test]
fn a_file_that_cannot_be_created_is_a_typed_error() {
    let missing_dir = scratch("no-such-dir").join("state.bin");
    let Err(err) = OffloadStore::on_disk(&missing_dir, &NUMELS) else {
        panic!("created a file in a missing directory");
    };
    match &err {
        OffloadError::CreateFile { path, reason } => {
            assert_eq!(path, &missing_dir);
            assert!(reason.contains("No such file"), "{reason}");
        }
        other => panic!("wrong error {other:?}"),
    }
    assert!(err.to_string().contains(&*missing_dir.to_string_lossy()));
    // An existing file is never overwritten.
    let existing = scratch("existing.bin");
    std::fs::write(&existing, b"keep me").unwrap();
    let Err(err) = OffloadStore::on_disk(&existing, &NUMELS) else {
        panic!("overwrote an existing file");
    };
    assert!(matches!(err, OffloadError::CreateFile { .. }), "{err}");
    assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");
    std::fs::remove_file(&existing).unwrap();
    let Err(err) = OffloadStore::on_disk(&scratch("empty.bin"), &[]) else {
        panic!("mapped an empty file");
    };
    assert!(matches!(err, OffloadError::Empty));
}

#[test]
fn the_step_runs_on_a_host_arena_carved_from_a_plan() {
    let n = 50_000u64;
    let mut plan = MemoryPlan::new(1);
    let host = |key: Key, category| {
        Buffer::keyed(key, category, Device::Host, 4 * n, Lifetime::Persistent)
    };
    let unit = UnitKind::Block(0);
    let keys = [Key::Master(unit), Key::OptM(unit), Key::OptV(unit)];
    plan.push(host(keys[0], Category::Params));
    plan.push(host(keys[1], Category::Optimizer));
    plan.push(host(keys[2], Category::Optimizer));
    let arena = Arena::new(cpu::Cpu::new(), &plan, Device::Host, None).unwrap();
    assert_eq!(arena.measured().peak_bytes, 12 * n);
    let ids = keys.map(|key| arena.id(key));
    let init = values(n as usize, 9);
    arena.f32_mut(ids[0]).copy_from_slice(&init);
    let (mut p, mut m, mut v) = (init, vec![0.0f32; n as usize], vec![0.0f32; n as usize]);
    for step in 1..=2 {
        let g = values(n as usize, 50 + step);
        adamw::update(&mut p, &g, &mut m, &mut v, OPT, step);
        let (mut master, mut am, mut av) = (
            arena.f32_mut(ids[0]),
            arena.f32_mut(ids[1]),
            arena.f32_mut(ids[2]),
        );
        let s = MasterStep {
            opt: OPT,
            step,
            grad_multiplier: 1.0,
        };
        train::precision::adamw_master_step(&mut master, &mut am, &mut av, Grads::F32(&g), None, s);
        assert_eq!(bits(&master), bits(&p));
        assert_eq!((bits(&am), bits(&av)), (bits(&m), bits(&v)));
    }
}
