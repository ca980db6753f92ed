//! Forward-only passes on the training arena: validation loss, full logits (for tests and the HF
//! comparison) and text generation, greedy or top-k with a seed.
//!
//! These reuse the step's buffers (a pass covers at most the planned micro-batch), entering the
//! same phases, and end with `Arena::end_pass` which frees what the backward would have. Logits
//! are computed a chunk of rows at a time in the classifier's scratch, so no B×T×V tensor exists
//! in the arena; `logits` returns them in a Vec because its callers (tests, dev scripts) want them.
//!
//! Example: `trainer.generate(&prompt, 100, Sampling { top_k: Some(40), temperature: 1.0, seed: 7,
//! vocab_limit: None })`.

use crate::error::EngineError;
use crate::forward;
use crate::train::Trainer;
use crate::zero::Pass;
use data::SplitMix64;
use kernels::matmul;
use plan::buffer::Phase;

/// How to pick the next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// `None`: greedy (argmax); `Some(k)`: sample among the k most likely.
    pub top_k: Option<usize>,
    pub temperature: f32,
    pub seed: u64,
    /// Only ids below this are picked (the tokenizer's vocabulary, when the model's is padded).
    pub vocab_limit: Option<usize>,
}

impl Trainer {
    /// Runs the forward pass over `batch` rows of `seq` tokens already in `batch.tokens`, then
    /// calls `per_chunk(first_row, logits of a chunk of rows)` for the final positions.
    fn forward_chunks(
        &mut self,
        batch: usize,
        seq: usize,
        per_chunk: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        let n_layers = self.config.model.shape.n_layers;
        // Phases are entered through the trainer so ZeRO stage 3 gathers each unit (a
        // collective: every rank runs the same forward-only passes).
        // Leaving each phase frees what dies in it (stage 3's gathered units), so a forward-only
        // pass never holds more than the training step planned.
        self.enter_phase(Phase::Embed, Pass::ForwardOnly)?;
        forward::embed(&self.model, &self.arena, batch, seq);
        self.leave_phase(Phase::Embed)?;
        for l in 0..n_layers {
            self.enter_phase(Phase::Forward(l), Pass::ForwardOnly)?;
            forward::block(&self.model, &self.arena, l as usize, batch, seq);
            self.leave_phase(Phase::Forward(l))?;
        }
        self.enter_phase(Phase::Head, Pass::ForwardOnly)?;
        let (model, arena) = (&self.model, &mut self.arena);
        forward::final_norm(model, arena, batch, seq);
        let (c, v) = (
            model.config.shape.d_model as usize,
            model.config.shape.vocab as usize,
        );
        let (lm_unit, lm_range) = model.lm_head();
        let params = arena.f32(model.params[lm_unit]);
        let wte = &params[lm_range];
        let lnf = arena.f32(model.head.lnf);
        let mut scratch = arena.f32_mut(model.head.classifier);
        let chunk_rows = scratch.len() / v;
        let n = batch * seq;
        let mut row = 0;
        while row < n {
            let rows = chunk_rows.min(n - row);
            let logits = &mut scratch[..rows * v];
            matmul::forward(
                logits,
                &lnf[row * c..(row + rows) * c],
                wte,
                None,
                rows,
                c,
                v,
            );
            per_chunk(row, logits);
            row += rows;
        }
        drop((params, lnf, scratch));
        arena.end_pass();
        Ok(())
    }

    fn load_tokens(&mut self, inputs: &[u32]) -> Result<(), EngineError> {
        let vocab = self.config.model.shape.vocab;
        if let Some(&id) = inputs.iter().find(|&&id| u64::from(id) >= vocab) {
            return Err(EngineError::Data(format!(
                "token id {id} is beyond the model's vocabulary of {vocab}"
            )));
        }
        self.arena.u32_mut(self.model.head.tokens)[..inputs.len()].copy_from_slice(inputs);
        Ok(())
    }

    /// Mean cross-entropy of one micro-batch, without touching gradients.
    pub fn eval_loss(&mut self, inputs: &[u32], targets: &[u32]) -> Result<f32, EngineError> {
        let (b, t) = (self.config.batch as usize, self.config.seq as usize);
        assert!(inputs.len() == b * t && targets.len() == b * t);
        self.load_tokens(inputs)?;
        let v = self.config.model.shape.vocab as usize;
        let mut sum = 0.0f64;
        self.forward_chunks(b, t, &mut |first, logits| {
            for (i, row) in logits.chunks_exact(v).enumerate() {
                sum += f64::from(cross_entropy(row, targets[first + i] as usize));
            }
        })?;
        Ok((sum / (b * t) as f64) as f32)
    }

    /// Logits (batch, seq, V) of `inputs` (batch ≤ micro-batch, seq ≤ planned sequence).
    pub fn logits(
        &mut self,
        inputs: &[u32],
        batch: usize,
        seq: usize,
    ) -> Result<Vec<f32>, EngineError> {
        assert_eq!(inputs.len(), batch * seq);
        self.load_tokens(inputs)?;
        let mut out = Vec::with_capacity(inputs.len() * self.config.model.shape.vocab as usize);
        self.forward_chunks(batch, seq, &mut |_, logits| out.extend_from_slice(logits))?;
        Ok(out)
    }

    /// Continues `prompt` by `n_new` tokens; the context is cropped to the planned sequence.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n_new: usize,
        sampling: Sampling,
    ) -> Result<Vec<u32>, EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::Data(
                "generation needs a prompt of at least one token".into(),
            ));
        }
        let max_seq = self.config.seq as usize;
        let v = self.config.model.shape.vocab as usize;
        let mut rng = SplitMix64::new(sampling.seed);
        let mut tokens = prompt.to_vec();
        let mut last = vec![0.0f32; v];
        for _ in 0..n_new {
            let context = &tokens[tokens.len().saturating_sub(max_seq)..];
            let seq = context.len();
            let context = context.to_vec();
            self.load_tokens(&context)?;
            self.forward_chunks(1, seq, &mut |first, logits| {
                let rows = logits.len() / v;
                if first + rows == seq {
                    last.copy_from_slice(&logits[(rows - 1) * v..]);
                }
            })?;
            let limit = sampling.vocab_limit.unwrap_or(v).clamp(1, v);
            tokens.push(pick(&last[..limit], sampling, &mut rng));
        }
        Ok(tokens[prompt.len()..].to_vec())
    }
}

/// -log softmax(row)[target], computed stably.
fn cross_entropy(row: &[f32], target: usize) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = row.iter().map(|&x| (x - max).exp()).sum();
    max + sum.ln() - row[target]
}

/// Greedy or top-k choice from one row of logits.
fn pick(logits: &[f32], sampling: Sampling, rng: &mut SplitMix64) -> u32 {
    let argmax = || {
        (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap_or(0) as u32
    };
    let Some(k) = sampling.top_k else {
        return argmax();
    };
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    idx.truncate(k.max(1));
    let temp = sampling.temperature.max(1e-6);
    let top = logits[idx[0]];
    let weights: Vec<f64> = idx
        .iter()
        .map(|&i| f64::from((logits[i] - top) / temp).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut r = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
    for (&i, w) in idx.iter().zip(&weights) {
        if r < *w {
            return i as u32;
        }
        r -= w;
    }
    idx[idx.len() - 1] as u32
}
