//! What each stored layout means (see the `qmatmul` module docs): its size checks, the value of
//! one weight (the reference's view), and the nibble order of the 4-bit layouts.

use super::tiles::{self, TILE};
use super::{QWeight, SUB};

impl QWeight<'_> {
    /// Checks the stored sizes against (OC, IC); panics on a mismatch (a programmer error).
    pub fn check(&self, oc: usize, ic: usize) {
        let n = oc * ic;
        match *self {
            QWeight::F32(w) => assert_eq!(w.len(), n, "f32 weight"),
            QWeight::Bf16(w) => assert_eq!(w.len(), n, "bf16 weight"),
            QWeight::Int8 { codes, scales } => {
                assert!(codes.len() == n && scales.len() == oc, "int8 weight");
            }
            QWeight::Int8Tiled { codes, scales } => {
                assert!(codes.len() == n && scales.len() == oc, "int8 weight");
                assert!(
                    oc.is_multiple_of(TILE) && ic.is_multiple_of(SUB),
                    "tiles of {TILE} rows of whole blocks of {SUB}; (OC, IC) = ({oc}, {ic})"
                );
            }
            QWeight::Int4 {
                codes,
                scales,
                zeros,
                group,
            }
            | QWeight::Int4Tiled {
                codes,
                scales,
                zeros,
                group,
            } => {
                if let QWeight::Int4Tiled { .. } = self {
                    assert!(oc.is_multiple_of(TILE), "tiles of {TILE} rows; OC = {oc}");
                }
                check_groups(codes.len(), scales.len(), oc, ic, group);
                if let Some(z) = zeros {
                    assert_eq!(z.len(), scales.len(), "one zero point per group");
                }
            }
            QWeight::Nf4 {
                codes,
                scales,
                group,
                ..
            } => check_groups(codes.len(), scales.len(), oc, ic, group),
            QWeight::Nf4Tiled {
                codes,
                scales,
                group,
                ..
            } => {
                assert!(oc.is_multiple_of(TILE), "tiles of {TILE} rows; OC = {oc}");
                check_groups(codes.len(), scales.len(), oc, ic, group);
            }
            QWeight::Grouped {
                codes,
                scales,
                mins,
                group,
            } => check_grouped(codes.len(), n, scales, mins, group, ic),
            QWeight::Grouped4 {
                codes,
                scales,
                mins,
                group,
            } => check_grouped(2 * codes.len(), n, scales, mins, group, ic),
        }
    }

    /// Weight (o, i), dequantized (the reference's view, and the embedding's row lookup).
    pub fn at(&self, o: usize, i: usize, ic: usize) -> f32 {
        match *self {
            QWeight::F32(w) => w[o * ic + i],
            QWeight::Bf16(w) => w[o * ic + i].to_f32(),
            QWeight::Int8 { codes, scales } => scales[o].to_f32() * codes[o * ic + i] as f32,
            QWeight::Int8Tiled { codes, scales } => {
                scales[o].to_f32() * codes[tiles::code_at8(o, i, ic)] as f32
            }
            QWeight::Int4 {
                codes,
                scales,
                zeros,
                group,
            } => {
                let g = (o * ic + i) / group;
                let z = zeros.map_or(8, |z| z[g]) as i32;
                scales[g].to_f32() * (nibble(codes, o * ic + i) as i32 - z) as f32
            }
            QWeight::Int4Tiled {
                codes,
                scales,
                zeros,
                group,
            } => {
                let g = tiles::group_at(o, i / group, ic / group);
                let z = zeros.map_or(8, |z| z[g]) as i32;
                scales[g].to_f32() * (tiled_nibble(codes, o, i, ic) as i32 - z) as f32
            }
            QWeight::Nf4 {
                codes,
                scales,
                levels,
                group,
            } => {
                let g = (o * ic + i) / group;
                scales[g] * levels[nibble(codes, o * ic + i) as usize]
            }
            QWeight::Nf4Tiled {
                codes,
                scales,
                levels,
                group,
            } => {
                let g = tiles::group_at(o, i / group, ic / group);
                scales[g] * levels[tiled_nibble(codes, o, i, ic) as usize]
            }
            QWeight::Grouped {
                codes,
                scales,
                mins,
                group,
            } => {
                let g = (o * ic + i) / group;
                let w = scales[g] * f32::from(codes[o * ic + i]);
                mins.map_or(w, |m| w + m[g])
            }
            QWeight::Grouped4 {
                codes,
                scales,
                mins,
                group,
            } => {
                let g = (o * ic + i) / group;
                let w = scales[g] * f32::from(nibble(codes, o * ic + i));
                mins.map_or(w, |m| w + m[g])
            }
        }
    }

    /// Row `o` dequantized into `out` (IC).
    pub fn row(&self, o: usize, out: &mut [f32]) {
        let ic = out.len();
        for (i, x) in out.iter_mut().enumerate() {
            *x = self.at(o, i, ic);
        }
    }

    /// Bytes of weight data (codes, scales, zero points) one full product reads.
    pub fn bytes(&self) -> usize {
        match *self {
            QWeight::F32(w) => 4 * w.len(),
            QWeight::Bf16(w) => 2 * w.len(),
            QWeight::Int8 { codes, scales } | QWeight::Int8Tiled { codes, scales } => {
                codes.len() + 2 * scales.len()
            }
            QWeight::Int4 {
                codes,
                scales,
                zeros,
                ..
            }
            | QWeight::Int4Tiled {
                codes,
                scales,
                zeros,
                ..
            } => codes.len() + 2 * scales.len() + zeros.map_or(0, |z| z.len()),
            QWeight::Nf4 { codes, scales, .. } | QWeight::Nf4Tiled { codes, scales, .. } => {
                codes.len() + 4 * scales.len()
            }
            QWeight::Grouped {
                codes,
                scales,
                mins,
                ..
            } => codes.len() + 4 * scales.len() + mins.map_or(0, |m| 4 * m.len()),
            QWeight::Grouped4 {
                codes,
                scales,
                mins,
                ..
            } => codes.len() + 4 * scales.len() + mins.map_or(0, |m| 4 * m.len()),
        }
    }
}

