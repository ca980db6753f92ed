//! `Overlapped`: a started all-gather really runs while its caller does something else (a test
//! that deadlocks into a timeout error if the start blocked), every call keeps its order and
//! bits, failures reach `wait`, and dropping an endpoint with a gather in flight finishes it.

mod common;

use comm::{Buf, BufMut, Collective, CommError, Counted, Overlapped, ReduceOp};
use common::*;
use half::bf16;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

#[test]
fn a_started_gather_runs_while_the_caller_is_busy() {
    // Rank 1 reaches the gather only after rank 0 says so, and rank 0 says so only after its
    // start returned: a start that blocked until every rank arrived would wait for rank 1
    // forever (and fail at the timeout).
    let (tx, rx) = mpsc::channel::<()>();
    let (tx, rx) = (Mutex::new(Some(tx)), Mutex::new(Some(rx)));
    let got = run_world(2, TIMEOUT, |c| -> Result<Vec<f32>, CommError> {
        let rank = c.rank();
        let mut c = Overlapped::new(Box::new(c));
        let mine = [rank as f32 + 1.0; 3];
        let mut all = [0.0f32; 6];
        if rank == 0 {
            // SAFETY: both buffers outlive the wait below and are untouched until then.
            let t = unsafe { c.start_all_gather(Buf::F32(&mine), BufMut::F32(&mut all)) }?;
            tx.lock().unwrap().take().unwrap().send(()).unwrap();
            c.wait(t)?;
        } else {
            let rx = rx.lock().unwrap().take().unwrap();
            rx.recv_timeout(Duration::from_secs(10))
                .expect("rank 0's start returned before rank 1 arrived");
            c.all_gather(Buf::F32(&mine), BufMut::F32(&mut all))?;
        }
        Ok(all.to_vec())
    });
    for r in got {
        assert_eq!(r.unwrap().unwrap(), [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    }
}

/// A sequence of every kind of call, started gathers among them, over `c`; returns every output.
fn sequence(c: &mut dyn Collective, seed: u64) -> Vec<u32> {
    let n = c.world_size();
    let mut rng = Rng::new(seed + c.rank() as u64);
    let mut out = Vec::new();
    let mut x: Vec<f32> = (0..6 * n).map(|_| rng.value()).collect();
    c.all_reduce(BufMut::F32(&mut x), ReduceOp::Sum).unwrap();
    out.extend(x.iter().map(|v| v.to_bits()));
    let shard: Vec<bf16> = (0..5).map(|_| bf16::from_f32(rng.value())).collect();
    let mut gathered = vec![bf16::ZERO; 5 * n];
    let mut second = vec![0.0f32; 6 * n];
    let mine: Vec<f32> = (0..6).map(|_| rng.value()).collect();
    // Two gathers in flight at once, then a blocking reduce-scatter queued behind them.
    // SAFETY: every buffer outlives the waits below and is untouched until then.
    let (t1, t2) = unsafe {
        let t1 = c.start_all_gather(Buf::Bf16(&shard), BufMut::Bf16(&mut gathered));
        let t2 = c.start_all_gather(Buf::F32(&mine), BufMut::F32(&mut second));
        (t1.unwrap(), t2.unwrap())
    };
    let input: Vec<f32> = (0..4 * n).map(|_| rng.value()).collect();
    let mut reduced = vec![0.0f32; 4];
    let op = ReduceOp::Avg;
    c.reduce_scatter(Buf::F32(&input), BufMut::F32(&mut reduced), op)
        .unwrap();
    c.wait(t2).unwrap();
    c.wait(t1).unwrap();
    out.extend(gathered.iter().map(|v| u32::from(v.to_bits())));
    out.extend(second.iter().chain(&reduced).map(|v| v.to_bits()));
    let mut b = vec![c.rank() as f32; 3];
    c.broadcast(BufMut::F32(&mut b), n - 1).unwrap();
    c.barrier().unwrap();
    out.extend(b.iter().map(|v| v.to_bits()));
    out
}

#[test]
fn every_call_keeps_its_order_and_bits() {
    for n in [1, 3] {
        let plain = run_ok(n, |mut c| sequence(&mut c, 7));
        let over = run_ok(n, |c| {
            let mut c = Counted::new(Overlapped::new(Box::new(c)));
            let bits = sequence(&mut c, 7);
            // The two started gathers are counted when they start, like any all-gather.
            assert_eq!(c.stats().all_gather.calls, 2);
            assert!(c.blocked() > Duration::ZERO);
            bits
        });
        assert_eq!(plain, over, "{n} ranks");
    }
}

#[test]
fn a_rank_gone_during_a_started_gather_fails_its_wait() {
    let got = run_world(2, TIMEOUT, |c| -> Result<(), CommError> {
        let rank = c.rank();
        let mut c = Overlapped::new(Box::new(c));
        if rank == 1 {
            return Ok(()); // leaves without gathering: dropping the endpoint fails the world
        }
        let mine = [1.0f32; 2];
        let mut all = [0.0f32; 4];
        // SAFETY: both buffers outlive the wait.
        let t = unsafe { c.start_all_gather(Buf::F32(&mine), BufMut::F32(&mut all)) }?;
        let err = c.wait(t).unwrap_err();
        assert!(matches!(err, CommError::RankGone { rank: 1, .. }), "{err}");
        // The world stays failed for every later call.
        let again = c.all_reduce(BufMut::F32(&mut all), ReduceOp::Sum);
        assert_eq!(again.unwrap_err(), err);
        Ok(())
    });
    assert!(got.iter().all(|r| matches!(r, Ok(Ok(())))), "{got:?}");
}

#[test]
fn dropping_an_endpoint_finishes_its_gather_first() {
    let got = run_ok(2, |c| {
        let rank = c.rank();
        let mine = [rank as f32; 2];
        let mut all = vec![0.0f32; 4];
        {
            let mut c = Overlapped::new(Box::new(c));
            // SAFETY: the buffers outlive the endpoint, whose drop runs the gather.
            let _ = unsafe { c.start_all_gather(Buf::F32(&mine), BufMut::F32(&mut all)) };
        }
        all
    });
    assert!(got.iter().all(|a| a == &[0.0, 0.0, 1.0, 1.0]), "{got:?}");
}

#[test]
fn abort_fails_the_world_after_the_call_in_progress() {
    let got = run_world(2, TIMEOUT, |c| -> Result<(), CommError> {
        let rank = c.rank();
        let mut c = Overlapped::new(Box::new(c));
        let mut x = [1.0f32];
        c.all_reduce(BufMut::F32(&mut x), ReduceOp::Sum)?;
        if rank == 0 {
            c.abort("rank 0 gives up");
        }
        match c.all_reduce(BufMut::F32(&mut x), ReduceOp::Sum) {
            Err(CommError::Aborted { rank: 0, .. }) => Ok(()),
            other => panic!("rank {rank}: {other:?}"),
        }
    });
    assert!(got.iter().all(|r| matches!(r, Ok(Ok(())))), "{got:?}");
}
