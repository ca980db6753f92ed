//! Token log-probabilities for the OpenAI API's `logprobs`: each generated token's
//! log-probability under the model (the log-softmax of its logits over the tokenizer's
//! vocabulary, before temperature, top-k and top-p, as vLLM reports by default) and the `top`
//! likeliest tokens with theirs, laid out as the completions API lays them out (`tokens`,
//! `token_logprobs`, `top_logprobs`, `text_offset`) or the chat API (`content`: `token`,
//! `logprob`, `bytes`, `top_logprobs`).
//!
//! A token that holds part of a character (a byte-level piece) shows it as U+FFFD in `token` and
//! `bytes`, as `decode` gives it; the token that completes a stop string keeps its whole text.
//!
//! Example: `logprobs::of(&row, vocab, chosen, 2, 0)` is the chosen token's and the two likeliest.

use serde_json::{json, Map, Value};

/// The most alternatives a request may ask for (OpenAI's limit).
pub const MAX_TOP: usize = 20;

/// What a log-probability of minus infinity (or NaN) is reported as: JSON has no infinity.
const FLOOR: f32 = -9999.0;

/// One generated token's log-probability and the likeliest tokens' at its step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// Where its text starts in the answer, in characters.
    pub offset: usize,
    /// The `top` likeliest ids and their log-probabilities, likeliest first (ids in order on
    /// ties).
    pub top: Vec<(u32, f32)>,
}

/// The log-probability of `id` among the first `limit` of `logits`, and the `top` likeliest;
/// `offset` is where its text starts in the answer.
pub fn of(logits: &[f32], limit: usize, id: u32, top: usize, offset: usize) -> TokenLogprob {
    let row = &logits[..limit.clamp(1, logits.len())];
    let (max, ln_sum) = infer::sample::log_sum_exp(row);
    let lse = f64::from(max) + ln_sum;
    let lp = |i: usize| match (f64::from(row[i]) - lse) as f32 {
        x if x.is_finite() => x,
        _ => FLOOR,
    };
    let top = top.min(row.len());
    let mut ids: Vec<usize> = match top {
        0 => Vec::new(),
        _ => (0..row.len()).collect(),
    };
    let order = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
    if top > 0 && top < ids.len() {
        ids.select_nth_unstable_by(top - 1, order);
    }
    ids.truncate(top);
    ids.sort_unstable_by(order);
    TokenLogprob {
        id,
        logprob: lp((id as usize).min(row.len() - 1)),
        offset,
        top: ids.into_iter().map(|i| (i as u32, lp(i))).collect(),
    }
}

fn text(tok: &data::Tokenizer, id: u32) -> String {
    tok.decode(&[id]).unwrap_or_default()
}

/// The completions API's `logprobs` object for `tokens`: each step's top entries include the
/// chosen token (up to `logprobs + 1`, as OpenAI's), offsets in characters from the answer's
/// start.
pub fn completion(tok: &data::Tokenizer, tokens: &[TokenLogprob]) -> Value {
    let (mut texts, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for t in tokens {
        let piece = text(tok, t.id);
        offsets.push(t.offset);
        let mut top = Map::new();
        for &(id, lp) in &t.top {
            top.entry(text(tok, id)).or_insert(json!(lp));
        }
        top.entry(piece.clone()).or_insert(json!(t.logprob));
        texts.push(piece);
        lps.push(t.logprob);
        tops.push(Value::Object(top));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// The chat API's `logprobs` object for `tokens`.
pub fn chat(tok: &data::Tokenizer, tokens: &[TokenLogprob]) -> Value {
    let entry = |id: u32, lp: f32| {
        let piece = text(tok, id);
        json!({"token": piece, "logprob": lp, "bytes": piece.as_bytes()})
    };
    let content: Vec<Value> = (tokens.iter())
        .map(|t| {
            let mut e = entry(t.id, t.logprob);
            let top: Vec<Value> = t.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
            e["top_logprobs"] = json!(top);
            e
        })
        .collect();
    json!({"content": content})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probabilities_sum_to_one_and_the_top_are_the_likeliest() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let t = of(&logits, 4, 2, 3, 0);
        let total: f64 = (0..4)
            .map(|i| f64::from(of(&logits, 4, i, 0, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        // Ties in id order; the id past the limit (4) is not a candidate.
        assert_eq!(t.top.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        assert!((t.logprob - t.top[2].1).abs() < 1e-7);
        let z = (1f64.exp() + 2.0 * 3f64.exp() + 2f64.exp()).ln();
        assert!((f64::from(t.logprob) - (2.0 - z)).abs() < 1e-6);
        // A masked logit: a finite floor, not an infinity JSON cannot hold.
        let masked = [0.0f32, f32::NEG_INFINITY];
        assert_eq!(of(&masked, 2, 1, 0, 0).logprob, FLOOR);
    }
}
