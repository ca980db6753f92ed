//! Flash attention against the materialised kernel (itself held to finite differences), and the
//! flash backward directly against f64 finite differences of the reference forward.

use super::*;
use crate::attention;
use crate::testutil::*;

/// Materialised and flash attention reduce in different orders (per-tile rescaling, exp of
/// S - lse instead of normalised P); on O(1) inputs and T ≈ 150 both are within a few f32 ulps of
/// the exact value, so 2e-4 relative-or-absolute is the f32 budget, as elsewhere.
const FLASH_TOL: f64 = F32_TOL;

fn random_case(
    b: usize,
    t: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let r = (nh + 2 * nkv) * hd;
    // Scale 2 so softmax rows are peaked and the online max matters.
    let qkv: Vec<f32> = rng.vec(b * t * r).iter().map(|x| 2.0 * *x as f32).collect();
    (qkv, to_f32(&rng.vec(b * t * nh * hd)))
}

#[test]
fn matches_materialised_attention() {
    // T = 150 = 2 full tiles + a partial one; GQA 6 query heads over 2 kv heads.
    let (b, t, nh, nkv, hd) = (2, 150, 6, 2, 8);
    let (qkv, dout) = random_case(b, t, nh, nkv, hd, 15);
    let (mut out_ref, mut att) = (vec![0.0f32; b * t * nh * hd], vec![0.0f32; b * nh * t * t]);
    attention::forward(
        &mut out_ref,
        &mut att,
        &qkv,
        Shape::causal(b, t, nh, nkv, hd),
    );
    let (mut d_ref, mut datt) = (vec![0.5f32; qkv.len()], vec![0.0f32; att.len()]);
    attention::backward(
        &mut d_ref,
        &mut datt,
        &dout,
        &qkv,
        &att,
        Shape::causal(b, t, nh, nkv, hd),
    );

    let (mut out, mut lse) = (vec![9.0f32; out_ref.len()], vec![0.0f32; b * nh * t]);
    forward(&mut out, &mut lse, &qkv, Shape::causal(b, t, nh, nkv, hd));
    assert_close_f32("out", &out, &to_f64(&out_ref), FLASH_TOL);
    let mut d = vec![0.5f32; qkv.len()];
    backward(
        &mut d,
        &dout,
        &out,
        &lse,
        &qkv,
        Shape::causal(b, t, nh, nkv, hd),
    );
    assert_close_f32("dqkv", &d, &to_f64(&d_ref), FLASH_TOL);

    // lse against the materialised scores: P[t, s] = exp(S[t, s] - lse[t]) for every visible s.
    let (bi, h, ti) = (1, 4, 149);
    let (g, r) = (h / (nh / nkv), (nh + 2 * nkv) * hd);
    let q = &qkv[(bi * t + ti) * r + h * hd..][..hd];
    let k = &qkv[(bi * t + 3) * r + (nh + g) * hd..][..hd];
    let s: f32 = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() / (hd as f32).sqrt();
    let p = att[((bi * nh + h) * t + ti) * t + 3];
    assert_close(
        "P from lse",
        &[(s - lse[(bi * nh + h) * t + ti]).exp() as f64],
        &[p as f64],
        FLASH_TOL,
    );
}

#[test]
fn backward_matches_finite_differences() {
    let (b, t, nh, nkv, hd) = (1, 70, 2, 1, 3); // crosses one tile boundary
    let mut rng = Rng::new(16);
    let r = (nh + 2 * nkv) * hd;
    let (qkv, dout) = (rng.vec(b * t * r), rng.vec(b * t * nh * hd));
    let loss = |x: &[f64]| {
        let (mut o, mut a) = (vec![0.0; b * t * nh * hd], vec![0.0; b * nh * t * t]);
        attention::reference::forward(&mut o, &mut a, x, Shape::causal(b, t, nh, nkv, hd));
        dot(&o, &dout)
    };
    let fd = fd_grad(&qkv, loss);
    let (q32, d32) = (to_f32(&qkv), to_f32(&dout));
    let (mut out, mut lse) = (vec![0.0f32; b * t * nh * hd], vec![0.0f32; b * nh * t]);
    forward(&mut out, &mut lse, &q32, Shape::causal(b, t, nh, nkv, hd));
    let mut d = vec![0.0f32; qkv.len()];
    backward(
        &mut d,
        &d32,
        &out,
        &lse,
        &q32,
        Shape::causal(b, t, nh, nkv, hd),
    );
    assert_close_f32("dqkv", &d, &fd, F32_TOL);
}

#[test]
fn sliding_windows_match_the_reference_and_finite_differences() {
    // Windows inside one tile, across tile boundaries, of one position, and wider than T.
    let (b, t, nh, nkv, hd) = (1, 150, 4, 2, 4);
    let (qkv, dout) = random_case(b, t, nh, nkv, hd, 17);
    for window in [1usize, 5, 64, 100, 150, 1000] {
        let ws = Shape {
            window,
            ..Shape::causal(b, t, nh, nkv, hd)
        };
        let (mut out_ref, mut att_ref) =
            (vec![0.0f64; b * t * nh * hd], vec![0.0f64; b * nh * t * t]);
        let q64 = to_f64(&qkv);
        attention::reference::forward(&mut out_ref, &mut att_ref, &q64, ws);
        let (mut out_m, mut att) = (vec![0.0f32; out_ref.len()], vec![0.0f32; att_ref.len()]);
        attention::forward(&mut out_m, &mut att, &qkv, ws);
        assert_close_f32("materialised out", &out_m, &out_ref, FLASH_TOL);
        let (mut out, mut lse) = (vec![9.0f32; out_ref.len()], vec![0.0f32; b * nh * t]);
        forward(&mut out, &mut lse, &qkv, ws);
        assert_close_f32("flash out", &out, &out_ref, FLASH_TOL);
        // Nothing outside the window: query 149 never sees key 149 - window.
        if window < t {
            assert_eq!(att[149 * t + 149 - window], 0.0, "window {window}");
        }
        let (mut d_m, mut datt) = (vec![0.0f32; qkv.len()], vec![0.0f32; att.len()]);
        attention::backward(
            &mut d_m,
            &mut datt,
            &dout,
            &qkv,
            &att,
            Shape::causal(b, t, nh, nkv, hd),
        );
        let mut d = vec![0.0f32; qkv.len()];
        backward(&mut d, &dout, &out, &lse, &qkv, ws);
        assert_close_f32("flash dqkv", &d, &to_f64(&d_m), FLASH_TOL);
    }
    // The windowed backward against f64 finite differences of the windowed reference.
    let (t, window) = (70, 9);
    let mut rng = Rng::new(18);
    let r = (nh + 2 * nkv) * hd;
    let ws1 = Shape {
        window,
        ..Shape::causal(1, t, nh, nkv, hd)
    };
    let (x, dy) = (rng.vec(t * r), rng.vec(t * nh * hd));
    let loss = |x: &[f64]| {
        let (mut o, mut a) = (vec![0.0; t * nh * hd], vec![0.0; nh * t * t]);
        attention::reference::forward(&mut o, &mut a, x, ws1);
        dot(&o, &dy)
    };
    let fd = fd_grad(&x, loss);
    let (x32, dy32) = (to_f32(&x), to_f32(&dy));
    let (mut out, mut lse) = (vec![0.0f32; t * nh * hd], vec![0.0f32; nh * t]);
    forward(&mut out, &mut lse, &x32, ws1);
    let mut d = vec![0.0f32; x.len()];
    backward(&mut d, &dy32, &out, &lse, &x32, ws1);
    assert_close_f32("dqkv", &d, &fd, F32_TOL);
}
