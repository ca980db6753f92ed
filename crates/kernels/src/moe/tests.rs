//! MoE routing against naive per-token loops and f64 finite differences.

use super::*;
use crate::testutil::{Rng, FD_STEP, FD_TOL_F64};

fn routed(
    logits: &[f64],
    n: usize,
    e: usize,
    k: usize,
    g: Gating,
) -> (Vec<f64>, Vec<f64>, Vec<u32>) {
    let mut probs = logits.to_vec();
    let mut gates = vec![0.0; n * k];
    let mut r = vec![0u32; route_len(n, k, e)];
    let routing = Routing {
        gating: g,
        groups: None,
    };
    route(&mut probs, &mut gates, &mut r, n, e, k, routing, None);
    (probs, gates, r)
}

#[test]
fn the_sorted_layout_holds_every_choice_once_in_expert_then_token_order() {
    let (n, e, k) = (9, 4, 2);
    let mut rng = Rng::new(1);
    let (_, _, r) = routed(&rng.vec(n * e), n, e, k, Gating::Renormalise);
    let (idx, perm, inv, offsets) = parts(&r, n, k);
    assert_eq!(offsets[e] as usize, n * k);
    for s in 0..n * k {
        assert_eq!(inv[perm[s] as usize] as usize, s);
    }
    for x in 0..e {
        let rows = expert_rows(&r, n, k, x);
        assert!(rows.len() <= n, "an expert holds each token at most once");
        let tokens: Vec<u32> = rows.map(|s| perm[s] / k as u32).collect();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]));
        for &t in &tokens {
            assert!(idx[t as usize * k..(t as usize + 1) * k].contains(&(x as u32)));
        }
    }
}

#[test]
fn top_k_picks_the_largest_probabilities_best_first() {
    let logits = [0.1, 2.0, -1.0, 1.0];
    let (probs, gates, r) = routed(&logits, 1, 4, 2, Gating::Renormalise);
    assert_eq!(&r[..2], &[1, 3]);
    let s = probs[1] + probs[3];
    assert!((gates[0] - probs[1] / s).abs() < 1e-15 && (gates[1] - probs[3] / s).abs() < 1e-15);
    let (_, scaled, _) = routed(&logits, 1, 4, 2, Gating::Scaled(2.5));
    assert!((scaled[0] - 2.5 * probs[1]).abs() < 1e-15);
}

#[test]
fn route_backward_matches_finite_differences_under_both_gatings() {
    let (n, e, k) = (5, 6, 3);
    for gating in [Gating::Renormalise, Gating::Scaled(1.7)] {
        let mut rng = Rng::new(7);
        let logits = rng.vec(n * e);
        let r_g = rng.vec(n * k);
        let c = rng.vec(e);
        // L = Σ r_g·gates + Σ_t Σ_e c_e·p_te: the gates' gradient is r_g, the probabilities' c.
        let loss = |l: &[f64]| {
            let (p, g, _) = routed(l, n, e, k, gating);
            let a: f64 = g.iter().zip(&r_g).map(|(x, y)| x * y).sum();
            let b: f64 = p
                .chunks(e)
                .map(|row| row.iter().zip(&c).map(|(x, y)| x * y).sum::<f64>())
                .sum();
            a + b
        };
        let (probs, _, r) = routed(&logits, n, e, k, gating);
        let mut dl = vec![0.0; n * e];
        route_backward(&mut dl, &r_g, &probs, &r, (n, e, k), gating, Some(&c));
        for i in 0..n * e {
            let (mut up, mut down) = (logits.clone(), logits.clone());
            up[i] += FD_STEP;
            down[i] -= FD_STEP;
            let fd = (loss(&up) - loss(&down)) / (2.0 * FD_STEP);
            assert!(
                (fd - dl[i]).abs() < FD_TOL_F64,
                "{gating:?} logit {i}: fd {fd} vs {}",
                dl[i]
            );
        }
    }
}

#[test]
fn gather_combine_scale_and_gate_grads_equal_per_token_loops() {
    let (n, e, k, c) = (7, 4, 2, 3);
    let mut rng = Rng::new(3);
    let (_, gates, r) = routed(&rng.vec(n * e), n, e, k, Gating::Renormalise);
    let (idx, _, inv, _) = parts(&r, n, k);
    let x = rng.vec(n * c);
    let mut xs = vec![0.0; n * k * c];
    gather(&mut xs, &x, &r, n, k, c);
    // An "expert" that doubles its rows plus the expert id, so the combine sees who ran it.
    let y: Vec<f64> = (0..n * k)
        .flat_map(|s| {
            let x = &xs[s * c..(s + 1) * c];
            let id = (0..n * k)
                .find(|&q| inv[q] as usize == s)
                .map(|q| idx[q])
                .unwrap();
            x.iter()
                .map(move |v| 2.0 * v + f64::from(id))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut out = vec![0.0; n * c];
    combine(&mut out, &y, Some(&gates), &r, n, k, c);
    for t in 0..n {
        for ch in 0..c {
            let want: f64 = (0..k)
                .map(|j| gates[t * k + j] * (2.0 * x[t * c + ch] + f64::from(idx[t * k + j])))
                .sum();
            assert!((out[t * c + ch] - want).abs() < 1e-12);
        }
    }
    let dout = rng.vec(n * c);
    let mut dg = vec![0.0; n * k * c];
    gather(&mut dg, &dout, &r, n, k, c);
    let mut dgates = vec![0.0; n * k];
    gate_grads(&mut dgates, &dg, &y, |v| v, &r, n, k, c);
    for t in 0..n {
        for j in 0..k {
            let s = inv[t * k + j] as usize;
            let want: f64 = (0..c).map(|ch| dout[t * c + ch] * y[s * c + ch]).sum();
            assert!((dgates[t * k + j] - want).abs() < 1e-12);
        }
    }
    scale_rows(&mut dg, &gates, &r, n, k, c);
    let mut back = vec![0.0; n * c];
    combine(&mut back, &dg, None, &r, n, k, c);
    for t in 0..n {
        let g: f64 = gates[t * k..(t + 1) * k].iter().sum();
        for ch in 0..c {
            assert!((back[t * c + ch] - g * dout[t * c + ch]).abs() < 1e-12);
        }
    }
}

#[test]
fn the_balance_loss_is_hf_formula_and_one_for_a_uniform_router() {
    // Uniform probabilities and perfectly balanced top-1 counts give E · Σ (1/E)(1/E) = 1.
    let e = 4;
    let rows = 8.0;
    let aux = [2.0f32, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0];
    let mut dprob = [0.0f32; 4];
    let loss = balance_loss(&aux, e, rows, &mut dprob);
    assert!((loss - 1.0).abs() < 1e-12);
    assert!((f64::from(dprob[0]) - 4.0 * 2.0 / 64.0).abs() < 1e-7);
}

#[test]
fn group_limited_routing_picks_only_inside_the_best_groups() {
    // 2 groups of 3: group 1 holds the single best expert (5); group 0 the next three. With one
    // group kept, both choices come from group 1 even though experts 0-2 beat expert 3.
    let logits = [2.0f64, 1.9, 1.8, 0.0, -1.0, 3.0];
    let mut probs = logits.to_vec();
    let (mut gates, mut r) = (vec![0.0; 2], vec![0u32; route_len(1, 2, 6)]);
    let routing = Routing {
        gating: Gating::Scaled(1.0),
        groups: Some((2, 1)),
    };
    route(&mut probs, &mut gates, &mut r, 1, 6, 2, routing, None);
    assert_eq!(&r[..2], &[5, 3]);
    assert!((gates[0] - probs[5]).abs() < 1e-15);
}
