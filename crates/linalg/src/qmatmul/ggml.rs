//! ggml's arithmetic for weights in its blocks of 32 (Q4_0 … Q8_0, repacked as `Grouped` or
//! `Grouped4` with groups of 32), written out as plain loops: the activations quantized as
//! `quantize_row_q8_1` does, each block's integer dot product scaled by the product of the two
//! scales and accumulated into eight f32 lanes of four products each as
//! `ggml_vec_dot_q4_1_q8_1` (and `…_q8_0_q8_0`) do on AVX2, the lanes summed in their order,
//! and the minima's share accumulated block by block with one fused multiply-add each. The
//! integer paths compute exactly this, bit for bit (tests).

use super::{nibble, QWeight};
use half::f16;

/// One row's activations as ggml's `block_q8_1`s: codes, and per block of 32 the scale and
/// the scaled code sum, both as fp16 values.
pub struct Q8Blocks {
    pub codes: Vec<i8>,
    pub scales: Vec<f32>,
    pub sums: Vec<f32>,
}

/// `quantize_row_q8_1` on one row (IC a multiple of 32).
pub fn quantize(x: &[f32]) -> Q8Blocks {
    assert!(x.len().is_multiple_of(32), "a row of whole blocks of 32");
    let fp16 = |v: f32| f16::from_f32(v).to_f32();
    let mut q = Q8Blocks {
        codes: Vec::with_capacity(x.len()),
        scales: Vec::new(),
        sums: Vec::new(),
    };
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
    q
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
    let code = |i: usize| -> i32 {
        match *w {
            QWeight::Grouped { codes, .. } => i32::from(codes[o * ic + i]),
            QWeight::Grouped4 { codes, .. } => i32::from(nibble(codes, o * ic + i)),
            _ => unreachable!(),
        }
    };
    let blocks = ic / 32;
    let mut lanes = [0.0f32; 8];
    let mut share = 0.0f32;
    for b in 0..blocks {
        let g = o * blocks + b;
        let d = scales[g] * a.scales[b];
        for (k, lane) in lanes.iter_mut().enumerate() {
            let s: i32 = (0..4)
                .map(|j| code(b * 32 + 4 * k + j) * i32::from(a.codes[b * 32 + 4 * k + j]))
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
