//! Tests for the parent module: reference backward against f64 finite differences, fast kernels
//! against the reference.
use super::*;
use crate::testutil::*;

const N: usize = 7;
const C: usize = 5;
const V: usize = 11;

#[test]
fn backward_matches_finite_differences() {
    let mut rng = Rng::new(14);
    let inp: Vec<f64> = rng.vec(N * C).iter().map(|x| 2.0 * x).collect();
    let wte = rng.vec(V * C);
    let targets: Vec<u32> = (0..N).map(|_| rng.below(V as u32)).collect();
    let dloss = 1.0 / N as f64;
    let loss = |inp: &[f64], wte: &[f64]| {
        let (mut di, mut dw) = (vec![0.0; N * C], vec![0.0; V * C]);
        dloss * reference::forward_backward(&mut di, &mut dw, inp, wte, &targets, N, C, V, dloss)
    };
    let fd_inp = fd_grad(&inp, |x| loss(x, &wte));
    let fd_wte = fd_grad(&wte, |w| loss(&inp, w));
    let (mut di, mut dw) = (vec![0.0; N * C], vec![0.0; V * C]);
    let total = reference::forward_backward(&mut di, &mut dw, &inp, &wte, &targets, N, C, V, dloss);
    assert_close("dinp f64", &di, &fd_inp, FD_TOL_F64);
    assert_close("dwte f64", &dw, &fd_wte, FD_TOL_F64);

    // Chunks of 3 rows: 7 = 3 + 3 + 1 exercises the partial last chunk.
    let (i32_, w32) = (to_f32(&inp), to_f32(&wte));
    let (mut losses, mut di32, mut dw32) =
        (vec![0.0f32; N], vec![0.0f32; N * C], vec![0.0f32; V * C]);
    let mut scratch = vec![0.0f32; 3 * V];
    let sum = forward_backward(
        &mut losses,
        &mut di32,
        Some(&mut dw32),
        &i32_,
        &w32,
        &targets,
        &mut scratch,
        N,
        C,
        V,
        dloss as f32,
    );
    assert_close("sum of losses", &[sum as f64], &[total], F32_TOL);
    assert_close_f32("dinp f32", &di32, &fd_inp, F32_TOL);
    assert_close_f32("dwte f32", &dw32, &fd_wte, F32_TOL);

    let mut losses2 = vec![0.0f32; N];
    let sum2 = super::loss(&mut losses2, &i32_, &w32, &targets, &mut scratch, N, C, V);
    assert_eq!(
        (sum2, &losses2),
        (sum, &losses),
        "loss alone must equal the fused forward"
    );
    let mut row = vec![0.0f32; V];
    logits(&mut row, &i32_[..C], &w32, C, V);
    let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
    assert_close(
        "row 0 loss from logits",
        &[lse - row[targets[0] as usize] as f64],
        &[losses[0] as f64],
        F32_TOL,
    );
}

#[test]
#[should_panic(expected = "beyond vocabulary")]
fn target_beyond_vocabulary_panics() {
    let mut scratch = vec![0.0f32; V];
    super::loss(
        &mut [0.0],
        &[0.0; C],
        &[0.0; V * C],
        &[V as u32],
        &mut scratch,
        1,
        C,
        V,
    );
}
