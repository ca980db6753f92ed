//! Tests for the parent module: reference backward against f64 finite differences, fast kernels
//! against the reference.
use super::*;
use crate::testutil::*;

#[test]
fn backward_matches_finite_differences() {
    let (n, ic, oc) = (5, 7, 6);
    let mut rng = Rng::new(7);
    let (x, w, bias, r) = (
        rng.vec(n * ic),
        rng.vec(oc * ic),
        rng.vec(oc),
        rng.vec(n * oc),
    );
    let loss = |x: &[f64], w: &[f64], bias: &[f64]| {
        let mut out = vec![0.0; n * oc];
        reference::forward(&mut out, x, w, Some(bias), (n, ic, oc));
        dot(&out, &r)
    };
    let fd_x = fd_grad(&x, |v| loss(v, &w, &bias));
    let fd_w = fd_grad(&w, |v| loss(&x, v, &bias));
    let fd_b = fd_grad(&bias, |v| loss(&x, &w, v));
    let (mut dx, mut dw, mut db) = (vec![0.0; n * ic], vec![0.0; oc * ic], vec![0.0; oc]);
    reference::backward(&mut dx, &mut dw, Some(&mut db), &r, &x, &w, (n, ic, oc));
    assert_close("dinp f64", &dx, &fd_x, FD_TOL_F64);
    assert_close("dweight f64", &dw, &fd_w, FD_TOL_F64);
    assert_close("dbias f64", &db, &fd_b, FD_TOL_F64);

    let (mut dx, mut dw, mut db) = (
        vec![0.0f32; n * ic],
        vec![0.0f32; oc * ic],
        vec![0.0f32; oc],
    );
    let (x32, w32) = (to_f32(&x), to_f32(&w));
    backward(
        &mut dx,
        &mut dw,
        Some(&mut db),
        &to_f32(&r),
        &x32,
        &w32,
        (n, ic, oc),
    );
    assert_close_f32("dinp f32", &dx, &fd_x, F32_TOL);
    assert_close_f32("dweight f32", &dw, &fd_w, F32_TOL);
    assert_close_f32("dbias f32", &db, &fd_b, F32_TOL);
}

/// faer against the plain loops at a shape large enough for faer's blocked, parallel path, with
/// sizes that are not multiples of any SIMD width.
#[test]
fn gemm_matches_reference() {
    let (n, ic, oc) = (67, 133, 201);
    let mut rng = Rng::new(8);
    let (x, w, bias, g) = (
        rng.vec(n * ic),
        rng.vec(oc * ic),
        rng.vec(oc),
        rng.vec(n * oc),
    );
    let mut want = vec![0.0; n * oc];
    reference::forward(&mut want, &x, &w, Some(&bias), (n, ic, oc));
    let (x32, w32, b32, g32) = (to_f32(&x), to_f32(&w), to_f32(&bias), to_f32(&g));
    let mut out = vec![0.0f32; n * oc];
    forward(&mut out, &x32, &w32, Some(&b32), (n, ic, oc));
    // Sums of 133 products of O(1) terms: f32 rounding is ~1e-5 absolute.
    assert_close_f32("out", &out, &want, F32_TOL);
    forward(&mut out, &x32, &w32, None, (n, ic, oc));
    reference::forward(&mut want, &x, &w, None, (n, ic, oc));
    assert_close_f32("out without bias", &out, &want, F32_TOL);

    let (mut dx, mut dw, mut db) = (vec![0.0; n * ic], vec![0.0; oc * ic], vec![0.0; oc]);
    reference::backward(&mut dx, &mut dw, Some(&mut db), &g, &x, &w, (n, ic, oc));
    // Start from 1 to check that the fast path accumulates.
    let (mut dx32, mut dw32, mut db32) = (
        vec![1.0f32; n * ic],
        vec![1.0f32; oc * ic],
        vec![1.0f32; oc],
    );
    backward(
        &mut dx32,
        &mut dw32,
        Some(&mut db32),
        &g32,
        &x32,
        &w32,
        (n, ic, oc),
    );
    let plus_one = |v: &[f64]| v.iter().map(|x| x + 1.0).collect::<Vec<_>>();
    assert_close_f32("dinp", &dx32, &plus_one(&dx), F32_TOL);
    assert_close_f32("dweight", &dw32, &plus_one(&dw), F32_TOL);
    assert_close_f32("dbias", &db32, &plus_one(&db), F32_TOL);
}

