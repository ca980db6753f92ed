//! Forward-only passes: validation loss, full logits (for tests and the HF comparison) and text
//! generation, greedy or sampled ([`crate::sample`]: top-k, top-p) with a seed, on any model that can run its phases ([`Forward`]:
//! a `Trainer`, whose ZeRO-3 units are gathered as phases begin, or a `Runner`, a model with no
//! training state).
//!
//! A pass covers at most the planned micro-batch, entering the same phases, and ends with
//! `Arena::end_pass`, which frees what the backward would have. Logits are computed a chunk of
//! rows at a time in the classifier's scratch, so no B×T×V tensor exists in the arena; each chunk
//! is copied to the host for the caller (`logits` returns them in a Vec because its callers,
//! tests and dev scripts, want them).
//!
//! Example: `trainer.generate(&prompt, 100, Sampling { top_k: Some(40), temperature: 1.0,
//! top_p: 1.0, seed: 7, vocab_limit: None })`.

use crate::arena::Arena;
use crate::backend::{Backend, ClassifierLogits, DType, Linear, LinearKind, LinearShape};
use crate::error::EngineError;
use crate::forward;
use crate::model::Model;
use data::SplitMix64;
use plan::buffer::Phase;

/// How to pick the next token: [`crate::sample::Sampling`] and the seed of its draws.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// `None`: greedy (argmax); `Some(k)`: sample among the k most likely.
    pub top_k: Option<usize>,
    pub temperature: f32,
    /// Nucleus sampling: the fewest most likely tokens whose probability reaches this (1: all).
    pub top_p: f32,
    pub seed: u64,
    /// Only ids below this are picked (the tokenizer's vocabulary, when the model's is padded).
    pub vocab_limit: Option<usize>,
}

impl Sampling {
    /// The sampler's settings, without the seed.
    pub fn picker(&self) -> crate::sample::Sampling {
        crate::sample::Sampling {
            top_k: self.top_k,
            temperature: self.temperature,
            top_p: self.top_p,
            vocab_limit: self.vocab_limit,
        }
    }
}

/// A model that runs forward-only passes: its parts, and what happens at each phase boundary.
pub trait Forward<B: Backend> {
    fn parts(&self) -> (&Model, &Arena<B>);
    /// Makes the phase's buffers live (and gathers what the phase reads).
    fn enter(&mut self, phase: Phase) -> Result<(), EngineError>;
    /// Frees what dies in the phase.
    fn leave(&mut self, phase: Phase) -> Result<(), EngineError>;
    /// Frees every non-persistent buffer.
    fn end_pass(&mut self);
}

/// Runs the forward pass over `batch` rows of `seq` tokens already in `batch.tokens`, then
/// calls `per_chunk(first_row, logits of a chunk of rows)` for the final positions.
pub fn forward_chunks<B: Backend>(
    f: &mut dyn Forward<B>,
    batch: usize,
    seq: usize,
    per_chunk: &mut dyn FnMut(usize, &[f32]),
) -> Result<(), EngineError> {
    let n_layers = f.parts().0.config.shape.n_layers;
    let n = batch * seq;
    // Sequence parallelism splits the pass's rows over the group: one sequence is padded to a
    // multiple of the ranks (causal attention keeps the padding out of the real positions).
    let seq = match (&f.parts().0.sp, &f.parts().0.tp) {
        (Some(_), Some(tp)) if n % tp.size as usize != 0 => {
            if batch != 1 {
                return Err(EngineError::Data(format!(
                    "a pass of {batch} x {seq} rows does not split over {} sequence-parallel \
                     ranks",
                    tp.size
                )));
            }
            seq.next_multiple_of(tp.size as usize)
        }
        _ => seq,
    };
    f.enter(Phase::Embed)?;
    let (model, arena) = f.parts();
    // A pipeline stage receives its input from the previous stage and sends its output on;
    // only the last computes logits.
    let boundary = crate::sp::rows(model, batch * seq).1 * model.config.shape.d_model as usize;
    match &model.pp {
        Some(pp) if !pp.stage.is_first() => {
            let encoded = model.head.encoded.prefix(boundary);
            pp.exchange(arena, crate::pp::Side::Prev, encoded)?;
            pp.take(arena, crate::pp::Side::Prev, encoded);
        }
        _ => forward::embed(model, arena, batch, seq),
    }
    f.leave(Phase::Embed)?;
    for l in 0..n_layers {
        f.enter(Phase::Forward(l))?;
        let (model, arena) = f.parts();
        forward::block(model, arena, l as usize, batch, seq);
        f.leave(Phase::Forward(l))?;
    }
    let (model, arena) = f.parts();
    if let Some(pp) = model.pp.as_ref().filter(|p| !p.stage.is_last()) {
        let out = model.forward_blocks[model.forward_blocks.len() - 1].out;
        pp.exchange(arena, crate::pp::Side::Next, out.prefix(boundary))?;
        f.end_pass();
        return Ok(());
    }
    f.enter(Phase::Head)?;
    let (model, arena) = f.parts();
    forward::final_norm(model, arena, batch, seq);
    let s = &model.config.shape;
    let (c, v) = (s.d_model as usize, s.vocab as usize);
    let weight = model.lm_weight(arena);
    let scratch = model.head.classifier;
    let chunk_rows = match model.policy.bf16_units {
        // The bf16 head's scratch also holds the rounded rows (`classifier_row_bytes`).
        true => {
            let bytes = 2 * arena.tensor(scratch.buf, DType::Bf16).len as u64;
            (bytes / plan_frugal::classifier_row_bytes(s, model.policy)) as usize
        }
        false => scratch.len / v,
    };
    let mut host = vec![0.0f32; chunk_rows.min(n) * v];
    let mut whole = WholeLogits::new(model, chunk_rows.min(n));
    let be = arena.backend();
    let mut row = 0;
    while row < n {
        let rows = chunk_rows.min(n - row);
        let out = scratch.prefix(rows * v);
        let lnf = model.head.lnf.slice(row * c..(row + rows) * c);
        match model.policy.bf16_units {
            true => {
                let op = ClassifierLogits {
                    lnf,
                    weight,
                    scratch,
                    rows,
                    c,
                    v,
                };
                be.classifier_logits(arena, &op);
            }
            false => {
                let op = Linear {
                    kind: LinearKind::Dense,
                    out,
                    inp: lnf,
                    weight,
                    bias: None,
                    shape: LinearShape {
                        n: rows,
                        ic: c,
                        oc: v,
                    },
                };
                be.linear(arena, &op);
            }
        }
        be.download(arena, out, &mut host[..rows * v]);
        match whole.as_mut() {
            Some(w) => per_chunk(row, w.gather(model, &host[..rows * v], rows)?),
            None => per_chunk(row, &host[..rows * v]),
        }
        row += rows;
    }
    f.end_pass();
    Ok(())
}

