//! Every collective of the in-process backend, for 1-4 ranks, f32 and bf16, against the serial
//! reference, bit for bit; determinism under random thread timing; byte counters.

mod common;

use comm::{reference, Collective, ReduceOp};
use common::*;
use half::bf16;
use std::time::Duration;

const OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max];
/// Lengths around the kernel's 1024-element block and not divisible by 3 or 4.
const LENS: [usize; 4] = [0, 1, 7, 2501];

#[test]
fn order_matters_for_the_test_data() {
    // Guards the bit-exact tests below: with these inputs a different summation order gives a
    // different answer, so a backend that reduced in any other order would fail them.
    let inputs: Vec<Vec<f32>> = (0..4).map(|r| f32_input(r, 2501, 1)).collect();
    let fwd: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    let rev: Vec<&[f32]> = fwd.iter().rev().copied().collect();
    let a = reference::reduce_f32(&fwd, ReduceOp::Sum);
    let b = reference::reduce_f32(&rev, ReduceOp::Sum);
    assert_ne!(bits_f32(&a), bits_f32(&b));
}

#[test]
fn all_reduce_matches_reference() {
    for n in 1..=4 {
        for op in OPS {
            for len in LENS {
                let got = run_ok(n, |mut c| {
                    let mut a = f32_input(c.rank(), len, 2);
                    let mut b = bf16_input(c.rank(), len, 3);
                    c.all_reduce(a.as_mut_slice().into(), op).unwrap();
                    c.all_reduce(b.as_mut_slice().into(), op).unwrap();
                    (a, b)
                });
                let a_in: Vec<Vec<f32>> = (0..n).map(|r| f32_input(r, len, 2)).collect();
                let b_in: Vec<Vec<bf16>> = (0..n).map(|r| bf16_input(r, len, 3)).collect();
                let a_ref =
                    reference::reduce_f32(&a_in.iter().map(|v| &v[..]).collect::<Vec<_>>(), op);
                let b_ref =
                    reference::reduce_bf16(&b_in.iter().map(|v| &v[..]).collect::<Vec<_>>(), op);
                for (rank, (a, b)) in got.iter().enumerate() {
                    assert_eq!(
                        bits_f32(a),
                        bits_f32(&a_ref),
                        "f32 n={n} {op:?} len={len} rank {rank}"
                    );
                    assert_eq!(
                        bits_bf16(b),
                        bits_bf16(&b_ref),
                        "bf16 n={n} {op:?} len={len} rank {rank}"
                    );
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_matches_reference() {
    for n in 1..=4 {
        for op in OPS {
            for shard in LENS {
                let got = run_ok(n, |mut c| {
                    let a = f32_input(c.rank(), n * shard, 4);
                    let b = bf16_input(c.rank(), n * shard, 5);
                    let mut a_out = vec![f32::NAN; shard];
                    let mut b_out = vec![bf16::NAN; shard];
                    c.reduce_scatter(a.as_slice().into(), a_out.as_mut_slice().into(), op)
                        .unwrap();
                    c.reduce_scatter(b.as_slice().into(), b_out.as_mut_slice().into(), op)
                        .unwrap();
                    (a_out, b_out)
                });
                let a_in: Vec<Vec<f32>> = (0..n).map(|r| f32_input(r, n * shard, 4)).collect();
                let b_in: Vec<Vec<bf16>> = (0..n).map(|r| bf16_input(r, n * shard, 5)).collect();
                let a_ref =
                    reference::reduce_f32(&a_in.iter().map(|v| &v[..]).collect::<Vec<_>>(), op);
                let b_ref =
                    reference::reduce_bf16(&b_in.iter().map(|v| &v[..]).collect::<Vec<_>>(), op);
                for (rank, (a, b)) in got.iter().enumerate() {
                    let range = rank * shard..(rank + 1) * shard;
                    assert_eq!(
                        bits_f32(a),
                        bits_f32(&a_ref[range.clone()]),
                        "f32 n={n} {op:?} shard={shard} rank {rank}"
                    );
                    assert_eq!(
                        bits_bf16(b),
                        bits_bf16(&b_ref[range]),
                        "bf16 n={n} {op:?} shard={shard} rank {rank}"
                    );
                }
            }
        }
    }
}

#[test]
fn in_place_forms_match_out_of_place() {
    for n in 1..=4 {
        for shard in LENS {
            let got = run_ok(n, |mut c| {
                let r = c.rank();
                let mut a = f32_input(r, n * shard, 10);
                let mut b = bf16_input(r, n * shard, 11);
                c.reduce_scatter_in_place(a.as_mut_slice().into(), ReduceOp::Sum)
                    .unwrap();
                c.reduce_scatter_in_place(b.as_mut_slice().into(), ReduceOp::Avg)
                    .unwrap();
                // Gather the reduced shards back: the all-reduce, done the ZeRO way.
                c.all_gather_in_place(a.as_mut_slice().into()).unwrap();
                c.all_gather_in_place(b.as_mut_slice().into()).unwrap();
                (a, b)
            });
            let a_in: Vec<Vec<f32>> = (0..n).map(|r| f32_input(r, n * shard, 10)).collect();
            let b_in: Vec<Vec<bf16>> = (0..n).map(|r| bf16_input(r, n * shard, 11)).collect();
            let a_ref = reference::reduce_f32(
                &a_in.iter().map(|v| &v[..]).collect::<Vec<_>>(),
                ReduceOp::Sum,
            );
            let b_ref = reference::reduce_bf16(
                &b_in.iter().map(|v| &v[..]).collect::<Vec<_>>(),
                ReduceOp::Avg,
            );
            for (rank, (a, b)) in got.iter().enumerate() {
                assert_eq!(
                    bits_f32(a),
                    bits_f32(&a_ref),
                    "f32 n={n} shard={shard} rank {rank}"
                );
                assert_eq!(
                    bits_bf16(b),
                    bits_bf16(&b_ref),
                    "bf16 n={n} shard={shard} rank {rank}"
                );
            }
        }
    }
}

#[test]
fn all_gather_concatenates_in_rank_order() {
    for n in 1..=4 {
        for shard in LENS {
            let got = run_ok(n, |mut c| {
                let a = f32_input(c.rank(), shard, 6);
                let b = bf16_input(c.rank(), shard, 7);
                let mut a_out = vec![f32::NAN; n * shard];
                let mut b_out = vec![bf16::NAN; n * shard];
                c.all_gather(a.as_slice().into(), a_out.as_mut_slice().into())
                    .unwrap();
                c.all_gather(b.as_slice().into(), b_out.as_mut_slice().into())
                    .unwrap();
                (a_out, b_out)
            });
            let a_ref: Vec<f32> = (0..n).flat_map(|r| f32_input(r, shard, 6)).collect();
            let b_ref: Vec<bf16> = (0..n).flat_map(|r| bf16_input(r, shard, 7)).collect();
            for (a, b) in &got {
                assert_eq!(bits_f32(a), bits_f32(&a_ref), "f32 n={n} shard={shard}");
                assert_eq!(bits_bf16(b), bits_bf16(&b_ref), "bf16 n={n} shard={shard}");
            }
        }
    }
}

#[test]
fn broadcast_copies_the_root() {
    for n in 1..=4 {
        for root in 0..n {
            let got = run_ok(n, |mut c| {
                let mut a = f32_input(c.rank(), 2501, 8);
                let mut b = bf16_input(c.rank(), 7, 9);
                c.broadcast(a.as_mut_slice().into(), root).unwrap();
                c.broadcast(b.as_mut_slice().into(), root).unwrap();
                c.barrier().unwrap();
                (a, b)
            });
            for (a, b) in &got {
                assert_eq!(
                    bits_f32(a),
                    bits_f32(&f32_input(root, 2501, 8)),
                    "n={n} root={root}"
                );
                assert_eq!(
                    bits_bf16(b),
                    bits_bf16(&bf16_input(root, 7, 9)),
                    "n={n} root={root}"
                );
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_thread_timing() {
    const N_CALLS: usize = 12;
    let run_once = |seed: u64| {
        run_ok(4, |mut c| {
            let mut rng = Rng::new(seed * 31 + c.rank() as u64);
            let mut out = Vec::new();
            for call in 0..N_CALLS {
                std::thread::sleep(Duration::from_micros(rng.next_u64() % 1500));
                let mut a = f32_input(c.rank(), 3001, 100 + call as u64);
                c.all_reduce(a.as_mut_slice().into(), ReduceOp::Sum)
                    .unwrap();
                out.push(bits_f32(&a));
            }
            out
        })
    };
    let first = run_once(1);
    for seed in 2..4 {
        assert_eq!(run_once(seed), first, "timing changed a result");
    }
    for call in 0..N_CALLS {
        let inputs: Vec<Vec<f32>> = (0..4)
            .map(|r| f32_input(r, 3001, 100 + call as u64))
            .collect();
        let want = reference::reduce_f32(
            &inputs.iter().map(|v| &v[..]).collect::<Vec<_>>(),
            ReduceOp::Sum,
        );
        for rank_out in &first {
            assert_eq!(rank_out[call], bits_f32(&want), "call {call}");
        }
    }
}

#[test]
fn scalar_helpers_for_norms_and_overflow_flags() {
    let got = run_ok(3, |c| {
        // Through a trait object, as the engine holds it.
        let mut c: Box<dyn Collective> = Box::new(c);
        let r = c.rank();
        let sum = c.all_reduce_f32(r as f32 + 0.5, ReduceOp::Sum).unwrap();
        let max = c.all_reduce_f32(r as f32, ReduceOp::Max).unwrap();
        let any_found = c.any(r == 2).unwrap();
        let none_found = c.any(false).unwrap();
        let nan_max = c
            .all_reduce_f32(if r == 1 { f32::NAN } else { 1.0 }, ReduceOp::Max)
            .unwrap();
        (sum, max, any_found, none_found, nan_max.is_nan())
    });
    assert!(
        got.iter().all(|g| *g == (4.5, 2.0, true, false, true)),
        "{got:?}"
    );
}

#[test]
fn bytes_are_counted_as_a_ring_moves_them() {
    let got = run_ok(4, |c| {
        let mut c = comm::Counted::new(c);
        let mut grads = vec![1.0f32; 1000]; // 4000 bytes
        c.all_reduce(grads.as_mut_slice().into(), ReduceOp::Sum)
            .unwrap();
        let mut shard = vec![0.0f32; 250];
        c.reduce_scatter(
            grads.as_slice().into(),
            shard.as_mut_slice().into(),
            ReduceOp::Avg,
        )
        .unwrap();
        c.all_gather(shard.as_slice().into(), grads.as_mut_slice().into())
            .unwrap();
        let mut half_buf = vec![bf16::ZERO; 1000]; // 2000 bytes
        c.broadcast(half_buf.as_mut_slice().into(), 0).unwrap();
        c.barrier().unwrap();
        c.stats()
    });
    for s in &got {
        assert_eq!((s.all_reduce.calls, s.all_reduce.sent_bytes), (1, 6000));
        assert_eq!(s.reduce_scatter.sent_bytes, 3000);
        assert_eq!(s.all_gather.received_bytes, 3000);
        assert_eq!(s.broadcast.sent_bytes, 1500);
        assert_eq!((s.barrier.calls, s.barrier.sent_bytes), (1, 0));
        assert_eq!(s.total_sent_bytes(), 13_500);
    }
    let one = run_ok(1, |c| {
        let mut c = comm::Counted::new(c);
        let mut g = vec![1.0f32; 1000];
        c.all_reduce(g.as_mut_slice().into(), ReduceOp::Sum)
            .unwrap();
        c.stats()
    });
    assert_eq!(one[0].total_sent_bytes(), 0, "a world of one moves nothing");
}

#[test]
fn split_makes_groups_that_reduce_among_themselves() {
    // 4 ranks, colour = rank % 2, key reversing the order: groups {0, 2} and {1, 3}.
    let got = run_ok(4, |mut c| {
        let r = c.rank();
        let mut group = c.split((r % 2) as u32, (10 - r) as u32).unwrap();
        let mut v = [r as f32];
        group
            .all_reduce(v.as_mut_slice().into(), ReduceOp::Sum)
            .unwrap();
        // The parent still works after the split.
        let mut all = [1.0f32];
        c.all_reduce(all.as_mut_slice().into(), ReduceOp::Sum)
            .unwrap();
        (group.rank(), group.world_size(), v[0], all[0])
    });
    assert_eq!(
        got[0],
        (1, 2, 2.0, 4.0),
        "rank 0: second by key in {{0, 2}}"
    );
    assert_eq!(got[2], (0, 2, 2.0, 4.0));
    assert_eq!(got[1], (1, 2, 4.0, 4.0));
    assert_eq!(got[3], (0, 2, 4.0, 4.0));
}

#[test]
fn u64_values_gather_exactly_and_solo_is_a_world_of_one() {
    let got = run_ok(3, |mut c| {
        let v = [u64::MAX - c.rank() as u64, 151_073_024 + c.rank() as u64];
        c.all_gather_u64(&v).unwrap()
    });
    let want: Vec<u64> = (0..3u64)
        .flat_map(|r| [u64::MAX - r, 151_073_024 + r])
        .collect();
    assert!(got.iter().all(|g| *g == want), "{got:?}");
    let mut solo = comm::Solo::new();
    assert_eq!(solo.all_gather_u64(&[7, 8]).unwrap(), vec![7, 8]);
    let mut out = [0.0f32; 3];
    let err = solo
        .all_gather([1.0f32; 2].as_slice().into(), out.as_mut_slice().into())
        .unwrap_err();
    assert!(err.to_string().contains("bad arguments"), "{err}");
    solo.abort("test");
    assert!(matches!(
        solo.barrier(),
        Err(comm::CommError::Aborted { .. })
    ));
}
