//! Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a small draft model proposes
//! K tokens one by one, the target scores all of them in one step (K + 1 rows of logits), and
//! the longest acceptable prefix is kept plus one token from the target, so every step of the
//! target yields 1 to K + 1 tokens.
//!
//! Acceptance: greedy keeps a draft token while it equals the target's argmax (so the output is
//! token-identical to greedy decoding with the target alone); sampling accepts x with probability
//! min(1, p(x)/q(x)) and on rejection draws from max(0, p − q) normalised, which makes the output
//! distributed exactly as sampling from the target (both distributions are the same top-k and
//! temperature transform of each model's logits). Rejected tokens are dropped from both caches
//! (`Worker::truncate`). The caches hold every committed token but the last, which each round
//! feeds first.
//!
//! Example: `let (tokens, stats) = spec::generate(&mut target, &mut draft, &prompt, 64, 4,
//! &Sampling::greedy(), 1)?;`

use super::blocks::SeqId;
use super::sample::{argmax, distribution, draw, uniform, Sampling};
use super::{SplitK, Worker};
use data::SplitMix64;
use engine::backend::InferOps;
use engine::error::EngineError;

/// What a speculative run did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// Draft tokens proposed and accepted.
    pub drafted: u64,
    pub accepted: u64,
    /// Target verification steps.
    pub target_steps: u64,
    /// Seconds spent reading the prompt (target and draft), before the first proposal.
    pub prefill_s: f64,
}

