//! The kernel against the f64 reference for every KV format, scattered block tables, GQA and MQA
//! groups, head-parallel and split-K (which must agree to 1e-6 relative), and fp8 against the
//! `formats` crate's codec.

use super::*;
use crate::testutil::Rng;

struct Cache {
    f32s: Vec<f32>,
    bf16s: Vec<bf16>,
    i8s: Vec<i8>,
    u8s: Vec<u8>,
    scales: Vec<f32>,
}

impl Cache {
    fn new(n_blocks: usize, s: &KvShape) -> Cache {
        let n = n_blocks * s.n_kv_heads * s.block;
        Cache {
            f32s: vec![0.0; n * s.head_dim],
            bf16s: vec![bf16::ZERO; n * s.head_dim],
            i8s: vec![0; n * s.head_dim],
            u8s: vec![0; n * s.head_dim],
            scales: vec![0.0; n],
        }
    }

    fn slice_mut(&mut self, fmt: usize) -> KvSliceMut<'_> {
        match fmt {
            0 => KvSliceMut::F32(&mut self.f32s),
            1 => KvSliceMut::Bf16(&mut self.bf16s),
            2 => KvSliceMut::Int8 {
                codes: &mut self.i8s,
                scales: &mut self.scales,
            },
            _ => KvSliceMut::Fp8 {
                codes: &mut self.u8s,
                scales: &mut self.scales,
            },
        }
    }

    fn slice(&self, fmt: usize) -> KvSlice<'_> {
        match fmt {
            0 => KvSlice::F32(&self.f32s),
            1 => KvSlice::Bf16(&self.bf16s),
            2 => KvSlice::Int8 {
                codes: &self.i8s,
                scales: &self.scales,
            },
            _ => KvSlice::Fp8 {
                codes: &self.u8s,
                scales: &self.scales,
            },
        }
    }
}

fn case(shape: KvShape, lens: &[usize], fmt: usize) {
    windowed_case(shape, lens, fmt, usize::MAX);
}

/// Each row attends to its last `window` tokens only (`start = len - window`).
fn windowed_case(shape: KvShape, lens: &[usize], fmt: usize, window: usize) {
    let mut rng = Rng::new(11 + fmt as u64);
    let (nkv, hd) = (shape.n_kv_heads, shape.head_dim);
    let per_seq: Vec<usize> = lens.iter().map(|l| l.div_ceil(shape.block)).collect();
    let n_blocks: usize = per_seq.iter().sum::<usize>() + 3;
    // Scattered tables: sequence i takes every other free block from the end.
    let mut free: Vec<u32> = (0..n_blocks as u32).rev().collect();
    let tables: Vec<Vec<u32>> = per_seq
        .iter()
        .map(|&n| (0..n).map(|_| free.remove(free.len() / 2)).collect())
        .collect();
    let (mut k, mut v) = (Cache::new(n_blocks, &shape), Cache::new(n_blocks, &shape));
    for (table, &len) in tables.iter().zip(lens) {
        for p in 0..len {
            let (b, s) = (table[p / shape.block] as usize, p % shape.block);
            let kt: Vec<f32> = (0..nkv * hd).map(|_| rng.uniform() as f32 * 2.0).collect();
            let vt: Vec<f32> = (0..nkv * hd).map(|_| rng.uniform() as f32).collect();
            write(&mut k.slice_mut(fmt), &kt, b, s, &shape);
            write(&mut v.slice_mut(fmt), &vt, b, s, &shape);
        }
    }
    let q_width = shape.n_heads * hd + 2 * nkv * hd;
    let q: Vec<f32> = (0..lens.len() * q_width)
        .map(|_| rng.uniform() as f32)
        .collect();
    let rows: Vec<RowCtx> = tables
        .iter()
        .zip(lens)
        .map(|(t, &len)| RowCtx {
            blocks: t,
            start: len.saturating_sub(window),
            len,
        })
        .collect();
    let n_out = lens.len() * shape.n_heads * hd;
    let mut want = vec![0.0f32; n_out];
    let (ks, vs) = (k.slice(fmt), v.slice(fmt));
    reference(&mut want, &q, q_width, &rows, &ks, &vs, &shape);
    let mut head_par = vec![f32::NAN; n_out];
    attend(
        &mut head_par,
        &q,
        q_width,
        &rows,
        &ks,
        &vs,
        &shape,
        1,
        &mut [],
    );
    for (i, (g, e)) in head_par.iter().zip(&want).enumerate() {
        assert!((g - e).abs() <= 1e-5, "fmt {fmt} [{i}]: {g} vs {e}");
    }
    for splits in [2, 3, 7] {
        let mut parts = vec![0.0f32; shape.partials_len(lens.len(), splits)];
        let mut split = vec![f32::NAN; n_out];
        attend(
            &mut split, &q, q_width, &rows, &ks, &vs, &shape, splits, &mut parts,
        );
        for (i, (g, e)) in split.iter().zip(&head_par).enumerate() {
            assert!(
                (g - e).abs() <= 1e-6 * e.abs().max(1.0),
                "fmt {fmt} splits {splits} [{i}]: {g} vs {e}"
            );
        }
    }
}

