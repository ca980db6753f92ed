//! Tests for the parent module: reference backward against f64 finite differences, fast kernels
//! against the reference.
use super::*;
use crate::testutil::*;

/// LayerNorm with C = 70 (not a multiple of the column block) and N = 19 rows.
const N: usize = 19;
const C: usize = 70;

struct Case {
    x: Vec<f64>,
    w: Vec<f64>,
    bias: Vec<f64>,
    r: Vec<f64>,
}

fn case() -> Case {
    let mut rng = Rng::new(5);
    Case {
        x: rng.vec(N * C),
        w: rng.vec(C),
        bias: rng.vec(C),
        r: rng.vec(N * C),
    }
}

fn loss(x: &[f64], w: &[f64], bias: &[f64], r: &[f64]) -> f64 {
    let mut out = vec![0.0; N * C];
    let (mut m, mut s) = (vec![0.0; N], vec![0.0; N]);
    reference::forward(&mut out, &mut m, &mut s, x, w, bias, N, C);
    dot(&out, r)
}

#[test]
fn backward_matches_finite_differences() {
    let k = case();
    let fd_x = fd_grad(&k.x, |x| loss(x, &k.w, &k.bias, &k.r));
    let fd_w = fd_grad(&k.w, |w| loss(&k.x, w, &k.bias, &k.r));
    let fd_b = fd_grad(&k.bias, |b| loss(&k.x, &k.w, b, &k.r));

    let (mut out, mut m, mut s) = (vec![0.0; N * C], vec![0.0; N], vec![0.0; N]);
    reference::forward(&mut out, &mut m, &mut s, &k.x, &k.w, &k.bias, N, C);
    let (mut dx, mut dw, mut db) = (vec![0.0; N * C], vec![0.0; C], vec![0.0; C]);
    reference::backward(&mut dx, &mut dw, &mut db, &k.r, &k.x, &k.w, &m, &s, N, C);
    assert_close("dinp f64", &dx, &fd_x, FD_TOL_F64);
    assert_close("dweight f64", &dw, &fd_w, FD_TOL_F64);
    assert_close("dbias f64", &db, &fd_b, FD_TOL_F64);

    let (x, w, bias) = (to_f32(&k.x), to_f32(&k.w), to_f32(&k.bias));
    let (mut out32, mut m32, mut s32) = (vec![0.0f32; N * C], vec![0.0f32; N], vec![0.0f32; N]);
    forward(&mut out32, &mut m32, &mut s32, &x, &w, &bias, N, C);
    assert_close_f32("out", &out32, &out, F32_TOL);
    let (mut dx32, mut dw32, mut db32) = (vec![0.0f32; N * C], vec![0.0f32; C], vec![0.0f32; C]);
    backward(
        &mut dx32,
        Some((&mut dw32, &mut db32)),
        &to_f32(&k.r),
        &x,
        &w,
        &m32,
        &s32,
        N,
        C,
    );
    assert_close_f32("dinp f32", &dx32, &fd_x, F32_TOL);
    assert_close_f32("dweight f32", &dw32, &fd_w, F32_TOL);
    assert_close_f32("dbias f32", &db32, &fd_b, F32_TOL);
}

#[test]
fn backward_accumulates() {
    let k = case();
    let (x, w, bias, r) = (to_f32(&k.x), to_f32(&k.w), to_f32(&k.bias), to_f32(&k.r));
    let (mut out, mut m, mut s) = (vec![0.0f32; N * C], vec![0.0f32; N], vec![0.0f32; N]);
    forward(&mut out, &mut m, &mut s, &x, &w, &bias, N, C);
    let run = |init: f32| {
        let (mut dx, mut dw, mut db) = (vec![init; N * C], vec![init; C], vec![init; C]);
        backward(&mut dx, Some((&mut dw, &mut db)), &r, &x, &w, &m, &s, N, C);
        [dx, dw, db]
    };
    let (zero, seven) = (run(0.0), run(7.0));
    for (a, b) in zero.iter().zip(&seven) {
        for (&u, &v) in a.iter().zip(b) {
            assert!(
                (u + 7.0 - v).abs() < 1e-4,
                "backward must add into its gradients"
            );
        }
    }
}
