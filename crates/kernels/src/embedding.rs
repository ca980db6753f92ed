//! Token and (learned) position embedding: `out[b,t,:] = wte[token[b,t],:] + wpe[t,:]`.
//!
//! Plain loops, generic over [`Real`] so the f64 instance is the finite-difference oracle; a copy
//! per row is memory bound, so there is no separate fast version. Llama-style models pass
//! `wpe: None` (positions come from RoPE). Token ids are validated by the data loader; an id
//! beyond the table here is a programmer error and panics.
//!
//! ```
//! let wte = [0.0f32, 1.0, 10.0, 11.0]; // V = 2, C = 2
//! let mut out = [0.0f32; 2];
//! kernels::embedding::forward(&mut out, &[1], &wte, None, 1, 1, 2);
//! assert_eq!(out, [10.0, 11.0]);
//! ```

use crate::Real;

/// out (B,T,C), tokens (B,T), wte (V,C), wpe (maxT,C) with maxT >= T.
pub fn forward<F: Real>(
    out: &mut [F],
    tokens: &[u32],
    wte: &[F],
    wpe: Option<&[F]>,
    b: usize,
    t: usize,
    c: usize,
) {
    check_ids(tokens, wte.len() / c);
    forward_shard(out, tokens, wte, wpe, (b, t, c), 0);
}

/// Panics on an id beyond a whole table of `v` rows (the loader validates ids; this is a
/// programmer error).
fn check_ids(tokens: &[u32], v: usize) {
    if let Some(&tok) = tokens.iter().find(|&&tok| tok as usize >= v) {
        panic!("token {tok} beyond vocabulary {v}");
    }
}

/// Vocab-parallel [`forward`]: `wte` holds the rows of ids `first..first + V`; a token outside
/// them embeds as zero (another rank's rows fill it when the ranks' outputs are summed).
#[allow(clippy::too_many_arguments)]
pub fn forward_shard<F: Real>(
    out: &mut [F],
    tokens: &[u32],
    wte: &[F],
    wpe: Option<&[F]>,
    (b, t, c): (usize, usize, usize),
    first: usize,
) {
    assert_eq!(out.len(), b * t * c);
    assert_eq!(tokens.len(), b * t);
    let v = wte.len() / c;
    if let Some(wpe) = wpe {
        assert!(wpe.len() >= t * c, "wpe holds fewer than T positions");
    }
    for (row, (out_row, &tok)) in out.chunks_exact_mut(c).zip(tokens).enumerate() {
        match (tok as usize).checked_sub(first).filter(|&i| i < v) {
            Some(i) => out_row.copy_from_slice(&wte[i * c..][..c]),
            None => out_row.fill(F::zero()),
        }
        if let Some(wpe) = wpe {
            let pos = &wpe[(row % t) * c..][..c];
            for (o, &p) in out_row.iter_mut().zip(pos) {
                *o += p;
            }
        }
    }
}

/// Vocab-parallel [`backward`]: only tokens in `first..first + V` reach `dwte`; `dwpe` takes
/// every row.
pub fn backward_shard<F: Real>(
    dwte: &mut [F],
    mut dwpe: Option<&mut [F]>,
    dout: &[F],
    tokens: &[u32],
    (b, t, c): (usize, usize, usize),
    first: usize,
) {
    assert_eq!(dout.len(), b * t * c);
    assert_eq!(tokens.len(), b * t);
    let v = dwte.len() / c;
    for (row, (d_row, &tok)) in dout.chunks_exact(c).zip(tokens).enumerate() {
        if let Some(i) = (tok as usize).checked_sub(first).filter(|&i| i < v) {
            for (g, &d) in dwte[i * c..][..c].iter_mut().zip(d_row) {
                *g += d;
            }
        }
        if let Some(dwpe) = dwpe.as_deref_mut() {
            for (g, &d) in dwpe[(row % t) * c..][..c].iter_mut().zip(d_row) {
                *g += d;
            }
        }
    }
}

/// Accumulates dwte (V,C) and dwpe (maxT,C) from dout (B,T,C).
pub fn backward<F: Real>(
    dwte: &mut [F],
    dwpe: Option<&mut [F]>,
    dout: &[F],
    tokens: &[u32],
    b: usize,
    t: usize,
    c: usize,
) {
    check_ids(tokens, dwte.len() / c);
    backward_shard(dwte, dwpe, dout, tokens, (b, t, c), 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn backward_matches_finite_differences() {
        let (b, t, c, v) = (2, 3, 4, 5);
        let mut rng = Rng::new(1);
        let tokens: Vec<u32> = (0..b * t).map(|_| rng.below(v as u32)).collect();
        let wte = rng.vec(v * c);
        let wpe = rng.vec(t * c);
        let r = rng.vec(b * t * c);
        let loss = |wte: &[f64], wpe: &[f64]| {
            let mut out = vec![0.0; b * t * c];
            forward(&mut out, &tokens, wte, Some(wpe), b, t, c);
            dot(&out, &r)
        };
        let fd_wte = fd_grad(&wte, |x| loss(x, &wpe));
        let fd_wpe = fd_grad(&wpe, |x| loss(&wte, x));
        // Accumulation: start from ones and subtract them after.
        let mut dwte = vec![1.0f32; v * c];
        let mut dwpe = vec![1.0f32; t * c];
        backward(&mut dwte, Some(&mut dwpe), &to_f32(&r), &tokens, b, t, c);
        let minus_one = |g: Vec<f32>| g.iter().map(|&x| x as f64 - 1.0).collect::<Vec<_>>();
        assert_close("dwte", &minus_one(dwte), &fd_wte, F32_TOL);
        assert_close("dwpe", &minus_one(dwpe), &fd_wpe, F32_TOL);
    }

    #[test]
    fn vocabulary_shards_sum_to_the_whole_table() {
        let (b, t, c, v) = (2, 3, 4, 7);
        let mut rng = Rng::new(2);
        let tokens: Vec<u32> = (0..b * t).map(|_| rng.below(v as u32)).collect();
        let wte = to_f32(&rng.vec(v * c));
        let dout = to_f32(&rng.vec(b * t * c));
        let mut whole = vec![0.0f32; b * t * c];
        forward(&mut whole, &tokens, &wte, None, b, t, c);
        let mut dwhole = vec![0.0f32; v * c];
        backward(&mut dwhole, None, &dout, &tokens, b, t, c);
        let mut sum = vec![0.0f32; b * t * c];
        let mut dsum = Vec::new();
        for (first, rows) in [(0, 4), (4, 3)] {
            let mut part = vec![0.0f32; b * t * c];
            let table = &wte[first * c..(first + rows) * c];
            forward_shard(&mut part, &tokens, table, None, (b, t, c), first);
            sum.iter_mut().zip(&part).for_each(|(s, p)| *s += p);
            let mut dpart = vec![0.0f32; rows * c];
            backward_shard(&mut dpart, None, &dout, &tokens, (b, t, c), first);
            dsum.extend(dpart);
        }
        assert_eq!(sum, whole);
        assert_eq!(dsum, dwhole);
    }

    #[test]
    #[should_panic(expected = "beyond vocabulary")]
    fn token_beyond_vocabulary_panics() {
        let mut out = [0.0f32; 2];
        forward(&mut out, &[2], &[0.0f32; 4], None, 1, 1, 2);
    }
}
