//! Faults: a rank that panics, stalls, leaves, aborts, mismatches its call or passes bad
//! buffers makes every other rank return an error naming it within bounded time, never hang.
//! Timeouts are 200 ms so the suite stays fast; "bounded" is asserted with generous slack.

mod common;

use comm::{Collective, CommError, InProcess, ReduceOp};
use common::*;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(200);
/// Far above the timeout, far below a hang: what "within bounded time" means here.
const BOUND: Duration = Duration::from_secs(3);

fn all_reduce_once(c: &mut impl Collective, len: usize) -> Result<Vec<f32>, CommError> {
    let mut buf = vec![1.0f32; len];
    c.all_reduce(buf.as_mut_slice().into(), ReduceOp::Sum)?;
    Ok(buf)
}

#[test]
fn empty_world_is_an_error() {
    assert_eq!(InProcess::world(0).err(), Some(CommError::EmptyWorld));
}

#[test]
fn a_panicking_rank_fails_the_others_naming_it() {
    let start = Instant::now();
    let got = run_world(4, TIMEOUT, |mut c| {
        for _ in 0..3 {
            all_reduce_once(&mut c, 100)?;
        }
        if c.rank() == 1 {
            panic!("rank 1 breaks mid-training");
        }
        // The others are already waiting in this call when rank 1 dies.
        all_reduce_once(&mut c, 100)
    });
    assert!(start.elapsed() < BOUND, "took {:?}", start.elapsed());
    assert!(got[1].as_ref().unwrap_err().contains("rank 1 breaks"));
    for r in [0, 2, 3] {
        let err = expect_err(&got[r]);
        assert_eq!(
            *err,
            CommError::RankGone {
                rank: 1,
                panicked: true
            },
            "rank {r}"
        );
        assert!(err.to_string().contains("rank 1 panicked"));
    }
}

#[test]
fn a_stalled_rank_times_out_the_others_naming_it() {
    let start = Instant::now();
    let got = run_world(3, TIMEOUT, |mut c| {
        all_reduce_once(&mut c, 10)?;
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(800));
        }
        let t0 = Instant::now();
        let result = all_reduce_once(&mut c, 10);
        Ok::<_, CommError>((result, t0.elapsed()))
    });
    assert!(start.elapsed() < BOUND);
    for (rank, g) in got.iter().enumerate() {
        let (result, waited) = g.as_ref().unwrap().as_ref().unwrap();
        match result {
            Err(CommError::Timeout {
                late, op, call_idx, ..
            }) => {
                assert_eq!(
                    (late.as_slice(), *op, *call_idx),
                    (&[2][..], "all_reduce", 1),
                    "rank {rank}"
                );
            }
            other => panic!("rank {rank}: expected a timeout naming rank 2, got {other:?}"),
        }
        if rank != 2 {
            // The first rank to time out fails the world, so a rank that entered the call
            // later returns before its own full timeout: only the detector waits all of it.
            assert!(*waited < TIMEOUT * 4, "rank {rank} waited {waited:?}");
        }
    }
    let longest = (got.iter().take(2))
        .map(|g| g.as_ref().unwrap().as_ref().unwrap().1)
        .max()
        .unwrap();
    assert!(longest >= TIMEOUT, "the detector waited only {longest:?}");
    let Ok(Ok((Err(err), _))) = &got[0] else {
        unreachable!("checked above")
    };
    assert!(err.to_string().contains("rank(s) [2]"), "{err}");
}

#[test]
fn a_rank_that_leaves_early_fails_the_others() {
    let got = run_world(2, TIMEOUT, |mut c| {
        if c.rank() == 0 {
            return Ok(vec![]); // drops its handle without panicking
        }
        all_reduce_once(&mut c, 4)
    });
    assert_eq!(
        *expect_err(&got[1]),
        CommError::RankGone {
            rank: 0,
            panicked: false
        }
    );
}

#[test]
fn mismatched_kinds_name_both_calls() {
    let got = run_world(2, TIMEOUT, |mut c| {
        if c.rank() == 0 {
            all_reduce_once(&mut c, 8).map(|_| ())
        } else {
            let mut out = vec![0.0f32; 8];
            c.all_gather([1.0f32; 4].as_slice().into(), out.as_mut_slice().into())
        }
    });
    for g in &got {
        let msg = expect_err(g).to_string();
        assert!(
            msg.contains("rank 0 called all_reduce #0 (f32 × 8, sum)"),
            "{msg}"
        );
        assert!(
            msg.contains("rank 1 called all_gather #0 (f32 × 4 in, 8 out)"),
            "{msg}"
        );
    }
}

