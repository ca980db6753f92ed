//! Choosing the next token from a row of logits: greedy (argmax), or sampling from the softmax at
//! a temperature restricted to the `top_k` most likely tokens and then to the nucleus (`top_p`:
//! the fewest most likely tokens whose probability reaches p), with a seeded SplitMix64. The
//! distribution itself ([`distribution`]) is what speculative decoding's rejection sampling
//! compares between the draft and the target.
//!
//! Example: `let t = sample::pick(&row, &Sampling::greedy(), &mut rng);`

use data::SplitMix64;

/// How to pick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// `None`: greedy.
    pub top_k: Option<usize>,
    pub temperature: f32,
    /// Nucleus sampling: keep the fewest most likely tokens whose probability sums to at least
    /// this (1: all of them).
    pub top_p: f32,
    /// Only ids below this are picked (a tokenizer smaller than the padded vocabulary).
    pub vocab_limit: Option<usize>,
}

impl Sampling {
    pub fn greedy() -> Sampling {
        Sampling {
            top_k: None,
            temperature: 1.0,
            top_p: 1.0,
            vocab_limit: None,
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.top_k.is_none()
    }
}

/// The largest logit's id (the first on ties) among the first `limit`.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// A row's largest logit `m` and ln Σ exp(x − m) (summed in f64): its log-sum-exp is their sum,
/// and `x − m − ln Σ` the log-probability of a logit `x` (what perplexity, log-probabilities and
/// the quality bench read).
pub fn log_sum_exp(row: &[f32]) -> (f32, f64) {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: f64 = row.iter().map(|&x| f64::from(x - m).exp()).sum();
    (m, s.ln())
}

/// The sampling distribution over the whole vocabulary (zero outside the top k and the nucleus),
/// in f64.
pub fn distribution(logits: &[f32], s: &Sampling) -> Vec<f64> {
    let limit = s.vocab_limit.unwrap_or(logits.len()).clamp(1, logits.len());
    let row = &logits[..limit];
    let mut p = vec![0.0f64; logits.len()];
    let k = s.top_k.unwrap_or(limit).clamp(1, limit);
    let mut idx: Vec<usize> = (0..limit).collect();
    if k < limit {
        idx.select_nth_unstable_by(k - 1, |&a, &b| row[b].total_cmp(&row[a]));
        idx.truncate(k);
    }
    let temp = f64::from(s.temperature.max(1e-6));
    let top = idx
        .iter()
        .map(|&i| row[i])
        .fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0.0;
    for &i in &idx {
        let w = (f64::from(row[i] - top) / temp).exp();
        p[i] = w;
        total += w;
    }
    p.iter_mut().for_each(|x| *x /= total);
    if s.top_p < 1.0 {
        nucleus(&mut p, &mut idx, f64::from(s.top_p));
    }
    p
}

/// Keeps the fewest most likely of `idx` whose probability reaches `top_p` (at least one; ties
/// in id order), renormalised.
fn nucleus(p: &mut [f64], idx: &mut [usize], top_p: f64) {
    idx.sort_unstable_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let mut sum = 0.0;
    let mut keep = idx.len();
    for (n, &i) in idx.iter().enumerate() {
        sum += p[i];
        if sum >= top_p {
            keep = n + 1;
            break;
        }
    }
    for &i in &idx[keep..] {
        p[i] = 0.0;
    }
    p.iter_mut().for_each(|x| *x /= sum);
}

/// A draw from `p` (sums to 1).
pub fn draw(p: &[f64], rng: &mut SplitMix64) -> u32 {
    let mut r = uniform(rng);
    let mut last = 0;
    for (i, &w) in p.iter().enumerate() {
        if w > 0.0 {
            last = i;
            if r < w {
                return i as u32;
            }
            r -= w;
        }
    }
    last as u32
}

/// Uniform in [0, 1).
pub fn uniform(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// The next token from `logits` under `s`.
pub fn pick(logits: &[f32], s: &Sampling, rng: &mut SplitMix64) -> u32 {
    if s.is_greedy() {
        let limit = s.vocab_limit.unwrap_or(logits.len()).clamp(1, logits.len());
        return argmax(&logits[..limit]);
    }
    draw(&distribution(logits, s), rng)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nucleus_keeps_the_fewest_likeliest_tokens_reaching_top_p() {
        // Probabilities 0.5, 0.3, 0.15, 0.05 (temperature 1).
        let logits: Vec<f32> = [0.5f64, 0.3, 0.15, 0.05]
            .iter()
            .map(|p| p.ln() as f32)
            .collect();
        let at = |top_p: f32| {
            let s = Sampling {
                top_k: Some(4),
                top_p,
                ..Sampling::greedy()
            };
            distribution(&logits, &s)
        };
        let all = at(1.0);
        assert!((all[0] - 0.5).abs() < 1e-6 && (all[3] - 0.05).abs() < 1e-6);
        // 0.5 + 0.3 reaches 0.75: the two, renormalised.
        let two = at(0.75);
        assert!(
            (two[0] - 0.625).abs() < 1e-6 && (two[1] - 0.375).abs() < 1e-6,
            "{two:?}"
        );
        assert_eq!((two[2], two[3]), (0.0, 0.0));
        // Below the likeliest token's own probability: that token alone.
        assert_eq!(at(0.1), vec![1.0, 0.0, 0.0, 0.0]);
        let mut rng = SplitMix64::new(3);
        let s = Sampling {
            top_k: Some(4),
            top_p: 0.75,
            ..Sampling::greedy()
        };
        assert!((0..200).all(|_| pick(&logits, &s, &mut rng) < 2));
    }
}
