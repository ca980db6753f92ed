//! The portable path: each output row's weights dequantized 256 at a time into a stack buffer
//! (per 32-weight sub-block: one scale conversion, 16 bytes of nibbles), then multiplied with
//! up to [`ROWS`] activation rows in f32. Bit for bit what [`QWeight::at`] gives per weight, at
//! a fraction of its cost (one group lookup and one f16 conversion per 32 weights, not per
//! weight).

use super::{QWeight, ROWS, SUB};

pub(super) fn rows(
    out: &mut [f32],
    a: &[f32],
    w: &QWeight,
    rows: usize,
    ic: usize,
    oc: usize,
    range: std::ops::Range<usize>,
) {
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
        } if whole && group.is_multiple_of(SUB) => {
            for (b, chunk) in out.chunks_exact_mut(SUB).enumerate() {
                let idx = start + b * SUB;
                let g = idx / group;
                let (s, z) = (scales[g].to_f32(), zeros.map_or(8, |z| z[g]) as i32);
                unpack(&codes[idx / 2..][..SUB / 2], chunk, |q| {
                    s * (q as i32 - z) as f32
                });
            }
        }
        QWeight::Nf4 {
            codes,
            scales,
            levels,
            group,
        } if whole && group.is_multiple_of(SUB) => {
            for (b, chunk) in out.chunks_exact_mut(SUB).enumerate() {
                let idx = start + b * SUB;
                let s = scales[idx / group];
                unpack(&codes[idx / 2..][..SUB / 2], chunk, |q| {
                    s * levels[q as usize]
                });
            }
        }
        QWeight::Int4 { .. } | QWeight::Nf4 { .. } => {
            for (j, x) in out.iter_mut().enumerate() {
                *x = w.at(o, c0 + j, ic);
            }
        }
    }
}

/// One sub-block's 16 bytes into its 32 weights: low nibbles are weights 0..16, high 16..32.
fn unpack(bytes: &[u8], out: &mut [f32], value: impl Fn(u8) -> f32) {
    let (lo, hi) = out.split_at_mut(SUB / 2);
    for ((l, h), &byte) in lo.iter_mut().zip(hi.iter_mut()).zip(bytes) {
        *l = value(byte & 0xF);
        *h = value(byte >> 4);
    }
}
