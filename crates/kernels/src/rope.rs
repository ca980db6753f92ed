//! Rotary position embedding in Hugging Face Llama's `rotate_half` convention: within each head
//! of dim HD, element `i` pairs with `i + HD/2` and the pair turns by `pos * theta^(-2i/HD)`,
//! positions 0..T. Applied in place; the backward is the rotation by the opposite angle, applied
//! in place to the gradient (a rotation's adjoint is its inverse).
//!
//! [`forward_rows`] rotates the first heads of rows that hold more (a packed qkv row
//! `[q heads | k heads | v heads]` rotates its NH + NKV leading heads in one call). Angles are
//! computed in the kernel's float type, as HF does in f32. Plain loops, generic over [`Real`]:
//! one `sin`/`cos` per (position, frequency), shared by all heads.
//!
//! ```
//! let mut x = [1.0f32, 0.0]; // B = T = NH = 1, HD = 2: position 0 does not rotate
//! kernels::rope::forward(&mut x, 1, 1, 1, 2, 10000.0);
//! assert_eq!(x, [1.0, 0.0]);
//! ```

use crate::Real;

/// Which heads of a row turn: (heads, HD, row length); the first `heads` heads of HD elements
/// of every row of `row length`.
pub type Heads = (usize, usize, usize);

/// x (B,T,NH,HD), rotated in place.
pub fn forward<F: Real>(x: &mut [F], b: usize, t: usize, nh: usize, hd: usize, theta: F) {
    forward_rows(x, (b, t), (nh, hd, nh * hd), theta);
}

/// dx (B,T,NH,HD): the gradient w.r.t. the rotated x, turned in place into the gradient w.r.t.
/// the input of [`forward`].
pub fn backward<F: Real>(dx: &mut [F], b: usize, t: usize, nh: usize, hd: usize, theta: F) {
    backward_rows(dx, (b, t), (nh, hd, nh * hd), theta);
}

/// x (B,T,row length): rotates the leading heads of every row in place.
pub fn forward_rows<F: Real>(x: &mut [F], (b, t): (usize, usize), heads: Heads, theta: F) {
    assert!(x.len() == b * t * heads.2);
    rotate_rows(x, heads, theta, F::one(), |r| r % t);
}

/// The backward of [`forward_rows`], in place on the gradient.
pub fn backward_rows<F: Real>(dx: &mut [F], (b, t): (usize, usize), heads: Heads, theta: F) {
    assert!(dx.len() == b * t * heads.2);
    rotate_rows(dx, heads, theta, -F::one(), |r| r % t);
}

/// Rotates the leading heads of each row of `x` for the position `positions[row]` (inference: a
/// row's place in its own sequence).
pub fn forward_at<F: Real>(x: &mut [F], positions: &[u32], heads: Heads, theta: F) {
    assert_eq!(x.len(), positions.len() * heads.2, "one position per row");
    rotate_rows(x, heads, theta, F::one(), |r| positions[r] as usize);
}

fn rotate_rows<F: Real>(
    x: &mut [F],
    (n_heads, hd, row_len): Heads,
    theta: F,
    sign: F,
    position: impl Fn(usize) -> usize,
) {
    assert!(
        hd.is_multiple_of(2),
        "RoPE needs an even head dim, got {hd}"
    );
    assert!(n_heads * hd <= row_len);
    let half = hd / 2;
    for (row_idx, row) in x.chunks_exact_mut(row_len).enumerate() {
        let pos = F::from_f64(position(row_idx) as f64);
        for i in 0..half {
            let inv_freq = F::one() / theta.powf(F::from_f64((2 * i) as f64 / hd as f64));
            let angle = pos * inv_freq;
            let (cos, sin) = (angle.cos(), sign * angle.sin());
            for head in row[..n_heads * hd].chunks_exact_mut(hd) {
                let (x1, x2) = (head[i], head[i + half]);
                head[i] = x1 * cos - x2 * sin;
                head[i + half] = x2 * cos + x1 * sin;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn backward_matches_finite_differences() {
        // Packed rows: 3 rotated heads of 4 plus 2 heads' worth of untouched values.
        let (b, t, nh, hd, row_len) = (2, 5, 3, 4, 20);
        let mut rng = Rng::new(9);
        let (x, r) = (rng.vec(b * t * row_len), rng.vec(b * t * row_len));
        let loss = |x: &[f64]| {
            let mut y = x.to_vec();
            forward_rows(&mut y, (b, t), (nh, hd, row_len), 10000.0);
            dot(&y, &r)
        };
        let fd = fd_grad(&x, loss);
        let mut d64 = r.clone();
        backward_rows(&mut d64, (b, t), (nh, hd, row_len), 10000.0);
        assert_close("dx f64", &d64, &fd, FD_TOL_F64);
        let mut d32 = to_f32(&r);
        backward_rows(&mut d32, (b, t), (nh, hd, row_len), 10000.0f32);
        assert_close_f32("dx f32", &d32, &fd, F32_TOL);
    }

    #[test]
    fn matches_rotate_half_formula() {
        // Position 1, HD = 4, theta = 100: frequencies 1 and 1/10.
        let mut x = vec![0.0f64; 2 * 4];
        x[4..].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        forward(&mut x, 1, 2, 1, 4, 100.0);
        let (c0, s0, c1, s1) = (1f64.cos(), 1f64.sin(), 0.1f64.cos(), 0.1f64.sin());
        let want = [
            1.0 * c0 - 3.0 * s0,
            2.0 * c1 - 4.0 * s1,
            3.0 * c0 + 1.0 * s0,
            4.0 * c1 + 2.0 * s1,
        ];
        assert_close("rotated", &x[4..], &want, 1e-12);
    }

    #[test]
    fn rows_at_their_positions_match_the_sequence_form() {
        let (t, nh, hd, row_len) = (6, 2, 4, 12);
        let mut rng = Rng::new(4);
        let x = to_f32(&rng.vec(t * row_len));
        let mut whole = x.clone();
        forward_rows(&mut whole, (1, t), (nh, hd, row_len), 10000.0f32);
        // Rows 3 and 5 alone, at their positions.
        let mut two: Vec<f32> = [&x[3 * row_len..4 * row_len], &x[5 * row_len..]].concat();
        forward_at(&mut two, &[3, 5], (nh, hd, row_len), 10000.0f32);
        assert_eq!(&two[..row_len], &whole[3 * row_len..4 * row_len]);
        assert_eq!(&two[row_len..], &whole[5 * row_len..]);
    }
}