impl SpecStats {
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// Refuses a draft that cannot propose for `target` (another vocabulary).
pub fn check_pair<B: InferOps>(target: &Worker<B>, draft: &Worker<B>) -> Result<(), EngineError> {
    let (t, d) = (&target.config.shape, &draft.config.shape);
    if t.vocab != d.vocab {
        return Err(EngineError::Infer(format!(
            "the draft model's vocabulary has {} tokens and the target's {}: a draft must share \
             the target's tokenizer",
            d.vocab, t.vocab
        )));
    }
    Ok(())
}

/// Continues `prompt` by `n_new` tokens with `draft` proposing `k` at a time.
pub fn generate<B: InferOps>(
    target: &mut Worker<B>,
    draft: &mut Worker<B>,
    prompt: &[u32],
    n_new: usize,
    k: usize,
    sampling: &Sampling,
    seed: u64,
) -> Result<(Vec<u32>, SpecStats), EngineError> {
    check_pair(target, draft)?;
    if prompt.is_empty() {
        return Err(EngineError::Infer(
            "generation needs a prompt of at least one token".into(),
        ));
    }
    let k = k.clamp(
        1,
        target.setup.prefill_logit_rows.saturating_sub(1).max(1) as usize,
    );
    // Verification rows must run the decode kernels' order: head-parallel attention.
    let saved = (target.split_k, draft.split_k);
    target.split_k = SplitK::Off;
    draft.split_k = SplitK::Off;
    let (ts, ds) = (target.new_sequence(), draft.new_sequence());
    let result = run(target, draft, (ts, ds), prompt, n_new, k, sampling, seed);
    target.free(ts);
    draft.free(ds);
    (target.split_k, draft.split_k) = saved;
    result
}

#[allow(clippy::too_many_arguments)]
fn run<B: InferOps>(
    target: &mut Worker<B>,
    draft: &mut Worker<B>,
    (ts, ds): (SeqId, SeqId),
    prompt: &[u32],
    n_new: usize,
    k: usize,
    sampling: &Sampling,
    seed: u64,
) -> Result<(Vec<u32>, SpecStats), EngineError> {
    let mut rng = SplitMix64::new(seed);
    let mut stats = SpecStats::default();
    let mut logits = Vec::new();
    let v = target.vocab();
    let t0 = std::time::Instant::now();
    if n_new == 0 {
        // Nothing to propose: the prompt is read, as a run without a draft reads it.
        target.prefill(ts, prompt, &mut logits)?;
        draft.prefill(ds, prompt, &mut logits)?;
        stats.prefill_s = t0.elapsed().as_secs_f64();
        return Ok((Vec::new(), stats));
    }
    let (body, tail) = prompt.split_at(prompt.len() - 1);
    let mut last = tail[0];
    if !body.is_empty() {
        target.prefill(ts, body, &mut logits)?;
        draft.prefill(ds, body, &mut logits)?;
        // (A one-token prompt has no prefill: its token is the first verification step's.)
        stats.prefill_s = t0.elapsed().as_secs_f64();
    }
    let context = target.setup.context.min(draft.setup.context) as usize;
    let mut out = Vec::with_capacity(n_new + k + 1);
    while out.len() < n_new {
        let base = target.seq_len(ts);
        let k = k
            .min(context.saturating_sub(base + 1))
            .min(n_new - out.len());
        if k == 0 {
            return Err(EngineError::Infer(format!(
                "the context of {context} tokens is full after {} new tokens",
                out.len()
            )));
        }
        // The draft proposes k tokens.
        let mut proposal = Vec::with_capacity(k);
        let mut q = Vec::with_capacity(k);
        let mut feed = last;
        for _ in 0..k {
            draft.decode(&[ds], &[feed], &mut logits)?;
            let x = if sampling.is_greedy() {
                argmax(&logits[..limit(sampling, v)])
            } else {
                let dist = distribution(&logits, sampling);
                let x = draw(&dist, &mut rng);
                q.push(dist);
                x
            };
            proposal.push(x);
            feed = x;
        }
        // The target scores last + proposal: k + 1 rows.
        let mut rows = vec![last];
        rows.extend_from_slice(&proposal);
        target.prefill_rows(ts, &rows, k + 1, &mut logits)?;
        stats.target_steps += 1;
        stats.drafted += k as u64;
        let mut accepted = 0;
        let mut next = None;
        for i in 0..k {
            let row = &logits[i * v..(i + 1) * v];
            if sampling.is_greedy() {
                let y = argmax(&row[..limit(sampling, v)]);
                if y == proposal[i] {
                    accepted += 1;
                    continue;
                }
                next = Some(y);
                break;
            }
            let p = distribution(row, sampling);
            let x = proposal[i] as usize;
            if uniform(&mut rng) * q[i][x] < p[x] {
                accepted += 1;
                continue;
            }
            let mut resid: Vec<f64> = p.iter().zip(&q[i]).map(|(a, b)| (a - b).max(0.0)).collect();
            let total: f64 = resid.iter().sum();
            resid.iter_mut().for_each(|r| *r /= total);
            next = Some(draw(&resid, &mut rng));
            break;
        }
        let next = next.unwrap_or_else(|| {
            let row = &logits[k * v..(k + 1) * v];
            if sampling.is_greedy() {
                argmax(&row[..limit(sampling, v)])
            } else {
                draw(&distribution(row, sampling), &mut rng)
            }
        });
        stats.accepted += accepted as u64;
        // Keep last + the accepted tokens in both caches.
        target.truncate(ts, base + 1 + accepted);
        let fed = draft.seq_len(ds);
        if fed > base + 1 + accepted {
            draft.truncate(ds, base + 1 + accepted);
        } else if fed < base + 1 + accepted {
            // Every proposal was accepted: the draft never fed its last one.
            draft.prefill(ds, &proposal[k - 1..], &mut logits)?;
        }
        out.extend_from_slice(&proposal[..accepted]);
        out.push(next);
        last = next;
    }
    out.truncate(n_new);
    Ok((out, stats))
}

fn limit(s: &Sampling, v: usize) -> usize {
    s.vocab_limit.unwrap_or(v).clamp(1, v)
}

/// Plain decoding with `worker` alone: the reference speculative decoding must match.
pub fn generate_plain<B: InferOps>(
    worker: &mut Worker<B>,
    prompt: &[u32],
    n_new: usize,
    sampling: &Sampling,
    seed: u64,
) -> Result<Vec<u32>, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::Infer(
            "generation needs a prompt of at least one token".into(),
        ));
    }
    let mut rng = SplitMix64::new(seed);
    let seq = worker.new_sequence();
    let mut logits = Vec::new();
    let result = (|| {
        worker.prefill(seq, prompt, &mut logits)?;
        let mut out = Vec::with_capacity(n_new);
        for i in 0..n_new {
            let t = super::sample::pick(&logits, sampling, &mut rng);
            out.push(t);
            if i + 1 < n_new {
                worker.decode(&[seq], &[t], &mut logits)?;
            }
        }
        Ok(out)
    })();
    worker.free(seq);
    result
}
