//! A streaming read over a large buffer on every core: the machine's memory bandwidth, measured
//! in the same run as a memory-bound kernel (decode reads every weight once per token), so a
//! benchmark reports its kernel as a fraction of what this machine can read, not of a datasheet.
//!
//! The caller times [`read_all`]; the sum it returns keeps the reads from being optimised away.
//! Each rayon task reads a contiguous chunk with 16 independent partial sums (vectorised by the
//! compiler), the access pattern a GEMV streams its weight rows in.
//!
//! ```
//! let data = vec![1.0f32; 1 << 16];
//! assert_eq!(kernels::stream::read_all(&data), 65536.0);
//! ```

use rayon::prelude::*;

/// Elements per rayon task (1 MiB of f32).
const CHUNK: usize = 1 << 18;

/// The sum of `data`, read once by every core in parallel.
pub fn read_all(data: &[f32]) -> f32 {
    data.par_chunks(CHUNK)
        .map(|c| {
            let mut acc = [0.0f32; 16];
            let body = c.chunks_exact(16);
            let tail: f32 = body.remainder().iter().sum();
            for x in body {
                for (a, v) in acc.iter_mut().zip(x) {
                    *a += v;
                }
            }
            acc.iter().sum::<f32>() + tail
        })
        .sum()
}
