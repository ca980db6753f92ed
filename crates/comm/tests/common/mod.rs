//! Helpers shared by the comm integration tests: run a closure on every rank of a world, and
//! make inputs whose sums depend on the order of summation (so bit-exact checks can fail).

#![allow(dead_code)] // each test file uses a different subset

use comm::{CommError, InProcess, InProcessComm, InProcessOptions};
use half::bf16;
use std::time::Duration;

/// Runs `f` on every rank (one thread each) and returns the results in rank order.
/// A rank's panic is returned as `Err(message)`.
pub fn run_world<R: Send>(
    n_ranks: usize,
    timeout: Duration,
    f: impl Fn(InProcessComm) -> R + Sync,
) -> Vec<Result<R, String>> {
    let ranks = InProcess::world_with(n_ranks, &InProcessOptions { timeout }).unwrap();
    std::thread::scope(|s| {
        let joins: Vec<_> = ranks
            .into_iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(c))
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join().map_err(|p| {
                    p.downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_default()
                })
            })
            .collect()
    })
}

/// Results of a world where no rank is expected to panic.
pub fn run_ok<R: Send>(n_ranks: usize, f: impl Fn(InProcessComm) -> R + Sync) -> Vec<R> {
    run_world(n_ranks, Duration::from_secs(20), f)
        .into_iter()
        .map(|r| r.expect("no rank panics"))
        .collect()
}

/// The project's SplitMix64 with the value distribution these tests want.
pub struct Rng(rng::SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(rng::SplitMix64::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Values spread over 2^-12 .. 2^12 with random signs, so rounding depends on the order.
    pub fn value(&mut self) -> f32 {
        let bits = self.next_u64();
        let mantissa = 1.0 + (bits & 0xFFFF) as f32 / 65536.0;
        let exponent = ((bits >> 16) % 25) as i32 - 12;
        let sign = if bits >> 63 == 1 { -1.0 } else { 1.0 };
        sign * mantissa * 2f32.powi(exponent)
    }
}

pub fn f32_input(rank: usize, len: usize, salt: u64) -> Vec<f32> {
    let mut rng = Rng::new(salt * 1000 + rank as u64 + 1);
    (0..len).map(|_| rng.value()).collect()
}

pub fn bf16_input(rank: usize, len: usize, salt: u64) -> Vec<bf16> {
    f32_input(rank, len, salt)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

pub fn bits_f32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

pub fn bits_bf16(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The error a rank got, for fault tests.
pub fn expect_err<T: std::fmt::Debug>(r: &Result<Result<T, CommError>, String>) -> &CommError {
    match r {
        Ok(Err(e)) => e,
        other => panic!("expected a CommError, got {other:?}"),
    }
}
