//! Every kernel family at every instruction-set level this CPU runs (`cpu::set_cap`), against the
//! same call at the best level: the f32 GEMM (faer's AVX-512 or AVX2 kernel, or the plain loop),
//! flash attention forward and backward (vectorised `exp`), GELU, layer norm, the fused classifier,
//! conversions, the bf16 GEMMs, the quantized products, NF4 dequantization and paged decode
//! attention. The unit tests hold the best level to the plain references; this holds every lower
//! level to the best, so an AVX2 or portable path cannot drift on a machine that would never pick
//! it.
//!
//! Budgets: the fp32 families differ across levels only in summation order and FMA contraction
//! (relative 1e-4 over sums of up to a few hundred terms); the quantized products at the AVX2
//! levels multiply int8-quantized activations (relative 2e-2, the int8 step of 1/127 over a
//! block's absmax, as the VNNI path); conversions and dequantization are exact.

use half::bf16;
use kernels::attention::Shape;
use kernels::cpu::{self, Level};

struct Rng(u64);

impl Rng {
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }
}

/// Every family's outputs, concatenated per family, at the level in force.
fn run_all() -> Vec<(&'static str, Vec<f32>)> {
    let mut rng = Rng(7);
    let mut out = Vec::new();
    // f32 linear forward and backward (n, ic, oc off the SIMD widths).
    let (n, ic, oc) = (37, 70, 53);
    let (inp, w, dout) = (rng.vec(n * ic), rng.vec(oc * ic), rng.vec(n * oc));
    let mut y = vec![0.0; n * oc];
    kernels::matmul::forward(&mut y, &inp, &w, None, (n, ic, oc));
    let (mut dinp, mut dw) = (vec![0.0; n * ic], vec![0.0; oc * ic]);
    kernels::matmul::backward(&mut dinp, &mut dw, None, &dout, &inp, &w, (n, ic, oc));
    out.push(("gemm_f32", [y, dinp, dw].concat()));
    // Flash attention, GQA (4 query heads over 2 KV heads), forward and backward.
    let (b, t, nh, nkv, hd) = (2, 45, 4, 2, 16);
    let qkv = rng.vec(b * t * (nh + 2 * nkv) * hd);
    let (mut o, mut lse) = (vec![0.0; b * t * nh * hd], vec![0.0; b * nh * t]);
    kernels::flash::forward(&mut o, &mut lse, &qkv, Shape::causal(b, t, nh, nkv, hd));
    let mut dqkv = vec![0.0; qkv.len()];
    let d_o = rng.vec(o.len());
    kernels::flash::backward(
        &mut dqkv,
        &d_o,
        &o,
        &lse,
        &qkv,
        Shape::causal(b, t, nh, nkv, hd),
    );
    out.push(("flash", [o, lse, dqkv].concat()));
    // GELU, layer norm.
    let x = rng.vec(1000);
    let mut g = vec![0.0; 1000];
    kernels::gelu::forward(&mut g, &x);
    let mut dg = vec![0.0; 1000];
    kernels::gelu::backward(&mut dg, &x, &rng.vec(1000));
    out.push(("gelu", [g, dg].concat()));
    let (rows, c) = (9, 100);
    let (xn, wn, bn) = (rng.vec(rows * c), rng.vec(c), rng.vec(c));
    let (mut yn, mut mean, mut rstd) = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
    kernels::layernorm::forward(&mut yn, &mut mean, &mut rstd, &xn, &wn, &bn, rows, c);
    out.push(("layernorm", [yn, mean, rstd].concat()));
    // The fused classifier: losses and both gradients.
    let (n, c, v) = (11, 24, 301);
    let (x, wte) = (rng.vec(n * c), rng.vec(v * c));
    let targets: Vec<u32> = (0..n as u32).map(|i| (i * 37) % v as u32).collect();
    let (mut losses, mut dx, mut dwte) = (vec![0.0; n], vec![0.0; n * c], vec![0.0; v * c]);
    let mut scratch = vec![0.0; 4 * v];
    let dw = Some(&mut dwte[..]);
    let io =
        kernels::classifier::Io::new(&mut losses, &mut dx, dw, &x, &wte, &targets, &mut scratch);
    kernels::classifier::forward_backward(io, (n, c, v), 1.0 / n as f32);
    out.push(("classifier", [losses, dx, dwte].concat()));
    // Conversions (exact).
    let mut h = vec![bf16::ZERO; 1003];
    kernels::convert::f32_to_bf16(&mut h, &rng.vec(1003));
    let mut back = vec![0.0; 1003];
    kernels::convert::bf16_to_f32(&mut back, &h);
    out.push(("convert", back));
    // bf16 GEMMs: nt, nn and nn into bf16.
    let (m, nn, k) = (70, 45, 131);
    let to_bf = |x: Vec<f32>| -> Vec<bf16> { x.into_iter().map(bf16::from_f32).collect() };
    let (a, bt, bk) = (
        to_bf(rng.vec(m * k)),
        to_bf(rng.vec(nn * k)),
        to_bf(rng.vec(k * nn)),
    );
    let mut y1 = vec![0.0; m * nn];
    kernels::gemm_bf16::gemm_nt(
        &mut y1,
        &a,
        &bt,
        (m, nn, k),
        kernels::gemm_bf16::Accum::Replace,
    );
    let mut y2 = vec![0.0; m * nn];
    kernels::gemm_bf16::gemm_nn(
        &mut y2,
        &a,
        &bk,
        (m, nn, k),
        kernels::gemm_bf16::Accum::Replace,
    );
    let mut y3 = vec![bf16::ZERO; m * nn];
    kernels::gemm_bf16::gemm_nn_bf16(
        &mut y3,
        &a,
        &bk,
        (m, nn, k),
        kernels::gemm_bf16::Accum::Replace,
    );
    let y3: Vec<f32> = y3.iter().map(|x| x.to_f32()).collect();
    out.push(("gemm_bf16", [y1, y2, y3].concat()));
    // Quantized products: int8 (a row scale), int4 (groups of 32, zero points), nf4.
    let (rows, ic, oc) = (3, 128, 40);
    let x = rng.vec(rows * ic);
    let i8s: Vec<i8> = rng.vec(oc * ic).iter().map(|v| (v * 127.0) as i8).collect();
    let u8s: Vec<u8> = rng
        .vec(oc * ic / 2)
        .iter()
        .map(|v| ((v + 1.0) * 127.0) as u8)
        .collect();
    let groups = oc * ic / 32;
    let hs: Vec<half::f16> = rng
        .vec(groups)
        .iter()
        .map(|v| half::f16::from_f32(v.abs() * 0.1))
        .collect();
    let zeros: Vec<u8> = (0..groups).map(|i| (i % 16) as u8).collect();
    let levels: [f32; 16] = std::array::from_fn(|i| i as f32 / 7.5 - 1.0);
    let fs: Vec<f32> = rng.vec(groups).iter().map(|v| v.abs()).collect();
    let weights = [
        kernels::qmatmul::QWeight::Int8 {
            codes: &i8s,
            scales: &hs[..oc],
        },
        kernels::qmatmul::QWeight::Int4 {
            codes: &u8s,
            scales: &hs,
            zeros: Some(&zeros),
            group: 32,
        },
        kernels::qmatmul::QWeight::Nf4 {
            codes: &u8s,
            scales: &fs,
            levels: &levels,
            group: 32,
        },
    ];
    let mut q = Vec::new();
    for w in &weights {
        let mut y = vec![0.0; rows * oc];
        kernels::qmatmul::matmul(&mut y, &x, w, rows, ic, oc);
        q.extend(y);
    }
    out.push(("qmatmul", q));
    // NF4 dequantization (exact).
    let stored = kernels::dequant::Stored::Nf4 {
        block: 64,
        double: false,
    };
    let n = 512;
    let mut src = u8s[..n / 2].to_vec();
    for s in fs[..n / 64].iter() {
        src.extend(s.to_le_bytes());
    }
    let mut deq = vec![0.0; n];
    kernels::dequant::dequantize(&mut deq, &src, stored, &levels, &[0.0; 256]);
    out.push(("dequant_nf4", deq));
    // Paged decode attention over f32 and int8 caches, head dims 64, 72 (64 + 8), 96 (64 + 32 in
    // 256 bits), 128 and 12 (the plain loops), rows of 70 and 33 positions (several tiles),
    // head-parallel and split in three.
    let mut att = Vec::new();
    for hd in [64, 72, 96, 128, 12] {
        att.extend(paged(&mut rng, hd));
    }
    out.push(("paged_attention", att));
    out
}

