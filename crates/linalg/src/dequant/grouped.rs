//! ggml's blocks as a frozen base holds them ([`super::Stored::Grouped`]): one code per weight
//! (int8, or 0..15 two a byte in int4's sub-block order, `qmatmul::nibble`), then an f32
//! scale and an f32 minimum per group: w = scale × code + min, the value inference's `ggml`
//! weights multiply (`qmatmul::QWeight::Grouped`), bit for bit.

use super::{f32_at, TASK};
use crate::qmatmul::nibble;
use rayon::prelude::*;

/// Bytes of `n` values: codes, then scales and minima.
pub(super) fn bytes(n: usize, group: usize, nibbles: bool) -> usize {
    codes_len(n, nibbles) + 8 * n.div_ceil(group)
}

fn codes_len(n: usize, nibbles: bool) -> usize {
    match nibbles {
        true => n.div_ceil(2),
        false => n,
    }
}

/// Value `i` of a part of `n` values.
#[inline]
pub(super) fn value(src: &[u8], n: usize, i: usize, group: usize, nibbles: bool) -> f32 {
    let (codes, rest) = src.split_at(codes_len(n, nibbles));
    let groups = n.div_ceil(group);
    let g = i / group;
    let code = match nibbles {
        true => f32::from(nibble(codes, i)),
        false => f32::from(codes[i] as i8),
    };
    f32_at(rest, g) * code + f32_at(&rest[4 * groups..], g)
}

/// Values `first .. first + out.len()` of a part of `n` values: 32 at a time (a nibble
/// sub-block, one or two groups) when the range holds whole sub-blocks, else value by value.
pub(super) fn range(
    out: &mut [f32],
    src: &[u8],
    n: usize,
    first: usize,
    group: usize,
    nibbles: bool,
) {
    let whole = first.is_multiple_of(32) && out.len().is_multiple_of(32);
    if !(whole && (group == 16 || group == 32)) {
        return out.par_chunks_mut(TASK).enumerate().for_each(|(t, o)| {
            for (j, x) in o.iter_mut().enumerate() {
                *x = value(src, n, first + t * TASK + j, group, nibbles);
            }
        });
    }
    let (codes, rest) = src.split_at(codes_len(n, nibbles));
    let groups = n.div_ceil(group);
    let (scales, mins) = rest.split_at(4 * groups);
    out.par_chunks_mut(TASK).enumerate().for_each(|(t, o)| {
        for (k, o) in o.chunks_mut(32).enumerate() {
            let i0 = first + t * TASK + 32 * k;
            let mut c = [0.0f32; 32];
            match nibbles {
                true => {
                    let b = &codes[i0 / 2..i0 / 2 + 16];
                    for j in 0..16 {
                        c[j] = f32::from(b[j] & 0xF);
                        c[j + 16] = f32::from(b[j] >> 4);
                    }
                }
                false => {
                    for (x, &b) in c.iter_mut().zip(&codes[i0..i0 + 32]) {
                        *x = f32::from(b as i8);
                    }
                }
            }
            for (h, (o, c)) in o.chunks_mut(group).zip(c.chunks(group)).enumerate() {
                let g = i0 / group + h;
                let (scale, min) = (f32_at(scales, g), f32_at(mins, g));
                for (x, &c) in o.iter_mut().zip(c) {
                    *x = scale * c + min;
                }
            }
        }
    });
}
