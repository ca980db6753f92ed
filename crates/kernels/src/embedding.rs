//! Token and (learned) position embedding: `out[b,t,:] = wte[token[b,t],:] + wpe[t,:]`.
//!
//! Plain loops, generic over [`Real`] so the f64 instance is the finite-difference oracle; a copy
//! per row is memory bound, so there is no separate fast version. Llama-style models pass
//! `wpe: None` (positions come from RoPE). Token ids are validated by the data loader; an id
//! beyond the table here is a programmer error and panics.
//!
//! Under `--precision bf16` the tables are the 2-byte working copy: [`forward_bf16`] widens the
//! rows it reads (exact), and [`backward_bf16`] writes the 2-byte gradient directly: each
//! table row's part (every position holding that token, in order) is summed in f32 and added
//! with one rounding, one rayon task per distinct token (and per position for `wpe`), so no
//! f32 copy of the table exists. The caller gives the scratch for the positions sorted by
//! token (4 bytes a token).
//!
//! ```
//! let wte = [0.0f32, 1.0, 10.0, 11.0]; // V = 2, C = 2
//! let mut out = [0.0f32; 2];
//! kernels::embedding::forward(&mut out, &[1], &wte, None, 1, 1, 2);
//! assert_eq!(out, [10.0, 11.0]);
//! ```

use crate::convert::bf16_bits;
use crate::Real;
use half::bf16;
use rayon::prelude::*;

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

/// [`forward_shard`] from 2-byte tables: out (B,T,C) f32 = wte[token] + wpe[t], widened (a
/// token outside this table's ids `first..first + V` embeds as zero).
pub fn forward_bf16(
    out: &mut [f32],
    tokens: &[u32],
    wte: &[bf16],
    wpe: Option<&[bf16]>,
    (b, t, c): (usize, usize, usize),
    first: usize,
) {
    assert!(out.len() == b * t * c && tokens.len() == b * t);
    if let Some(wpe) = wpe {
        assert!(wpe.len() >= t * c, "wpe holds fewer than T positions");
    }
    let v = wte.len() / c;
    let own = |tok: u32| (tok as usize).checked_sub(first).filter(|&i| i < v);
    (out.par_chunks_mut(c).zip(tokens).enumerate()).for_each(|(row, (o, &tok))| {
        match own(tok) {
            Some(i) => (o.iter_mut().zip(&wte[i * c..][..c])).for_each(|(d, x)| *d = x.to_f32()),
            None => o.fill(0.0),
        }
        if let Some(wpe) = wpe {
            let pos = &wpe[(row % t) * c..][..c];
            o.iter_mut().zip(pos).for_each(|(d, p)| *d += p.to_f32());
        }
    });
}

/// [`backward_shard`] into 2-byte tables: every row of `dwte` (ids `first..first + V`) and of
/// `dwpe` takes the f32 sum of its positions' `dout` rows (in position order) with one rounding.
/// `order` (B·T) is scratch for the positions sorted by token.
#[allow(clippy::too_many_arguments)]
pub fn backward_bf16(
    dwte: &mut [bf16],
    dwpe: Option<&mut [bf16]>,
    dout: &[f32],
    tokens: &[u32],
    order: &mut [u32],
    (b, t, c): (usize, usize, usize),
    first: usize,
) {
    assert!(dout.len() == b * t * c && tokens.len() == b * t && order.len() >= b * t);
    let v = dwte.len() / c;
    let own = |tok: u32| (tok as usize).checked_sub(first).filter(|&i| i < v);
    let mut kept = 0;
    for p in 0..(b * t) as u32 {
        if own(tokens[p as usize]).is_some() {
            order[kept] = p;
            kept += 1;
        }
    }
    let order = &mut order[..kept];
    // By token, then position (each token's positions in order; sorts in place).
    order.sort_unstable_by_key(|&p| (tokens[p as usize], p));
    let table = dwte.as_mut_ptr() as usize;
    let add_group = |g: &[u32]| {
        let i = own(tokens[g[0] as usize]).expect("filtered to this table's ids");
        // SAFETY: each group is one distinct token, so no two tasks write one row, and the row
        // lies inside dwte (V·C elements).
        let row = unsafe { std::slice::from_raw_parts_mut((table as *mut bf16).add(i * c), c) };
        add_rows_rounded(row, g.iter().map(|&p| &dout[p as usize * c..][..c]));
    };
    split_groups(
        order,
        &|p, q| tokens[p as usize] == tokens[q as usize],
        &add_group,
    );
    if let Some(dwpe) = dwpe {
        assert!(dwpe.len() >= t * c, "wpe holds fewer than T positions");
        (dwpe[..t * c].par_chunks_mut(c).enumerate()).for_each(|(pos, row)| {
            add_rows_rounded(row, (0..b).map(|bb| &dout[(bb * t + pos) * c..][..c]));
        });
    }
}

/// Positions per serial piece of [`split_groups`].
const SERIAL: usize = 256;

