//! Mixture-of-experts routing (Mixtral, DeepSeek): a router's softmax and top-k, the dropless
//! sorted layout the expert GEMMs run on, and the gathers, weighted combines and scatters
//! between token order and expert order, with their backwards.
//!
//! Every token picks `k` distinct experts, so the routed rows number exactly N·k whatever the
//! router decides: the sorted layout is a static (N·k, ·) buffer, expert `e` owning the rows
//! `offsets[e] .. offsets[e + 1]` (at most N of them), tokens in ascending order within an
//! expert. The `route` tensor packs four u32 arrays: `idx` (N·k: each token's experts, best
//! first), `perm` (N·k: sorted row → token·k + choice), `inv` (N·k: its inverse) and `offsets`
//! (E + 1). Gates (N·k, f32) are the chosen probabilities, renormalised over the k choices
//! (Mixtral, `norm_topk_prob`) or multiplied by a scaling factor (DeepSeek-V2). Sums over a
//! token's choices run in choice order, so every result is deterministic.
//!
//! The loops are generic over [`Real`] so the f64 instantiation is the finite-difference oracle.
//!
//! ```
//! // 1 token, 2 experts, top-1: the larger logit wins with gate 1 after renormalisation.
//! let mut probs = [0.0f32, 1.0];
//! let (mut gates, mut route) = ([0.0f32; 1], [0u32; 3 + 3]);
//! kernels::moe::route(&mut probs, &mut gates, &mut route, 1, 2, 1, kernels::moe::Routing::RENORMALISED, None);
//! assert_eq!(route[0], 1); // idx
//! assert_eq!(gates[0], 1.0);
//! ```

use crate::Real;

pub use plan::model::{Gating, Routing};

/// u32 elements of a route tensor for `n` tokens, `k` choices and `e` experts.
pub fn route_len(n: usize, k: usize, e: usize) -> usize {
    3 * n * k + e + 1
}

/// The four arrays of a route tensor: (idx, perm, inv, offsets).
pub fn parts(route: &[u32], n: usize, k: usize) -> (&[u32], &[u32], &[u32], &[u32]) {
    let nk = n * k;
    let (idx, rest) = route.split_at(nk);
    let (perm, rest) = rest.split_at(nk);
    let (inv, offsets) = rest.split_at(nk);
    (idx, perm, inv, offsets)
}

/// Router logits (N, E) → probabilities in place (softmax per row); each row's top-k experts
/// (largest first, the lower index on a tie), gates (N·k) and the sorted layout into `route`.
/// With `aux` (2E), adds each expert's selection count to `aux[..E]` and its probability sum to
/// `aux[E..]`, what the load-balancing loss needs.
#[allow(clippy::too_many_arguments)]
pub fn route<F: Real>(
    probs: &mut [F],
    gates: &mut [F],
    route: &mut [u32],
    n: usize,
    e: usize,
    k: usize,
    routing: Routing,
    mut aux: Option<&mut [F]>,
) {
    assert!(probs.len() == n * e && gates.len() == n * k && route.len() == route_len(n, k, e));
    assert!(k >= 1 && k <= e, "top-{k} of {e} experts");
    let gating = routing.gating;
    if let Some((g, kept)) = routing.groups {
        assert!(
            g <= 64 && e.is_multiple_of(g) && kept <= g && k <= kept * (e / g),
            "groups {g}/{kept}"
        );
    }
    let nk = n * k;
    for t in 0..n {
        let row = &mut probs[t * e..(t + 1) * e];
        let max = row.iter().fold(F::neg_infinity(), |m, &x| m.max(x));
        let mut sum = F::zero();
        for x in row.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        for x in row.iter_mut() {
            *x = *x / sum;
        }
        let allowed = match routing.groups {
            None => u64::MAX,
            Some((g, kept)) => kept_groups(row, g, kept),
        };
        let per_group = routing.groups.map_or(e, |(g, _)| e / g);
        let chosen = &mut route[t * k..(t + 1) * k];
        for j in 0..k {
            let mut best = usize::MAX;
            for (x, &p) in row.iter().enumerate() {
                let taken = chosen[..j].contains(&(x as u32));
                let open = allowed >> (x / per_group) & 1 == 1;
                if open && !taken && (best == usize::MAX || p > row[best]) {
                    best = x;
                }
            }
            chosen[j] = best as u32;
        }
        let g = &mut gates[t * k..(t + 1) * k];
        for (gj, &x) in g.iter_mut().zip(chosen.iter()) {
            *gj = row[x as usize];
        }
        match gating {
            Gating::Renormalise => {
                let s = g.iter().fold(F::zero(), |a, &x| a + x);
                g.iter_mut().for_each(|x| *x = *x / s);
            }
            Gating::Scaled(f) => g.iter_mut().for_each(|x| *x *= F::from_f64(f.into())),
        }
        if let Some(aux) = aux.as_deref_mut() {
            for &x in chosen.iter() {
                aux[x as usize] += F::one();
            }
            for (a, &p) in aux[e..].iter_mut().zip(row.iter()) {
                *a += p;
            }
        }
    }
    let (idx, rest) = route.split_at_mut(nk);
    let (perm, rest) = rest.split_at_mut(nk);
    let (inv, offsets) = rest.split_at_mut(nk);
    offsets.fill(0);
    for &x in idx.iter() {
        offsets[x as usize + 1] += 1;
    }
    for x in 0..e {
        offsets[x + 1] += offsets[x];
    }
    // Expert by expert, tokens ascending (E passes over N·k ids: no allocation).
    for (x, &first) in offsets[..e].iter().enumerate() {
        let mut row = first;
        for (slot, &chosen) in idx.iter().enumerate() {
            if chosen as usize == x {
                perm[row as usize] = slot as u32;
                inv[slot] = row;
                row += 1;
            }
        }
    }
}

