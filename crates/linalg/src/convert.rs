//! Slice conversions between f32 and the 2-byte training formats, for `--precision bf16|fp16`:
//! f32 → bf16 / f16 with round-to-nearest-even (NaN stays NaN, overflow becomes ±inf, f16
//! subnormals kept, never flushed), and the exact widenings back.
//!
//! f32 → bf16 is a branch-free bit loop (add the rounding bias, keep the high half) that the
//! compiler vectorises; f16 goes through `half`'s slice conversions, which use the F16C
//! instructions when the CPU has them (detected at run time). Long slices are split over rayon.
//! Results equal `half::bf16::from_f32` / `half::f16::from_f32` bit for bit (tested on every
//! class of value). What this module does not hold: loss scaling or statistics (engine).
//!
//! ```
//! use linalg::convert::{bf16_to_f32, f32_to_bf16};
//! use half::bf16;
//! let src = [1.0f32, 1.0 + 1.0 / 256.0, -3.5];
//! let mut half = [bf16::ZERO; 3];
//! f32_to_bf16(&mut half, &src);
//! let mut back = [0.0f32; 3];
//! bf16_to_f32(&mut back, &half);
//! assert_eq!(back, [1.0, 1.0, -3.5]); // 1 + 2^-8 is a tie: rounds to the even 1.0
//! ```

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

/// Elements per rayon task; shorter slices run on the calling thread.
const CHUNK: usize = 1 << 15;

/// Rounds each f32 to the nearest bf16, ties to even. `dst.len() == src.len()`.
pub fn f32_to_bf16(dst: &mut [bf16], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "f32_to_bf16: lengths differ");
    if src.len() <= CHUNK {
        f32_to_bf16_serial(dst, src);
        return;
    }
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| f32_to_bf16_serial(d, s));
}

/// Widens each bf16 to f32 (exact). `dst.len() == src.len()`.
pub fn bf16_to_f32(dst: &mut [f32], src: &[bf16]) {
    assert_eq!(dst.len(), src.len(), "bf16_to_f32: lengths differ");
    if src.len() <= CHUNK {
        bf16_to_f32_serial(dst, src);
        return;
    }
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| bf16_to_f32_serial(d, s));
}

/// Rounds each f32 to the nearest f16, ties to even; beyond ±65504 (after rounding) ±inf.
pub fn f32_to_f16(dst: &mut [f16], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "f32_to_f16: lengths differ");
    if src.len() <= CHUNK {
        dst.convert_from_f32_slice(src);
        return;
    }
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| d.convert_from_f32_slice(s));
}

/// Widens each f16 to f32 (exact).
pub fn f16_to_f32(dst: &mut [f32], src: &[f16]) {
    assert_eq!(dst.len(), src.len(), "f16_to_f32: lengths differ");
    if src.len() <= CHUNK {
        src.convert_to_f32_slice(dst);
        return;
    }
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| s.convert_to_f32_slice(d));
}

/// One f32 → bf16 bit pattern, round-to-nearest-even; what `half::bf16::from_f32` returns.
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    // Adding 0x7FFF plus the kept part's lowest bit carries into the kept half exactly when
    // the dropped half is above one half, or equal to it with an odd kept half (ties to even).
    let lsb = (bits >> 16) & 1;
    let rounded = (bits.wrapping_add(0x7FFF + lsb) >> 16) as u16;
    // NaN: keep the payload's high bits and force the quiet bit, as `half` does, so a NaN can
    // never round into an infinity.
    let quiet_nan = ((bits >> 16) | 0x0040) as u16;
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        quiet_nan
    } else {
        rounded
    }
}

fn f32_to_bf16_serial(dst: &mut [bf16], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16::from_bits(bf16_bits(s));
    }
}