/// Tensor parallelism: host buffers that put every rank's vocabulary slice of a chunk of logits
/// together into whole rows (outside the plan, as the host copy of the chunk is).
struct WholeLogits {
    /// This rank's slice padded to the widest, every rank's, and the whole rows.
    padded: Vec<f32>,
    all: Vec<f32>,
    rows: Vec<f32>,
    /// Each rank's `(first id, ids)`.
    slices: Vec<(usize, usize)>,
}

impl WholeLogits {
    fn new(model: &Model, max_rows: usize) -> Option<WholeLogits> {
        let tp = model.tp.as_ref()?;
        let vocab = model.vocab();
        let slices: Vec<(usize, usize)> = (0..tp.size)
            .map(|r| plan_frugal::tp::vocab_range(vocab, tp.size, r))
            .map(|(f, n)| (f as usize, n as usize))
            .collect();
        let width = slices[0].1 * max_rows;
        Some(WholeLogits {
            padded: vec![0.0; width],
            all: vec![0.0; width * slices.len()],
            rows: vec![0.0; max_rows * vocab as usize],
            slices,
        })
    }

    /// The whole rows of a chunk of `rows` rows whose slice on this rank is `mine`.
    fn gather(&mut self, model: &Model, mine: &[f32], rows: usize) -> Result<&[f32], EngineError> {
        let tp = model.tp.as_ref().expect("a tensor-parallel model");
        let width = self.padded.len();
        self.padded[..mine.len()].copy_from_slice(mine);
        tp.gather_host(&self.padded, &mut self.all);
        tp.check()?;
        let v: usize = self.slices.iter().map(|s| s.1).sum();
        for (r, &(first, ids)) in self.slices.iter().enumerate() {
            let theirs = &self.all[r * width..];
            for i in 0..rows {
                let dst = &mut self.rows[i * v + first..][..ids];
                dst.copy_from_slice(&theirs[i * ids..][..ids]);
            }
        }
        Ok(&self.rows[..rows * v])
    }
}

fn load_tokens<B: Backend>(f: &dyn Forward<B>, inputs: &[u32]) -> Result<(), EngineError> {
    let (model, arena) = f.parts();
    let vocab = model.vocab();
    if let Some(&id) = inputs.iter().find(|&&id| u64::from(id) >= vocab) {
        return Err(EngineError::Data(format!(
            "token id {id} is beyond the model's vocabulary of {vocab}"
        )));
    }
    // A pipeline stage holds the ids only where it embeds them.
    if model.runs_embedding() {
        let tokens = model.head.tokens.prefix(inputs.len());
        arena.backend().upload_ids(arena, tokens, inputs);
    }
    Ok(())
}