#[test]
fn mismatched_lengths_ops_or_dtypes_are_errors_not_corruption() {
    // Different lengths.
    let got = run_world(3, TIMEOUT, |mut c| {
        let len = 10 + c.rank() / 2;
        all_reduce_once(&mut c, len)
    });
    for g in &got {
        assert!(
            matches!(
                expect_err(g),
                CommError::Mismatch {
                    rank_a: 0,
                    rank_b: 2,
                    ..
                }
            ),
            "{g:?}"
        );
    }
    // Different ops, then the world stays failed.
    let got = run_world(2, TIMEOUT, |mut c| {
        let op = if c.rank() == 0 {
            ReduceOp::Sum
        } else {
            ReduceOp::Avg
        };
        let first = c.all_reduce_f32(1.0, op);
        let second = c.barrier();
        (first, second)
    });
    for g in &got {
        let (first, second) = g.as_ref().unwrap();
        assert!(matches!(first, Err(CommError::Mismatch { .. })));
        assert_eq!(first.as_ref().unwrap_err(), second.as_ref().unwrap_err());
    }
    // Different element types.
    let got = run_world(2, TIMEOUT, |mut c| {
        if c.rank() == 0 {
            c.all_reduce(vec![1.0f32; 4].as_mut_slice().into(), ReduceOp::Sum)
        } else {
            c.all_reduce(
                vec![half::bf16::ONE; 4].as_mut_slice().into(),
                ReduceOp::Sum,
            )
        }
    });
    assert!(expect_err(&got[0]).to_string().contains("bf16 × 4"));
}

#[test]
fn bad_arguments_fail_fast_on_every_rank() {
    let start = Instant::now();
    let got = run_world(2, Duration::from_secs(30), |mut c| {
        let mut out = vec![0.0f32; 4];
        let len = if c.rank() == 0 { 9 } else { 8 };
        c.reduce_scatter(
            vec![1.0f32; len].as_slice().into(),
            out.as_mut_slice().into(),
            ReduceOp::Sum,
        )
    });
    assert!(
        start.elapsed() < BOUND,
        "rank 1 must not wait for the 30 s timeout"
    );
    for g in &got {
        let msg = expect_err(g).to_string();
        assert!(
            msg.contains("rank 0 called reduce_scatter with bad arguments: input has 9 elements"),
            "{msg}"
        );
    }

    let got = run_world(3, TIMEOUT, |mut c| {
        c.all_gather_in_place(vec![0.0f32; 7].as_mut_slice().into())
    });
    for g in &got {
        let msg = expect_err(g).to_string();
        assert!(
            msg.contains("7 elements, not a multiple of world_size (3); pad it to 9"),
            "{msg}"
        );
    }

    let got = run_world(2, TIMEOUT, |mut c| {
        c.broadcast(vec![0.0f32; 2].as_mut_slice().into(), 2)
    });
    assert!(expect_err(&got[0])
        .to_string()
        .contains("root 2 is not a rank"));

    let got = run_world(1, TIMEOUT, |mut c| {
        let mut out = vec![half::bf16::ZERO; 2];
        c.all_gather([1.0f32; 2].as_slice().into(), out.as_mut_slice().into())
    });
    assert!(expect_err(&got[0])
        .to_string()
        .contains("input is f32 but output is bf16"));
}

#[test]
fn abort_fails_pending_and_future_calls() {
    let got = run_world(3, Duration::from_secs(30), |mut c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(50)); // let the others start waiting
            c.abort("loss became NaN");
        }
        let pending = all_reduce_once(&mut c, 4).map(|_| ());
        let later = c.barrier();
        (pending, later)
    });
    let want = CommError::Aborted {
        rank: 2,
        reason: "loss became NaN".into(),
    };
    for g in &got {
        let (pending, later) = g.as_ref().unwrap();
        assert_eq!(pending.as_ref().unwrap_err(), &want);
        assert_eq!(later.as_ref().unwrap_err(), &want);
    }
}

#[test]
fn an_unbounded_timeout_still_works() {
    let got = run_world(2, Duration::MAX, |mut c| c.barrier());
    assert!(got.iter().all(|g| matches!(g, Ok(Ok(())))));
}