/// [`run_all`]'s paged attention at head dim `hd`: 8 query heads over 2 KV heads, blocks of 16.
fn paged(rng: &mut Rng, hd: usize) -> Vec<f32> {
    use kernels::paged_attention::{attend, write, KvShape, KvSlice, KvSliceMut, RowCtx};
    let shape = KvShape {
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: hd,
        block: 16,
    };
    let lens = [70usize, 33];
    let n_blocks = 8;
    let n = n_blocks * 2 * 16 * hd;
    let (mut kf, mut vf) = (vec![0.0f32; n], vec![0.0f32; n]);
    let (mut ki, mut vi) = (vec![0i8; n], vec![0i8; n]);
    let (mut ks, mut vs) = (vec![0.0f32; n / hd], vec![0.0f32; n / hd]);
    // Row 0 holds blocks 0, 2, 4, 6, 7; row 1 blocks 5, 3, 1.
    let tables: [&[u32]; 2] = [&[0, 2, 4, 6, 7], &[5, 3, 1]];
    for (table, len) in tables.iter().zip(lens) {
        for p in 0..len {
            let (b, s) = (table[p / 16] as usize, p % 16);
            let (k, v) = (rng.vec(2 * hd), rng.vec(2 * hd));
            write(&mut KvSliceMut::F32(&mut kf), &k, b, s, &shape);
            write(&mut KvSliceMut::F32(&mut vf), &v, b, s, &shape);
            let mut k8 = KvSliceMut::Int8 {
                codes: &mut ki,
                scales: &mut ks,
            };
            write(&mut k8, &k, b, s, &shape);
            let mut v8 = KvSliceMut::Int8 {
                codes: &mut vi,
                scales: &mut vs,
            };
            write(&mut v8, &v, b, s, &shape);
        }
    }
    let rows: Vec<RowCtx> = tables
        .iter()
        .zip(lens)
        .map(|(t, len)| RowCtx {
            blocks: t,
            start: 0,
            len,
        })
        .collect();
    let q = rng.vec(2 * 8 * hd);
    let caches = [
        (KvSlice::F32(&kf), KvSlice::F32(&vf)),
        (
            KvSlice::Int8 {
                codes: &ki,
                scales: &ks,
            },
            KvSlice::Int8 {
                codes: &vi,
                scales: &vs,
            },
        ),
    ];
    let mut out = Vec::new();
    for (k, v) in &caches {
        for splits in [1, 3] {
            let mut o = vec![0.0f32; 2 * 8 * hd];
            let mut parts = vec![0.0f32; shape.partials_len(2, splits)];
            attend(&mut o, &q, 8 * hd, &rows, k, v, &shape, splits, &mut parts);
            out.extend(o);
        }
    }
    out
}

#[test]
fn every_level_computes_what_the_best_level_computes() {
    let best = cpu::detected();
    let want = run_all();
    for level in cpu::supported() {
        cpu::set_cap(level).unwrap();
        let got = run_all();
        cpu::set_cap(best).unwrap();
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            let budget = match *name {
                "convert" | "dequant_nf4" => 0.0,
                "qmatmul" if level < Level::Avx512 => 2e-2,
                "gemm_bf16" => 1e-2,
                _ => 1e-4,
            };
            let scale = w.iter().fold(1.0f32, |m, x| m.max(x.abs()));
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                assert!(
                    (a - b).abs() <= budget * scale,
                    "{name} at {level} [{i}]: {a} vs {b} at {best}"
                );
            }
        }
    }
}
