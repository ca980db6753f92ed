//! All-reduce throughput of the in-process backend on 2 and 4 ranks, against a plain memcpy of
//! the same bytes measured in the same run, plus the latency of a one-scalar all-reduce (the
//! global gradient norm / overflow flag).
//!
//! Run: `cargo bench -p comm --bench collectives`. Reported per size: median time per call,
//! "algbw" = buffer bytes / time, "busbw" = ring bytes per rank (2(N−1)/N · size) / time (the
//! NCCL-tests convention), and the ratio time(all-reduce) / time(memcpy of the buffer).

use comm::{Collective, InProcess, InProcessComm, ReduceOp};
use half::bf16;
use std::time::{Duration, Instant};

const WARMUP: usize = 2;
const ITERS: usize = 9;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn memcpy_time(bytes: usize) -> Duration {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let times = (0..WARMUP + ITERS)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            t.elapsed()
        })
        .skip(WARMUP)
        .collect();
    median(times)
}

/// Runs `f` on every rank of an in-process world of `n_ranks`, one thread each; returns rank 0's
/// result.
fn on_rank_0<R: Send>(n_ranks: usize, f: impl Fn(InProcessComm) -> R + Sync) -> R {
    let ranks = InProcess::world(n_ranks).expect("n_ranks > 0");
    let f = &f;
    std::thread::scope(|s| {
        let joins: Vec<_> = ranks.into_iter().map(|c| s.spawn(move || f(c))).collect();
        let mut per_rank = joins.into_iter().map(|j| j.join().unwrap());
        per_rank.next().unwrap()
    })
}

/// Median wall time of one all-reduce, as seen by rank 0 (every call ends with a barrier).
fn all_reduce_time(n_ranks: usize, len: usize, use_bf16: bool) -> Duration {
    on_rank_0(n_ranks, |mut c| {
        let mut f = vec![c.rank() as f32; if use_bf16 { 0 } else { len }];
        let mut b = vec![bf16::from_f32(c.rank() as f32); if use_bf16 { len } else { 0 }];
        let mut times = Vec::with_capacity(WARMUP + ITERS);
        for _ in 0..WARMUP + ITERS {
            c.barrier().expect("barrier");
            let t = Instant::now();
            if use_bf16 {
                c.all_reduce(b.as_mut_slice().into(), ReduceOp::Sum)
            } else {
                c.all_reduce(f.as_mut_slice().into(), ReduceOp::Sum)
            }
            .expect("all_reduce");
            times.push(t.elapsed());
        }
        median(times[WARMUP..].to_vec())
    })
}

fn scalar_latency(n_ranks: usize) -> Duration {
    const CALLS: u32 = 2000;
    on_rank_0(n_ranks, |mut c| {
        let t = Instant::now();
        for _ in 0..CALLS {
            c.all_reduce_f32(1.0, ReduceOp::Sum)
                .expect("all_reduce_f32");
        }
        t.elapsed() / CALLS
    })
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("in-process all-reduce (sum), median of {ITERS}, {cores} cores available");
    println!(
        "{:>5} {:>5} {:>9} {:>10} {:>11} {:>11} {:>12} {:>10}",
        "ranks",
        "dtype",
        "size MiB",
        "time ms",
        "algbw GB/s",
        "busbw GB/s",
        "memcpy GB/s",
        "vs memcpy"
    );
    for (len, use_bf16) in [(1 << 22, false), (1 << 23, true), (1 << 18, false)] {
        let elem = if use_bf16 { 2 } else { 4 };
        let bytes = len * elem;
        for n in [2, 4] {
            let t = all_reduce_time(n, len, use_bf16);
            let copy = memcpy_time(bytes);
            let gbps = |b: f64, d: Duration| b / d.as_secs_f64() / 1e9;
            let ring = 2.0 * (n as f64 - 1.0) / n as f64 * bytes as f64;
            println!(
                "{n:>5} {:>5} {:>9.1} {:>10.3} {:>11.2} {:>11.2} {:>12.2} {:>9.2}x",
                if use_bf16 { "bf16" } else { "f32" },
                bytes as f64 / (1 << 20) as f64,
                t.as_secs_f64() * 1e3,
                gbps(bytes as f64, t),
                gbps(ring, t),
                gbps(bytes as f64, copy),
                t.as_secs_f64() / copy.as_secs_f64(),
            );
        }
    }
    for n in [2, 4] {
        println!(
            "one-f32 all-reduce latency, {n} ranks: {:.1} µs",
            scalar_latency(n).as_secs_f64() * 1e6
        );
    }
}
