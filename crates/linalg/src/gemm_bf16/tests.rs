//! Every bf16 path against the plain loop and against an f64 sum of the same bf16 values.

use super::*;
use crate::testutil::*;

/// bf16 × bf16 products are exact in f32 (8-bit mantissas), so the paths differ only in summation
/// order: K = 777 terms of |x| < 1 give f32 rounding ~1e-5 absolute; 2e-4 catches any wrong index.
const BF16_GEMM_TOL: f64 = F32_TOL;

fn bf(x: &[f64]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f64(v)).collect()
}

fn exact(a: &[bf16], b: &[bf16], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| a[i * k + p].to_f64() * b[j * k + p].to_f64())
                .sum();
        }
    }
    out
}

#[test]
fn paths_match_reference() {
    // M, N not multiples of 4 or 64; K not a multiple of 32 or 16; N over two packed blocks of
    // 512 columns with a ragged last one; M within one task; (AMX) M over two 256-row tasks
    // with a ragged group of 32, K over two 512-deep blocks with an odd ragged one.
    for (m, n, k) in [
        (70, 131, 777),
        (64, 1100, 33),
        (200, 529, 8),
        (300, 70, 1031),
    ] {
        nt_paths_match_reference(m, n, k);
    }
}

fn nt_paths_match_reference(m: usize, n: usize, k: usize) {
    let mut rng = Rng::new(17);
    let (a, b) = (bf(&rng.vec(m * k)), bf(&rng.vec(n * k)));
    let want = exact(&a, &b, m, n, k);
    let mut out = vec![0.0f32; m * n];
    reference::gemm_nt(&mut out, &a, &b, m, n, k);
    assert_close_f32("reference", &out, &want, BF16_GEMM_TOL);
    for &isa in supported() {
        gemm_nt_on(isa, &mut out, &a, &b, (m, n, k), Accum::Replace);
        assert_close_f32(&format!("{isa:?} replace"), &out, &want, BF16_GEMM_TOL);
        gemm_nt_on(isa, &mut out, &a, &b, (m, n, k), Accum::Add);
        let twice: Vec<f64> = want.iter().map(|x| 2.0 * x).collect();
        assert_close_f32(&format!("{isa:?} add"), &out, &twice, BF16_GEMM_TOL);
    }
}

/// An empty K on every path: `Replace` writes zeros, `Add` leaves out as it was.
#[test]
fn empty_k_replaces_with_zeros_or_adds_nothing() {
    let (m, n) = (70, 40);
    for &isa in supported() {
        let mut out = vec![1.5f32; m * n];
        gemm_nt_on(isa, &mut out, &[], &[], (m, n, 0), Accum::Add);
        assert!(out.iter().all(|&x| x == 1.5), "{isa:?} nt add");
        gemm_nt_on(isa, &mut out, &[], &[], (m, n, 0), Accum::Replace);
        assert!(out.iter().all(|&x| x == 0.0), "{isa:?} nt replace");
        let mut out = vec![bf16::ONE; m * n];
        gemm_nn_bf16_on(isa, &mut out, &[], &[], (m, n, 0), Accum::Add);
        assert!(out.iter().all(|&x| x == bf16::ONE), "{isa:?} nn bf16 add");
        gemm_nn_bf16_on(isa, &mut out, &[], &[], (m, n, 0), Accum::Replace);
        assert!(
            out.iter().all(|&x| x == bf16::ZERO),
            "{isa:?} nn bf16 replace"
        );
    }
}

#[test]
fn forward_adds_bias_and_transpose_round_trips() {
    let (n, ic, oc) = (5, 33, 7);
    let mut rng = Rng::new(18);
    let (x, w, bias) = (
        bf(&rng.vec(n * ic)),
        bf(&rng.vec(oc * ic)),
        to_f32(&rng.vec(oc)),
    );
    let mut out = vec![0.0f32; n * oc];
    forward(&mut out, &x, &w, Some(&bias), n, ic, oc);
    let want: Vec<f64> = exact(&x, &w, n, oc, ic)
        .iter()
        .enumerate()
        .map(|(i, v)| v + bias[i % oc] as f64)
        .collect();
    assert_close_f32("forward", &out, &want, BF16_GEMM_TOL);
    let (mut wt, mut back) = (vec![bf16::ZERO; oc * ic], vec![bf16::ZERO; oc * ic]);
    transpose(&mut wt, &w, oc, ic);
    transpose(&mut back, &wt, ic, oc);
    assert_eq!(back, w);
    assert_eq!(wt[3 * oc + 2], w[2 * ic + 3]);
}

/// Shapes that cross the 64 × 64 tiles unevenly: every element lands at its transposed place.
#[test]
fn transpose_moves_every_element_across_tiles() {
    for (rows, cols) in [(130, 70), (1, 200), (200, 1), (64, 129)] {
        let src = bf(&Rng::new(19).vec(rows * cols));
        let mut dst = vec![bf16::ZERO; rows * cols];
        transpose(&mut dst, &src, rows, cols);
        for i in 0..rows {
            for j in 0..cols {
                assert_eq!(
                    dst[j * rows + i],
                    src[i * cols + j],
                    "({i},{j}) of {rows}x{cols}"
                );
            }
        }
    }
}

