//! A streaming read over a large buffer on every core: the machine's memory bandwidth, measured
//! in the same run as a memory-bound kernel (decode reads every weight once per token), so a
//! benchmark reports its kernel as a fraction of what this machine can read, not of a datasheet.
//!
//! The caller times [`read_all`]; the sum it returns keeps the reads from being optimised away.
//! [`triad`] is STREAM's `a = b + s·c` (two reads and one write per element), the yardstick of a
//! kernel that reads and writes, such as the optimizer step.
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

/// STREAM's triad `a = b + s·c` on every core in parallel: 12 bytes of traffic per element.
pub fn triad(a: &mut [f32], b: &[f32], c: &[f32], s: f32) {
    assert!(
        a.len() == b.len() && b.len() == c.len(),
        "triad: equal lengths"
    );
    a.par_chunks_mut(CHUNK)
        .zip(b.par_chunks(CHUNK))
        .zip(c.par_chunks(CHUNK))
        .for_each(|((a, b), c)| {
            for ((a, b), c) in a.iter_mut().zip(b).zip(c) {
                *a = b + s * c;
            }
        });
}

#[cfg(test)]
mod tests {
    #[test]
    fn triad_is_b_plus_s_c() {
        let (b, c) = (vec![1.0f32; 1000], vec![2.0f32; 1000]);
        let mut a = vec![0.0f32; 1000];
        super::triad(&mut a, &b, &c, 3.0);
        assert!(a.iter().all(|&x| x == 7.0));
    }
}
