//! llm.c-style loops for causal GQA attention, generic over [`Real`]: the oracle for the fast
//! kernels (in f32) and for finite differences (in f64). Same packing and layout as the parent.

use super::{inv_sqrt, Shape};
use crate::Real;

/// Calls `f(bi, ti, h, g)` for every batch row, query position and head in order (`g`: the
/// head's KV head).
fn each_query(shape: Shape, mut f: impl FnMut(usize, usize, usize, usize)) {
    let (b, t, nh, nkv, _) = shape.dims();
    for bi in 0..b {
        for ti in 0..t {
            for h in 0..nh {
                f(bi, ti, h, h / (nh / nkv));
            }
        }
    }
}

/// out (B,T,NH*HD), att (B,NH,T,T), qkv (B,T,(NH+2*NKV)*HD); query `t` sees keys
/// `t + 1 - window ..= t` only (the backward is the same: the probabilities are zero outside the
/// window).
pub fn forward<F: Real>(out: &mut [F], att: &mut [F], qkv: &[F], shape: Shape) {
    let (_, t, nh, nkv, hd) = shape.dims();
    let window = shape.window;
    let (r, c) = ((nh + 2 * nkv) * hd, nh * hd);
    let scale = inv_sqrt::<F>(hd);
    each_query(shape, |bi, ti, h, g| {
        let q = &qkv[(bi * t + ti) * r + h * hd..][..hd];
        let a = &mut att[((bi * nh + h) * t + ti) * t..][..t];
        let lo = (ti + 1).saturating_sub(window);
        let mut max = F::neg_infinity();
        for s in lo..=ti {
            let k = &qkv[(bi * t + s) * r + (nh + g) * hd..][..hd];
            let mut dot = F::zero();
            for i in 0..hd {
                dot += q[i] * k[i];
            }
            a[s] = dot * scale;
            max = max.max(a[s]);
        }
        let mut sum = F::zero();
        for x in a[lo..=ti].iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        for x in a[lo..=ti].iter_mut() {
            *x = *x / sum;
        }
        a[..lo].iter_mut().for_each(|x| *x = F::zero());
        a[ti + 1..].iter_mut().for_each(|x| *x = F::zero());
        let o = &mut out[(bi * t + ti) * c + h * hd..][..hd];
        o.iter_mut().for_each(|x| *x = F::zero());
        for s in lo..=ti {
            let v = &qkv[(bi * t + s) * r + (nh + nkv + g) * hd..][..hd];
            for i in 0..hd {
                o[i] += a[s] * v[i];
            }
        }
    });
}

/// Accumulates dqkv (B,T,R); datt (B,NH,T,T) is scratch.
pub fn backward<F: Real>(
    dqkv: &mut [F],
    datt: &mut [F],
    dout: &[F],
    qkv: &[F],
    att: &[F],
    shape: Shape,
) {
    let (_, t, nh, nkv, hd) = shape.dims();
    let (r, c) = ((nh + 2 * nkv) * hd, nh * hd);
    let scale = inv_sqrt::<F>(hd);
    each_query(shape, |bi, ti, h, g| {
        let row = ((bi * nh + h) * t + ti) * t;
        let d_o = &dout[(bi * t + ti) * c + h * hd..][..hd];
        // dP and dV, through out = sum_s P[s] v[s].
        for s in 0..=ti {
            let v_off = (bi * t + s) * r + (nh + nkv + g) * hd;
            let mut dp = F::zero();
            for i in 0..hd {
                dp += d_o[i] * qkv[v_off + i];
                dqkv[v_off + i] += att[row + s] * d_o[i];
            }
            datt[row + s] = dp;
        }
        // Softmax backward, then dQ and dK through the scaled dot products.
        let mut dot = F::zero();
        for s in 0..=ti {
            dot += att[row + s] * datt[row + s];
        }
        let q_off = (bi * t + ti) * r + h * hd;
        for s in 0..=ti {
            let ds = att[row + s] * (datt[row + s] - dot) * scale;
            let k_off = (bi * t + s) * r + (nh + g) * hd;
            for i in 0..hd {
                dqkv[q_off + i] += ds * qkv[k_off + i];
                dqkv[k_off + i] += ds * qkv[q_off + i];
            }
        }
    });
}
