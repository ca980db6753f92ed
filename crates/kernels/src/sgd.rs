//! SGD with momentum exactly as `torch.optim.SGD` (dampening 0, nesterov off): `g += wd * p`;
//! `buf = momentum * buf + g` (on the first step `buf = g`); `p -= lr * buf`.
//!
//! torch sets `buf = g` on the first step; a zeroed buffer gives the same (`momentum * 0 + g`),
//! so the caller zeroes the buffer once at start-up. With momentum 0 the buffer is unused and may
//! be empty.
//!
//! ```
//! use kernels::sgd::{update, Sgd};
//! let (mut p, mut buf) = ([1.0f32], [0.0f32]);
//! let opt = Sgd { lr: 0.1, momentum: 0.9, weight_decay: 0.0 };
//! update(&mut p, &[1.0], &mut buf, opt);
//! assert_eq!((p[0], buf[0]), (0.9, 1.0));
//! ```

use rayon::prelude::*;

/// Hyperparameters, with torch's names and meaning.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
}

const CHUNK: usize = 1 << 14;

/// One step on params (P) with grads (P) and momentum_buf (P, zeroed before the first step; may
/// be empty when momentum is 0).
pub fn update(params: &mut [f32], grads: &[f32], momentum_buf: &mut [f32], opt: Sgd) {
    assert_eq!(grads.len(), params.len());
    if opt.momentum == 0.0 {
        params
            .par_chunks_mut(CHUNK)
            .zip(grads.par_chunks(CHUNK))
            .for_each(|(p, g)| {
                for (p, &g) in p.iter_mut().zip(g) {
                    *p -= opt.lr * (g + opt.weight_decay * *p);
                }
            });
        return;
    }
    assert_eq!(momentum_buf.len(), params.len());
    params
        .par_chunks_mut(CHUNK)
        .zip(grads.par_chunks(CHUNK))
        .zip(momentum_buf.par_chunks_mut(CHUNK))
        .for_each(|((p, g), buf)| {
            for i in 0..p.len() {
                let d = g[i] + opt.weight_decay * p[i];
                buf[i] = opt.momentum * buf[i] + d;
                p[i] -= opt.lr * buf[i];
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn matches_torch_algorithm_over_five_steps() {
        let mut rng = Rng::new(11);
        let n = 20_000;
        let (lr, mom, wd) = (0.05, 0.9, 0.01);
        let mut p64 = rng.vec(n);
        let mut buf64 = vec![0.0; n];
        let mut p32 = to_f32(&p64);
        let mut buf32 = vec![0.0f32; n];
        for step in 0..5 {
            let g = rng.vec(n);
            for i in 0..n {
                let d = g[i] + wd * p64[i];
                buf64[i] = if step == 0 { d } else { mom * buf64[i] + d };
                p64[i] -= lr * buf64[i];
            }
            let opt = Sgd {
                lr: lr as f32,
                momentum: mom as f32,
                weight_decay: wd as f32,
            };
            update(&mut p32, &to_f32(&g), &mut buf32, opt);
        }
        assert_close_f32("params", &p32, &p64, 1e-6);
        assert_close_f32("buf", &buf32, &buf64, 1e-6);
    }

    #[test]
    fn no_momentum_needs_no_buffer() {
        let mut p = [1.0f32];
        update(
            &mut p,
            &[2.0],
            &mut [],
            Sgd {
                lr: 0.5,
                momentum: 0.0,
                weight_decay: 0.0,
            },
        );
        assert_eq!(p[0], 0.0);
    }
}
