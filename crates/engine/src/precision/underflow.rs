//! fp16 underflow, made visible: for fp32 gradient values and a loss scale, how many
//! would flush to zero, fall subnormal (losing precision) or overflow if stored in fp16.
//!
//! A value `g` is stored as `f16(g * scale)` (the product rounded to f32 first, as the scaled
//! backward computes it). With round-to-nearest-even the classes are exact thresholds on
//! `|g * scale|`: at most 2^-25 rounds to zero (the tie goes to the even 0), below
//! 2^-14 - 2^-25 stays subnormal (the tie rounds up to the even 2^-14), and 65520 or more
//! becomes infinity (the tie rounds to the even infinity). The tests hold these thresholds
//! against `half`'s conversion. Zeros and non-finite inputs are counted apart: a zero gradient
//! loses nothing, and inf/NaN is the scaler's business.
//!
//! ```
//! use engine::precision::UnderflowStats;
//! let grads = [1e-9f32, 1e-6, 1e-3, 0.0];
//! let at_1 = UnderflowStats::measure(&grads, 1.0);
//! assert_eq!((at_1.flushed, at_1.subnormal), (1, 1)); // 1e-9 is lost, 1e-6 is subnormal
//! let at_64k = UnderflowStats::measure(&grads, 65536.0);
//! assert_eq!((at_64k.flushed, at_64k.subnormal), (0, 0));
//! ```

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Elements per rayon task (also keeps the per-lane u32 counters from overflowing).
const CHUNK: usize = 1 << 15;
const LANES: usize = 16;

/// `|x|` at or below this rounds to zero in f16: 2^-25.
const FLUSH_MAX: f32 = 2.980_232_2e-8;
/// `|x|` below this stays subnormal in f16: 2^-14 - 2^-25.
const SUBNORMAL_BELOW: f32 = 6.100_535_4e-5;
/// `|x|` at or above this rounds to infinity in f16: 65520.
const OVERFLOW_MIN: f32 = 65520.0;

/// Counts of gradient values by what fp16 storage at a given scale would do to them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnderflowStats {
    /// Values examined.
    pub total: u64,
    /// Exactly zero already in fp32 (nothing lost).
    pub zero: u64,
    /// Non-zero in fp32, zero in fp16.
    pub flushed: u64,
    /// Subnormal in fp16: kept, with fewer than 11 significant bits.
    pub subnormal: u64,
    /// Finite in fp32, infinite in fp16.
    pub overflow: u64,
    /// Already inf or NaN in fp32.
    pub non_finite: u64,
}

impl UnderflowStats {
    /// Classifies every value of `grads` stored as fp16 after multiplying by `scale`.
    pub fn measure(grads: &[f32], scale: f32) -> UnderflowStats {
        if grads.len() <= CHUNK {
            return measure_serial(grads, scale);
        }
        grads
            .par_chunks(CHUNK)
            .map(|c| measure_serial(c, scale))
            .reduce(UnderflowStats::default, |mut a, b| {
                a.merge(&b);
                a
            })
    }

    /// Adds another slice's counts (e.g. over all units, or all ranks).
    pub fn merge(&mut self, other: &UnderflowStats) {
        self.total += other.total;
        self.zero += other.zero;
        self.flushed += other.flushed;
        self.subnormal += other.subnormal;
        self.overflow += other.overflow;
        self.non_finite += other.non_finite;
    }

    /// Fraction of all values that flush to zero.
    pub fn flushed_fraction(&self) -> f64 {
        self.fraction(self.flushed)
    }

    /// Fraction of all values that fall subnormal.
    pub fn subnormal_fraction(&self) -> f64 {
        self.fraction(self.subnormal)
    }

    /// Fraction of all values that overflow.
    pub fn overflow_fraction(&self) -> f64 {
        self.fraction(self.overflow)
    }

    fn fraction(&self, count: u64) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            count as f64 / self.total as f64
        }
    }
}

