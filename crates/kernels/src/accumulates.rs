//! The invariant every backward kernel keeps, checked for each: it accumulates (`+=`) into the
//! gradients it writes. Each kernel runs once on zeroed gradients (the delta), then twice on
//! random starting gradients g0, which must end at g0 + delta and then g0 + 2·delta (to f32
//! rounding of one addition per element: 1e-5 relative). Scratch outputs (attention's `datt`,
//! the classifier's logits) are not gradients and may be overwritten. RoPE's backward is a
//! rotation of the gradient in place, not an accumulation, and is left out.

use crate::attention::Shape;
use crate::testutil::Rng;
use crate::{
    attention, classifier, embedding, flash, gelu, gemm_bf16, layernorm, matmul, residual, rmsnorm,
    swiglu,
};
use half::bf16;

fn values(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform() as f32).collect()
}

/// Runs `backward` (which adds into the gradient buffers it is given) from zero and from random
/// starts, checking every buffer accumulates.
fn check(what: &str, lens: &[usize], backward: &mut dyn FnMut(&mut [Vec<f32>])) {
    let mut rng = Rng::new(7);
    let mut zero: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.0; n]).collect();
    backward(&mut zero);
    let start: Vec<Vec<f32>> = lens.iter().map(|&n| values(&mut rng, n)).collect();
    let mut acc = start.clone();
    for times in 1..=2 {
        backward(&mut acc);
        for (k, ((got, g0), d)) in acc.iter().zip(&start).zip(&zero).enumerate() {
            assert!(
                d.iter().any(|&x| x != 0.0),
                "{what}: gradient {k} is all zero"
            );
            for (i, ((&got, &g0), &d)) in got.iter().zip(g0).zip(d).enumerate() {
                let want = g0 + times as f32 * d;
                let tol = 1e-5 * want.abs().max(1.0);
                assert!(
                    (got - want).abs() <= tol,
                    "{what}: gradient {k}[{i}] after {times} calls is {got}, not g0 + {times}·delta = {want}"
                );
            }
        }
    }
}

#[test]
fn every_backward_kernel_accumulates() {
    let mut rng = Rng::new(1);
    let (b, t, c, v) = (2, 4, 8, 11);
    let n = b * t;
    let dout = values(&mut rng, n * c);
    let inp = values(&mut rng, n * c);
    let weight = values(&mut rng, c);
    let tokens: Vec<u32> = (0..n).map(|_| rng.below(v as u32)).collect();
    check("embedding", &[v * c, t * c], &mut |g| {
        let [wte, wpe] = g else { unreachable!() };
        embedding::backward(wte, Some(wpe), &dout, &tokens, b, t, c);
    });
    let (mut mean, mut rstd, mut out) = (vec![0.0; n], vec![0.0; n], vec![0.0; n * c]);
    let bias = values(&mut rng, c);
    layernorm::forward(&mut out, &mut mean, &mut rstd, &inp, &weight, &bias, n, c);
    check("layernorm", &[n * c, c, c], &mut |g| {
        let [dinp, dw, db] = g else { unreachable!() };
        layernorm::backward(
            dinp,
            Some((dw, db)),
            &dout,
            &inp,
            &weight,
            &mean,
            &rstd,
            n,
            c,
        );
    });
    rmsnorm::forward(&mut out, &mut rstd, &inp, &weight, n, c, 1e-5);
    check("rmsnorm", &[n * c, c], &mut |g| {
        let [dinp, dw] = g else { unreachable!() };
        rmsnorm::backward(dinp, Some(dw), &dout, &inp, &weight, &rstd, n, c);
    });
    let oc = 6;
    let (w, dmm) = (values(&mut rng, oc * c), values(&mut rng, n * oc));
    check("matmul", &[n * c, oc * c, oc], &mut |g| {
        let [dinp, dw, db] = g else { unreachable!() };
        matmul::backward(dinp, dw, Some(db), &dmm, &inp, &w, (n, c, oc));
    });
    check("gelu", &[n * c], &mut |g| {
        gelu::backward(&mut g[0], &inp, &dout)
    });
    let gate_up = values(&mut rng, n * 2 * c);
    check("swiglu", &[n * 2 * c], &mut |g| {
        swiglu::backward(&mut g[0], &gate_up, &dout, n, c)
    });
    check("residual", &[n * c, n * c], &mut |g| {
        let [da, db] = g else { unreachable!() };
        residual::backward(da, db, &dout);
    });
    let (nh, nkv, hd) = (4, 2, 2);
    let qkv = values(&mut rng, n * (nh + 2 * nkv) * hd);
    let datty = values(&mut rng, n * nh * hd);
    let (mut atty, mut att) = (vec![0.0; n * nh * hd], vec![0.0; b * nh * t * t]);
    attention::forward(&mut atty, &mut att, &qkv, Shape::causal(b, t, nh, nkv, hd));
    let mut datt = vec![0.0; att.len()];
    check("attention", &[qkv.len()], &mut |g| {
        attention::backward(
            &mut g[0],
            &mut datt,
            &datty,
            &qkv,
            &att,
            Shape::causal(b, t, nh, nkv, hd),
        );
    });
    let mut lse = vec![0.0; b * nh * t];
    flash::forward(&mut atty, &mut lse, &qkv, Shape::causal(b, t, nh, nkv, hd));
    check("flash", &[qkv.len()], &mut |g| {
        flash::backward(
            &mut g[0],
            &datty,
            &atty,
            &lse,
            &qkv,
            Shape::causal(b, t, nh, nkv, hd),
        );
    });
    let wte = values(&mut rng, v * c);
    let (mut losses, mut scratch) = (vec![0.0; n], vec![0.0; 3 * v]);
    check("classifier", &[n * c, v * c], &mut |g| {
        let [dinp, dwte] = g else { unreachable!() };
        let (x, w, y) = (&inp, &wte, &tokens);
        let io = classifier::Io::new(&mut losses, dinp, Some(dwte), x, w, y, &mut scratch);
        classifier::forward_backward(io, (n, c, v), 0.5);
    });
    let (m, k) = (5, 16);
    let a: Vec<bf16> = values(&mut rng, m * k)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let bb: Vec<bf16> = values(&mut rng, oc * k)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    check("gemm_bf16 (Accum::Add)", &[m * oc], &mut |g| {
        gemm_bf16::gemm_nt(&mut g[0], &a, &bb, (m, oc, k), gemm_bf16::Accum::Add);
    });
}