#[test]
fn every_format_matches_the_reference_over_scattered_blocks() {
    let gqa = KvShape {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
        block: 4,
    };
    for fmt in 0..4 {
        case(gqa, &[1, 5, 13, 8], fmt);
    }
    let mqa = KvShape {
        n_heads: 6,
        n_kv_heads: 1,
        head_dim: 8,
        block: 16,
    };
    case(mqa, &[40, 3], 0);
    let mha = KvShape {
        n_heads: 3,
        n_kv_heads: 3,
        head_dim: 12,
        block: 2,
    };
    case(mha, &[7], 2);
    // Head dims that take the column sums' every width over several tiles of positions: 64 and
    // 128 (whole blocks), 72 (64 + 8), 80 (64 + 16 in 512 bits, 64 + 8 + 8 in 256), 104 (64 + 32
    // + 8 in 256 bits at every x86 level).
    for (fmt, hd) in [(0, 64), (1, 72), (2, 80), (3, 128), (0, 72), (1, 104)] {
        let shape = KvShape {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: hd,
            block: 16,
        };
        case(shape, &[70, 33, 1], fmt);
    }
    // Sliding windows: starts inside a block, on a block boundary, past short sequences.
    for (fmt, window) in [(0, 5), (1, 8), (2, 3), (3, 40)] {
        windowed_case(gqa, &[1, 5, 13, 17, 33], fmt, window);
    }
}

#[test]
fn int8_and_fp8_keep_each_value_within_half_a_step() {
    let shape = KvShape {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 64,
        block: 1,
    };
    let mut rng = Rng::new(3);
    let x: Vec<f32> = (0..64).map(|_| rng.uniform() as f32 * 5.0).collect();
    let absmax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let mut c = Cache::new(1, &shape);
    write(&mut c.slice_mut(2), &x, 0, 0, &shape);
    let mut back = vec![0.0f32; 64];
    c.slice(2).load(0, 64, &mut back);
    for (a, b) in x.iter().zip(&back) {
        assert!(
            (a - b).abs() <= absmax / 127.0 / 2.0 * 1.0001,
            "int8 {a} {b}"
        );
    }
    write(&mut c.slice_mut(3), &x, 0, 0, &shape);
    c.slice(3).load(0, 64, &mut back);
    for (a, b) in x.iter().zip(&back) {
        // e4m3 keeps 3 mantissa bits: relative error at most 2^-4 above the subnormals.
        assert!(
            (a - b).abs() <= a.abs() / 16.0 + absmax / 448.0 / 512.0,
            "fp8 {a} {b}"
        );
    }
}

#[test]
fn fp8_matches_the_formats_codec() {
    let layout = formats::FloatLayout::FP8_E4M3;
    for code in 0..=255u32 {
        let v = layout.decode(code);
        if v.is_nan() {
            assert!(crate::fp8::E4M3[code as usize].is_nan());
            continue;
        }
        assert_eq!(crate::fp8::E4M3[code as usize] as f64, v, "code {code:#x}");
    }
    let mut rng = Rng::new(5);
    for _ in 0..20000 {
        let x = (rng.uniform() * 448.0) * (rng.uniform() * 8.0).exp2() / 256.0;
        let ours = crate::fp8::e4m3_from_f32(x as f32);
        let theirs = layout.encode(f64::from(x as f32)) as u8;
        assert_eq!(ours, theirs, "x = {x}");
    }
}
