//! Helpers the kernel benchmarks share: a median timer and deterministic test data.

use std::time::Instant;

/// Median seconds of `reps` runs of `f` after one warm-up run.
pub fn median_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[reps / 2]
}

/// `n` values spread over [-scale/2, scale/2) by a multiplicative hash of the index: the same
/// data every run, no RNG dependency.
pub fn fill(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let u = ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                / (1u32 << 24) as f32;
            scale * (u - 0.5)
        })
        .collect()
}

/// Caps the kernels at `FRUGAL_ISA` (a benchmark is a binary's edge, as the CLI is), so one
/// machine times every level it runs; prints the level.
#[allow(dead_code)]
pub fn cap_from_env() {
    // Unset or empty: the CPU's best, as the CLI reads it.
    if let Some(v) = std::env::var("FRUGAL_ISA")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        let capped = kernels::cpu::parse(&v).and_then(kernels::cpu::set_cap);
        if let Err(e) = capped {
            eprintln!("FRUGAL_ISA: {e}");
            std::process::exit(2);
        }
    }
    println!(
        "instruction-set level: {} (this CPU: {})",
        kernels::cpu::level(),
        kernels::cpu::detected()
    );
}

/// Bytes per second of a streaming read of a 1 GiB buffer (median of 5), printed: the baseline
/// the memory-bound kernels are measured against in the same run.
#[allow(dead_code)]
pub fn streaming_read() -> f64 {
    let big = fill(1 << 28, 3, 1.0);
    let t = median_secs(5, || {
        std::hint::black_box(kernels::stream::read_all(&big));
    });
    let bw = (4usize << 28) as f64 / t;
    println!("streaming read: {:.2} GB/s", bw / 1e9);
    bw
}