/// Runs `f` on every run of `same` elements of `order`, halves split at a run's boundary and
/// run in parallel (no allocation).
fn split_groups(
    order: &[u32],
    same: &(impl Fn(u32, u32) -> bool + Sync),
    f: &(impl Fn(&[u32]) + Sync),
) {
    if order.len() <= SERIAL {
        return order.chunk_by(|&p, &q| same(p, q)).for_each(f);
    }
    let mut mid = order.len() / 2;
    while mid < order.len() && same(order[mid - 1], order[mid]) {
        mid += 1;
    }
    if mid == order.len() {
        // The second half is one token's run: nothing to split off.
        return order.chunk_by(|&p, &q| same(p, q)).for_each(f);
    }
    let (left, right) = order.split_at(mid);
    rayon::join(
        || split_groups(left, same, f),
        || split_groups(right, same, f),
    );
}

/// Columns summed at a time on the stack.
const COLS: usize = 64;

/// dst (C) = bf16(dst + Σ rows), the sum in f32 in the rows' order, rounded once.
fn add_rows_rounded<'a>(dst: &mut [bf16], rows: impl Iterator<Item = &'a [f32]> + Clone) {
    for j0 in (0..dst.len()).step_by(COLS) {
        let cols = COLS.min(dst.len() - j0);
        let mut acc = [0.0f32; COLS];
        for r in rows.clone() {
            (acc.iter_mut().zip(&r[j0..j0 + cols])).for_each(|(a, &x)| *a += x);
        }
        for (d, &a) in dst[j0..j0 + cols].iter_mut().zip(&acc) {
            *d = bf16::from_bits(bf16_bits(d.to_f32() + a));
        }
    }
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

    /// The 2-byte tables: the forward reads the same values widened; the backward's every
    /// element is the f32 backward's sum (from zero, same order per row) added to the old value
    /// with one rounding, whole and over two vocabulary shards.
    #[test]
    fn bf16_tables_round_each_rows_sum_once() {
        let (b, t, c, v) = (3, 5, 70, 6);
        let mut rng = Rng::new(3);
        let tokens: Vec<u32> = (0..b * t).map(|_| rng.below(v as u32)).collect();
        let half = |x: Vec<f64>| -> Vec<bf16> { x.iter().map(|&y| bf16::from_f64(y)).collect() };
        let (wte, wpe) = (half(rng.vec(v * c)), half(rng.vec(t * c)));
        let wide = |x: &[bf16]| -> Vec<f32> { x.iter().map(|y| y.to_f32()).collect() };
        let mut want = vec![0.0f32; b * t * c];
        let (wte32, wpe32) = (wide(&wte), wide(&wpe));
        forward(&mut want, &tokens, &wte32, Some(&wpe32), b, t, c);
        let mut got = vec![0.0f32; b * t * c];
        forward_bf16(&mut got, &tokens, &wte, Some(&wpe), (b, t, c), 0);
        assert_eq!(got, want);

        let dout = to_f32(&rng.vec(b * t * c));
        let (mut sum_te, mut sum_pe) = (vec![0.0f32; v * c], vec![0.0f32; t * c]);
        backward(&mut sum_te, Some(&mut sum_pe), &dout, &tokens, b, t, c);
        let once = |old: &[bf16], sum: &[f32]| -> Vec<bf16> {
            (old.iter().zip(sum))
                .map(|(o, &s)| bf16::from_f32(o.to_f32() + s))
                .collect()
        };
        let (mut dwte, mut dwpe) = (wte.clone(), wpe.clone());
        let mut order = vec![0u32; b * t];
        backward_bf16(
            &mut dwte,
            Some(&mut dwpe),
            &dout,
            &tokens,
            &mut order,
            (b, t, c),
            0,
        );
        assert_eq!(dwte, once(&wte, &sum_te));
        assert_eq!(dwpe, once(&wpe, &sum_pe));
        let mut parts = Vec::new();
        for (first, rows) in [(0, 4), (4, 2)] {
            let mut part = wte[first * c..(first + rows) * c].to_vec();
            backward_bf16(
                &mut part,
                None,
                &dout,
                &tokens,
                &mut order,
                (b, t, c),
                first,
            );
            parts.extend(part);
        }
        assert_eq!(parts, dwte);

        // One token over many positions (a run longer than a serial piece) and many tokens.
        let (b, t) = (4, 300);
        let tokens: Vec<u32> = (0..b * t)
            .map(|p| if p % 3 == 0 { 1 } else { (p % 5) as u32 })
            .collect();
        let dout = to_f32(&rng.vec(b * t * c));
        let mut sum = vec![0.0f32; v * c];
        backward(&mut sum, None, &dout, &tokens, b, t, c);
        let mut got = wte.clone();
        let mut order = vec![0u32; b * t];
        backward_bf16(&mut got, None, &dout, &tokens, &mut order, (b, t, c), 0);
        assert_eq!(got, once(&wte, &sum));
    }

    #[test]
    #[should_panic(expected = "beyond vocabulary")]
    fn token_beyond_vocabulary_panics() {
        let mut out = [0.0f32; 2];
        forward(&mut out, &[2], &[0.0f32; 4], None, 1, 1, 2);
    }
}
