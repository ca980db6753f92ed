//! ggml's arithmetic for weights in its blocks of 32 (Q4_0 … Q8_0, repacked as `Grouped` or
//! `Grouped4` with groups of 32), written out as plain loops: the activations quantized as
//! `quantize_row_q8_1` does, each block's integer dot product scaled by the product of the two
//! scales and accumulated into eight f32 lanes of four products each as
//! `ggml_vec_dot_q4_1_q8_1` (and `…_q8_0_q8_0`) do on AVX2, the lanes summed in their order,
//! and the minima's share accumulated block by block with one fused multiply-add each. The
//! integer paths compute exactly this, bit for bit (tests), and the portable level runs it as
//! written ([`rows`]): weights in blocks of 32 multiply to the same bits at every level.

use super::{nibble, QWeight};
use half::f16;
use std::cell::RefCell;
use std::ops::Range;

/// One row's activations as ggml's `block_q8_1`s: codes, and per block of 32 the scale and
/// the scaled code sum, both as fp16 values.
#[derive(Default)]
pub struct Q8Blocks {
    pub codes: Vec<i8>,
    pub scales: Vec<f32>,
    pub sums: Vec<f32>,
}

/// `quantize_row_q8_1` on one row (IC a multiple of 32).
pub fn quantize(x: &[f32]) -> Q8Blocks {
    let mut q = Q8Blocks::default();
    quantize_into(&mut q, x);
    q
}

/// [`quantize`] into `q`, reusing its buffers.
fn quantize_into(q: &mut Q8Blocks, x: &[f32]) {
    assert!(x.len().is_multiple_of(32), "a row of whole blocks of 32");
    let fp16 = |v: f32| f16::from_f32(v).to_f32();
    q.codes.clear();
    q.scales.clear();
    q.sums.clear();
    for block in x.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for v in block {
            let c = (v * inv).round_ties_even() as i32;
            sum += c;
            q.codes.push(c as i8);
        }
        q.scales.push(fp16(d));
        q.sums.push(fp16(d * sum as f32));
    }
}

/// Whether `w` is in ggml's blocks of 32, which multiply in ggml's arithmetic.
pub fn takes(w: &QWeight) -> bool {
    matches!(
        w,
        QWeight::Grouped { group: 32, .. } | QWeight::Grouped4 { group: 32, .. }
    )
}

thread_local! {
    /// This thread's quantized activation rows, grown once to the largest (one set per product
    /// running on the thread at once), taken for the call and put back.
    static SCRATCH: RefCell<Vec<Vec<Q8Blocks>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with one of this thread's activation scratches, the rows of `x` (IC each)
/// quantized into it.
pub(super) fn with_quantized<R>(x: &[f32], ic: usize, f: impl FnOnce(&[Q8Blocks]) -> R) -> R {
    let mut q = SCRATCH.with(|s| s.borrow_mut().pop()).unwrap_or_default();
    let rows = x.len() / ic;
    if q.len() < rows {
        q.resize_with(rows, Q8Blocks::default);
    }
    for (q, x) in q.iter_mut().zip(x.chunks(ic)) {
        quantize_into(q, x);
    }
    let out = f(&q[..rows]);
    SCRATCH.with(|s| s.borrow_mut().push(q));
    out
}

/// The portable level's product for [`takes`] weights: outputs `range` of each quantized
/// activation row in `a` into `out` (rows of OC), in ggml's arithmetic; the rows share one pass
/// over the weights.
pub(super) fn rows(
    out: &mut [f32],
    a: &[Q8Blocks],
    w: &QWeight,
    (ic, oc): (usize, usize),
    range: Range<usize>,
) {
    for o in range {
        for (r, a) in a.iter().enumerate() {
            out[r * oc + o] = dot(w, o, a, ic);
        }
    }
}

/// ggml's dot product of weight row `o` with one quantized activation row.
fn dot(w: &QWeight, o: usize, a: &Q8Blocks, ic: usize) -> f32 {
    let (scales, mins) = match *w {
        QWeight::Grouped {
            scales,
            mins,
            group: 32,
            ..
        }
        | QWeight::Grouped4 {
            scales,
            mins,
            group: 32,
            ..
        } => (scales, mins),
        _ => panic!("ggml's arithmetic is for weights in blocks of 32"),
    };
    // Block b's 32 codes: one signed byte each, or (nibble order) 16 bytes whose low nibbles
    // are the first 16 and high nibbles the rest.
    let block_codes = |b: usize| -> [i16; 32] {
        let at = o * ic + b * 32;
        match *w {
            QWeight::Grouped { codes, .. } => std::array::from_fn(|i| i16::from(codes[at + i])),
            QWeight::Grouped4 { codes, .. } => {
                let bytes = &codes[at / 2..][..16];
                debug_assert_eq!(nibble(codes, at + 17), bytes[1] >> 4);
                std::array::from_fn(|i| i16::from((bytes[i % 16] >> (4 * (i / 16))) & 0xF))
            }
            _ => unreachable!(),
        }
    };
    let blocks = ic / 32;
    let mut lanes = [0.0f32; 8];
    let mut share = 0.0f32;
    for b in 0..blocks {
        let g = o * blocks + b;
        let d = scales[g] * a.scales[b];
        let codes = block_codes(b);
        let acts = &a.codes[b * 32..][..32];
        for (k, lane) in lanes.iter_mut().enumerate() {
            let s: i32 = (0..4)
                .map(|j| i32::from(codes[4 * k + j]) * i32::from(acts[4 * k + j]))
                .sum();
            *lane = d.mul_add(s as f32, *lane);
        }
        if let Some(m) = mins {
            share = m[g].mul_add(a.sums[b], share);
        }
    }
    let l = lanes;
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])) + share
}

/// out (N,OC) = inp (N,IC) · Wᵀ in ggml's arithmetic, for `Grouped`/`Grouped4` weights in
/// groups of 32.
pub fn reference(out: &mut [f32], inp: &[f32], w: &QWeight, n: usize, ic: usize, oc: usize) {
    w.check(oc, ic);
    for r in 0..n {
        let a = quantize(&inp[r * ic..(r + 1) * ic]);
        for o in 0..oc {
            out[r * oc + o] = dot(w, o, &a, ic);
        }
    }
}