/// The AVX-512 kernel against an f64 loop: every operand layout, ragged edges, K and N across
/// block boundaries, a strided dst, both accumulations, one thread and all; and the same bits
/// whatever the thread count.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_kernel_matches_reference() {
    use crate::cpu::{self, Level};
    use faer::Mat;
    if cpu::detected() < Level::Avx512 {
        return;
    }
    let mut rng = Rng::new(9);
    for (m, n, k) in [
        (1, 1, 1),
        (13, 33, 257),
        (25, 1030, 300),
        (100, 64, 600),
        (12, 32, 0),
    ] {
        let (a, b) = (to_f32(&rng.vec(m * k)), to_f32(&rng.vec(k * n)));
        let start = to_f32(&rng.vec(m * (n + 3)));
        let mut want = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                    .sum();
            }
        }
        // Each operand row-major, and as the transpose of a row-major copy of its transpose.
        let at = Mat::from_fn(k, m, |p, i| a[i * k + p]);
        let bt = Mat::from_fn(n, k, |j, p| b[p * n + j]);
        let lhs = [view(&a, m, k), at.as_ref().transpose()];
        let rhs = [view(&b, k, n), bt.as_ref().transpose()];
        let mut first: Option<Vec<f32>> = None;
        // One thread, and parts for three threads (more than the test pool may have), each
        // layout both ways.
        for x in 0..8 {
            let (l, r, accum, threads) = (x & 1, (x >> 1) & 1, x >> 2, [1, 3, 3, 1][x & 3]);
            let accum = [Accum::Replace, Accum::Add][accum];
            // dst: columns 1..=n of a (m, n + 3) matrix, so its row stride is not n.
            let mut buf = start.clone();
            let dst = view_mut(&mut buf, m, n + 3).submatrix_mut(0, 1, m, n);
            // SAFETY: the CPU has AVX-512 F (checked above); dst's column stride is 1.
            unsafe { super::avx512::gemm(dst, accum, lhs[l], rhs[r], threads) };
            let mut got = Vec::with_capacity(m * n);
            for i in 0..m {
                for j in 0..n {
                    let before = if accum == Accum::Add {
                        start[i * (n + 3) + 1 + j]
                    } else {
                        0.0
                    };
                    got.push(buf[i * (n + 3) + 1 + j] - before);
                }
                // Columns outside dst are untouched.
                assert_eq!(buf[i * (n + 3)], start[i * (n + 3)]);
                assert_eq!(
                    buf[i * (n + 3) + n + 1..][..2],
                    start[i * (n + 3) + n + 1..][..2]
                );
            }
            let what = format!("{m}x{n}x{k} lhs {l} rhs {r} {accum:?} threads {threads}");
            assert_close_f32(&what, &got, &want, F32_TOL * (k as f64).sqrt().max(1.0));
            if accum == Accum::Replace {
                match &first {
                    None => first = Some(got),
                    Some(f) => assert_eq!(f, &got, "{what}: the same bits on any split"),
                }
            }
        }
    }
}

/// Products nested in rayon tasks (each thread's packing buffer is then in use by the product
/// that waits on it) still come out right.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_kernel_nests_in_rayon_tasks() {
    use crate::cpu::{self, Level};
    if cpu::detected() < Level::Avx512 {
        return;
    }
    let (m, n, k) = (200, 300, 100);
    let mut rng = Rng::new(10);
    let (a, b) = (to_f32(&rng.vec(m * k)), to_f32(&rng.vec(k * n)));
    let mut want = vec![0.0f32; m * n];
    // SAFETY (both calls): the CPU has AVX-512 F; each dst is row-major.
    unsafe {
        super::avx512::gemm(
            view_mut(&mut want, m, n),
            Accum::Replace,
            view(&a, m, k),
            view(&b, k, n),
            1,
        )
    };
    let mut outs = vec![vec![0.0f32; m * n]; 6];
    outs.par_iter_mut().for_each(|out| unsafe {
        super::avx512::gemm(
            view_mut(out, m, n),
            Accum::Replace,
            view(&a, m, k),
            view(&b, k, n),
            rayon::current_num_threads(),
        )
    });
    for out in &outs {
        assert_eq!(out, &want);
    }
}