/// The bit set of the `kept` groups (of `g`) with the largest best probability in `row`.
fn kept_groups<F: Real>(row: &[F], g: usize, kept: usize) -> u64 {
    let per = row.len() / g;
    let best = |x: usize| {
        row[x * per..(x + 1) * per]
            .iter()
            .fold(F::neg_infinity(), |m, &p| m.max(p))
    };
    let mut set = 0u64;
    for _ in 0..kept {
        let next = (0..g)
            .filter(|&x| set >> x & 1 == 0)
            .fold(None, |acc: Option<usize>, x| match acc {
                Some(y) if best(y) >= best(x) => Some(y),
                _ => Some(x),
            })
            .expect("kept <= groups");
        set |= 1 << next;
    }
    set
}

/// dlogits (N, E) += the gradient of the router logits, from the gates' gradient `dgates`
/// (N·k) through the gating and the softmax; `dprob` (E), when given, is added to every row's
/// probability gradient first (the load-balancing loss's). Only a row's k chosen probabilities
/// receive a gate's gradient, so the softmax backward needs no scratch row.
pub fn route_backward<F: Real>(
    dlogits: &mut [F],
    dgates: &[F],
    probs: &[F],
    route: &[u32],
    (n, e, k): (usize, usize, usize),
    gating: Gating,
    dprob: Option<&[F]>,
) {
    assert!(dlogits.len() == n * e && probs.len() == n * e && dgates.len() == n * k);
    let (idx, ..) = parts(route, n, k);
    let base = |x: usize| dprob.map_or(F::zero(), |c| c[x]);
    for t in 0..n {
        let p = &probs[t * e..(t + 1) * e];
        let chosen = &idx[t * k..(t + 1) * k];
        let dg = &dgates[t * k..(t + 1) * k];
        // The gate gradient's share of each chosen probability's gradient.
        let extra = |j: usize| -> F {
            match gating {
                Gating::Renormalise => {
                    let s = chosen.iter().fold(F::zero(), |a, &x| a + p[x as usize]);
                    let dot = chosen
                        .iter()
                        .zip(dg)
                        .fold(F::zero(), |a, (&x, &d)| a + d * p[x as usize] / s);
                    (dg[j] - dot) / s
                }
                Gating::Scaled(f) => dg[j] * F::from_f64(f.into()),
            }
        };
        let mut dot = (0..e).fold(F::zero(), |a, x| a + p[x] * base(x));
        for (j, &x) in chosen.iter().enumerate() {
            dot += p[x as usize] * extra(j);
        }
        let row = &mut dlogits[t * e..(t + 1) * e];
        for x in 0..e {
            row[x] += p[x] * (base(x) - dot);
        }
        for (j, &x) in chosen.iter().enumerate() {
            row[x as usize] += p[x as usize] * extra(j);
        }
    }
}

