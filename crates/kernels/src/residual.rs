//! Residual connection: `out = a + b`. Its backward is the identity on both inputs, so callers
//! pass the same `dout` on to both branches (the accumulating backward convention makes that
//! free); [`backward`] exists for symmetry and for branches kept in separate buffers.
//!
//! ```
//! let mut out = [0.0f32; 2];
//! kernels::residual::forward(&mut out, &[1.0, 2.0], &[3.0, 4.0]);
//! assert_eq!(out, [4.0, 6.0]);
//! ```

use crate::Real;

/// out (N), a (N), b (N).
pub fn forward<F: Real>(out: &mut [F], a: &[F], b: &[F]) {
    assert!(out.len() == a.len() && a.len() == b.len());
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// da += dout, db += dout.
pub fn backward<F: Real>(da: &mut [F], db: &mut [F], dout: &[F]) {
    assert!(da.len() == dout.len() && db.len() == dout.len());
    for ((x, y), &d) in da.iter_mut().zip(db.iter_mut()).zip(dout) {
        *x += d;
        *y += d;
    }
}

/// out += inp: adds a branch into the residual stream in place.
pub fn accumulate<F: Real>(out: &mut [F], inp: &[F]) {
    assert_eq!(out.len(), inp.len());
    for (o, &x) in out.iter_mut().zip(inp) {
        *o += x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = Rng::new(2);
        let (a, b, r) = (rng.vec(7), rng.vec(7), rng.vec(7));
        let loss = |a: &[f64], b: &[f64]| {
            let mut out = vec![0.0; 7];
            forward(&mut out, a, b);
            dot(&out, &r)
        };
        let (mut da, mut db) = (vec![0.0f32; 7], vec![0.0f32; 7]);
        backward(&mut da, &mut db, &to_f32(&r));
        assert_close_f32("da", &da, &fd_grad(&a, |x| loss(x, &b)), F32_TOL);
        assert_close_f32("db", &db, &fd_grad(&b, |x| loss(&a, x)), F32_TOL);
    }
}