/// Mean cross-entropy of `batch` rows of `seq` tokens, without touching gradients.
pub fn eval_loss<B: Backend>(
    f: &mut dyn Forward<B>,
    inputs: &[u32],
    targets: &[u32],
    (batch, seq): (usize, usize),
) -> Result<f32, EngineError> {
    assert!(inputs.len() == batch * seq && targets.len() == batch * seq);
    load_tokens(f, inputs)?;
    let v = f.parts().0.vocab() as usize;
    let mut sum = 0.0f64;
    forward_chunks(f, batch, seq, &mut |first, logits| {
        for (i, row) in logits.chunks_exact(v).enumerate() {
            sum += f64::from(cross_entropy(row, targets[first + i] as usize));
        }
    })?;
    if let Some(pp) = &f.parts().0.pp {
        sum = pp.from_last(sum)?;
    }
    Ok((sum / (batch * seq) as f64) as f32)
}

/// The log-probability of `targets[j]` after `inputs[..=j]`, for every position `j >= from` of
/// one sequence (a perplexity scores these). The log-softmax is llama.cpp's: each row's maximum
/// subtracted, exponentials in f32 summed in f64.
pub fn target_log_probs<B: Backend>(
    f: &mut dyn Forward<B>,
    inputs: &[u32],
    targets: &[u32],
    from: usize,
) -> Result<Vec<f64>, EngineError> {
    assert_eq!(inputs.len(), targets.len());
    load_tokens(f, inputs)?;
    let v = f.parts().0.vocab() as usize;
    let mut out = Vec::with_capacity(inputs.len().saturating_sub(from));
    forward_chunks(f, 1, inputs.len(), &mut |first, logits| {
        for (i, row) in logits.chunks_exact(v).enumerate() {
            let j = first + i;
            if j < from {
                continue;
            }
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = row.iter().map(|&x| f64::from((x - max).exp())).sum();
            out.push(f64::from(row[targets[j] as usize] - max) - sum.ln());
        }
    })?;
    Ok(out)
}

/// Logits (batch, seq, V) of `inputs` (batch ≤ the planned rows, seq ≤ the planned sequence).
pub fn logits<B: Backend>(
    f: &mut dyn Forward<B>,
    inputs: &[u32],
    batch: usize,
    seq: usize,
) -> Result<Vec<f32>, EngineError> {
    assert_eq!(inputs.len(), batch * seq);
    load_tokens(f, inputs)?;
    let v = f.parts().0.vocab() as usize;
    let mut out = Vec::with_capacity(inputs.len() * v);
    forward_chunks(f, batch, seq, &mut |_, logits| {
        out.extend_from_slice(logits)
    })?;
    Ok(out)
}

/// Continues `prompt` by `n_new` tokens; the context is cropped to `max_seq`.
pub fn generate<B: Backend>(
    f: &mut dyn Forward<B>,
    prompt: &[u32],
    n_new: usize,
    max_seq: usize,
    sampling: Sampling,
) -> Result<Vec<u32>, EngineError> {
    generate_until(f, prompt, n_new, max_seq, sampling, &|| false)
}

/// As [`generate`], asking `stop` before each token and returning the tokens so far when it
/// says yes (a signal during a long sample).
pub fn generate_until<B: Backend>(
    f: &mut dyn Forward<B>,
    prompt: &[u32],
    n_new: usize,
    max_seq: usize,
    sampling: Sampling,
    stop: &dyn Fn() -> bool,
) -> Result<Vec<u32>, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::Data(
            "generation needs a prompt of at least one token".into(),
        ));
    }
    let v = f.parts().0.vocab() as usize;
    let mut rng = SplitMix64::new(sampling.seed);
    let picker = sampling.picker();
    let mut tokens = prompt.to_vec();
    let mut last = vec![0.0f32; v];
    for _ in 0..n_new {
        if stop() {
            break;
        }
        let context = &tokens[tokens.len().saturating_sub(max_seq)..];
        let seq = context.len();
        let context = context.to_vec();
        load_tokens(f, &context)?;
        forward_chunks(f, 1, seq, &mut |first, logits| {
            let rows = logits.len() / v;
            if first + rows == seq {
                last.copy_from_slice(&logits[(rows - 1) * v..]);
            }
        })?;
        let mut next = crate::sample::pick(&last, &picker, &mut rng);
        if let Some(pp) = &f.parts().0.pp {
            next = pp.token_from_last(next)?;
        }
        tokens.push(next);
    }
    Ok(tokens[prompt.len()..].to_vec())
}

/// -log softmax(row)[target], computed stably.
fn cross_entropy(row: &[f32], target: usize) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = row.iter().map(|&x| (x - max).exp()).sum();
    max + sum.ln() - row[target]
}
