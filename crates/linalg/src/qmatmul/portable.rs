//! The portable path: each output row's weights dequantized 256 at a time into a stack buffer
//! (per 32-weight sub-block: a table of the 16 values its codes take, then its 16 bytes of
//! nibbles looked up), then multiplied with up to [`ROWS`] activation rows in f32. Bit for bit
//! what [`QWeight::at`] gives per weight (tested below), at a fraction of its cost: one group
//! lookup and one f16 conversion per 32 weights, not per weight.

use super::{QWeight, Rows, ROWS, SUB};

pub(super) fn rows(out: &mut [f32], p: Rows, range: std::ops::Range<usize>) {
    let Rows { a, w, rows, ic, oc } = p;
    let mut wrow = [0.0f32; 256];
    for o in range {
        let mut acc = [[0.0f32; 16]; ROWS];
        for c0 in (0..ic).step_by(256) {
            let len = 256.min(ic - c0);
            dequantize(w, o, c0, ic, &mut wrow[..len]);
            for r in 0..rows {
                let ar = &a[r * ic + c0..][..len];
                for (j, (x, y)) in wrow[..len].iter().zip(ar).enumerate() {
                    acc[r][j % 16] += x * y;
                }
            }
        }
        for r in 0..rows {
            out[r * oc + o] = acc[r].iter().sum();
        }
    }
}

/// Weights `c0 .. c0 + out.len()` of row `o` (IC wide), as `QWeight::at` gives them.
fn dequantize(w: &QWeight, o: usize, c0: usize, ic: usize, out: &mut [f32]) {
    let start = o * ic + c0;
    let whole = start.is_multiple_of(SUB) && out.len().is_multiple_of(SUB);
    match *w {
        QWeight::F32(v) => out.copy_from_slice(&v[start..start + out.len()]),
        QWeight::Bf16(v) => {
            for (x, b) in out.iter_mut().zip(&v[start..]) {
                *x = b.to_f32();
            }
        }
        QWeight::Int8 { codes, scales } => {
            let s = scales[o].to_f32();
            for (x, &c) in out.iter_mut().zip(&codes[start..]) {
                *x = s * c as f32;
            }
        }
        QWeight::Int4 {
            codes,
            scales,
            zeros,
            group,
        } if whole && group.is_multiple_of(SUB) => nibbles(codes, start, group, out, |g| {
            let (s, z) = (scales[g].to_f32(), zeros.map_or(8, |z| z[g]) as i32);
            std::array::from_fn(|q| s * (q as i32 - z) as f32)
        }),
        QWeight::Nf4 {
            codes,
            scales,
            levels,
            group,
        } if whole && group.is_multiple_of(SUB) => nibbles(codes, start, group, out, |g| {
            std::array::from_fn(|q| scales[g] * levels[q])
        }),
        QWeight::Grouped4 {
            codes,
            scales,
            mins,
            group: 32,
        } if whole => nibbles(codes, start, 32, out, |g| {
            let m = mins.map(|m| m[g]);
            std::array::from_fn(|q| {
                let w = scales[g] * f32::from(q as u8);
                m.map_or(w, |m| w + m)
            })
        }),
        QWeight::Int4 { .. }
        | QWeight::Int4Tiled { .. }
        | QWeight::Int8Tiled { .. }
        | QWeight::Nf4 { .. }
        | QWeight::Nf4Tiled { .. }
        | QWeight::Grouped { .. }
        | QWeight::Grouped4 { .. } => {
            for (j, x) in out.iter_mut().enumerate() {
                *x = w.at(o, c0 + j, ic);
            }
        }
    }
}

/// Whole sub-blocks of nibble codes from flat weight `start` into `out`: each sub-block's 16
/// bytes give its weights 0..16 (low nibbles) and 16..32 (high), through `table(group)`, the 16
/// values a code takes in that group.
fn nibbles(
    codes: &[u8],
    start: usize,
    group: usize,
    out: &mut [f32],
    table: impl Fn(usize) -> [f32; 16],
) {
    for (b, chunk) in out.chunks_exact_mut(SUB).enumerate() {
        let idx = start + b * SUB;
        let t = table(idx / group);
        let (lo, hi) = chunk.split_at_mut(SUB / 2);
        for ((l, h), &byte) in lo.iter_mut().zip(hi).zip(&codes[idx / 2..][..SUB / 2]) {
            *l = t[usize::from(byte & 0xF)];
            *h = t[usize::from(byte >> 4)];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn rows_dequantize_bit_for_bit_as_each_weight_does() {
        let (oc, ic) = (3, 320);
        let codes: Vec<u8> = (0..oc * ic / 2).map(|i| (i * 37 % 256) as u8).collect();
        let groups = oc * ic / 32;
        let scales: Vec<f16> = (0..groups)
            .map(|g| f16::from_f32(0.01 * g as f32 - 0.3))
            .collect();
        let f_scales: Vec<f32> = (0..groups).map(|g| 0.02 * g as f32 + 0.1).collect();
        let zeros: Vec<u8> = (0..groups).map(|g| (g % 16) as u8).collect();
        let levels: [f32; 16] = std::array::from_fn(|i| i as f32 / 7.5 - 1.0);
        let int8: Vec<i8> = (0..oc * ic).map(|i| (i * 13 % 255) as i8).collect();
        let weights = [
            QWeight::Int4 {
                codes: &codes,
                scales: &scales,
                zeros: None,
                group: 32,
            },
            QWeight::Int4 {
                codes: &codes,
                scales: &scales[..groups / 2],
                zeros: Some(&zeros[..groups / 2]),
                group: 64,
            },
            QWeight::Nf4 {
                codes: &codes,
                scales: &f_scales,
                levels: &levels,
                group: 32,
            },
            QWeight::Int8 {
                codes: &int8,
                scales: &scales[..oc],
            },
            QWeight::Grouped {
                codes: &int8,
                scales: &f_scales,
                mins: Some(&f_scales),
                group: 32,
            },
            QWeight::Grouped {
                codes: &int8,
                scales: &[f_scales.as_slice(), f_scales.as_slice()].concat(),
                mins: None,
                group: 16,
            },
            QWeight::Grouped4 {
                codes: &codes,
                scales: &f_scales,
                mins: Some(&f_scales),
                group: 32,
            },
            QWeight::Grouped4 {
                codes: &codes,
                scales: &[f_scales.as_slice(), f_scales.as_slice()].concat(),
                mins: None,
                group: 16,
            },
        ];
        for w in &weights {
            for o in 0..oc {
                for c0 in (0..ic).step_by(256) {
                    let len = 256.min(ic - c0);
                    let mut got = vec![0.0f32; len];
                    dequantize(w, o, c0, ic, &mut got);
                    for (j, g) in got.iter().enumerate() {
                        assert_eq!(g.to_bits(), w.at(o, c0 + j, ic).to_bits(), "{w:?} {o} {j}");
                    }
                }
            }
        }
    }
}