/// dst (N·k, C), in expert order: row s is token `perm[s] / k`'s row of `src` (N, C).
pub fn gather<T: Copy>(dst: &mut [T], src: &[T], route: &[u32], n: usize, k: usize, c: usize) {
    let (_, perm, ..) = parts(route, n, k);
    assert!(dst.len() == n * k * c && src.len() == n * c);
    for (row, &slot) in dst.chunks_exact_mut(c).zip(perm) {
        let t = slot as usize / k;
        row.copy_from_slice(&src[t * c..(t + 1) * c]);
    }
}

/// out (N, C) += Σ over each token's choices j of `weight[t·k + j]` × its expert-order row of `y`
/// (N·k, C); with no weights, the plain sum (the gradient of [`gather`]).
pub fn combine<F: Real>(
    out: &mut [F],
    y: &[F],
    weights: Option<&[F]>,
    route: &[u32],
    n: usize,
    k: usize,
    c: usize,
) {
    let (_, _, inv, _) = parts(route, n, k);
    assert!(out.len() == n * c && y.len() == n * k * c);
    for (t, row) in out.chunks_exact_mut(c).enumerate() {
        for j in 0..k {
            let s = inv[t * k + j] as usize;
            let w = weights.map_or(F::one(), |w| w[t * k + j]);
            for (o, &v) in row.iter_mut().zip(&y[s * c..(s + 1) * c]) {
                *o += w * v;
            }
        }
    }
}

/// Each expert-order row of `x` (N·k, W) times its choice's gate.
pub fn scale_rows<F: Real>(x: &mut [F], gates: &[F], route: &[u32], n: usize, k: usize, w: usize) {
    let (_, perm, ..) = parts(route, n, k);
    for (row, &slot) in x.chunks_exact_mut(w).zip(perm) {
        let g = gates[slot as usize];
        row.iter_mut().for_each(|v| *v *= g);
    }
}

/// dgates[t·k + j] += the dot product of the expert-order rows of `a` and `b` (N·k, W) of that
/// choice (the gradient of a gate: its expert's output against the output's gradient); `b`'s
/// elements are read through `to` (a bf16 `b` widened on the fly).
#[allow(clippy::too_many_arguments)]
pub fn gate_grads<F: Real, T: Copy>(
    dgates: &mut [F],
    a: &[F],
    b: &[T],
    to: impl Fn(T) -> F,
    route: &[u32],
    n: usize,
    k: usize,
    w: usize,
) {
    let (_, perm, ..) = parts(route, n, k);
    for ((ra, rb), &slot) in a.chunks_exact(w).zip(b.chunks_exact(w)).zip(perm) {
        let dot = ra
            .iter()
            .zip(rb)
            .fold(F::zero(), |acc, (&x, &y)| acc + x * to(y));
        dgates[slot as usize] += dot;
    }
}

/// Expert `x`'s rows in the sorted layout.
pub fn expert_rows(route: &[u32], n: usize, k: usize, x: usize) -> std::ops::Range<usize> {
    let (.., offsets) = parts(route, n, k);
    offsets[x] as usize..offsets[x + 1] as usize
}

/// The load-balancing loss (Switch Transformer, as HF's `load_balancing_loss_func`) from the
/// statistics [`route`] accumulated over `rows` router rows (tokens × MoE layers):
/// E · Σₑ (countₑ / rows) · (probsumₑ / rows). Returns it and the gradient of every router
/// probability, E · countₑ / rows², the same for every row (the counts do not depend on the
/// probabilities' values).
pub fn balance_loss(aux: &[f32], e: usize, rows: f64, dprob: &mut [f32]) -> f64 {
    let (counts, psum) = aux.split_at(e);
    let ef = e as f64;
    let mut loss = 0.0;
    for x in 0..e {
        loss += f64::from(counts[x]) / rows * (f64::from(psum[x]) / rows);
        dprob[x] = (ef * f64::from(counts[x]) / (rows * rows)) as f32;
    }
    loss * ef
}

#[cfg(test)]
mod tests;