/// `gemm_nn` on shapes that cross its 64 × 128 blocks, 32-column tiles, 8-row tiles and 256-deep
/// K blocks unevenly (odd K, a K block of one row, N below one tile), both accumulate modes.
#[test]
fn nn_paths_match_reference() {
    let isas = supported();
    for (m, n, k) in [
        (70, 131, 777),
        (9, 33, 257),
        (1, 5, 3),
        (130, 768, 64),
        (3, 200, 1),
        (300, 70, 1031),
    ] {
        let mut rng = Rng::new(21);
        let (a, b) = (bf(&rng.vec(m * k)), bf(&rng.vec(k * n)));
        // The (N, K) copy of b turns the known nt product into the nn one.
        let mut bt = vec![bf16::ZERO; n * k];
        transpose(&mut bt, &b, k, n);
        let want = exact(&a, &bt, m, n, k);
        let mut out = vec![0.0f32; m * n];
        reference::gemm_nn(&mut out, &a, &b, m, n, k);
        assert_close_f32("nn reference", &out, &want, BF16_GEMM_TOL);
        for &isa in isas {
            out.fill(f32::NAN);
            gemm_nn_on(isa, &mut out, &a, &b, (m, n, k), Accum::Replace);
            let at = format!("{isa:?} nn {m}x{n}x{k}");
            assert_close_f32(&format!("{at} replace"), &out, &want, BF16_GEMM_TOL);
            gemm_nn_on(isa, &mut out, &a, &b, (m, n, k), Accum::Add);
            let twice: Vec<f64> = want.iter().map(|x| 2.0 * x).collect();
            assert_close_f32(&format!("{at} add"), &out, &twice, BF16_GEMM_TOL);
        }
    }
}

/// `gemm_nn_bf16` adds each element's whole K sum to its widened bf16 and rounds once: the
/// portable path exactly as `bf16(old + reference sum)` (the same f32 summation order), the
/// AVX-512 and AMX paths within one bf16 rounding of the exact value, K beyond one 256-deep
/// (AVX-512) and one 512-deep (AMX) block.
#[test]
fn nn_into_bf16_rounds_once() {
    let isas = supported();
    for (m, n, k) in [
        (70, 131, 300),
        (9, 33, 64),
        (1, 5, 3),
        (130, 200, 1),
        (300, 70, 1031),
    ] {
        let mut rng = Rng::new(22);
        let (a, b) = (bf(&rng.vec(m * k)), bf(&rng.vec(k * n)));
        let old = bf(&rng.vec(m * n));
        let mut sum = vec![0.0f32; m * n];
        reference::gemm_nn(&mut sum, &a, &b, m, n, k);
        let once: Vec<u16> = (old.iter().zip(&sum))
            .map(|(o, &s)| bf16::from_f32(o.to_f32() + s).to_bits())
            .collect();
        for &isa in isas {
            let mut out = old.clone();
            gemm_nn_bf16_on(isa, &mut out, &a, &b, (m, n, k), Accum::Add);
            let at = format!("{isa:?} nn into bf16 {m}x{n}x{k}");
            if isa == Isa::Portable {
                let got: Vec<u16> = out.iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, once, "{at}");
            }
            for ((&g, &s), &o) in out.iter().zip(&sum).zip(&old) {
                let want = o.to_f64() + f64::from(s);
                let err = (g.to_f64() - want).abs();
                assert!(err <= want.abs() / 256.0 + 1e-4, "{at}: {g} vs {want}");
            }
            gemm_nn_bf16_on(isa, &mut out, &a, &b, (m, n, k), Accum::Replace);
            for (&g, &s) in out.iter().zip(&sum) {
                let err = (g.to_f64() - f64::from(s)).abs();
                assert!(err <= f64::from(s.abs()) / 256.0 + 1e-4, "{at} replace");
            }
        }
    }
}

/// The 512-bit widening kernel gives the AVX2 one's bits, both layouts and outputs, on shapes
/// with ragged 12-row panels, an odd last 16-column panel and K over two 256-deep blocks.
#[test]
fn the_widening_kernels_give_the_same_bits() {
    if !(supported().contains(&Isa::Avx512) && supported().contains(&Isa::Avx2)) {
        return;
    }
    for (m, n, k) in [(70, 131, 777), (121, 48, 300), (13, 17, 5), (250, 300, 64)] {
        let mut rng = Rng::new(23);
        let (a, bt, bk) = (
            bf(&rng.vec(m * k)),
            bf(&rng.vec(n * k)),
            bf(&rng.vec(k * n)),
        );
        let old = bf(&rng.vec(m * n));
        let bits = |isa: Isa| {
            let mut nt = vec![0.5f32; m * n];
            gemm_nt_on(isa, &mut nt, &a, &bt, (m, n, k), Accum::Add);
            let mut nn = vec![0.0f32; m * n];
            gemm_nn_on(isa, &mut nn, &a, &bk, (m, n, k), Accum::Replace);
            let mut into = old.clone();
            gemm_nn_bf16_on(isa, &mut into, &a, &bk, (m, n, k), Accum::Add);
            let f = nt.iter().chain(&nn).map(|x| x.to_bits());
            f.chain(into.iter().map(|x| u32::from(x.to_bits())))
                .collect::<Vec<u32>>()
        };
        assert!(bits(Isa::Avx512) == bits(Isa::Avx2), "{m}x{n}x{k}");
    }
}
