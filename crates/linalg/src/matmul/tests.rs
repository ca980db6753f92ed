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