fn bf16_to_f32_serial(dst: &mut [f32], src: &[bf16]) {
    // On the raw bits: `bf16::to_bits` per element keeps the loop from vectorising.
    let src: &[u16] = src.reinterpret_cast();
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits(u32::from(s) << 16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every class of f32: zeros, subnormals, normals near each format's limits and rounding
    /// boundaries, infinities, NaNs with payloads, plus a sweep of bit patterns.
    fn probe_values() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x007F_FFFF),
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7F80_0001), // signalling NaN, payload only in the low half
            f32::from_bits(0xFFC1_2345),
            65504.0,
            65519.0,
            65520.0,
            -65520.0,
            1e-8,
            2f32.powi(-24),                  // f16's smallest subnormal
            2f32.powi(-25),                  // the tie that rounds to zero
            2f32.powi(-14) - 2f32.powi(-25), // the tie between subnormal and normal
            f32::from_bits(0x3300_0001),     // just above 2^-25
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
        ];
        // A sweep over bit patterns with a stride co-prime to 2^32 hits every exponent and
        // many low-bit patterns (ties included).
        let mut bits = 0u32;
        for _ in 0..200_000 {
            v.push(f32::from_bits(bits));
            bits = bits.wrapping_add(0x0001_5A3B);
        }
        for k in 0..(1u32 << 16) {
            v.push(f32::from_bits((k << 16) | 0x8000)); // exact ties
            v.push(f32::from_bits((k << 16) | 0x8001));
        }
        v
    }

    fn same_bits(got: u16, want: u16, x: f32, what: &str) {
        assert_eq!(got, want, "{what} of {x:e} ({:#010x})", x.to_bits());
    }

    #[test]
    fn bf16_matches_half_bit_for_bit() {
        let src = probe_values();
        let mut dst = vec![bf16::ZERO; src.len()];
        f32_to_bf16(&mut dst, &src); // long enough to take the rayon path
        for (x, d) in src.iter().zip(&dst) {
            same_bits(d.to_bits(), bf16::from_f32(*x).to_bits(), *x, "bf16");
        }
        let mut back = vec![0.0f32; src.len()];
        bf16_to_f32(&mut back, &dst);
        for (b, d) in back.iter().zip(&dst) {
            assert_eq!(b.to_bits(), d.to_f32().to_bits());
        }
        // The short (serial) path agrees with the long one.
        let mut short = vec![bf16::ZERO; 100];
        f32_to_bf16(&mut short, &src[..100]);
        let bits = |v: &[bf16]| v.iter().map(|b| b.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&short), bits(&dst[..100]));
    }

    #[test]
    fn f16_matches_half_bit_for_bit() {
        let src = probe_values();
        let mut dst = vec![f16::ZERO; src.len()];
        f32_to_f16(&mut dst, &src);
        for (x, d) in src.iter().zip(&dst) {
            let want = f16::from_f32(*x);
            if want.is_nan() {
                assert!(d.is_nan(), "f16 of NaN {:#010x}", x.to_bits());
            } else {
                same_bits(d.to_bits(), want.to_bits(), *x, "f16");
            }
        }
        let mut back = vec![0.0f32; src.len()];
        f16_to_f32(&mut back, &dst);
        for (b, d) in back.iter().zip(&dst) {
            assert!(b.to_bits() == d.to_f32().to_bits() || b.is_nan() && d.is_nan());
        }
    }

    #[test]
    fn rounding_edges_are_the_formats() {
        let cases = [
            (65519.0f32, 65504.0f32), // below the tie: largest finite f16
            (65520.0, f32::INFINITY), // the tie rounds to the even neighbour: infinity
            (2f32.powi(-25), 0.0),    // ties to the even 0
            (f32::from_bits(0x3300_0001), 2f32.powi(-24)),
            (2f32.powi(-14) - 2f32.powi(-25), 2f32.powi(-14)), // ties to the even normal
        ];
        for (x, want) in cases {
            let mut d = [f16::ZERO];
            f32_to_f16(&mut d, &[x]);
            assert_eq!(d[0].to_f32(), want, "f16 of {x:e}");
        }
        let mut b = [bf16::ZERO; 2];
        f32_to_bf16(&mut b, &[f32::MAX, f32::from_bits(0x7F80_0001)]);
        assert_eq!(b[0].to_f32(), f32::INFINITY);
        assert!(
            b[1].is_nan(),
            "a NaN whose payload sits in the low half stays NaN"
        );
    }
}