/// A grouped weight of `n` values holding `codes` codes: groups of 16 or 32 in rows of whole
/// blocks of 32, a scale (and a minimum, if any) per group.
fn check_grouped(
    codes: usize,
    n: usize,
    scales: &[f32],
    mins: Option<&[f32]>,
    group: usize,
    ic: usize,
) {
    assert!(
        (group == 16 || group == 32) && ic.is_multiple_of(SUB),
        "groups of 16 or 32 in rows of whole blocks of {SUB} (IC = {ic})"
    );
    assert!(codes == n && scales.len() == n / group, "grouped weight");
    if let Some(m) = mins {
        assert_eq!(m.len(), scales.len(), "one minimum per group");
    }
}

fn check_groups(codes: usize, scales: usize, oc: usize, ic: usize, group: usize) {
    assert!(
        group.is_multiple_of(SUB) && group > 0 && ic.is_multiple_of(group),
        "group {group} must be a multiple of {SUB} dividing IC = {ic}"
    );
    assert_eq!(codes, oc * ic / 2, "two codes per byte");
    assert_eq!(scales, oc * ic / group, "one scale per group");
}

/// The nibble of weight `idx` (flat index in a row-major matrix whose rows are whole sub-blocks).
#[inline(always)]
pub fn nibble(codes: &[u8], idx: usize) -> u8 {
    let (sub, j) = (idx / SUB, idx % SUB);
    let byte = codes[sub * (SUB / 2) + j % (SUB / 2)];
    if j < SUB / 2 {
        byte & 0xF
    } else {
        byte >> 4
    }
}

/// The nibble of weight (o, i) in int4's tiles of rows IC wide ([`tiles::code_at`]).
fn tiled_nibble(codes: &[u8], o: usize, i: usize, ic: usize) -> u8 {
    let (at, high) = tiles::code_at(o, i, ic);
    match high {
        true => codes[at] >> 4,
        false => codes[at] & 0xF,
    }
}

/// Packs 4-bit codes (one per weight, in row-major order) into the sub-block nibble order.
pub fn pack_nibbles(codes: &[u8]) -> Vec<u8> {
    assert!(codes.len().is_multiple_of(SUB), "whole sub-blocks of {SUB}");
    let mut out = vec![0u8; codes.len() / 2];
    for (sub, c) in codes.chunks_exact(SUB).enumerate() {
        for j in 0..SUB / 2 {
            out[sub * SUB / 2 + j] = (c[j] & 0xF) | (c[j + SUB / 2] << 4);
        }
    }
    out
}

/// `tail[r] += w(i) · a[r, i]` for the columns `body..ic` (the vector kernels' last IC mod 8 or
/// mod 16 products, in scalar code).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn scalar_tail<const R: usize>(
    tail: &mut [f32; R],
    a: &[f32],
    ic: usize,
    body: usize,
    w: impl Fn(usize) -> f32,
) {
    for i in body..ic {
        let x = w(i);
        for (r, t) in tail.iter_mut().enumerate() {
            *t += x * a[r * ic + i];
        }
    }
}