/// Branch-free per-lane counters so the loop vectorises.
fn measure_serial(grads: &[f32], scale: f32) -> UnderflowStats {
    let mut c = [[0u32; LANES]; 5];
    let mut count = |g: f32, lane: usize| {
        let x = (g * scale).abs();
        let finite = g.is_finite();
        let nonzero = g != 0.0;
        let live = finite & nonzero;
        c[0][lane] += u32::from(!nonzero);
        c[1][lane] += u32::from(live & (x <= FLUSH_MAX));
        c[2][lane] += u32::from(live & (x > FLUSH_MAX) & (x < SUBNORMAL_BELOW));
        c[3][lane] += u32::from(live & (x >= OVERFLOW_MIN));
        c[4][lane] += u32::from(!finite);
    };
    let mut lanes = grads.chunks_exact(LANES);
    for lane in &mut lanes {
        for (i, &g) in lane.iter().enumerate() {
            count(g, i);
        }
    }
    for &g in lanes.remainder() {
        count(g, 0);
    }
    let sum = |k: usize| c[k].iter().map(|&n| u64::from(n)).sum::<u64>();
    UnderflowStats {
        total: grads.len() as u64,
        zero: sum(0),
        flushed: sum(1),
        subnormal: sum(2),
        overflow: sum(3),
        non_finite: sum(4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn thresholds_are_the_exact_powers_of_two() {
        assert_eq!(FLUSH_MAX, 2f32.powi(-25));
        assert_eq!(SUBNORMAL_BELOW, 2f32.powi(-14) - 2f32.powi(-25));
    }

    /// The oracle: convert with `half` and look at the result.
    fn classify_with_half(grads: &[f32], scale: f32) -> UnderflowStats {
        let mut s = UnderflowStats {
            total: grads.len() as u64,
            ..Default::default()
        };
        for &g in grads {
            let h = f16::from_f32(g * scale);
            if !g.is_finite() {
                s.non_finite += 1;
            } else if g == 0.0 {
                s.zero += 1;
            } else if h.is_infinite() {
                s.overflow += 1;
            } else if h.to_f32() == 0.0 {
                s.flushed += 1;
            } else if !h.is_normal() {
                s.subnormal += 1;
            }
        }
        s
    }

    #[test]
    fn agrees_with_half_on_a_sweep_of_magnitudes_and_scales() {
        // Magnitudes from 2^-60 to 2^40 with dense mantissas, both signs: every boundary is
        // crossed many times, ties included (exact powers of two and midpoints).
        let mut grads = Vec::new();
        for e in -60..40 {
            for k in 0..64 {
                let x = 2f32.powi(e) * (1.0 + k as f32 / 64.0);
                grads.push(x);
                grads.push(-x);
            }
            grads.push(2f32.powi(e) * (2.0 - 2f32.powi(-23)));
        }
        grads.extend([0.0, -0.0, f32::NAN, f32::INFINITY, f32::MIN_POSITIVE]);
        for scale in [1.0f32, 128.0, 65536.0, 2f32.powi(24), 2f32.powi(-8)] {
            let mut many = grads.clone();
            many.extend(grads.iter().cycle().take(3 * CHUNK)); // the rayon path too
            assert_eq!(
                UnderflowStats::measure(&many, scale),
                classify_with_half(&many, scale),
                "scale {scale}"
            );
        }
    }

    #[test]
    fn constructed_gradients_give_known_fractions() {
        // 1000 values at scale 1024: 250 of 2^-40 (scaled 2^-30: flushed), 250 of 2^-30
        // (scaled 2^-20: subnormal), 100 of 100.0 (scaled 102400: overflow), 300 of 1e-3
        // (fine), 50 zeros, 50 NaN.
        let mut g = Vec::new();
        g.extend(std::iter::repeat_n(2f32.powi(-40), 250));
        g.extend(std::iter::repeat_n(-(2f32.powi(-30)), 250));
        g.extend(std::iter::repeat_n(100.0f32, 100));
        g.extend(std::iter::repeat_n(1e-3f32, 300));
        g.extend(std::iter::repeat_n(0.0f32, 50));
        g.extend(std::iter::repeat_n(f32::NAN, 50));
        let s = UnderflowStats::measure(&g, 1024.0);
        let want = UnderflowStats {
            total: 1000,
            zero: 50,
            flushed: 250,
            subnormal: 250,
            overflow: 100,
            non_finite: 50,
        };
        assert_eq!(s, want);
        assert_eq!(s.flushed_fraction(), 0.25);
        assert_eq!(s.subnormal_fraction(), 0.25);
        assert_eq!(s.overflow_fraction(), 0.1);
        // Scale 2^20 rescues the 2^-40 values from flushing (now 2^-20: subnormal) and moves
        // the 2^-30 ones to normal (2^-10); 100 overflows even more.
        let s = UnderflowStats::measure(&g, 2f32.powi(20));
        assert_eq!((s.flushed, s.subnormal, s.overflow), (0, 250, 100));
        // The ties: exactly 2^-25 flushes, the next f32 up survives as the smallest subnormal.
        let tie = [2f32.powi(-25), f32::from_bits(2f32.powi(-25).to_bits() + 1)];
        let s = UnderflowStats::measure(&tie, 1.0);
        assert_eq!((s.flushed, s.subnormal), (1, 1));
        assert_eq!(UnderflowStats::default().flushed_fraction(), 0.0);
    }
}
