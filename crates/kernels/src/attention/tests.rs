//! Tests for the parent module: reference backward against f64 finite differences, fast kernels
//! against the reference.
use super::*;
use crate::testutil::*;

/// GQA with two query heads per kv head and T not a power of two.
const B: usize = 2;
const T: usize = 5;
const NH: usize = 4;
const NKV: usize = 2;
const HD: usize = 3;
const R: usize = (NH + 2 * NKV) * HD;

#[test]
fn backward_matches_finite_differences() {
    let mut rng = Rng::new(12);
    let qkv = rng.vec(B * T * R);
    let dout = rng.vec(B * T * NH * HD);
    let loss = |x: &[f64]| {
        let (mut out, mut att) = (vec![0.0; B * T * NH * HD], vec![0.0; B * NH * T * T]);
        reference::forward(&mut out, &mut att, x, Shape::causal(B, T, NH, NKV, HD));
        dot(&out, &dout)
    };
    let fd = fd_grad(&qkv, loss);
    let (mut out, mut att) = (vec![0.0; B * T * NH * HD], vec![0.0; B * NH * T * T]);
    reference::forward(&mut out, &mut att, &qkv, Shape::causal(B, T, NH, NKV, HD));
    let (mut dqkv, mut datt) = (vec![0.0; qkv.len()], vec![0.0; att.len()]);
    reference::backward(
        &mut dqkv,
        &mut datt,
        &dout,
        &qkv,
        &att,
        Shape::causal(B, T, NH, NKV, HD),
    );
    assert_close("dqkv f64", &dqkv, &fd, FD_TOL_F64);

    let (q32, d32) = (to_f32(&qkv), to_f32(&dout));
    let (mut out32, mut att32) = (vec![0.0f32; out.len()], vec![7.0f32; att.len()]);
    forward(
        &mut out32,
        &mut att32,
        &q32,
        Shape::causal(B, T, NH, NKV, HD),
    );
    assert_close_f32("out", &out32, &out, F32_TOL);
    assert_close_f32("att", &att32, &att, F32_TOL);
    let (mut dqkv32, mut datt32) = (vec![0.0f32; qkv.len()], vec![7.0f32; att.len()]);
    backward(
        &mut dqkv32,
        &mut datt32,
        &d32,
        &q32,
        &att32,
        Shape::causal(B, T, NH, NKV, HD),
    );
    assert_close_f32("dqkv f32", &dqkv32, &fd, F32_TOL);
}

/// The fast path against the reference at a size where faer's blocking matters, with accumulation.
#[test]
fn fast_matches_reference_at_larger_shape() {
    let (b, t, nh, nkv, hd) = (2, 67, 6, 2, 16);
    let r = (nh + 2 * nkv) * hd;
    let mut rng = Rng::new(13);
    let qkv = to_f32(&rng.vec(b * t * r));
    let dout = to_f32(&rng.vec(b * t * nh * hd));
    let (mut out, mut att) = (vec![0.0f32; b * t * nh * hd], vec![0.0f32; b * nh * t * t]);
    reference::forward(&mut out, &mut att, &qkv, Shape::causal(b, t, nh, nkv, hd));
    let (mut dq_ref, mut scratch) = (vec![1.0f32; qkv.len()], vec![0.0f32; att.len()]);
    reference::backward(
        &mut dq_ref,
        &mut scratch,
        &dout,
        &qkv,
        &att,
        Shape::causal(b, t, nh, nkv, hd),
    );

    let (mut out2, mut att2) = (vec![0.0f32; out.len()], vec![0.0f32; att.len()]);
    forward(&mut out2, &mut att2, &qkv, Shape::causal(b, t, nh, nkv, hd));
    let mut dq = vec![1.0f32; qkv.len()];
    backward(
        &mut dq,
        &mut scratch,
        &dout,
        &qkv,
        &att2,
        Shape::causal(b, t, nh, nkv, hd),
    );
    assert_close_f32("out", &out2, &to_f64(&out), F32_TOL);
    assert_close_f32("dqkv", &dq, &to_f64(&dq_ref), F32_TOL);
}
